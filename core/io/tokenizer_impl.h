/* tokenizer_impl.h - what the tokenizer files share (not a public header).
 *
 * A tokenizer is a Hugging Face pipeline held as data:
 *   added tokens (split first, on the raw text)
 *   -> normalizers (norm[], in order)  -> pre-tokenizers (pre[], in order)
 *   -> model (WordPiece, BPE or Unigram) -> post-processor (template)
 * tokenizer_json.c fills it from tokenizer.json; wordpiece.c and bpe.c fill
 * it from vocab.txt / vocab.json + merges.txt the way transformers' slow
 * classes would. tokenizer.c runs it. Text positions are code-point indices;
 * every normalised code point keeps the original span [os, oe) it came from,
 * so a token's offsets are [os(first), oe(last)). */
#ifndef LENS_TOKENIZER_IMPL_H
#define LENS_TOKENIZER_IMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <utf8proc.h>

#include "core/io/file.h"
#include "core/io/tokenizer.h"

/* Text over this many bytes is refused: offsets and ids are int, and one
 * request that large is a client error, not a workload. */
#define LENS_TOK_MAX_TEXT (1u << 30)
#define LENS_TOK_MAX_ID (1 << 24)
#define LENS_TOK_MAX_STEPS 16

typedef struct {
    char *text;
    int len, id;
    unsigned char lstrip, rstrip, single_word, special;
} lens_added;

typedef enum {
    NORM_BERT, NORM_NFC, NORM_NFKC, NORM_NFD, NORM_NFKD, NORM_LOWERCASE, NORM_STRIP_ACCENTS,
    NORM_REPLACE, NORM_PREPEND, NORM_STRIP, NORM_PRECOMPILED
} lens_norm_kind;

/* A compiled Oniguruma regex (tokenizer_regex.c). */
typedef struct lens_regex lens_regex;
/* A SentencePiece charsmap (tokenizer_precompiled.c). */
typedef struct lens_charsmap lens_charsmap;

typedef struct {
    lens_norm_kind kind;
    /* BertNormalizer */
    unsigned char clean, chinese, strip_accents, lowercase, final_sigma;
    /* Replace (pattern, or re when a Regex, -> content), Prepend (content) */
    char *pattern, *content;
    lens_regex *re;
    lens_charsmap *charsmap; /* Precompiled */
    /* Strip */
    unsigned char left, right;
} lens_norm;

typedef enum {
    PRE_BERT, PRE_BYTELEVEL, PRE_REGEX, PRE_SPLIT_STRING, PRE_METASPACE, PRE_DIGITS, PRE_WHITESPACE,
    PRE_WHITESPACE_SPLIT, PRE_PUNCTUATION,
    PRE_SP_WORDS /* internal: cut before a ▁ that follows a non-▁ (see tokenizer_json.c) */
} lens_pre_kind;

/* A compiled Oniguruma regex (tokenizer_regex.c). */
typedef struct lens_regex lens_regex;

/* The regexes with a hand-written fast path (tokenizer_pretok.c). */
typedef enum { FAST_NONE = -1, FAST_GPT2, FAST_LLAMA3, FAST_QWEN2 } lens_fast_regex;

/* Split behaviours of HF's SplitDelimiterBehavior. */
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } lens_split;

typedef struct {
    lens_pre_kind kind;
    lens_regex *re;            /* PRE_REGEX, PRE_BYTELEVEL with use_regex (owned) */
    unsigned char use_regex, add_prefix_space, individual_digits, split;
    unsigned char invert;      /* PRE_REGEX: the pieces between matches are the delimiters */
    lens_fast_regex fast;      /* PRE_REGEX, PRE_BYTELEVEL: the hand-written matcher of re, or FAST_NONE */
    unsigned char prepend;     /* Metaspace: 0 never, 1 first, 2 always */
    lens_split behavior;
    uint32_t replacement;      /* Metaspace */
    char *string;              /* PRE_SPLIT_STRING */
} lens_pre;

/* Decoders of tokenizer.json (decode.c runs them, HF's decode_chain). */
typedef enum {
    DEC_BYTELEVEL, DEC_METASPACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE, DEC_WORDPIECE, DEC_BPE
} lens_dec_kind;

