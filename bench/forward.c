/* forward.c - the lensd side of the forward-pass benchmark (bench/run.sh).
 *
 *   forward --mkmodel DIR [--task encoder] [--seed S]
 *       writes a random BERT-base checkpoint (lens_mkmodel) into DIR.
 *   forward --sgemm [--size 2048] [--threads n] [--reps R]
 *       times cblas_sgemm on size x size matrices: the machine's ceiling.
 *   forward --gemm M,K,N [--dtype f32|bf16|f16] [--threads n] [--reps R]
 *       times lens_gemm (prepacked random W of that dtype, bias) on x[M][K] -> y[M][N]
 *       four times: rows of x and y stored at their width (ldx = K, ldy = N)
 *       or padded by 16 floats, each alone and both, one JSON line each:
 *       what the 4 KiB aliasing of a stride of 1024 floats (or a multiple)
 *       costs on the input and on the output side (gemm.h).
 *   forward --kernels M,K,N [--threads n] [--reps R]
 *       y[M][N] = x[M][K] W[K][N] + bias with every GEMM kernel this CPU runs
 *       (gemm.h: avx512, avx2, blas, portable; W prepacked, or as mapped for
 *       blas, as the loader leaves it) and with OpenBLAS's cblas_sgemm itself
 *       (no bias), in R rounds that run each once in turn, so a change of
 *       load hits all alike: one JSON line each, median CPU ms and GFLOP/s,
 *       and the kernel's rate over sgemm's.
 *   forward --model DIR --T 128 --batch 1 --threads 2 --reps R [--warmup W]
 *           [--seed S] [--dump FILE] [--dump-logits FILE]
 *       times lens_forward on S = batch sequences of T tokens packed into one
 *       lens_batch (N = S*T rows, no padding) with a lens_pool of --threads
 *       threads (OpenBLAS at one thread); --dump writes the final hidden
 *       states [N][C] as raw float32 for the correctness guard; --dump-logits
 *       (a causal LM, batch 1) the last position's logits [V] (the llama-1b
 *       section checks them against bench/llama_peer.py's).
 *
 * Every mode prints one JSON line on stdout. Token ids come from xorshift32
 * seeded with --seed, id = x mod V for each of the N tokens in packed order;
 * bench/peer/torch_forward.py and ort_forward.mjs draw the same sequence, so
 * all three implementations see identical inputs.
 *
 * FLOPs of one forward (matmuls only): S times the cost model's count for
 * T tokens (api/cost.c: q, k and v at their head counts, o, the MLP's two or
 * three maps, q k^T and P v), so "gflops" is on the scale of /v1/info's
 * calibrated rate. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "api/cost.h"
#include "bench/bench.h"
#include "core/base/blas.h"
#include "core/base/gemm.h"
#include "core/base/heap.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"

typedef struct {
    const char *model_dir, *mkmodel_dir, *task, *dump, *dump_logits, *gemm, *kernels;
    int sgemm, size, T, batch, threads, reps, warmup;
    lens_dtype gemm_dtype; /* --gemm's W: F32 (lens_gemm_pack) or BF16/F16 (lens_gemm_pack_half) */
    unsigned seed;
} options;

/* Median, min and max of times[n]; sorts times in place. */
static void summarize(double *times, int n, double *median, double *min, double *max)
{
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    *median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    *min = times[0], *max = times[n - 1];
}

/* xorshift32 (Marsaglia); the peers implement the same three shifts. */
static int run_mkmodel(const options *o)
{
    lens_err err = {0};
    double t0 = now_ms();
    if (lens_mkmodel("bert", "base", o->task, o->seed, o->mkmodel_dir, &err)) {
        fprintf(stderr, "forward: mkmodel %s: %s\n", o->mkmodel_dir, err.msg);
        return 1;
    }
    printf("{\"mode\":\"mkmodel\",\"dir\":\"%s\",\"task\":\"%s\",\"ms\":%.0f}\n", o->mkmodel_dir, o->task,
           now_ms() - t0);
    return 0;
}

