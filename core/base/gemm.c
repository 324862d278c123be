/* gemm.c - packed-weight SGEMM (see gemm.h for the layout): packing, the
 * choice of kernel, the portable kernel, the OpenBLAS path and the loop nest.
 *
 * Loop nest of one task (rows m0..m1 of x, panels p0..p1 of W):
 *   for k0 in K step KC          A block x[m0..m1][k0..k0+KC] stays in L2
 *     for panel p                W sub-panel [KC][32] (96 KiB) streams from L2
 *       for m in m0..m1 step MR  register tile y[m..m+MR][32p..32p+32]
 *         acc = k0 == 0 && !accumulate ? bias : y;  acc += x[m][k] W[k][.] over k;  y = acc
 * Bias is the accumulator's initial value, so no separate bias pass exists.
 * The micro-kernels themselves are in gemm_avx512.c and gemm_avx2.c. */
#include "core/base/gemm.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/base/gemm_kernel.h"

#define NR LENS_GEMM_NR
#define MR LENS_GEMM_MR
#ifndef KC
/* 768 = 1 KC, 3072 = 4 KC. 384 (the W sub-panel in L1) measured 2-5% slower
 * on BERT-base at one thread (CPU ms, interleaved: T=128 112.7/105.1/100.3
 * vs 107.2/99.9/103.4, T=512 472/476/483 vs 461/468/468, 8 x 32 tokens
 * 217/217/211 vs 206/207/205): each output tile is reloaded per KC block,
 * and L2 streams the sub-panel fast enough. */
#define KC 768
#endif
#define MC 240 /* rows per task: MC x KC floats = 720 KiB of L2 */
/* Padding of a row stride that is a multiple of 1024 floats (see padded). */
#define PAD 16
/* Prepacked BF16/F16 W is widened by the kernel as it loads each panel row,
 * exactly, and the first row tile of a task stores the widened rows for the
 * task's other row tiles, which read them as F32: no separate widening pass
 * (3.3% of the Llama-1B BF16 forward's samples at T = 128, perf; the first
 * tile's stores cost about as much) and no widening repeated per row tile
 * (5% more kernel cycles on BERT-base BF16 at T = 512). Bitwise the product
 * with W widened beforehand. */
#define BLAS_NC 256 /* columns per OpenBLAS task: fixed, so the pool never changes the arithmetic */

size_t lens_gemm_packed_size(int K, int N)
{
    return (size_t)K * (size_t)((N + NR - 1) / NR) * NR;
}

static lens_gemm_pack_half_fn *pack_half_fn(void);

/* dst[kc][32] = scale * W[k0 + k][n0 + j], zero for j >= nr. F32 W is read
 * as floats; BF16/F16 W (weights resident in their file dtype) is widened
 * here, exactly, a row or column at a time (n-major with the AVX-512 or AVX2
 * kernel: gathered, a dst row at a time, 3x faster than the scalar scatter). */
