/* json_writer.c - the growable JSON buffer, fast float formatting, base64.
 *
 * Owns: every byte of every response body. See json_writer.h for the float
 * format and its error bound. The fixed-notation path turns x into the
 * integer round(|x| * 10^p) (exact enough in double: |x| < 1e9, p <= 9 keeps
 * it below 2^60) and prints its digits two at a time, which is what makes a
 * 37M-float attention tensor take well under a second instead of a printf
 * call per number. */
#include "json_writer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static const char digit_pairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static const uint64_t pow10_u64[] = {
    1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
    100000000ull, 1000000000ull, 10000000000ull, 100000000000ull, 1000000000000ull,
    10000000000000ull, 100000000000000ull, 1000000000000000ull,
    10000000000000000ull, 100000000000000000ull, 1000000000000000000ull,
    10000000000000000000ull};

static const double pow10_f64[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,
                                   1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18};

void jw_init(jw *w) { memset(w, 0, sizeof *w); }

void jw_free(jw *w)
{
    free(w->buf);
    jw_init(w);
}

void jw_reset(jw *w)
{
    char *buf = w->buf;
    size_t cap = w->cap;
    jw_init(w);
    w->buf = buf, w->cap = cap;
}

char *jw_take(jw *w, size_t *len)
{
    if (jw_reserve(w, 1)) {
        if (len) *len = 0;
        jw_free(w);
        return NULL;
    }
    w->buf[w->len] = 0;
    char *buf = w->buf;
    if (len) *len = w->len;
    jw_init(w);
    return buf;
}

int jw_reserve(jw *w, size_t extra)
{
    if (w->oom) return -1;
    if (w->len + extra + 1 <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + extra + 1) cap *= 2;
    char *buf = realloc(w->buf, cap);
    if (!buf) {
        w->oom = 1;
        return -1;
    }
    w->buf = buf, w->cap = cap;
    return 0;
}

void jw_raw(jw *w, const char *s, size_t n)
{
    if (jw_reserve(w, n)) return;
    memcpy(w->buf + w->len, s, n);
    w->len += n;
}

static void put(jw *w, char c)
{
    if (jw_reserve(w, 1)) return;
    w->buf[w->len++] = c;
}

/* Separator before a value: ',' between array elements; nothing after a key. */
static void before_value(jw *w)
{
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->count[w->depth]++ > 0) put(w, ',');
}

static void write_string(jw *w, const char *s, size_t n);

void jw_raw_value(jw *w, const char *s, size_t n)
{
    before_value(w);
    jw_raw(w, s, n);
}

void jw_key(jw *w, const char *key)
{
    if (w->count[w->depth]++ > 0) put(w, ',');
    write_string(w, key, strlen(key));
    put(w, ':');
    w->after_key = 1;
}

static void open_container(jw *w, char open, char close)
{
    before_value(w);
    put(w, open);
    if (w->depth < JW_MAX_DEPTH) w->depth++;
    w->count[w->depth] = 0;
    w->close[w->depth] = close;
}

void jw_obj(jw *w) { open_container(w, '{', '}'); }
void jw_arr(jw *w) { open_container(w, '[', ']'); }

void jw_end(jw *w)
{
    if (w->depth == 0) return;
    put(w, w->close[w->depth]);
    w->depth--;
}

static const char hex_digits[] = "0123456789abcdef";

void jw_strn(jw *w, const char *s, size_t n)
{
    before_value(w);
    write_string(w, s, n);
}

/* Escapes s; a byte that does not start a valid UTF-8 sequence (a string cut
 * inside one, a file name in another encoding) becomes U+FFFD, so a body is
 * valid JSON whatever the bytes it quotes. */
static void write_string(jw *w, const char *s, size_t n)
{
    /* worst case every byte becomes \u00XX */
    if (jw_reserve(w, 6 * n + 2)) return;
    char *d = w->buf + w->len;
    *d++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
            if (k > 0) {
                memcpy(d, s + i, (size_t)k);
                d += k;
                i += (size_t)k - 1;
            } else {
                memcpy(d, "\xEF\xBF\xBD", 3); /* U+FFFD */
                d += 3;
            }
            continue;
        }
        if (c >= 0x20 && c != '"' && c != '\\') {
            *d++ = (char)c;
            continue;
        }
        *d++ = '\\';
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '\n': *d++ = 'n'; break;
        case '\r': *d++ = 'r'; break;
        case '\t': *d++ = 't'; break;
        case '\b': *d++ = 'b'; break;
        case '\f': *d++ = 'f'; break;
        default:
            *d++ = 'u', *d++ = '0', *d++ = '0';
            *d++ = hex_digits[c >> 4], *d++ = hex_digits[c & 15];
        }
    }
    *d++ = '"';
    w->len = (size_t)(d - w->buf);
}