typedef struct {
    lens_dec_kind kind;
    uint32_t ch;           /* Metaspace replacement, Strip content */
    unsigned char prepend; /* Metaspace: 0 never, else the first token's replacements are dropped */
    unsigned char cleanup; /* WordPiece */
    int start, stop;       /* Strip: at most this many leading / trailing ch per token */
    char *text;            /* WordPiece prefix, BPEDecoder suffix */
    lens_norm replace;     /* Replace: the normalizer of the same name */
} lens_dec;

typedef struct {
    int id;      /* special token id, or -1 for a sequence */
    int seq;     /* 0 A, 1 B for a sequence */
    int type_id;
} lens_tmpl_item;

struct merge_slot;

struct lens_tokenizer {
    lens_tok_kind kind;
    int vocab_size;   /* max id + 1; ids without a piece are holes */
    char **piece;     /* [vocab_size] NUL-terminated, NULL for holes */
    int *piece_len;   /* [vocab_size] bytes */
    int max_piece_len;
    uint32_t *vocab_slots; /* open addressing: id + 1, 0 = empty */
    uint32_t vocab_mask;
    unsigned char *special; /* [vocab_size] 1 for special tokens */

    lens_added *added;
    int n_added, cap_added;
    uint8_t added_first[256]; /* 1 for bytes that start some added token */
    uint32_t *added_slots;    /* open addressing over added by text: index + 1, 0 = empty */
    uint32_t added_mask;
    int *added_lens;          /* the distinct byte lengths of added tokens, longest first */
    int n_added_lens;

    lens_norm norm[LENS_TOK_MAX_STEPS];
    int n_norm;
    lens_pre pre[LENS_TOK_MAX_STEPS];
    int n_pre;
    int bert_fast;   /* BertNormalizer + BertPreTokenizer + WordPiece: fused path */
    int byte_level;  /* a ByteLevel pre-tokenizer: the model sees bytes */

    /* model */
    int unk_id;                 /* -1 when none */
    char *wp_prefix;            /* WordPiece continuing_subword_prefix ("##") */
    int wp_prefix_len;
    int max_input_chars_per_word;
    int byte_fallback, fuse_unk, ignore_merges;
    double *score;              /* Unigram: [vocab_size] log probability of each piece */
    double min_score;           /* Unigram: the lowest score (unknowns score min_score - 10) */
    int n_model_pieces;         /* Unigram: ids below this are the model's pieces */
    struct merge_slot *merge_slots;
    uint64_t merge_mask;
    int byte_id[256];           /* byte-level: id of each byte's symbol */
    int fallback_id[256];       /* byte_fallback: id of "<0xXX>", -1 when absent */

    /* decoder: has_decoder when tokenizer.json gave one (n_dec steps, or
     * none: pieces joined by spaces); otherwise decode.c decodes by kind */
    lens_dec dec[LENS_TOK_MAX_STEPS];
    int n_dec, has_decoder;
    /* tokenizer_config.json's clean_up_tokenization_spaces: 1 or 0, -1 when
     * it does not say (decode.c: then only WordPiece without a decoder, as
     * transformers' BertTokenizer defaults) */
    int clean_up_spaces;

    /* post-processor */
    lens_tmpl_item *single, *pair;
    int n_single, n_pair, has_template;
    int trim_offsets;           /* ByteLevel / RobertaProcessing trim_offsets */
};

/* ---- UTF-8 and decoded text (tokenizer.c) ----------------------------- */

int lens_utf8_next(const unsigned char *s, size_t avail, uint32_t *cp);
int lens_utf8_put(uint32_t cp, char *out);
/* GPT-2's byte -> code point table (bpe.c): byte-level pieces spell bytes with these. */
uint32_t lens_byte_to_unicode(int b);
int lens_utf8_valid(const char *s, size_t len, size_t *bad_at);

/* A decoded segment: cp[n] and byte_off[n + 1] into bytes. */
typedef struct {
    const char *bytes;
    size_t len;
    uint32_t *cp;
    int *byte_off;
    int n;
} lens_text;

int lens_text_decode(lens_text *t, const char *s, size_t len, const char *what, lens_err *err);
void lens_text_free(lens_text *t);

/* ---- Unicode classes (tokenizer_normalize.c) -------------------------- */

/* Inline, with an ASCII fast path: they run once or twice per character. */
/* White_Space: \s of Rust onig / Python regex; \p{L}; \p{N}; BERT's own
 * white space and punctuation. */