static void pack_panel(float *dst, const void *w, lens_dtype dt, size_t ld, int w_kn, int k0, int kc, int n0, int nr,
                       float scale)
{
    if (dt == LENS_DT_F32) {
        const float *wf = w;
        if (w_kn) {
            for (int k = 0; k < kc; k++) {
                const float *src = wf + (size_t)(k0 + k) * ld + n0;
                float *d = dst + (size_t)k * NR;
                for (int j = 0; j < nr; j++) d[j] = scale * src[j];
                for (int j = nr; j < NR; j++) d[j] = 0.0f;
            }
        } else {
            for (int j = 0; j < nr; j++) {
                const float *src = wf + (size_t)(n0 + j) * ld + k0;
                for (int k = 0; k < kc; k++) dst[(size_t)k * NR + j] = scale * src[k];
            }
            for (int k = 0; nr < NR && k < kc; k++) memset(dst + (size_t)k * NR + nr, 0, sizeof(float) * (NR - nr));
        }
        return;
    }
    if (w_kn) {
        for (int k = 0; k < kc; k++) {
            float *d = dst + (size_t)k * NR;
            lens_widen(d, lens_dtype_at(w, dt, (size_t)(k0 + k) * ld + n0), dt, (size_t)nr);
            for (int j = 0; j < nr; j++) d[j] *= scale;
            for (int j = nr; j < NR; j++) d[j] = 0.0f;
        }
    } else {
        lens_gemm_pack_half_fn *gather = pack_half_fn();
        if (gather && ld * 15 < (size_t)1 << 30) {
            gather(dst, w, dt, ld, k0, kc, n0, nr, scale);
            return;
        }
        float col[KC]; /* one W row [out][in]: kc contiguous elements */
        for (int j = 0; j < nr; j++) {
            lens_widen(col, lens_dtype_at(w, dt, (size_t)(n0 + j) * ld + k0), dt, (size_t)kc);
            for (int k = 0; k < kc; k++) dst[(size_t)k * NR + j] = scale * col[k];
        }
        for (int k = 0; nr < NR && k < kc; k++) memset(dst + (size_t)k * NR + nr, 0, sizeof(float) * (NR - nr));
    }
}

/* Measured on BERT-base T = 128 at one thread: 4-7% less CPU time per
 * forward (340 MB of weights, 83 k pages of 4 KiB otherwise). Below one huge
 * page the plain 64-byte alignment is kept (tiny models, tests). */
float *lens_gemm_alloc_packed(size_t floats)
{
    const size_t huge = (size_t)2 << 20, bytes = floats * sizeof(float);
    if (bytes < huge) return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    const size_t rounded = (bytes + huge - 1) & ~(huge - 1);
    float *p = aligned_alloc(huge, rounded);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, rounded, MADV_HUGEPAGE); /* advice only: 4 KiB pages still work */
#endif
    return p;
}

/* pack_panel's source when W is the transpose of a prepacked matrix: W[k][n]
 * = Wt[n][k] with Wt (N x K) in lens_gemm_pack's panels, so rows k0 .. k0+31
 * of W are panel k0 / 32 of Wt, and its row n holds W[k0 .. k0+31][n]
 * contiguously: 32 x 32 transposes. k0 is a multiple of KC, hence of 32;
 * Wt's zero padding beyond its N is never read (k < K). */
static void pack_panel_transposed(float *dst, const float *wt, int N, int k0, int kc, int n0, int nr)
{
    for (int q = k0; q < k0 + kc; q += NR) {
        const int rows = k0 + kc - q < NR ? k0 + kc - q : NR;
        const float *src = wt + (size_t)(q / NR) * N * NR + (size_t)n0 * NR;
        float *d = dst + (size_t)(q - k0) * NR;
        for (int j = 0; j < nr; j++)
            for (int r = 0; r < rows; r++) d[(size_t)r * NR + j] = src[(size_t)j * NR + r];
        for (int r = 0; nr < NR && r < rows; r++) memset(d + (size_t)r * NR + nr, 0, sizeof(float) * (NR - nr));
    }
}

/* The half-precision panels: dst[p][k][32] = W[k][32p + j] as stored (the
 * same 16 bits), zero past N. */
void lens_gemm_pack_half(uint16_t *packed, const void *w, int K, int N, size_t ld, int w_kn)
{
    const uint16_t *src = w; /* BF16 and F16 alike: bits are moved, not converted */
    for (int p = 0; p * NR < N; p++) {
        const int nr = N - p * NR < NR ? N - p * NR : NR;
        uint16_t *panel = packed + (size_t)p * K * NR;
        for (int k = 0; k < K; k++) {
            uint16_t *d = panel + (size_t)k * NR;
            for (int j = 0; j < NR; j++)
                d[j] = j >= nr ? 0 : w_kn ? src[(size_t)k * ld + p * NR + j] : src[(size_t)(p * NR + j) * ld + k];
        }
    }
}

