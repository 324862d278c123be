/* tokenizer_pretok.c - HF pre-tokenizers over code points.
 *
 * Each pre-tokenizer cuts a range [a, b) of a decoded text into pre-tokens;
 * a Sequence feeds each piece to the next step (lens_pretokenize recurses
 * over tok->pre[k..]), and the last step hands pieces to the model. The
 * regexes of Split and ByteLevel run through Oniguruma (tokenizer_regex.c),
 * the engine HF uses; their matches are cut with HF's Split behaviours
 * (split_regex). Content changes (Metaspace's ▁, ByteLevel's prefix
 * space) happen before, in tokenizer.c.
 *
 * Fast paths: the GPT-2, Llama-3 and Qwen2 regexes (the commonest, with
 * behaviour Isolated and no invert) are also written out by hand over
 * utf8proc's classes, the alternatives tried in order at each position as
 * the engine does: twice as fast as Oniguruma on 1 MB of mixed text with
 * Llama-3's file (48 vs 96 ms, docs/tokenizers.md). tests/fuzz/fuzz_tok_regex.c
 * checks each against Oniguruma's matches. */
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

enum { C_SPACE, C_LETTER, C_NUMBER, C_OTHER };

static int cls_of(uint32_t cp)
{
    return lens_uni_white_space(cp) ? C_SPACE : lens_uni_letter(cp) ? C_LETTER
         : lens_uni_number(cp) ? C_NUMBER : C_OTHER;
}

/* Run of class c from i: the first index >= i not of class c (< b). */
static int run_end(const uint32_t *cp, int i, int b, int c)
{
    while (i < b && cls_of(cp[i]) == c) i++;
    return i;
}

/* Simple case folding of the letters of 's 't 're 've 'm 'll 'd: ASCII,
 * and U+017F (long s), which folds to s. */
static uint32_t fold(uint32_t c)
{
    return c < 0x80 && c >= 'A' && c <= 'Z' ? c | 0x20 : c == 0x17F ? 's' : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i (case-insensitive when ci): its end, or i. */
static int contraction_end(const uint32_t *cp, int i, int b, int ci)
{
    if (cp[i] != '\'' || i + 1 >= b) return i;
    uint32_t c1 = cp[i + 1], c2 = i + 2 < b ? cp[i + 2] : 0;
    if (ci) c1 = fold(c1), c2 = fold(c2);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    return i;
}

/* \s+(?!\S) then \s+ from i: the run, less its last character when a
 * non-space follows and the run is longer than one. */
static int space_end(const uint32_t *cp, int i, int b)
{
    int j = run_end(cp, i, b, C_SPACE);
    if (j < b && j - i > 1) j--;
    return j;
}

/* GPT-2's pre-tokenizer: the end of the pre-token that starts at i, for
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
int lens_gpt2_word_end(const uint32_t *cp, int i, int b)
{
    int j = contraction_end(cp, i, b, 0);
    if (j > i) return j;
    int k = i + (cp[i] == ' ' && i + 1 < b && !lens_uni_white_space(cp[i + 1]));
    int c = cls_of(cp[k]);
    if (c != C_SPACE) return run_end(cp, k, b, c);
    return space_end(cp, i, b);
}

/* Llama-3 (max_digits 3) and Qwen2 (max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static int llama3_word_end(const uint32_t *cp, int i, int b, int max_digits)
{
    int j = contraction_end(cp, i, b, 1);
    if (j > i) return j;
    int c = cls_of(cp[i]);
    if (c == C_LETTER) return run_end(cp, i, b, C_LETTER);
    if (c != C_NUMBER && cp[i] != '\r' && cp[i] != '\n' && i + 1 < b && cls_of(cp[i + 1]) == C_LETTER)
        return run_end(cp, i + 1, b, C_LETTER);
    if (c == C_NUMBER) {
        j = i;
        while (j < b && j - i < max_digits && cls_of(cp[j]) == C_NUMBER) j++;
        return j;
    }
    int k = c == C_OTHER ? i : (cp[i] == ' ' && i + 1 < b && cls_of(cp[i + 1]) == C_OTHER) ? i + 1 : -1;
    if (k >= 0) {
        j = run_end(cp, k, b, C_OTHER);
        while (j < b && (cp[j] == '\r' || cp[j] == '\n')) j++;
        return j;
    }
    /* c is white space: \s*[\r\n]+ ends after the run's last line break */
    j = run_end(cp, i, b, C_SPACE);
    for (int m = j - 1; m >= i; m--)
        if (cp[m] == '\r' || cp[m] == '\n') return m + 1;
    return space_end(cp, i, b);
}

const char lens_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char llama3_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char qwen2_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *lens_fast_regex_pattern(lens_fast_regex which)
{
    return which == FAST_GPT2 ? lens_gpt2_pattern : which == FAST_LLAMA3 ? llama3_pattern
         : which == FAST_QWEN2 ? qwen2_pattern : NULL;
}

