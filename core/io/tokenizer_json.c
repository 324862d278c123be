/* tokenizer_json.c - Hugging Face tokenizer.json into the pipeline of
 * tokenizer_impl.h.
 *
 * Read: normalizer (Sequence, BertNormalizer, NFC, NFKC, NFD, NFKD,
 * Lowercase, StripAccents, Replace with a string or regex pattern, Prepend,
 * Strip, Precompiled), pre_tokenizer (Sequence, BertPreTokenizer, ByteLevel,
 * Split with a string or any regex, every behaviour and invert, Metaspace,
 * Digits, Whitespace, WhitespaceSplit, Punctuation), model (WordPiece; BPE
 * with byte_fallback, fuse_unk, ignore_merges, merges as "a b" strings or
 * ["a", "b"] pairs; Unigram with unk_id and byte_fallback), post_processor
 * (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel,
 * Sequence of them), added_tokens (lstrip, rstrip, single_word, special),
 * decoder (Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
 * Replace, WordPiece, BPEDecoder; decode.c runs them). Truncation and
 * padding are not used: lensd reports pieces and offsets and never pads.
 * Anything else is a load error that names it (a normalizer, pre-tokenizer
 * or decoder with its JSON path), never a silently different tokenization
 * or detokenization. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

typedef struct {
    lens_tokenizer *tok;
    const char *path;
    lens_err *err;
    const char *at; /* JSON path of the normalizer / pre-tokenizer being read, or NULL */
} loader;

static int bad(loader *L, const char *what)
{
    if (L->at) return lens_fail(L->err, LENS_EFORMAT, "%s: %s (at %s)", L->path, what, L->at);
    return lens_fail(L->err, LENS_EFORMAT, "%s: %s", L->path, what);
}

static int get_bool(const json_t *o, const char *key, int dflt)
{
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *get_str(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* A short UTF-8 string (<= 64 code points), copied. */
static char *short_string(loader *L, const char *s, const char *what)
{
    size_t n = s ? strlen(s) : 0, bad_at;
    if (!s || n > 256 || !lens_utf8_valid(s, n, &bad_at)) {
        bad(L, what);
        return NULL;
    }
    char *copy = strdup(s);
    if (!copy) lens_fail(L->err, LENS_ENOMEM, "out of memory");
    return copy;
}

/* Oniguruma's compile of pattern into *re; a pattern it rejects is a load
 * error naming the component, the JSON path and the engine's message. */
static int compile(loader *L, lens_regex **re, const char *pattern, const char *who)
{
    char msg[128];
    *re = lens_regex_compile(pattern, msg, sizeof msg);
    if (*re) return 0;
    return lens_fail(L->err, LENS_EFORMAT, "%s: %s at %s: regex \"%.120s\" rejected by Oniguruma: %s", L->path, who,
                     L->at ? L->at : "?", pattern, msg);
}

static int behavior_of(loader *L, const json_t *n, lens_split dflt, lens_split *out)
{
    const char *b = get_str(n, "behavior");
    *out = dflt;
    if (!b) return 0;
    if (!strcmp(b, "Removed")) *out = SPLIT_REMOVED;
    else if (!strcmp(b, "Isolated")) *out = SPLIT_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious")) *out = SPLIT_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext")) *out = SPLIT_MERGED_NEXT;
    else if (!strcmp(b, "Contiguous")) *out = SPLIT_CONTIGUOUS;
    else return lens_fail(L->err, LENS_EFORMAT, "%s: split behavior \"%.64s\" is not supported", L->path, b);
    return 0;
}

/* Standard base64 (RFC 4648, padding optional) of s into *out (malloc'd). */
static int base64_decode(const char *s, unsigned char **out, size_t *n)
{
    size_t len = strlen(s), k = 0;
    unsigned char *buf = malloc(len / 4 * 3 + 3);
    if (!buf) return -1;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
              : c == '+' ? 62 : c == '/' ? 63 : c == '=' ? -2 : -1;
        if (v == -2) break;
        if (v < 0) { free(buf); return 1; }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[k++] = (unsigned char)(acc >> bits);
        }
    }
    *out = buf;
    *n = k;
    return 0;
}

static int read_precompiled(loader *L, lens_norm *nm, const json_t *n)
{
    const char *b64 = get_str(n, "precompiled_charsmap");
    if (!b64 || !*b64) return bad(L, "Precompiled without a \"precompiled_charsmap\" string");
    unsigned char *bytes = NULL;
    size_t len = 0;
    int rc = base64_decode(b64, &bytes, &len);
    if (rc < 0) return lens_fail(L->err, LENS_ENOMEM, "out of memory");
    if (rc) return bad(L, "Precompiled precompiled_charsmap is not base64");
    char msg[128];
    nm->charsmap = lens_charsmap_new(bytes, len, msg, sizeof msg);
    free(bytes);
    if (!nm->charsmap) {
        char what[200];
        snprintf(what, sizeof what, "Precompiled: %s", msg);
        return bad(L, what);
    }
    return 0;
}

