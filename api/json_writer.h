/* json_writer.h - a growable-buffer JSON writer for responses.
 *
 * Every response body of lensd is written with this, from `{"status":"ok"}`
 * to a 37M-number attention tensor. Structure calls (jw_obj, jw_key, jw_arr,
 * jw_end) track nesting so that commas are never written by hand; the bulk
 * float calls write straight into the buffer with a hand-written formatter
 * (no printf per number).
 *
 * Float formatting with precision p (0..9):
 *   |x| < 1e9  -> fixed notation rounded to p decimals, trailing zeros
 *                 dropped ("0.5", "12.25", "0", "-3")
 *   |x| >= 1e9 -> scientific notation with p+1 significant digits
 *   NaN, +-Inf -> null (JSON has no representation for them)
 * so a parsed value y of written x satisfies
 *   |x - y| <= 0.5 * 10^-p * max(1, |x|)   (plus double rounding, < 1e-15 rel).
 *
 * Precision p | JW_SIGNIFICANT (p in 1..9) counts significant digits
 * instead, which is what format.precision means in the API (an attribution
 * score of 3.2e-5 keeps its digits):
 *   1e9 > |x| >= 1e-9 -> fixed notation rounded to p significant digits,
 *                 trailing zeros dropped ("0.0000321", "12.3", "1234570")
 *   otherwise  -> %.{p}g: p significant digits ("1e-10", "2.5e+10")
 *   0          -> "0"
 * so |x - y| <= 0.5 * 10^(1-p) * |x|   (plus double rounding).
 *
 * Base64: float32 little-endian bytes, standard alphabet with padding
 * (RFC 4648 section 4), decoded exactly by any base64 decoder. */
#ifndef LENS_JSON_WRITER_H
#define LENS_JSON_WRITER_H

#include <stddef.h>
#include <stdint.h>

#define JW_MAX_DEPTH 32
#define JW_SIGNIFICANT 0x100 /* or'ed into a precision: p significant digits, not p decimals */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;                     /* an allocation failed; buf holds a prefix */
    int depth;
    int count[JW_MAX_DEPTH + 1]; /* values written at each depth */
    char close[JW_MAX_DEPTH + 1]; /* '}' or ']' closing each depth */
    int after_key;               /* the next value completes a "key": pair */
} jw;

void jw_init(jw *w);
void jw_free(jw *w);
void jw_reset(jw *w);
/* Hand the buffer (NUL-terminated) to the caller, who frees it; w is reset. */
char *jw_take(jw *w, size_t *len);
int jw_reserve(jw *w, size_t extra);

void jw_raw(jw *w, const char *s, size_t n); /* no separator logic */
/* A complete JSON value written elsewhere (e.g. a stored job result), as the next value. */
void jw_raw_value(jw *w, const char *s, size_t n);

void jw_obj(jw *w);
void jw_arr(jw *w);
void jw_end(jw *w); /* closes the innermost object or array */
void jw_key(jw *w, const char *key);

void jw_str(jw *w, const char *s);               /* NULL writes null */
void jw_strn(jw *w, const char *s, size_t n);    /* escapes; invalid UTF-8 bytes become U+FFFD */
void jw_int(jw *w, long long v);
void jw_bool(jw *w, int v);
void jw_null(jw *w);
void jw_float(jw *w, double x, int precision);
void jw_ints(jw *w, const int *v, size_t n);     /* [..] */
void jw_floats(jw *w, const float *x, size_t n, int precision); /* [..] */
/* [[..]..] of rows x cols, row r starting at x + r * ld */
void jw_floats_2d(jw *w, const float *x, size_t rows, size_t cols, size_t ld, int precision);
/* {"dtype":"float32","shape":[..],"data":"<base64>"} of ndim dims */
void jw_base64_tensor(jw *w, const float *x, const size_t *shape, int ndim);

/* Formats x into dst (>= 32 bytes) as described above; returns the length. */
size_t jw_format_float(char *dst, float x, int precision);
/* Base64 of n bytes into dst (4 * ceil(n/3) bytes, not NUL-terminated). */
size_t jw_base64(char *dst, const unsigned char *src, size_t n);

#endif
