/* train_vocab.c - `lensd train vocab`: a WordPiece vocabulary learned from a
 * corpus, so that the project ships its own vocab.txt files.
 *
 * Algorithm (the one HF `tokenizers`' WordPieceTrainer uses: BPE merges
 * written as a WordPiece vocabulary):
 *  1. Pre-tokenize each line like BERT's BasicTokenizer with lower-casing:
 *     split on whitespace, every ASCII punctuation character is a word of its
 *     own; count the words. (Simplifications: accents are not stripped and
 *     non-ASCII punctuation / CJK characters are not split; words longer
 *     than 100 characters are skipped, WordPiece maps them to [UNK].)
 *  2. Spell each word as characters: the first plain, the others "##c".
 *     The alphabet (every character seen >= min_count times in either form)
 *     enters the vocabulary after [PAD] [UNK] [CLS] [SEP] [MASK].
 *  3. Repeatedly merge the adjacent pair with the largest count (summed over
 *     word frequencies; ties: the pair found first): "a" + "##b" -> "ab",
 *     "##a" + "##b" -> "##ab"; each new symbol is appended to the
 *     vocabulary, until it has vocab_size entries or no pair occurs
 *     min_count times.
 * Input files: one text a line; a tab-separated line contributes the text
 * before its last tab (TSV text<TAB>label), a header whose last field is
 * "label" is skipped. Output: vocab.txt and tokenizer_config.json
 * (do_lower_case true), read by core/io/tokenizer.c as any BERT vocabulary. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/train/train.h"

/* ------------------------------------------------------ string -> int map */

typedef struct {
    char **keys;
    int *vals;
    size_t cap, n;
} strmap;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int strmap_grow(strmap *m)
{
    strmap bigger = {.cap = m->cap ? 2 * m->cap : 1024};
    bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
    bigger.vals = calloc(bigger.cap, sizeof *bigger.vals);
    if (!bigger.keys || !bigger.vals) {
        free(bigger.keys), free(bigger.vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = hash_str(m->keys[i]) & (bigger.cap - 1);
        while (bigger.keys[j]) j = (j + 1) & (bigger.cap - 1);
        bigger.keys[j] = m->keys[i], bigger.vals[j] = m->vals[i];
    }
    bigger.n = m->n;
    free(m->keys), free(m->vals);
    *m = bigger;
    return 0;
}

/* Slot of key (existing or where it would go); NULL when out of memory. */
static int *strmap_slot(strmap *m, const char *key, int *found)
{
    if (2 * (m->n + 1) > m->cap && strmap_grow(m)) return NULL;
    size_t j = hash_str(key) & (m->cap - 1);
    while (m->keys[j] && strcmp(m->keys[j], key)) j = (j + 1) & (m->cap - 1);
    *found = m->keys[j] != NULL;
    if (!*found) {
        if (!(m->keys[j] = strdup(key))) return NULL;
        m->n++;
        m->vals[j] = 0;
    }
    return &m->vals[j];
}

static void strmap_free(strmap *m)
{
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys), free(m->vals);
}

/* ------------------------------------------------------ pair -> count map */

typedef struct {
    uint64_t *keys; /* (a + 1) << 32 | b, 0 = empty */
    long *counts;
    size_t cap, n;
} pairmap;

static long *pair_slot(pairmap *m, int a, int b)
{
    if (2 * (m->n + 1) > m->cap) {
        pairmap bigger = {.cap = m->cap ? 2 * m->cap : 1 << 16};
        bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
        bigger.counts = calloc(bigger.cap, sizeof *bigger.counts);
        if (!bigger.keys || !bigger.counts) {
            free(bigger.keys), free(bigger.counts);
            return NULL;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i] || m->counts[i] <= 0) continue; /* drop dead pairs */
            size_t j = (m->keys[i] * 0x9E3779B97F4A7C15ull >> 20) & (bigger.cap - 1);
            while (bigger.keys[j]) j = (j + 1) & (bigger.cap - 1);
            bigger.keys[j] = m->keys[i], bigger.counts[j] = m->counts[i];
            bigger.n++;
        }
        free(m->keys), free(m->counts);
        *m = bigger;
    }
    const uint64_t key = (uint64_t)(a + 1) << 32 | (uint32_t)b;
    size_t j = (key * 0x9E3779B97F4A7C15ull >> 20) & (m->cap - 1);
    while (m->keys[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) m->keys[j] = key, m->counts[j] = 0, m->n++;
    return &m->counts[j];
}

