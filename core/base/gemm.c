/* gemm.c - packed-weight SGEMM (see gemm.h for the layout).
 *
 * Loop nest of one task (rows m0..m1 of x, panels p0..p1 of W):
 *   for k0 in K step KC          A block x[m0..m1][k0..k0+KC] stays in L2
 *     for panel p                W sub-panel [KC][32] (96 KiB) streams from L2
 *       for m in m0..m1 step MR  register tile y[m..m+MR][32p..32p+32]
 *         acc = k0 == 0 && !accumulate ? bias : y;  acc += x[m][k] W[k][.] over k;  y = acc
 * Bias is the accumulator's initial value, so no separate bias pass exists. */
#include "core/base/gemm.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NR LENS_GEMM_NR
#ifndef MR
#define MR 12 /* 24 of the 32 zmm registers accumulate */
#endif
#ifndef KC
/* 768 = 1 KC, 3072 = 4 KC. 384 (the W sub-panel in L1) measured 2-5% slower
 * on BERT-base at one thread (CPU ms, interleaved: T=128 112.7/105.1/100.3
 * vs 107.2/99.9/103.4, T=512 472/476/483 vs 461/468/468, 8 x 32 tokens
 * 217/217/211 vs 206/207/205): each output tile is reloaded per KC block,
 * and L2 streams the sub-panel fast enough. */
#define KC 768
#endif
#define MC 240 /* rows per task: MC x KC floats = 720 KiB of L2 */

/* pf[0 .. pf_lines * 16): cache lines of the next W sub-panel to pull into
 * L2 while this tile computes (prepacked W comes from DRAM or L3 once per
 * panel; without prefetch the first row block of each panel stalls on it). */
typedef void kernel_fn(int mr, int kc, const float *a, size_t lda, const float *b, float *c, size_t ldc, int nr,
                       const float *bias, int init, const float *pf, int pf_lines);

size_t lens_gemm_packed_size(int K, int N)
{
    return (size_t)K * (size_t)((N + NR - 1) / NR) * NR;
}

#if defined(__x86_64__)
static void pack_half_nmajor_avx512(float *dst, const void *w, lens_dtype dt, size_t ld, int k0, int kc, int n0,
                                    int nr, float scale);
#endif
int lens_gemm_avx512(void);

/* dst[kc][32] = scale * W[k0 + k][n0 + j], zero for j >= nr. F32 W is read
 * as floats; BF16/F16 W (weights resident in their file dtype) is widened
 * here, exactly, a row or column at a time (n-major with AVX-512: gathered,
 * a dst row at a time, 3x faster than the scalar scatter). */
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
#if defined(__x86_64__)
        if (lens_gemm_avx512() && ld * 15 < (size_t)1 << 30) {
            pack_half_nmajor_avx512(dst, w, dt, ld, k0, kc, n0, nr, scale);
            return;
        }
#endif
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

void lens_gemm_pack(float *packed, const float *w, int K, int N, size_t ld, int w_kn)
{
    for (int p = 0; p * NR < N; p++) {
        const int nr = N - p * NR < NR ? N - p * NR : NR;
        pack_panel(packed + (size_t)p * K * NR, w, LENS_DT_F32, ld, w_kn, 0, K, p * NR, nr, 1.0f);
    }
}

/* ------------------------------------------------------------ kernels */

/* Portable: 4-row strips, the 32-wide inner loop left to the vectoriser. */
static void kernel_c(int mr, int kc, const float *a, size_t lda, const float *b, float *c, size_t ldc, int nr,
                     const float *bias, int init, const float *pf, int pf_lines)
{
    (void)pf, (void)pf_lines;
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

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 "avx512f,avx512bw,avx512dq,avx512vl"

/* One mr x 32 register tile; mr is a constant at every call site, so the row
 * loops unroll and the accumulators live in registers. */
__attribute__((target(AVX512), always_inline)) static inline void tile_avx512(const int mr, int kc, const float *a,
                                                                               size_t lda, const float *b, float *c,
                                                                               size_t ldc, int nr, const float *bias,
                                                                               int init, const float *pf, int pf_lines)
{
    const __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    __m512 c0[MR], c1[MR];
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
        if (k < pf_lines) _mm_prefetch((const char *)(pf + (size_t)k * 16), _MM_HINT_T1);
        const __m512 b0 = _mm512_load_ps(b + (size_t)k * NR), b1 = _mm512_load_ps(b + (size_t)k * NR + 16);
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
__attribute__((target(AVX512))) static void pack_half_nmajor_avx512(float *dst, const void *w, lens_dtype dt,
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
            _mm512_store_ps(dst + (size_t)k * NR + 16 * half, _mm512_mul_ps(v, s));
        }
    }
}

