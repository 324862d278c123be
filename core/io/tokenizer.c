/* tokenizer.c - the public tokenizer API: loading decided by the files (as
 * AutoTokenizer does), added tokens, the pipeline runner and the
 * post-processor, plus what every algorithm shares (UTF-8, the vocabulary
 * hash map, file helpers).
 *
 *   tokenizer.json           -> tokenizer_json.c (any HF fast tokenizer)
 *   vocab.txt                -> wordpiece.c (BertTokenizer, DistilBertTokenizer)
 *   vocab.json + merges.txt  -> bpe.c (GPT2Tokenizer; RobertaTokenizer when
 *   (or encoder.json +          tokenizer_config.json's tokenizer_class says so)
 *    vocab.bpe)
 *
 * Pipeline (tokenizer_impl.h): split the raw text at added tokens
 * (leftmost-longest, with lstrip / rstrip / single_word), normalise each
 * remaining range with alignments, pre-tokenize, run the model, map offsets
 * back to original code points, then apply the template. Whether an id is
 * special is decided here only (lens_tokenizer_is_special), for tokens from
 * text and for input_ids alike.
 *
 * Everything is read-only after lens_tokenizer_load; lens_tokenize keeps its
 * scratch on the heap per call, so concurrent calls on one tokenizer are safe.
 *
 * Known differences from Hugging Face (all in rarely seen characters):
 *   - U+2028/U+2029 count as whitespace for BERT (Rust tokenizers and
 *     transformers.js do so; Python's slow BasicTokenizer does not).
 *   - Unicode tables are utf8proc's version.
 *   - BERT's NFD is applied per code point without canonical reordering of
 *     combining marks; only the order of surviving non-Mn marks can differ.
 *   - From vocab.txt, lower-casing follows Python's str.lower (final sigma,
 *     as the slow BertTokenizer); from tokenizer.json, Rust's per-character
 *     mapping, as the fast tokenizer.
 *   - Added tokens are all matched on the raw text, also those marked
 *     "normalized" (HF matches those after normalisation; they differ only
 *     when a normaliser changes the token's own text). */
#include "core/io/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/io/tokenizer_impl.h"

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                     */

/* Length of the valid UTF-8 sequence at s[0..avail), 0 when invalid: no
 * overlong forms, no surrogates, nothing above U+10FFFF (RFC 3629 table). */
