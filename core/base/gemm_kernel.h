/* gemm_kernel.h - the micro-kernels behind lens_gemm (gemm.c), one file per
 * instruction set so each is compiled for its own target only:
 * gemm_avx512.c, gemm_avx2.c (built with -mno-avx512f, see the Makefile, so
 * a -march=native build on an AVX-512 CPU still gives an AVX2 kernel that
 * runs on AVX2-only CPUs). Internal to core/base/gemm*.c.
 *
 * Kernel contract: c[mr][nr] (row stride ldc) = (init ? bias or 0 : c) +
 * a[mr][kc] (row stride lda) b[kc][32], mr <= LENS_GEMM_MR, nr <= 32, b a
 * 64-byte aligned sub-panel of W (gemm.h's panel layout, zero past nr) with
 * elements of bdt: F32, or BF16/F16 (a model's half-precision weights packed
 * at load as they are), widened exactly in registers as each row is loaded,
 * so the product is bitwise the one with b widened beforehand (the portable
 * kernel takes F32 only). Columns of c past nr are neither read nor written;
 * bias [nr] may be NULL.
 * wide: NULL, or (half-precision b only) a 64-byte aligned [kc][32] where the
 * kernel also stores the rows it widened, so the row tiles after it read F32
 * (gemm.c gemm_task).
 * pf[0 .. pf_lines * 64): 64-byte lines of the next W sub-panel to pull into
 * L2 while this tile computes (prepacked W comes from DRAM or L3 once per
 * panel; without prefetch the first row block of each panel stalls on it). */
#ifndef LENS_GEMM_KERNEL_H
#define LENS_GEMM_KERNEL_H

#include <stddef.h>

#include "core/base/gemm.h"

#define LENS_GEMM_MR 12 /* rows per kernel call: AVX-512 12 x 32 (24 of 32 zmm), AVX2 2 x (6 x 16) */

typedef void lens_gemm_kernel_fn(int mr, int kc, const float *a, size_t lda, const void *b, lens_dtype bdt, float *c,
                                 size_t ldc, int nr, const float *bias, int init, const char *pf, int pf_lines,
                                 float *wide);

/* dst[kc][32] = scale * W[k0 + k][n0 + j] for n-major BF16/F16 W (w[n*ld + k]),
 * zero for j >= nr: gathers, a dst row at a time (3x faster than the scalar
 * scatter). Needs ld * 15 < 2^30 (32-bit gather offsets). */
typedef void lens_gemm_pack_half_fn(float *dst, const void *w, lens_dtype dt, size_t ld, int k0, int kc, int n0, int nr,
                                    float scale);

#if defined(__x86_64__)
lens_gemm_kernel_fn lens_gemm_kernel_avx512, lens_gemm_kernel_avx2;
lens_gemm_pack_half_fn lens_gemm_pack_half_avx512, lens_gemm_pack_half_avx2;
#endif

#endif