static inline int lens_uni_white_space(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static inline int lens_uni_letter(uint32_t cp)
{
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

static inline int lens_uni_number(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

static inline int lens_bert_is_whitespace(uint32_t cp)
{
    if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') return 1;
    if (cp < 0x80) return 0;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* HF _is_punctuation: ASCII non-alphanumeric printables count even where
 * Unicode says symbol ("$", "+", "^"), plus every P* category. */
static inline int lens_bert_is_punct(uint32_t cp)
{
    if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
        (cp >= 123 && cp <= 126))
        return 1;
    if (cp < 0x80) return 0;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}


/* ---- Normalised text with alignments (tokenizer_normalize.c) ---------- */

typedef struct {
    uint32_t *cp;
    int *os, *oe; /* original code-point span of each normalised code point */
    int n, cap;
} lens_norm_buf;

int lens_norm_reserve(lens_norm_buf *b, int need);
static inline int lens_norm_push(lens_norm_buf *b, uint32_t cp, int os, int oe)
{
    if (b->n == b->cap && lens_norm_reserve(b, b->n + 1) < 0) return -1;
    b->cp[b->n] = cp;
    b->os[b->n] = os;
    b->oe[b->n++] = oe;
    return 0;
}
void lens_norm_buf_free(lens_norm_buf *b);
/* Apply one normalizer: in -> out (out is cleared first). */
int lens_normalize_step(const lens_norm *nm, const lens_norm_buf *in, lens_norm_buf *out);
/* The fused BertNormalizer of code points [a, b) of t into out. */
int lens_bert_normalize(const lens_norm *nm, const lens_text *t, int a, int b, lens_norm_buf *out);

/* ---- Output (tokenizer.c) --------------------------------------------- */

typedef struct {
    lens_token *v;
    int n, cap;
} lens_tok_vec;

int lens_tok_grow(lens_tok_vec *out);
static inline int lens_tok_push(lens_tok_vec *out, int id, int start, int end, int segment)
{
    if (out->n == out->cap && lens_tok_grow(out) < 0) return -1;
    out->v[out->n++] = (lens_token){ .id = id, .start = start, .end = end, .segment = segment, .text_index = segment };
    return 0;
}

/* ---- Vocabulary and merges --------------------------------------------- */

#define LENS_FNV_OFFSET 0xcbf29ce484222325ULL
static inline uint64_t lens_fnv1a(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Id of prefix+s (prefix may be empty: "##" for WordPiece continuations),
 * hashing the two parts without concatenating them. */
static inline int lens_vocab_find2(const lens_tokenizer *tok, const char *prefix, size_t plen,
                       const char *s, size_t n)
{
    uint64_t h = lens_fnv1a(lens_fnv1a(LENS_FNV_OFFSET, prefix, plen), s, n);
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

int lens_vocab_alloc(lens_tokenizer *tok, int size, lens_err *err);
int lens_piece_set(lens_tokenizer *tok, int id, const char *s, size_t n, lens_err *err);
int lens_vocab_build_index(lens_tokenizer *tok, lens_err *err);
/* Added token (matched in raw text); text must be in the vocabulary unless
 * id >= 0 is given. Returns -1 on out-of-memory only. */
int lens_added_add(lens_tokenizer *tok, const char *text, int id, int special, int lstrip, int rstrip,
                   int single_word);
/* Special tokens named in tokenizer_config.json / special_tokens_map.json. */
int lens_added_from_json(lens_tokenizer *tok, const json_t *root, lens_err *err);

/* Files */
int lens_tok_file_exists(const char *dir, const char *name);
int lens_tok_json_optional(const char *dir, const char *name, json_t **out, lens_err *err);
const char *lens_tok_json_text(const json_t *v);

/* ---- Models ----------------------------------------------------------- */

typedef struct lens_wp_scratch lens_wp_scratch;
typedef struct lens_bpe_scratch lens_bpe_scratch;

/* WordPiece (wordpiece.c): word w[0..n) -> pieces with offsets k0 + [0, n),
 * through nb's alignments when nb is not NULL. */
int lens_wp_word(const lens_tokenizer *tok, lens_wp_scratch *sc, const uint32_t *w, int n, int k0,
                 const lens_norm_buf *nb, int segment, lens_tok_vec *out);
int lens_wp_bert_range(const lens_tokenizer *tok, lens_wp_scratch *sc, const lens_text *t, int a, int b,
                       int segment, lens_tok_vec *out);
lens_wp_scratch *lens_wp_scratch_new(void);
void lens_wp_scratch_free(lens_wp_scratch *sc);
int lens_load_wordpiece(lens_tokenizer *tok, const char *dir, lens_err *err);

/* BPE (bpe.c): code points [a, b) of t (one pre-token) -> tokens with
 * code-point offsets into t. lens_bpe_begin before each new text. */
int lens_bpe_begin(lens_bpe_scratch *sc, const lens_text *t);
int lens_bpe_word(const lens_tokenizer *tok, lens_bpe_scratch *sc, const lens_text *t, int a, int b,
                  int segment, lens_tok_vec *out);
lens_bpe_scratch *lens_bpe_scratch_new(void);
void lens_bpe_scratch_free(lens_bpe_scratch *sc);
int lens_merges_alloc(lens_tokenizer *tok, int n, lens_err *err);
/* Merge "left right" (pieces); -1 with a message naming what is missing. */
int lens_merge_add(lens_tokenizer *tok, const char *l, size_t ln, const char *r, size_t rn, int rank,
                   lens_err *err);
int lens_byte_level_ids(lens_tokenizer *tok, const char *what, lens_err *err);
int lens_byte_fallback_ids(lens_tokenizer *tok);
int lens_load_bpe(lens_tokenizer *tok, const char *dir, const char *vocab_name, const char *merges_name,
                  lens_err *err);

/* Unigram (unigram.c): code points [a, b) of t (one pre-token) -> tokens
 * with code-point offsets into t. */
int lens_unigram_word(const lens_tokenizer *tok, const lens_text *t, int a, int b, int segment, lens_tok_vec *out);

/* ---- Precompiled normalizer (tokenizer_precompiled.c) ------------------ */

/* NULL with a message when bytes are not a charsmap. */
lens_charsmap *lens_charsmap_new(const unsigned char *bytes, size_t n, char *msg, size_t msg_cap);
void lens_charsmap_free(lens_charsmap *m);
int lens_precompiled_normalize(const lens_charsmap *m, const lens_norm_buf *in, lens_norm_buf *out);

/* ---- Pre-tokenizers (tokenizer_pretok.c) ------------------------------ */

/* Calls word(ctx, i, j) for each pre-token [i, j) of code points [a, b) of
 * t, pre-tokenizer steps k.. of tok applied in order. */
typedef int (*lens_word_fn)(void *ctx, const lens_text *t, int i, int j);
int lens_pretokenize(const lens_tokenizer *tok, int k, const lens_text *t, int a, int b, lens_word_fn word,
                     void *ctx);
/* The fast paths: the end of the pre-token at i of a hand-written regex
 * (GPT-2's also for vocabulary training, lens_gpt2_pretokenize); which
 * fast path a pattern has (FAST_NONE when none) and its pattern. */
int lens_gpt2_word_end(const uint32_t *cp, int i, int b);
int lens_fast_word_end(lens_fast_regex which, const uint32_t *cp, int i, int b);
lens_fast_regex lens_fast_regex_of(const char *pattern);
const char *lens_fast_regex_pattern(lens_fast_regex which);

/* ---- Regexes through Oniguruma (tokenizer_regex.c) -------------------- */

/* ByteLevel's regex (GPT-2's). */
extern const char lens_gpt2_pattern[];
/* NULL with Oniguruma's message in msg when the pattern does not compile. */
lens_regex *lens_regex_compile(const char *pattern, char *msg, size_t msg_cap);
void lens_regex_free(lens_regex *r);
/* Calls found(ctx, s, e) for each match [s, e) (code points of t) of r in
 * [a, b), in order, as the onig crate's find_iter does; stops at the first
 * non-zero return and returns it (-1 when the engine gives up). */
typedef int (*lens_match_fn)(void *ctx, int start, int end);
int lens_regex_each(const lens_regex *r, const lens_text *t, int a, int b, lens_match_fn found, void *ctx);

/* ---- tokenizer.json (tokenizer_json.c) -------------------------------- */

int lens_load_tokenizer_json(lens_tokenizer *tok, const char *path, const json_t *config, lens_err *err);
int lens_load_tokenizer_json_text(lens_tokenizer *tok, const char *data, size_t len, lens_err *err);

#endif