void lens_gemm_pack(float *packed, const float *w, int K, int N, size_t ld, int w_kn)
{
    for (int p = 0; p * NR < N; p++) {
        const int nr = N - p * NR < NR ? N - p * NR : NR;
        pack_panel(packed + (size_t)p * K * NR, w, LENS_DT_F32, ld, w_kn, 0, K, p * NR, nr, 1.0f);
    }
}

/* ------------------------------------------------------------ kernels */

/* Portable: 4-row strips, the 32-wide inner loop left to the vectoriser.
 * F32 panels only (sub_panel widens half-precision ones for it). */
static void kernel_c(int mr, int kc, const float *a, size_t lda, const void *bv, lens_dtype bdt, float *c, size_t ldc,
                     int nr, const float *bias, int init, const char *pf, int pf_lines, float *wide)
{
    (void)bdt, (void)pf, (void)pf_lines, (void)wide;
    const float *b = bv;
    for (int i0 = 0; i0 < mr; i0 += 4) {
        const int rows = mr - i0 < 4 ? mr - i0 : 4;
        float acc[4][NR];
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < NR; j++)
                acc[i][j] = j >= nr ? 0.0f : init ? (bias ? bias[j] : 0.0f) : c[(size_t)(i0 + i) * ldc + j];
        for (int k = 0; k < kc; k++) {
            const float *bk = b + (size_t)k * NR;
            for (int i = 0; i < rows; i++) {
                const float av = a[(size_t)(i0 + i) * lda + k];
                for (int j = 0; j < NR; j++) acc[i][j] += av * bk[j];
            }
        }
        for (int i = 0; i < rows; i++) memcpy(c + (size_t)(i0 + i) * ldc, acc[i], sizeof(float) * nr);
    }
}


/* ------------------------------------------------------------ choice of kernel */

static const char *const kernel_names[] = {
    [LENS_GEMM_PORTABLE] = "portable", [LENS_GEMM_BLAS] = "blas", [LENS_GEMM_AVX2] = "avx2", [LENS_GEMM_AVX512] = "avx512"};

const char *lens_gemm_kernel_name(lens_gemm_kernel k)
{
    return k >= LENS_GEMM_PORTABLE && k <= LENS_GEMM_AVX512 ? kernel_names[k] : "unknown";
}

int lens_gemm_kernel_available(lens_gemm_kernel k)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (k == LENS_GEMM_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (k == LENS_GEMM_AVX2) /* with F16C (F16 panels), which every CPU with AVX2 has */
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return k == LENS_GEMM_PORTABLE || k == LENS_GEMM_BLAS;
}

/* The fastest kernel this CPU runs, or the one LENS_GEMM_KERNEL names when
 * the CPU runs it (a warning on stderr otherwise: never an instruction the
 * CPU lacks). */
static lens_gemm_kernel choose_kernel(void)
{
    const lens_gemm_kernel best = lens_gemm_kernel_available(LENS_GEMM_AVX512) ? LENS_GEMM_AVX512
                                  : lens_gemm_kernel_available(LENS_GEMM_AVX2) ? LENS_GEMM_AVX2
                                                                               : LENS_GEMM_BLAS;
    const char *want = getenv("LENS_GEMM_KERNEL");
    if (!want || !*want) return best;
    for (int k = LENS_GEMM_PORTABLE; k <= LENS_GEMM_AVX512; k++) {
        if (strcmp(want, kernel_names[k])) continue;
        if (lens_gemm_kernel_available((lens_gemm_kernel)k)) return (lens_gemm_kernel)k;
        fprintf(stderr, "lensd: warning: LENS_GEMM_KERNEL=%s: this CPU cannot run it; using %s\n", want,
                kernel_names[best]);
        return best;
    }
    fprintf(stderr, "lensd: warning: LENS_GEMM_KERNEL=%s is not avx512, avx2, blas or portable; using %s\n", want,
            kernel_names[best]);
    return best;
}

static atomic_int kernel_in_use = -1; /* lens_gemm_kernel once chosen */

