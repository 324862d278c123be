/* train_bpe.c - `lensd train vocab --bpe`: a GPT-2 byte-level BPE vocabulary
 * learned from a corpus (Sennrich et al. 2016 merges over GPT-2's byte-level
 * symbols, Radford et al. 2019), so that the project ships its own
 * vocab.json / merges.txt for causal LMs.
 *
 * Algorithm:
 *  1. Split the text with GPT-2's pre-tokenizer (lens_gpt2_pretokenize, the
 *     same code core/io/tokenizer.c encodes with) and count the distinct words.
 *  2. Spell each word as bytes. The 256 byte symbols are ids 0..255 in the
 *     order of GPT-2's bytes_to_unicode (as in GPT-2's own vocab.json).
 *  3. Repeatedly merge the adjacent pair (a, b) with the largest count,
 *     count(a, b) = sum over words of word frequency x occurrences of a b in
 *     the word. Ties go to the smaller (a, b) in id order, so the output is a
 *     function of the word counts alone. Occurrences are replaced left to
 *     right without overlap ("a a a" -> "aa a"), which is what the tokenizer
 *     does when it applies the merge. The new symbol a+b gets the next id
 *     (or the id it already has when another merge produced the same bytes).
 *     Stop at vocab_size - 1 symbols or when the best count < min_count.
 *  4. "<|endoftext|>" takes the last id.
 * Pair counts are kept in a hash map with, per pair, the words it occurs in;
 * a merge only revisits those words. The best pair comes from a max-heap
 * with lazy deletion (an entry whose count differs from the map's is stale).
 * Cost per merge: the words holding the pair, times their length, times a
 * heap push; WikiText-2 test (241k words, 14k distinct) to 6000 entries takes
 * 0.2 s.
 *
 * Output (HF GPT2Tokenizer format): vocab.json {"symbol": id} with each
 * byte written as its bytes_to_unicode character ("Ġthe"), merges.txt
 * ("#version: 0.2" then "left right" per merge, rank order) and
 * tokenizer_config.json (GPT2Tokenizer, <|endoftext|> as bos/eos/unk). */
#include "core/train/train_bpe.h"

#include "core/io/file.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/io/tokenizer.h"

#define BPE_EOT "<|endoftext|>"

/* ------------------------------------------------ byte-string -> int map */

typedef struct {
    char **key; /* NULL = empty slot */
    int *key_len;
    long *val;
    size_t cap, n;
} bytemap;

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static void bytemap_free(bytemap *m)
{
    for (size_t i = 0; i < m->cap; i++) free(m->key[i]);
    free(m->key), free(m->key_len), free(m->val);
    memset(m, 0, sizeof *m);
}

static size_t bytemap_find(const bytemap *m, const char *s, size_t n)
{
    size_t j = hash_bytes(s, n) & (m->cap - 1);
    while (m->key[j] && ((size_t)m->key_len[j] != n || memcmp(m->key[j], s, n))) j = (j + 1) & (m->cap - 1);
    return j;
}

static int bytemap_grow(bytemap *m)
{
    bytemap big = {.cap = m->cap ? 2 * m->cap : 4096, .n = m->n};
    big.key = calloc(big.cap, sizeof *big.key);
    big.key_len = calloc(big.cap, sizeof *big.key_len);
    big.val = calloc(big.cap, sizeof *big.val);
    if (!big.key || !big.key_len || !big.val) {
        free(big.key), free(big.key_len), free(big.val);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i]) continue;
        size_t j = bytemap_find(&big, m->key[i], (size_t)m->key_len[i]);
        big.key[j] = m->key[i], big.key_len[j] = m->key_len[i], big.val[j] = m->val[i];
    }
    free(m->key), free(m->key_len), free(m->val);
    *m = big;
    return 0;
}

/* Value slot of s[0..n), inserted with 0 when absent (*added = 1); NULL when
 * out of memory. */
static long *bytemap_slot(bytemap *m, const char *s, size_t n, int *added)
{
    if (2 * (m->n + 1) > m->cap && bytemap_grow(m)) return NULL;
    size_t j = bytemap_find(m, s, n);
    *added = !m->key[j];
    if (*added) {
        char *k = malloc(n + 1);
        if (!k) return NULL;
        memcpy(k, s, n);
        k[n] = 0;
        m->key[j] = k, m->key_len[j] = (int)n, m->val[j] = 0;
        m->n++;
    }
    return &m->val[j];
}

/* ------------------------------------------------------------- trainer */

struct lens_bpe_trainer {
    bytemap words; /* word bytes -> count */
    int learned;
};

