/* test_gemm.c - the thread pool and the packed SGEMM (core/base/pool.h,
 * core/base/gemm.h), and lens_forward with a pool against lens_forward without.
 *
 * Pool: every task of a job runs exactly once for pools of 1..3 threads and
 * job sizes 0..1000; runs nested inside a task (same pool or NULL) go inline;
 * lens_pool_thread_index stays below the pool's thread count.
 *
 * Every GEMM test below runs once per kernel this CPU can run (avx512, avx2,
 * blas = OpenBLAS's sgemm, portable: lens_gemm_use_kernel), and the kernels
 * are checked against the portable one on odd shapes (test_kernels_agree).
 *
 * GEMM: y = x W + b against a double-precision reference for shapes that are
 * not multiples of the tiles (MR 12, NR 32, KC 768, MC 240), M, N or K = 1,
 * row strides larger than the rows, both weight layouts, with and without
 * bias, prepacked and packed-per-call W (with a scale), pools of 1 and 2
 * threads. Tolerance per element: 2 K FLT_EPSILON (sum_k |x_k W_kn| + |b_n|),
 * the worst-case error bound of a K-term float32 dot product (gamma_K, twice
 * over), so a wrong element or a missed term fails while any accumulation
 * order passes. Columns past N of y must be left untouched (masked stores).
 *
 * Forward: the pool only splits work between threads, never an element's
 * arithmetic, so hidden states, attention, values and logits with a 2-thread
 * pool must equal the single-threaded ones exactly (tolerance 0). */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/model/model.h"
#include "core/nn/ops.h"
#include "core/base/pool.h"
#include "tests/check.h"

/* ---------------------------------------------------------------- pool */

typedef struct {
    atomic_int *count;
    lens_pool *pool;
    int threads;
    atomic_int bad_index, inner;
} pool_ctx;

static void count_task(void *ctx, int task)
{
    pool_ctx *c = ctx;
    atomic_fetch_add(&c->count[task], 1);
    int idx = lens_pool_thread_index();
    if (idx < 0 || idx >= c->threads) atomic_fetch_add(&c->bad_index, 1);
}

static void inner_task(void *ctx, int task)
{
    (void)task;
    atomic_fetch_add(&((pool_ctx *)ctx)->inner, 1);
}

/* A task that starts jobs of its own: on the same pool and on no pool. */
static void nesting_task(void *ctx, int task)
{
    pool_ctx *c = ctx;
    atomic_fetch_add(&c->count[task], 1);
    lens_pool_run(c->pool, 3, inner_task, c);
    lens_pool_run(NULL, 2, inner_task, c);
}

static void test_pool(void)
{
    enum { MAX_TASKS = 1000 };
    static atomic_int count[MAX_TASKS];
    const int sizes[] = {0, 1, 2, 3, 7, 64, MAX_TASKS};
    for (int threads = 1; threads <= 3; threads++) {
        lens_pool *pool = lens_pool_create(threads);
        CHECK(pool != NULL, "lens_pool_create(%d)", threads);
        if (!pool) continue;
        CHECK(lens_pool_threads(pool) == threads, "pool of %d reports %d threads", threads, lens_pool_threads(pool));
        for (int rep = 0; rep < 50; rep++) {
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                const int n = sizes[s];
                pool_ctx c = {.count = count, .pool = pool, .threads = threads};
                for (int i = 0; i < MAX_TASKS; i++) atomic_store(&count[i], 0);
                lens_pool_run(pool, n, count_task, &c);
                int wrong = 0;
                for (int i = 0; i < MAX_TASKS; i++) wrong += atomic_load(&count[i]) != (i < n);
                if (wrong || atomic_load(&c.bad_index)) {
                    CHECK(0, "pool %d threads, %d tasks: %d tasks not run exactly once, %d bad thread indices",
                          threads, n, wrong, atomic_load(&c.bad_index));
                    rep = 50;
                    break;
                }
            }
        }
        check_passed++;
        pool_ctx c = {.count = count, .pool = pool, .threads = threads};
        for (int i = 0; i < MAX_TASKS; i++) atomic_store(&count[i], 0);
        lens_pool_run(pool, 10, nesting_task, &c);
        int wrong = 0;
        for (int i = 0; i < 10; i++) wrong += atomic_load(&count[i]) != 1;
        CHECK(!wrong && atomic_load(&c.inner) == 10 * 5, "nested runs in a %d-thread pool: %d outer wrong, %d inner of 50",
              threads, wrong, atomic_load(&c.inner));
        lens_pool_free(pool);
    }
    /* NULL pool: inline, in order */
    static int order[5], pos;
    pos = 0;
    pool_ctx c = {.count = count, .threads = 1};
    for (int i = 0; i < 5; i++) atomic_store(&count[i], 0);
    lens_pool_run(NULL, 5, count_task, &c);
    for (int i = 0; i < 5; i++) order[pos++] = atomic_load(&count[i]);
    CHECK(order[0] == 1 && order[4] == 1 && !atomic_load(&c.bad_index), "NULL pool runs every task once");
    lens_pool_free(NULL);
}