/* ---- normalizer --------------------------------------------------------- */

/* Normalizer n, found at JSON path at ("normalizer.normalizers[1]"). */
/* s as one character (dflt when s is absent) into *cp. */
static int one_char(loader *L, const char *s, uint32_t dflt, const char *what, uint32_t *cp)
{
    *cp = dflt;
    if (s && (!*s || lens_utf8_next((const unsigned char *)s, strlen(s), cp) != (int)strlen(s))) return bad(L, what);
    return 0;
}

/* Metaspace's prepend_scheme (or the older add_prefix_space): 2 always,
 * 1 first, 0 never. */
static int metaspace_scheme(loader *L, const json_t *n, unsigned char *prepend)
{
    const char *scheme = get_str(n, "prepend_scheme");
    if (!scheme) *prepend = get_bool(n, "add_prefix_space", 1) ? 2 : 0;
    else if (!strcmp(scheme, "always")) *prepend = 2;
    else if (!strcmp(scheme, "first")) *prepend = 1;
    else if (!strcmp(scheme, "never")) *prepend = 0;
    else return bad(L, "Metaspace prepend_scheme is not always / first / never");
    return 0;
}

/* Replace (the normalizer, and the decoder of the same name): a String or
 * Regex pattern -> content. */
static int read_replace(loader *L, lens_norm *nm, const json_t *n)
{
    nm->kind = NORM_REPLACE;
    const json_t *pat = json_object_get(n, "pattern");
    const char *re = get_str(pat, "Regex"), *p = get_str(pat, "String");
    if (re) {
        if (compile(L, &nm->re, re, "Replace") < 0) return -1;
    } else if (!p || !*p) {
        return bad(L, "Replace without a non-empty String or Regex pattern");
    } else if (!(nm->pattern = short_string(L, p, "Replace pattern too long"))) {
        return -1;
    }
    if (!(nm->content = short_string(L, get_str(n, "content"), "Replace needs a short \"content\" string"))) return -1;
    return 0;
}

static int add_norm(loader *L, const json_t *n, const char *at)
{
    lens_tokenizer *tok = L->tok;
    const char *type = get_str(n, "type");
    L->at = at;
    if (!type) return bad(L, "normalizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers"), *v;
        size_t i;
        if (!json_is_array(list)) return bad(L, "Sequence normalizer without \"normalizers\"");
        json_array_foreach(list, i, v) {
            char child[160];
            snprintf(child, sizeof child, "%.120s.normalizers[%zu]", at, i);
            if (add_norm(L, v, child) < 0) return -1;
        }
        L->at = NULL;
        return 0;
    }
    if (tok->n_norm == LENS_TOK_MAX_STEPS) return bad(L, "too many normalizers");
    lens_norm *nm = &tok->norm[tok->n_norm];
    memset(nm, 0, sizeof *nm);
    if (!strcmp(type, "BertNormalizer")) {
        nm->kind = NORM_BERT;
        nm->clean = (unsigned char)get_bool(n, "clean_text", 1);
        nm->chinese = (unsigned char)get_bool(n, "handle_chinese_chars", 1);
        nm->lowercase = (unsigned char)get_bool(n, "lowercase", 1);
        nm->strip_accents = (unsigned char)get_bool(n, "strip_accents", nm->lowercase);
    } else if (!strcmp(type, "NFC")) nm->kind = NORM_NFC;
    else if (!strcmp(type, "NFKC")) nm->kind = NORM_NFKC;
    else if (!strcmp(type, "NFD")) nm->kind = NORM_NFD;
    else if (!strcmp(type, "NFKD")) nm->kind = NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) nm->kind = NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents")) nm->kind = NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Strip")) {
        nm->kind = NORM_STRIP;
        nm->left = (unsigned char)get_bool(n, "strip_left", 1);
        nm->right = (unsigned char)get_bool(n, "strip_right", 1);
    } else if (!strcmp(type, "Prepend")) {
        nm->kind = NORM_PREPEND;
        if (!(nm->content = short_string(L, get_str(n, "prepend"), "Prepend needs a short \"prepend\" string"))) return -1;
    } else if (!strcmp(type, "Replace")) {
        if (read_replace(L, nm, n) < 0) return -1;
    } else if (!strcmp(type, "Precompiled")) {
        nm->kind = NORM_PRECOMPILED;
        if (read_precompiled(L, nm, n) < 0) return -1;
    } else {
        return lens_fail(L->err, LENS_EFORMAT, "%s: normalizer \"%.64s\" at %s is not supported", L->path, type, at);
    }
    tok->n_norm++;
    L->at = NULL;
    return 0;
}

