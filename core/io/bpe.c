/* bpe.c - BPE: byte-level (GPT-2, RoBERTa, Llama-3, Qwen) and
 * SentencePiece-style with byte fallback (Llama-2, Mistral, Gemma), the
 * merge table, and the vocab.json + merges.txt loader.
 *
 * One merge engine for both: a pre-token becomes symbols (byte-level: one
 * per byte, through GPT-2's bytes_to_unicode alphabet; SentencePiece-style:
 * one per character, a character missing from the vocabulary becomes its
 * <0xXX> byte tokens with byte_fallback, else the unknown token, fused with
 * fuse_unk), then the pair of lowest merge rank is merged until none is
 * left, with a min-heap (O(n log n) per word, so a 1 MB word without spaces
 * stays cheap); ties go to the leftmost pair, as in both HF
 * implementations. ignore_merges (Llama-3) takes a pre-token that is itself
 * in the vocabulary as one token. A token's span covers every character one
 * of its bytes belongs to, so two byte tokens of one emoji both get the
 * emoji's span. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

/* ------------------------------------------------------------------------ */
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

int lens_merges_alloc(lens_tokenizer *tok, int n, lens_err *err)
{
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    tok->merge_slots = malloc(cap * sizeof *tok->merge_slots);
    if (!tok->merge_slots) return lens_fail(err, LENS_ENOMEM, "out of memory for %d merges", n);
    for (uint64_t i = 0; i < cap; i++) tok->merge_slots[i].key = UINT64_MAX;
    tok->merge_mask = cap - 1;
    return 0;
}

/* A repeated merge keeps the later rank, as both HF loaders do. The table
 * was sized for the caller's count, so it never fills. */
