/* dtype.c - dtype names and the exact F16 / BF16 <-> float32 conversions
 * (core/base/dtype.h). */
#include "core/base/dtype.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dtype.c reads 16-bit elements as little-endian; big-endian hosts need a byte-swapping path"
#endif

const char *lens_dtype_name(lens_dtype dt)
{
    switch (dt) {
    case LENS_DT_F32: return "F32";
    case LENS_DT_F16: return "F16";
    case LENS_DT_BF16: return "BF16";
    }
    return "?";
}

int lens_dtype_parse(const char *name, lens_dtype *dt)
{
    if (!strcasecmp(name, "f32") || !strcasecmp(name, "float32")) *dt = LENS_DT_F32;
    else if (!strcasecmp(name, "bf16") || !strcasecmp(name, "bfloat16")) *dt = LENS_DT_BF16;
    else if (!strcasecmp(name, "f16") || !strcasecmp(name, "float16")) *dt = LENS_DT_F16;
    else return -1;
    return 0;
}

/* IEEE binary16 -> binary32, exact for every input: normals rebias the
 * exponent (15 -> 127), subnormals (exp 0) are renormalised since they are
 * normal in binary32, inf keeps a zero mantissa and NaN keeps its payload
 * shifted into the top mantissa bits (so stays NaN, quiet bit preserved). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        /* value = mant * 2^-24; shift until the implicit bit (0x400) is set,
         * lowering the exponent from that of 2^-14 once per shift. */
        uint32_t e = 127 - 15 + 1;
        while (!(mant & 0x400)) { mant <<= 1; e--; }
        bits = sign | (e << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* bfloat16 is the top half of a binary32, so widening is exact. */
static float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* memcpy, not byte arithmetic: one (vectorisable) load on little-endian hosts */
static uint16_t load_u16(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

void lens_widen(float *dst, const void *src, lens_dtype dt, size_t n)
{
    const unsigned char *b = src;
    if (dt == LENS_DT_F32) memcpy(dst, b, n * 4);
    else if (dt == LENS_DT_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(load_u16(b + 2 * i));
    else
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(load_u16(b + 2 * i));
}

void lens_widen_add(float *dst, const void *src, lens_dtype dt, size_t n)
{
    const unsigned char *b = src;
    if (dt == LENS_DT_F32)
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, b + 4 * i, 4);
            dst[i] += f;
        }
    else if (dt == LENS_DT_BF16)
        for (size_t i = 0; i < n; i++) dst[i] += bf16_to_f32(load_u16(b + 2 * i));
    else
        for (size_t i = 0; i < n; i++) dst[i] += f16_to_f32(load_u16(b + 2 * i));
}

/* binary32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* binary32 -> binary16, round to nearest even: overflow to inf (|x| >=
 * 65520), subnormals below 2^-14, zero below 2^-25 (2^-25 itself ties to 0). */
static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    uint32_t h, rem, half;
    if (a < 0x38800000u) {
        if (a <= 0x33000000u) return (uint16_t)sign;
        /* value = m 2^(e-150) = (m >> (126 - e)) 2^-24, the subnormal unit */
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
        h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    } else {
        const uint32_t r = a - (112u << 23); /* exponent bias 127 -> 15 */
        h = r >> 13, rem = r & 0x1fffu, half = 0x1000u;
    }
    if (rem > half || (rem == half && (h & 1))) h++; /* a carry into the exponent is still right */
    return (uint16_t)(sign | h);
}

void lens_narrow(void *dst, const float *src, lens_dtype dt, size_t n)
{
    unsigned char *b = dst;
    if (dt == LENS_DT_F32) {
        memcpy(b, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const uint16_t h = dt == LENS_DT_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
        b[2 * i] = (unsigned char)h, b[2 * i + 1] = (unsigned char)(h >> 8);
    }
}