/* ---------------------------------------------------------------- gemm */

static unsigned rng = 12345;
static float uniform(void)
{
    rng = rng * 1103515245u + 12345u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* sum_k |x[m][k] W[k][n]| for W[k][n] at w[k*ld + n] (w_kn) or w[n*ld + k]:
 * the scale of a K-term float32 dot product's rounding error. */
static double dot_magnitude(const float *x, size_t ldx, const float *w, size_t ld, int w_kn, int m, int n, int K)
{
    double mag = 0;
    for (int k = 0; k < K; k++)
        mag += fabs((double)x[(size_t)m * ldx + k] * (w_kn ? w[(size_t)k * ld + n] : w[(size_t)n * ld + k]));
    return mag;
}

/* 1 when two computations of one product by the kernel in use must agree
 * bitwise: lensd's kernels (same kernel, same blocking, whatever W's
 * source); not OpenBLAS, which blocks K its own way for each shape. */
static int bitwise_kernel(void)
{
    return lens_gemm_kernel_in_use() != LENS_GEMM_BLAS;
}

/* Two computations of y[M][N] (row stride ldy) = x W (+ y or b): the count
 * of elements that differ at all (exact) or by more than twice the dot
 * product's error bound (2 K eps sum_k |x_k W_kn|, alpha scaling W) plus
 * one rounding of the result. */
static size_t products_differ(const float *a, const float *b, size_t ldy, const float *x, size_t ldx, const float *w,
                              size_t ld, int w_kn, int M, int N, int K, float alpha, int exact)
{
    size_t differ = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float u = a[(size_t)m * ldy + n], v = b[(size_t)m * ldy + n];
            if (u == v) continue;
            const double tol = 4.0 * K * FLT_EPSILON * fabs(alpha) * dot_magnitude(x, ldx, w, ld, w_kn, m, n, K) +
                               2.0 * FLT_EPSILON * fabs((double)v);
            differ += exact || !(fabs((double)u - v) <= tol);
        }
    return differ;
}

