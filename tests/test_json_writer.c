/* test_json_writer.c - api/json_writer: float formatting, structure, base64.
 *
 * Float tolerance: a value x written with precision p and parsed back with
 * strtod as y must satisfy |x - y| <= 0.5 * 10^-p * max(1, |x|) * (1 + 1e-9).
 * 0.5 * 10^-p is the rounding to p decimals (or to p+1 significant digits in
 * scientific notation for |x| >= 1e9); the 1e-9 slack covers the double
 * multiplication x * 10^p, whose relative error is ~1e-16.
 * Base64 round-trips must be bit-exact (including NaN payloads and -0). */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "api/json_writer.h"
#include "tests/check.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double uniform(void) { return (double)(rng() >> 11) / 9007199254740992.0; }

static void test_format_cases(void)
{
    struct {
        float x;
        int p;
        const char *want;
    } cases[] = {
        {0.0f, 6, "0"},         {-0.0f, 6, "0"},          {0.5f, 6, "0.5"},       {-3.0f, 6, "-3"},
        {1e-7f, 6, "0"},        {-1e-7f, 6, "0"},         {0.1234567f, 6, "0.123457"}, {12.25f, 1, "12.3"},
        {12.25f, 0, "12"},      {0.999999f, 3, "1"},      {100.0f, 2, "100"},     {1e9f, 2, "1.00e+09"},
        {-2.5e10f, 3, "-2.500e+10"}, {NAN, 6, "null"},    {INFINITY, 6, "null"},  {-INFINITY, 6, "null"},
        {123456789.0f, 0, "123456792"}, {0.000123f, 9, "0.000123"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[40];
        size_t n = jw_format_float(buf, cases[i].x, cases[i].p);
        buf[n] = 0;
        CHECK(!strcmp(buf, cases[i].want), "format(%.9g, %d) = \"%s\", want \"%s\"", (double)cases[i].x, cases[i].p,
              buf, cases[i].want);
    }
}

/* p | JW_SIGNIFICANT: p significant digits (format.precision of the API) */
static void test_format_significant_cases(void)
{
    const int S = JW_SIGNIFICANT;
    struct {
        float x;
        int p;
        const char *want;
    } cases[] = {
        {0.0f, 6, "0"},           {-0.0f, 6, "0"},           {0.5f, 6, "0.5"},           {-3.0f, 6, "-3"},
        {3.2145678e-5f, 6, "0.0000321457"}, {-3.2145678e-5f, 2, "-0.000032"}, {0.1234567f, 6, "0.123457"},
        {12.25f, 3, "12.3"},      {123456.7f, 6, "123457"},  {1234567.0f, 6, "1234570"}, {1e9f, 2, "1e+09"},
        {1e-10f, 6, "1e-10"},     {1.5e-9f, 3, "0.0000000015"}, {0.999999f, 3, "1"},     {9.9999e-6f, 2, "0.00001"},
        {100.0f, 2, "100"},       {-2.5e10f, 3, "-2.5e+10"}, {NAN, 6, "null"},          {1.0f, 0, "1"},             {0.000123f, 9, "0.000123000005"},
    };
    int n = (int)(sizeof cases / sizeof *cases);
    for (int i = 0; i < n; i++) {
        char buf[40];
        size_t k = jw_format_float(buf, cases[i].x, cases[i].p | S);
        buf[k] = 0;
        CHECK(!strcmp(buf, cases[i].want), "significant format(%.9g, %d) = \"%s\", want \"%s\"", (double)cases[i].x,
              cases[i].p, buf, cases[i].want);
    }
    CHECK(n == 20, "20 significant-digit cases");
}

/* |x - y| <= 0.5 * 10^(1-p) * |x| for p significant digits, over 1e-12 .. 1e12 */
static void test_float_roundtrip_significant(void)
{
    for (int p = 1; p <= 9; p++) {
        int bad = 0;
        for (int i = 0; i < 200000; i++) {
            double mag = pow(10.0, -12.0 + 24.0 * uniform());
            float x = (float)((rng() & 1) ? -mag : mag);
            char buf[40];
            size_t n = jw_format_float(buf, x, p | JW_SIGNIFICANT);
            buf[n] = 0;
            char *end;
            double y = strtod(buf, &end);
            double bound = 0.5 * pow(10.0, 1 - p) * fabs((double)x) * (1 + 1e-9);
            if (*end || !(fabs((double)x - y) <= bound) || n > 24) {
                if (!bad) fprintf(stderr, "  p=%d x=%.9g wrote \"%s\" err %g > %g\n", p, (double)x, buf, fabs(x - y), bound);
                bad++;
            }
        }
        CHECK(bad == 0, "significant precision %d: %d of 200000 values outside the relative bound", p, bad);
    }
}

static void test_float_roundtrip(void)
{
    for (int p = 0; p <= 9; p++) {
        int bad = 0;
        double worst = 0;
        float worst_x = 0;
        for (int i = 0; i < 200000; i++) {
            /* log-uniform magnitudes 1e-10 .. 1e12, random sign */
            double mag = pow(10.0, -10.0 + 22.0 * uniform());
            float x = (float)((rng() & 1) ? -mag : mag);
            if (i % 17 == 0) x = (float)(uniform() * 2 - 1); /* plenty in [-1, 1] */
            char buf[40];
            size_t n = jw_format_float(buf, x, p);
            buf[n] = 0;
            char *end;
            double y = strtod(buf, &end);
            double bound = 0.5 * pow(10.0, -p) * fmax(1.0, fabs((double)x)) * (1 + 1e-9);
            double err = fabs((double)x - y);
            if (*end || !(err <= bound)) {
                if (!bad) fprintf(stderr, "  p=%d x=%.9g wrote \"%s\" err %g > %g\n", p, (double)x, buf, err, bound);
                bad++;
            }
            if (err / bound > worst) worst = err / bound, worst_x = x;
        }
        CHECK(bad == 0, "precision %d: %d of 200000 values outside the bound (worst %.3g of bound at %.9g)", p, bad,
              worst, (double)worst_x);
    }
}

static void test_structure(void)
{
    jw w;
    jw_init(&w);
    float row[3] = {1.5f, NAN, -0.25f};
    float mat[6] = {1, 2, 3, 4, 5, 6};
    jw_obj(&w);
    jw_key(&w, "s");
    jw_str(&w, "quote\" backslash\\ nl\n tab\t ctl\x01 \xc3\xa9 \xf0\x9f\x98\x80");
    jw_key(&w, "n");
    jw_null(&w);
    jw_key(&w, "i");
    jw_int(&w, -9223372036854775807LL - 1);
    jw_key(&w, "b");
    jw_bool(&w, 1);
    jw_key(&w, "row");
    jw_floats(&w, row, 3, 6);
    jw_key(&w, "mat");
    jw_floats_2d(&w, mat, 2, 2, 3, 6);
    jw_key(&w, "nested");
    jw_arr(&w);
    jw_obj(&w);
    jw_end(&w);
    jw_arr(&w);
    jw_end(&w);
    jw_int(&w, 7);
    jw_end(&w);
    jw_key(&w, "empty");
    jw_floats(&w, row, 0, 6);
    jw_end(&w);
    size_t len;
    char *s = jw_take(&w, &len);
    json_error_t err;
    json_t *root = json_loadb(s, len, 0, &err);
    CHECK(root != NULL, "writer output does not parse: %s in %s", err.text, s);
    if (root) {
        CHECK(!strcmp(json_string_value(json_object_get(root, "s")),
                      "quote\" backslash\\ nl\n tab\t ctl\x01 \xc3\xa9 \xf0\x9f\x98\x80"),
              "string escaping did not round-trip");
        CHECK(json_is_null(json_object_get(root, "n")), "null");
        CHECK(json_integer_value(json_object_get(root, "i")) == -9223372036854775807LL - 1, "int64 min");
        CHECK(json_is_true(json_object_get(root, "b")), "bool");
        json_t *r = json_object_get(root, "row");
        CHECK(json_array_size(r) == 3 && json_is_null(json_array_get(r, 1)) &&
                  json_real_value(json_array_get(r, 0)) == 1.5,
              "float row with NaN -> null");
        json_t *m = json_object_get(root, "mat");
        CHECK(json_array_size(m) == 2 && json_integer_value(json_array_get(json_array_get(m, 1), 1)) == 5,
              "2d rows use the row stride: %s", s);
        CHECK(json_array_size(json_object_get(root, "nested")) == 3, "nested containers");
        CHECK(json_array_size(json_object_get(root, "empty")) == 0, "empty array");
        json_decref(root);
    }
    free(s);
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Independent decoder: returns bytes written, or -1 on a bad character. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    long k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=') break;
        int v = b64_value(s[i]);
        if (v < 0) return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[k++] = (unsigned char)(acc >> bits);
        }
    }
    return k;
}

