/* gemm_avx2.c - the AVX2 + FMA micro-kernel (Haswell and later, AMD Zen 1-3)
 * and the gather that widens n-major BF16/F16 W while packing it; contract in
 * gemm_kernel.h.
 *
 * Register tile 6 x 16: 12 ymm accumulators, the W row's 16 columns in two
 * ymm, one broadcast of A: 15 of the 16 ymm registers (12 FMAs per 8 loads,
 * so the FMA units, not the loads, bound it). A kernel call's 12 x 32 block
 * is four such tiles, rows outer, so each 6-row strip of A (6 x KC floats,
 * 18 KiB) is read from L1 for both halves of the panel row.
 *
 * Measured against the alternatives on Zen 4 forced to this kernel
 * (x86-64-v3 build, one thread, CPU time, `forward --kernels` runs
 * alternating the builds, OpenBLAS's Haswell sgemm as the yardstick,
 * 2026-11-28, bench/README.md): a 4 x 24 tile (12 accumulators, three W
 * vectors) with the panel's last 8 columns in a 12 x 8 tile reached
 * 0.62-0.90 of sgemm's rate on BERT-base's three products where this one
 * reached 0.94-1.34 (each W vector serves 4 rows instead of 6, and the
 * 12 x 8 tile is load-bound); KC below 768 (384, 256, 192, 128) was slower
 * too (W streams from L2 fast enough; the output tile is reloaded per KC
 * block).
 *
 * The Makefile builds this file with -mno-avx512f: the target attributes
 * below only add instructions to the command line's, so under -march=native
 * on an AVX-512 CPU the compiler could otherwise emit EVEX (AVX-512VL) forms
 * here, and the kernel would fault on the AVX2-only CPUs it is for. */
#include "core/base/gemm_kernel.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 "avx2,fma,f16c"
#define NR LENS_GEMM_NR
#define RA 6 /* rows of one register tile */