/* One case: y[M][N] (stride ldy) = x[M][K] (stride ldx) W + b. */
static void gemm_case(int M, int N, int K, int w_kn, int with_bias, int prepack, lens_pool *pool, const char *pool_name)
{
    const size_t ldx = (size_t)K + (K % 3), ldy = (size_t)N + 5;
    const size_t ld = (w_kn ? (size_t)N : (size_t)K) + (size_t)(M % 4); /* W's row stride, sometimes > its row */
    const size_t w_rows = w_kn ? (size_t)K : (size_t)N;
    const float alpha = prepack ? 1.0f : 0.5f;
    float *x = malloc(sizeof(float) * M * ldx), *w = malloc(sizeof(float) * w_rows * ld);
    float *b = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * M * ldy), *want = malloc(sizeof(float) * M * N);
    float *got = malloc(sizeof(float) * M * N), *tol = malloc(sizeof(float) * M * N);
    float *packed = prepack ? aligned_alloc(64, sizeof(float) * lens_gemm_packed_size(K, N)) : NULL;
    for (size_t i = 0; i < M * ldx; i++) x[i] = uniform();
    for (size_t i = 0; i < w_rows * ld; i++) w[i] = uniform();
    for (int i = 0; i < N; i++) b[i] = uniform();
    for (size_t i = 0; i < M * ldy; i++) y[i] = 1234.5f; /* sentinel */
    if (prepack) lens_gemm_pack(packed, w, K, N, ld, w_kn);
    const lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = ldx, .packed = packed, .w = w, .ld = ld,
                              .w_kn = w_kn, .alpha = alpha, .bias = with_bias ? b : NULL, .y = y, .ldy = ldy};
    lens_gemm(&g, pool);
    int untouched = 1;
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            double sum = with_bias ? b[n] : 0, mag = with_bias ? fabs(b[n]) : 0;
            for (int k = 0; k < K; k++) {
                const double wk = alpha * (double)(w_kn ? w[(size_t)k * ld + n] : w[(size_t)n * ld + k]);
                sum += (double)x[(size_t)m * ldx + k] * wk;
                mag += fabs((double)x[(size_t)m * ldx + k] * wk);
            }
            want[(size_t)m * N + n] = (float)sum;
            got[(size_t)m * N + n] = y[(size_t)m * ldy + n];
            tol[(size_t)m * N + n] = (float)(2.0 * K * FLT_EPSILON * mag + 1e-30);
        }
        for (size_t n = (size_t)N; n < ldy; n++) untouched &= y[(size_t)m * ldy + n] == 1234.5f;
    }
    int bad = 0;
    size_t worst = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) {
        const double d = fabs((double)got[i] - want[i]), r = d / tol[i];
        if (!(d <= tol[i])) bad++;
        if (!(r <= worst_ratio)) worst_ratio = r, worst = i;
    }
    CHECK(!bad && untouched,
          "gemm M=%d N=%d K=%d %s %s %s pool %s: %d of %d elements outside 2K eps sum|xw|, worst y[%zu][%zu] got %g "
          "want %g; columns past N %s",
          M, N, K, w_kn ? "W[K][N]" : "W[N][K]", with_bias ? "bias" : "no bias", prepack ? "prepacked" : "per-call",
          pool_name, bad, M * N, worst / N, worst % N, (double)got[worst], (double)want[worst],
          untouched ? "untouched" : "WRITTEN");
    free(x), free(w), free(b), free(y), free(want), free(got), free(tol), free(packed);
}

static void test_gemm(void)
{
    static const int shapes[][3] = {
        {1, 1, 1},    {1, 33, 5},   {5, 1, 9},     {3, 7, 1},     {12, 32, 16},   {13, 31, 17},
        {25, 65, 385}, {11, 100, 769}, {241, 40, 50}, {250, 97, 400}, {128, 64, 128}, {37, 200, 3},
    };
    lens_pool *one = lens_pool_create(1), *two = lens_pool_create(2);
    struct {
        lens_pool *pool;
        const char *name;
    } pools[] = {{NULL, "NULL"}, {one, "1 thread"}, {two, "2 threads"}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int w_kn = 0; w_kn <= 1; w_kn++)
            for (int bias = 0; bias <= 1; bias++)
                for (int prepack = 0; prepack <= 1; prepack++)
                    for (size_t p = 0; p < sizeof pools / sizeof *pools; p++)
                        gemm_case(shapes[s][0], shapes[s][1], shapes[s][2], w_kn, bias, prepack, pools[p].pool,
                                  pools[p].name);
    lens_pool_free(one);
    lens_pool_free(two);
}

/* W in BF16 / F16 (weights resident in their checkpoint dtype): the GEMM
 * widens them while packing, exactly, so y must be the product with the
 * same W widened to F32 beforehand (products_differ: bitwise under lensd's
 * kernels), for both layouts (W[N][K] n-major takes the AVX-512 or AVX2
 * gather path), row strides past the row, K across KC blocks (k0 > 0),
 * N not a multiple of the 32-column panel, alpha != 1; and prepacked as the
 * loader packs them (lens_gemm_pack_half: 16-bit panels the AVX-512 and AVX2
 * kernels widen as they load them, the first row tile of a task storing them
 * widened for the task's other tiles: one tile at M = 1 and 5, and the 10
 * rows past MC = 240 of M = 250; two at 13; six at 64; twenty at 240 of 250)
 * against F32 panels. */
