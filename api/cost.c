/* cost.c - the cost model of the synchronous analyses (see cost.h).
 *
 * Owns: the measured GEMM rate, the efficiency of each analysis relative to
 * it, their hints, and the up-front 413. Efficiencies were measured on the
 * shared 2-core development machine (docs/operations.md, "Cost model"):
 * the analysis' flop count / its wall time / the calibration rate measured
 * just before, rounded down. Large batched GEMMs (the exact hidden
 * attribution's T·C tangents, attribution's steps) run at about the
 * calibration rate (1.0-1.5, 0.8 kept; exact hidden attribution at 500
 * tokens on an idle machine: 57.9 TFLOP in 228 s against a 458 GFLOP/s
 * calibration, 0.55, so 0.5 kept); the key-aware identifiability
 * step is the Gram-matrix method of core/analysis/attention.c (16 GFLOP at
 * 125 tokens in 0.30 s on one thread, not faster on two: about 0.2 of a
 * 2-thread calibration rate, 0.2 kept); context mixing reached 0.6 (value
 * zeroing, 122 tokens on demo-identifiable: 13.8 GFLOP in 1.17 s against a
 * 14-27 GFLOP/s calibration of a loaded machine) to 0.9 (ALTI on BERT-base,
 * T = 128), 0.5 kept. */
#include "api/cost.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/base/blas.h"
#include "core/base/gemm.h"

typedef struct {
    const char *name;
    double efficiency; /* achieved flop rate / calibration GEMM rate */
    const char *hint;  /* what to do instead, for the 413 and the 503 */
} cost_model;

static const cost_model models[API_COST_N] = {
    [API_COST_HIDDEN_ATTRIBUTION] = {"hidden_attribution", 0.5,
                                     "use \"method\": \"estimate\", fewer tokens, or \"async\": true (a job of kind "
                                     "\"hidden-attribution\", no deadline)"},
    [API_COST_ATTRIBUTION] = {"attribution", 0.8,
                              "use fewer \"steps\" or tokens, or \"async\": true (a job of kind \"attribution\", no "
                              "deadline)"},
    [API_COST_IDENTIFIABILITY] = {"identifiability", 0.2,
                                  "use \"identifiability\": false, fewer tokens, or fewer \"layers\" / \"heads\""},
    [API_COST_DECOMPOSITION] = {"decomposition", 0.8,
                                "use fewer windows, or \"async\": true (a job of kind \"decomposition\", no deadline)"},
    [API_COST_TOKEN_IDENTITY] = {"token_identity", 0.5, "use fewer tokens or layers, or \"vocabulary\": false"},
    [API_COST_CONTEXT_MIXING] = {"context_mixing", 0.5,
                                 "use fewer tokens or \"layers\" up to a lower one, another \"method\" (value "
                                 "zeroing reruns each layer T + 1 times), or the job \"context-mixing\" (no deadline)"},
    /* make bench's patching section: 1.4 TFLOP as counted below in 62.8 s at load 8-12, about half the GEMM rate */
    [API_COST_PATCHING] = {"patching", 0.5,
                           "use fewer tokens or \"targets\", drop \"per_position\" (T runs per head), or \"method\": "
                           "\"attribution\" (one forward and one backward per run)"},
};

/* ------------------------------------------------------------ the rate */

static pthread_mutex_t rate_lock = PTHREAD_MUTEX_INITIALIZER;
static api_cost_rate rate;

/* GFLOP/s of g repeated until `seconds` have passed (at least once). */
static double gemm_rate(const lens_gemm_args *g, lens_pool *pool, double seconds)
{
    const double t0 = api_now();
    double t;
    int reps = 0;
    do {
        lens_gemm(g, pool);
        reps++;
        t = api_now();
    } while (t - t0 < seconds);
    return 2.0 * g->M * g->N * g->K * reps / (t - t0) * 1e-9;
}

/* y[M][N] = x[M][K] W[K][N] timed: GFLOP/s of this machine's GEMM with these
 * threads, the kernel every analysis spends most of its time in. The best of
 * TRIALS short windows after a warm-up: one 40 ms window measured 165-458
 * GFLOP/s between starts of the idle machine (the clock ramping up, the
 * pool's threads waking, another process taking a core for a time slice),
 * and every such stall only lowers a window, so the best one is the rate the
 * cores give the kernel, the one the efficiencies above were measured
 * against. */
