/* tokenizer.c - BERT WordPiece and GPT-2 byte-level BPE, identical in ids to
 * Hugging Face's tokenizers for the same files, with code-point offsets.
 *
 * This file owns: strict UTF-8 decoding of request text, the Unicode classes
 * both tokenizers need (from libutf8proc, no hand tables), the vocabulary and
 * merge hash maps, loading of vocab.txt / vocab.json+merges.txt (or GPT-2's
 * original encoder.json+vocab.bpe) plus tokenizer_config.json and
 * special_tokens_map.json, and the two encoders.
 *
 * Pipeline shared by both kinds:
 *   UTF-8 text -> code points cp[n] with byte_off[n+1]
 *   -> split on special tokens written literally in the text ("[MASK]",
 *      "<|endoftext|>"), matched leftmost-longest on the raw text before any
 *      normalisation, as HF's AddedVocabulary does
 *   -> each remaining range goes through the kind's own pipeline.
 *
 * WordPiece (HF BertNormalizer + BertPreTokenizer + WordPiece):
 *   clean (drop U+0000, U+FFFD, categories C* except \t\n\r; whitespace -> ' ')
 *   -> ' ' around CJK ideographs -> lower-case (Python str.lower semantics)
 *   -> NFD and drop Mn -> split on ' ' and on punctuation -> greedy
 *   longest-match-first with "##", words > max_input_chars_per_word -> [UNK].
 *   Every normalised code point remembers the original code point it came
 *   from, so a piece's span is [orig(first), orig(last) + 1).
 *
 * BPE (HF ByteLevel + BPE): the GPT-2 regex, written out by hand over code
 *   point classes, then bytes -> byte-level symbols -> merges by rank with a
 *   min-heap (O(n log n) per word, so a 1 MB word without spaces stays
 *   cheap). A token's span covers every character one of its bytes belongs
 *   to, so two byte tokens of one emoji both get the emoji's span.
 *
 * Everything is read-only after lens_tokenizer_load; lens_tokenize keeps its
 * scratch on the heap per call, so concurrent calls on one tokenizer are safe.
 *
 * Known differences from Hugging Face (all in rarely seen characters):
 *   - U+2028/U+2029 count as whitespace for BERT (Rust tokenizers and
 *     transformers.js do so; Python's slow BasicTokenizer does not).
 *   - BERT drops unassigned code points (Cn) as Python and Rust do;
 *     transformers.js keeps them. Unicode tables are utf8proc's version.
 *   - NFD is applied per code point without canonical reordering of
 *     combining marks; only the order of surviving non-Mn marks can differ.
 *   - Python's str.lower "cased"/"case-ignorable" sets for the final-sigma
 *     rule are approximated from general categories.
 *   - GPT-2 \s is Unicode White_Space (Python `regex`, Rust onig);
 *     transformers.js uses JS \s (adds U+FEFF, lacks U+0085).
 *   - Added tokens are all matched as raw literal strings; "normalized",
 *     "lstrip", "rstrip", "single_word" flags and never_split are ignored. */
#include "core/io/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* Text over this many bytes is refused: offsets and ids are int, and one
 * request that large is a client error, not a workload. */
#define LENS_TOK_MAX_TEXT (1u << 30)
#define LENS_TOK_MAX_ADDED 256
#define LENS_TOK_MAX_ID (1 << 24)

typedef struct {
    char *text;
    int len;
    int id;
} added_token;

struct lens_tokenizer {
    lens_tok_kind kind;
    int vocab_size;   /* max id + 1; ids without a piece are holes */
    char **piece;     /* [vocab_size] NUL-terminated, NULL for holes */
    int *piece_len;   /* [vocab_size] bytes */
    int max_piece_len;
    uint32_t *vocab_slots; /* open addressing: id + 1, 0 = empty */
    uint32_t vocab_mask;

    added_token added[LENS_TOK_MAX_ADDED];
    int n_added;
    uint8_t added_first[256]; /* 1 for bytes that start some added token */

    /* WordPiece */
    int cls_id, sep_id, unk_id;
    int do_lower_case, strip_accents, chinese_chars;
    int max_input_chars_per_word;

    /* BPE */
    struct merge_slot *merge_slots;
    uint64_t merge_mask;
    int byte_id[256]; /* id of the single-byte symbol for each byte */
};

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                     */

/* Length of the valid UTF-8 sequence at s[0..avail), 0 when invalid: no
 * overlong forms, no surrogates, nothing above U+10FFFF (RFC 3629 table). */
static int utf8_next(const unsigned char *s, size_t avail, uint32_t *cp)
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

static int utf8_put(uint32_t cp, char *out)
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

static int utf8_valid(const char *s, size_t len, size_t *bad_at)
{
    size_t i = 0;
    uint32_t cp;
    while (i < len) {
        int k = utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (!k) { if (bad_at) *bad_at = i; return 0; }
        i += (size_t)k;
    }
    return 1;
}

/* A decoded segment: cp[n] and byte_off[n + 1] into the original bytes. */
typedef struct {
    const char *bytes;
    size_t len;
    uint32_t *cp;
    int *byte_off;
    int n;
} lens_text;

static int text_decode(lens_text *t, const char *s, size_t len, const char *what, lens_err *err)
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
        int k = utf8_next((const unsigned char *)s + i, len - i, &cp);
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

static void text_free(lens_text *t)
{
    free(t->cp);
    free(t->byte_off);
}

/* ------------------------------------------------------------------------ */
/* Unicode classes                                                           */

static utf8proc_category_t ucat(uint32_t cp)
{
    return utf8proc_category((utf8proc_int32_t)cp);
}