lens_gemm_kernel lens_gemm_kernel_in_use(void)
{
    int k = atomic_load_explicit(&kernel_in_use, memory_order_relaxed);
    if (k < 0) {
        int unset = -1;
        atomic_compare_exchange_strong(&kernel_in_use, &unset, (int)choose_kernel());
        k = atomic_load(&kernel_in_use);
    }
    return (lens_gemm_kernel)k;
}

int lens_gemm_use_kernel(lens_gemm_kernel k)
{
    if (!lens_gemm_kernel_available(k)) return -1;
    atomic_store(&kernel_in_use, (int)k);
    return 0;
}

int lens_gemm_packs_weights(void)
{
    return lens_gemm_kernel_in_use() != LENS_GEMM_BLAS;
}

/* The micro-kernel of the kernel in use (NULL for the OpenBLAS path). */
static lens_gemm_kernel_fn *micro_kernel(lens_gemm_kernel k)
{
    switch (k) {
#if defined(__x86_64__)
    case LENS_GEMM_AVX512: return lens_gemm_kernel_avx512;
    case LENS_GEMM_AVX2: return lens_gemm_kernel_avx2;
#endif
    case LENS_GEMM_PORTABLE: return kernel_c;
    default: return NULL;
    }
}

/* The gather that widens n-major BF16/F16 W for the kernel in use, or NULL
 * (the scalar loop): the instruction set goes with the kernel, so forcing
 * avx2 on an AVX-512 CPU runs what an AVX2 CPU runs. */
static lens_gemm_pack_half_fn *pack_half_fn(void)
{
    switch (lens_gemm_kernel_in_use()) {
#if defined(__x86_64__)
    case LENS_GEMM_AVX512: return lens_gemm_pack_half_avx512;
    case LENS_GEMM_AVX2: return lens_gemm_pack_half_avx2;
#endif
    default: return NULL;
    }
}

/* ------------------------------------------------------------ driver */

typedef struct {
    const lens_gemm_args *g;
    lens_gemm_kernel_fn *kernel;
    int half_loads; /* the kernel widens BF16/F16 panels itself */
    int n_panels, panels_per_task, n_panel_groups; /* OpenBLAS path: n_panel_groups column blocks of BLAS_NC */
} gemm_job;

/* Where sub-panel (p, k0) of prepacked W starts: elements of w_dtype. */
static const void *packed_at(const lens_gemm_args *g, int p, int k0)
{
    return lens_dtype_at(g->packed, g->w_dtype, (size_t)p * g->K * NR + (size_t)k0 * NR);
}

/* W's sub-panel [kc][32] at rows k0.. of panel p, *dt its elements: in place
 * when prepacked (F32, or BF16/F16 for a kernel with half_loads), else
 * packed into buf as F32 (from W^T's panels or from w, widened and scaled,
 * or the half-precision panel widened). */
static const void *sub_panel(const lens_gemm_args *g, int p, int k0, int kc, float *buf, int half_loads,
                             lens_dtype *dt)
{
    const int n0 = p * NR, nr = g->N - n0 < NR ? g->N - n0 : NR;
    *dt = LENS_DT_F32;
    if (g->packed && (g->w_dtype == LENS_DT_F32 || half_loads)) {
        *dt = g->w_dtype;
        return packed_at(g, p, k0);
    }
    if (g->packed) lens_widen(buf, packed_at(g, p, k0), g->w_dtype, (size_t)kc * NR);
    else if (g->packed_t) pack_panel_transposed(buf, g->packed_t, g->N, k0, kc, n0, nr);
    else pack_panel(buf, g->w, g->w_dtype, g->ld, g->w_kn, k0, kc, n0, nr, g->alpha);
    return buf;
}