lens_fast_regex lens_fast_regex_of(const char *pattern)
{
    for (int k = FAST_GPT2; k <= FAST_QWEN2; k++)
        if (!strcmp(pattern, lens_fast_regex_pattern((lens_fast_regex)k))) return (lens_fast_regex)k;
    return FAST_NONE;
}

int lens_fast_word_end(lens_fast_regex which, const uint32_t *cp, int i, int b)
{
    switch (which) {
    case FAST_GPT2: return lens_gpt2_word_end(cp, i, b);
    case FAST_LLAMA3: return llama3_word_end(cp, i, b, 3);
    case FAST_QWEN2: return llama3_word_end(cp, i, b, 1);
    case FAST_NONE: break;
    }
    return b;
}

/* Rust's char::is_alphanumeric plus '_': \w of the Whitespace pre-tokenizer. */
static int is_word_char(uint32_t cp)
{
    return cp == '_' || lens_uni_letter(cp) || lens_uni_number(cp);
}

/* Is code point i a delimiter of pre-tokenizer p? For string splits,
 * *len is the delimiter's length in code points. */
static int is_delim(const lens_pre *p, const lens_text *t, int i, int b, int *len)
{
    *len = 1;
    uint32_t cp = t->cp[i];
    switch (p->kind) {
    case PRE_METASPACE: return cp == p->replacement;
    case PRE_SP_WORDS: return cp == p->replacement && i > 0 && t->cp[i - 1] != p->replacement;
    case PRE_DIGITS: return lens_uni_number(cp);
    case PRE_PUNCTUATION: return lens_bert_is_punct(cp);
    case PRE_WHITESPACE_SPLIT: return lens_uni_white_space(cp);
    case PRE_SPLIT_STRING: {
        size_t n = strlen(p->string);
        int b0 = t->byte_off[i];
        if (!n || (size_t)(t->byte_off[b] - b0) < n || memcmp(t->bytes + b0, p->string, n) != 0) return 0;
        int j = i;
        while (t->byte_off[j] < b0 + (int)n) j++;
        *len = j - i;
        return 1;
    }
    default: return 0;
    }
}

/* The next step for piece [a, b): pre-tokenizer k + 1, or the model. */
static inline int next_step(const lens_tokenizer *tok, int k, const lens_text *t, int a, int b, lens_word_fn word,
                            void *ctx)
{
    if (k + 1 == tok->n_pre) return a < b ? word(ctx, t, a, b) : 0;
    return lens_pretokenize(tok, k + 1, t, a, b, word, ctx);
}

/* Cut [a, b) at delimiters with one of HF's behaviours. */
static int split_delims(const lens_tokenizer *tok, int k, const lens_text *t, int a, int b, lens_word_fn word,
                        void *ctx)
{
    const lens_pre *p = &tok->pre[k];
    lens_split how = p->behavior;
    int start = a, rc = 0;
    for (int i = a; i < b && !rc;) {
        int len;
        if (!is_delim(p, t, i, b, &len)) { i++; continue; }
        int e = i + len;
        if (how == SPLIT_CONTIGUOUS)
            while (e < b && is_delim(p, t, e, b, &len)) e += len;
        switch (how) {
        case SPLIT_REMOVED:
            if (i > start) rc = next_step(tok, k, t, start, i, word, ctx);
            start = e;
            break;
        case SPLIT_ISOLATED: case SPLIT_CONTIGUOUS:
            if (i > start) rc = next_step(tok, k, t, start, i, word, ctx);
            if (!rc) rc = next_step(tok, k, t, i, e, word, ctx);
            start = e;
            break;
        case SPLIT_MERGED_PREV:
            rc = next_step(tok, k, t, start, e, word, ctx);
            start = e;
            break;
        case SPLIT_MERGED_NEXT:
            if (i > start) rc = next_step(tok, k, t, start, i, word, ctx);
            start = i;
            break;
        }
        i = e;
    }
    if (!rc && b > start) rc = next_step(tok, k, t, start, b, word, ctx);
    return rc;
}

/* The pieces of a regex Split: [s, e), is_match (a delimiter). */
typedef struct {
    int s, e;
    unsigned char match;
} piece;

typedef struct {
    piece *v, stack[64];
    int n, cap, prev;
} pieces;

static int piece_add(pieces *p, int s, int e, int match)
{
    if (p->n == p->cap) {
        int cap = p->cap * 2;
        piece *v = malloc((size_t)cap * sizeof *v);
        if (!v) return -1;
        memcpy(v, p->v, (size_t)p->n * sizeof *v);
        if (p->v != p->stack) free(p->v);
        p->v = v, p->cap = cap;
    }
    p->v[p->n++] = (piece){ s, e, (unsigned char)match };
    return 0;
}

/* HF's Pattern::find_matches: the text between matches, then the match. */
static int on_match(void *ctx, int s, int e)
{
    pieces *p = ctx;
    if (p->prev != s && piece_add(p, p->prev, s, 0) < 0) return -1;
    p->prev = e;
    return piece_add(p, s, e, 1);
}