__attribute__((target(AVX512))) static void kernel_avx512(int mr, int kc, const float *a, size_t lda, const float *b,
                                                          float *c, size_t ldc, int nr, const float *bias, int init,
                                                          const float *pf, int pf_lines)
{
    switch (mr) {
#define CASE(R) \
    case R: tile_avx512(R, kc, a, lda, b, c, ldc, nr, bias, init, pf, pf_lines); break;
        CASE(12) CASE(11) CASE(10) CASE(9) CASE(8) CASE(7) CASE(6) CASE(5) CASE(4) CASE(3) CASE(2) CASE(1)
#undef CASE
    }
}
#endif

/* LENS_GEMM_PORTABLE=1 in the environment forces the portable kernel (to
 * test it on AVX-512 machines). */
int lens_gemm_avx512(void)
{
#if defined(__x86_64__)
    static atomic_int cached = -1; /* same answer from every thread: a benign race */
    int use = atomic_load_explicit(&cached, memory_order_relaxed);
    if (use < 0) {
        __builtin_cpu_init();
        const char *portable = getenv("LENS_GEMM_PORTABLE");
        use = !(portable && *portable && *portable != '0') && __builtin_cpu_supports("avx512f") &&
              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512vl");
        atomic_store_explicit(&cached, use, memory_order_relaxed);
    }
    return use;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------ driver */

typedef struct {
    const lens_gemm_args *g;
    kernel_fn *kernel;
    int n_panels, panels_per_task, n_panel_groups;
} gemm_job;

static void gemm_task(void *ctx, int task)
{
    const gemm_job *j = ctx;
    const lens_gemm_args *g = j->g;
    const int m0 = task / j->n_panel_groups * MC, m1 = m0 + MC < g->M ? m0 + MC : g->M;
    const int p0 = task % j->n_panel_groups * j->panels_per_task;
    const int p1 = p0 + j->panels_per_task < j->n_panels ? p0 + j->panels_per_task : j->n_panels;
    _Alignas(64) float panel[KC * NR]; /* W panel packed during the call when not prepacked */
    for (int k0 = 0; k0 < g->K; k0 += KC) {
        const int kc = g->K - k0 < KC ? g->K - k0 : KC;
        for (int p = p0; p < p1; p++) {
            const int n0 = p * NR, nr = g->N - n0 < NR ? g->N - n0 : NR;
            const float *b = panel, *next = NULL;
            int next_lines = 0; /* 64-byte lines of the next sub-panel, spread over the row blocks */
            if (g->packed) {
                b = g->packed + (size_t)p * g->K * NR + (size_t)k0 * NR;
                if (p + 1 < p1) next = g->packed + (size_t)(p + 1) * g->K * NR + (size_t)k0 * NR, next_lines = 2 * kc;
                else if (k0 + KC < g->K) {
                    next = g->packed + (size_t)p0 * g->K * NR + (size_t)(k0 + KC) * NR;
                    next_lines = 2 * (g->K - k0 - KC < KC ? g->K - k0 - KC : KC);
                }
            } else if (g->packed_t) {
                pack_panel_transposed(panel, g->packed_t, g->N, k0, kc, n0, nr);
            } else {
                pack_panel(panel, g->w, g->w_dtype, g->ld, g->w_kn, k0, kc, n0, nr, g->alpha);
            }
            const int n_blocks = (m1 - m0 + MR - 1) / MR, per_block = (next_lines + n_blocks - 1) / n_blocks;
            for (int m = m0, i = 0; m < m1; m += MR, i++) {
                const int pf_first = i * per_block < next_lines ? i * per_block : next_lines;
                const int pf_lines = next_lines - pf_first < per_block ? next_lines - pf_first : per_block;
                const int mr = m1 - m < MR ? m1 - m : MR;
                float *y = g->y + (size_t)m * g->ldy + n0;
                j->kernel(mr, kc, g->x + (size_t)m * g->ldx + k0, g->ldx, b, y, g->ldy, nr,
                          g->bias ? g->bias + n0 : NULL, k0 == 0 && !g->accumulate,
                          next ? next + (size_t)pf_first * 16 : NULL, pf_lines);
                for (int i = 0; g->post && k0 + kc == g->K && i < mr; i++) g->post(y + (size_t)i * g->ldy, (size_t)nr);
            }
        }
    }
}

/* y rows a multiple of 1024 floats (4 KiB) apart: an output tile's 12 rows
 * fall in the same L1 sets, so its stores (and reloads at every KC block of
 * K) evict each other. Measured with forward --gemm at M = 128, one thread:
 * N = 3072 with K = 384 and K = 768 10-20% slower than rows padded by 16
 * floats, while aliased x rows cost nothing measurable. Such a product (q, k,
 * v and the residual branch of C = 1024, 2048 models) is computed into rows
 * of N + 16 floats and copied out: bitwise the same y, for one pass over it,
 * which the 2K flops per element pay for from K = 256 on (attention's scores,
 * K = DK, stay in place). 0 when not needed (or out of memory: then computed
 * in place, only slower). */
static int product_padded(const lens_gemm_args *g, lens_pool *pool)
{
    if (g->ldy % 1024 || g->M < 2 || g->K < 256) return 0;
    const size_t ld = (size_t)g->N + ((g->N + 16) % 1024 ? 16 : 32); /* itself not 1024-aligned */
    float *tmp = malloc(sizeof(float) * ld * (size_t)g->M);
    if (!tmp) return 0;
    lens_gemm_args padded = *g;
    padded.y = tmp, padded.ldy = ld;
    for (int m = 0; g->accumulate && m < g->M; m++)
        memcpy(tmp + (size_t)m * ld, g->y + (size_t)m * g->ldy, sizeof(float) * g->N);
    lens_gemm(&padded, pool);
    for (int m = 0; m < g->M; m++) memcpy(g->y + (size_t)m * g->ldy, tmp + (size_t)m * ld, sizeof(float) * g->N);
    free(tmp);
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
    if (product_padded(g, pool)) return;
    gemm_job j = {.g = g, .kernel = kernel_c};
#if defined(__x86_64__)
    if (lens_gemm_avx512()) j.kernel = kernel_avx512;
#endif
    j.n_panels = (g->N + NR - 1) / NR;
    const int n_mblocks = (g->M + MC - 1) / MC, threads = lens_pool_threads(pool);
    /* about four tasks per thread, so the shared counter evens out the work */
    int groups = threads > 1 ? (4 * threads + n_mblocks - 1) / n_mblocks : 1;
    groups = groups < j.n_panels ? groups : j.n_panels;
    j.panels_per_task = (j.n_panels + groups - 1) / groups;
    j.n_panel_groups = (j.n_panels + j.panels_per_task - 1) / j.panels_per_task;
    lens_pool_run(pool, n_mblocks * j.n_panel_groups, gemm_task, &j);
}

void lens_gemm_linear_post(float *out, size_t ld_out, const float *inp, size_t ld_inp, const lens_linear *lin, int N,
                           void (*post)(float *y, size_t n), lens_pool *pool)
{
    const lens_gemm_args g = {.M = N, .N = lin->out, .K = lin->in, .x = inp, .ldx = ld_inp, .packed = lin->packed,
                              .w = lin->w, .w_dtype = lin->dtype, .ld = (size_t)lin->ld, .w_kn = lin->w_in_out,
                              .alpha = 1.0f,
                              .bias = lin->b, .y = out, .ldy = ld_out, .post = post};
    lens_gemm(&g, pool);
}

void lens_gemm_linear_ld(float *out, size_t ld_out, const float *inp, size_t ld_inp, const lens_linear *lin, int N,
                         lens_pool *pool)
{
    lens_gemm_linear_post(out, ld_out, inp, ld_inp, lin, N, NULL, pool);
}

void lens_gemm_linear(float *out, const float *inp, const lens_linear *lin, int N, lens_pool *pool)
{
    lens_gemm_linear_ld(out, (size_t)lin->out, inp, (size_t)lin->in, lin, N, pool);
}

void lens_gemm_linear_backward(float *dinp, const float *dout, const lens_linear *lin, int N, int accumulate,
                               lens_pool *pool)
{
    /* forward: out = inp W' with W'[in][out]; dinp = dout W'^T, and W'^T[o][i]
     * is w[o*ld + i] for a Linear ([out][in], k-major here) or w[i*ld + o]
     * for a Conv1D ([in][out], n-major here) */
    const lens_gemm_args g = {.M = N, .N = lin->in, .K = lin->out, .x = dout, .ldx = (size_t)lin->out,
                              .packed_t = lin->packed, .w = lin->w, .w_dtype = lin->dtype, .ld = (size_t)lin->ld,
                              .w_kn = !lin->w_in_out, .alpha = 1.0f, .y = dinp, .ldy = (size_t)lin->in,
                              .accumulate = accumulate};
    lens_gemm(&g, pool);
}