/* Lanes j < n set: the columns of a partial 8-column group. */
__attribute__((target(AVX2), always_inline)) static inline __m256i lanes_below(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 elements of a panel row as floats: F32 loaded, BF16 moved to the high
 * half of each lane, F16 converted (both exact). */
__attribute__((target(AVX2), always_inline)) static inline __m256 load8(const void *row, const lens_dtype dt)
{
    if (dt == LENS_DT_F32) return _mm256_load_ps(row);
    const __m128i h = _mm_load_si128(row);
    if (dt == LENS_DT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* c[r][cols] (+)= a[r][kc] b[kc][16] (b's rows a panel row apart, elements
 * of dt), cols <= 16. r and dt are constants at every call site, so the row
 * loops unroll into registers. */
__attribute__((target(AVX2), always_inline)) static inline void tile_avx2(const int r, int kc, const float *a,
                                                                           size_t lda, const void *b,
                                                                           const lens_dtype dt, float *c, size_t ldc,
                                                                           int cols, const float *bias, int init,
                                                                           const char *pf, int pf_lines, float *wide)
{
    const size_t row = NR * lens_dtype_size(dt), step8 = row / 4; /* bytes per panel row, per 8 elements */
    const int full = cols >= 16;
    const __m256i m0 = lanes_below(cols), m1 = lanes_below(cols - 8);
    __m256 c0[RA], c1[RA];
    if (init) {
        const __m256 b0 = !bias ? _mm256_setzero_ps() : full ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, m0);
        const __m256 b1 = !bias ? _mm256_setzero_ps()
                          : full ? _mm256_loadu_ps(bias + 8)
                                 : _mm256_maskload_ps(bias + 8, m1);
        for (int i = 0; i < r; i++) c0[i] = b0, c1[i] = b1;
    } else {
        for (int i = 0; i < r; i++) {
            const float *ci = c + (size_t)i * ldc;
            c0[i] = full ? _mm256_loadu_ps(ci) : _mm256_maskload_ps(ci, m0);
            c1[i] = full ? _mm256_loadu_ps(ci + 8) : _mm256_maskload_ps(ci + 8, m1);
        }
    }
    for (int k = 0; k < kc; k++) {
        if (k < pf_lines) _mm_prefetch(pf + (size_t)k * 64, _MM_HINT_T1);
        const unsigned char *bk = (const unsigned char *)b + (size_t)k * row;
        const __m256 b0 = load8(bk, dt), b1 = load8(bk + step8, dt);
        if (dt != LENS_DT_F32 && wide) {
            _mm256_store_ps(wide + (size_t)k * NR, b0);
            _mm256_store_ps(wide + (size_t)k * NR + 8, b1);
        }
        for (int i = 0; i < r; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + (size_t)i * lda + k);
            c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
        }
    }
    for (int i = 0; i < r; i++) {
        float *ci = c + (size_t)i * ldc;
        if (full) {
            _mm256_storeu_ps(ci, c0[i]);
            _mm256_storeu_ps(ci + 8, c1[i]);
        } else {
            _mm256_maskstore_ps(ci, m0, c0[i]);
            _mm256_maskstore_ps(ci + 8, m1, c1[i]);
        }
    }
}

#define CASE(R, DT) \
    case R: tile_avx2(R, kc, ai, lda, bh, DT, ch, ldc, cols, bias_h, init, pf, lines, wide_h); break;
#define ROWS_AVX2(DT) \
    switch (r) { CASE(6, DT) CASE(5, DT) CASE(4, DT) CASE(3, DT) CASE(2, DT) CASE(1, DT) }

__attribute__((target(AVX2))) void lens_gemm_kernel_avx2(int mr, int kc, const float *a, size_t lda, const void *b,
                                                         lens_dtype bdt, float *c, size_t ldc, int nr,
                                                         const float *bias, int init, const char *pf, int pf_lines,
                                                         float *wide)
{
    for (int i0 = 0; i0 < mr; i0 += RA) {
        const int r = mr - i0 < RA ? mr - i0 : RA;
        for (int h = 0; h < 2 && nr > 16 * h; h++) {
            const int cols = nr - 16 * h, lines = i0 == 0 && h == 0 ? pf_lines : 0; /* prefetch once per call */
            const float *ai = a + (size_t)i0 * lda, *bias_h = bias ? bias + 16 * h : NULL;
            const void *bh = (const unsigned char *)b + (size_t)16 * h * lens_dtype_size(bdt);
            float *ch = c + (size_t)i0 * ldc + 16 * h;
            float *wide_h = wide && i0 == 0 ? wide + 16 * h : NULL; /* the first strip widens each half */
            if (bdt == LENS_DT_BF16) ROWS_AVX2(LENS_DT_BF16)
            else if (bdt == LENS_DT_F16) ROWS_AVX2(LENS_DT_F16)
            else ROWS_AVX2(LENS_DT_F32)
        }
    }
}
#undef CASE

/* As lens_gemm_pack_half_avx512 (which see), 8 columns per gather: each lane
 * loads elements k-1 and k of its W row and keeps the high half, so no load
 * reaches past the row; a row's element 0 is read with lens_widen. */
__attribute__((target(AVX2))) void lens_gemm_pack_half_avx2(float *dst, const void *w, lens_dtype dt, size_t ld,
                                                            int k0, int kc, int n0, int nr, float scale)
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)ld));
    const __m256 s = _mm256_set1_ps(scale);
    for (int q = 0; q < NR / 8; q++) {
        const int cols = nr - 8 * q;
        const __m256i m = lanes_below(cols);
        const unsigned char *row0 = lens_dtype_at(w, dt, (size_t)(n0 + 8 * q) * ld + k0);
        for (int k = 0; k < kc; k++) {
            __m256 v;
            if (cols <= 0) {
                v = _mm256_setzero_ps();
            } else if (k0 + k == 0) {
                float first[8] = {0};
                for (int j = 0; j < cols && j < 8; j++) lens_widen(&first[j], row0 + (size_t)j * ld * 2, dt, 1);
                v = _mm256_loadu_ps(first);
            } else {
                const __m256i g = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(row0 + (size_t)k * 2 - 2),
                                                              idx, m, 2);
                if (dt == LENS_DT_BF16) {
                    v = _mm256_castsi256_ps(_mm256_and_si256(g, _mm256_set1_epi32((int)0xffff0000u)));
                } else {
                    /* the 8 high halves as 8 uint16 (packus keeps 128-bit lanes: 64-bit words 0 and 2) */
                    const __m256i h = _mm256_srli_epi32(g, 16), p = _mm256_packus_epi32(h, h);
                    v = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
                }
            }
            _mm256_store_ps(dst + (size_t)k * NR + 8 * q, _mm256_mul_ps(v, s));
        }
    }
}
#endif