lens_bpe_trainer *lens_bpe_trainer_new(lens_err *err)
{
    lens_bpe_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) lens_fail(err, LENS_ENOMEM, "out of memory");
    return tr;
}

void lens_bpe_trainer_free(lens_bpe_trainer *tr)
{
    if (!tr) return;
    bytemap_free(&tr->words);
    free(tr);
}

typedef struct {
    lens_bpe_trainer *tr;
    const char *text;
    int out_of_memory;
} add_ctx;

static int count_word(void *ctx, size_t start, size_t end)
{
    add_ctx *c = ctx;
    int added;
    long *count = bytemap_slot(&c->tr->words, c->text + start, end - start, &added);
    if (!count) return c->out_of_memory = 1;
    (*count)++;
    return 0;
}

int lens_bpe_trainer_add_text(lens_bpe_trainer *tr, const char *text, size_t len, lens_err *err)
{
    add_ctx c = {tr, text, 0};
    int rc = lens_gpt2_pretokenize(text, len, count_word, &c, err);
    if (c.out_of_memory) return lens_fail(err, LENS_ENOMEM, "out of memory counting words");
    return rc ? -1 : 0;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 map to U+0100.. in byte order. */
static int byte_printable(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

static uint32_t byte_to_unicode(int b)
{
    if (byte_printable(b)) return (uint32_t)b;
    uint32_t k = 0;
    for (int x = 0; x < b; x++) k += !byte_printable(x);
    return 256 + k;
}

/* A pair (left, right) of symbol ids and the words it occurs in. */
typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty slot */
    long count;
    int *where; /* word indices, may repeat; only grows */
    int n_where, cap_where;
    int stamp;  /* last merge that queued it; -2 never */
} bpe_pair;

typedef struct {
    long count;
    int left, right;
} heap_entry;

typedef struct {
    int **sym; /* [n_words] symbol ids */
    int *n_sym;
    long *freq;
    int *stamp; /* last merge that rewrote it */
    int n_words;
    bpe_pair *pairs;
    size_t pair_cap, n_pairs;
    heap_entry *heap;
    size_t heap_n, heap_cap;
    uint64_t *touched;
    size_t n_touched, touched_cap;
} merge_state;

static uint64_t pair_key(int left, int right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static bpe_pair *pair_find(merge_state *s, uint64_t key)
{
    size_t j = mix64(key) & (s->pair_cap - 1);
    while (s->pairs[j].key != UINT64_MAX && s->pairs[j].key != key) j = (j + 1) & (s->pair_cap - 1);
    return &s->pairs[j];
}

static int pairs_grow(merge_state *s)
{
    size_t cap = s->pair_cap ? 2 * s->pair_cap : 1 << 16;
    bpe_pair *old = s->pairs;
    size_t old_cap = s->pair_cap;
    s->pairs = malloc(cap * sizeof *s->pairs);
    if (!s->pairs) {
        s->pairs = old;
        return -1;
    }
    for (size_t i = 0; i < cap; i++) s->pairs[i] = (bpe_pair){.key = UINT64_MAX, .stamp = -2};
    s->pair_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key != UINT64_MAX) *pair_find(s, old[i].key) = old[i];
    free(old);
    return 0;
}

/* count(left, right) += delta; word w is recorded as a place of the pair
 * when add_where. The pair is queued for the heap once per merge. */
static int pair_add(merge_state *s, int left, int right, long delta, int w, int add_where, int merge_no)
{
    if (2 * (s->n_pairs + 1) > s->pair_cap && pairs_grow(s)) return -1;
    uint64_t key = pair_key(left, right);
    bpe_pair *p = pair_find(s, key);
    if (p->key == UINT64_MAX) {
        p->key = key;
        s->n_pairs++;
    }
    p->count += delta;
    if (add_where) {
        if (p->n_where == p->cap_where) {
            int cap = p->cap_where ? 2 * p->cap_where : 4;
            int *where = realloc(p->where, (size_t)cap * sizeof *where);
            if (!where) return -1;
            p->where = where, p->cap_where = cap;
        }
        p->where[p->n_where++] = w;
    }
    if (p->stamp != merge_no) {
        p->stamp = merge_no;
        if (s->n_touched == s->touched_cap) {
            size_t cap = s->touched_cap ? 2 * s->touched_cap : 1024;
            uint64_t *t = realloc(s->touched, cap * sizeof *t);
            if (!t) return -1;
            s->touched = t, s->touched_cap = cap;
        }
        s->touched[s->n_touched++] = key;
    }
    return 0;
}

/* Max-heap order: larger count first, then smaller (left, right). */
static int heap_before(heap_entry a, heap_entry b)
{
    if (a.count != b.count) return a.count > b.count;
    if (a.left != b.left) return a.left < b.left;
    return a.right < b.right;
}

static int heap_push(merge_state *s, heap_entry e)
{
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? 2 * s->heap_cap : 1 << 16;
        heap_entry *h = realloc(s->heap, cap * sizeof *h);
        if (!h) return -1;
        s->heap = h, s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0 && heap_before(e, s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
    return 0;
}

static heap_entry heap_pop(merge_state *s)
{
    heap_entry top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->heap_n) break;
        if (c + 1 < s->heap_n && heap_before(s->heap[c + 1], s->heap[c])) c++;
        if (!heap_before(s->heap[c], last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->heap_n) s->heap[i] = last;
    return top;
}

/* Queue every pair touched since the last flush with its current count. */
static int flush_touched(merge_state *s)
{
    for (size_t t = 0; t < s->n_touched; t++) {
        bpe_pair *p = pair_find(s, s->touched[t]);
        if (p->count > 0 &&
            heap_push(s, (heap_entry){p->count, (int)(p->key >> 32), (int)(p->key & 0xffffffffu)}) < 0)
            return -1;
    }
    s->n_touched = 0;
    return 0;
}

static void merge_state_free(merge_state *s)
{
    for (int w = 0; w < s->n_words; w++) free(s->sym[w]);
    free(s->sym), free(s->n_sym), free(s->freq), free(s->stamp);
    for (size_t i = 0; i < s->pair_cap; i++) free(s->pairs[i].where);
    free(s->pairs), free(s->heap), free(s->touched);
}

void lens_bpe_vocab_free(lens_bpe_vocab *v)
{
    if (!v) return;
    if (v->piece)
        for (int i = 0; i < v->n_pieces; i++) free(v->piece[i]);
    free(v->piece), free(v->piece_len), free(v->merge), free(v->merge_count);
    memset(v, 0, sizeof *v);
}

static int piece_add(lens_bpe_vocab *v, const char *s, int n)
{
    char *p = malloc((size_t)n + 1);
    if (!p) return -1;
    memcpy(p, s, (size_t)n);
    p[n] = 0;
    v->piece[v->n_pieces] = p;
    v->piece_len[v->n_pieces] = n;
    return v->n_pieces++;
}

/* Replace left right by merged in word w, left to right without overlap,
 * and move the word's pair counts from the old spelling to the new one. */
static int rewrite_word(merge_state *s, int w, int left, int right, int merged, int merge_no)
{
    int *sym = s->sym[w], n = s->n_sym[w];
    long f = s->freq[w];
    for (int i = 0; i + 1 < n; i++)
        if (pair_add(s, sym[i], sym[i + 1], -f, w, 0, merge_no) < 0) return -1;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (i + 1 < n && sym[i] == left && sym[i + 1] == right) {
            sym[m++] = merged;
            i++;
        } else {
            sym[m++] = sym[i];
        }
    }
    s->n_sym[w] = m;
    /* Pairs without the new symbol were in the word before: already listed. */
    for (int i = 0; i + 1 < m; i++)
        if (pair_add(s, sym[i], sym[i + 1], f, w, sym[i] == merged || sym[i + 1] == merged, merge_no) < 0)
            return -1;
    return 0;
}

int lens_bpe_trainer_learn(lens_bpe_trainer *tr, int vocab_size, int min_count, lens_bpe_vocab *out,
                           lens_err *err)
{
    memset(out, 0, sizeof *out);
    if (vocab_size < 258)
        return lens_fail(err, LENS_EINVAL, "BPE vocabulary size %d: must be at least 258 (256 bytes, one merge, %s)",
                         vocab_size, BPE_EOT);
    if (tr->learned) return lens_fail(err, LENS_EINVAL, "this BPE trainer has already learned its vocabulary");
    tr->learned = 1;
    if (min_count < 1) min_count = 1;
    merge_state s = {0};
    bytemap by_bytes = {0}; /* symbol bytes -> id */
    char *joined = NULL;    /* bytes of a new symbol */
    int rc = -1;
    int max_merges = vocab_size - 257;
    out->piece = calloc((size_t)vocab_size, sizeof *out->piece);
    out->piece_len = calloc((size_t)vocab_size, sizeof *out->piece_len);
    out->merge = malloc((size_t)max_merges * sizeof *out->merge);
    out->merge_count = malloc((size_t)max_merges * sizeof *out->merge_count);
    size_t nw = tr->words.n ? tr->words.n : 1;
    s.sym = calloc(nw, sizeof *s.sym);
    s.n_sym = calloc(nw, sizeof *s.n_sym);
    s.freq = calloc(nw, sizeof *s.freq);
    s.stamp = calloc(nw, sizeof *s.stamp);
    if (!out->piece || !out->piece_len || !out->merge || !out->merge_count || !s.sym || !s.n_sym || !s.freq ||
        !s.stamp || pairs_grow(&s) < 0)
        goto oom;

    /* ids 0..255 in bytes_to_unicode order: printable bytes, then the rest */
    int byte_id[256];
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            if (byte_printable(b) != (pass == 0)) continue;
            char c = (char)b;
            int added;
            long *slot = bytemap_slot(&by_bytes, &c, 1, &added);
            if (!slot || (byte_id[b] = piece_add(out, &c, 1)) < 0) goto oom;
            *slot = byte_id[b];
        }

    /* Words in hash order: only their counts matter to the result. */
    for (size_t i = 0; i < tr->words.cap; i++) {
        if (!tr->words.key[i]) continue;
        int w = s.n_words++, n = tr->words.key_len[i];
        s.sym[w] = malloc((size_t)(n ? n : 1) * sizeof *s.sym[w]);
        if (!s.sym[w]) goto oom;
        for (int k = 0; k < n; k++) s.sym[w][k] = byte_id[(unsigned char)tr->words.key[i][k]];
        s.n_sym[w] = n;
        s.freq[w] = tr->words.val[i];
        s.stamp[w] = -1;
    }
    for (int w = 0; w < s.n_words; w++)
        for (int i = 0; i + 1 < s.n_sym[w]; i++)
            if (pair_add(&s, s.sym[w][i], s.sym[w][i + 1], s.freq[w], w, 1, -1) < 0) goto oom;
    if (flush_touched(&s) < 0) goto oom;

    while (out->n_merges < max_merges && out->n_pieces < vocab_size - 1 && s.heap_n) {
        heap_entry e = heap_pop(&s);
        bpe_pair *p = pair_find(&s, pair_key(e.left, e.right));
        if (p->count != e.count || e.count <= 0) continue; /* stale */
        if (e.count < min_count) break;
        int merge_no = out->n_merges;
        int ln = out->piece_len[e.left], rn = out->piece_len[e.right];
        joined = malloc((size_t)(ln + rn));
        if (!joined) goto oom;
        memcpy(joined, out->piece[e.left], (size_t)ln);
        memcpy(joined + ln, out->piece[e.right], (size_t)rn);
        int added;
        long *slot = bytemap_slot(&by_bytes, joined, (size_t)(ln + rn), &added);
        if (!slot) goto oom;
        if (added) {
            if ((*slot = piece_add(out, joined, ln + rn)) < 0) goto oom;
        }
        free(joined);
        joined = NULL;
        int merged = (int)*slot;
        out->merge[merge_no][0] = e.left, out->merge[merge_no][1] = e.right, out->merge[merge_no][2] = merged;
        out->merge_count[merge_no] = e.count;
        out->n_merges++;
        /* p->where may move while rewriting (pairs_grow): iterate over a copy
         * of its pointer and length taken by key each step. */
        uint64_t key = p->key;
        for (int k = 0;; k++) {
            bpe_pair *q = pair_find(&s, key);
            if (k >= q->n_where) break;
            int w = q->where[k];
            if (s.stamp[w] == merge_no) continue;
            s.stamp[w] = merge_no;
            if (rewrite_word(&s, w, e.left, e.right, merged, merge_no) < 0) goto oom;
        }
        bpe_pair *q = pair_find(&s, key);
        q->count = 0; /* every occurrence is merged: the pair cannot come back */
        free(q->where);
        q->where = NULL, q->n_where = q->cap_where = 0;
        if (flush_touched(&s) < 0) goto oom;
    }
    if (piece_add(out, BPE_EOT, (int)strlen(BPE_EOT)) < 0) goto oom;
    rc = 0;
    goto done;
oom:
    free(joined);
    lens_fail(err, LENS_ENOMEM, "out of memory learning BPE merges");
    lens_bpe_vocab_free(out);
done:
    merge_state_free(&s);
    bytemap_free(&by_bytes);
    return rc;
}

