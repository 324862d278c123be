/* json_valid.h - is a byte string one JSON text (RFC 8259)? A recursive
 * descent recogniser that builds nothing: the request fuzzers check every
 * 200 body with it, where parsing the body into jansson values (a malloc and
 * a strtod per number of a forward's hidden states) took two thirds of
 * fuzz_req_forward's time. Strings must be valid UTF-8 (no overlong forms,
 * no surrogates, nothing past U+10FFFF), as jansson requires; nesting is
 * limited to 2048 levels, jansson's limit; \u0000 and unpaired surrogate
 * escapes are refused, as jansson (without JSON_ALLOW_NUL) refuses them, and
 * so are integers beyond 64 bits and reals beyond a double's range.
 * tests/test_json_valid.c checks it against a table and against jansson on
 * mutated documents. */
#ifndef LENS_JSON_VALID_H
#define LENS_JSON_VALID_H

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const unsigned char *p, *end;
} json_scan;

static int jv_value(json_scan *s, int depth);

static void jv_space(json_scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int jv_literal(json_scan *s, const char *word)
{
    for (; *word; word++, s->p++)
        if (s->p >= s->end || *s->p != (unsigned char)*word) return 0;
    return 1;
}

static int jv_digits(json_scan *s)
{
    const unsigned char *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') s->p++;
    return s->p > start;
}

/* jansson's range check on a number that may be out of range: strtoll for
 * an integer, strtod for a real, on a NUL-terminated copy */
static int jv_in_range(const unsigned char *start, size_t n, int integer)
{
    char small[128], *copy = n < sizeof small ? small : malloc(n + 1);
    if (!copy) return 0;
    memcpy(copy, start, n), copy[n] = 0;
    errno = 0;
    int ok;
    if (integer) {
        (void)strtoll(copy, NULL, 10);
        ok = errno != ERANGE;
    } else {
        const double v = strtod(copy, NULL);
        ok = !((v == HUGE_VAL || v == -HUGE_VAL) && errno == ERANGE);
    }
    if (copy != small) free(copy);
    return ok;
}

static int jv_number(json_scan *s)
{
    const unsigned char *start = s->p;
    if (s->p < s->end && *s->p == '-') s->p++;
    if (s->p < s->end && *s->p == '0') s->p++;
    else if (!(s->p < s->end && *s->p >= '1' && *s->p <= '9') || !jv_digits(s)) return 0;
    const long int_digits = (long)(s->p - start) - (*start == '-');
    int integer = 1;
    long exponent = 0;
    if (s->p < s->end && *s->p == '.' && (integer = 0, s->p++, !jv_digits(s))) return 0;
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        integer = 0;
        s->p++;
        const int negative = s->p < s->end && *s->p == '-';
        if (s->p < s->end && (*s->p == '+' || *s->p == '-')) s->p++;
        const unsigned char *digits = s->p;
        if (!jv_digits(s)) return 0;
        for (const unsigned char *d = digits; d < s->p && exponent < 100000; d++) exponent = exponent * 10 + (*d - '0');
        if (negative) exponent = -exponent;
    }
    /* only numbers near the ends of the ranges pay for the library call */
    if (integer ? int_digits >= 19 : int_digits + exponent > 300) return jv_in_range(start, (size_t)(s->p - start), integer);
    return 1;
}

/* one UTF-8 sequence starting at a byte >= 0x80 */
static int jv_utf8(json_scan *s)
{
    const unsigned c = *s->p++;
    int n;
    unsigned cp, min;
    if (c >= 0xC2 && c <= 0xDF) n = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) n = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) n = 3, cp = c & 0x07, min = 0x10000;
    else return 0;
    for (int i = 0; i < n; i++, s->p++) {
        if (s->p >= s->end || (*s->p & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (*s->p & 0x3F);
    }
    return cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

/* the 4 hex digits of a \u escape, or -1 */
static long jv_hex4(json_scan *s)
{
    long v = 0;
    for (int i = 0; i < 4; i++, s->p++) {
        if (s->p >= s->end) return -1;
        const unsigned char h = *s->p;
        const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

/* \u escapes as jansson takes them: no U+0000, surrogates only as a high-low pair */
static int jv_unicode_escape(json_scan *s)
{
    const long v = jv_hex4(s);
    if (v <= 0 || (v >= 0xDC00 && v <= 0xDFFF)) return 0;
    if (v < 0xD800 || v > 0xDBFF) return 1;
    if (s->end - s->p < 2 || s->p[0] != '\\' || s->p[1] != 'u') return 0;
    s->p += 2;
    const long lo = jv_hex4(s);
    return lo >= 0xDC00 && lo <= 0xDFFF;
}

static int jv_string(json_scan *s)
{
    s->p++; /* the opening quote */
    while (s->p < s->end) {
        const unsigned char c = *s->p;
        if (c == '"') return s->p++, 1;
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (++s->p >= s->end) return 0;
            const unsigned char e = *s->p++;
            if (e == 'u') {
                if (!jv_unicode_escape(s)) return 0;
            } else if (e != '"' && e != '\\' && e != '/' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't') {
                return 0;
            }
        } else if (c >= 0x80) {
            if (!jv_utf8(s)) return 0;
        } else {
            s->p++;
        }
    }
    return 0;
}

/* object or array: open already seen */
static int jv_container(json_scan *s, int depth, unsigned char close)
{
    s->p++;
    jv_space(s);
    if (s->p < s->end && *s->p == close) return s->p++, 1;
    for (;;) {
        if (close == '}') {
            if (s->p >= s->end || *s->p != '"' || !jv_string(s)) return 0;
            jv_space(s);
            if (s->p >= s->end || *s->p++ != ':') return 0;
            jv_space(s);
        }
        if (!jv_value(s, depth + 1)) return 0;
        jv_space(s);
        if (s->p >= s->end) return 0;
        if (*s->p == close) return s->p++, 1;
        if (*s->p++ != ',') return 0;
        jv_space(s);
    }
}

static int jv_value(json_scan *s, int depth)
{
    if (s->p >= s->end || depth > 2048) return 0;
    switch (*s->p) {
    case '{': return jv_container(s, depth, '}');
    case '[': return jv_container(s, depth, ']');
    case '"': return jv_string(s);
    case 't': return jv_literal(s, "true");
    case 'f': return jv_literal(s, "false");
    case 'n': return jv_literal(s, "null");
    default: return jv_number(s);
    }
}

/* 1 when buf[0..len) is exactly one JSON value, with optional white space around it */
static inline int json_valid(const char *buf, size_t len)
{
    json_scan s = {(const unsigned char *)buf, (const unsigned char *)buf + len};
    jv_space(&s);
    if (!jv_value(&s, 1)) return 0;
    jv_space(&s);
    return s.p == s.end;
}

#endif
