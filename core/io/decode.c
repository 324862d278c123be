/* decode.c - ids back to text (lens_tokenizer_decode, POST /v1/detokenize).
 *
 * A tokenizer.json's "decoder" runs as Hugging Face's Rust decode does: the
 * pieces (added tokens' contents included, special ones dropped under
 * skip_special) go through each step's decode_chain in order, then are
 * concatenated; no decoder joins them with spaces. The steps:
 *   ByteLevel     every piece's symbols back to bytes (a piece with a symbol
 *                 outside the table as its own bytes), all pieces one text,
 *                 invalid UTF-8 as U+FFFD per maximal invalid subpart
 *                 (Rust's from_utf8_lossy)
 *   Metaspace     the replacement as a space, dropped in the first piece
 *                 unless prepend_scheme is "never"
 *   ByteFallback  runs of "<0xXX>" pieces as their bytes; a run that is not
 *                 UTF-8 becomes one U+FFFD per byte
 *   Fuse          every piece one; Strip: up to start / stop leading /
 *                 trailing content characters off each piece; Replace: the
 *                 normalizer of that name on each piece
 *   WordPiece     pieces after the first get a space unless they start with
 *                 the prefix (which goes), then HF's cleanup per piece
 *   BPEDecoder    the suffix becomes a space (nothing in the last piece)
 *
 * Without tokenizer.json (vocab.txt, vocab.json + merges.txt) it decodes by
 * kind, as transformers' slow tokenizers do:
 *   WordPiece           pieces joined by spaces, continuations ("##") glued;
 *   byte-level BPE      each piece's code points map back to bytes
 *                       (byte_to_unicode's inverse); runs that are not valid
 *                       UTF-8 become U+FFFD, as errors="replace";
 *   SentencePiece BPE   pieces concatenated, "<0xXX>" byte-fallback pieces as
 *                       bytes, U+2581 as a space, one leading space dropped
 *                       (the Metaspace / ByteFallback / Fuse / Strip decoders).
 * skip_special drops every special token ([CLS], <s>, added special tokens).
 * Then, as transformers' decode does, clean_up_tokenization (no space before
 * . , ! ? and English contractions) over the whole text when
 * tokenizer_config.json's clean_up_tokenization_spaces is true, or, when it
 * does not say, for WordPiece without a decoder (BertTokenizer's default). */
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

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

static int skipped(const lens_tokenizer *tok, int id, int skip_special) { return skip_special && tok->special[id]; }

/* HF's clean-up of spaces, in order: the WordPiece decoder's (Rust,
 * decoders/wordpiece.rs) with do_not, transformers' clean_up_tokenization
 * without (it lacks " do not" -> " don't"). */
static int clean_up_spaces(text_buf *p, int do_not)
{
    static const char *const pairs[][2] = { { " .", "." },         { " ?", "?" },     { " !", "!" },   { " ,", "," },
                                            { " ' ", "'" },        { " n't", "n't" }, { " 'm", "'m" },
                                            { " do not", " don't" }, { " 's", "'s" },   { " 've", "'ve" },
                                            { " 're", "'re" } };
    for (size_t k = 0; k < sizeof pairs / sizeof *pairs; k++) {
        if (k == 7 && !do_not) continue;
        const size_t from = strlen(pairs[k][0]), to = strlen(pairs[k][1]);
        text_buf out = { 0 };
        int rc = buf_put(&out, "", 0);
        for (size_t r = 0; r < p->len && !rc;) {
            if (p->len - r >= from && !memcmp(p->s + r, pairs[k][0], from))
                rc = buf_put(&out, pairs[k][1], to), r += from;
            else
                rc = buf_put(&out, p->s + r, 1), r++;
        }
        if (rc) { free(out.s); return -1; }
        free(p->s);
        *p = out;
    }
    return 0;
}

/* Length of the maximal invalid subpart at s (Rust's Utf8Chunks): the lead
 * byte and the continuation bytes that could still have completed it. */
static size_t invalid_run(const unsigned char *s, size_t avail)
{
    const unsigned char c = s[0];
    int need = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    for (int i = 0; i < need && k < avail; i++, k++) {
        if (s[k] < lo || s[k] > hi) break;
        lo = 0x80, hi = 0xBF;
    }
    return k;
}