static void gemm_task(void *ctx, int task)
{
    const gemm_job *j = ctx;
    const lens_gemm_args *g = j->g;
    const int m0 = task / j->n_panel_groups * MC, m1 = m0 + MC < g->M ? m0 + MC : g->M;
    const int p0 = task % j->n_panel_groups * j->panels_per_task;
    const int p1 = p0 + j->panels_per_task < j->n_panels ? p0 + j->panels_per_task : j->n_panels;
    _Alignas(64) float panel[KC * NR]; /* W panel packed during the call when not prepacked, or widened */
    for (int k0 = 0; k0 < g->K; k0 += KC) {
        const int kc = g->K - k0 < KC ? g->K - k0 : KC;
        for (int p = p0; p < p1; p++) {
            const int n0 = p * NR, nr = g->N - n0 < NR ? g->N - n0 : NR;
            lens_dtype bdt;
            const void *b = sub_panel(g, p, k0, kc, panel, j->half_loads, &bdt);
            const char *next = NULL;
            /* 64-byte lines of the next sub-panel, spread over the row blocks: 2 (F32) or 1 per row */
            const int lines_per_row = (int)lens_dtype_size(g->w_dtype) / 2;
            int next_lines = 0;
            if (g->packed) {
                if (p + 1 < p1) next = packed_at(g, p + 1, k0), next_lines = lines_per_row * kc;
                else if (k0 + KC < g->K) {
                    next = packed_at(g, p0, k0 + KC);
                    next_lines = lines_per_row * (g->K - k0 - KC < KC ? g->K - k0 - KC : KC);
                }
            }
            const int n_blocks = (m1 - m0 + MR - 1) / MR, per_block = (next_lines + n_blocks - 1) / n_blocks;
            for (int m = m0, i = 0; m < m1; m += MR, i++) {
                const int pf_first = i * per_block < next_lines ? i * per_block : next_lines;
                const int pf_lines = next_lines - pf_first < per_block ? next_lines - pf_first : per_block;
                const int mr = m1 - m < MR ? m1 - m : MR;
                float *y = g->y + (size_t)m * g->ldy + n0;
                /* half-precision b: the first tile widens it into panel, the others read that */
                const int widened = bdt != LENS_DT_F32 && m > m0;
                j->kernel(mr, kc, g->x + (size_t)m * g->ldx + k0, g->ldx, widened ? panel : b,
                          widened ? LENS_DT_F32 : bdt, y, g->ldy, nr, g->bias ? g->bias + n0 : NULL,
                          k0 == 0 && !g->accumulate, next ? next + (size_t)pf_first * 64 : NULL, pf_lines,
                          bdt != LENS_DT_F32 && m == m0 && m + MR < m1 ? panel : NULL);
                for (int i = 0; g->post && k0 + kc == g->K && i < mr; i++) g->post(y + (size_t)i * g->ldy, (size_t)nr);
            }
        }
    }
}

/* The OpenBLAS path (CPUs without a lensd kernel, LENS_GEMM_KERNEL=blas):
 * rows m0..m1, columns n0..n1 of y by cblas_sgemm, single-threaded in this
 * task (lensd's threads come from the pool). F32 W is read in its own layout
 * in one call (the loader leaves weights unpacked for this path), BF16/F16 W
 * widened first into a copy of the task's columns in the same layout (so a
 * BF16 model gives bitwise the F32 one's results here too); prepacked W and
 * W^T's panels (or no memory for the copy) one 32-column sub-panel at a
 * time, packed as for the kernels. y starts as the bias (or 0) unless
 * accumulating. */

/* W's columns n0 .. n0+nc widened to float32: [K][nc] (w_kn) or [nc][K];
 * NULL when out of memory. */
static float *widen_columns(const lens_gemm_args *g, int n0, int nc)
{
    const int rows = g->w_kn ? g->K : nc, cols = g->w_kn ? nc : g->K;
    float *wide = malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    for (int r = 0; wide && r < rows; r++) {
        const size_t at = g->w_kn ? (size_t)r * g->ld + (size_t)n0 : (size_t)(n0 + r) * g->ld;
        lens_widen(wide + (size_t)r * cols, lens_dtype_at(g->w, g->w_dtype, at), g->w_dtype, (size_t)cols);
    }
    return wide;
}