/* ------------------------------------------------------------- output */

/* The vocab.json spelling of raw bytes: each byte as its bytes_to_unicode
 * character in UTF-8 (at most 2 bytes each). The special token is kept. */
static char *unicode_spelling(const lens_bpe_vocab *v, int id)
{
    const unsigned char *s = (const unsigned char *)v->piece[id];
    int n = v->piece_len[id];
    char *o = malloc(2 * (size_t)n + 1), *q = o;
    if (!o) return NULL;
    if (id == v->n_pieces - 1 && !strcmp(v->piece[id], BPE_EOT)) {
        strcpy(o, BPE_EOT);
        return o;
    }
    for (int i = 0; i < n; i++) {
        uint32_t cp = byte_to_unicode(s[i]);
        if (cp < 0x80) *q++ = (char)cp;
        else *q++ = (char)(0xC0 | (cp >> 6)), *q++ = (char)(0x80 | (cp & 0x3F));
    }
    *q = 0;
    return o;
}

int lens_bpe_vocab_save(const lens_bpe_vocab *v, const char *out_dir, lens_err *err)
{
    if (mkdir(out_dir, 0755) && errno != EEXIST)
        return lens_fail(err, LENS_EIO, "%s: cannot create: %s", out_dir, strerror(errno));
    char **spell = calloc((size_t)v->n_pieces, sizeof *spell);
    json_t *vocab = json_object(), *config = NULL;
    char path[4096];
    FILE *f = NULL;
    int rc = -1;
    if (!spell || !vocab) goto oom;
    for (int i = 0; i < v->n_pieces; i++) {
        if (!(spell[i] = unicode_spelling(v, i))) goto oom;
        if (json_object_set_new(vocab, spell[i], json_integer(i)) < 0) goto oom;
    }
    snprintf(path, sizeof path, "%s/vocab.json", out_dir);
    if (json_dump_file(vocab, path, JSON_PRESERVE_ORDER) < 0) {
        lens_fail(err, LENS_EIO, "%s: cannot write", path);
        goto done;
    }
    snprintf(path, sizeof path, "%s/merges.txt", out_dir);
    if (!(f = fopen(path, "w"))) {
        lens_fail(err, LENS_EIO, "%s: %s", path, strerror(errno));
        goto done;
    }
    fprintf(f, "#version: 0.2\n");
    for (int m = 0; m < v->n_merges; m++) fprintf(f, "%s %s\n", spell[v->merge[m][0]], spell[v->merge[m][1]]);
    if (fclose(f)) {
        f = NULL;
        lens_fail(err, LENS_EIO, "%s: write failed", path);
        goto done;
    }
    f = NULL;
    config = json_pack("{s:s, s:s, s:s, s:s, s:b, s:s}", "tokenizer_class", "GPT2Tokenizer", "bos_token", BPE_EOT,
                       "eos_token", BPE_EOT, "unk_token", BPE_EOT, "add_prefix_space", 0, "model_type", "gpt2");
    if (!config) goto oom;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out_dir);
    if (json_dump_file(config, path, JSON_PRESERVE_ORDER | JSON_INDENT(2)) < 0) {
        lens_fail(err, LENS_EIO, "%s: cannot write", path);
        goto done;
    }
    rc = 0;
    goto done;