int lens_utf8_next(const unsigned char *s, size_t avail, uint32_t *cp)
{
    unsigned char b0 = s[0];
    if (b0 < 0x80) { *cp = b0; return 1; }
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (avail < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(b0 & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        unsigned char lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
        if (avail < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        unsigned char lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
        if (avail < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        *cp = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
              ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

int lens_utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int lens_utf8_valid(const char *s, size_t len, size_t *bad_at)
{
    size_t i = 0;
    uint32_t cp;
    while (i < len) {
        int k = lens_utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (!k) { if (bad_at) *bad_at = i; return 0; }
        i += (size_t)k;
    }
    return 1;
}

int lens_text_decode(lens_text *t, const char *s, size_t len, const char *what, lens_err *err)
{
    memset(t, 0, sizeof *t);
    t->bytes = s;
    t->len = len;
    if (len > LENS_TOK_MAX_TEXT)
        return lens_fail(err, LENS_ELIMIT, "%s is %zu bytes, over the tokenizer limit of %u",
                         what, len, LENS_TOK_MAX_TEXT);
    t->cp = malloc((len + 1) * sizeof *t->cp);
    t->byte_off = malloc((len + 1) * sizeof *t->byte_off);
    if (!t->cp || !t->byte_off) {
        free(t->cp);
        free(t->byte_off);
        t->cp = NULL;
        t->byte_off = NULL;
        return lens_fail(err, LENS_ENOMEM, "out of memory decoding %s", what);
    }
    size_t i = 0;
    int n = 0;
    while (i < len) {
        uint32_t cp;
        int k = lens_utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (!k) {
            free(t->cp);
            free(t->byte_off);
            t->cp = NULL;
            t->byte_off = NULL;
            return lens_fail(err, LENS_EINVAL, "%s is not valid UTF-8 at byte %zu (0x%02x)",
                             what, i, (unsigned char)s[i]);
        }
        t->cp[n] = cp;
        t->byte_off[n++] = (int)i;
        i += (size_t)k;
    }
    t->byte_off[n] = (int)len;
    t->n = n;
    return 0;
}

void lens_text_free(lens_text *t)
{
    free(t->cp);
    free(t->byte_off);
}


/* ------------------------------------------------------------------------ */
/* Vocabulary                                                                */



/* Insert id under its piece; a later duplicate string takes the slot, as
 * Python's dict and Rust's HashMap do when reading vocab.txt. */
static void vocab_insert(lens_tokenizer *tok, int id)
{
    const char *p = tok->piece[id];
    size_t n = (size_t)tok->piece_len[id];
    uint64_t h = lens_fnv1a(LENS_FNV_OFFSET, p, n);
    for (uint32_t i = (uint32_t)h & tok->vocab_mask;; i = (i + 1) & tok->vocab_mask) {
        uint32_t slot = tok->vocab_slots[i];
        if (!slot || ((size_t)tok->piece_len[slot - 1] == n && memcmp(tok->piece[slot - 1], p, n) == 0)) {
            tok->vocab_slots[i] = (uint32_t)id + 1;
            return;
        }
    }
}

int lens_vocab_build_index(lens_tokenizer *tok, lens_err *err)
{
    uint32_t cap = 16;
    while (cap < (uint32_t)tok->vocab_size * 2) cap <<= 1;
    tok->vocab_slots = calloc(cap, sizeof *tok->vocab_slots);
    if (!tok->vocab_slots) return lens_fail(err, LENS_ENOMEM, "out of memory indexing the vocabulary");
    tok->vocab_mask = cap - 1;
    tok->max_piece_len = 0;
    for (int id = 0; id < tok->vocab_size; id++) {
        if (!tok->piece[id]) continue;
        vocab_insert(tok, id);
        if (tok->piece_len[id] > tok->max_piece_len) tok->max_piece_len = tok->piece_len[id];
    }
    return 0;
}


/* ------------------------------------------------------------------------ */
/* Files                                                                     */

int lens_tok_file_exists(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}


/* Optional JSON file: *out NULL when absent; malformed -> LENS_EFORMAT with
 * file and line. */
int lens_tok_json_optional(const char *dir, const char *name, json_t **out, lens_err *err)
{
    char path[4096];
    *out = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!lens_tok_file_exists(dir, name)) return 0;
    json_error_t jerr;
    /* Integers as reals: transformers writes model_max_length as 1e30 spelled
     * out as an integer, which jansson refuses otherwise. */
    json_t *root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) return lens_fail(err, LENS_EFORMAT, "%s:%d: %s", path, jerr.line, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return lens_fail(err, LENS_EFORMAT, "%s: top level is not a JSON object", path);
    }
    *out = root;
    return 0;
}

/* "[UNK]" or {"content": "[UNK]", ...} as tokenizer_config.json writes it. */
const char *lens_tok_json_text(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        const json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}


int lens_vocab_alloc(lens_tokenizer *tok, int size, lens_err *err)
{
    tok->vocab_size = size;
    tok->piece = calloc((size_t)size, sizeof *tok->piece);
    tok->piece_len = calloc((size_t)size, sizeof *tok->piece_len);
    if (!tok->piece || !tok->piece_len) return lens_fail(err, LENS_ENOMEM, "out of memory for %d pieces", size);
    return 0;
}

int lens_piece_set(lens_tokenizer *tok, int id, const char *s, size_t n, lens_err *err)
{
    tok->piece[id] = malloc(n + 1);
    if (!tok->piece[id]) return lens_fail(err, LENS_ENOMEM, "out of memory for the vocabulary");
    memcpy(tok->piece[id], s, n);
    tok->piece[id][n] = 0;
    tok->piece_len[id] = (int)n;
    return 0;
}


int lens_tok_grow(lens_tok_vec *out)
{
    int cap = out->cap ? out->cap * 2 : 64;
    lens_token *grown = realloc(out->v, (size_t)cap * sizeof *grown);
    if (!grown) return -1;
    out->v = grown;
    out->cap = cap;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Added tokens, matched literally in the raw text                           */

/* The slot of added text s[0..n): its entry or the empty slot where it
 * belongs (Gemma 3 has 6,415 added tokens, 6,322 of them starting with
 * '<': a scan of them all at every '<' of the text was 18% of its time). */
static uint32_t *added_slot(const lens_tokenizer *tok, const char *s, int n)
{
    for (uint32_t i = (uint32_t)lens_fnv1a(LENS_FNV_OFFSET, s, (size_t)n) & tok->added_mask;;
         i = (i + 1) & tok->added_mask) {
        uint32_t *slot = &tok->added_slots[i];
        const lens_added *a = *slot ? &tok->added[*slot - 1] : NULL;
        if (!a || (a->len == n && memcmp(a->text, s, (size_t)n) == 0)) return slot;
    }
}

/* Room for one more added token: the array, the table (at most half full)
 * and the list of lengths. */
static int added_reserve(lens_tokenizer *tok)
{
    if (tok->n_added == tok->cap_added) {
        int cap = tok->cap_added ? tok->cap_added * 2 : 16;
        lens_added *grown = realloc(tok->added, (size_t)cap * sizeof *grown);
        int *lens = realloc(tok->added_lens, (size_t)cap * sizeof *lens);
        if (grown) tok->added = grown;
        if (lens) tok->added_lens = lens;
        if (!grown || !lens) return -1;
        tok->cap_added = cap;
    }
    if ((uint32_t)(tok->n_added + 1) * 2 <= tok->added_mask) return 0;
    uint32_t cap = tok->added_mask ? (tok->added_mask + 1) * 2 : 64;
    uint32_t *old = tok->added_slots;
    tok->added_slots = calloc(cap, sizeof *tok->added_slots);
    if (!tok->added_slots) {
        tok->added_slots = old;
        return -1;
    }
    tok->added_mask = cap - 1;
    free(old);
    for (int k = 0; k < tok->n_added; k++)
        *added_slot(tok, tok->added[k].text, tok->added[k].len) = (uint32_t)k + 1;
    return 0;
}

int lens_added_add(lens_tokenizer *tok, const char *text, int id, int special, int lstrip, int rstrip,
                   int single_word)
{
    if (!text || !*text) return 0;
    if (id < 0) id = lens_vocab_find2(tok, "", 0, text, strlen(text));
    if (id < 0) return 0; /* not in this vocabulary: nothing to match it to */
    const int len = (int)strlen(text);
    if (added_reserve(tok) < 0) return -1;
    uint32_t *slot = added_slot(tok, text, len);
    if (*slot) return 0; /* the first of a text's entries counts */
    char *copy = strdup(text);
    if (!copy) return -1;
    tok->added[tok->n_added++] = (lens_added){ copy, len, id, (unsigned char)lstrip, (unsigned char)rstrip,
                                               (unsigned char)single_word, (unsigned char)special };
    *slot = (uint32_t)tok->n_added;
    tok->added_first[(unsigned char)text[0]] = 1;
    int at = 0; /* keep the lengths distinct and longest first */
    while (at < tok->n_added_lens && tok->added_lens[at] > len) at++;
    if (at == tok->n_added_lens || tok->added_lens[at] != len) {
        memmove(tok->added_lens + at + 1, tok->added_lens + at, sizeof(int) * (size_t)(tok->n_added_lens - at));
        tok->added_lens[at] = len;
        tok->n_added_lens++;
    }
    return 0;
}

static const char *const special_keys[] = {
    "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "bos_token", "eos_token",
};

int lens_added_from_json(lens_tokenizer *tok, const json_t *root, lens_err *err)
{
    if (!root) return 0;
    for (size_t k = 0; k < sizeof special_keys / sizeof *special_keys; k++)
        if (lens_added_add(tok, lens_tok_json_text(json_object_get(root, special_keys[k])), -1, 1, 0, 0, 0) < 0) goto oom;
    const json_t *extra = json_object_get(root, "additional_special_tokens");
    size_t i;
    const json_t *v;
    if (json_is_array(extra))
        json_array_foreach(extra, i, v)
            if (lens_added_add(tok, lens_tok_json_text(v), -1, 1, 0, 0, 0) < 0) goto oom;
    const json_t *dec = json_object_get(root, "added_tokens_decoder");
    const char *key;
    if (json_is_object(dec))
        json_object_foreach((json_t *)dec, key, v) {
            const json_t *sp = json_object_get(v, "special");
            if (lens_added_add(tok, lens_tok_json_text(v), -1, !json_is_false(sp), 0, 0, 0) < 0) goto oom;
        }
    return 0;
oom:
    return lens_fail(err, LENS_ENOMEM, "out of memory for special tokens");
}

/* Rust's char::is_alphanumeric plus '_': what single_word treats as a word. */
static int word_char(uint32_t cp)
{
    return cp == '_' || lens_uni_letter(cp) || lens_uni_number(cp);
}

/* Longest added token at code point i of t, or NULL; *end is its end. */
static const lens_added *added_match(const lens_tokenizer *tok, const lens_text *t, int i, int *end)
{
    const size_t p = (size_t)t->byte_off[i];
    for (int k = 0; k < tok->n_added_lens; k++) {
        const int len = tok->added_lens[k];
        if ((size_t)len > t->len - p) continue;
        const uint32_t slot = *added_slot(tok, t->bytes + p, len);
        if (!slot) continue;
        int j = i;
        while (t->byte_off[j] < (int)p + len) j++;
        *end = j;
        return &tok->added[slot - 1];
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Running the pipeline                                                      */

typedef struct {
    const lens_tokenizer *tok;
    lens_wp_scratch *wp;
    lens_bpe_scratch *bpe;
    lens_norm_buf n1, n2;
    char *nbytes;
    size_t nbytes_cap;
    lens_text nt; /* the normalised range as text (arrays owned here) */
    int nt_cap;
    int segment;
    lens_tok_vec *out;
} enc_ctx;

static int model_word(void *arg, const lens_text *t, int i, int j)
{
    enc_ctx *c = arg;
    if (c->tok->kind == LENS_TOK_BPE) return lens_bpe_word(c->tok, c->bpe, t, i, j, c->segment, c->out);
    if (c->tok->kind == LENS_TOK_UNIGRAM) return lens_unigram_word(c->tok, t, i, j, c->segment, c->out);
    return lens_wp_word(c->tok, c->wp, t->cp + i, j - i, i, NULL, c->segment, c->out);
}

/* Does anything change the text before the model (so offsets need a map)? */
static int changes_text(const lens_tokenizer *tok)
{
    if (tok->n_norm) return 1;
    for (int k = 0; k < tok->n_pre; k++)
        if (tok->pre[k].kind == PRE_METASPACE || (tok->pre[k].kind == PRE_BYTELEVEL && tok->pre[k].add_prefix_space))
            return 1;
    return 0;
}

/* Prepend cp to b, aligned to b's first code point. */
static int norm_prepend(lens_norm_buf *b, uint32_t cp)
{
    if (lens_norm_push(b, 0, 0, 0) < 0) return -1;
    memmove(b->cp + 1, b->cp, (size_t)(b->n - 1) * sizeof *b->cp);
    memmove(b->os + 1, b->os, (size_t)(b->n - 1) * sizeof *b->os);
    memmove(b->oe + 1, b->oe, (size_t)(b->n - 1) * sizeof *b->oe);
    b->cp[0] = cp;
    b->os[0] = b->os[1];
    b->oe[0] = b->oe[1];
    return 0;
}

/* The pre-tokenizers' own text changes: Metaspace's ▁ for ' ' (and its
 * prefix), ByteLevel's prefix space. at_start: the range starts the text. */
static int pre_transform(const lens_tokenizer *tok, lens_norm_buf *b, int at_start)
{
    for (int k = 0; k < tok->n_pre && b->n; k++) {
        const lens_pre *p = &tok->pre[k];
        if (p->kind == PRE_METASPACE) {
            for (int i = 0; i < b->n; i++)
                if (b->cp[i] == ' ') b->cp[i] = p->replacement;
            if ((p->prepend == 2 || (p->prepend == 1 && at_start)) && b->cp[0] != p->replacement &&
                norm_prepend(b, p->replacement) < 0)
                return -1;
        } else if (p->kind == PRE_BYTELEVEL && p->add_prefix_space && b->cp[0] != ' ') {
            if (norm_prepend(b, ' ') < 0) return -1;
        }
    }
    return 0;
}

/* b as a lens_text in c->nt (UTF-8 bytes, code points, byte offsets). */
static int norm_to_text(enc_ctx *c, const lens_norm_buf *b)
{
    if ((size_t)b->n * 4 + 1 > c->nbytes_cap) {
        free(c->nbytes);
        c->nbytes_cap = (size_t)b->n * 4 + 1;
        c->nbytes = malloc(c->nbytes_cap);
        if (!c->nbytes) { c->nbytes_cap = 0; return -1; }
    }
    if (b->n + 1 > c->nt_cap) {
        free(c->nt.cp);
        free(c->nt.byte_off);
        c->nt_cap = b->n + 1;
        c->nt.cp = malloc((size_t)c->nt_cap * sizeof *c->nt.cp);
        c->nt.byte_off = malloc((size_t)c->nt_cap * sizeof *c->nt.byte_off);
        if (!c->nt.cp || !c->nt.byte_off) { c->nt_cap = 0; return -1; }
    }
    int nb = 0;
    for (int i = 0; i < b->n; i++) {
        c->nt.cp[i] = b->cp[i];
        c->nt.byte_off[i] = nb;
        nb += lens_utf8_put(b->cp[i], c->nbytes + nb);
    }
    c->nt.byte_off[b->n] = nb;
    c->nt.bytes = c->nbytes;
    c->nt.len = (size_t)nb;
    c->nt.n = b->n;
    return 0;
}

/* Code points [a, b) of t, free of added tokens -> tokens with offsets into t. */
static int encode_range(enc_ctx *c, const lens_text *t, int a, int b)
{
    const lens_tokenizer *tok = c->tok;
    if (tok->bert_fast) return lens_wp_bert_range(tok, c->wp, t, a, b, c->segment, c->out);
    if (!changes_text(tok)) return lens_pretokenize(tok, 0, t, a, b, model_word, c);
    lens_norm_buf *in = &c->n1, *out = &c->n2;
    in->n = 0;
    for (int i = a; i < b; i++)
        if (lens_norm_push(in, t->cp[i], i, i + 1) < 0) return -1;
    for (int k = 0; k < tok->n_norm && in->n; k++) {
        if (lens_normalize_step(&tok->norm[k], in, out) < 0) return -1;
        lens_norm_buf *swap = in;
        in = out, out = swap;
    }
    if (pre_transform(tok, in, a == 0) < 0 || norm_to_text(c, in) < 0) return -1;
    if (!in->n) return 0;
    if (tok->kind == LENS_TOK_BPE && lens_bpe_begin(c->bpe, &c->nt) < 0) return -1;
    int first = c->out->n;
    if (lens_pretokenize(tok, 0, &c->nt, 0, c->nt.n, model_word, c) < 0) return -1;
    for (int k = first; k < c->out->n; k++) {
        lens_token *v = &c->out->v[k];
        int s = v->start, e = v->end;
        v->start = in->os[s];
        v->end = in->oe[e - 1];
    }
    return 0;
}

/* HF ByteLevel.process_offsets: leading / trailing spaces of a piece ("Ġ")
 * leave its span. */
static void trim_offsets(const lens_tokenizer *tok, lens_token *v)
{
    const char *p = tok->piece[v->id];
    if (!p || v->start < 0) return;
    size_t n = strlen(p);
    int lead = 0, trail = 0;
    for (size_t i = 0; i + 1 < n + 1 && (size_t)i < n;) {
        uint32_t cp;
        int k = lens_utf8_next((const unsigned char *)p + i, n - i, &cp);
        if (!k || !(cp == 0x120 || lens_uni_white_space(cp))) break;
        lead++;
        i += (size_t)k;
    }
    for (size_t i = n; i > 0;) {
        size_t s = i - 1;
        while (s > 0 && ((unsigned char)p[s] & 0xC0) == 0x80) s--;
        uint32_t cp;
        if (!lens_utf8_next((const unsigned char *)p + s, i - s, &cp) || !(cp == 0x120 || lens_uni_white_space(cp))) break;
        trail++;
        i = s;
    }
    if (lead) v->start = v->start + lead < v->end ? v->start + lead : v->end;
    if (trail && v->end >= trail) v->end = v->end - trail > v->start ? v->end - trail : v->start;
}

/* One text: split at added tokens, run the pipeline between them. */
static int encode_text(enc_ctx *c, const lens_text *t)
{
    const lens_tokenizer *tok = c->tok;
    int first = c->out->n;
    if (!tok->bert_fast && tok->kind == LENS_TOK_BPE && !changes_text(tok) && lens_bpe_begin(c->bpe, t) < 0) return -1;
    int a = 0, free_from = 0; /* no added token starts before free_from */
    for (int i = 0; i <= t->n; i++) {
        const lens_added *m = NULL;
        int j = i;
        if (i < t->n && i >= free_from && tok->added_first[(unsigned char)t->bytes[t->byte_off[i]]])
            m = added_match(tok, t, i, &j);
        /* a single_word token next to a word character is not matched, but
         * its span is taken, as by HF's leftmost-longest automaton: no added
         * token starts inside it, nor a shorter one at its start */
        if (m && m->single_word && ((i > 0 && word_char(t->cp[i - 1])) || (j < t->n && word_char(t->cp[j])))) {
            free_from = j;
            m = NULL;
        }
        if (i < t->n && !m) continue;
        int s = i;
        if (m && m->lstrip)
            while (s > a && lens_uni_white_space(t->cp[s - 1])) s--;
        if (s > a && encode_range(c, t, a, s) < 0) return -1;
        if (!m) break;
        int me = j; /* the match's own end */
        if (m->rstrip)
            while (j < t->n && lens_uni_white_space(t->cp[j])) j++;
        /* the stripped white space is in the span unless offsets are trimmed */
        if (lens_tok_push(c->out, m->id, tok->trim_offsets ? i : s, tok->trim_offsets ? me : j, c->segment) < 0)
            return -1;
        a = j;
        i = j - 1;
    }
    if (tok->trim_offsets)
        for (int k = first; k < c->out->n; k++) trim_offsets(tok, &c->out->v[k]);
    return 0;
}

static void enc_free(enc_ctx *c)
{
    lens_wp_scratch_free(c->wp);
    lens_bpe_scratch_free(c->bpe);
    lens_norm_buf_free(&c->n1);
    lens_norm_buf_free(&c->n2);
    free(c->nbytes);
    free(c->nt.cp);
    free(c->nt.byte_off);
}

/* The post-processor, in place in seq (A then B): the template's special
 * tokens around the sequences' tokens, with the template's type ids; with
 * no template A (B) stay as they are, segments 0 / 1. Filled from the back:
 * a token only moves right, past tokens already read (the loaders refuse
 * templates with B before A). */
static int apply_template(const lens_tokenizer *tok, lens_tok_vec *seq, int n_a, int pair)
{
    if (!tok->has_template) return 0;
    const lens_tmpl_item *items = pair ? tok->pair : tok->single;
    int n = pair ? tok->n_pair : tok->n_single, total = 0;
    for (int i = 0; i < n; i++) total += items[i].id >= 0 ? 1 : items[i].seq == 0 ? n_a : seq->n - n_a;
    if (total > seq->cap) {
        lens_token *grown = realloc(seq->v, (size_t)total * sizeof *grown);
        if (!grown) return -1;
        seq->v = grown;
        seq->cap = total;
    }
    int pos = total;
    for (int i = n - 1; i >= 0; i--) {
        const lens_tmpl_item *it = &items[i];
        if (it->id >= 0) {
            seq->v[--pos] = (lens_token){ .id = it->id, .start = -1, .end = -1, .segment = it->type_id, .text_index = -1 };
            continue;
        }
        int lo = it->seq == 0 ? 0 : n_a, hi = it->seq == 0 ? n_a : seq->n;
        for (int k = hi - 1; k >= lo; k--) {
            seq->v[--pos] = seq->v[k];
            seq->v[pos].segment = it->type_id; /* text_index stays the input's */
        }
    }
    seq->n = total;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Public API                                                                */

void lens_tokenizer_free(lens_tokenizer *tok)
{
    if (!tok) return;
    if (tok->piece)
        for (int i = 0; i < tok->vocab_size; i++) free(tok->piece[i]);
    free(tok->piece);
    free(tok->piece_len);
    free(tok->vocab_slots);
    free(tok->special);
    free(tok->merge_slots);
    for (int i = 0; i < tok->n_added; i++) free(tok->added[i].text);
    free(tok->added);
    free(tok->added_slots);
    free(tok->added_lens);
    /* every slot: a step that failed half-way to load is not counted */
    for (int k = 0; k < LENS_TOK_MAX_STEPS; k++) {
        free(tok->norm[k].pattern);
        free(tok->norm[k].content);
        free(tok->pre[k].string);
        lens_regex_free(tok->pre[k].re);
        lens_regex_free(tok->norm[k].re);
        lens_charsmap_free(tok->norm[k].charsmap);
        free(tok->dec[k].text);
        free(tok->dec[k].replace.pattern);
        free(tok->dec[k].replace.content);
        lens_regex_free(tok->dec[k].replace.re);
    }
    free(tok->score);
    free(tok->wp_prefix);
    free(tok->single);
    free(tok->pair);
    free(tok);
}

/* The one list of special ids: added tokens flagged special and the
 * template's tokens. */
static int mark_special(lens_tokenizer *tok, lens_err *err)
{
    tok->special = calloc((size_t)tok->vocab_size + 1, 1);
    if (!tok->special) return lens_fail(err, LENS_ENOMEM, "out of memory");
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].special && tok->added[i].id < tok->vocab_size) tok->special[tok->added[i].id] = 1;
    for (int i = 0; i < tok->n_single; i++)
        if (tok->single[i].id >= 0) tok->special[tok->single[i].id] = 1;
    for (int i = 0; i < tok->n_pair; i++)
        if (tok->pair[i].id >= 0) tok->special[tok->pair[i].id] = 1;
    return 0;
}

/* tokenizer_config.json's "clean_up_tokenization_spaces" (transformers
 * applies clean_up_tokenization to the whole decoded text when it is true);
 * tok->clean_up_spaces stays -1 when the file or the key is absent. */
static int read_clean_up(lens_tokenizer *tok, const char *dir, lens_err *err)
{
    json_t *config = NULL;
    if (lens_tok_json_optional(dir, "tokenizer_config.json", &config, err) < 0) return -1;
    const json_t *v = json_object_get(config, "clean_up_tokenization_spaces");
    int rc = 0;
    if (json_is_boolean(v)) tok->clean_up_spaces = json_is_true(v);
    else if (v && !json_is_null(v))
        rc = lens_fail(err, LENS_EFORMAT, "%s/tokenizer_config.json: clean_up_tokenization_spaces is not a boolean", dir);
    json_decref(config);
    return rc;
}

lens_tokenizer *lens_tokenizer_load(const char *dir, lens_err *err)
{
    lens_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) { lens_fail(err, LENS_ENOMEM, "out of memory"); return NULL; }
    tok->unk_id = -1;
    tok->clean_up_spaces = -1;
    int rc;
    if (lens_tok_file_exists(dir, "tokenizer.json")) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        json_t *config = NULL;
        rc = lens_tok_json_optional(dir, "tokenizer_config.json", &config, err);
        if (rc == 0) rc = lens_load_tokenizer_json(tok, path, config, err);
        json_decref(config);
    } else if (lens_tok_file_exists(dir, "vocab.txt")) {
        tok->kind = LENS_TOK_WORDPIECE;
        rc = lens_load_wordpiece(tok, dir, err);
    } else if (lens_tok_file_exists(dir, "vocab.json") && lens_tok_file_exists(dir, "merges.txt")) {
        tok->kind = LENS_TOK_BPE;
        rc = lens_load_bpe(tok, dir, "vocab.json", "merges.txt", err);
    } else if (lens_tok_file_exists(dir, "encoder.json") && lens_tok_file_exists(dir, "vocab.bpe")) {
        tok->kind = LENS_TOK_BPE;
        rc = lens_load_bpe(tok, dir, "encoder.json", "vocab.bpe", err);
    } else {
        rc = lens_fail(err, LENS_ENOENT,
                       "%s: no tokenizer files (tokenizer.json, vocab.txt, vocab.json + merges.txt, or encoder.json + vocab.bpe)", dir);
    }
    if (rc == 0) rc = mark_special(tok, err);
    if (rc == 0) rc = read_clean_up(tok, dir, err);
    if (rc < 0) {
        lens_tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

lens_tokenizer *lens_tokenizer_from_json(const char *data, size_t len, lens_err *err)
{
    lens_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) { lens_fail(err, LENS_ENOMEM, "out of memory"); return NULL; }
    tok->unk_id = -1;
    tok->clean_up_spaces = -1;
    if (lens_load_tokenizer_json_text(tok, data, len, err) < 0 || mark_special(tok, err) < 0) {
        lens_tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

/* A model folder without tokenizer files has tok NULL: the queries below
 * answer "nothing" for it and lens_tokenize fails with LENS_ENOENT. */
lens_tok_kind lens_tokenizer_kind(const lens_tokenizer *tok) { return tok ? tok->kind : LENS_TOK_WORDPIECE; }

int lens_tokenizer_vocab_size(const lens_tokenizer *tok) { return tok ? tok->vocab_size : 0; }

const char *lens_tokenizer_piece(const lens_tokenizer *tok, int id)
{
    return tok && id >= 0 && id < tok->vocab_size ? tok->piece[id] : NULL;
}

int lens_tokenizer_id(const lens_tokenizer *tok, const char *piece)
{
    return tok && piece ? lens_vocab_find2(tok, "", 0, piece, strlen(piece)) : -1;
}

int lens_tokenizer_is_special(const lens_tokenizer *tok, int id)
{
    return tok && id >= 0 && id < tok->vocab_size && tok->special[id];
}

int lens_tokenizer_pair_template(const lens_tokenizer *tok)
{
    return tok && tok->has_template && tok->n_pair > 0;
}

int lens_tokenize(const lens_tokenizer *tok, const char *text, size_t len,
                  const char *pair, size_t pair_len,
                  lens_token **out, int *n_out, lens_err *err)
{
    *out = NULL;
    *n_out = 0;
    if (!tok) return lens_fail(err, LENS_ENOENT, "the model has no tokenizer (no tokenizer files in its folder): send input_ids");
    if (!text && len) return lens_fail(err, LENS_EINVAL, "text is NULL");
    if (!text) text = "";
    if (pair && tok->has_template && tok->n_pair == 0)
        return lens_fail(err, LENS_EINVAL, "this tokenizer's template has no pair form: text_pair is not accepted");
    lens_text t = { 0 }, tp = { 0 };
    if (lens_text_decode(&t, text, len, "text", err) < 0) return -1;
    if (pair && lens_text_decode(&tp, pair, pair_len, "text_pair", err) < 0) {
        lens_text_free(&t);
        return -1;
    }
    lens_tok_vec v = { 0 };
    enc_ctx c = { .tok = tok, .wp = lens_wp_scratch_new(), .bpe = lens_bpe_scratch_new(), .out = &v };
    int rc = !c.wp || !c.bpe ? -1 : encode_text(&c, &t);
    int n_a = v.n;
    c.segment = 1;
    if (!rc && pair) rc = encode_text(&c, &tp);
    if (!rc) rc = apply_template(tok, &v, n_a, pair != NULL);
    enc_free(&c);
    lens_text_free(&t);
    lens_text_free(&tp);
    if (rc) {
        free(v.v);
        return lens_fail(err, LENS_ENOMEM, "out of memory while tokenizing");
    }
    for (int k = 0; k < v.n; k++) v.v[k].special = tok->special[v.v[k].id]; /* ids come from the vocabulary */
    if (v.n > 0 && v.n < v.cap) {
        lens_token *shrunk = realloc(v.v, (size_t)v.n * sizeof *shrunk);
        if (shrunk) v.v = shrunk;
    }
    *out = v.v;
    *n_out = v.n;
    return 0;
}

int lens_gpt2_pretokenize(const char *text, size_t len, int (*word)(void *ctx, size_t start, size_t end),
                          void *ctx, lens_err *err)
{
    lens_text t;
    if (lens_text_decode(&t, text ? text : "", text ? len : 0, "text", err) < 0) return -1;
    int rc = 0;
    for (int i = 0; i < t.n && rc == 0;) {
        int j = lens_gpt2_word_end(t.cp, i, t.n);
        rc = word(ctx, (size_t)t.byte_off[i], (size_t)t.byte_off[j]);
        i = j;
    }
    lens_text_free(&t);
    return rc;
}
