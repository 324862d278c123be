/* gemm.h - the SGEMM behind every linear map and attention product.
 *
 *   y[M][N] = x[M][K] W[K][N] (+ b[N])
 *
 * W is read through a weight layout: "k-major" W[k][n] at w[k*ld + n]
 * (GPT-2 Conv1D, attention's v) or "n-major" W[k][n] at w[n*ld + k]
 * (HF nn.Linear [out][in], attention's k for q k^T). The micro-kernel streams
 * W as panels of LENS_GEMM_NR = 32 columns stored k-major
 * (panel p, row k: W[k][32p .. 32p+31], zero beyond N), so weights are packed
 * into that form once at model load (lens_gemm_pack) and every call only
 * reads them; a W that is not packed is packed panel by panel during the call.
 * BF16/F16 weights are packed at load too, as 16-bit panels
 * (lens_gemm_pack_half), and the AVX-512 and AVX2 kernels widen each panel
 * row in registers as they load it when a task has few rows (<= 24), else
 * each sub-panel [KC][32] is widened once per task into an F32 buffer that
 * all its row tiles read; a half-precision W that is not packed
 * (or under the other kernels) is widened to float32 while its sub-panel
 * [KC][32] is packed during the call. Widening is exact either way, so the
 * product equals the one with W widened beforehand.
 *
 * Kernel, chosen at run time from cpuid (lens_gemm_kernel_in_use): AVX-512
 * (12 rows x 32 columns of zmm accumulators, A broadcast, FMA), else AVX2 +
 * FMA (6 x 16 ymm tiles over the same panels), else OpenBLAS's sgemm (ARM64
 * and every other CPU: its NEON and other kernels, never lensd's portable
 * loop, which stays as the tests' oracle). LENS_GEMM_KERNEL=avx512|avx2|blas|
 * portable in the environment forces one the CPU can run. Blocking: K in
 * blocks of 768 rows, M in blocks of 240 rows, work split over (M block,
 * group of panels) tasks through the pool. A model's linear maps call it
 * through core/nn/linear.h (lens_gemm_linear*). */
#ifndef LENS_GEMM_H
#define LENS_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/dtype.h"
#include "core/base/pool.h"

#define LENS_GEMM_NR 32

/* Floats of a packed K x N matrix (N rounded up to whole panels). */
size_t lens_gemm_packed_size(int K, int N);

/* Storage for `floats` packed weight floats, freed with free(): 2 MiB
 * aligned and advised into transparent huge pages, so the forward, which
 * streams every weight from DRAM once per call, does not also walk the page
 * tables every 4 KiB. NULL when out of memory. */
float *lens_gemm_alloc_packed(size_t floats);

/* packed = W (K x N) in panel layout; w_kn: 1 = W[k][n] at w[k*ld + n],
 * 0 = at w[n*ld + k]. packed must be 64-byte aligned. */
void lens_gemm_pack(float *packed, const float *w, int K, int N, size_t ld, int w_kn);

/* packed = W (K x N) in panel layout with its BF16/F16 elements as they
 * are (lens_gemm_packed_size(K, N) uint16, 64-byte aligned): the kernels
 * widen them as they load each panel row, so a half-precision model keeps
 * half the bytes resident and is packed once, like an F32 one. */
void lens_gemm_pack_half(uint16_t *packed, const void *w, int K, int N, size_t ld, int w_kn);

/* The general product: y[M][N] (row stride ldy) = x[M][K] (row stride ldx) W
 * + bias, or y += x W with accumulate (bias ignored). W is `packed` when not
 * NULL, else alpha * (w, ld, w_kn) with elements of w_dtype (F32 = 0 unless
 * set): alpha scales W while it is packed during the call (attention's
 * 1/sqrt(DK)) and is ignored for prepacked W. bias [N] may be NULL. y must
 * not alias x or W. post, when set, is applied in place to every finished
 * output row segment (y[m][n0 .. n0+n)) while it is still in L1: an
 * elementwise activation fused into the product (BERT's GELU). */
typedef struct {
    int M, N, K;
    const float *x;
    size_t ldx;
    const void *packed; /* prepacked W: panels of w_dtype elements (lens_gemm_pack, lens_gemm_pack_half) */
    const float *packed_t; /* else W^T packed by lens_gemm_pack (N x K), read transposed: a packed
                              map's input gradient, so the backward leaves the released mapped
                              weights alone */
    const void *w;
    lens_dtype w_dtype;
    size_t ld;
    int w_kn;
    float alpha;
    const float *bias;
    float *y;
    size_t ldy;
    int accumulate;
    void (*post)(float *y, size_t n);
} lens_gemm_args;
void lens_gemm(const lens_gemm_args *g, lens_pool *pool);

typedef enum { LENS_GEMM_PORTABLE, LENS_GEMM_BLAS, LENS_GEMM_AVX2, LENS_GEMM_AVX512 } lens_gemm_kernel;

/* The kernel every lens_gemm call uses: the first call chooses it (the best
 * the CPU runs, or LENS_GEMM_KERNEL's when the CPU runs that one). */
lens_gemm_kernel lens_gemm_kernel_in_use(void);
/* "avx512", "avx2", "blas", "portable" (the LENS_GEMM_KERNEL values). */
const char *lens_gemm_kernel_name(lens_gemm_kernel k);
/* 1 when this CPU can run k (blas and portable: always). */
int lens_gemm_kernel_available(lens_gemm_kernel k);
/* Switch kernels (tests, benchmarks): -1, and no change, when k is not
 * available. Not while another thread is in lens_gemm; models loaded under
 * one kernel stay correct under another (only slower). */
int lens_gemm_use_kernel(lens_gemm_kernel k);
/* 1 when the kernel in use reads prepacked panels, so the loader packs F32
 * weights (lens_gemm_pack); 0 for OpenBLAS, which reads W in its own layout. */
int lens_gemm_packs_weights(void);

#endif