static void test_half_weights(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {5, 17, 9}, {13, 33, 385}, {250, 70, 800}, {64, 96, 768}};
    static const lens_dtype dts[] = {LENS_DT_BF16, LENS_DT_F16};
    lens_pool *two = lens_pool_create(2);
    int n_cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int w_kn = 0; w_kn <= 1; w_kn++)
            for (int d = 0; d < 2; d++) {
                const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                const size_t ld = (w_kn ? (size_t)N : (size_t)K) + (size_t)(s % 3), rows = w_kn ? (size_t)K : (size_t)N;
                float *x = malloc(sizeof(float) * M * K), *wf = malloc(sizeof(float) * rows * ld);
                float *y16 = malloc(sizeof(float) * M * N), *y32 = malloc(sizeof(float) * M * N);
                uint16_t *wh = malloc(sizeof(uint16_t) * rows * ld);
                for (size_t i = 0; i < (size_t)M * K; i++) x[i] = uniform();
                for (size_t i = 0; i < rows * ld; i++) wf[i] = uniform() * 3.0f;
                lens_narrow(wh, wf, dts[d], rows * ld);
                lens_widen(wf, wh, dts[d], rows * ld);
                lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = (size_t)K, .w = wh, .w_dtype = dts[d],
                                    .ld = ld, .w_kn = w_kn, .alpha = 0.5f, .y = y16, .ldy = (size_t)N};
                lens_gemm(&g, two);
                g.w = wf, g.w_dtype = LENS_DT_F32, g.y = y32;
                lens_gemm(&g, two);
                const size_t differ = products_differ(y16, y32, (size_t)N, x, (size_t)K, wf, ld, w_kn, M, N, K, 0.5f,
                                                       bitwise_kernel());
                CHECK(!differ, "%s W %s M=%d N=%d K=%d: %zu values differ from the product with widened F32 W",
                      lens_dtype_name(dts[d]), w_kn ? "[K][N]" : "[N][K]", M, N, K, differ);
                /* prepacked: 16-bit panels (the kernel widens them) against F32 panels (alpha ignored) */
                uint16_t *ph = aligned_alloc(64, (sizeof(uint16_t) * lens_gemm_packed_size(K, N) + 63) & ~(size_t)63);
                float *pf = aligned_alloc(64, sizeof(float) * lens_gemm_packed_size(K, N));
                lens_gemm_pack_half(ph, wh, K, N, ld, w_kn);
                lens_gemm_pack(pf, wf, K, N, ld, w_kn);
                g.packed = ph, g.w = wh, g.w_dtype = dts[d], g.y = y16;
                lens_gemm(&g, two);
                g.packed = pf, g.w = wf, g.w_dtype = LENS_DT_F32, g.y = y32;
                lens_gemm(&g, two);
                const size_t differ_packed = products_differ(y16, y32, (size_t)N, x, (size_t)K, wf, ld, w_kn, M, N, K,
                                                              1.0f, bitwise_kernel());
                CHECK(!differ_packed, "%s W %s M=%d N=%d K=%d prepacked: %zu values differ from F32 panels",
                      lens_dtype_name(dts[d]), w_kn ? "[K][N]" : "[N][K]", M, N, K, differ_packed);
                free(ph), free(pf);
                n_cases++;
                free(x), free(wf), free(y16), free(y32), free(wh);
            }
    CHECK(n_cases == 20, "%d half-weight cases", n_cases);
    lens_pool_free(two);
}

/* n values uniform in [-scale, scale), malloc'd (n + 1 so n = 0 allocates). */
static float *uniform_floats(size_t n, float scale)
{
    float *v = malloc(sizeof(float) * (n + 1));
    for (size_t i = 0; i < n; i++) v[i] = uniform() * scale;
    return v;
}

/* lens_gemm_args.post (BERT's GELU fused into the FFN's first product):
 * bitwise the unfused product followed by the activation on every row, for
 * prepacked and per-call W, K across KC blocks and K = 0, N not a multiple
 * of the panel, y stride past the row (untouched past N), with and without
 * a pool, both GELUs. */