static void test_base64(void)
{
    /* RFC 4648 section 10 test vectors */
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *want[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char buf[32];
        size_t n = jw_base64(buf, (const unsigned char *)in[i], strlen(in[i]));
        buf[n] = 0;
        CHECK(!strcmp(buf, want[i]), "base64(\"%s\") = \"%s\", want \"%s\"", in[i], buf, want[i]);
    }
    for (size_t n = 0; n < 50; n++) {
        float x[50];
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)rng();
            memcpy(&x[i], &u, 4); /* any bit pattern: NaNs, denormals, -0 */
        }
        jw w;
        jw_init(&w);
        jw_base64_tensor(&w, x, &n, 1);
        size_t len;
        char *s = jw_take(&w, &len);
        json_t *root = json_loadb(s, len, 0, NULL);
        CHECK(root != NULL, "base64 tensor of %zu floats is not JSON: %s", n, s);
        if (!root) {
            free(s);
            continue;
        }
        const char *data = json_string_value(json_object_get(root, "data"));
        unsigned char back[200];
        long k = b64_decode(data, strlen(data), back);
        CHECK(k == (long)(n * 4) && !memcmp(back, x, n * 4), "base64 of %zu floats does not round-trip exactly", n);
        CHECK(!strcmp(json_string_value(json_object_get(root, "dtype")), "float32") &&
                  json_integer_value(json_array_get(json_object_get(root, "shape"), 0)) == (json_int_t)n,
              "dtype/shape of base64 tensor");
        json_decref(root);
        free(s);
    }
}