static double measure_gflops(lens_pool *pool)
{
    enum { M = 256, N = 512, K = 512, TRIALS = 8 };
    const double warmup_s = 0.02, trial_s = 0.005;
    float *x = calloc((size_t)M * K, sizeof *x), *w = calloc((size_t)K * N, sizeof *w);
    float *y = calloc((size_t)M * N, sizeof *y);
    float *packed = aligned_alloc(64, (lens_gemm_packed_size(K, N) * sizeof *packed + 63) / 64 * 64);
    double best = 0;
    if (x && w && y && packed) {
        for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)(i % 7) * 0.125f;
        for (size_t i = 0; i < (size_t)K * N; i++) w[i] = (float)(i % 5) * 0.25f;
        lens_gemm_pack(packed, w, K, N, N, 1); /* as model weights are, once at load */
        /* W as the kernel in use reads model weights: packed, or as mapped for OpenBLAS */
        lens_gemm_args g = {.M = M, .N = N, .K = K, .x = x, .ldx = K, .packed = lens_gemm_packs_weights() ? packed : NULL,
                            .w = w, .ld = N, .w_kn = 1, .alpha = 1, .y = y, .ldy = N};
        gemm_rate(&g, pool, warmup_s); /* caches, page faults, the pool's threads, the clock */
        for (int i = 0; i < TRIALS; i++) {
            const double r = gemm_rate(&g, pool, trial_s);
            if (r > best) best = r;
        }
    }
    free(x), free(w), free(y), free(packed);
    return best;
}

const api_cost_rate *api_cost_calibrate(int threads)
{
    pthread_mutex_lock(&rate_lock);
    if (rate.gflops <= 0) {
        double t0 = api_now();
        if (threads < 1) threads = 1;
        lens_pool *pool = lens_pool_create(threads); /* NULL: this thread alone */
        rate.gflops = measure_gflops(pool);
        lens_pool_free(pool);
        if (!(rate.gflops > 0)) rate.gflops = 1; /* out of memory: refuse little rather than much */
        rate.threads = threads;
        rate.calibration_ms = (api_now() - t0) * 1e3;
    }
    pthread_mutex_unlock(&rate_lock);
    return &rate;
}

void api_cost_set_rate(double gflops, int threads)
{
    pthread_mutex_lock(&rate_lock);
    rate.gflops = gflops, rate.threads = threads, rate.calibration_ms = 0;
    pthread_mutex_unlock(&rate_lock);
}

void api_cost_write_info(jw *w)
{
    const api_cost_rate *r = api_cost_calibrate(lens_blas_threads());
    jw_key(w, "cost_model");
    jw_obj(w);
    jw_key(w, "gemm_gflops");
    jw_float(w, r->gflops, 1);
    jw_key(w, "threads");
    jw_int(w, r->threads);
    jw_key(w, "calibration_ms");
    jw_float(w, r->calibration_ms, 1);
    jw_key(w, "efficiency");
    jw_obj(w);
    for (int k = 0; k < API_COST_N; k++) {
        jw_key(w, models[k].name);
        jw_float(w, models[k].efficiency, 3);
    }
    jw_end(w);
    jw_end(w);
}

/* ------------------------------------------------------- flop counts */

double api_cost_forward_flops(const lens_config *cfg, int T, int n_layers)
{
    const double C = cfg->d_model, KV = lens_kv_heads(cfg);
    const double Q = (double)cfg->n_heads * cfg->d_head_k, O = (double)cfg->n_heads * cfg->d_head_v;
    const double K = KV * cfg->d_head_k, V = KV * cfg->d_head_v; /* grouped-query attention: fewer k, v heads */
    const double maps = cfg->glu ? 3 : 2; /* gate, up and down, or the two maps */
    /* a mixture of experts runs K experts of its width per token, plus its router */
    const double F = cfg->n_experts ? (double)cfg->top_k * cfg->d_ff_expert : cfg->d_ff;
    const double router = cfg->n_experts ? C * cfg->n_experts : 0;
    /* projections q, k, v, o and the MLP, then the T x T scores and mixing */
    const double per_layer = 2.0 * T * (C * (Q + K + V) + O * C + maps * C * F + router) + 2.0 * T * T * (Q + O);
    return per_layer * n_layers;
}

/* ------------------------------------------------------- the check */

void api_cost_hint(api_call *c, api_cost_kind kind) { c->hint = models[kind].hint; }

int api_cost_check(api_call *c, api_cost_kind kind, double flops, const char *field)
{
    api_cost_hint(c, kind);
    const int synchronous = c->ctx->state && !c->progress; /* a server request, not a job or the CLI */
    if (!synchronous || c->ctx->timeout <= 0) return 0;
    const api_cost_rate *r = api_cost_calibrate(lens_pool_threads(c->threads));
    const double seconds = flops * 1e-9 / (r->gflops * models[kind].efficiency);
    const double left = c->ctx->timeout - (api_now() - c->t_start);
    if (seconds <= left) return 0;
    return api_fail(c, 413, "too_many_tokens", field,
                    "%s of %d tokens costs about %.0f GFLOP: %.1f s at this server's measured %.0f GFLOP/s x %.2f, "
                    "over the %.1f s left of its %g s deadline; %s",
                    models[kind].name, c->n_tokens, flops * 1e-9, seconds, r->gflops, models[kind].efficiency,
                    left > 0 ? left : 0, c->ctx->timeout, models[kind].hint);
}