static int run_sgemm(const options *o)
{
    const size_t n = (size_t)o->size;
    float *a = malloc(n * n * sizeof(float)), *b = malloc(n * n * sizeof(float)), *c = malloc(n * n * sizeof(float));
    double *times = malloc(sizeof(double) * (size_t)o->reps);
    if (!a || !b || !c || !times) {
        fprintf(stderr, "forward: out of memory for sgemm %zu\n", n);
        return 1;
    }
    uint32_t state = o->seed;
    for (size_t i = 0; i < n * n; i++) {
        a[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
        b[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
    }
    lens_blas_set_threads(o->threads);
    for (int r = -o->warmup; r < o->reps; r++) {
        double t0 = now_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, o->size, o->size, o->size, 1.0f, a, o->size, b,
                    o->size, 0.0f, c, o->size);
        if (r >= 0) times[r] = now_ms() - t0;
    }
    double med, min, max;
    summarize(times, o->reps, &med, &min, &max);
    double gflop = 2.0 * n * n * n * 1e-9;
    printf("{\"impl\":\"sgemm\",\"size\":%d,\"threads\":%d,\"reps\":%d,\"ms_median\":%.3f,\"ms_min\":%.3f,"
           "\"gflops\":%.2f,\"gflops_best\":%.2f,\"blas_core\":\"%s\",\"blas_core_source\":\"%s\"}\n",
           o->size, o->threads, o->reps, med, min, gflop / (med * 1e-3), gflop / (min * 1e-3), lens_blas_core(),
           lens_blas_core_source());
    free(a), free(b), free(c), free(times);
    return 0;
}

/* lens_gemm on x[M][K] (row stride ldx) and prepacked W[K][N] into y (row
 * stride ldy), with the forward's pool; median ms of o->reps after warm-up. */
static double time_gemm(const options *o, lens_pool *pool, int M, int K, int N, size_t ldx, size_t ldy,
                        const void *packed, const float *bias, double *cpu_med)
{
    float *x = malloc(sizeof(float) * (size_t)M * ldx), *y = malloc(sizeof(float) * (size_t)M * ldy);
    double *times = malloc(sizeof(double) * (size_t)o->reps), *cpu = malloc(sizeof(double) * (size_t)o->reps);
    double med = -1;
    if (x && y && times && cpu) {
        uint32_t state = o->seed;
        for (size_t i = 0; i < (size_t)M * ldx; i++) x[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
        const lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = ldx, .packed = packed,
                                  .w_dtype = o->gemm_dtype, .alpha = 1.0f, .bias = bias, .y = y, .ldy = ldy};
        for (int r = -o->warmup; r < o->reps; r++) {
            double t0 = now_ms(), c0 = cpu_ms();
            lens_gemm(&g, pool);
            if (r >= 0) times[r] = now_ms() - t0, cpu[r] = cpu_ms() - c0;
        }
        med = median(times, o->reps);
        *cpu_med = median(cpu, o->reps);
    }
    free(x), free(y), free(times), free(cpu);
    return med;
}

static int run_gemm(const options *o)
{
    int M = 0, K = 0, N = 0;
    if (sscanf(o->gemm, "%d,%d,%d", &M, &K, &N) != 3 || M < 1 || K < 1 || N < 1) {
        fprintf(stderr, "forward: --gemm wants M,K,N (positive)\n");
        return 2;
    }
    float *w = malloc(sizeof(float) * (size_t)K * N), *bias = malloc(sizeof(float) * (size_t)N);
    void *half = o->gemm_dtype == LENS_DT_F32 ? NULL : malloc(sizeof(uint16_t) * (size_t)K * N);
    void *packed = aligned_alloc(64, (lens_gemm_packed_size(K, N) * lens_dtype_size(o->gemm_dtype) + 63) & ~(size_t)63);
    lens_pool *pool = o->threads > 1 ? lens_pool_create(o->threads) : NULL;
    if (!w || !bias || !packed || (o->gemm_dtype != LENS_DT_F32 && !half) || (o->threads > 1 && !pool)) {
        fprintf(stderr, "forward: out of memory for gemm %d x %d x %d\n", M, K, N);
        return 1;
    }
    uint32_t state = o->seed + 1;
    for (size_t i = 0; i < (size_t)K * N; i++) w[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
    for (int i = 0; i < N; i++) bias[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
    if (half) {
        lens_narrow(half, w, o->gemm_dtype, (size_t)K * N);
        lens_gemm_pack_half(packed, half, K, N, (size_t)N, 1);
    } else {
        lens_gemm_pack(packed, w, K, N, (size_t)N, 1);
    }
    const double gflop = 2.0 * M * K * N * 1e-9;
    /* An untimed pass first: Linux starts the pool's new worker on the
     * caller's core and moves it only after tens of ms, so the first
     * variant timed at two threads measured one core's rate (79 against
     * 190 GFLOP/s at 128 x 2048 x 512, whichever variant came first). */
    double cpu_warm = 0;
    time_gemm(o, pool, M, K, N, (size_t)K, (size_t)N, packed, bias, &cpu_warm);
    for (int v = 0; v < 4; v++) {
        const int pad_x = v & 1 ? 16 : 0, pad_y = v & 2 ? 16 : 0;
        double cpu = 0;
        const double ms = time_gemm(o, pool, M, K, N, (size_t)(K + pad_x), (size_t)(N + pad_y), packed, bias, &cpu);
        if (ms < 0) {
            fprintf(stderr, "forward: out of memory for gemm %d x %d x %d\n", M, K, N);
            return 1;
        }
        printf("{\"impl\":\"gemm\",\"M\":%d,\"K\":%d,\"N\":%d,\"dtype\":\"%s\",\"ldx\":%d,\"ldy\":%d,\"threads\":%d,"
               "\"reps\":%d,\"ms_median\":%.4f,\"gflops\":%.2f,\"cpu_ms_median\":%.4f}\n",
               M, K, N, lens_dtype_name(o->gemm_dtype), K + pad_x, N + pad_y, o->threads, o->reps, ms,
               gflop / (ms * 1e-3), cpu);
    }
    lens_pool_free(pool);
    free(w), free(bias), free(half), free(packed);
    return 0;
}

/* One timed product for run_kernels: impl < 0 is cblas_sgemm, else the
 * lens_gemm kernel impl. CPU ms (what a 1-thread run costs when other
 * processes take slices of the core). */
static double time_impl(int impl, const lens_gemm_args *g, const float *w, lens_pool *pool)
{
    const double c0 = cpu_ms();
    if (impl < 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->M, g->N, g->K, 1.0f, g->x, (int)g->ldx, w, g->N, 0.0f,
                    g->y, (int)g->ldy);
    } else {
        lens_gemm_use_kernel((lens_gemm_kernel)impl);
        lens_gemm_args k = *g;
        if (!lens_gemm_packs_weights()) k.packed = NULL;
        lens_gemm(&k, pool);
    }
    return cpu_ms() - c0;
}

static int run_kernels(const options *o)
{
    int M = 0, K = 0, N = 0;
    if (sscanf(o->kernels, "%d,%d,%d", &M, &K, &N) != 3 || M < 1 || K < 1 || N < 1) {
        fprintf(stderr, "forward: --kernels wants M,K,N (positive)\n");
        return 2;
    }
    enum { IMPLS = 5 }; /* sgemm, then lens_gemm_kernel 0 .. 3 */
    float *x = malloc(sizeof(float) * (size_t)M * K), *w = malloc(sizeof(float) * (size_t)K * N);
    float *bias = malloc(sizeof(float) * (size_t)N), *y = malloc(sizeof(float) * (size_t)M * N);
    float *packed = lens_gemm_alloc_packed(lens_gemm_packed_size(K, N));
    double *times = malloc(sizeof(double) * IMPLS * (size_t)o->reps);
    lens_pool *pool = o->threads > 1 ? lens_pool_create(o->threads) : NULL;
    if (!x || !w || !bias || !y || !packed || !times || (o->threads > 1 && !pool)) {
        fprintf(stderr, "forward: out of memory for kernels %d x %d x %d\n", M, K, N);
        return 1;
    }
    uint32_t state = o->seed;
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
    for (size_t i = 0; i < (size_t)K * N; i++) w[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
    for (int i = 0; i < N; i++) bias[i] = (float)xorshift32(&state) / 4294967296.0f - 0.5f;
    lens_gemm_pack(packed, w, K, N, (size_t)N, 1);
    lens_blas_set_threads(o->threads);
    const lens_gemm_kernel chosen = lens_gemm_kernel_in_use();
    const lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = (size_t)K, .packed = packed, .w = w,
                              .ld = (size_t)N, .w_kn = 1, .alpha = 1.0f, .bias = bias, .y = y, .ldy = (size_t)N};
    for (int r = -o->warmup; r < o->reps; r++)
        for (int impl = -1; impl < IMPLS - 1; impl++) {
            if (impl >= 0 && !lens_gemm_kernel_available((lens_gemm_kernel)impl)) continue;
            const double ms = time_impl(impl, &g, w, pool);
            if (r >= 0) times[(size_t)(impl + 1) * o->reps + r] = ms;
        }
    lens_gemm_use_kernel(chosen);
    const double gflop = 2.0 * M * K * N * 1e-9, sgemm_ms = median(times, o->reps);
    for (int impl = -1; impl < IMPLS - 1; impl++) {
        if (impl >= 0 && !lens_gemm_kernel_available((lens_gemm_kernel)impl)) continue;
        const double ms = median(times + (size_t)(impl + 1) * o->reps, o->reps);
        printf("{\"impl\":\"kernel\",\"kernel\":\"%s\",\"chosen\":%s,\"M\":%d,\"K\":%d,\"N\":%d,\"threads\":%d,"
               "\"reps\":%d,\"cpu_ms_median\":%.4f,\"gflops\":%.2f,\"vs_sgemm\":%.3f}\n",
               impl < 0 ? "sgemm" : lens_gemm_kernel_name((lens_gemm_kernel)impl),
               impl >= 0 && impl == (int)chosen ? "true" : "false", M, K, N, o->threads, o->reps, ms,
               gflop / (ms * 1e-3), sgemm_ms / ms);
    }
    lens_pool_free(pool);
    free(x), free(w), free(bias), free(y), free(packed), free(times);
    return 0;
}

/* One more forward after the timing, keeping `keep` (LENS_KEEP_HIDDEN or
 * LENS_KEEP_LOGITS), written to path as raw float32: the final hidden states
 * [N][C], or the last position's logits [V] (a causal LM). */
static int dump_forward(const lens_model *m, const lens_batch *batch, lens_pool *pool, unsigned keep, const char *path)
{
    lens_err err = {0};
    lens_activations act;
    lens_forward_opts opts = {.keep = keep, .pool = pool};
    if (lens_forward(m, batch, &opts, &act, &err)) {
        fprintf(stderr, "forward: dump forward: %s\n", err.msg);
        return -1;
    }
    const float *rows = NULL;
    size_t count = 0;
    if (keep == LENS_KEEP_HIDDEN) {
        count = (size_t)act.n_tokens * m->cfg.d_model;
        rows = act.hidden + (size_t)act.n_layers * count; /* [N][C] after the last layer */
    } else if ((rows = lens_act_logits(m, &act, batch->n_seqs - 1))) {
        count = (size_t)m->cfg.vocab_size;
        rows += (size_t)(batch->lengths[batch->n_seqs - 1] - 1) * count; /* [V] of the last position */
    }
    FILE *f = rows ? fopen(path, "wb") : NULL;
    int rc = f && fwrite(rows, sizeof(float), count, f) == count ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    if (rc) fprintf(stderr, "forward: cannot write %s%s\n", path, rows ? "" : " (the model has no LM head)");
    lens_activations_free(&act);
    return rc;
}

static int run_forward(const options *o)
{
    lens_err err = {0};
    double t0 = now_ms();
    lens_model *m = lens_model_load(o->model_dir, &err);
    if (!m) {
        fprintf(stderr, "forward: %s: %s\n", o->model_dir, err.msg);
        return 1;
    }
    const double load_ms = now_ms() - t0;
    const lens_config *c = &m->cfg;
    if (o->T > c->max_positions) {
        fprintf(stderr, "forward: T=%d exceeds max_positions %d\n", o->T, c->max_positions);
        lens_model_free(m);
        return 1;
    }
    const int S = o->batch, N = o->T * o->batch;
    int *ids = malloc(sizeof(int) * (size_t)N), *lengths = malloc(sizeof(int) * (size_t)S);
    double *times = malloc(sizeof(double) * (size_t)o->reps), *cpu = malloc(sizeof(double) * (size_t)o->reps);
    if (!ids || !lengths || !times || !cpu) {
        fprintf(stderr, "forward: out of memory\n");
        return 1;
    }
    uint32_t state = o->seed;
    for (int n = 0; n < N; n++) ids[n] = (int)(xorshift32(&state) % (uint32_t)c->vocab_size);
    for (int s = 0; s < S; s++) lengths[s] = o->T;
    const lens_batch batch = {.n_seqs = S, .lengths = lengths, .ids = ids, .type_ids = NULL};
    /* the forward is threaded by its pool alone (core/base/pool.h): OpenBLAS at 1 */
    lens_blas_set_threads(1);
    lens_pool *pool = o->threads > 1 ? lens_pool_create(o->threads) : NULL;
    if (o->threads > 1 && !pool) {
        fprintf(stderr, "forward: cannot start %d threads\n", o->threads);
        return 1;
    }
    const lens_forward_opts opts = {.keep = 0, .pool = pool}; /* hidden states stay in per-call scratch */

    for (int r = -o->warmup; r < o->reps; r++) {
        lens_activations act;
        double start = now_ms(), cpu_start = cpu_ms();
        if (lens_forward(m, &batch, &opts, &act, &err)) {
            fprintf(stderr, "forward: %s\n", err.msg);
            return 1;
        }
        double ms = now_ms() - start;
        lens_activations_free(&act);
        if (r >= 0) times[r] = ms, cpu[r] = cpu_ms() - cpu_start;
    }
    const long rss = maxrss_kib(), huge = anon_huge_kib(); /* before the dump, which keeps all L+1 hidden states */
    double med, min, max;
    summarize(times, o->reps, &med, &min, &max);
    const double gflop = S * api_cost_forward_flops(c, o->T, c->n_layers) * 1e-9; /* what /v1/info's rate is set against */
    if (o->dump && dump_forward(m, &batch, pool, LENS_KEEP_HIDDEN, o->dump)) return 1;
    if (o->dump_logits && dump_forward(m, &batch, pool, LENS_KEEP_LOGITS, o->dump_logits)) return 1;
    lens_pool_free(pool);
    printf("{\"impl\":\"lensd\",\"T\":%d,\"batch\":%d,\"threads\":%d,\"reps\":%d,\"warmup\":%d,"
           "\"ms_median\":%.3f,\"ms_min\":%.3f,\"ms_max\":%.3f,\"gflop\":%.4f,\"gflops\":%.2f,"
           "\"cpu_ms_median\":%.3f,\"load_ms\":%.1f,\"maxrss_kib\":%ld,\"anon_huge_kib\":%ld,\"blas_core\":\"%s\","
           "\"kernel\":\"%s\"}\n",
           o->T, o->batch, o->threads, o->reps, o->warmup, med, min, max, gflop, gflop / (med * 1e-3),
           median(cpu, o->reps), load_ms, rss, huge, lens_blas_core(), lens_gemm_kernel_name(lens_gemm_kernel_in_use()));
    free(ids), free(lengths), free(times), free(cpu);
    lens_model_free(m);
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: forward --model DIR [--T 128] [--batch 1] [--threads 1] [--reps 5] [--warmup 1]\n"
            "               [--seed 42] [--dump FILE] [--dump-logits FILE]\n"
            "       forward --sgemm [--size 2048] [--threads 1] [--reps 5]\n"
            "       forward --gemm M,K,N [--dtype f32|bf16|f16] [--threads 1] [--reps 5]\n"
            "       forward --kernels M,K,N [--threads 1] [--reps 5]\n"
            "       forward --mkmodel DIR [--task encoder] [--seed 42]\n");
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    options o = {.task = "encoder", .size = 2048, .T = 128, .batch = 1, .threads = 1, .reps = 5, .warmup = 1,
                 .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--sgemm")) {
            o.sgemm = 1;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) o.model_dir = v;
        else if (!strcmp(a, "--mkmodel")) o.mkmodel_dir = v;
        else if (!strcmp(a, "--task")) o.task = v;
        else if (!strcmp(a, "--dump")) o.dump = v;
        else if (!strcmp(a, "--gemm")) o.gemm = v;
        else if (!strcmp(a, "--kernels")) o.kernels = v;
        else if (!strcmp(a, "--dtype")) {
            if (lens_dtype_parse(v, &o.gemm_dtype)) {
                usage();
                return 2;
            }
        }
        else if (!strcmp(a, "--dump-logits")) o.dump_logits = v;
        else if (!strcmp(a, "--size")) o.size = atoi(v);
        else if (!strcmp(a, "--T")) o.T = atoi(v);
        else if (!strcmp(a, "--batch")) o.batch = atoi(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--warmup")) o.warmup = atoi(v);
        else if (!strcmp(a, "--seed")) o.seed = (unsigned)strtoul(v, NULL, 10);
        else {
            usage();
            return 2;
        }
    }
    if (o.seed == 0) o.seed = 1; /* xorshift32 stays at 0 forever */
    if (o.size < 1 || o.T < 1 || o.batch < 1 || o.threads < 1 || o.reps < 1 || o.warmup < 0) {
        usage();
        return 2;
    }
    if (o.mkmodel_dir) return run_mkmodel(&o);
    if (o.sgemm) return run_sgemm(&o);
    if (o.gemm) return run_gemm(&o);
    if (o.kernels) return run_kernels(&o);
    if (o.model_dir) return run_forward(&o);
    usage();
    return 2;
}