/* bytes -> out as UTF-8, each maximal invalid subpart one U+FFFD */
static int put_lossy(const char *s, size_t len, text_buf *out)
{
    if (buf_put(out, "", 0)) return -1;
    for (size_t k = 0; k < len;) {
        uint32_t cp;
        size_t step = (size_t)lens_utf8_next((const unsigned char *)s + k, len - k, &cp);
        int rc = step ? buf_put(out, s + k, step) : buf_put(out, "\xEF\xBF\xBD", 3);
        if (!step) step = invalid_run((const unsigned char *)s + k, len - k);
        k += step;
        if (rc) return -1;
    }
    return 0;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

/* "<0xXX>" as Rust's u8::from_str_radix(XX, 16) reads XX ("+A" is 10 too). */
static int is_byte_piece(const char *s, size_t len, unsigned *byte)
{
    if (len != 6 || strncmp(s, "<0x", 3) || s[5] != '>') return 0;
    const int hi = s[3] == '+' ? 0 : hex_digit(s[3]), lo = hex_digit(s[4]);
    if (hi < 0 || lo < 0) return 0;
    *byte = (unsigned)(hi * 16 + lo);
    return 1;
}

static int decode_byte_level(const lens_tokenizer *tok, const int *ids, int n, int skip_special, text_buf *out)
{
    int byte_of[256 + 68];
    for (int b = 0; b < 256; b++) byte_of[lens_byte_to_unicode(b)] = b;
    text_buf raw = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const char *p = tok->piece[ids[i]];
        if (skipped(tok, ids[i], skip_special)) continue;
        if (tok->special[ids[i]]) { /* added tokens are written as they are */
            rc = buf_put(&raw, p, strlen(p));
            continue;
        }
        size_t len = strlen(p);
        for (size_t k = 0; k < len && !rc;) {
            uint32_t cp;
            int step = lens_utf8_next((const unsigned char *)p + k, len - k, &cp);
            if (step == 0) step = 1, cp = 0xFFFD;
            k += (size_t)step;
            char byte = (char)(cp < 256 + 68 ? byte_of[cp] : '?');
            rc = buf_put(&raw, &byte, 1);
        }
    }
    if (!rc) rc = put_lossy(raw.s, raw.len, out);
    free(raw.s);
    return rc;
}

static int decode_wordpiece(const lens_tokenizer *tok, const int *ids, int n, int skip_special, text_buf *out)
{
    const char *prefix = tok->wp_prefix ? tok->wp_prefix : "##";
    const size_t plen = strlen(prefix);
    if (buf_put(out, "", 0)) return -1;
    for (int i = 0; i < n; i++) {
        const char *p = tok->piece[ids[i]];
        if (skipped(tok, ids[i], skip_special)) continue;
        int glue = !strncmp(p, prefix, plen);
        if (glue) p += plen;
        else if (out->len && buf_put(out, " ", 1)) return -1;
        if (buf_put(out, p, strlen(p))) return -1;
    }
    return 0;
}

static int decode_sentencepiece(const lens_tokenizer *tok, const int *ids, int n, int skip_special, text_buf *out)
{
    text_buf raw = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const char *p = tok->piece[ids[i]];
        unsigned byte;
        if (skipped(tok, ids[i], skip_special)) continue;
        if (is_byte_piece(p, strlen(p), &byte)) {
            char b = (char)byte;
            rc = buf_put(&raw, &b, 1);
            continue;
        }
        for (const char *q = p; *q && !rc;) { /* U+2581 (E2 96 81) is a space */
            if (!strncmp(q, "\xE2\x96\x81", 3)) rc = buf_put(&raw, " ", 1), q += 3;
            else rc = buf_put(&raw, q, 1), q++;
        }
    }
    if (!rc) {
        text_buf trimmed = raw;
        if (trimmed.len && trimmed.s[0] == ' ') trimmed.s++, trimmed.len--; /* the prepended space */
        rc = put_lossy(trimmed.s, trimmed.len, out);
    }
    free(raw.s);
    return rc;
}

/* ---- tokenizer.json's decoder -------------------------------------------- */

typedef struct {
    text_buf *t; /* pieces, each NUL-terminated and owned */
    int n;
} pieces;

static void pieces_free(pieces *p)
{
    for (int i = 0; i < p->n; i++) free(p->t[i].s);
    free(p->t);
    p->t = NULL, p->n = 0;
}

static int pieces_put(pieces *p, const char *s, size_t len)
{
    text_buf b = { 0 };
    if (buf_put(&b, s, len)) return -1;
    p->t[p->n++] = b;
    return 0;
}

