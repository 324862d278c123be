/* test_safetensors.c - core/io/safetensors.c: write/read round trips, a matrix of
 * corrupt files (each must fail with the right code and a message naming the
 * problem, never crash), F16/BF16 widening checked bit for bit, sharded
 * checkpoints, and the shared trained checkpoints when ../shared exists.
 *
 * Comparisons are exact (bitwise): every path here copies or widens floats,
 * none rounds, so any difference is a bug. */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/io/safetensors.h"
#include "tests/check.h"

static char tmpdir[64];

static const char *tpath(const char *name)
{
    static char buf[4][256];
    static int slot;
    char *p = buf[slot++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    if (n && fwrite(data, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

/* u64 LE header length (hlen, or strlen(json) when hlen is 0) + json + data */
static void write_st_raw(const char *path, const char *json, uint64_t hlen, const void *data, size_t n)
{
    size_t jl = strlen(json);
    if (!hlen) hlen = jl;
    unsigned char *buf = malloc(8 + jl + n + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, json, jl);
    if (n) memcpy(buf + 8 + jl, data, n);
    write_bytes(path, buf, 8 + jl + n);
    free(buf);
}

static int bits_equal(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Open must fail with code and a message containing every given fragment. */
static void expect_open_fail(const char *what, const char *path, lens_status code, const char *frag1, const char *frag2)
{
    lens_safetensors st;
    lens_err err = {0};
    int rc = lens_st_open(path, &st, &err);
    CHECK(rc == -1, "%s: lens_st_open succeeded", what);
    if (rc == 0) { lens_st_close(&st); return; }
    CHECK(err.code == code, "%s: code %s, want %s (%s)", what, lens_status_name(err.code), lens_status_name(code), err.msg);
    CHECK(strstr(err.msg, path) != NULL, "%s: message does not name the file: %s", what, err.msg);
    CHECK(!frag1 || strstr(err.msg, frag1), "%s: message lacks \"%s\": %s", what, frag1, err.msg);
    CHECK(!frag2 || strstr(err.msg, frag2), "%s: message lacks \"%s\": %s", what, frag2, err.msg);
    CHECK(st.map == NULL && st.tensors == NULL && st.n_tensors == 0, "%s: struct not cleared on failure", what);
}

/* A header JSON with 8 data bytes of zeros for [begin,end] tests. */
static void corrupt_case(const char *what, const char *json, size_t data_len, const char *frag1, const char *frag2)
{
    static const unsigned char zeros[64];
    const char *p = tpath("corrupt.safetensors");
    write_st_raw(p, json, 0, zeros, data_len);
    expect_open_fail(what, p, LENS_EFORMAT, frag1, frag2);
}

/* --------------------------------------------------------------- tests */

static void test_roundtrip(void)
{
    float a[6] = {1.5f, -2.25f, 3e-38f, INFINITY, -0.0f, 1e30f};
    float b[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    float scalar = 42.0f;
    lens_st_out out[] = {
        {.name = "layer.weight", .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "layer.bias", .ndim = 1, .shape = {4}, .data = b},
        {.name = "scale", .ndim = 0, .data = &scalar},
        {.name = "empty", .ndim = 2, .shape = {0, 3}, .data = NULL},
    };
    lens_err err = {0};
    const char *p = tpath("model.safetensors");
    CHECK(lens_st_write(p, out, 4, &err) == 0, "write: %s", err.msg);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK(access(tmp, F_OK) != 0, "write left %s behind", tmp);

    /* Header padded to a multiple of 8 with spaces; data follows in order. */
    FILE *f = fopen(p, "rb");
    unsigned char raw[4096];
    size_t n = fread(raw, 1, sizeof raw, f);
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
    CHECK(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
    CHECK(n == 8 + hlen + sizeof a + sizeof b + sizeof scalar, "file size %zu", n);
    CHECK(raw[8] == '{', "header starts with %c", raw[8]);
    CHECK(memcmp(raw + 8 + hlen, a, sizeof a) == 0, "first tensor not at data start");
    CHECK(memcmp(raw + 8 + hlen + sizeof a, b, sizeof b) == 0, "second tensor not after first");

    lens_safetensors st;
    CHECK(lens_st_open(p, &st, &err) == 0, "open: %s", err.msg);
    CHECK(st.n_tensors == 4, "n_tensors %d", st.n_tensors);
    const lens_st_tensor *t = lens_st_find(&st, "layer.weight");
    CHECK(t && t->dtype == LENS_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->nbytes == 24,
          "layer.weight metadata");
    CHECK(t && bits_equal(t->data, a, 6), "layer.weight values");
    t = lens_st_find(&st, "scale");
    CHECK(t && t->ndim == 0 && t->nbytes == 4 && *(const float *)t->data == 42.0f, "scalar");
    t = lens_st_find(&st, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->nbytes == 0, "empty tensor");
    CHECK(lens_st_find(&st, "nope") == NULL, "find of absent name");
    lens_st_close(&st);

    /* Through lens_weights: F32 is served from the mapping (zero-copy). */
    lens_weights *w = lens_weights_open(tmpdir, &err);
    CHECK(w != NULL, "weights_open: %s", err.msg);
    if (!w) return;
    CHECK(lens_weights_bytes(w) == sizeof a + sizeof b + sizeof scalar, "bytes %zu", lens_weights_bytes(w));
    const float *pa = lens_weights_get(w, "layer.weight", 2, (int64_t[]){2, 3}, &err);
    CHECK(pa && bits_equal(pa, a, 6), "get layer.weight: %s", pa ? "values differ" : err.msg);
    const float *pb = lens_weights_get(w, "layer.bias", 1, (int64_t[]){4}, &err);
    CHECK(pb && bits_equal(pb, b, 4), "get layer.bias");
    CHECK(lens_weights_get(w, "scale", 0, NULL, &err) != NULL, "get scalar: %s", err.msg);
    CHECK(lens_weights_bytes(w) == sizeof a + sizeof b + sizeof scalar, "zero-copy: bytes grew to %zu",
          lens_weights_bytes(w));
    CHECK(lens_weights_has(w, "layer.bias") && !lens_weights_has(w, "layer.bia"), "has");

    err = (lens_err){0};
    CHECK(lens_weights_get(w, "bert.pooler.dense.weight", 2, (int64_t[]){2, 3}, &err) == NULL, "missing name");
    CHECK(err.code == LENS_ENOENT && strstr(err.msg, "'bert.pooler.dense.weight'"), "missing name error: %s %s",
          lens_status_name(err.code), err.msg);
    err = (lens_err){0};
    CHECK(lens_weights_get(w, "layer.weight", 2, (int64_t[]){3, 2}, &err) == NULL, "wrong shape accepted");
    CHECK(err.code == LENS_EFORMAT && strstr(err.msg, "'layer.weight' has shape [2, 3], expected [3, 2]") &&
              strstr(err.msg, "model.safetensors"),
          "wrong shape error: %s %s", lens_status_name(err.code), err.msg);
    err = (lens_err){0};
    CHECK(lens_weights_get(w, "layer.bias", 2, (int64_t[]){4, 1}, &err) == NULL && err.code == LENS_EFORMAT &&
              strstr(err.msg, "[4], expected [4, 1]"),
          "wrong ndim error: %s", err.msg);
    lens_weights_close(w);
    unlink(p);

    /* Writer input errors. */
    err = (lens_err){0};
    lens_st_out dup[] = {{.name = "x", .ndim = 1, .shape = {1}, .data = b}, {.name = "x", .ndim = 1, .shape = {1}, .data = b}};
    CHECK(lens_st_write(tpath("dup.safetensors"), dup, 2, &err) == -1 && err.code == LENS_EINVAL, "duplicate write: %s",
          err.msg);
    CHECK(access(tpath("dup.safetensors"), F_OK) != 0, "failed write created the file");
    err = (lens_err){0};
    CHECK(lens_st_write("/nonexistent-dir-lensd/x.safetensors", out, 1, &err) == -1 &&
              (err.code == LENS_ENOENT || err.code == LENS_EIO),
          "write into missing dir: %s", err.msg);
}

static void test_corrupt(void)
{
    unsigned char buf[64] = {0};
    const char *p = tpath("corrupt.safetensors");

    expect_open_fail("missing file", tpath("absent.safetensors"), LENS_ENOENT, "absent.safetensors", NULL);
    write_bytes(p, buf, 0);
    expect_open_fail("empty file", p, LENS_EFORMAT, "empty", NULL);
    write_bytes(p, buf, 5);
    expect_open_fail("5-byte file", p, LENS_EFORMAT, "shorter than the 8-byte", NULL);
    write_st_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 200, NULL, 0);
    expect_open_fail("header cut", p, LENS_EFORMAT, "header length 200 runs past", NULL);
    write_st_raw(p, "{}", 1000000, NULL, 0);
    expect_open_fail("header length past EOF", p, LENS_EFORMAT, "runs past the end", NULL);
    write_st_raw(p, "{}", 1ULL << 63, NULL, 0);
    expect_open_fail("header length 2^63", p, LENS_EFORMAT, "9223372036854775808", "limit");
    write_st_raw(p, "{}", UINT64_MAX, NULL, 0);
    expect_open_fail("header length 2^64-1", p, LENS_EFORMAT, "limit", NULL);
    write_st_raw(p, "{}", 1, NULL, 0);
    expect_open_fail("header length 1", p, LENS_EFORMAT, "too small", NULL);
    write_st_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, buf, 8);
    expect_open_fail("data cut", p, LENS_EFORMAT, "'a'", "past the data section");

    corrupt_case("not JSON", "{abc", 0, "not valid JSON", NULL);
    corrupt_case("binary header", "\x01\x02\xff\xfe", 0, "not valid JSON", NULL);
    corrupt_case("trailing garbage", "{} x", 0, "not valid JSON", NULL);
    corrupt_case("JSON array", "[1, 2]", 0, "not a JSON object", NULL);
    corrupt_case("JSON string", "\"abc\"", 0, "not a JSON object", NULL);
    corrupt_case("entry not object", "{\"w\": 5}", 0, "'w'", "not a JSON object");
    corrupt_case("missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "missing \"dtype\"");
    corrupt_case("missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "'w'", "missing \"shape\"");
    corrupt_case("missing offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'w'", "missing \"data_offsets\"");
    corrupt_case("dtype not string", "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'",
                 "not a string");
    corrupt_case("unknown dtype", "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'",
                 "unknown dtype");
    const char *unsupported[] = {"F64", "I64", "U8", "BOOL", "I32", "F8_E4M3"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        char json[200], frag[64];
        snprintf(json, sizeof json, "{\"emb.%s\":{\"dtype\":\"%s\",\"shape\":[1],\"data_offsets\":[0,8]}}",
                 unsupported[i], unsupported[i]);
        snprintf(frag, sizeof frag, "unsupported dtype %s", unsupported[i]);
        corrupt_case(unsupported[i], json, 8, frag, "'emb.");
    }
    corrupt_case("shape not array", "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, "'w'",
                 "not an array");
    corrupt_case("negative dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8, "'w'",
                 "shape[1]");
    corrupt_case("float dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "'w'",
                 "shape[0]");
    corrupt_case("9 dims", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                 "'w'", "9 dimensions");
    corrupt_case("shape overflow",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4, "'w'",
                 "overflows");
    corrupt_case("bytes overflow", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}",
                 4, "'w'", "overflows");
    corrupt_case("offsets out of range", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 12, "'w'",
                 "past the data section");
    corrupt_case("offset huge", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775800,9223372036854775807]}}",
                 8, "'w'", "past the data section");
    corrupt_case("begin > end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "'w'",
                 "begin 8 > end 4");
    corrupt_case("negative offset", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, "'w'",
                 "data_offsets");
    corrupt_case("3 offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "'w'",
                 "data_offsets");
    corrupt_case("overlap",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 16, "'b'", "overlaps tensor 'a'");
    corrupt_case("contained overlap",
                 "{\"big\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                 "\"in\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]},"
                 "\"after\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}",
                 20, "'in'", "overlaps tensor 'big'");
    corrupt_case("shape/bytes mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "'w'",
                 "needs 12 bytes but data_offsets span 8");
    corrupt_case("F16 bytes mismatch", "{\"w\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,12]}}", 12, "'w'",
                 "needs 6 bytes");
    corrupt_case("duplicate names",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, "twice", "\"w\"");
    corrupt_case("metadata not object", "{\"__metadata__\": 3}", 0, "__metadata__", NULL);
    corrupt_case("metadata value not string", "{\"__metadata__\": {\"format\": 1}}", 0, "__metadata__", "'format'");

    /* Valid edge cases that must be accepted. */
    lens_safetensors st;
    lens_err err = {0};
    write_st_raw(p, "{}", 0, NULL, 0);
    CHECK(lens_st_open(p, &st, &err) == 0 && st.n_tensors == 0, "empty header {}: %s", err.msg);
    lens_st_close(&st);
    write_st_raw(p,
                 "{\"__metadata__\":{\"format\":\"pt\"},\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                 "\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}   ",
                 0, buf, 8);
    CHECK(lens_st_open(p, &st, &err) == 0 && st.n_tensors == 2, "metadata + empty tensor + trailing data: %s", err.msg);
    lens_st_close(&st);
    lens_st_close(&st); /* closing twice is harmless */

    /* A directory is not a checkpoint file. */
    expect_open_fail("directory", tmpdir, LENS_EIO, "regular file", NULL);
    unlink(p);
}