static void test_post(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {13, 33, 1000}, {128, 96, 768}, {30, 70, 0}, {25, 3072, 40}};
    lens_pool *two = lens_pool_create(2);
    int n_cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 4; variant++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], prepack = variant & 1;
            void (*post)(float *, size_t) = variant & 2 ? lens_gelu_tanh_forward : lens_gelu_forward;
            const size_t ldy = (size_t)N + 7;
            float *x = uniform_floats((size_t)M * K, 2.0f), *w = uniform_floats((size_t)K * N, 0.2f);
            float *b = uniform_floats((size_t)N, 1.0f), *fused = malloc(sizeof(float) * M * ldy);
            float *plain = malloc(sizeof(float) * M * ldy);
            float *packed = aligned_alloc(64, sizeof(float) * (lens_gemm_packed_size(K, N) + 16));
            for (size_t i = 0; i < M * ldy; i++) fused[i] = plain[i] = 1234.5f;
            if (prepack) lens_gemm_pack(packed, w, K, N, (size_t)N, 1);
            lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = (size_t)K, .packed = prepack ? packed : NULL,
                                .w = w, .ld = (size_t)N, .w_kn = 1, .alpha = 1.0f, .bias = b, .y = plain, .ldy = ldy};
            lens_gemm(&g, variant < 2 ? NULL : two);
            for (int m = 0; m < M; m++) post(plain + (size_t)m * ldy, (size_t)N);
            g.y = fused, g.post = post;
            lens_gemm(&g, variant < 2 ? two : NULL);
            CHECK(!memcmp(fused, plain, sizeof(float) * M * ldy),
                  "post M=%d N=%d K=%d %s %s: fused product differs from product then activation (or wrote past N)",
                  M, N, K, prepack ? "prepacked" : "per-call", variant & 2 ? "gelu_tanh" : "gelu");
            n_cases++;
            free(x), free(w), free(b), free(fused), free(plain), free(packed);
        }
    CHECK(n_cases == 20, "%d post cases", n_cases);
    lens_pool_free(two);
}

/* y rows 1024 floats (4 KiB) apart or a multiple: lens_gemm computes into a
 * padded copy and copies it out (gemm.c padded). y must be bitwise the
 * product written at an unaliased stride, for y = and y += (accumulate, the
 * copy starts from y), with post, across KC and MC blocks, K below the
 * copy's threshold (256) and M = 1, NULL and 2-thread pool; the columns past
 * N stay untouched. x rows 1024 floats apart (read from a padded copy), alone
 * and with such y: the same bits as x rows K apart. */
static void test_aliased_rows(void)
{
    static const int shapes[][3] = {{250, 70, 800}, {13, 1008, 385}, {1, 33, 300}, {40, 64, 64}, {128, 2048, 256}};
    lens_pool *two = lens_pool_create(2);
    int n_cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 4; variant++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], acc = variant & 1;
            const size_t aliased = ((size_t)N + 1023) / 1024 * 1024, plain = (size_t)N + 3;
            float *x = uniform_floats((size_t)M * K, 1.0f), *w = uniform_floats((size_t)K * N, 0.1f);
            float *b = uniform_floats((size_t)N, 1.0f);
            const size_t aliased_x = ((size_t)K + 1023) / 1024 * 1024;
            float *xa = malloc(sizeof(float) * M * aliased_x), *yx = malloc(sizeof(float) * M * plain);
            for (int m = 0; m < M; m++) memcpy(xa + (size_t)m * aliased_x, x + (size_t)m * K, sizeof(float) * K);
            float *ya = malloc(sizeof(float) * M * aliased), *yp = malloc(sizeof(float) * M * plain);
            float *yxa = malloc(sizeof(float) * M * aliased); /* x and y aliased */
            for (size_t i = 0; i < M * aliased; i++) ya[i] = yxa[i] = 1234.5f;
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    ya[(size_t)m * aliased + n] = yp[(size_t)m * plain + n] = yx[(size_t)m * plain + n] =
                        yxa[(size_t)m * aliased + n] = uniform();
            lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = (size_t)K, .w = w, .ld = (size_t)N, .w_kn = 1,
                                .alpha = 1.0f, .bias = b, .y = ya, .ldy = aliased, .accumulate = acc,
                                .post = variant & 2 ? lens_gelu_forward : NULL};
            lens_gemm(&g, variant & 2 ? two : NULL);
            g.y = yp, g.ldy = plain;
            lens_gemm(&g, variant & 2 ? two : NULL);
            g.x = xa, g.ldx = aliased_x, g.y = yx;
            lens_gemm(&g, variant & 2 ? two : NULL);
            g.y = yxa, g.ldy = aliased;
            lens_gemm(&g, variant & 2 ? two : NULL);
            int same_rows = 1, untouched = 1, same_x = 1;
            for (int m = 0; m < M; m++) {
                same_rows &= !memcmp(ya + (size_t)m * aliased, yp + (size_t)m * plain, sizeof(float) * N);
                same_x &= !memcmp(yx + (size_t)m * plain, yp + (size_t)m * plain, sizeof(float) * N);
                same_x &= !memcmp(yxa + (size_t)m * aliased, yp + (size_t)m * plain, sizeof(float) * N);
                for (size_t n = (size_t)N; n < aliased; n++)
                    untouched &= ya[(size_t)m * aliased + n] == 1234.5f && yxa[(size_t)m * aliased + n] == 1234.5f;
            }
            CHECK(same_rows && untouched, "M=%d N=%d K=%d %s%s: y stride %zu %s", M, N, K, acc ? "y +=" : "y =",
                  variant & 2 ? " post, 2 threads" : "", aliased,
                  !same_rows ? "gives another product than an unaliased stride" : "wrote past N");
            CHECK(same_x, "M=%d N=%d K=%d %s%s: x stride %zu gives another product than stride K", M, N, K,
                  acc ? "y +=" : "y =", variant & 2 ? " post, 2 threads" : "", aliased_x);
            n_cases++;
            free(x), free(xa), free(w), free(b), free(ya), free(yp), free(yx), free(yxa);
        }
    CHECK(n_cases == 20, "%d aliased-stride cases", n_cases);
    lens_pool_free(two);
}