void jw_str(jw *w, const char *s)
{
    if (!s) jw_null(w);
    else jw_strn(w, s, strlen(s));
}

/* Digits of v into d; returns the count. */
static size_t format_u64(char *d, uint64_t v)
{
    char tmp[24];
    char *end = tmp + sizeof tmp, *p = end;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        memcpy(p, digit_pairs + 2 * r, 2);
    }
    if (v >= 10) {
        p -= 2;
        memcpy(p, digit_pairs + 2 * v, 2);
    } else {
        *--p = (char)('0' + v);
    }
    size_t n = (size_t)(end - p);
    memcpy(d, p, n);
    return n;
}

void jw_int(jw *w, long long v)
{
    before_value(w);
    if (jw_reserve(w, 24)) return;
    char *d = w->buf + w->len;
    uint64_t u = (uint64_t)v;
    if (v < 0) {
        *d++ = '-';
        u = 0 - u;
    }
    d += format_u64(d, u);
    w->len = (size_t)(d - w->buf);
}

void jw_bool(jw *w, int v)
{
    before_value(w);
    if (v) jw_raw(w, "true", 4);
    else jw_raw(w, "false", 5);
}

void jw_null(jw *w)
{
    before_value(w);
    jw_raw(w, "null", 4);
}

/* round(ax * 10^p) printed as fixed notation with p decimals, trailing
 * zeros dropped; ax * 10^p < 2^60 and p <= 18. */
static size_t format_fixed(char *dst, double x, double ax, int p)
{
    uint64_t scaled = (uint64_t)(ax * pow10_f64[p] + 0.5);
    if (scaled == 0) {
        dst[0] = '0';
        return 1;
    }
    char *d = dst;
    if (x < 0) *d++ = '-';
    uint64_t int_part = scaled / pow10_u64[p], frac = scaled % pow10_u64[p];
    d += format_u64(d, int_part);
    if (frac) {
        int digits = p;
        while (frac % 10 == 0) frac /= 10, digits--; /* drop trailing zeros */
        *d++ = '.';
        char *q = d + digits; /* digits right to left, two at a time, then the leading zeros */
        while (frac >= 100) {
            q -= 2;
            memcpy(q, digit_pairs + 2 * (frac % 100), 2);
            frac /= 100;
        }
        if (frac >= 10) q -= 2, memcpy(q, digit_pairs + 2 * frac, 2);
        else *--q = (char)('0' + frac);
        while (q > d) *--q = '0';
        d += digits;
    }
    return (size_t)(d - dst);
}

/* floor(log10(ax)) for ax in [1e-9, 1e9): ax lies in [2^e2, 2^(e2+1)), so
 * floor(log10 ax) is floor(e2 log10 2) (1233 / 4096 = log10 2 to 4e-5,
 * exact for |e2| < 128) or one more: one table comparison, no log10. */
static int decimal_exponent(double ax)
{
    static const double pow10_all[] = {1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0,
                                       1e1,   1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10};
    uint64_t bits;
    memcpy(&bits, &ax, sizeof bits);
    int e2 = (int)((bits >> 52) & 0x7ff) - 1023; /* ax normal: ax in [2^e2, 2^(e2+1)) */
    int e = (e2 * 1233) >> 12;                   /* arithmetic shift: floor for negative values too */
    return ax >= pow10_all[e + 11] ? e + 1 : e;
}

