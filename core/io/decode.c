/* decode.c - ids back to text (lens_tokenizer_decode, POST /v1/detokenize),
 * as Hugging Face's tokenizer.decode for the three model kinds:
 *   WordPiece           pieces joined by spaces, continuations ("##") glued,
 *                       then clean_up_tokenization (no space before . , ! ?
 *                       and English contractions);
 *   byte-level BPE      each piece's code points map back to bytes
 *                       (byte_to_unicode's inverse); runs that are not valid
 *                       UTF-8 become U+FFFD, as errors="replace";
 *   SentencePiece BPE   pieces concatenated, "<0xXX>" byte-fallback pieces as
 *                       bytes, U+2581 as a space, one leading space dropped
 *                       (the Metaspace / ByteFallback / Fuse / Strip decoders).
 * skip_special drops every special token ([CLS], <s>, added special tokens). */
#include <stdio.h>
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

/* HF's clean_up_tokenization, in place. */
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

/* raw bytes -> out, invalid UTF-8 runs as U+FFFD */
static int put_valid_utf8(const text_buf *raw, text_buf *out)
{
    for (size_t k = 0; k < raw->len;) {
        uint32_t cp;
        int step = lens_utf8_next((const unsigned char *)raw->s + k, raw->len - k, &cp);
        int rc = step ? buf_put(out, raw->s + k, (size_t)step) : buf_put(out, "\xEF\xBF\xBD", 3);
        k += step ? (size_t)step : 1;
        if (rc) return -1;
    }
    return buf_put(out, "", 0);
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
    if (!rc) rc = put_valid_utf8(&raw, out);
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
    clean_up_spaces(out->s, &out->len);
    return 0;
}

static int decode_sentencepiece(const lens_tokenizer *tok, const int *ids, int n, int skip_special, text_buf *out)
{
    text_buf raw = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const char *p = tok->piece[ids[i]];
        unsigned byte;
        char tail;
        if (skipped(tok, ids[i], skip_special)) continue;
        if (strlen(p) == 6 && sscanf(p, "<0x%2X%c", &byte, &tail) == 2 && tail == '>') {
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
        rc = put_valid_utf8(&trimmed, out);
    }
    free(raw.s);
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
    int rc = tok->kind == LENS_TOK_WORDPIECE ? decode_wordpiece(tok, ids, n, skip_special, &out)
             : tok->byte_level                ? decode_byte_level(tok, ids, n, skip_special, &out)
                                              : decode_sentencepiece(tok, ids, n, skip_special, &out);
    if (rc) {
        free(out.s);
        return lens_fail(err, LENS_ENOMEM, "out of memory decoding %d ids", n);
    }
    *text = out.s;
    if (len) *len = out.len;
    return 0;
}