/* lens_gemm_linear_backward (the attribution backward's GEMM) against
 * ops.c's cblas lens_linear_backward: Linear and Conv1D layouts, row strides
 * past the row, y = and y += (accumulate), on a 2-thread pool; and with the
 * map prepacked as the loader packs it (the backward then reads W^T from
 * those panels), the same product as from w (products_differ). out = 1000
 * spans two K blocks of 768, the second not a whole number of 32-row
 * panels; in = 50, 70: a partial last column panel. */
static void test_linear_backward(void)
{
    lens_pool *two = lens_pool_create(2);
    const int N = 250, shapes[][2] = {{50, 90}, {70, 1000}};
    int cases = 0;
    for (int sh = 0; sh < 2; sh++)
        for (int conv = 0; conv <= 1; conv++)
            for (int acc = 0; acc <= 1; acc++) {
                const int in = shapes[sh][0], out = shapes[sh][1], ld = (conv ? out : in) + 3;
                const size_t nw = (size_t)(conv ? in : out) * ld;
                float *w = malloc(sizeof(float) * nw), *dout = malloc(sizeof(float) * N * out);
                float *want = malloc(sizeof(float) * N * in), *got = malloc(sizeof(float) * N * in);
                float *from_packed = malloc(sizeof(float) * N * in);
                float *packed = aligned_alloc(64, sizeof(float) * lens_gemm_packed_size(in, out));
                for (size_t i = 0; i < nw; i++) w[i] = uniform();
                for (size_t i = 0; i < (size_t)N * out; i++) dout[i] = uniform();
                for (size_t i = 0; i < (size_t)N * in; i++) {
                    want[i] = acc ? uniform() : 0.0f;
                    got[i] = from_packed[i] = acc ? want[i] : 1234.5f; /* without accumulate the old values must go */
                }
                lens_linear lin = {.w = w, .in = in, .out = out, .ld = ld, .w_in_out = conv};
                lens_linear_backward(want, NULL, NULL, dout, NULL, &lin, N);
                lens_gemm_linear_backward(got, dout, &lin, N, acc, two);
                lens_gemm_pack(packed, w, in, out, (size_t)ld, conv);
                lin.packed = packed;
                lens_gemm_linear_backward(from_packed, dout, &lin, N, acc, two);
                double worst = 0;
                for (size_t i = 0; i < (size_t)N * in; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
                /* dinp = dout W^T: W^T[o][i] at w[o*ld + i] for a Linear, w[i*ld + o] for a Conv1D */
                const size_t differ =
                    products_differ(from_packed, got, (size_t)in, dout, (size_t)out, w, (size_t)ld, !conv, N, in, out, 1.0f,
                                    bitwise_kernel());
                CHECK(worst <= 1e-4, "linear backward %dx%d %s %s: max |lens_gemm - cblas| %.3g", in, out,
                      conv ? "Conv1D" : "Linear", acc ? "+=" : "=", worst);
                CHECK(differ == 0, "linear backward %dx%d %s %s: %zu values differ with prepacked W", in, out,
                      conv ? "Conv1D" : "Linear", acc ? "+=" : "=", differ);
                free(w), free(dout), free(want), free(got), free(from_packed), free(packed);
                cases++;
            }
    CHECK(cases == 8, "linear backward: %d cases, want 8", cases);
    lens_pool_free(two);
}

/* ------------------------------------------------- forward with a pool */

static int same(const char *what, const float *a, const float *b, size_t n)
{
    if (!a && !b) return 1;
    if (!a || !b) {
        CHECK(0, "%s kept in one run only", what);
        return 0;
    }
    size_t diff = 0, first = 0;
    for (size_t i = n; i-- > 0;)
        if (a[i] != b[i]) diff++, first = i;
    CHECK(diff == 0, "%s: %zu of %zu values differ with a pool, first at %zu (%g vs %g)", what, diff, n, first,
          (double)a[first], (double)b[first]);
    return diff == 0;
}

static void test_forward_pool(const char *shared, const char *name)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/%s", shared, name);
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    if (!m) {
        SKIP("%s: %s", dir, err.msg);
        return;
    }
    const lens_config *c = &m->cfg;
    const int lengths[] = {5, 17, 1, 30};
    const int S = 4, N = 5 + 17 + 1 + 30;
    int ids[5 + 17 + 1 + 30];
    for (int i = 0; i < N; i++) ids[i] = (i * 7919 + 13) % c->vocab_size;
    const lens_batch batch = {.n_seqs = S, .lengths = lengths, .ids = ids};
    lens_pool *pool = lens_pool_create(2);
    lens_forward_opts alone = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_LN |
                                       LENS_KEEP_LOGITS};
    lens_forward_opts pooled = alone;
    pooled.pool = pool;
    lens_activations a, b;
    int ra = lens_forward(m, &batch, &alone, &a, &err);
    int rb = lens_forward(m, &batch, &pooled, &b, &err);
    CHECK(ra == 0 && rb == 0, "%s: forward failed: %s", name, err.msg);
    if (ra == 0 && rb == 0) {
        const size_t L = (size_t)c->n_layers, C = (size_t)c->d_model, VO = (size_t)c->n_heads * c->d_head_v;
        char what[160];
        snprintf(what, sizeof what, "%s hidden", name);
        same(what, a.hidden, b.hidden, (L + 1) * N * C);
        snprintf(what, sizeof what, "%s attention", name);
        same(what, a.attn, b.attn, L * c->n_heads * a.attn_layer_size);
        snprintf(what, sizeof what, "%s values", name);
        same(what, a.values, b.values, L * N * VO);
        snprintf(what, sizeof what, "%s LayerNorm mean", name);
        same(what, a.ln_mean, b.ln_mean, (2 * L + 1) * N);
        const size_t n_logits = c->task == LENS_TASK_CLASSIFICATION ? (size_t)S * c->n_labels
                                : c->task == LENS_TASK_ENCODER      ? 0
                                                                    : (size_t)N * c->vocab_size;
        snprintf(what, sizeof what, "%s logits", name);
        if (n_logits) same(what, a.logits, b.logits, n_logits);
    }
    if (ra == 0) lens_activations_free(&a);
    if (rb == 0) lens_activations_free(&b);
    /* the unkept path (probabilities in per-thread scratch) against the kept one */
    lens_forward_opts hidden_only = {.keep = LENS_KEEP_HIDDEN, .pool = pool};
    lens_forward_opts hidden_alone = {.keep = LENS_KEEP_HIDDEN};
    if (lens_forward(m, &batch, &hidden_only, &a, &err) == 0) {
        if (lens_forward(m, &batch, &hidden_alone, &b, &err) == 0) {
            char what[160];
            snprintf(what, sizeof what, "%s hidden, attention not kept", name);
            same(what, a.hidden, b.hidden, (size_t)(c->n_layers + 1) * N * c->d_model);
            lens_activations_free(&b);
        }
        lens_activations_free(&a);
    }
    lens_pool_free(pool);
    lens_model_free(m);
}