/* ---- pre_tokenizer ------------------------------------------------------ */

/* Pre-tokenizer n, found at JSON path at ("pre_tokenizer.pretokenizers[0]"). */
static int add_pre(loader *L, const json_t *n, const char *at)
{
    lens_tokenizer *tok = L->tok;
    const char *type = get_str(n, "type");
    L->at = at;
    if (!type) return bad(L, "pre_tokenizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "pretokenizers"), *v;
        size_t i;
        if (!json_is_array(list)) return bad(L, "Sequence pre_tokenizer without \"pretokenizers\"");
        json_array_foreach(list, i, v) {
            char child[160];
            snprintf(child, sizeof child, "%.120s.pretokenizers[%zu]", at, i);
            if (add_pre(L, v, child) < 0) return -1;
        }
        L->at = NULL;
        return 0;
    }
    if (tok->n_pre == LENS_TOK_MAX_STEPS) return bad(L, "too many pre_tokenizers");
    lens_pre *p = &tok->pre[tok->n_pre];
    memset(p, 0, sizeof *p);
    p->fast = FAST_NONE;
    if (!strcmp(type, "BertPreTokenizer")) {
        p->kind = PRE_BERT;
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = PRE_BYTELEVEL;
        p->behavior = SPLIT_ISOLATED;
        p->use_regex = (unsigned char)get_bool(n, "use_regex", 1);
        p->fast = FAST_GPT2;
        if (p->use_regex && compile(L, &p->re, lens_gpt2_pattern, "ByteLevel") < 0) return -1;
        p->add_prefix_space = (unsigned char)get_bool(n, "add_prefix_space", 1);
        if (p->add_prefix_space && tok->n_pre > 0)
            return bad(L, "ByteLevel with add_prefix_space after another pre_tokenizer is not supported");
    } else if (!strcmp(type, "Split")) {
        const json_t *pat = json_object_get(n, "pattern");
        p->invert = (unsigned char)get_bool(n, "invert", 0);
        if (behavior_of(L, n, SPLIT_ISOLATED, &p->behavior) < 0) return -1;
        const char *re = get_str(pat, "Regex"), *str = get_str(pat, "String");
        if (re) {
            p->kind = PRE_REGEX;
            if (compile(L, &p->re, re, "Split") < 0) return -1;
            p->fast = p->behavior == SPLIT_ISOLATED && !p->invert ? lens_fast_regex_of(re) : FAST_NONE;
        } else if (p->invert) {
            return bad(L, "Split with a String pattern and \"invert\": true is not supported");
        } else if (str && *str) {
            p->kind = PRE_SPLIT_STRING;
            if (!(p->string = short_string(L, str, "Split pattern too long"))) return -1;
        } else {
            return bad(L, "Split without a pattern");
        }
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = PRE_METASPACE;
        if (one_char(L, get_str(n, "replacement"), 0x2581, "Metaspace replacement must be one character",
                     &p->replacement) < 0 ||
            metaspace_scheme(L, n, &p->prepend) < 0)
            return -1;
        p->split = (unsigned char)get_bool(n, "split", 1);
        p->behavior = SPLIT_MERGED_NEXT;
        if (tok->n_pre > 0) return bad(L, "Metaspace after another pre_tokenizer is not supported");
    } else if (!strcmp(type, "Digits")) {
        p->kind = PRE_DIGITS;
        p->individual_digits = (unsigned char)get_bool(n, "individual_digits", 0);
        p->behavior = p->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
    } else if (!strcmp(type, "Whitespace")) {
        p->kind = PRE_WHITESPACE;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->kind = PRE_WHITESPACE_SPLIT;
        p->behavior = SPLIT_REMOVED;
    } else if (!strcmp(type, "Punctuation")) {
        p->kind = PRE_PUNCTUATION;
        if (behavior_of(L, n, SPLIT_ISOLATED, &p->behavior) < 0) return -1;
    } else {
        return lens_fail(L->err, LENS_EFORMAT, "%s: pre_tokenizer \"%.64s\" at %s is not supported", L->path, type, at);
    }
    tok->n_pre++;
    L->at = NULL;
    return 0;
}

/* ---- model -------------------------------------------------------------- */

/* The piece table for ids up to the model's max_id and every added token's
 * id (added tokens may lie past the model's vocabulary); each added token
 * checked for an id and a non-empty content. */