/* ------------------------------------------------------------ the corpus */

typedef struct {
    int *sym;  /* symbols of all words, word w at sym + start[w], len[w] of them */
    size_t *start;
    int *len;
    long *count;
    int n;
} words;

static int utf8_len(unsigned char c) { return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

static int count_line(strmap *wc, char *line)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    char *tab = strrchr(line, '\t');
    if (tab) {
        if (!strcmp(tab + 1, "label")) return 0;
        *tab = 0;
    }
    char word[512];
    size_t w = 0;
    for (char *p = line;; p++) {
        const unsigned char c = (unsigned char)*p;
        const int space = c == 0 || isspace(c), punct = c < 0x80 && ispunct(c);
        if ((space || punct) && w) {
            word[w] = 0;
            int found = 0, *v = w <= 100 ? strmap_slot(wc, word, &found) : &found;
            if (!v) return -1;
            (*v)++;
            w = 0;
        }
        if (!c) break;
        if (punct) {
            char one[2] = {(char)c, 0};
            int found, *v = strmap_slot(wc, one, &found);
            if (!v) return -1;
            (*v)++;
        } else if (!space && w < sizeof word - 1) {
            word[w++] = (char)tolower(c);
        }
    }
    return 0;
}

static int symbol_id(strmap *symbols, char ***names, int *n_names, const char *s)
{
    int found, *v = strmap_slot(symbols, s, &found);
    if (!v) return -1;
    if (!found) {
        char **grown = realloc(*names, sizeof **names * (*n_names + 1));
        if (!grown || !(grown[*n_names] = strdup(s))) return -1;
        *names = grown;
        *v = (*n_names)++;
    }
    return *v;
}