/* Every kernel this CPU runs against the portable one (the oracle) on odd
 * shapes: M, N, K not multiples of the tiles (12 or 6 rows, 32 or 16
 * columns, KC 768, MC 240, OpenBLAS's column blocks of 256), x, W and y
 * rows padded past their ends, bias, both W layouts, prepacked and not, on
 * a 2-thread pool: within twice the K-term dot product's error bound. */
static void test_kernels_agree(void)
{
    static const int shapes[][3] = {{7, 45, 13}, {29, 77, 781}, {245, 300, 97}, {128, 259, 1539}, {1, 513, 40}};
    const lens_gemm_kernel before = lens_gemm_kernel_in_use();
    lens_pool *two = lens_pool_create(2);
    int n_compared = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int variant = 0; variant < 4; variant++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], w_kn = variant & 1, prepack = variant >> 1;
            const size_t ldx = (size_t)K + 3, ldy = (size_t)N + 9, ld = (w_kn ? (size_t)N : (size_t)K) + 5;
            float *x = uniform_floats((size_t)M * ldx, 1.0f), *w = uniform_floats((w_kn ? (size_t)K : (size_t)N) * ld, 1.0f);
            float *b = uniform_floats((size_t)N, 1.0f), *want = malloc(sizeof(float) * M * ldy);
            float *got = malloc(sizeof(float) * M * ldy);
            float *packed = aligned_alloc(64, sizeof(float) * (lens_gemm_packed_size(K, N) + 16));
            lens_gemm_pack(packed, w, K, N, ld, w_kn);
            lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = ldx, .packed = prepack ? packed : NULL, .w = w,
                                .ld = ld, .w_kn = w_kn, .alpha = 1.0f, .bias = b, .y = want, .ldy = ldy};
            lens_gemm_use_kernel(LENS_GEMM_PORTABLE);
            lens_gemm(&g, two);
            for (int k = LENS_GEMM_BLAS; k <= LENS_GEMM_AVX512; k++) {
                if (lens_gemm_use_kernel((lens_gemm_kernel)k)) continue;
                g.y = got;
                lens_gemm(&g, two);
                const size_t differ = products_differ(got, want, ldy, x, ldx, w, ld, w_kn, M, N, K, 1.0f, 0);
                CHECK(!differ, "kernel %s vs portable, M=%d N=%d K=%d %s %s: %zu of %d values differ",
                      lens_gemm_kernel_name((lens_gemm_kernel)k), M, N, K, w_kn ? "W[K][N]" : "W[N][K]",
                      prepack ? "prepacked" : "per-call", differ, M * N);
                n_compared++;
            }
            free(x), free(w), free(b), free(want), free(got), free(packed);
        }
    int others = 0;
    for (int k = LENS_GEMM_BLAS; k <= LENS_GEMM_AVX512; k++) others += lens_gemm_kernel_available((lens_gemm_kernel)k);
    CHECK(n_compared == 20 * others, "%d kernel comparisons, want %d", n_compared, 20 * others);
    lens_gemm_use_kernel(before);
    lens_pool_free(two);
}

int main(void)
{
    test_pool();
    /* LENS_GEMM_KERNEL, when set, picks the one kernel to test (run-tests.sh
     * runs the fixture tests that way); else every kernel this CPU runs */
    const char *forced = getenv("LENS_GEMM_KERNEL");
    const lens_gemm_kernel first = lens_gemm_kernel_in_use();
    for (int k = LENS_GEMM_AVX512; k >= LENS_GEMM_PORTABLE; k--) {
        if (forced && *forced ? k != (int)first : lens_gemm_use_kernel((lens_gemm_kernel)k) != 0) continue;
        printf("gemm: kernel %s\n", lens_gemm_kernel_name(lens_gemm_kernel_in_use()));
        test_gemm();
        test_half_weights();
        test_post();
        test_aliased_rows();
        test_linear_backward();
    }
    lens_gemm_use_kernel(first);
    test_kernels_agree();
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("shared checkpoints not found (../shared/models or $LENS_SHARED): forward with a pool not tested");
    } else {
        const char *models[] = {"bert-tiny-sst2", "bert-tiny-mlm", "gpt2-tiny-wikitext"};
        for (int i = 0; i < 3; i++) test_forward_pool(shared, models[i]);
    }
    return check_done("test_gemm");
}
