/* tokenizer_precompiled.c - the Precompiled normalizer: SentencePiece's
 * normalization rules (nmt_nfkc and the like) compiled into a "charsmap",
 * applied the way Hugging Face's tokenizers applies it
 * (normalizers/precompiled.rs over the spm_precompiled crate).
 *
 * The charsmap (base64 in tokenizer.json, precompiled_charsmap) is
 *   u32 LE trie_size | trie: trie_size / 4 u32 LE units | NUL-separated UTF-8 replacements
 * The trie is a darts-clone double array over UTF-8 bytes; a key's value is
 * the offset of its replacement in the replacements blob. transform(s) is
 * the replacement of the SHORTEST key that is a prefix of s (the first hit
 * of the common-prefix search), or none.
 * Text goes by extended grapheme clusters (utf8proc's segmentation): a
 * cluster of fewer than 6 bytes with a transform is replaced whole; else
 * each of its characters is replaced by its own transform, or kept.
 * Alignments follow HF's: a replacement of k characters by m takes the
 * first min(k, m) spans positionally; extra characters (m > k) share the
 * span before them, and a shorter one (m < k) uses up the rest
 * (NormalizedString::transform with the changes HF's replace() gives). */
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

struct lens_charsmap {
    uint32_t *unit;
    size_t n_units;
    char *text; /* the replacements, NUL-terminated each */
    size_t text_len;
};

lens_charsmap *lens_charsmap_new(const unsigned char *bytes, size_t n, char *msg, size_t msg_cap)
{
    if (n < 4) {
        snprintf(msg, msg_cap, "charsmap of %zu bytes", n);
        return NULL;
    }
    size_t trie = (size_t)bytes[0] | (size_t)bytes[1] << 8 | (size_t)bytes[2] << 16 | (size_t)bytes[3] << 24;
    if (trie % 4 || trie > n - 4 || trie == 0) {
        snprintf(msg, msg_cap, "charsmap trie of %zu bytes in %zu", trie, n);
        return NULL;
    }
    lens_charsmap *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->n_units = trie / 4;
    m->unit = malloc(trie);
    m->text_len = n - 4 - trie;
    m->text = malloc(m->text_len + 1);
    if (!m->unit || !m->text) goto oom;
    for (size_t i = 0; i < m->n_units; i++) {
        const unsigned char *u = bytes + 4 + 4 * i;
        m->unit[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    }
    memcpy(m->text, bytes + 4 + trie, m->text_len);
    m->text[m->text_len] = 0;
    size_t bad_at;
    if (!lens_utf8_valid(m->text, m->text_len, &bad_at)) {
        snprintf(msg, msg_cap, "charsmap replacements are not UTF-8 (byte %zu)", bad_at);
        lens_charsmap_free(m);
        return NULL;
    }
    return m;
oom:
    snprintf(msg, msg_cap, "out of memory");
    lens_charsmap_free(m);
    return NULL;
}

void lens_charsmap_free(lens_charsmap *m)
{
    if (!m) return;
    free(m->unit);
    free(m->text);
    free(m);
}

/* darts-clone unit fields */
static int unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
static uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static size_t unit_offset(uint32_t u) { return (size_t)(u >> 10) << ((u & (1u << 9)) >> 6); }

/* The replacement of the shortest key that prefixes s[0..n), or NULL. */
static const char *transform(const lens_charsmap *m, const unsigned char *s, size_t n)
{
    size_t pos = unit_offset(m->unit[0]);
    for (size_t i = 0; i < n && s[i]; i++) {
        pos ^= s[i];
        if (pos >= m->n_units) return NULL;
        uint32_t u = m->unit[pos];
        if (unit_label(u) != s[i]) return NULL;
        pos ^= unit_offset(u);
        if (pos >= m->n_units) return NULL;
        if (unit_has_leaf(u)) {
            uint32_t v = unit_value(m->unit[pos]);
            return v < m->text_len ? m->text + v : NULL;
        }
    }
    return NULL;
}

/* One (code point, change) of HF's transform: change 0 replaces the next
 * input character, 1 is a new one, -k replaces it and removes k more. */
typedef struct {
    const lens_norm_buf *in;
    lens_norm_buf *out;
    int pos; /* the next input character */
} aligner;

static int put(aligner *A, uint32_t cp, int change)
{
    int os = 0, oe = 0, from = change > 0 ? A->pos - 1 : A->pos;
    if (from >= A->in->n) from = A->in->n - 1;
    if (from >= 0) os = A->in->os[from], oe = A->in->oe[from];
    if (change <= 0) A->pos += 1 - change;
    return lens_norm_push(A->out, cp, os, oe);
}

/* HF's replace(): old_count characters become the code points of repl; the
 * changes go on the pending list (last is the entry before, whose change a
 * shorter replacement lowers). */
typedef struct {
    uint32_t cp;
    int change, has;
} pending;

static int flush(aligner *A, pending *p)
{
    int rc = p->has ? put(A, p->cp, p->change) : 0;
    p->has = 0;
    return rc;
}

static int replace(aligner *A, pending *last, int old_count, const char *repl)
{
    uint32_t cps[64];
    int m = 0;
    for (size_t i = 0, len = strlen(repl); i < len && m < 64;) {
        int k = lens_utf8_next((const unsigned char *)repl + i, len - i, &cps[m]);
        if (!k) break;
        m++;
        i += (size_t)k;
    }
    int diff = m - old_count;
    if (m == 0) {
        /* nothing to add: the previous entry removes what is replaced */
        if (last->has) last->change += diff;
        return 0;
    }
    int rc = flush(A, last);
    for (int k = 0; k < m - 1 && !rc; k++) rc = put(A, cps[k], diff > 0 && k >= m - diff ? 1 : 0);
    *last = (pending){ cps[m - 1], diff > 0 ? 1 : diff, 1 };
    return rc;
}

int lens_precompiled_normalize(const lens_charsmap *m, const lens_norm_buf *in, lens_norm_buf *out)
{
    aligner A = { in, out, 0 };
    pending last = { 0, 0, 0 };
    int rc = 0, state = 0;
    unsigned char g[64];
    for (int i = 0; i < in->n && !rc;) {
        /* the extended grapheme cluster [i, j) */
        int j = i + 1;
        while (j < in->n && !utf8proc_grapheme_break_stateful((utf8proc_int32_t)in->cp[j - 1],
                                                               (utf8proc_int32_t)in->cp[j], &state))
            j++;
        size_t len = 0;
        for (int k = i; k < j && len + 4 <= sizeof g; k++) len += (size_t)lens_utf8_put(in->cp[k], (char *)g + len);
        const char *r = len < 6 ? transform(m, g, len) : NULL;
        if (r) {
            rc = replace(&A, &last, j - i, r);
        } else {
            for (int k = i; k < j && !rc; k++) {
                unsigned char c[4];
                size_t cl = (size_t)lens_utf8_put(in->cp[k], (char *)c);
                const char *rk = transform(m, c, cl);
                if (rk) {
                    rc = replace(&A, &last, 1, rk);
                } else {
                    rc = flush(&A, &last);
                    last = (pending){ in->cp[k], 0, 1 };
                }
            }
        }
        i = j;
    }
    if (!rc) rc = flush(&A, &last);
    return rc;
}