static int alloc_pieces(loader *L, const json_t *added, long long max_id)
{
    size_t i;
    const json_t *v;
    json_array_foreach(added, i, v) {
        const json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= LENS_TOK_MAX_ID ||
            !json_is_string(json_object_get(v, "content")) || !*get_str(v, "content"))
            return bad(L, "added_tokens entry without a valid \"id\" and non-empty \"content\"");
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    return lens_vocab_alloc(L->tok, (int)max_id + 1, L->err);
}

/* Added tokens whose id the model's vocabulary left empty get their content
 * as their piece (alloc_pieces checked them). */
static int set_added_pieces(loader *L, const json_t *added)
{
    size_t i;
    const json_t *v;
    json_array_foreach(added, i, v) {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        const char *s = get_str(v, "content");
        if (!L->tok->piece[id] && lens_piece_set(L->tok, id, s, strlen(s), L->err) < 0) return -1;
    }
    return 0;
}

/* vocab {piece: id} plus added tokens (which may lie past it) -> pieces. */
static int read_vocab(loader *L, const json_t *vocab, const json_t *added)
{
    lens_tokenizer *tok = L->tok;
    const char *key;
    const json_t *v;
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) return bad(L, "model.vocab is not a non-empty object");
    long long max_id = -1;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= LENS_TOK_MAX_ID)
            return lens_fail(L->err, LENS_EFORMAT, "%s: id of \"%.64s\" is not an integer in [0, %d)", L->path, key,
                             LENS_TOK_MAX_ID);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    if (alloc_pieces(L, added, max_id) < 0) return -1;
    json_object_foreach((json_t *)vocab, key, v) {
        int id = (int)json_integer_value(v);
        size_t n = strlen(key);
        if (tok->piece[id])
            return lens_fail(L->err, LENS_EFORMAT, "%s: id %d given to both \"%.64s\" and \"%.64s\"", L->path, id,
                             tok->piece[id], key);
        if (n == 0) return lens_fail(L->err, LENS_EFORMAT, "%s: empty piece (id %d)", L->path, id);
        if (lens_piece_set(tok, id, key, n, L->err) < 0) return -1;
    }
    if (set_added_pieces(L, added) < 0) return -1;
    return lens_vocab_build_index(tok, L->err);
}

static int read_unk(loader *L, const json_t *model)
{
    const json_t *u = json_object_get(model, "unk_token");
    L->tok->unk_id = -1;
    if (json_is_null(u) || !u) return 0;
    if (!json_is_string(u)) return bad(L, "model.unk_token is not a string");
    L->tok->unk_id = lens_tokenizer_id(L->tok, json_string_value(u));
    if (L->tok->unk_id < 0)
        return lens_fail(L->err, LENS_EFORMAT, "%s: unk_token \"%.64s\" is not in the vocabulary", L->path,
                         json_string_value(u));
    return 0;
}

static int read_merges(loader *L, const json_t *merges)
{
    lens_tokenizer *tok = L->tok;
    size_t i;
    const json_t *m;
    if (!json_is_array(merges)) return bad(L, "model.merges is not an array");
    if (lens_merges_alloc(tok, (int)json_array_size(merges) + 1, L->err) < 0) return -1;
    json_array_foreach(merges, i, m) {
        const char *l, *r;
        size_t ln, rn;
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
                return lens_fail(L->err, LENS_EFORMAT, "%s: merge %zu \"%.64s\" is not two pieces separated by one space",
                                 L->path, i + 1, s);
            l = s, ln = (size_t)(sp - s), r = sp + 1, rn = strlen(r);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            l = json_string_value(json_array_get(m, 0)), r = json_string_value(json_array_get(m, 1));
            ln = strlen(l), rn = strlen(r);
        } else {
            return lens_fail(L->err, LENS_EFORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", L->path, i + 1);
        }
        if (lens_merge_add(tok, l, ln, r, rn, (int)i, L->err) < 0) {
            lens_err inner = *L->err;
            return lens_fail(L->err, LENS_EFORMAT, "%s: %s", L->path, inner.msg);
        }
    }
    return 0;
}

static int empty_or_null(const json_t *v)
{
    return !v || json_is_null(v) || (json_is_string(v) && !*json_string_value(v));
}

/* Unigram: "vocab" [[piece, score], ...] (id = index), "unk_id",
 * "byte_fallback"; every bad entry named by its JSON path. */
