/* gemm_avx512.c - the AVX-512 micro-kernel (12 x 32 register tile: 24 zmm
 * accumulators, W rows as two zmm, A broadcast, FMA) and the gather that
 * widens n-major BF16/F16 W while packing it; contract in gemm_kernel.h.
 * Compiled for every x86-64 target with per-function target attributes and
 * called only when cpuid reports AVX-512 F/BW/DQ/VL (gemm.c). */
#include "core/base/gemm_kernel.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 "avx512f,avx512bw,avx512dq,avx512vl"

/* 16 elements of a panel row as floats: F32 loaded, BF16 moved to the high
 * half of each lane, F16 converted (both exact). */
__attribute__((target(AVX512), always_inline)) static inline __m512 load16(const void *row, const lens_dtype dt)
{
    if (dt == LENS_DT_F32) return _mm512_load_ps(row);
    const __m256i h = _mm256_load_si256(row);
    if (dt == LENS_DT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* One mr x 32 register tile; mr and dt are constants at every call site, so
 * the row loops unroll and the accumulators live in registers. */
__attribute__((target(AVX512), always_inline)) static inline void tile_avx512(const int mr, int kc, const float *a,
                                                                               size_t lda, const void *b,
                                                                               const lens_dtype dt, float *c,
                                                                               size_t ldc, int nr, const float *bias,
                                                                               int init, const char *pf, int pf_lines,
                                                                               float *wide)
{
    const size_t row = LENS_GEMM_NR * lens_dtype_size(dt); /* bytes per panel row */
    const __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    __m512 c0[LENS_GEMM_MR], c1[LENS_GEMM_MR];
    if (init) {
        const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
        const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
        for (int i = 0; i < mr; i++) c0[i] = b0, c1[i] = b1;
    } else {
        for (int i = 0; i < mr; i++) {
            c0[i] = _mm512_maskz_loadu_ps(m0, c + (size_t)i * ldc);
            c1[i] = _mm512_maskz_loadu_ps(m1, c + (size_t)i * ldc + 16);
        }
    }
    for (int k = 0; k < kc; k++) {
        if (k < pf_lines) _mm_prefetch(pf + (size_t)k * 64, _MM_HINT_T1);
        const unsigned char *bk = (const unsigned char *)b + (size_t)k * row;
        const __m512 b0 = load16(bk, dt), b1 = load16(bk + row / 2, dt);
        if (dt != LENS_DT_F32 && wide) {
            _mm512_store_ps(wide + (size_t)k * LENS_GEMM_NR, b0);
            _mm512_store_ps(wide + (size_t)k * LENS_GEMM_NR + 16, b1);
        }
        for (int i = 0; i < mr; i++) {
            const __m512 ai = _mm512_set1_ps(a[(size_t)i * lda + k]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm512_mask_storeu_ps(c + (size_t)i * ldc, m0, c0[i]);
        _mm512_mask_storeu_ps(c + (size_t)i * ldc + 16, m1, c1[i]);
    }
}

/* pack_panel's n-major BF16/F16 case: dst row k = W[n0 .. n0+15][k0 + k]
 * (and the next 16 columns), one masked 32-bit gather per 16 columns of a
 * row. Each lane loads elements k-1 and k of its W row and keeps the high
 * half (element k), so no load reaches past the row; the first element of a
 * row (k0 + k == 0), which has no element before it, is read with
 * lens_widen. BF16 widens by position, F16 by vcvtph2ps: both exact, as the
 * scalar path. */
__attribute__((target(AVX512))) void lens_gemm_pack_half_avx512(float *dst, const void *w, lens_dtype dt,
                                                                    size_t ld, int k0, int kc, int n0, int nr,
                                                                    float scale)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)ld));
    const __m512 s = _mm512_set1_ps(scale);
    for (int half = 0; half < 2; half++) {
        const int cols = nr - 16 * half;
        const __mmask16 m = cols >= 16 ? 0xffff : cols <= 0 ? 0 : (__mmask16)((1u << cols) - 1);
        const unsigned char *row0 = lens_dtype_at(w, dt, (size_t)(n0 + 16 * half) * ld + k0);
        for (int k = 0; k < kc; k++) {
            __m512 v;
            if (k0 + k == 0) {
                float first[16] = {0};
                for (int j = 0; j < cols && j < 16; j++) lens_widen(&first[j], row0 + (size_t)j * ld * 2, dt, 1);
                v = _mm512_loadu_ps(first);
            } else {
                const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, row0 + (size_t)k * 2 - 2, 2);
                v = dt == LENS_DT_BF16 ? _mm512_castsi512_ps(_mm512_and_si512(g, _mm512_set1_epi32((int)0xffff0000u)))
                                       : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
            }
            _mm512_store_ps(dst + (size_t)k * LENS_GEMM_NR + 16 * half, _mm512_mul_ps(v, s));
        }
    }
}

/* mr rows of one B dtype: every (mr, dt) pair is its own unrolled tile. */
#define ROWS_AVX512(DT)                                                                                            \
    switch (mr) {                                                                                                  \
        CASE(12, DT) CASE(11, DT) CASE(10, DT) CASE(9, DT) CASE(8, DT) CASE(7, DT) CASE(6, DT) CASE(5, DT)         \
        CASE(4, DT) CASE(3, DT) CASE(2, DT) CASE(1, DT)                                                            \
    }
#define CASE(R, DT) \
    case R: tile_avx512(R, kc, a, lda, b, DT, c, ldc, nr, bias, init, pf, pf_lines, wide); break;

__attribute__((target(AVX512))) void lens_gemm_kernel_avx512(int mr, int kc, const float *a, size_t lda, const void *b,
                                                             lens_dtype bdt, float *c, size_t ldc, int nr,
                                                             const float *bias, int init, const char *pf, int pf_lines,
                                                             float *wide)
{
    if (bdt == LENS_DT_BF16) ROWS_AVX512(LENS_DT_BF16)
    else if (bdt == LENS_DT_F16) ROWS_AVX512(LENS_DT_F16)
    else ROWS_AVX512(LENS_DT_F32)
}
#undef CASE
#endif