int lens_train_vocab(const char *const *paths, int n_paths, int vocab_size, int min_count, const char *out_dir,
                     lens_err *err)
{
    strmap wc = {0}, symbols = {0};
    words W = {0};
    pairmap pairs = {0};
    char **names = NULL, *line = NULL;
    int n_names = 0, rc = -1;
    size_t cap = 0;
    long *sym_count = NULL;
    for (int i = 0; i < n_paths; i++) {
        FILE *f = fopen(paths[i], "r");
        if (!f) {
            lens_fail(err, LENS_ENOENT, "%s: %s", paths[i], strerror(errno));
            goto done;
        }
        while (getline(&line, &cap, f) > 0)
            if (count_line(&wc, line)) {
                fclose(f);
                goto oom;
            }
        fclose(f);
    }
    /* words as symbol sequences */
    W.start = malloc(sizeof *W.start * (wc.n + 1));
    W.len = malloc(sizeof *W.len * (wc.n + 1));
    W.count = malloc(sizeof *W.count * (wc.n + 1));
    size_t total_sym = 0;
    for (size_t i = 0; i < wc.cap; i++) total_sym += wc.keys[i] ? strlen(wc.keys[i]) : 0;
    W.sym = malloc(sizeof *W.sym * (total_sym + 1));
    if (!W.start || !W.len || !W.count || !W.sym) goto oom;
    size_t pos = 0;
    for (size_t i = 0; i < wc.cap; i++) {
        const char *w = wc.keys[i];
        if (!w) continue;
        W.start[W.n] = pos, W.count[W.n] = wc.vals[i];
        int len = 0;
        for (const char *p = w; *p;) {
            char s[8] = "##";
            const int n = utf8_len((unsigned char)*p), off = len ? 2 : 0;
            memcpy(s + off, p, (size_t)n);
            s[off + n] = 0;
            p += n;
            const int id = symbol_id(&symbols, &names, &n_names, s);
            if (id < 0) goto oom;
            W.sym[pos++] = id, len++;
        }
        W.len[W.n++] = len;
    }
    /* alphabet: symbols seen min_count times */
    sym_count = calloc((size_t)n_names + 1, sizeof *sym_count);
    if (!sym_count) goto oom;
    for (int w = 0; w < W.n; w++)
        for (int j = 0; j < W.len[w]; j++) sym_count[W.sym[W.start[w] + j]] += W.count[w];
    char path[4096];
    if (mkdir(out_dir, 0755) && errno != EEXIST) {
        lens_fail(err, LENS_EIO, "%s: %s", out_dir, strerror(errno));
        goto done;
    }
    snprintf(path, sizeof path, "%s/vocab.txt", out_dir);
    FILE *out = fopen(path, "w");
    if (!out) {
        lens_fail(err, LENS_EIO, "%s: %s", path, strerror(errno));
        goto done;
    }
    fprintf(out, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n");
    int n_vocab = 5;
    for (int pass = 0; pass < 2; pass++) /* plain characters, then "##" ones */
        for (int s = 0; s < n_names; s++)
            if ((names[s][0] == '#' && names[s][1] == '#') == pass && sym_count[s] >= min_count)
                fprintf(out, "%s\n", names[s]), n_vocab++;
    /* pair counts */
    for (int w = 0; w < W.n; w++)
        for (int j = 0; j + 1 < W.len[w]; j++) {
            long *c = pair_slot(&pairs, W.sym[W.start[w] + j], W.sym[W.start[w] + j + 1]);
            if (!c) goto oom_file;
            *c += W.count[w];
        }
    while (n_vocab < vocab_size) {
        size_t best = 0;
        long best_count = 0;
        for (size_t i = 0; i < pairs.cap; i++)
            if (pairs.keys[i] && pairs.counts[i] > best_count) best = i, best_count = pairs.counts[i];
        if (best_count < min_count || best_count <= 0) break;
        const int a = (int)(pairs.keys[best] >> 32) - 1, b = (int)(uint32_t)pairs.keys[best];
        char merged[512];
        snprintf(merged, sizeof merged, "%s%s", names[a], names[b] + 2);
        const int ab = symbol_id(&symbols, &names, &n_names, merged);
        if (ab < 0) goto oom_file;
        fprintf(out, "%s\n", merged), n_vocab++;
        /* rewrite words containing a b, moving the counts of their neighbours */
        for (int w = 0; w < W.n; w++) {
            int *s = W.sym + W.start[w], len = W.len[w];
            const long c = W.count[w];
            for (int j = 0; j + 1 < len; j++) {
                if (s[j] != a || s[j + 1] != b) continue;
                long *p;
                if (j > 0) {
                    if (!(p = pair_slot(&pairs, s[j - 1], a))) goto oom_file;
                    *p -= c;
                    if (!(p = pair_slot(&pairs, s[j - 1], ab))) goto oom_file;
                    *p += c;
                }
                if (j + 2 < len) {
                    if (!(p = pair_slot(&pairs, b, s[j + 2]))) goto oom_file;
                    *p -= c;
                    if (!(p = pair_slot(&pairs, ab, s[j + 2]))) goto oom_file;
                    *p += c;
                }
                if (!(p = pair_slot(&pairs, a, b))) goto oom_file;
                *p -= c;
                s[j] = ab;
                memmove(s + j + 1, s + j + 2, sizeof *s * (size_t)(len - j - 2));
                len--;
            }
            W.len[w] = len;
        }
    }
    if (ferror(out) | fclose(out)) {
        lens_fail(err, LENS_EIO, "%s: write failed", path);
        goto done;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out_dir);
    out = fopen(path, "w");
    if (!out) {
        lens_fail(err, LENS_EIO, "%s: %s", path, strerror(errno));
        goto done;
    }
    fprintf(out, "{\"do_lower_case\": true, \"tokenizer_class\": \"BertTokenizer\", \"model_max_length\": 512}\n");
    if (ferror(out) | fclose(out)) {
        lens_fail(err, LENS_EIO, "%s: write failed", path);
        goto done;
    }
    fprintf(stderr, "train vocab: %d words, %d entries in %s/vocab.txt\n", W.n, n_vocab, out_dir);
    rc = 0;
    goto done;
oom_file:
    fclose(out);
oom:
    lens_fail(err, LENS_ENOMEM, "out of memory learning the vocabulary");
done:
    free(line);
    strmap_free(&wc), strmap_free(&symbols);
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names), free(sym_count);
    free(W.sym), free(W.start), free(W.len), free(W.count);
    free(pairs.keys), free(pairs.counts);
    return rc;
}