/* HF's NormalizedString::split: the pieces of [a, b) by the matches of
 * p->re (flags flipped with invert), merged by the behaviour; delimiters
 * removed with Removed; empty pieces dropped. */
static int split_regex(const lens_tokenizer *tok, int k, const lens_text *t, int a, int b, lens_word_fn word,
                       void *ctx)
{
    const lens_pre *pre = &tok->pre[k];
    pieces p = { .n = 0, .cap = 64, .prev = a };
    p.v = p.stack;
    int rc = lens_regex_each(pre->re, t, a, b, on_match, &p);
    if (!rc && p.prev != b) rc = piece_add(&p, p.prev, b, 0);
    if (pre->invert)
        for (int i = 0; i < p.n; i++) p.v[i].match ^= 1;
    /* merge in place: m pieces kept, each with .match = "remove it" */
    int m = 0, prev_match = 0;
    lens_split how = pre->behavior;
    if (how == SPLIT_MERGED_NEXT) {
        /* HF folds from the end: a delimiter joins the piece after it */
        for (int i = p.n - 1; i >= 0; i--) {
            piece c = p.v[i];
            if (m > 0 && c.match && !prev_match) p.v[p.n - m].s = c.s;
            else p.v[p.n - ++m] = (piece){ c.s, c.e, 0 };
            prev_match = c.match;
        }
        memmove(p.v, p.v + p.n - m, (size_t)m * sizeof *p.v);
    } else {
        for (int i = 0; i < p.n; i++) {
            piece c = p.v[i];
            int join = how == SPLIT_CONTIGUOUS ? c.match == prev_match : how == SPLIT_MERGED_PREV && c.match && !prev_match;
            if (m > 0 && join) p.v[m - 1].e = c.e;
            else p.v[m++] = (piece){ c.s, c.e, (unsigned char)(how == SPLIT_REMOVED && c.match) };
            prev_match = c.match;
        }
    }
    for (int i = 0; i < m && !rc; i++)
        if (!p.v[i].match && p.v[i].e > p.v[i].s) rc = next_step(tok, k, t, p.v[i].s, p.v[i].e, word, ctx);
    if (p.v != p.stack) free(p.v);
    return rc;
}

/* A regex pre-tokenizer: its fast path when it has one, else Oniguruma. */
static int split_by_regex(const lens_tokenizer *tok, int k, const lens_text *t, int a, int b, lens_word_fn word,
                          void *ctx)
{
    const lens_pre *p = &tok->pre[k];
    if (p->fast == FAST_NONE) return split_regex(tok, k, t, a, b, word, ctx);
    int rc = 0;
    for (int i = a; i < b && !rc;) {
        int j = lens_fast_word_end(p->fast, t->cp, i, b);
        rc = next_step(tok, k, t, i, j, word, ctx);
        i = j;
    }
    return rc;
}

int lens_pretokenize(const lens_tokenizer *tok, int k, const lens_text *t, int a, int b, lens_word_fn word,
                     void *ctx)
{
    if (a >= b) return 0;
    if (k == tok->n_pre) return word(ctx, t, a, b);
    const lens_pre *p = &tok->pre[k];
    const uint32_t *cp = t->cp;
    int rc = 0;
    switch (p->kind) {
    case PRE_BYTELEVEL:
        if (!p->use_regex) return next_step(tok, k, t, a, b, word, ctx);
        return split_by_regex(tok, k, t, a, b, word, ctx); /* behaviour Isolated, set at load */
    case PRE_REGEX:
        return split_by_regex(tok, k, t, a, b, word, ctx);
    case PRE_BERT:
        /* white space removed, each punctuation character alone */
        for (int i = a; i < b && !rc;) {
            if (lens_uni_white_space(cp[i])) { i++; continue; }
            int j = i + 1;
            if (!lens_bert_is_punct(cp[i]))
                while (j < b && !lens_uni_white_space(cp[j]) && !lens_bert_is_punct(cp[j])) j++;
            rc = next_step(tok, k, t, i, j, word, ctx);
            i = j;
        }
        return rc;
    case PRE_WHITESPACE:
        /* \w+|[^\w\s]+ */
        for (int i = a; i < b && !rc;) {
            if (lens_uni_white_space(cp[i])) { i++; continue; }
            int w = is_word_char(cp[i]), j = i + 1;
            while (j < b && !lens_uni_white_space(cp[j]) && is_word_char(cp[j]) == w) j++;
            rc = next_step(tok, k, t, i, j, word, ctx);
            i = j;
        }
        return rc;
    case PRE_METASPACE:
        if (!p->split) return next_step(tok, k, t, a, b, word, ctx);
        return split_delims(tok, k, t, a, b, word, ctx);
    case PRE_DIGITS: case PRE_SPLIT_STRING: case PRE_WHITESPACE_SPLIT: case PRE_PUNCTUATION: case PRE_SP_WORDS:
        /* behaviour set at load: Digits Isolated or Contiguous, WhitespaceSplit Removed */
        return split_delims(tok, k, t, a, b, word, ctx);
    }
    return -1;
}