int lens_merge_add(lens_tokenizer *tok, const char *l, size_t ln, const char *r, size_t rn, int rank,
                   lens_err *err)
{
    int left = lens_vocab_find2(tok, "", 0, l, ln), right = lens_vocab_find2(tok, "", 0, r, rn);
    int to = left < 0 || right < 0 ? -1 : lens_vocab_find2(tok, l, ln, r, rn);
    if (to < 0) {
        const char *what = left < 0 ? l : right < 0 ? r : l;
        int wn = left < 0 ? (int)ln : right < 0 ? (int)rn : (int)(ln + 1 + rn);
        return lens_fail(err, LENS_EFORMAT, "merge %d: \"%.*s\"%s is not in the vocabulary", rank + 1,
                         wn > 64 ? 64 : wn, what, left >= 0 && right >= 0 ? " (merged)" : "");
    }
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = merge_hash(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        struct merge_slot *s = &tok->merge_slots[i];
        if (s->key == key || s->key == UINT64_MAX) {
            *s = (struct merge_slot){ key, rank, to };
            return 0;
        }
    }
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes map to U+0100.. in byte order, so every byte has a
 * visible, valid-UTF-8 symbol in vocab.json. */
uint32_t lens_byte_to_unicode(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    if (b < 33) return 256 + (uint32_t)b;          /* 0..32   -> U+0100..U+0120 */
    if (b <= 160) return 289 + (uint32_t)(b - 127); /* 127..160 -> U+0121..U+0142 */
    return 323;                                    /* 173 (soft hyphen) -> U+0143 */
}

int lens_byte_level_ids(lens_tokenizer *tok, const char *what, lens_err *err)
{
    for (int b = 0; b < 256; b++) {
        char sym[4];
        int n = lens_utf8_put(lens_byte_to_unicode(b), sym);
        tok->byte_id[b] = lens_vocab_find2(tok, "", 0, sym, (size_t)n);
        if (tok->byte_id[b] < 0)
            return lens_fail(err, LENS_EFORMAT, "%s: no piece for byte 0x%02x (\"%.*s\"), not a byte-level vocabulary",
                             what, b, n, sym);
    }
    tok->byte_level = 1;
    return 0;
}

int lens_byte_fallback_ids(lens_tokenizer *tok)
{
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->fallback_id[b] = lens_vocab_find2(tok, "", 0, name, strlen(name));
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Scratch                                                                   */

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
    int first, count;         /* its tokens in ctok */
} bpe_cache_entry;

typedef struct {
    int id, byte_len;
} bpe_cache_tok;

struct lens_bpe_scratch {
    bpe_sym *sym;
    bpe_cand *heap;
    int sym_cap, heap_cap, heap_n;
    int *cp_of_byte;   /* [len] code point index of each byte of the text */
    size_t cp_of_byte_cap;
    const char *cache_text;
    uint32_t *cache_slots; /* entry index + 1, 0 = empty */
    uint32_t cache_mask;
    bpe_cache_entry *entry;
    int n_entry, entry_cap;
    bpe_cache_tok *ctok;
    int n_ctok, ctok_cap;
};

lens_bpe_scratch *lens_bpe_scratch_new(void)
{
    return calloc(1, sizeof(lens_bpe_scratch));
}

void lens_bpe_scratch_free(lens_bpe_scratch *sc)
{
    if (!sc) return;
    free(sc->sym);
    free(sc->heap);
    free(sc->cp_of_byte);
    free(sc->cache_slots);
    free(sc->entry);
    free(sc->ctok);
    free(sc);
}

/* A new text: its byte -> code point map, and a cache that starts afresh
 * (entries point into the text's bytes). */
int lens_bpe_begin(lens_bpe_scratch *sc, const lens_text *t)
{
    if (t->len + 1 > sc->cp_of_byte_cap) {
        free(sc->cp_of_byte);
        sc->cp_of_byte_cap = t->len + 1;
        sc->cp_of_byte = malloc(sc->cp_of_byte_cap * sizeof *sc->cp_of_byte);
        if (!sc->cp_of_byte) { sc->cp_of_byte_cap = 0; return -1; }
    }
    for (int i = 0; i < t->n; i++)
        for (int b = t->byte_off[i]; b < t->byte_off[i + 1]; b++) sc->cp_of_byte[b] = i;
    sc->cache_text = t->bytes;
    sc->n_entry = sc->n_ctok = 0;
    if (sc->cache_slots) memset(sc->cache_slots, 0, ((size_t)sc->cache_mask + 1) * sizeof *sc->cache_slots);
    return 0;
}

static int bpe_cache_grow(lens_bpe_scratch *sc)
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
static uint32_t *bpe_cache_slot(lens_bpe_scratch *sc, uint64_t h, int b0, int n)
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

static int heap_push(lens_bpe_scratch *sc, int rank, int pos)
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

static bpe_cand heap_pop(lens_bpe_scratch *sc)
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

static int bpe_push_pair(const lens_tokenizer *tok, lens_bpe_scratch *sc, int pos)
{
    int next = sc->sym[pos].next;
    if (next < 0) return 0;
    const struct merge_slot *m = merge_find(tok, sc->sym[pos].id, sc->sym[next].id);
    return m ? heap_push(sc, m->rank, pos) : 0;
}

static void sym_add(lens_bpe_scratch *sc, int *n, int id, int byte_start, int byte_len)
{
    sc->sym[*n] = (bpe_sym){ id, *n - 1, -1, byte_start, byte_len };
    if (*n > 0) sc->sym[*n - 1].next = *n;
    (*n)++;
}

/* SentencePiece-style initial symbols of the characters [a, b) of t. */
static int sp_symbols(const lens_tokenizer *tok, lens_bpe_scratch *sc, const lens_text *t, int a, int b)
{
    int n = 0, last_unk = 0;
    for (int i = a; i < b; i++) {
        int b0 = t->byte_off[i], nb = t->byte_off[i + 1] - b0;
        int id = lens_vocab_find2(tok, "", 0, t->bytes + b0, (size_t)nb);
        if (id >= 0) {
            sym_add(sc, &n, id, b0, nb);
            last_unk = 0;
            continue;
        }
        if (tok->byte_fallback) {
            int ok = 1;
            for (int k = 0; k < nb; k++) ok &= tok->fallback_id[(unsigned char)t->bytes[b0 + k]] >= 0;
            if (ok) {
                for (int k = 0; k < nb; k++) sym_add(sc, &n, tok->fallback_id[(unsigned char)t->bytes[b0 + k]], b0 + k, 1);
                last_unk = 0;
                continue;
            }
        }
        if (tok->unk_id < 0) continue; /* no unknown token: the character is dropped, as HF does */
        if (last_unk && tok->fuse_unk) {
            sc->sym[n - 1].byte_len += nb;
            continue;
        }
        sym_add(sc, &n, tok->unk_id, b0, nb);
        last_unk = 1;
    }
    return n;
}

/* Code points [a, b) of t (one pre-token) -> tokens. */
int lens_bpe_word(const lens_tokenizer *tok, lens_bpe_scratch *sc, const lens_text *t, int a, int b,
                  int segment, lens_tok_vec *out)
{
    int b0 = t->byte_off[a], b1 = t->byte_off[b];
    int n = b1 - b0;
    if (n == 0) return 0;
    if (tok->ignore_merges) {
        /* a byte-level vocabulary holds the bytes_to_unicode spelling */
        int id = -1;
        if (!tok->byte_level) {
            id = lens_vocab_find2(tok, "", 0, t->bytes + b0, (size_t)n);
        } else if (n <= 256) {
            char mapped[512];
            int m = 0;
            for (int k = 0; k < n; k++) m += lens_utf8_put(lens_byte_to_unicode((unsigned char)t->bytes[b0 + k]), mapped + m);
            id = lens_vocab_find2(tok, "", 0, mapped, (size_t)m);
        }
        if (id >= 0) return lens_tok_push(out, id, a, b, segment);
    }
    uint32_t *slot = NULL;
    uint64_t h = 0;
    if (n <= BPE_CACHE_MAX_WORD) {
        if ((uint32_t)sc->n_entry * 2 >= sc->cache_mask && bpe_cache_grow(sc) < 0) return -1;
        h = lens_fnv1a(LENS_FNV_OFFSET, t->bytes + b0, (size_t)n);
        slot = bpe_cache_slot(sc, h, b0, n);
        if (*slot) {
            const bpe_cache_entry *e = &sc->entry[*slot - 1];
            int at = b0;
            for (int k = e->first; k < e->first + e->count; k++) {
                const bpe_cache_tok *c = &sc->ctok[k];
                if (lens_tok_push(out, c->id, sc->cp_of_byte[at], sc->cp_of_byte[at + c->byte_len - 1] + 1, segment) < 0)
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
    int ns = 0;
    if (tok->byte_level) {
        const unsigned char *bytes = (const unsigned char *)t->bytes;
        for (int k = 0; k < n; k++) sym_add(sc, &ns, tok->byte_id[bytes[b0 + k]], b0 + k, 1);
    } else {
        ns = sp_symbols(tok, sc, t, a, b);
    }
    sc->heap_n = 0;
    for (int k = 0; k + 1 < ns; k++)
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
    int first = sc->n_ctok, at = b0, gap = 0;
    for (int k = ns ? 0 : -1; k >= 0; k = sc->sym[k].next) {
        const bpe_sym *s = &sc->sym[k];
        gap |= s->byte_start != at; /* a dropped character (no unknown token) */
        at = s->byte_start + s->byte_len;
        int start = sc->cp_of_byte[s->byte_start];
        int end = sc->cp_of_byte[s->byte_start + s->byte_len - 1] + 1;
        if (lens_tok_push(out, s->id, start, end, segment) < 0) return -1;
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
    if (slot && !gap && at == b1) { /* words with dropped characters are not cached */
        if (sc->n_entry == sc->entry_cap) {
            int cap = sc->entry_cap ? sc->entry_cap * 2 : 1024;
            bpe_cache_entry *e = realloc(sc->entry, (size_t)cap * sizeof *e);
            if (!e) return -1;
            sc->entry = e;
            sc->entry_cap = cap;
        }
        sc->entry[sc->n_entry] = (bpe_cache_entry){ h, b0, n, first, sc->n_ctok - first };
        *slot = (uint32_t)++sc->n_entry;
    } else {
        sc->n_ctok = first;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* vocab.json + merges.txt                                                   */

/* The pipeline of GPT2Tokenizer / RobertaTokenizer: ByteLevel pre-tokenizer
 * (GPT-2 regex), byte-level BPE; RoBERTa adds <s> A </s></s> B </s> and
 * trims spaces off offsets (RobertaTokenizerFast's trim_offsets). */
static int bpe_pipeline(lens_tokenizer *tok, const json_t *config, lens_err *err)
{
    const json_t *cls = config ? json_object_get(config, "tokenizer_class") : NULL;
    const char *name = json_is_string(cls) ? json_string_value(cls) : "GPT2Tokenizer";
    int roberta = !strcmp(name, "RobertaTokenizer") || !strcmp(name, "RobertaTokenizerFast");
    int gpt2 = !strcmp(name, "GPT2Tokenizer") || !strcmp(name, "GPT2TokenizerFast");
    if (!roberta && !gpt2)
        return lens_fail(err, LENS_EFORMAT, "tokenizer_class \"%s\" with vocab.json + merges.txt is not supported "
                         "(GPT2Tokenizer, RobertaTokenizer)", name);
    const json_t *aps = config ? json_object_get(config, "add_prefix_space") : NULL;
    tok->n_pre = 1;
    tok->pre[0] = (lens_pre){ .kind = PRE_BYTELEVEL, .behavior = SPLIT_ISOLATED, .use_regex = 1, .fast = FAST_GPT2,
                              .add_prefix_space = (unsigned char)json_is_true(aps) };
    char msg[128];
    if (!(tok->pre[0].re = lens_regex_compile(lens_gpt2_pattern, msg, sizeof msg)))
        return lens_fail(err, LENS_ENOMEM, "GPT-2 pre-tokenizer regex: %s", msg);
    tok->unk_id = -1;
    /* GPT2Tokenizer's unk/bos/eos default to <|endoftext|>. */
    if (!roberta) return lens_added_add(tok, "<|endoftext|>", -1, 1, 0, 0, 0) < 0 ? lens_fail(err, LENS_ENOMEM, "out of memory") : 0;
    tok->trim_offsets = 1;
    const char *names[5] = { "<s>", "</s>", "<unk>", "<pad>", "<mask>" };
    const char *keys[5] = { "bos_token", "eos_token", "unk_token", "pad_token", "mask_token" };
    int ids[5];
    for (int k = 0; k < 5; k++) {
        const char *v = config ? lens_tok_json_text(json_object_get(config, keys[k])) : NULL;
        if (v) names[k] = v;
        ids[k] = lens_vocab_find2(tok, "", 0, names[k], strlen(names[k]));
        if (ids[k] < 0 && k < 2)
            return lens_fail(err, LENS_EFORMAT, "RobertaTokenizer: \"%s\" is not in vocab.json", names[k]);
        /* <mask> takes the space before it (lstrip), as RobertaTokenizer declares it */
        if (ids[k] >= 0 && lens_added_add(tok, names[k], ids[k], 1, k == 4, 0, 0) < 0)
            return lens_fail(err, LENS_ENOMEM, "out of memory");
    }
    tok->unk_id = ids[2];
    tok->single = malloc(3 * sizeof *tok->single);
    tok->pair = malloc(6 * sizeof *tok->pair);
    if (!tok->single || !tok->pair) return lens_fail(err, LENS_ENOMEM, "out of memory");
    const lens_tmpl_item s = { ids[0], 0, 0 }, a = { -1, 0, 0 }, e = { ids[1], 0, 0 }, b = { -1, 1, 0 };
    tok->single[0] = s, tok->single[1] = a, tok->single[2] = e;
    tok->pair[0] = s, tok->pair[1] = a, tok->pair[2] = e, tok->pair[3] = e, tok->pair[4] = b, tok->pair[5] = e;
    tok->n_single = 3;
    tok->n_pair = 6;
    tok->has_template = 1;
    return 0;
}

int lens_load_bpe(lens_tokenizer *tok, const char *dir, const char *vocab_name, const char *merges_name,
                  lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, vocab_name);
    json_error_t jerr;
    json_t *vocab = json_load_file(path, 0, &jerr);
    if (!vocab) {
        if (!lens_tok_file_exists(dir, vocab_name)) return lens_fail(err, LENS_ENOENT, "%s: not found", path);
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
    if (lens_vocab_alloc(tok, max_id + 1, err) < 0) goto done;
    json_object_foreach(vocab, key, v) {
        int id = (int)json_integer_value(v);
        if (tok->piece[id]) {
            lens_fail(err, LENS_EFORMAT, "%s: id %d given to both \"%.64s\" and \"%.64s\"", path, id, tok->piece[id], key);
            goto done;
        }
        size_t n = strlen(key);
        if (n == 0) { lens_fail(err, LENS_EFORMAT, "%s: empty piece (id %d)", path, id); goto done; }
        if (lens_piece_set(tok, id, key, n, err) < 0) goto done;
    }
    if (lens_vocab_build_index(tok, err) < 0) goto done;
    if (lens_byte_level_ids(tok, path, err) < 0) goto done;

    snprintf(path, sizeof path, "%s/%s", dir, merges_name);
    size_t len;
    data = lens_file_read(path, &len, err);
    if (!data) goto done;
    int n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += data[i] == '\n';
    if (lens_merges_alloc(tok, n_lines, err) < 0) goto done;
    char *p = data;
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
        if (lens_merge_add(tok, row, ln, sp + 1, rn, rank++, err) < 0) {
            lens_err inner = *err;
            lens_fail(err, LENS_EFORMAT, "%s:%d: %s (%s)", path, line, inner.msg, vocab_name);
            goto done;
        }
    }

    json_t *config = NULL, *map = NULL;
    if (lens_tok_json_optional(dir, "tokenizer_config.json", &config, err) < 0) goto done;
    if (lens_tok_json_optional(dir, "special_tokens_map.json", &map, err) < 0) { json_decref(config); goto done; }
    rc = bpe_pipeline(tok, config, err);
    if (rc == 0) rc = lens_added_from_json(tok, config, err);
    if (rc == 0) rc = lens_added_from_json(tok, map, err);
    json_decref(config);
    json_decref(map);
done:
    free(data);
    json_decref(vocab);
    return rc;
}