static int read_unigram(loader *L, const json_t *model, const json_t *added)
{
    lens_tokenizer *tok = L->tok;
    const json_t *vocab = json_object_get(model, "vocab"), *v;
    size_t i, n = json_array_size(vocab);
    if (!json_is_array(vocab) || n == 0) return bad(L, "model.vocab of a Unigram model is not a non-empty array");
    if (n >= LENS_TOK_MAX_ID) return bad(L, "model.vocab of a Unigram model is too large");
    if (alloc_pieces(L, added, (long long)n - 1) < 0) return -1;
    tok->score = calloc((size_t)tok->vocab_size, sizeof *tok->score);
    if (!tok->score) return lens_fail(L->err, LENS_ENOMEM, "out of memory");
    tok->n_model_pieces = (int)n;
    tok->min_score = 0;
    json_array_foreach(vocab, i, v) {
        const json_t *piece = json_array_get(v, 0), *score = json_array_get(v, 1);
        size_t bad_at;
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(piece) || !json_string_length(piece) ||
            !lens_utf8_valid(json_string_value(piece), json_string_length(piece), &bad_at))
            return lens_fail(L->err, LENS_EFORMAT, "%s: model.vocab[%zu] of a Unigram model is not [piece, score] "
                             "with a non-empty UTF-8 piece", L->path, i);
        if (!json_is_number(score))
            return lens_fail(L->err, LENS_EFORMAT, "%s: model.vocab[%zu] (\"%.64s\"): score is not a number", L->path,
                             i, json_string_value(piece));
        if (lens_piece_set(tok, (int)i, json_string_value(piece), json_string_length(piece), L->err) < 0) return -1;
        tok->score[i] = json_number_value(score);
        if (!i || tok->score[i] < tok->min_score) tok->min_score = tok->score[i];
    }
    if (set_added_pieces(L, added) < 0) return -1;
    if (lens_vocab_build_index(tok, L->err) < 0) return -1;
    const json_t *unk = json_object_get(model, "unk_id");
    if (!json_is_integer(unk) || json_integer_value(unk) < 0 || json_integer_value(unk) >= (json_int_t)n)
        return bad(L, "model.unk_id of a Unigram model is not an id of model.vocab (a Unigram model without one is not supported)");
    tok->unk_id = (int)json_integer_value(unk);
    tok->byte_fallback = get_bool(model, "byte_fallback", 0);
    tok->kind = LENS_TOK_UNIGRAM;
    return lens_byte_fallback_ids(tok);
}

static int read_model(loader *L, const json_t *model, const json_t *added)
{
    lens_tokenizer *tok = L->tok;
    const char *type = get_str(model, "type");
    if (!json_is_object(model)) return bad(L, "no \"model\" object");
    if (type && !strcmp(type, "Unigram")) return read_unigram(L, model, added);
    if (!type) type = json_object_get(model, "merges") ? "BPE" : json_object_get(model, "max_input_chars_per_word") ? "WordPiece" : "";
    if (read_vocab(L, json_object_get(model, "vocab"), added) < 0 || read_unk(L, model) < 0) return -1;
    if (!strcmp(type, "WordPiece")) {
        tok->kind = LENS_TOK_WORDPIECE;
        const char *prefix = get_str(model, "continuing_subword_prefix");
        tok->wp_prefix = strdup(prefix ? prefix : "##");
        if (!tok->wp_prefix) return lens_fail(L->err, LENS_ENOMEM, "out of memory");
        tok->wp_prefix_len = (int)strlen(tok->wp_prefix);
        const json_t *mx = json_object_get(model, "max_input_chars_per_word");
        tok->max_input_chars_per_word = json_is_integer(mx) && json_integer_value(mx) > 0 && json_integer_value(mx) < (1 << 30)
                                        ? (int)json_integer_value(mx) : 100;
        if (tok->unk_id < 0) return bad(L, "WordPiece needs an unk_token in the vocabulary");
        return 0;
    }
    if (strcmp(type, "BPE") != 0)
        return lens_fail(L->err, LENS_EFORMAT, "%s: model \"%.64s\" is not supported (WordPiece, BPE, Unigram)", L->path, type);
    tok->kind = LENS_TOK_BPE;
    if (!empty_or_null(json_object_get(model, "continuing_subword_prefix")) ||
        !empty_or_null(json_object_get(model, "end_of_word_suffix")))
        return bad(L, "BPE with continuing_subword_prefix / end_of_word_suffix is not supported");
    const json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0) return bad(L, "BPE dropout is not supported");
    tok->byte_fallback = get_bool(model, "byte_fallback", 0);
    tok->fuse_unk = get_bool(model, "fuse_unk", 0);
    tok->ignore_merges = get_bool(model, "ignore_merges", 0);
    if (read_merges(L, json_object_get(model, "merges")) < 0) return -1;
    for (int k = 0; k < tok->n_pre; k++)
        if (tok->pre[k].kind == PRE_BYTELEVEL) return lens_byte_level_ids(tok, L->path, L->err);
    return lens_byte_fallback_ids(tok);
}