size_t jw_format_float(char *dst, float xf, int p)
{
    double x = xf;
    if (!isfinite(x)) {
        memcpy(dst, "null", 4);
        return 4;
    }
    int significant = p & JW_SIGNIFICANT;
    p &= ~JW_SIGNIFICANT;
    if (p > 9) p = 9;
    double ax = fabs(x);
    if (significant) {
        if (p < 1) p = 1;
        if (ax == 0) {
            dst[0] = '0';
            return 1;
        }
        if (ax < 1e-9 || ax >= 1e9) return (size_t)snprintf(dst, 32, "%.*g", p, x);
        int decimals = p - 1 - decimal_exponent(ax);
        if (decimals >= 0) return format_fixed(dst, x, ax, decimals);
        /* more integer digits than p: round to a multiple of 10^-decimals */
        uint64_t unit = pow10_u64[-decimals];
        char *d = dst;
        if (x < 0) *d++ = '-';
        d += format_u64(d, (uint64_t)(ax / (double)unit + 0.5) * unit);
        return (size_t)(d - dst);
    }
    if (p < 0) p = 0;
    if (ax >= 1e9) return (size_t)snprintf(dst, 32, "%.*e", p, x);
    return format_fixed(dst, x, ax, p);
}

void jw_float(jw *w, double x, int precision)
{
    before_value(w);
    if (jw_reserve(w, 32)) return;
    w->len += jw_format_float(w->buf + w->len, (float)x, precision);
}

void jw_ints(jw *w, const int *v, size_t n)
{
    jw_arr(w);
    for (size_t i = 0; i < n; i++) jw_int(w, v[i]);
    jw_end(w);
}

/* Longest number: "-" + 10 integer digits + "." + 9 decimals, or %.9e (16). */
#define JW_FLOAT_MAX 24

static void floats_row(jw *w, const float *x, size_t n, int precision)
{
    if (jw_reserve(w, n * (JW_FLOAT_MAX + 1) + 2)) return;
    char *d = w->buf + w->len;
    *d++ = '[';
    for (size_t i = 0; i < n; i++) {
        if (i) *d++ = ',';
        d += jw_format_float(d, x[i], precision);
    }
    *d++ = ']';
    w->len = (size_t)(d - w->buf);
}

void jw_floats(jw *w, const float *x, size_t n, int precision)
{
    before_value(w);
    floats_row(w, x, n, precision);
}

void jw_floats_2d(jw *w, const float *x, size_t rows, size_t cols, size_t ld, int precision)
{
    before_value(w);
    put(w, '[');
    for (size_t r = 0; r < rows; r++) {
        if (r) put(w, ',');
        floats_row(w, x + r * ld, cols, precision);
    }
    put(w, ']');
}

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t jw_base64(char *dst, const unsigned char *src, size_t n)
{
    char *d = dst;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8 | src[i + 2];
        *d++ = b64_alphabet[v >> 18];
        *d++ = b64_alphabet[(v >> 12) & 63];
        *d++ = b64_alphabet[(v >> 6) & 63];
        *d++ = b64_alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)src[i] << 16;
        *d++ = b64_alphabet[v >> 18];
        *d++ = b64_alphabet[(v >> 12) & 63];
        *d++ = '=', *d++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8;
        *d++ = b64_alphabet[v >> 18];
        *d++ = b64_alphabet[(v >> 12) & 63];
        *d++ = b64_alphabet[(v >> 6) & 63];
        *d++ = '=';
    }
    return (size_t)(d - dst);
}

void jw_base64_tensor(jw *w, const float *x, const size_t *shape, int ndim)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    jw_obj(w);
    jw_key(w, "dtype");
    jw_str(w, "float32");
    jw_key(w, "shape");
    jw_arr(w);
    for (int i = 0; i < ndim; i++) jw_int(w, (long long)shape[i]);
    jw_end(w);
    jw_key(w, "data");
    before_value(w);
    size_t nbytes = n * sizeof(float);
    if (jw_reserve(w, 4 * (nbytes / 3 + 1) + 2)) return;
    char *d = w->buf + w->len;
    *d++ = '"';
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    d += jw_base64(d, (const unsigned char *)x, nbytes);
#else
    for (size_t i = 0; i < n; i += 3) {
        unsigned char le[12];
        size_t k = n - i < 3 ? n - i : 3;
        for (size_t j = 0; j < k; j++) {
            uint32_t u;
            memcpy(&u, x + i + j, 4);
            le[4 * j] = u & 255, le[4 * j + 1] = (u >> 8) & 255;
            le[4 * j + 2] = (u >> 16) & 255, le[4 * j + 3] = u >> 24;
        }
        d += jw_base64(d, le, 4 * k);
    }
#endif
    *d++ = '"';
    w->len = (size_t)(d - w->buf);
    jw_end(w);
}