oom:
    lens_fail(err, LENS_ENOMEM, "out of memory writing the BPE vocabulary");
done:
    if (f) fclose(f);
    if (spell)
        for (int i = 0; i < v->n_pieces; i++) free(spell[i]);
    free(spell);
    json_decref(vocab);
    json_decref(config);
    return rc;
}

int lens_train_bpe(const char *const *paths, int n_paths, int vocab_size, int min_count, const char *out_dir,
                   lens_err *err)
{
    lens_bpe_trainer *tr = lens_bpe_trainer_new(err);
    if (!tr) return -1;
    lens_bpe_vocab v = {0};
    int rc = -1;
    for (int i = 0; i < n_paths; i++) {
        size_t len;
        char *text = lens_file_read(paths[i], &len, err);
        if (!text) goto done;
        int bad = lens_bpe_trainer_add_text(tr, text, len, err);
        free(text);
        if (bad) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
            lens_fail(err, err ? err->code : LENS_EINVAL, "%s: %s", paths[i], msg);
            goto done;
        }
    }
    if (lens_bpe_trainer_learn(tr, vocab_size, min_count, &v, err) < 0) goto done;
    rc = lens_bpe_vocab_save(&v, out_dir, err);
    if (rc == 0)
        fprintf(stderr, "lensd train vocab --bpe: %d words, %d merges, %d entries -> %s\n", (int)tr->words.n,
                v.n_merges, v.n_pieces, out_dir);
done:
    lens_bpe_vocab_free(&v);
    lens_bpe_trainer_free(tr);
    return rc;
}