/* ---- post_processor ----------------------------------------------------- */

/* A post-processor's token id must name a token the vocabulary has: an id
 * inside a gap of the vocabulary's ids would be emitted without a piece
 * (found by fuzz_tokenizer_json: sep ["[SEP]", 31] with ids 0..9 and 71). */
static int is_token_id(const loader *L, const json_t *id)
{
    return json_is_integer(id) && json_integer_value(id) >= 0 && json_integer_value(id) < L->tok->vocab_size &&
           L->tok->piece[json_integer_value(id)] != NULL;
}

/* ["[CLS]", 101] of BertProcessing / RobertaProcessing -> id. */
static int pair_id(loader *L, const json_t *v, const char *what)
{
    const json_t *id = json_array_get(v, 1);
    if (!json_is_array(v) || !is_token_id(L, id))
        return lens_fail(L->err, LENS_EFORMAT, "%s: post_processor %s is not [token, id] with the id of a vocabulary token",
                         L->path, what);
    return (int)json_integer_value(id);
}

static int set_template(lens_tokenizer *tok, const lens_tmpl_item *single, int ns, const lens_tmpl_item *pair, int np,
                        lens_err *err)
{
    free(tok->single);
    free(tok->pair);
    tok->single = malloc(((size_t)ns + 1) * sizeof *single);
    tok->pair = malloc(((size_t)np + 1) * sizeof *pair);
    if (!tok->single || !tok->pair) return lens_fail(err, LENS_ENOMEM, "out of memory");
    memcpy(tok->single, single, (size_t)ns * sizeof *single);
    memcpy(tok->pair, pair, (size_t)np * sizeof *pair);
    tok->n_single = ns, tok->n_pair = np, tok->has_template = 1;
    return 0;
}

/* One side ("single" or "pair") of a TemplateProcessing. */
static int template_side(loader *L, const json_t *list, const json_t *specials, lens_tmpl_item *out, int cap)
{
    size_t i;
    const json_t *v;
    int n = 0;
    if (!json_is_array(list)) return bad(L, "TemplateProcessing without \"single\" / \"pair\" lists");
    json_array_foreach(list, i, v) {
        const json_t *sp = json_object_get(v, "SpecialToken"), *sq = json_object_get(v, "Sequence");
        const json_t *node = sp ? sp : sq;
        const json_t *ty = json_object_get(node, "type_id");
        int type_id = json_is_integer(ty) ? (int)json_integer_value(ty) : 0;
        const char *name = get_str(node, "id");
        if (!node || !name || type_id < 0 || type_id > 1000) return bad(L, "TemplateProcessing item is not a SpecialToken or Sequence");
        if (sq) {
            if (n == cap) return bad(L, "TemplateProcessing template too long");
            if (strcmp(name, "A") != 0 && strcmp(name, "B") != 0) return bad(L, "TemplateProcessing Sequence id is not A or B");
            out[n++] = (lens_tmpl_item){ -1, name[0] == 'B', type_id };
            continue;
        }
        const json_t *ids = json_object_get(json_object_get(specials, name), "ids"), *idv;
        size_t k;
        if (!json_is_array(ids) || json_array_size(ids) == 0)
            return lens_fail(L->err, LENS_EFORMAT, "%s: template token \"%.64s\" is not in special_tokens", L->path, name);
        json_array_foreach(ids, k, idv) {
            if (!is_token_id(L, idv))
                return lens_fail(L->err, LENS_EFORMAT, "%s: template token \"%.64s\" has an id that is not a vocabulary token", L->path, name);
            if (n == cap) return bad(L, "TemplateProcessing template too long");
            out[n++] = (lens_tmpl_item){ (int)json_integer_value(idv), 0, type_id };
        }
    }
    return n;
}