static void blas_task(void *ctx, int task)
{
    const gemm_job *j = ctx;
    const lens_gemm_args *g = j->g;
    const int m0 = task / j->n_panel_groups * MC, m1 = m0 + MC < g->M ? m0 + MC : g->M;
    const int n0 = task % j->n_panel_groups * BLAS_NC, n1 = n0 + BLAS_NC < g->N ? n0 + BLAS_NC : g->N;
    const float *x = g->x + (size_t)m0 * g->ldx;
    float *y = g->y + (size_t)m0 * g->ldy;
    for (int m = 0; !g->accumulate && m < m1 - m0; m++) {
        if (g->bias) memcpy(y + (size_t)m * g->ldy + n0, g->bias + n0, sizeof(float) * (size_t)(n1 - n0));
        else memset(y + (size_t)m * g->ldy + n0, 0, sizeof(float) * (size_t)(n1 - n0));
    }
    float *wide = !g->packed && !g->packed_t && g->w_dtype != LENS_DT_F32 ? widen_columns(g, n0, n1 - n0) : NULL;
    if (wide) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, g->w_kn ? CblasNoTrans : CblasTrans, m1 - m0, n1 - n0, g->K, g->alpha,
                    x, (int)g->ldx, wide, g->w_kn ? n1 - n0 : g->K, 1.0f, y + n0, (int)g->ldy);
        free(wide);
    } else if (!g->packed && !g->packed_t && g->w_dtype == LENS_DT_F32) {
        const float *w = g->w;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, g->w_kn ? CblasNoTrans : CblasTrans, m1 - m0, n1 - n0, g->K, g->alpha,
                    x, (int)g->ldx, g->w_kn ? w + n0 : w + (size_t)n0 * g->ld, (int)g->ld, 1.0f, y + n0, (int)g->ldy);
    } else {
        _Alignas(64) float panel[KC * NR];
        for (int k0 = 0; k0 < g->K; k0 += KC) {
            const int kc = g->K - k0 < KC ? g->K - k0 : KC;
            for (int p = n0 / NR; p * NR < n1; p++) {
                const int nr = g->N - p * NR < NR ? g->N - p * NR : NR;
                lens_dtype dt;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m1 - m0, nr, kc, 1.0f, x + k0, (int)g->ldx,
                            sub_panel(g, p, k0, kc, panel, 0, &dt), NR, 1.0f, y + (size_t)p * NR, (int)g->ldy);
            }
        }
    }
    for (int m = 0; g->post && m < m1 - m0; m++) g->post(y + (size_t)m * g->ldy + n0, (size_t)(n1 - n0));
}

/* Rows a multiple of 1024 floats (4 KiB) apart put the rows of a register
 * tile in the same L1 sets.
 * - x: the 12 rows the micro-kernel broadcasts from. Measured with forward
 *   --gemm at M = 128, one thread (AMD EPYC Zen 4, avx512): K = 3072, N = 768
 *   75 GFLOP/s against 110 with rows 16 floats further apart; K = N = 2048
 *   (q, k, v, o and the MLP's first maps of C = 2048 models) 69 against 95.
 * - y: an output tile's 12 rows, whose stores (and reloads at every KC block
 *   of K) evict each other: N = 3072 with K = 384 and K = 768 10-20% slower.
 * Such a product (the hidden states, heads and MLP rows of C = 1024, 2048
 * models) reads a copy of x and computes into a copy of y with rows PAD (or
 * 2 PAD) floats longer, copied out: bitwise the same y, for one pass over
 * each, which the 2K flops per element pay for from K = 256 on (attention's
 * scores, K = DK, stay in place). The pool makes each copy once per product
 * (a copy of x per task, one task per column group, copied a 1 MB x eight
 * times at two threads). 0 when not needed (or out of memory: then computed
 * in place, only slower). */
typedef struct {
    const float *src;
    float *dst;
    size_t ld_src, ld_dst, cols;
    int rows, n_tasks;
} copy_job;

