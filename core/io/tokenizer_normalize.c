/* tokenizer_normalize.c - Unicode classes and HF normalizers with alignments.
 *
 * Every normaliser maps a lens_norm_buf (code points, each with the span
 * [os, oe) of original code points it came from) to another, so offsets
 * survive any chain: BertNormalizer, NFC/NFKC/NFD/NFKD, Lowercase,
 * StripAccents, Replace (string or regex pattern), Prepend, Strip. Unicode tables
 * are utf8proc's (no hand tables).
 *
 * Precompiled (SentencePiece's charsmap) is in tokenizer_precompiled.c. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/io/tokenizer_impl.h"

static utf8proc_category_t ucat(uint32_t cp)
{
    return utf8proc_category((utf8proc_int32_t)cp);
}




/* HF _is_control: every C* category, but \t \n \r are whitespace. */
static int bert_is_control(uint32_t cp)
{
    if (cp < 0x80) return (cp < 0x20 || cp == 0x7F) && cp != '\t' && cp != '\n' && cp != '\r';
    utf8proc_category_t c = ucat(cp);
    return c == UTF8PROC_CATEGORY_CN || c >= UTF8PROC_CATEGORY_CC;
}



/* HF _is_chinese_char: the CJK Unified Ideographs blocks, not kana/hangul. */
static int bert_is_chinese(uint32_t cp)
{
    return cp >= 0x3400 && ((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F));
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

int lens_norm_reserve(lens_norm_buf *b, int need)
{
    if (need <= b->cap) return 0;
    int cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    uint32_t *c = realloc(b->cp, (size_t)cap * sizeof *c);
    if (!c) return -1;
    b->cp = c;
    int *s = realloc(b->os, (size_t)cap * sizeof *s);
    if (!s) return -1;
    b->os = s;
    int *e = realloc(b->oe, (size_t)cap * sizeof *e);
    if (!e) return -1;
    b->oe = e;
    b->cap = cap;
    return 0;
}

void lens_norm_buf_free(lens_norm_buf *b)
{
    free(b->cp);
    free(b->os);
    free(b->oe);
    memset(b, 0, sizeof *b);
}

static int bert_dropped(uint32_t cp)
{
    return cp == 0 || cp == 0xFFFD || bert_is_control(cp);
}

/* Lower-case of cps[i] (cps[lo..hi) its text): a simple per code point
 * mapping plus İ -> "i̇" (the only unconditional multi-character one);
 * with final_sigma, Python's str.lower rule for Σ (the slow BertTokenizer;
 * code points BERT's cleaning drops are skipped like case-ignorable ones),
 * without it Rust's char::to_lowercase (tokenizers' normalizers). */
static int lower_cp(const uint32_t *cps, int lo, int hi, int i, int final_sigma, uint32_t out[2])
{
    uint32_t cp = cps[i];
    if (cp < 0x80) { out[0] = (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; return 1; }
    if (cp == 0x130) { out[0] = 'i'; out[1] = 0x307; return 2; }
    if (cp == 0x3A3 && final_sigma) {
        int j = i - 1;
        while (j >= lo && (is_case_ignorable(cps[j]) || bert_dropped(cps[j]))) j--;
        int final = j >= lo && is_cased(cps[j]);
        if (final) {
            j = i + 1;
            while (j < hi && (is_case_ignorable(cps[j]) || bert_dropped(cps[j]))) j++;
            final = j == hi || !is_cased(cps[j]);
        }
        out[0] = final ? 0x3C2 : 0x3C3;
        return 1;
    }
    out[0] = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
    return 1;
}

/* NFD of one code point with Mn dropped (BERT's strip_accents). */
static int strip_push(lens_norm_buf *out, uint32_t cp, int os, int oe)
{
    if (cp < 0x80) return lens_norm_push(out, cp, os, oe);
    utf8proc_int32_t dec[32];
    int last_boundclass = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, dec, 32, UTF8PROC_DECOMPOSE, &last_boundclass);
    if (n < 0 || n > 32) { dec[0] = (utf8proc_int32_t)cp; n = 1; }
    for (utf8proc_ssize_t k = 0; k < n; k++) {
        if (ucat((uint32_t)dec[k]) == UTF8PROC_CATEGORY_MN) continue;
        if (lens_norm_push(out, (uint32_t)dec[k], os, oe) < 0) return -1;
    }
    return 0;
}

/* BertNormalizer over code points [a, b) of t, in one pass: clean (drop
 * U+0000, U+FFFD, C* except \t\n\r; whitespace -> ' '), ' ' around CJK
 * ideographs, lower-case, NFD and drop Mn. */
int lens_bert_normalize(const lens_norm *nm, const lens_text *t, int a, int b, lens_norm_buf *out)
{
    out->n = 0;
    /* room for the usual case (no expansion) up front: no regrowth */
    int rc = lens_norm_reserve(out, b - a + 16);
    for (int i = a; i < b && !rc; i++) {
        uint32_t cp = t->cp[i];
        if (nm->clean && bert_dropped(cp)) continue;
        if (nm->clean && lens_bert_is_whitespace(cp)) {
            rc = lens_norm_push(out, ' ', i, i + 1);
            continue;
        }
        int cjk = nm->chinese && bert_is_chinese(cp);
        if (cjk) rc = lens_norm_push(out, ' ', i, i + 1);
        uint32_t low[2] = { cp, 0 };
        int k = nm->lowercase ? lower_cp(t->cp, a, b, i, nm->final_sigma, low) : 1;
        for (int j = 0; j < k && !rc; j++)
            rc = nm->strip_accents ? strip_push(out, low[j], i, i + 1) : lens_norm_push(out, low[j], i, i + 1);
        if (cjk && !rc) rc = lens_norm_push(out, ' ', i, i + 1);
    }
    return rc;
}

/* Does a normalisation run start at cp? Not at a combining mark (ccc > 0),
 * nor at a starter that composes with the code point before it: Hangul
 * medial vowels and final consonants, and the few others with a canonical
 * composition as second element (utf8proc marks them in comb_index), such
 * as the Bengali and Tamil length marks U+09BE, U+0BBE. */
static int starts_run(uint32_t cp)
{
    if (cp < 0x300) return 1;
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return 0;
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    return p->combining_class == 0 && !(p->comb_index != UINT16_MAX && p->comb_index >= 0x8000);
}

/* Canonical ordering of buf[0..n): each stretch of combining marks stably
 * sorted by combining class (insertion sort: stretches are a few marks). */
static void canonical_order(utf8proc_int32_t *buf, int n)
{
    for (int i = 1; i < n; i++) {
        utf8proc_int32_t c = buf[i];
        int cc = utf8proc_get_property(c)->combining_class, j = i;
        if (!cc) continue;
        while (j > 0 && utf8proc_get_property(buf[j - 1])->combining_class > cc) {
            buf[j] = buf[j - 1];
            j--;
        }
        buf[j] = c;
    }
}

/* Full decomposition (canonical, or compatibility with UTF8PROC_COMPAT) of
 * in into dec[], src[] the index in in of each code point's source. */
typedef struct {
    utf8proc_int32_t *dec;
    int *src;
    int n, cap;
} decomposed;

static int decompose_all(const lens_norm_buf *in, utf8proc_option_t opt, decomposed *d)
{
    d->n = 0;
    for (int k = 0; k < in->n; k++) {
        for (;;) {
            int last = 0, room = d->cap - d->n;
            utf8proc_ssize_t got = room <= 0 ? 32
                : utf8proc_decompose_char((utf8proc_int32_t)in->cp[k], d->dec + d->n, room,
                                          (opt & UTF8PROC_COMPAT) | UTF8PROC_DECOMPOSE, &last);
            if (got < 0) return -1;
            if (got <= room) {
                for (int q = 0; q < (int)got; q++) d->src[d->n + q] = k;
                d->n += (int)got;
                break;
            }
            int ncap = (d->n + (int)got) * 2 + 64;
            utf8proc_int32_t *dec = realloc(d->dec, (size_t)ncap * sizeof *dec);
            if (!dec) return -1;
            d->dec = dec;
            int *src = realloc(d->src, (size_t)ncap * sizeof *src);
            if (!src) return -1;
            d->src = src;
            d->cap = ncap;
        }
    }
    return 0;
}

/* Unicode normal form of in: full decomposition, then one run (a starter
 * and what follows it up to the next run start) at a time canonical
 * ordering and, for NFC / NFKC, canonical composition.
 * Alignments as HF's (unicode-normalization-alignments through
 * NormalizedString::transform) are positional: the code point at position
 * p of the decomposed run takes the span of the source of the code point
 * that was at p before reordering; a composed character takes its
 * starter's and uses up the positions of the marks it absorbed, so the
 * code points after it shift by that many. */
static int unicode_normalize(const lens_norm_buf *in, lens_norm_buf *out, utf8proc_option_t opt)
{
    decomposed d = { 0 };
    int rc = decompose_all(in, opt, &d);
    for (int i = 0; i < d.n && !rc;) {
        int j = i + 1;
        while (j < d.n && !starts_run((uint32_t)d.dec[j])) j++;
        const int m = j - i, *src = d.src + i;
        utf8proc_int32_t *run = d.dec + i;
        canonical_order(run, m);
        utf8proc_ssize_t got = m;
        if ((opt & UTF8PROC_COMPOSE) && m > 1) got = utf8proc_normalize_utf32(run, m, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
        if (got < 0) { rc = -1; break; }
        const int absorbed = m - (int)got; /* by the run's first code point, the only one that composes */
        for (int k = 0; k < (int)got && !rc; k++) {
            int from = src[k ? k + absorbed : 0];
            rc = lens_norm_push(out, (uint32_t)run[k], in->os[from], in->oe[from]);
        }
        i = j;
    }
    free(d.dec);
    free(d.src);
    return rc;
}

/* Code points of UTF-8 s into out (valid UTF-8 checked at load). */
static int utf8_to_cps(const char *s, uint32_t *out, int cap)
{
    int n = 0;
    size_t len = strlen(s), i = 0;
    while (i < len && n < cap) {
        uint32_t cp;
        int k = lens_utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (!k) break;
        out[n++] = cp;
        i += (size_t)k;
    }
    return n;
}

/* Replace: the matches of a string pattern (compared, left to right, not
 * overlapping) or a Regex (Oniguruma over in's UTF-8) replaced by content. */
typedef struct {
    const lens_norm *nm;
    const lens_norm_buf *in;
    lens_norm_buf *out;
    uint32_t rep[64];
    int n_rep, done; /* in[0, done) is written */
} replacer;

/* HF's NormalizedString::replace: the text before the match as it is, then
 * the content, every code point of it aligned to the match's last code
 * point (transform_range with all changes 1 after removing the match; an
 * empty match: the code point before it). */
static int on_replace(void *ctx, int s, int e)
{
    replacer *R = ctx;
    int rc = 0;
    for (int i = R->done; i < s && !rc; i++) rc = lens_norm_push(R->out, R->in->cp[i], R->in->os[i], R->in->oe[i]);
    int at = e > s ? e - 1 : s - 1, os = at >= 0 ? R->in->os[at] : 0, oe = at >= 0 ? R->in->oe[at] : 0;
    for (int j = 0; j < R->n_rep && !rc; j++) rc = lens_norm_push(R->out, R->rep[j], os, oe);
    R->done = e;
    return rc;
}

static int replace_all(const lens_norm *nm, const lens_norm_buf *in, lens_norm_buf *out)
{
    replacer R = { nm, in, out, { 0 }, 0, 0 };
    R.n_rep = utf8_to_cps(nm->content, R.rep, 64);
    int rc = 0;
    if (nm->re) {
        /* in as UTF-8 text for the engine */
        lens_text t = { 0 };
        char *bytes = malloc((size_t)in->n * 4 + 1);
        t.cp = in->cp;
        t.byte_off = malloc(((size_t)in->n + 1) * sizeof *t.byte_off);
        if (!bytes || !t.byte_off) rc = -1;
        for (int i = 0, nb = 0; !rc && i <= in->n; i++) {
            t.byte_off[i] = nb;
            if (i < in->n) nb += lens_utf8_put(in->cp[i], bytes + nb);
        }
        if (!rc) {
            t.bytes = bytes, t.n = in->n, t.len = (size_t)t.byte_off[in->n];
            rc = lens_regex_each(nm->re, &t, 0, in->n, on_replace, &R);
        }
        free(bytes);
        free(t.byte_off);
    } else {
        uint32_t pat[64];
        int np = utf8_to_cps(nm->pattern, pat, 64);
        for (int i = 0; np && i + np <= in->n && !rc;) {
            if (memcmp(in->cp + i, pat, (size_t)np * sizeof *pat) == 0) {
                rc = on_replace(&R, i, i + np);
                i += np;
            } else {
                i++;
            }
        }
    }
    for (int i = R.done; i < in->n && !rc; i++) rc = lens_norm_push(out, in->cp[i], in->os[i], in->oe[i]);
    return rc;
}

int lens_normalize_step(const lens_norm *nm, const lens_norm_buf *in, lens_norm_buf *out)
{
    out->n = 0;
    int rc = 0;
    switch (nm->kind) {
    case NORM_BERT: {
        /* not reached: the fused path runs BertNormalizer on raw text */
        for (int i = 0; i < in->n && !rc; i++) rc = lens_norm_push(out, in->cp[i], in->os[i], in->oe[i]);
        return rc;
    }
    case NORM_NFC: return unicode_normalize(in, out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    case NORM_NFKC: return unicode_normalize(in, out, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case NORM_NFD: return unicode_normalize(in, out, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case NORM_NFKD: return unicode_normalize(in, out, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    case NORM_LOWERCASE:
        for (int i = 0; i < in->n && !rc; i++) {
            uint32_t low[2];
            int k = lower_cp(in->cp, 0, in->n, i, 0, low);
            for (int j = 0; j < k && !rc; j++) rc = lens_norm_push(out, low[j], in->os[i], in->oe[i]);
        }
        return rc;
    case NORM_STRIP_ACCENTS:
        /* HF's StripAccents drops every mark (Mn, Mc, Me: is_combining_mark), BertNormalizer's only Mn */
        for (int i = 0; i < in->n && !rc; i++) {
            utf8proc_category_t c = ucat(in->cp[i]);
            if (c != UTF8PROC_CATEGORY_MN && c != UTF8PROC_CATEGORY_MC && c != UTF8PROC_CATEGORY_ME)
                rc = lens_norm_push(out, in->cp[i], in->os[i], in->oe[i]);
        }
        return rc;
    case NORM_STRIP: {
        int a = 0, b = in->n;
        while (nm->left && a < b && lens_uni_white_space(in->cp[a])) a++;
        while (nm->right && b > a && lens_uni_white_space(in->cp[b - 1])) b--;
        for (int i = a; i < b && !rc; i++) rc = lens_norm_push(out, in->cp[i], in->os[i], in->oe[i]);
        return rc;
    }
    case NORM_PREPEND: {
        uint32_t add[64];
        int k = in->n ? utf8_to_cps(nm->content, add, 64) : 0;
        for (int j = 0; j < k && !rc; j++) rc = lens_norm_push(out, add[j], in->os[0], in->oe[0]);
        for (int i = 0; i < in->n && !rc; i++) rc = lens_norm_push(out, in->cp[i], in->os[i], in->oe[i]);
        return rc;
    }
    case NORM_REPLACE: return replace_all(nm, in, out);
    case NORM_PRECOMPILED: return lens_precompiled_normalize(nm->charsmap, in, out);
    }
    return -1;
}