static int read_post(loader *L, const json_t *n)
{
    lens_tokenizer *tok = L->tok;
    if (!n || json_is_null(n)) return 0;
    const char *type = get_str(n, "type");
    if (!type) return bad(L, "post_processor without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "processors"), *v;
        size_t i;
        if (!json_is_array(list)) return bad(L, "Sequence post_processor without \"processors\"");
        json_array_foreach(list, i, v)
            if (read_post(L, v) < 0) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        tok->trim_offsets |= get_bool(n, "trim_offsets", 1);
        return 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        lens_tmpl_item single[64], pair[64];
        const json_t *specials = json_object_get(n, "special_tokens");
        int ns = template_side(L, json_object_get(n, "single"), specials, single, 64);
        if (ns < 0) return -1;
        int np = template_side(L, json_object_get(n, "pair"), specials, pair, 64);
        if (np < 0) return -1;
        for (int i = 0, saw_b = 0; i < np; i++) {
            if (pair[i].id < 0 && pair[i].seq == 0 && saw_b) return bad(L, "TemplateProcessing pair with B before A is not supported");
            saw_b |= pair[i].id < 0 && pair[i].seq == 1;
        }
        return set_template(tok, single, ns, pair, np, L->err);
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int roberta = type[0] == 'R';
        int cls = pair_id(L, json_object_get(n, "cls"), "cls");
        if (cls < 0) return -1;
        int sep = pair_id(L, json_object_get(n, "sep"), "sep");
        if (sep < 0) return -1;
        if (roberta) tok->trim_offsets |= get_bool(n, "trim_offsets", 1);
        lens_tmpl_item single[3] = { { cls, 0, 0 }, { -1, 0, 0 }, { sep, 0, 0 } };
        lens_tmpl_item bert[5] = { { cls, 0, 0 }, { -1, 0, 0 }, { sep, 0, 0 }, { -1, 1, 1 }, { sep, 0, 1 } };
        lens_tmpl_item rob[6] = { { cls, 0, 0 }, { -1, 0, 0 }, { sep, 0, 0 }, { sep, 0, 0 }, { -1, 1, 0 }, { sep, 0, 0 } };
        return set_template(tok, single, 3, roberta ? rob : bert, roberta ? 6 : 5, L->err);
    }
    return lens_fail(L->err, LENS_EFORMAT, "%s: post_processor \"%.64s\" is not supported", L->path, type);
}

/* ---- the file ----------------------------------------------------------- */

/* SentencePiece-style files (Llama-2, Gemma) have no pre_tokenizer: BPE runs
 * over the whole normalised text as one word, O(n log n) and uncacheable.
 * When no piece has a ▁ after another character, no merge can join across
 * the start of a "▁word", so cutting there (before a ▁ that follows a non-▁)
 * gives the same tokens, word by word and cached. */
static int sp_words(lens_tokenizer *tok)
{
    if (tok->kind != LENS_TOK_BPE || tok->byte_level || tok->n_pre != 0) return 0;
    static const char bar[] = "\xE2\x96\x81"; /* U+2581 */
    for (int id = 0; id < tok->vocab_size; id++) {
        const char *p = tok->piece[id];
        if (!p) continue;
        for (const char *q = strstr(p, bar); q; q = strstr(q + 3, bar))
            if (q > p && (q - p < 3 || memcmp(q - 3, bar, 3) != 0)) return 0;
    }
    if (tok->n_pre == LENS_TOK_MAX_STEPS) return -1;
    tok->pre[tok->n_pre++] = (lens_pre){ .kind = PRE_SP_WORDS, .replacement = 0x2581, .behavior = SPLIT_MERGED_NEXT };
    return 0;
}

/* ---- decoder ------------------------------------------------------------ */

static int read_decoder_step(loader *L, lens_dec *d, const json_t *n, const char *type)
{
    if (!strcmp(type, "ByteLevel")) d->kind = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->kind = DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->kind = DEC_METASPACE;
        return one_char(L, get_str(n, "replacement"), 0x2581, "Metaspace replacement must be one character", &d->ch) < 0
                   ? -1 : metaspace_scheme(L, n, &d->prepend);
    } else if (!strcmp(type, "Strip")) {
        d->kind = DEC_STRIP;
        const json_t *start = json_object_get(n, "start"), *stop = json_object_get(n, "stop");
        if (!json_is_integer(start) || !json_is_integer(stop) || json_integer_value(start) < 0 ||
            json_integer_value(stop) < 0 || json_integer_value(start) > INT32_MAX ||
            json_integer_value(stop) > INT32_MAX)
            return bad(L, "Strip needs non-negative integers \"start\" and \"stop\"");
        d->start = (int)json_integer_value(start), d->stop = (int)json_integer_value(stop);
        if (!get_str(n, "content")) return bad(L, "Strip needs a one-character \"content\"");
        return one_char(L, get_str(n, "content"), ' ', "Strip needs a one-character \"content\"", &d->ch);
    } else if (!strcmp(type, "Replace")) {
        d->kind = DEC_REPLACE;
        return read_replace(L, &d->replace, n);
    } else if (!strcmp(type, "WordPiece") || !strcmp(type, "BPEDecoder")) {
        int wp = type[0] == 'W';
        d->kind = wp ? DEC_WORDPIECE : DEC_BPE;
        d->cleanup = (unsigned char)get_bool(n, "cleanup", 1);
        const char *text = get_str(n, wp ? "prefix" : "suffix");
        return (d->text = short_string(L, text ? text : wp ? "##" : "</w>", wp ? "WordPiece decoder prefix too long"
                                                                            : "BPEDecoder suffix too long")) ? 0 : -1;
    } else {
        return lens_fail(L->err, LENS_EFORMAT, "%s: decoder \"%.64s\" at %s is not supported", L->path, type, L->at);
    }
    return 0;
}