/* ByteLevel: all pieces to one text. */
static int dec_byte_level(const pieces *in, pieces *out)
{
    int byte_of[256 + 68];
    memset(byte_of, -1, sizeof byte_of);
    for (int b = 0; b < 256; b++) byte_of[lens_byte_to_unicode(b)] = b;
    text_buf raw = { 0 }, one = { 0 };
    int rc = buf_put(&raw, "", 0);
    for (int i = 0; i < in->n && !rc; i++) {
        const text_buf *p = &in->t[i];
        one.len = 0;
        int mapped = 1;
        for (size_t k = 0; k < p->len && mapped && !rc;) {
            uint32_t cp;
            int step = lens_utf8_next((const unsigned char *)p->s + k, p->len - k, &cp);
            if (!step || cp >= 256 + 68 || byte_of[cp] < 0) { mapped = 0; break; }
            char byte = (char)byte_of[cp];
            rc = buf_put(&one, &byte, 1);
            k += (size_t)step;
        }
        if (!rc) rc = mapped ? buf_put(&raw, one.s ? one.s : "", one.len) : buf_put(&raw, p->s, p->len);
    }
    text_buf text = { 0 };
    if (!rc) rc = put_lossy(raw.s, raw.len, &text);
    free(raw.s), free(one.s);
    if (!rc) out->t[out->n++] = text;
    else free(text.s);
    return rc;
}

/* ByteFallback: the run of byte pieces in bytes as one piece, or one U+FFFD
 * piece per byte when they are not UTF-8. */
static int flush_bytes(text_buf *bytes, pieces *out)
{
    int rc = 0;
    size_t bad_at;
    if (!bytes->len) return 0;
    if (lens_utf8_valid(bytes->s, bytes->len, &bad_at)) rc = pieces_put(out, bytes->s, bytes->len);
    else
        for (size_t k = 0; k < bytes->len && !rc; k++) rc = pieces_put(out, "\xEF\xBF\xBD", 3);
    bytes->len = 0;
    return rc;
}

static int dec_byte_fallback(const pieces *in, pieces *out)
{
    text_buf bytes = { 0 };
    int rc = 0;
    for (int i = 0; i < in->n && !rc; i++) {
        unsigned byte;
        if (is_byte_piece(in->t[i].s, in->t[i].len, &byte)) {
            char b = (char)byte;
            rc = buf_put(&bytes, &b, 1);
            continue;
        }
        rc = flush_bytes(&bytes, out);
        if (!rc) rc = pieces_put(out, in->t[i].s, in->t[i].len);
    }
    if (!rc) rc = flush_bytes(&bytes, out);
    free(bytes.s);
    return rc;
}

/* Metaspace, Strip: code point by code point. */
static int dec_chars(const lens_dec *d, const text_buf *p, int first, text_buf *out)
{
    size_t from = 0, to = p->len;
    if (d->kind == DEC_STRIP) { /* up to start leading and stop trailing d->ch */
        char ch[4];
        size_t w = (size_t)lens_utf8_put(d->ch, ch);
        for (int i = 0; i < d->start && to - from >= w && !memcmp(p->s + from, ch, w); i++) from += w;
        for (int i = 0; i < d->stop && to - from >= w && !memcmp(p->s + to - w, ch, w); i++) to -= w;
        return buf_put(out, p->s + from, to - from);
    }
    char rep[4];
    size_t w = (size_t)lens_utf8_put(d->ch, rep);
    int rc = buf_put(out, "", 0);
    for (size_t k = 0; k < p->len && !rc;) {
        if (p->len - k >= w && !memcmp(p->s + k, rep, w)) {
            if (!(first && d->prepend)) rc = buf_put(out, " ", 1);
            k += w;
        } else {
            rc = buf_put(out, p->s + k, 1), k++;
        }
    }
    return rc;
}

/* Replace: the normalizer on the piece's code points. */
static int dec_replace(const lens_norm *nm, const text_buf *p, text_buf *out)
{
    lens_norm_buf in = { 0 }, done = { 0 };
    int rc = buf_put(out, "", 0);
    for (size_t k = 0; k < p->len && !rc;) {
        uint32_t cp;
        int step = lens_utf8_next((const unsigned char *)p->s + k, p->len - k, &cp);
        if (!step) step = 1, cp = 0xFFFD;
        rc = lens_norm_push(&in, cp, 0, 0);
        k += (size_t)step;
    }
    if (!rc) rc = lens_normalize_step(nm, &in, &done);
    for (int i = 0; i < done.n && !rc; i++) {
        char u[4];
        rc = buf_put(out, u, (size_t)lens_utf8_put(done.cp[i], u));
    }
    lens_norm_buf_free(&in), lens_norm_buf_free(&done);
    return rc;
}