/* White_Space property: what `\s` means in Python's `regex` and Rust's onig. */
static int is_white_space(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static int is_letter(uint32_t cp)
{
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    utf8proc_category_t c = ucat(cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

static int is_number(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = ucat(cp);
    return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

/* HF _is_control: every C* category, but \t \n \r are whitespace. */
static int bert_is_control(uint32_t cp)
{
    if (cp == '\t' || cp == '\n' || cp == '\r') return 0;
    utf8proc_category_t c = ucat(cp);
    return c == UTF8PROC_CATEGORY_CN || c >= UTF8PROC_CATEGORY_CC;
}

static int bert_is_whitespace(uint32_t cp)
{
    if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') return 1;
    if (cp < 0x80) return 0;
    utf8proc_category_t c = ucat(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* HF _is_punctuation: ASCII non-alphanumeric printables count even where
 * Unicode says symbol ("$", "+", "^"), plus every P* category. */
static int bert_is_punct(uint32_t cp)
{
    if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
        (cp >= 123 && cp <= 126))
        return 1;
    if (cp < 0x80) return 0;
    utf8proc_category_t c = ucat(cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* HF _is_chinese_char: the CJK Unified Ideographs blocks, not kana/hangul. */
static int bert_is_chinese(uint32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* Python's str.lower "cased" and "case-ignorable" (Unicode 3.13 D135/D136),
 * approximated from categories, only for the final-sigma rule. */
static int is_cased(uint32_t cp)
{
    utf8proc_category_t c = ucat(cp);
    if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) return 1;
    return utf8proc_tolower((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
           utf8proc_toupper((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp;
}

static int is_case_ignorable(uint32_t cp)
{
    switch (cp) {
    case '\'': case '.': case ':': case '^': case '`': case 0xB7: case 0x387: case 0x55F:
    case 0x5F4: case 0x2018: case 0x2019: case 0x2024: case 0x2027: case 0xFE13:
    case 0xFE52: case 0xFE55: case 0xFF07: case 0xFF0E: case 0xFF1A:
        return 1;
    }
    if (cp < 0x80) return 0;
    utf8proc_category_t c = ucat(cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK;
}

/* ------------------------------------------------------------------------ */
/* Hash maps                                                                 */

static uint64_t fnv1a(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ULL

/* Id of prefix+s (prefix may be empty: "##" for WordPiece continuations),
 * hashing the two parts without concatenating them. */
static int vocab_find2(const lens_tokenizer *tok, const char *prefix, size_t plen,
                       const char *s, size_t n)
{
    uint64_t h = fnv1a(fnv1a(FNV_OFFSET, prefix, plen), s, n);
    size_t total = plen + n;
    for (uint32_t i = (uint32_t)h & tok->vocab_mask;; i = (i + 1) & tok->vocab_mask) {
        uint32_t slot = tok->vocab_slots[i];
        if (!slot) return -1;
        int id = (int)slot - 1;
        const char *p = tok->piece[id];
        if ((size_t)tok->piece_len[id] == total && memcmp(p, prefix, plen) == 0 &&
            memcmp(p + plen, s, n) == 0)
            return id;
    }
}

/* Insert id under its piece; a later duplicate string takes the slot, as
 * Python's dict and Rust's HashMap do when reading vocab.txt. */
static void vocab_insert(lens_tokenizer *tok, int id)
{
    const char *p = tok->piece[id];
    size_t n = (size_t)tok->piece_len[id];
    uint64_t h = fnv1a(FNV_OFFSET, p, n);
    for (uint32_t i = (uint32_t)h & tok->vocab_mask;; i = (i + 1) & tok->vocab_mask) {
        uint32_t slot = tok->vocab_slots[i];
        if (!slot || ((size_t)tok->piece_len[slot - 1] == n && memcmp(tok->piece[slot - 1], p, n) == 0)) {
            tok->vocab_slots[i] = (uint32_t)id + 1;
            return;
        }
    }
}

static int vocab_build_index(lens_tokenizer *tok, lens_err *err)
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

/* Merges: key (left id, right id) -> rank and merged id. key UINT64_MAX is
 * empty; ids are < 2^24 so no real key collides with it. */
struct merge_slot {
    uint64_t key;
    int rank;
    int merged;
};

static uint64_t merge_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
}

static const struct merge_slot *merge_find(const lens_tokenizer *tok, int left, int right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = merge_hash(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        const struct merge_slot *s = &tok->merge_slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

/* A repeated merge line keeps the later rank, as both HF loaders do. */
static void merge_insert(lens_tokenizer *tok, int left, int right, int rank, int merged)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = merge_hash(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        struct merge_slot *s = &tok->merge_slots[i];
        if (s->key == key || s->key == UINT64_MAX) {
            s->key = key;
            s->rank = rank;
            s->merged = merged;
            return;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Files                                                                     */

static int file_exists(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Whole file, NUL-terminated; *len excludes the NUL. */
static char *file_read(const char *path, size_t *len, lens_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        lens_fail(err, errno == ENOENT ? LENS_ENOENT : LENS_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) { free(buf); buf = NULL; break; }
            buf = grown;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int read_error = ferror(f);
    fclose(f);
    if (!buf) { lens_fail(err, LENS_ENOMEM, "%s: out of memory", path); return NULL; }
    if (read_error) { free(buf); lens_fail(err, LENS_EIO, "%s: read error", path); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Optional JSON file: *out NULL when absent; malformed -> LENS_EFORMAT with
 * file and line. */
static int json_optional(const char *dir, const char *name, json_t **out, lens_err *err)
{
    char path[4096];
    *out = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!file_exists(dir, name)) return 0;
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
static const char *json_token_text(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        const json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}

static int vocab_alloc(lens_tokenizer *tok, int size, lens_err *err)
{
    tok->vocab_size = size;
    tok->piece = calloc((size_t)size, sizeof *tok->piece);
    tok->piece_len = calloc((size_t)size, sizeof *tok->piece_len);
    if (!tok->piece || !tok->piece_len) return lens_fail(err, LENS_ENOMEM, "out of memory for %d pieces", size);
    return 0;
}

static int piece_set(lens_tokenizer *tok, int id, const char *s, size_t n, lens_err *err)
{
    tok->piece[id] = malloc(n + 1);
    if (!tok->piece[id]) return lens_fail(err, LENS_ENOMEM, "out of memory for the vocabulary");
    memcpy(tok->piece[id], s, n);
    tok->piece[id][n] = 0;
    tok->piece_len[id] = (int)n;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Special (added) tokens matched literally in text                          */

static int added_add(lens_tokenizer *tok, const char *text)
{
    if (!text || !*text) return 0;
    int id = vocab_find2(tok, "", 0, text, strlen(text));
    if (id < 0) return 0; /* not in this vocabulary: nothing to match it to */
    for (int i = 0; i < tok->n_added; i++)
        if (strcmp(tok->added[i].text, text) == 0) return 0;
    if (tok->n_added == LENS_TOK_MAX_ADDED) return 0;
    char *copy = strdup(text);
    if (!copy) return -1;
    tok->added[tok->n_added++] = (added_token){ copy, (int)strlen(text), id };
    tok->added_first[(unsigned char)text[0]] = 1;
    return 0;
}

static const char *const special_keys[] = {
    "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "bos_token", "eos_token",
};

/* Special tokens from a tokenizer_config.json or special_tokens_map.json. */
static int added_from_json(lens_tokenizer *tok, const json_t *root, lens_err *err)
{
    if (!root) return 0;
    for (size_t k = 0; k < sizeof special_keys / sizeof *special_keys; k++)
        if (added_add(tok, json_token_text(json_object_get(root, special_keys[k]))) < 0) goto oom;
    const json_t *extra = json_object_get(root, "additional_special_tokens");
    size_t i;
    const json_t *v;
    if (json_is_array(extra))
        json_array_foreach(extra, i, v)
            if (added_add(tok, json_token_text(v)) < 0) goto oom;
    const json_t *dec = json_object_get(root, "added_tokens_decoder");
    const char *key;
    if (json_is_object(dec))
        json_object_foreach((json_t *)dec, key, v)
            if (added_add(tok, json_token_text(v)) < 0) goto oom;
    return 0;
oom:
    return lens_fail(err, LENS_ENOMEM, "out of memory for special tokens");
}

/* Longest added token starting at byte p of s, or NULL. */
static const added_token *added_match(const lens_tokenizer *tok, const char *s, size_t len, size_t p)
{
    const added_token *best = NULL;
    for (int i = 0; i < tok->n_added; i++) {
        const added_token *a = &tok->added[i];
        if ((size_t)a->len <= len - p && s[p] == a->text[0] && memcmp(s + p, a->text, (size_t)a->len) == 0 &&
            (!best || a->len > best->len))
            best = a;
    }
    return best;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

typedef struct {
    lens_token *v;
    int n, cap;
} tok_vec;

static int tok_push(tok_vec *out, int id, int start, int end, int segment, int special)
{
    if (out->n == out->cap) {
        int cap = out->cap ? out->cap * 2 : 64;
        lens_token *grown = realloc(out->v, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        out->v = grown;
        out->cap = cap;
    }
    out->v[out->n++] = (lens_token){ .id = id, .start = start, .end = end, .segment = segment, .special = special };
    return 0;
}

/* ------------------------------------------------------------------------ */
/* WordPiece                                                                 */

/* Normalised code points with the index of the original code point each one
 * came from. */
typedef struct {
    uint32_t *cp;
    int *orig;
    int n, cap;
} norm_buf;

static int norm_push(norm_buf *b, uint32_t cp, int orig)
{
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 256;
        uint32_t *c = realloc(b->cp, (size_t)cap * sizeof *c);
        if (!c) return -1;
        b->cp = c;
        int *o = realloc(b->orig, (size_t)cap * sizeof *o);
        if (!o) return -1;
        b->orig = o;
        b->cap = cap;
    }
    b->cp[b->n] = cp;
    b->orig[b->n++] = orig;
    return 0;
}

typedef struct {
    norm_buf cleaned, normal;
    char *word_utf8;
    int *word_off;
    int word_cap;
} wp_scratch;

/* Python str.lower: per code point simple mapping, plus İ -> "i\u0307" (the
 * only unconditional multi-character lower-case mapping) and final sigma.
 * utf8proc_tolower alone would give 'i' and always 'σ'. */
static int wp_lower(const norm_buf *in, int i, uint32_t out[2])
{
    uint32_t cp = in->cp[i];
    if (cp < 0x80) { out[0] = (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; return 1; }
    if (cp == 0x130) { out[0] = 'i'; out[1] = 0x307; return 2; }
    if (cp == 0x3A3) {
        int j = i - 1;
        while (j >= 0 && is_case_ignorable(in->cp[j])) j--;
        int final = j >= 0 && is_cased(in->cp[j]);
        if (final) {
            j = i + 1;
            while (j < in->n && is_case_ignorable(in->cp[j])) j++;
            final = j == in->n || !is_cased(in->cp[j]);
        }
        out[0] = final ? 0x3C2 : 0x3C3;
        return 1;
    }
    out[0] = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
    return 1;
}

/* NFD of one code point with Mn dropped (HF strip_accents). */
static int wp_strip_push(norm_buf *out, uint32_t cp, int orig)
{
    if (cp < 0x80) return norm_push(out, cp, orig);
    utf8proc_int32_t dec[32];
    int last_boundclass = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, dec, 32, UTF8PROC_DECOMPOSE, &last_boundclass);
    if (n < 0 || n > 32) { dec[0] = (utf8proc_int32_t)cp; n = 1; }
    for (utf8proc_ssize_t k = 0; k < n; k++) {
        if (ucat((uint32_t)dec[k]) == UTF8PROC_CATEGORY_MN) continue;
        if (norm_push(out, (uint32_t)dec[k], orig) < 0) return -1;
    }
    return 0;
}

/* One word (normalised code points w[0..n) with origins) -> pieces. */
static int wp_word(const lens_tokenizer *tok, wp_scratch *sc, const uint32_t *w, const int *orig, int n,
                   int segment, tok_vec *out)
{
    if (n > tok->max_input_chars_per_word)
        return tok_push(out, tok->unk_id, orig[0], orig[n - 1] + 1, segment, 0);
    if (n + 1 > sc->word_cap) {
        int cap = (n + 1) * 2;
        char *u = realloc(sc->word_utf8, (size_t)cap * 4);
        if (!u) return -1;
        sc->word_utf8 = u;
        int *o = realloc(sc->word_off, (size_t)cap * sizeof *o);
        if (!o) return -1;
        sc->word_off = o;
        sc->word_cap = cap;
    }
    int nb = 0;
    for (int i = 0; i < n; i++) {
        sc->word_off[i] = nb;
        nb += utf8_put(w[i], sc->word_utf8 + nb);
    }
    sc->word_off[n] = nb;

    int first = out->n;
    int start = 0;
    while (start < n) {
        int end = n, id = -1;
        size_t plen = start > 0 ? 2 : 0;
        while (end > start && sc->word_off[end] - sc->word_off[start] + (int)plen > tok->max_piece_len) end--;
        for (; end > start; end--) {
            id = vocab_find2(tok, "##", plen, sc->word_utf8 + sc->word_off[start],
                             (size_t)(sc->word_off[end] - sc->word_off[start]));
            if (id >= 0) break;
        }
        if (id < 0) {
            /* Like HF: one unmatched rest makes the whole word [UNK]. */
            out->n = first;
            return tok_push(out, tok->unk_id, orig[0], orig[n - 1] + 1, segment, 0);
        }
        if (tok_push(out, id, orig[start], orig[end - 1] + 1, segment, 0) < 0) return -1;
        start = end;
    }
    return 0;
}

/* Code points [a, b) of t, free of added tokens -> WordPiece tokens. */
static int wp_range(const lens_tokenizer *tok, wp_scratch *sc, const lens_text *t, int a, int b,
                    int segment, tok_vec *out)
{
    norm_buf *cl = &sc->cleaned, *nm = &sc->normal;
    cl->n = 0;
    nm->n = 0;
    for (int i = a; i < b; i++) {
        uint32_t cp = t->cp[i];
        if (cp == 0 || cp == 0xFFFD || bert_is_control(cp)) continue;
        int rc;
        if (bert_is_whitespace(cp)) rc = norm_push(cl, ' ', i);
        else if (tok->chinese_chars && bert_is_chinese(cp))
            rc = norm_push(cl, ' ', i) | norm_push(cl, cp, i) | norm_push(cl, ' ', i);
        else rc = norm_push(cl, cp, i);
        if (rc < 0) return -1;
    }
    for (int i = 0; i < cl->n; i++) {
        uint32_t low[2] = { cl->cp[i], 0 };
        int k = tok->do_lower_case ? wp_lower(cl, i, low) : 1;
        for (int j = 0; j < k; j++) {
            int rc = tok->strip_accents ? wp_strip_push(nm, low[j], cl->orig[i]) : norm_push(nm, low[j], cl->orig[i]);
            if (rc < 0) return -1;
        }
    }
    int ws = -1; /* start of the current word in nm, -1 when none */
    for (int i = 0; i <= nm->n; i++) {
        uint32_t cp = i < nm->n ? nm->cp[i] : ' ';
        int boundary = cp == ' ' || bert_is_punct(cp);
        if (!boundary) {
            if (ws < 0) ws = i;
            continue;
        }
        if (ws >= 0 && wp_word(tok, sc, nm->cp + ws, nm->orig + ws, i - ws, segment, out) < 0) return -1;
        ws = -1;
        if (cp != ' ' && wp_word(tok, sc, nm->cp + i, nm->orig + i, 1, segment, out) < 0) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* BPE                                                                       */

typedef struct {
    int id;
    int prev, next;
    int byte_start, byte_len; /* byte_len 0: merged into its left neighbour */
} bpe_sym;

typedef struct {
    int rank, pos;
} bpe_cand;

/* Per-call cache of short pre-tokens: running text repeats words, so most
 * words skip the merge loop. It lives in the call's scratch, not in the
 * tokenizer, so concurrent calls never share it and need no lock. */
#define BPE_CACHE_MAX_WORD 64
typedef struct {
    uint64_t hash;
    int byte_start, byte_len; /* the word's bytes in the text */
    int first, count;         /* its tokens in cache_tok */
} bpe_cache_entry;

typedef struct {
    int id, byte_len;
} bpe_cache_tok;

typedef struct {
    bpe_sym *sym;
    bpe_cand *heap;
    int sym_cap, heap_cap, heap_n;
    uint8_t *cls;      /* [n cp] 0 space, 1 letter, 2 number, 3 other */
    int *cp_of_byte;   /* [len] code point index of each byte */
    const char *cache_text;
    uint32_t *cache_slots; /* entry index + 1, 0 = empty */
    uint32_t cache_mask;
    bpe_cache_entry *entry;
    int n_entry, entry_cap;
    bpe_cache_tok *ctok;
    int n_ctok, ctok_cap;
} bpe_scratch;

static int bpe_cache_grow(bpe_scratch *sc)
{
    uint32_t cap = sc->cache_slots ? (sc->cache_mask + 1) * 2 : 4096;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (int e = 0; e < sc->n_entry; e++) {
        uint32_t i = (uint32_t)sc->entry[e].hash & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)e + 1;
    }
    free(sc->cache_slots);
    sc->cache_slots = slots;
    sc->cache_mask = cap - 1;
    return 0;
}

/* Slot for word bytes [b0, b0 + n): the matching entry or the empty slot
 * where it belongs. */
static uint32_t *bpe_cache_slot(bpe_scratch *sc, uint64_t h, int b0, int n)
{
    for (uint32_t i = (uint32_t)h & sc->cache_mask;; i = (i + 1) & sc->cache_mask) {
        uint32_t *slot = &sc->cache_slots[i];
        if (!*slot) return slot;
        const bpe_cache_entry *e = &sc->entry[*slot - 1];
        if (e->hash == h && e->byte_len == n && memcmp(sc->cache_text + e->byte_start, sc->cache_text + b0, (size_t)n) == 0)
            return slot;
    }
}

static int cand_less(bpe_cand x, bpe_cand y)
{
    return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos);
}

static int heap_push(bpe_scratch *sc, int rank, int pos)
{
    if (sc->heap_n == sc->heap_cap) {
        int cap = sc->heap_cap ? sc->heap_cap * 2 : 256;
        bpe_cand *h = realloc(sc->heap, (size_t)cap * sizeof *h);
        if (!h) return -1;
        sc->heap = h;
        sc->heap_cap = cap;
    }
    int i = sc->heap_n++;
    bpe_cand c = { rank, pos };
    while (i > 0 && cand_less(c, sc->heap[(i - 1) / 2])) {
        sc->heap[i] = sc->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    sc->heap[i] = c;
    return 0;
}

static bpe_cand heap_pop(bpe_scratch *sc)
{
    bpe_cand top = sc->heap[0], last = sc->heap[--sc->heap_n];
    int i = 0, n = sc->heap_n;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(sc->heap[c + 1], sc->heap[c])) c++;
        if (!cand_less(sc->heap[c], last)) break;
        sc->heap[i] = sc->heap[c];
        i = c;
    }
    if (n) sc->heap[i] = last;
    return top;
}

static int bpe_push_pair(const lens_tokenizer *tok, bpe_scratch *sc, int pos)
{
    int next = sc->sym[pos].next;
    if (next < 0) return 0;
    const struct merge_slot *m = merge_find(tok, sc->sym[pos].id, sc->sym[next].id);
    return m ? heap_push(sc, m->rank, pos) : 0;
}

/* Bytes [b0, b1) of one pre-token -> merged symbols -> tokens. Ties in rank
 * go to the leftmost pair, which is what both HF implementations produce. */
static int bpe_word(const lens_tokenizer *tok, bpe_scratch *sc, const lens_text *t, int b0, int b1,
                    int segment, tok_vec *out)
{
    int n = b1 - b0;
    uint32_t *slot = NULL;
    uint64_t h = 0;
    if (n <= BPE_CACHE_MAX_WORD) {
        if ((uint32_t)sc->n_entry * 2 >= sc->cache_mask && bpe_cache_grow(sc) < 0) return -1;
        h = fnv1a(FNV_OFFSET, t->bytes + b0, (size_t)n);
        slot = bpe_cache_slot(sc, h, b0, n);
        if (*slot) {
            const bpe_cache_entry *e = &sc->entry[*slot - 1];
            int at = b0;
            for (int k = e->first; k < e->first + e->count; k++) {
                const bpe_cache_tok *c = &sc->ctok[k];
                if (tok_push(out, c->id, sc->cp_of_byte[at], sc->cp_of_byte[at + c->byte_len - 1] + 1, segment, 0) < 0)
                    return -1;
                at += c->byte_len;
            }
            return 0;
        }
    }
    if (n > sc->sym_cap) {
        bpe_sym *s = realloc(sc->sym, (size_t)n * 2 * sizeof *s);
        if (!s) return -1;
        sc->sym = s;
        sc->sym_cap = n * 2;
    }
    const unsigned char *bytes = (const unsigned char *)t->bytes;
    for (int k = 0; k < n; k++)
        sc->sym[k] = (bpe_sym){ tok->byte_id[bytes[b0 + k]], k - 1, k + 1 < n ? k + 1 : -1, b0 + k, 1 };
    sc->heap_n = 0;
    for (int k = 0; k + 1 < n; k++)
        if (bpe_push_pair(tok, sc, k) < 0) return -1;
    while (sc->heap_n) {
        bpe_cand c = heap_pop(sc);
        bpe_sym *left = &sc->sym[c.pos];
        if (!left->byte_len || left->next < 0) continue;
        bpe_sym *right = &sc->sym[left->next];
        const struct merge_slot *m = merge_find(tok, left->id, right->id);
        if (!m || m->rank != c.rank) continue; /* stale: a neighbour changed since */
        left->id = m->merged;
        left->byte_len += right->byte_len;
        right->byte_len = 0;
        left->next = right->next;
        if (left->next >= 0) sc->sym[left->next].prev = c.pos;
        if (left->prev >= 0 && bpe_push_pair(tok, sc, left->prev) < 0) return -1;
        if (bpe_push_pair(tok, sc, c.pos) < 0) return -1;
    }
    int first = sc->n_ctok;
    for (int k = 0; k >= 0; k = sc->sym[k].next) {
        const bpe_sym *s = &sc->sym[k];
        int start = sc->cp_of_byte[s->byte_start];
        int end = sc->cp_of_byte[s->byte_start + s->byte_len - 1] + 1;
        if (tok_push(out, s->id, start, end, segment, 0) < 0) return -1;
        if (!slot) continue;
        if (sc->n_ctok == sc->ctok_cap) {
            int cap = sc->ctok_cap ? sc->ctok_cap * 2 : 4096;
            bpe_cache_tok *c = realloc(sc->ctok, (size_t)cap * sizeof *c);
            if (!c) return -1;
            sc->ctok = c;
            sc->ctok_cap = cap;
        }
        sc->ctok[sc->n_ctok++] = (bpe_cache_tok){ s->id, s->byte_len };
    }
    if (slot) {
        if (sc->n_entry == sc->entry_cap) {
            int cap = sc->entry_cap ? sc->entry_cap * 2 : 1024;
            bpe_cache_entry *e = realloc(sc->entry, (size_t)cap * sizeof *e);
            if (!e) return -1;
            sc->entry = e;
            sc->entry_cap = cap;
        }
        sc->entry[sc->n_entry] = (bpe_cache_entry){ h, b0, n, first, sc->n_ctok - first };
        *slot = (uint32_t)++sc->n_entry;
    }
    return 0;
}

enum { GPT2_SPACE, GPT2_LETTER, GPT2_NUMBER, GPT2_OTHER };

static void gpt2_classify(const uint32_t *cp, int a, int b, uint8_t *cls)
{
    for (int i = a; i < b; i++)
        cls[i] = is_white_space(cp[i]) ? GPT2_SPACE : is_letter(cp[i]) ? GPT2_LETTER
               : is_number(cp[i]) ? GPT2_NUMBER : GPT2_OTHER;
}

/* GPT-2's pre-tokenizer over code points [i, b): the end of the pre-token
 * that starts at i, for the regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * The alternatives are tried in order at each position, as the regex engine
 * does; the only backtracking case is \s+(?!\S), which gives back the last
 * white space character when a non-space follows. */
static int gpt2_word_end(const uint32_t *cp, const uint8_t *cls, int i, int b)
{
    int j = i;
    if (cp[i] == '\'' && i + 1 < b) {
        uint32_t c1 = cp[i + 1], c2 = i + 2 < b ? cp[i + 2] : 0;
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') j = i + 2;
        else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) j = i + 3;
    }
    if (j == i) {
        int k = i + (cp[i] == ' ' && i + 1 < b && cls[i + 1] != GPT2_SPACE);
        int c = cls[k];
        if (c != GPT2_SPACE) {
            j = k;
            while (j < b && cls[j] == c) j++;
        } else {
            j = i;
            while (j < b && cls[j] == GPT2_SPACE) j++;
            if (j < b && j - i > 1) j--; /* \s+(?!\S) leaves one for the next word */
        }
    }
    return j;
}

static int bpe_range(const lens_tokenizer *tok, bpe_scratch *sc, const lens_text *t, int a, int b,
                     int segment, tok_vec *out)
{
    gpt2_classify(t->cp, a, b, sc->cls);
    for (int i = a; i < b;) {
        int j = gpt2_word_end(t->cp, sc->cls, i, b);
        if (bpe_word(tok, sc, t, t->byte_off[i], t->byte_off[j], segment, out) < 0) return -1;
        i = j;
    }
    return 0;
}

int lens_gpt2_pretokenize(const char *text, size_t len, int (*word)(void *ctx, size_t start, size_t end),
                          void *ctx, lens_err *err)
{
    lens_text t;
    if (text_decode(&t, text ? text : "", text ? len : 0, "text", err) < 0) return -1;
    uint8_t *cls = malloc((size_t)t.n + 1);
    if (!cls) {
        text_free(&t);
        return lens_fail(err, LENS_ENOMEM, "out of memory pre-tokenizing %zu bytes", len);
    }
    gpt2_classify(t.cp, 0, t.n, cls);
    int rc = 0;
    for (int i = 0; i < t.n && rc == 0;) {
        int j = gpt2_word_end(t.cp, cls, i, t.n);
        rc = word(ctx, (size_t)t.byte_off[i], (size_t)t.byte_off[j]);
        i = j;
    }
    free(cls);
    text_free(&t);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */

static int load_wordpiece(lens_tokenizer *tok, const char *dir, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    size_t len;
    char *data = file_read(path, &len, err);
    if (!data) return -1;
    size_t bad;
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += data[i] == '\n';
    if (len && data[len - 1] != '\n') lines++;
    int rc = -1;
    if (lines == 0) { lens_fail(err, LENS_EFORMAT, "%s: empty vocabulary", path); goto done; }
    if (lines > LENS_TOK_MAX_ID) { lens_fail(err, LENS_EFORMAT, "%s: %d lines, over %d", path, lines, LENS_TOK_MAX_ID); goto done; }
    if (vocab_alloc(tok, lines, err) < 0) goto done;
    char *p = data;
    for (int line = 0; line < lines; line++) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(data + len - p);
        /* Rust's WordPiece loader trims trailing white space (and so \r). */
        while (n && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (n == 0) { lens_fail(err, LENS_EFORMAT, "%s:%d: empty token", path, line + 1); goto done; }
        if (memchr(p, 0, n)) { lens_fail(err, LENS_EFORMAT, "%s:%d: NUL byte in token", path, line + 1); goto done; }
        if (!utf8_valid(p, n, &bad)) {
            lens_fail(err, LENS_EFORMAT, "%s:%d: not valid UTF-8 at column %zu", path, line + 1, bad + 1);
            goto done;
        }
        if (piece_set(tok, line, p, n, err) < 0) goto done;
        p = nl ? nl + 1 : data + len;
    }
    if (vocab_build_index(tok, err) < 0) goto done;

    json_t *config = NULL, *map = NULL;
    if (json_optional(dir, "tokenizer_config.json", &config, err) < 0) goto done;
    if (json_optional(dir, "special_tokens_map.json", &map, err) < 0) { json_decref(config); goto done; }
    tok->do_lower_case = 1;
    tok->chinese_chars = 1;
    int strip = -1; /* null: follow do_lower_case */
    tok->max_input_chars_per_word = 100;
    const char *unk = "[UNK]", *cls = "[CLS]", *sep = "[SEP]";
    if (config) {
        const json_t *v;
        if ((v = json_object_get(config, "do_lower_case")) && json_is_boolean(v)) tok->do_lower_case = json_is_true(v);
        if ((v = json_object_get(config, "strip_accents")) && json_is_boolean(v)) strip = json_is_true(v);
        if ((v = json_object_get(config, "tokenize_chinese_chars")) && json_is_boolean(v)) tok->chinese_chars = json_is_true(v);
        if ((v = json_object_get(config, "max_input_chars_per_word")) && json_is_number(v) && json_number_value(v) >= 1)
            tok->max_input_chars_per_word = json_number_value(v) < INT_MAX ? (int)json_number_value(v) : INT_MAX;
    }
    tok->strip_accents = strip < 0 ? tok->do_lower_case : strip;
    const json_t *src[2] = { config, map };
    for (int s = 0; s < 2; s++) {
        if (!src[s]) continue;
        const char *v;
        if ((v = json_token_text(json_object_get(src[s], "unk_token")))) unk = v;
        if ((v = json_token_text(json_object_get(src[s], "cls_token")))) cls = v;
        if ((v = json_token_text(json_object_get(src[s], "sep_token")))) sep = v;
    }
    tok->unk_id = vocab_find2(tok, "", 0, unk, strlen(unk));
    tok->cls_id = vocab_find2(tok, "", 0, cls, strlen(cls));
    tok->sep_id = vocab_find2(tok, "", 0, sep, strlen(sep));
    const char *missing = tok->unk_id < 0 ? unk : tok->cls_id < 0 ? cls : tok->sep_id < 0 ? sep : NULL;
    if (missing) {
        lens_fail(err, LENS_EFORMAT, "%s: special token \"%s\" is not in the vocabulary", path, missing);
    } else {
        /* BertTokenizer's defaults are special tokens even without a config. */
        static const char *const defaults[] = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]" };
        rc = 0;
        for (int k = 0; k < 5 && rc == 0; k++) rc = added_add(tok, defaults[k]) < 0 ? lens_fail(err, LENS_ENOMEM, "out of memory") : 0;
        if (rc == 0 && added_add(tok, unk) < 0) rc = lens_fail(err, LENS_ENOMEM, "out of memory");
        if (rc == 0) rc = added_from_json(tok, config, err);
        if (rc == 0) rc = added_from_json(tok, map, err);
    }
    json_decref(config);
    json_decref(map);
done:
    free(data);
    return rc;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes map to U+0100.. in byte order, so every byte has a
 * visible, valid-UTF-8 symbol in vocab.json. */
static uint32_t byte_to_unicode(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int k = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) k++;
    return 256 + (uint32_t)k;
}

static int load_bpe(lens_tokenizer *tok, const char *dir, const char *vocab_name, const char *merges_name,
                    lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, vocab_name);
    json_error_t jerr;
    json_t *vocab = json_load_file(path, 0, &jerr);
    if (!vocab) {
        if (!file_exists(dir, vocab_name)) return lens_fail(err, LENS_ENOENT, "%s: not found", path);
        return lens_fail(err, LENS_EFORMAT, "%s:%d: %s", path, jerr.line, jerr.text);
    }
    int rc = -1;
    char *data = NULL;
    const char *key;
    json_t *v;
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
        lens_fail(err, LENS_EFORMAT, "%s: expected a non-empty object of piece -> id", path);
        goto done;
    }
    int max_id = -1;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= LENS_TOK_MAX_ID) {
            lens_fail(err, LENS_EFORMAT, "%s: id of \"%.64s\" is not an integer in [0, %d)", path, key, LENS_TOK_MAX_ID);
            goto done;
        }
        if (json_integer_value(v) > max_id) max_id = (int)json_integer_value(v);
    }
    if (vocab_alloc(tok, max_id + 1, err) < 0) goto done;
    json_object_foreach(vocab, key, v) {
        int id = (int)json_integer_value(v);
        if (tok->piece[id]) {
            lens_fail(err, LENS_EFORMAT, "%s: id %d given to both \"%.64s\" and \"%.64s\"", path, id, tok->piece[id], key);
            goto done;
        }
        size_t n = strlen(key);
        if (n == 0) { lens_fail(err, LENS_EFORMAT, "%s: empty piece (id %d)", path, id); goto done; }
        if (piece_set(tok, id, key, n, err) < 0) goto done;
    }
    if (vocab_build_index(tok, err) < 0) goto done;
    for (int b = 0; b < 256; b++) {
        char sym[4];
        int n = utf8_put(byte_to_unicode(b), sym);
        tok->byte_id[b] = vocab_find2(tok, "", 0, sym, (size_t)n);
        if (tok->byte_id[b] < 0) {
            lens_fail(err, LENS_EFORMAT, "%s: no piece for byte 0x%02x (\"%.*s\"), not a byte-level vocabulary",
                      path, b, n, sym);
            goto done;
        }
    }

    snprintf(path, sizeof path, "%s/%s", dir, merges_name);
    size_t len;
    data = file_read(path, &len, err);
    if (!data) goto done;
    int n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += data[i] == '\n';
    uint64_t cap = 16;
    while (cap < (uint64_t)n_lines * 2) cap <<= 1;
    tok->merge_slots = malloc(cap * sizeof *tok->merge_slots);
    if (!tok->merge_slots) { lens_fail(err, LENS_ENOMEM, "out of memory for merges"); goto done; }
    for (uint64_t i = 0; i < cap; i++) tok->merge_slots[i].key = UINT64_MAX;
    tok->merge_mask = cap - 1;
    char *p = data, *merged = NULL;
    int rank = 0;
    for (int line = 1; p < data + len; line++) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(data + len - p);
        char *row = p;
        p = nl ? nl + 1 : data + len;
        if (n && row[n - 1] == '\r') n--;
        if (n == 0 || (line == 1 && n >= 8 && memcmp(row, "#version", 8) == 0)) continue;
        char *sp = memchr(row, ' ', n);
        if (!sp || sp == row || sp == row + n - 1 || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - row))) {
            lens_fail(err, LENS_EFORMAT, "%s:%d: expected two pieces separated by one space", path, line);
            goto done;
        }
        size_t ln = (size_t)(sp - row), rn = n - ln - 1;
        int left = vocab_find2(tok, "", 0, row, ln), right = vocab_find2(tok, "", 0, sp + 1, rn);
        merged = malloc(ln + rn);
        if (!merged) { lens_fail(err, LENS_ENOMEM, "out of memory for merges"); goto done; }
        memcpy(merged, row, ln);
        memcpy(merged + ln, sp + 1, rn);
        int to = vocab_find2(tok, "", 0, merged, ln + rn);
        free(merged);
        if (left < 0 || right < 0 || to < 0) {
            lens_fail(err, LENS_EFORMAT, "%s:%d: \"%.*s\" is not in %s", path, line,
                      left < 0 ? (int)ln : right < 0 ? (int)rn : (int)n,
                      left < 0 ? row : right < 0 ? sp + 1 : row, vocab_name);
            goto done;
        }
        merge_insert(tok, left, right, rank++, to);
    }

    json_t *config = NULL, *map = NULL;
    if (json_optional(dir, "tokenizer_config.json", &config, err) < 0) goto done;
    if (json_optional(dir, "special_tokens_map.json", &map, err) < 0) { json_decref(config); goto done; }
    /* GPT2Tokenizer's unk/bos/eos default to <|endoftext|>. */
    rc = added_add(tok, "<|endoftext|>") < 0 ? lens_fail(err, LENS_ENOMEM, "out of memory") : 0;
    if (rc == 0) rc = added_from_json(tok, config, err);
    if (rc == 0) rc = added_from_json(tok, map, err);
    json_decref(config);
    json_decref(map);
done:
    free(data);
    json_decref(vocab);
    return rc;
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
    free(tok->merge_slots);
    for (int i = 0; i < tok->n_added; i++) free(tok->added[i].text);
    free(tok);
}

lens_tokenizer *lens_tokenizer_load(const char *dir, lens_err *err)
{
    lens_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) { lens_fail(err, LENS_ENOMEM, "out of memory"); return NULL; }
    int rc;
    if (file_exists(dir, "vocab.txt")) {
        tok->kind = LENS_TOK_WORDPIECE;
        rc = load_wordpiece(tok, dir, err);
    } else if (file_exists(dir, "vocab.json") && file_exists(dir, "merges.txt")) {
        tok->kind = LENS_TOK_BPE;
        rc = load_bpe(tok, dir, "vocab.json", "merges.txt", err);
    } else if (file_exists(dir, "encoder.json") && file_exists(dir, "vocab.bpe")) {
        tok->kind = LENS_TOK_BPE;
        rc = load_bpe(tok, dir, "encoder.json", "vocab.bpe", err);
    } else {
        rc = lens_fail(err, LENS_ENOENT,
                       "%s: no tokenizer files (vocab.txt, vocab.json + merges.txt, or encoder.json + vocab.bpe)", dir);
    }
    if (rc < 0) {
        lens_tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

lens_tok_kind lens_tokenizer_kind(const lens_tokenizer *tok) { return tok->kind; }

int lens_tokenizer_vocab_size(const lens_tokenizer *tok) { return tok->vocab_size; }

const char *lens_tokenizer_piece(const lens_tokenizer *tok, int id)
{
    return id >= 0 && id < tok->vocab_size ? tok->piece[id] : NULL;
}

int lens_tokenizer_id(const lens_tokenizer *tok, const char *piece)
{
    return piece ? vocab_find2(tok, "", 0, piece, strlen(piece)) : -1;
}

typedef struct {
    wp_scratch wp;
    bpe_scratch bpe;
} tok_scratch;

static void scratch_free(tok_scratch *sc)
{
    free(sc->wp.cleaned.cp);
    free(sc->wp.cleaned.orig);
    free(sc->wp.normal.cp);
    free(sc->wp.normal.orig);
    free(sc->wp.word_utf8);
    free(sc->wp.word_off);
    free(sc->bpe.sym);
    free(sc->bpe.heap);
    free(sc->bpe.cls);
    free(sc->bpe.cp_of_byte);
    free(sc->bpe.cache_slots);
    free(sc->bpe.entry);
    free(sc->bpe.ctok);
}

/* One segment: split at added tokens, run the kind's pipeline between them. */
static int tokenize_segment(const lens_tokenizer *tok, tok_scratch *sc, const lens_text *t, int segment,
                            tok_vec *out)
{
    if (tok->kind == LENS_TOK_BPE) {
        free(sc->bpe.cls);
        free(sc->bpe.cp_of_byte);
        sc->bpe.cls = malloc((size_t)t->n + 1);
        sc->bpe.cp_of_byte = malloc((t->len + 1) * sizeof *sc->bpe.cp_of_byte);
        if (!sc->bpe.cls || !sc->bpe.cp_of_byte) return -1;
        for (int i = 0; i < t->n; i++)
            for (int b = t->byte_off[i]; b < t->byte_off[i + 1]; b++) sc->bpe.cp_of_byte[b] = i;
        /* Cache entries point into the segment's bytes: start afresh. */
        sc->bpe.cache_text = t->bytes;
        sc->bpe.n_entry = sc->bpe.n_ctok = 0;
        if (sc->bpe.cache_slots) memset(sc->bpe.cache_slots, 0, ((size_t)sc->bpe.cache_mask + 1) * sizeof *sc->bpe.cache_slots);
    }
    int a = 0;
    for (int i = 0; i <= t->n; i++) {
        const added_token *m = NULL;
        if (i < t->n && tok->added_first[(unsigned char)t->bytes[t->byte_off[i]]])
            m = added_match(tok, t->bytes, t->len, (size_t)t->byte_off[i]);
        if (i < t->n && !m) continue;
        if (i > a) {
            int rc = tok->kind == LENS_TOK_BPE ? bpe_range(tok, &sc->bpe, t, a, i, segment, out)
                                               : wp_range(tok, &sc->wp, t, a, i, segment, out);
            if (rc < 0) return -1;
        }
        if (!m) break;
        int j = i;
        while (t->byte_off[j] < t->byte_off[i] + m->len) j++;
        if (tok_push(out, m->id, i, j, segment, 0) < 0) return -1;
        a = j;
        i = j - 1;
    }
    return 0;
}

int lens_tokenize(const lens_tokenizer *tok, const char *text, size_t len,
                  const char *pair, size_t pair_len,
                  lens_token **out, int *n_out, lens_err *err)
{
    *out = NULL;
    *n_out = 0;
    if (!text && len) return lens_fail(err, LENS_EINVAL, "text is NULL");
    if (!text) text = "";
    lens_text t = { 0 }, tp = { 0 };
    if (text_decode(&t, text, len, "text", err) < 0) return -1;
    if (pair && text_decode(&tp, pair, pair_len, "text_pair", err) < 0) {
        text_free(&t);
        return -1;
    }
    tok_vec v = { 0 };
    tok_scratch sc;
    memset(&sc, 0, sizeof sc);
    int wp = tok->kind == LENS_TOK_WORDPIECE;
    int rc = 0;
    if (wp) rc |= tok_push(&v, tok->cls_id, -1, -1, 0, 1);
    if (!rc) rc = tokenize_segment(tok, &sc, &t, 0, &v);
    if (!rc && wp) rc = tok_push(&v, tok->sep_id, -1, -1, 0, 1);
    if (!rc && pair) rc = tokenize_segment(tok, &sc, &tp, 1, &v);
    if (!rc && pair && wp) rc = tok_push(&v, tok->sep_id, -1, -1, 1, 1);
    scratch_free(&sc);
    text_free(&t);
    text_free(&tp);
    if (rc) {
        free(v.v);
        return lens_fail(err, LENS_ENOMEM, "out of memory while tokenizing");
    }
    if (v.n > 0 && v.n < v.cap) {
        lens_token *shrunk = realloc(v.v, (size_t)v.n * sizeof *shrunk);
        if (shrunk) v.v = shrunk;
    }
    *out = v.v;
    *n_out = v.n;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Decoding: ids -> text                                                     */

/* Growable output buffer of lens_tokenizer_decode. */
typedef struct {
    char *s;
    size_t len, cap;
} text_buf;

static int buf_put(text_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *grown = realloc(b->s, cap);
        if (!grown) return -1;
        b->s = grown, b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
    return 0;
}

static int is_added(const lens_tokenizer *tok, int id)
{
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].id == id) return 1;
    return 0;
}

/* HF's clean_up_tokenization (BERT tokenizers default to it): no space
 * before . ? ! , and English contractions. In place. */
static void clean_up_spaces(char *s, size_t *len)
{
    static const char *const pairs[][2] = {{" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
                                           {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
                                           {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
        size_t from = strlen(pairs[p][0]), to = strlen(pairs[p][1]), w = 0;
        for (size_t r = 0; r < *len;) {
            if (*len - r >= from && !memcmp(s + r, pairs[p][0], from)) {
                memmove(s + w, pairs[p][1], to);
                w += to, r += from;
            } else {
                s[w++] = s[r++];
            }
        }
        *len = w;
        s[w] = 0;
    }
}

/* Byte-level BPE: each code point of a piece stands for one byte
 * (byte_to_unicode's inverse); pieces are concatenated as bytes, and byte
 * runs that are not valid UTF-8 become U+FFFD, as HF's errors="replace". */
static int decode_bytes(const lens_tokenizer *tok, const int *ids, int n, int skip_special, text_buf *out)
{
    int byte_of[256 + 68];
    for (int b = 0; b < 256; b++) byte_of[byte_to_unicode(b)] = b;
    text_buf raw = {0};
    for (int i = 0; i < n; i++) {
        const char *p = lens_tokenizer_piece(tok, ids[i]);
        if (!p || (skip_special && is_added(tok, ids[i]))) continue;
        size_t len = strlen(p);
        for (size_t k = 0; k < len;) {
            uint32_t cp;
            int step = utf8_next((const unsigned char *)p + k, len - k, &cp);
            if (step == 0) step = 1, cp = 0xFFFD;
            k += (size_t)step;
            char byte = (char)(cp < 256 + 68 ? byte_of[cp] : '?');
            if (buf_put(&raw, &byte, 1)) return free(raw.s), -1;
        }
    }
    for (size_t k = 0; k < raw.len;) {
        uint32_t cp;
        int step = utf8_next((const unsigned char *)raw.s + k, raw.len - k, &cp);
        int rc = step ? buf_put(out, raw.s + k, (size_t)step) : buf_put(out, "\xEF\xBF\xBD", 3);
        k += step ? (size_t)step : 1;
        if (rc) return free(raw.s), -1;
    }
    free(raw.s);
    return out->s || !buf_put(out, "", 0) ? 0 : -1;
}

/* WordPiece: pieces joined by spaces, "##" continuations glued to the
 * previous piece, then clean_up_spaces. */
static int decode_wordpiece(const lens_tokenizer *tok, const int *ids, int n, int skip_special, text_buf *out)
{
    if (buf_put(out, "", 0)) return -1;
    for (int i = 0; i < n; i++) {
        const char *p = lens_tokenizer_piece(tok, ids[i]);
        if (!p || (skip_special && (ids[i] == tok->cls_id || ids[i] == tok->sep_id || is_added(tok, ids[i]))))
            continue;
        int glue = !strncmp(p, "##", 2);
        if (glue) p += 2;
        else if (out->len && buf_put(out, " ", 1)) return -1;
        if (buf_put(out, p, strlen(p))) return -1;
    }
    clean_up_spaces(out->s, &out->len);
    return 0;
}

int lens_tokenizer_decode(const lens_tokenizer *tok, const int *ids, int n, int skip_special, char **text,
                          size_t *len, lens_err *err)
{
    for (int i = 0; i < n; i++)
        if (!lens_tokenizer_piece(tok, ids[i]))
            return lens_fail(err, LENS_EINVAL, "id %d at index %d is not in the vocabulary (size %d)", ids[i], i,
                             tok->vocab_size);
    text_buf out = {0};
    int rc = tok->kind == LENS_TOK_BPE ? decode_bytes(tok, ids, n, skip_special, &out)
                                       : decode_wordpiece(tok, ids, n, skip_special, &out);
    if (rc) {
        free(out.s);
        return lens_fail(err, LENS_ENOMEM, "out of memory decoding %d ids", n);
    }
    *text = out.s;
    if (len) *len = out.len;
    return 0;
}