/* Decoder n, found at JSON path at; a Sequence's steps are chained in order. */
static int add_decoder(loader *L, const json_t *n, const char *at)
{
    lens_tokenizer *tok = L->tok;
    const char *type = get_str(n, "type");
    L->at = at;
    if (!type) return bad(L, "decoder without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "decoders"), *v;
        size_t i;
        if (!json_is_array(list)) return bad(L, "Sequence decoder without \"decoders\"");
        json_array_foreach(list, i, v) {
            char child[160];
            snprintf(child, sizeof child, "%.120s.decoders[%zu]", at, i);
            if (add_decoder(L, v, child) < 0) return -1;
        }
        L->at = NULL;
        return 0;
    }
    if (tok->n_dec == LENS_TOK_MAX_STEPS) return bad(L, "too many decoders");
    lens_dec *d = &tok->dec[tok->n_dec];
    memset(d, 0, sizeof *d);
    if (read_decoder_step(L, d, n, type) < 0) return -1;
    tok->n_dec++;
    L->at = NULL;
    return 0;
}

static int read_added(loader *L, const json_t *added)
{
    size_t i;
    const json_t *v;
    json_array_foreach(added, i, v) {
        if (lens_added_add(L->tok, get_str(v, "content"), (int)json_integer_value(json_object_get(v, "id")),
                           get_bool(v, "special", 0), get_bool(v, "lstrip", 0), get_bool(v, "rstrip", 0),
                           get_bool(v, "single_word", 0)) < 0)
            return lens_fail(L->err, LENS_ENOMEM, "out of memory");
    }
    return 0;
}

static int read_root(loader *L, const json_t *root)
{
    lens_tokenizer *tok = L->tok;
    if (!json_is_object(root)) return bad(L, "top level is not a JSON object");
    const json_t *added = json_object_get(root, "added_tokens");
    json_t *none = json_array();
    if (!none) return lens_fail(L->err, LENS_ENOMEM, "out of memory");
    if (!added || json_is_null(added)) added = none;
    int rc = -1;
    if (!json_is_array(added)) { bad(L, "added_tokens is not an array"); goto done; }
    const json_t *norm = json_object_get(root, "normalizer"), *pre = json_object_get(root, "pre_tokenizer");
    if (norm && !json_is_null(norm) && add_norm(L, norm, "normalizer") < 0) goto done;
    if (pre && !json_is_null(pre) && add_pre(L, pre, "pre_tokenizer") < 0) goto done;
    if (read_model(L, json_object_get(root, "model"), added) < 0) goto done;
    if (read_post(L, json_object_get(root, "post_processor")) < 0) goto done;
    const json_t *decoder = json_object_get(root, "decoder");
    tok->has_decoder = 1;
    if (decoder && !json_is_null(decoder) && add_decoder(L, decoder, "decoder") < 0) goto done;
    if (read_added(L, added) < 0) goto done;
    if (sp_words(tok) < 0) { bad(L, "too many pre_tokenizers"); goto done; }
    tok->bert_fast = tok->kind == LENS_TOK_WORDPIECE && tok->n_norm == 1 && tok->norm[0].kind == NORM_BERT &&
                     tok->n_pre == 1 && tok->pre[0].kind == PRE_BERT;
    for (int k = 0; k < tok->n_norm && !tok->bert_fast; k++)
        if (tok->norm[k].kind == NORM_BERT) {
            bad(L, "BertNormalizer is supported with BertPreTokenizer and WordPiece only");
            goto done;
        }
    rc = 0;
done:
    json_decref(none);
    return rc;
}

int lens_load_tokenizer_json_text(lens_tokenizer *tok, const char *data, size_t len, lens_err *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return lens_fail(err, LENS_EFORMAT, "tokenizer.json:%d: %s", jerr.line, jerr.text);
    loader L = { tok, "tokenizer.json", err, NULL };
    int rc = read_root(&L, root);
    json_decref(root);
    return rc;
}

int lens_load_tokenizer_json(lens_tokenizer *tok, const char *path, const json_t *config, lens_err *err)
{
    (void)config;
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return lens_fail(err, LENS_EFORMAT, "%s:%d: %s", path, jerr.line, jerr.text);
    loader L = { tok, path, err, NULL };
    int rc = read_root(&L, root);
    json_decref(root);
    return rc;
}