/* Bytes that are not valid UTF-8 become U+FFFD (EF BF BD); valid sequences,
 * 2 to 4 bytes, pass unchanged. Each output must parse with jansson. */
static void test_invalid_utf8(void)
{
    static const struct {
        const char *in, *want, *what;
    } cases[] = {
        {"caf\xc3\xa9", "caf\xc3\xa9", "2-byte sequence kept"},
        {"\xe2\x82\xac \xf0\x9f\x98\x80", "\xe2\x82\xac \xf0\x9f\x98\x80", "3- and 4-byte sequences kept"},
        {"ab\xc3", "ab\xef\xbf\xbd", "cut after a lead byte"},
        {"\xe2\x82x", "\xef\xbf\xbd\xef\xbf\xbdx", "cut 3-byte sequence: each byte replaced"},
        {"\x80z", "\xef\xbf\xbdz", "lone continuation byte"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd", "overlong '/'"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", "UTF-16 surrogate"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", "above U+10FFFF"},
        {"\xff\"", "\xef\xbf\xbd\"", "0xFF, then an escaped quote"},
    };
    const int n = (int)(sizeof cases / sizeof *cases);
    CHECK(n == 9, "9 UTF-8 cases");
    for (int i = 0; i < n; i++) {
        jw w;
        jw_init(&w);
        jw_arr(&w);
        jw_str(&w, cases[i].in);
        jw_end(&w);
        size_t len;
        char *out = jw_take(&w, &len);
        json_error_t err;
        json_t *v = json_loadb(out, len, 0, &err);
        const char *got = json_string_value(json_array_get(v, 0));
        CHECK(got && !strcmp(got, cases[i].want), "%s: %s", cases[i].what, v ? "wrong text" : err.text);
        json_decref(v);
        free(out);
    }
}

int main(void)
{
    test_format_cases();
    test_float_roundtrip();
    test_format_significant_cases();
    test_float_roundtrip_significant();
    test_structure();
    test_invalid_utf8();
    test_base64();
    return check_done("test_json_writer");
}