static void copy_task(void *ctx, int task)
{
    const copy_job *c = ctx;
    const int r0 = (int)((long long)c->rows * task / c->n_tasks);
    const int r1 = (int)((long long)c->rows * (task + 1) / c->n_tasks);
    for (int r = r0; r < r1; r++)
        memcpy(c->dst + (size_t)r * c->ld_dst, c->src + (size_t)r * c->ld_src, sizeof(float) * c->cols);
}

static void copy_rows(float *dst, size_t ld_dst, const float *src, size_t ld_src, int rows, size_t cols,
                      lens_pool *pool)
{
    copy_job c = {.src = src, .dst = dst, .ld_src = ld_src, .ld_dst = ld_dst, .cols = cols, .rows = rows};
    c.n_tasks = lens_pool_threads(pool) < rows ? lens_pool_threads(pool) : rows;
    lens_pool_run(pool, c.n_tasks, copy_task, &c);
}

/* A row stride of at least n floats that is not a multiple of 1024. */
static size_t unaliased(size_t n)
{
    return n + ((n + PAD) % 1024 ? PAD : 2 * PAD);
}

static int padded(const lens_gemm_args *g, lens_pool *pool)
{
    if (g->M < 2 || g->K < 256) return 0;
    /* OpenBLAS packs x itself: only lensd's kernels read its rows in place */
    const int pad_x = g->ldx % 1024 == 0 && micro_kernel(lens_gemm_kernel_in_use()), pad_y = g->ldy % 1024 == 0;
    if (!pad_x && !pad_y) return 0;
    lens_gemm_args p = *g;
    float *x = NULL, *y = NULL;
    if (pad_x) p.ldx = unaliased((size_t)g->K), p.x = x = malloc(sizeof(float) * p.ldx * (size_t)g->M);
    if (pad_y) p.ldy = unaliased((size_t)g->N), p.y = y = malloc(sizeof(float) * p.ldy * (size_t)g->M);
    if ((pad_x && !x) || (pad_y && !y)) {
        free(x), free(y);
        return 0;
    }
    if (x) copy_rows(x, p.ldx, g->x, g->ldx, g->M, (size_t)g->K, pool);
    if (y && g->accumulate) copy_rows(y, p.ldy, g->y, g->ldy, g->M, (size_t)g->N, pool);
    lens_gemm(&p, pool);
    if (y) copy_rows(g->y, g->ldy, y, p.ldy, g->M, (size_t)g->N, pool);
    free(x), free(y);
    return 1;
}

void lens_gemm(const lens_gemm_args *g, lens_pool *pool)
{
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0) {
        for (int m = 0; m < g->M; m++) {
            float *row = g->y + (size_t)m * g->ldy;
            if (!g->accumulate) {
                if (g->bias) memcpy(row, g->bias, sizeof(float) * g->N);
                else memset(row, 0, sizeof(float) * g->N);
            }
            if (g->post) g->post(row, (size_t)g->N);
        }
        return;
    }
    if (padded(g, pool)) return;
    const lens_gemm_kernel k = lens_gemm_kernel_in_use();
    gemm_job j = {.g = g, .kernel = micro_kernel(k), .half_loads = k == LENS_GEMM_AVX512 || k == LENS_GEMM_AVX2};
    const int n_mblocks = (g->M + MC - 1) / MC, threads = lens_pool_threads(pool);
    if (!j.kernel) {
        j.n_panel_groups = (g->N + BLAS_NC - 1) / BLAS_NC;
        lens_pool_run(pool, n_mblocks * j.n_panel_groups, blas_task, &j);
        return;
    }
    j.n_panels = (g->N + NR - 1) / NR;
    /* about four tasks per thread, so the shared counter evens out the work */
    int groups = threads > 1 ? (4 * threads + n_mblocks - 1) / n_mblocks : 1;
    groups = groups < j.n_panels ? groups : j.n_panels;
    j.panels_per_task = (j.n_panels + groups - 1) / groups;
    j.n_panel_groups = (j.n_panels + j.panels_per_task - 1) / j.panels_per_task;
    lens_pool_run(pool, n_mblocks * j.n_panel_groups, gemm_task, &j);
}