/* F32 at an offset that is not 4-aligned: valid file, served by copy. */
static void test_misaligned(void)
{
    const char *dir = tpath("misaligned");
    mkdir(dir, 0700);
    char p[300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    /* Header padded (with JSON whitespace) so the data section is 4-aligned
     * in the file; the F32 tensor then starts 1 byte in. */
    char json[256] = "{\"pad\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[1,13]}}";
    while ((8 + strlen(json)) % 4) strcat(json, " ");
    float want[3] = {1.0f, -3.5f, 1e-40f};
    unsigned char data[13] = {0xAA};
    memcpy(data + 1, want, sizeof want);
    write_st_raw(p, json, 0, data, sizeof data);
    size_t file_off = 8 + strlen(json) + 1;

    lens_err err = {0};
    lens_safetensors st;
    CHECK(lens_st_open(p, &st, &err) == 0, "misaligned open: %s", err.msg);
    const lens_st_tensor *t = lens_st_find(&st, "w");
    CHECK(t && ((uintptr_t)t->data % 4) == file_off % 4 && file_off % 4 != 0, "test file is not misaligned (%zu)",
          file_off);
    lens_st_close(&st);

    lens_weights *w = lens_weights_open(dir, &err);
    CHECK(w != NULL, "misaligned weights_open: %s", err.msg);
    if (!w) return;
    CHECK(lens_weights_bytes(w) == 0, "misaligned F32 counted as mapped: %zu", lens_weights_bytes(w));
    const float *got = lens_weights_get(w, "w", 1, (int64_t[]){3}, &err);
    CHECK(got && ((uintptr_t)got % 4) == 0, "misaligned get: %s", err.msg);
    CHECK(got && bits_equal(got, want, 3), "misaligned values differ");
    CHECK(lens_weights_get(w, "w", 1, (int64_t[]){3}, &err) == got, "second get must reuse the copy");
    CHECK(lens_weights_bytes(w) == 12, "bytes after copy %zu", lens_weights_bytes(w));
    lens_weights_close(w);
    unlink(p);
    rmdir(dir);
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Hand-made F16 and BF16 bytes with known float32 bit patterns. */
static void test_half(void)
{
    static const struct { uint16_t h; uint32_t f; const char *what; } f16[] = {
        {0x0000, 0x00000000, "+0"},
        {0x8000, 0x80000000, "-0"},
        {0x3C00, 0x3F800000, "1"},
        {0xC000, 0xC0000000, "-2"},
        {0x3555, 0x3EAAA000, "0.333251953125"},
        {0x7BFF, 0x477FE000, "65504 (max)"},
        {0x0400, 0x38800000, "2^-14 (min normal)"},
        {0x0001, 0x33800000, "2^-24 (min subnormal)"},
        {0x8001, 0xB3800000, "-2^-24"},
        {0x03FF, 0x387FC000, "1023*2^-24 (max subnormal)"},
        {0x0200, 0x38000000, "2^-15 (subnormal)"},
        {0x7C00, 0x7F800000, "+inf"},
        {0xFC00, 0xFF800000, "-inf"},
        {0x7E00, 0x7FC00000, "qNaN"},
        {0xFE01, 0xFFC02000, "-NaN with payload"},
        {0x7C01, 0x7F802000, "sNaN"},
    };
    static const struct { uint16_t h; uint32_t f; } bf16[] = {
        {0x0000, 0x00000000}, {0x8000, 0x80000000}, {0x3F80, 0x3F800000}, {0xC000, 0xC0000000},
        {0x4049, 0x40490000}, {0x0001, 0x00010000}, {0x7F7F, 0x7F7F0000}, {0x7F80, 0x7F800000},
        {0xFF80, 0xFF800000}, {0x7FC0, 0x7FC00000},
    };
    enum { N16 = sizeof f16 / sizeof *f16, NB = sizeof bf16 / sizeof *bf16, NALL = 65536 };
    /* data: f16 known [N16] | bf16 known [NB] | every f16 bit pattern [65536] */
    size_t nbytes = 2 * (N16 + NB + NALL);
    unsigned char *data = malloc(nbytes);
    size_t k = 0;
    for (int i = 0; i < N16; i++) { data[k++] = f16[i].h & 0xff; data[k++] = f16[i].h >> 8; }
    for (int i = 0; i < NB; i++) { data[k++] = bf16[i].h & 0xff; data[k++] = bf16[i].h >> 8; }
    for (uint32_t h = 0; h < NALL; h++) { data[k++] = h & 0xff; data[k++] = (unsigned char)(h >> 8); }
    char json[512];
    snprintf(json, sizeof json,
             "{\"h\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[0,%d]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[%d,%d]},"
             "\"all\":{\"dtype\":\"F16\",\"shape\":[256,256],\"data_offsets\":[%d,%d]}}",
             N16, 2 * N16, NB, 2 * N16, 2 * (N16 + NB), 2 * (N16 + NB), 2 * (N16 + NB + NALL));
    const char *dir = tpath("half");
    mkdir(dir, 0700);
    char p[300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_st_raw(p, json, 0, data, nbytes);
    free(data);

    lens_err err = {0};
    lens_weights *w = lens_weights_open(dir, &err);
    CHECK(w != NULL, "half weights_open: %s", err.msg);
    if (!w) return;
    /* half tensors are served from the mapping in their dtype: counted once */
    CHECK(lens_weights_bytes(w) == nbytes, "mapped half bytes %zu, want %zu", lens_weights_bytes(w), nbytes);
    lens_dtype dt = LENS_DT_F32;
    const void *raw = lens_weights_get_raw(w, "b", 1, (int64_t[]){NB}, &dt, &err);
    CHECK(raw && dt == LENS_DT_BF16 && lens_weights_bytes(w) == nbytes, "get_raw BF16: served from the mapping, "
          "dtype %s, bytes %zu (%s)", lens_dtype_name(dt), lens_weights_bytes(w), raw ? "" : err.msg);
    for (int i = 0; raw && i < NB; i++) {
        float x;
        lens_widen(&x, lens_dtype_at(raw, dt, (size_t)i), dt, 1);
        CHECK(to_bits(x) == bf16[i].f, "raw BF16 %d widened: 0x%08x, want 0x%08x", i, to_bits(x), bf16[i].f);
    }
    const float *h = lens_weights_get(w, "h", 1, (int64_t[]){N16}, &err);
    CHECK(h != NULL, "get F16: %s", err.msg);
    for (int i = 0; h && i < N16; i++)
        CHECK(to_bits(h[i]) == f16[i].f, "F16 %s (0x%04x): got 0x%08x, want 0x%08x", f16[i].what, f16[i].h,
              to_bits(h[i]), f16[i].f);
    CHECK(h && isnan(h[13]) && isinf(h[11]) && signbit(h[1]) && h[7] == ldexpf(1.0f, -24), "F16 classes");
    const float *b = lens_weights_get(w, "b", 1, (int64_t[]){NB}, &err);
    CHECK(b != NULL, "get BF16: %s", err.msg);
    for (int i = 0; b && i < NB; i++)
        CHECK(to_bits(b[i]) == bf16[i].f, "BF16 0x%04x: got 0x%08x, want 0x%08x", bf16[i].h, to_bits(b[i]), bf16[i].f);
    CHECK(b && b[4] == 3.140625f && b[5] == from_bits(0x00010000), "BF16 values");
    CHECK(lens_weights_bytes(w) == nbytes + 4 * (N16 + NB), "bytes after conversion %zu", lens_weights_bytes(w));

    /* Every binary16 pattern against the compiler's own conversion. */
    const float *all = lens_weights_get(w, "all", 2, (int64_t[]){256, 256}, &err);
    CHECK(all != NULL, "get all F16: %s", err.msg);
#ifdef __FLT16_MAX__
    if (all) {
        int bad = 0;
        for (uint32_t i = 0; i < NALL; i++) {
            uint16_t hb = (uint16_t)i;
            _Float16 x;
            memcpy(&x, &hb, 2);
            float want = (float)x;
            /* NaN payload conversion is not pinned down by C; compare class. */
            int ok = isnan(want) ? isnan(all[i]) && signbit(all[i]) == signbit(want) : to_bits(all[i]) == to_bits(want);
            if (!ok && bad++ < 5)
                fprintf(stderr, "F16 0x%04x: got 0x%08x, want 0x%08x\n", i, to_bits(all[i]), to_bits(want));
        }
        CHECK(bad == 0, "%d of 65536 F16 patterns converted wrongly", bad);
    }
#else
    SKIP("compiler has no _Float16; exhaustive F16 check not run");
#endif
    lens_weights_close(w);
    unlink(p);
    rmdir(dir);
}

/* lens_narrow, the writer's rounding, against exact identities: every F16
 * and BF16 pattern survives widen -> narrow (NaN stays NaN), and floats
 * between two neighbours round to the nearer one, ties to the even one;
 * against the compiler's _Float16 on a sweep of floats when it has one. */
static void test_narrow(void)
{
    int bad16 = 0, badb = 0, checked = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = (uint16_t)i;
        for (int d = 0; d < 2; d++) {
            const lens_dtype dt = d ? LENS_DT_BF16 : LENS_DT_F16;
            float x;
            uint16_t back;
            lens_widen(&x, &h, dt, 1);
            lens_narrow(&back, &x, dt, 1);
            float y;
            lens_widen(&y, &back, dt, 1);
            const int ok = isnan(x) ? isnan(y) : back == h;
            *(d ? &badb : &bad16) += !ok;
            checked++;
        }
    }
    CHECK(checked == 2 * 65536 && bad16 == 0 && badb == 0, "round trip: %d F16, %d BF16 of 65536 patterns changed",
          bad16, badb);
    /* ties: 1 + 2^-8 lies halfway between BF16 1 and 1 + 2^-7 -> even (1);
     * 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 -> even (1 + 2^-6) */
    const float ties[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, 65520.0f, 65519.0f, 0x1p-25f,
                          0x1.000002p-25f, 0x1.8p-24f};
    uint16_t b[8], h[8];
    lens_narrow(b, ties, LENS_DT_BF16, 3);
    CHECK(b[0] == 0x3F80 && b[1] == 0x3F82 && b[2] == 0x3F81, "BF16 ties to even: %04x %04x %04x", b[0], b[1], b[2]);
    lens_narrow(h, ties + 3, LENS_DT_F16, 5);
    CHECK(h[0] == 0x7C00 && h[1] == 0x7BFF && h[2] == 0 && h[3] == 1 && h[4] == 2,
          "F16 overflow / subnormal rounding: %04x %04x %04x %04x %04x", h[0], h[1], h[2], h[3], h[4]);
#ifdef __FLT16_MAX__
    int bad = 0, n = 0;
    for (uint32_t bits = 0; bits < 0x7f800000u; bits += 0x1235, n++) {
        const float x = from_bits(bits);
        const _Float16 want = (_Float16)x;
        uint16_t wb, got;
        memcpy(&wb, &want, 2);
        lens_narrow(&got, &x, LENS_DT_F16, 1);
        if (got != wb && bad++ < 5) fprintf(stderr, "narrow F16 0x%08x: got %04x, want %04x\n", bits, got, wb);
    }
    CHECK(n > 400000 && bad == 0, "%d of %d floats narrowed to F16 unlike _Float16", bad, n);
#else
    SKIP("compiler has no _Float16; F16 narrowing sweep not run");
#endif
}

/* lens_st_write in BF16/F16: the file says so, its bytes are the rounded
 * values, and chunked lens_st_writer_put gives the same file. */
static void test_write_dtypes(void)
{
    enum { N = 3000 };
    float *v = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) v[i] = sinf((float)i) * (float)(1 + i % 50);
    const lens_dtype dts[] = {LENS_DT_F32, LENS_DT_BF16, LENS_DT_F16};
    for (int d = 0; d < 3; d++) {
        const lens_st_out t[2] = {{.name = "a", .ndim = 2, .shape = {30, 50}, .data = v, .dtype = dts[d]},
                                  {.name = "b", .ndim = 1, .shape = {1500}, .data = v + 1500, .dtype = dts[d]}};
        char p[300], q[300];
        snprintf(p, sizeof p, "%s/w%d.safetensors", tmpdir, d);
        snprintf(q, sizeof q, "%s/c%d.safetensors", tmpdir, d);
        lens_err err = {0};
        CHECK(lens_st_write(p, t, 2, &err) == 0, "write %s: %s", lens_dtype_name(dts[d]), err.msg);
        lens_st_writer *w = lens_st_writer_open(q, t, 2, &err);
        int rc = !w;
        for (int i = 0; w && !rc && i < N; i += 7) rc = lens_st_writer_put(w, v + i, N - i < 7 ? N - i : 7, &err);
        rc |= w && !rc ? lens_st_writer_finish(w, &err) : (lens_st_writer_abort(w), -1);
        CHECK(rc == 0, "chunked write %s: %s", lens_dtype_name(dts[d]), err.msg);
        lens_safetensors st, sc;
        if (lens_st_open(p, &st, &err)) {
            CHECK(0, "reopen: %s", err.msg);
            continue;
        }
        CHECK(lens_st_open(q, &sc, &err) == 0 && st.map_len == sc.map_len && !memcmp(st.map, sc.map, st.map_len),
              "%s: chunked file differs from the whole-tensor one", lens_dtype_name(dts[d]));
        const lens_st_tensor *a = lens_st_find(&st, "a"), *b = lens_st_find(&st, "b");
        CHECK(a && b && a->dtype == dts[d] && b->dtype == dts[d] && a->nbytes == 1500 * lens_dtype_size(dts[d]),
              "dtype %s written", lens_dtype_name(dts[d]));
        int bad = 0;
        for (int i = 0; a && b && i < N; i++) {
            uint16_t want16 = 0;
            float got, want = v[i];
            if (dts[d] != LENS_DT_F32) lens_narrow(&want16, &v[i], dts[d], 1), lens_widen(&want, &want16, dts[d], 1);
            lens_widen(&got, lens_dtype_at(i < 1500 ? a->data : b->data, dts[d], (size_t)(i % 1500)), dts[d], 1);
            bad += to_bits(got) != to_bits(want);
        }
        CHECK(bad == 0, "%s: %d of %d values differ from the rounded input", lens_dtype_name(dts[d]), bad, N);
        lens_st_close(&st), lens_st_close(&sc);
        unlink(p), unlink(q);
    }
    /* too much / too little data is refused */
    const lens_st_out one = {.name = "x", .ndim = 1, .shape = {4}, .dtype = LENS_DT_BF16};
    char p[300];
    snprintf(p, sizeof p, "%s/short.safetensors", tmpdir);
    lens_err err = {0};
    lens_st_writer *w = lens_st_writer_open(p, &one, 1, &err);
    CHECK(w && lens_st_writer_put(w, v, 5, &err) != 0 && strstr(err.msg, "more data"), "overlong put refused: %s",
          err.msg);
    if (w) lens_st_writer_abort(w);
    w = lens_st_writer_open(p, &one, 1, &err);
    CHECK(w && lens_st_writer_put(w, v, 3, &err) == 0 && lens_st_writer_finish(w, &err) != 0 &&
              strstr(err.msg, "less data") && access(p, F_OK) != 0,
          "short tensor refused, no file left: %s", err.msg);
    free(v);
}

static void write_text(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

static void expect_weights_fail(const char *what, const char *dir, lens_status code, const char *frag1,
                                const char *frag2)
{
    lens_err err = {0};
    lens_weights *w = lens_weights_open(dir, &err);
    CHECK(w == NULL, "%s: open succeeded", what);
    if (w) { lens_weights_close(w); return; }
    CHECK(err.code == code, "%s: code %s, want %s (%s)", what, lens_status_name(err.code), lens_status_name(code), err.msg);
    CHECK(!frag1 || strstr(err.msg, frag1), "%s: message lacks \"%s\": %s", what, frag1, err.msg);
    CHECK(!frag2 || strstr(err.msg, frag2), "%s: message lacks \"%s\": %s", what, frag2, err.msg);
}

static void test_sharded(void)
{
    char dir[128], p1[256], p2[256], ip[256];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    mkdir(dir, 0700);
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);

    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, c[3] = {7, 8, 9};
    lens_st_out s1[] = {{.name = "a", .ndim = 2, .shape = {2, 2}, .data = a}, {.name = "b", .ndim = 1, .shape = {2}, .data = b}};
    lens_st_out s2[] = {{.name = "c", .ndim = 1, .shape = {3}, .data = c}};
    lens_err err = {0};
    CHECK(lens_st_write(p1, s1, 2, &err) == 0, "write shard 1: %s", err.msg);
    CHECK(lens_st_write(p2, s2, 1, &err) == 0, "write shard 2: %s", err.msg);

    expect_weights_fail("empty folder", dir, LENS_ENOENT, "no model.safetensors", NULL);

    write_text(ip, "{\"metadata\":{\"total_size\":36},\"weight_map\":{"
                   "\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\","
                   "\"c\":\"model-00002-of-00002.safetensors\"}}");
    lens_weights *w = lens_weights_open(dir, &err);
    CHECK(w != NULL, "sharded open: %s", err.msg);
    if (w) {
        const float *ga = lens_weights_get(w, "a", 2, (int64_t[]){2, 2}, &err);
        const float *gb = lens_weights_get(w, "b", 1, (int64_t[]){2}, &err);
        const float *gc = lens_weights_get(w, "c", 1, (int64_t[]){3}, &err);
        CHECK(ga && bits_equal(ga, a, 4) && gb && bits_equal(gb, b, 2) && gc && bits_equal(gc, c, 3),
              "sharded values: %s", err.msg);
        CHECK(lens_weights_bytes(w) == sizeof a + sizeof b + sizeof c, "sharded bytes %zu", lens_weights_bytes(w));
        err = (lens_err){0};
        CHECK(!lens_weights_get(w, "d", 1, (int64_t[]){1}, &err) && err.code == LENS_ENOENT && strstr(err.msg, "'d'"),
              "sharded missing: %s", err.msg);
        err = (lens_err){0};
        CHECK(!lens_weights_get(w, "c", 1, (int64_t[]){4}, &err) && err.code == LENS_EFORMAT &&
                  strstr(err.msg, "model-00002-of-00002.safetensors: tensor 'c' has shape [3], expected [4]"),
              "sharded shape error names the shard: %s", err.msg);
        lens_weights_close(w);
    }

    write_text(ip, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00003-of-00003.safetensors\"}}");
    expect_weights_fail("missing shard", dir, LENS_ENOENT, "model-00003-of-00003.safetensors", NULL);
    write_text(ip, "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    expect_weights_fail("../ shard", dir, LENS_EFORMAT, "'a'", "../x.safetensors");
    write_text(ip, "{\"weight_map\":{\"a\":\"..\"}}");
    expect_weights_fail(".. shard", dir, LENS_EFORMAT, "not a plain file name", NULL);
    write_text(ip, "{\"weight_map\":{\"a\":\"/etc/passwd\"}}");
    expect_weights_fail("absolute shard", dir, LENS_EFORMAT, "/etc/passwd", NULL);
    write_text(ip, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",");
    expect_weights_fail("malformed index", dir, LENS_EFORMAT, "model.safetensors.index.json", "not valid JSON");
    write_text(ip, "[]");
    expect_weights_fail("index not object", dir, LENS_EFORMAT, "weight_map", NULL);
    write_text(ip, "{\"weight_map\":{\"a\":7}}");
    expect_weights_fail("shard not string", dir, LENS_EFORMAT, "'a'", NULL);
    write_text(ip, "{\"weight_map\":{}}");
    expect_weights_fail("empty weight_map", dir, LENS_EFORMAT, "no tensors", NULL);
    write_text(ip, "{\"weight_map\":{\"c\":\"model-00001-of-00002.safetensors\",\"a\":\"model-00001-of-00002.safetensors\"}}");
    expect_weights_fail("stale index", dir, LENS_EFORMAT, "'c'", "does not contain");

    /* The same name in two shards. */
    lens_st_out s2dup[] = {{.name = "b", .ndim = 1, .shape = {2}, .data = b}};
    CHECK(lens_st_write(p2, s2dup, 1, &err) == 0, "rewrite shard 2: %s", err.msg);
    write_text(ip, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}");
    expect_weights_fail("tensor in two shards", dir, LENS_EFORMAT, "'b'", "both");

    /* A corrupt shard's error surfaces with the shard's path. */
    write_bytes(p2, "\x02\0\0\0\0\0\0\0{", 9);
    expect_weights_fail("corrupt shard", dir, LENS_EFORMAT, "model-00002-of-00002.safetensors", "runs past");

    unlink(p1);
    unlink(p2);
    unlink(ip);
    rmdir(dir);
}

static void test_shared_models(void)
{
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared not found (set LENS_SHARED); trained checkpoints not checked");
        return;
    }
    static const struct { const char *name; int n_tensors; } models[] = {
        {"bert-tiny-sst2", 41}, {"bert-tiny-mlm", 42}, {"gpt2-tiny-wikitext", 28},
    };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char dir[512], path[600];
        snprintf(dir, sizeof dir, "%s/models/%s", shared, models[i].name);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, R_OK) != 0) {
            SKIP("%s missing", path);
            continue;
        }
        lens_safetensors st;
        lens_err err = {0};
        CHECK(lens_st_open(path, &st, &err) == 0, "%s: %s", path, err.msg);
        CHECK(st.n_tensors == models[i].n_tensors, "%s: %d tensors, golden.json says %d", path, st.n_tensors,
              models[i].n_tensors);
        size_t total = 0;
        for (int t = 0; t < st.n_tensors; t++) total += st.tensors[t].nbytes;
        lens_st_close(&st);
        lens_weights *w = lens_weights_open(dir, &err);
        CHECK(w != NULL, "%s: %s", dir, err.msg);
        if (w) {
            CHECK(lens_weights_bytes(w) == total, "%s: weights bytes %zu, tensors hold %zu", dir,
                  lens_weights_bytes(w), total);
            lens_weights_close(w);
        }
    }
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lensd-st-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_roundtrip();
    test_corrupt();
    test_misaligned();
    test_half();
    test_narrow();
    test_write_dtypes();
    test_sharded();
    test_shared_models();
    rmdir(tmpdir);
    return check_done("test_safetensors");
}