/* WordPiece and BPEDecoder: the piece with its prefix / suffix handled. */
static int dec_affix(const lens_dec *d, const text_buf *p, int i, int last, text_buf *out)
{
    const size_t w = strlen(d->text);
    int rc = buf_put(out, "", 0);
    if (d->kind == DEC_WORDPIECE) {
        size_t from = 0;
        if (i > 0 && p->len >= w && !strncmp(p->s, d->text, w)) from = w;
        else if (i > 0) rc = buf_put(out, " ", 1);
        if (!rc) rc = buf_put(out, p->s + from, p->len - from);
        return rc || !d->cleanup ? rc : clean_up_spaces(out, 1);
    }
    for (size_t k = 0; k < p->len && !rc;) { /* every suffix: " ", or nothing in the last piece */
        if (w && p->len - k >= w && !memcmp(p->s + k, d->text, w)) rc = last ? 0 : buf_put(out, " ", 1), k += w;
        else rc = buf_put(out, p->s + k, 1), k++;
    }
    return rc;
}

/* One decoder step: in -> out (out has room for in->n pieces). */
static int dec_step(const lens_dec *d, const pieces *in, pieces *out)
{
    switch (d->kind) {
    case DEC_BYTELEVEL: return dec_byte_level(in, out);
    case DEC_BYTEFALLBACK: return dec_byte_fallback(in, out);
    case DEC_FUSE: {
        text_buf all = { 0 };
        int rc = buf_put(&all, "", 0);
        for (int i = 0; i < in->n && !rc; i++) rc = buf_put(&all, in->t[i].s, in->t[i].len);
        if (!rc) out->t[out->n++] = all;
        else free(all.s);
        return rc;
    }
    default: break;
    }
    for (int i = 0; i < in->n; i++) {
        text_buf p = { 0 };
        int rc = d->kind == DEC_REPLACE ? dec_replace(&d->replace, &in->t[i], &p)
                 : d->kind == DEC_WORDPIECE || d->kind == DEC_BPE ? dec_affix(d, &in->t[i], i, i == in->n - 1, &p)
                                                                   : dec_chars(d, &in->t[i], i == 0, &p);
        if (rc) { free(p.s); return -1; }
        out->t[out->n++] = p;
    }
    return 0;
}

static int decode_chain(const lens_tokenizer *tok, const int *ids, int n, int skip_special, text_buf *out)
{
    /* no step makes more pieces than it is given */
    const size_t cap = (size_t)n + 1;
    pieces cur = { calloc(cap, sizeof(text_buf)), 0 }, next = { NULL, 0 };
    int rc = cur.t ? 0 : -1;
    for (int i = 0; i < n && !rc; i++)
        if (!skipped(tok, ids[i], skip_special))
            rc = pieces_put(&cur, tok->piece[ids[i]], strlen(tok->piece[ids[i]]));
    for (int k = 0; k < tok->n_dec && !rc; k++) {
        if (!(next.t = calloc(cap, sizeof(text_buf)))) { rc = -1; break; }
        rc = dec_step(&tok->dec[k], &cur, &next);
        pieces_free(&cur);
        cur = next;
        next = (pieces){ NULL, 0 };
    }
    if (!rc) rc = buf_put(out, "", 0);
    for (int i = 0; i < cur.n && !rc; i++) {
        if (!tok->n_dec && i > 0) rc = buf_put(out, " ", 1);
        if (!rc) rc = buf_put(out, cur.t[i].s, cur.t[i].len);
    }
    pieces_free(&cur);
    return rc;
}

int lens_tokenizer_decode(const lens_tokenizer *tok, const int *ids, int n, int skip_special, char **text,
                          size_t *len, lens_err *err)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok->vocab_size || !tok->piece[ids[i]])
            return lens_fail(err, LENS_EINVAL, "id %d at index %d is not in the vocabulary (size %d)", ids[i], i,
                             tok->vocab_size);
    text_buf out = {0};
    int rc = tok->has_decoder                   ? decode_chain(tok, ids, n, skip_special, &out)
             : tok->kind == LENS_TOK_WORDPIECE ? decode_wordpiece(tok, ids, n, skip_special, &out)
             : tok->byte_level                ? decode_byte_level(tok, ids, n, skip_special, &out)
                                              : decode_sentencepiece(tok, ids, n, skip_special, &out);
    const int clean = tok->clean_up_spaces >= 0 ? tok->clean_up_spaces
                                                : !tok->has_decoder && tok->kind == LENS_TOK_WORDPIECE;
    if (!rc && clean) rc = clean_up_spaces(&out, 0);
    if (rc) {
        free(out.s);
        return lens_fail(err, LENS_ENOMEM, "out of memory decoding %d ids", n);
    }
    *text = out.s;
    if (len) *len = out.len;
    return 0;
}
