/* hidden_attribution.c - hidden token attribution, Brunner et al. ICLR 2020.
 *
 *     c^l_{j,i} = ‖∂h^l_j/∂h^0_i‖_F / Σ_k ‖∂h^l_j/∂h^0_k‖_F
 *
 * (formula, conventions and shapes in hidden_attribution.h; the math and the
 * measurements in docs/hidden-attribution.md).
 *
 * How it is computed, for one sequence of T tokens:
 *  - a primal pass from h^0 caches what the derivatives read: q, k, v, the
 *    attention probabilities, every LayerNorm's input and statistics, the
 *    GELU input;
 *  - forward mode: B input directions (tangents dh^0, each [T][C]) are
 *    packed as B*T rows, so every linear map is one GEMM of B*T rows. A
 *    tangent is pushed through the layers once and read after each layer:
 *    one pass gives ∂h^l/∂h^0 · dh^0 for every l (reverse mode would need a
 *    separate sweep per output layer, and T*C cotangents per sweep);
 *  - exact: the T*C one-hot directions e_{i,c}; ‖∂h^l_j/∂h^0_i‖_F² =
 *    Σ_c ‖(J e_{i,c})_j‖²;
 *  - estimate: P Rademacher directions per input token i; the probe mean
 *    of ‖(J v)_j‖² and its standard error.
 * The JVP of each op sits next to the comment of the forward line it
 * differentiates. */
#include "core/analysis/hidden_attribution.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/model/arch.h"
#include "core/model/embedding.h"
#include "core/nn/ops.h"

#define DEFAULT_PROBES 16
#define DEFAULT_SCRATCH ((size_t)256 << 20)
/* the blocks' row-wise tail Jacobians, [top][T][C][C] packed plus one layer
 * unpacked while forming: held up to this, else the tangents go through the
 * tail's own JVP (BERT-small at T = 128: 640 MiB) */
#define MAX_ROW_JAC ((size_t)1 << 30)

/* The primal pass: each layer's lens_block_cache (what the family's block
 * JVP reads) and attention probabilities, the final norm's cache. */
typedef struct {
    const lens_model *m;
    int T, L, C, QK, VO, F, NH, causal;
    lens_block_cache *cache;   /* [L], T rows */
    lens_block_cache final;    /* final norm (pre-norm families) */
    float *probs;              /* [L][NH][T][T] */
    float *row_jac;            /* [top][T][packed C x C] block_row_jacobian of each layer, or NULL */
    size_t row_jac_layer;      /* floats per layer: T * lens_gemm_packed_size(C, C) */
    /* primal work [T][...] */
    float *x, *h, *n, *ctx, *ff;
} primal;

static void *zalloc(size_t n, int *failed)
{
    void *p = calloc(n ? n : 1, sizeof(float));
    if (!p) *failed = 1;
    return p;
}

static void primal_free(primal *p)
{
    if (p->cache)
        for (int l = 0; l < p->L; l++) lens_block_cache_free(&p->cache[l]);
    free(p->cache);
    lens_block_cache_free(&p->final);
    free(p->probs), free(p->row_jac), free(p->x), free(p->h), free(p->n), free(p->ctx), free(p->ff);
    memset(p, 0, sizeof *p);
}

static int primal_init(primal *p, const lens_model *m, int T)
{
    const lens_config *c = &m->cfg;
    memset(p, 0, sizeof *p);
    p->m = m, p->T = T, p->L = c->n_layers, p->C = c->d_model, p->NH = c->n_heads;
    p->F = lens_ff_cols(m); /* the MLP buffer's columns: gate and up of a gated MLP */
    p->QK = c->n_heads * c->d_head_k, p->VO = c->n_heads * c->d_head_v;
    p->causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    int failed = 0;
    const size_t t = (size_t)T;
    p->cache = calloc((size_t)p->L, sizeof *p->cache);
    if (!p->cache) return -1;
    for (int l = 0; l < p->L; l++)
        if (lens_block_cache_init(&p->cache[l], m, l, T, 0)) failed = 1;
    if (lens_block_cache_init(&p->final, m, p->L, T, 0)) failed = 1;
    p->probs = zalloc((size_t)p->L * p->NH * t * t, &failed);
    p->x = zalloc(t * p->C, &failed), p->h = zalloc(t * p->C, &failed), p->n = zalloc(t * p->C, &failed);
    p->ctx = zalloc(t * p->VO, &failed), p->ff = zalloc(t * p->F, &failed);
    if (failed) {
        primal_free(p);
        return -1;
    }
    return 0;
}

/* attend hook of the primal: the one sequence, probabilities kept */
static void primal_attend(lens_block_io *io, int l)
{
    const primal *p = io->attend_ctx;
    const lens_config *c = &p->m->cfg;
    const size_t TT = (size_t)p->T * p->T;
    const lens_score_fn f = lens_model_scores(p->m, l, p->causal);
    lens_attention_forward(io->ctx, p->probs + (size_t)l * p->NH * TT, TT, io->q, io->k, io->v, p->T, p->NH,
                           c->d_head_k, c->d_head_v, &f);
}

/* The layers from h^0 (the family's block forward, caching); hidden
 * [L+1][T][C] when non-NULL (layer L after the final norm, as HF). */
static void primal_run(primal *p, const float *h0, float *hidden, lens_pool *pool)
{
    const lens_model *m = p->m;
    const size_t TC = (size_t)p->T * p->C;
    memcpy(p->x, h0, sizeof(float) * TC);
    if (hidden) memcpy(hidden, h0, sizeof(float) * TC);
    lens_block_io io = {.N = p->T, .x = p->x, .h = p->h, .n = p->n, .ctx = p->ctx, .ff = p->ff, .pool = pool,
                        .attend = primal_attend, .attend_ctx = p};
    for (int l = 0; l < p->L; l++) {
        io.cache = &p->cache[l];
        io.q = io.cache->q, io.k = io.cache->k, io.v = io.cache->v;
        lens_block_forward(m, &io, l);
        if (hidden) memcpy(hidden + (size_t)(l + 1) * TC, p->x, sizeof(float) * TC);
    }
    io.cache = &p->final;
    lens_block_forward(m, &io, p->L);
    if (hidden) memcpy(hidden + (size_t)p->L * TC, p->x, sizeof(float) * TC);
}

int lens_hta_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *h0, lens_err *err)
{
    const lens_config *c = &m->cfg;
    if (T < 1 || T > c->max_positions)
        return lens_fail(err, LENS_ELIMIT, "sequence of %d tokens (the model takes 1..%d)", T, c->max_positions);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size) return lens_fail(err, LENS_EINVAL, "token id %d out of range", ids[t]);
    lens_embed_forward(m, ids, lens_has_cap(c, LENS_CAP_SEGMENTS) ? type_ids : NULL, T, h0, NULL, NULL, NULL);
    return 0;
}

int lens_hta_forward_from(const lens_model *m, const float *h0, int T, float *hidden, lens_err *err)
{
    primal p;
    if (primal_init(&p, m, T)) return lens_fail(err, LENS_ENOMEM, "out of memory");
    primal_run(&p, h0, hidden, NULL);
    primal_free(&p);
    return 0;
}

/* ---- JVPs over B tangents, R = B*T rows: the family's block JVP ---- */

typedef struct {
    float *tx, *tn, *tq, *tk, *tv, *tctx, *th, *tff, *dS, *xhat;
    const primal *p;
} tangents;

static void tangents_free(tangents *t)
{
    free(t->tx), free(t->tn), free(t->tq), free(t->tk), free(t->tv), free(t->tctx), free(t->th), free(t->tff);
    free(t->dS), free(t->xhat);
    memset(t, 0, sizeof *t); /* tangents_init frees on failure and its caller frees every set again */
}

static int tangents_init(tangents *t, const primal *p, int B)
{
    int failed = 0;
    const size_t R = (size_t)B * p->T;
    memset(t, 0, sizeof *t);
    t->p = p;
    t->tx = zalloc(R * p->C, &failed), t->tn = zalloc(R * p->C, &failed), t->th = zalloc(R * p->C, &failed);
    t->tq = zalloc(R * p->QK, &failed), t->tk = zalloc(R * p->QK, &failed);
    t->tv = zalloc(R * p->VO, &failed), t->tctx = zalloc(R * p->VO, &failed);
    /* tff also takes the one-row products of the first layer, [B][max(QK, VO)] */
    t->tff = zalloc(R * p->F > (size_t)B * (p->QK > p->VO ? p->QK : p->VO) ? R * p->F
                                                                         : (size_t)B * (p->QK > p->VO ? p->QK : p->VO),
                    &failed);
    t->dS = zalloc(2 * (size_t)p->T * p->T, &failed) /* the soft-cap's derivative after dS */, t->xhat = zalloc((size_t)p->C, &failed);
    if (failed) tangents_free(t);
    return failed ? -1 : 0;
}

/* attend_jvp hook: tangent ctx of the B tangents from the primal's probabilities */
static void tangent_attend(lens_block_io *io, int l)
{
    tangents *t = io->attend_ctx;
    const primal *p = t->p;
    const lens_config *c = &p->m->cfg;
    const size_t TT = (size_t)p->T * p->T;
    const lens_score_fn f = lens_model_scores(p->m, l, p->causal);
    lens_attention_jvp(io->ctx, io->q, io->k, io->v, io->cache->q, io->cache->k, io->cache->v,
                       p->probs + (size_t)l * p->NH * TT, TT, io->N / p->T, p->T, p->NH, c->d_head_k, c->d_head_v,
                       &f, t->dS);
}

/* One layer's JVP: t->tx [B][T][C] in, t->tx out; row >= 0: every tangent
 * is zero except that row (the first layer sees one input token). */
static void layer_jvp(tangents *t, int l, int B, int row)
{
    const primal *p = t->p;
    lens_block_io io = {.N = B * p->T, .x = t->tx, .h = t->th, .n = t->tn, .q = t->tq, .k = t->tk, .v = t->tv,
                        .ctx = t->tctx, .ff = t->tff, .cache = &p->cache[l], .jvp_row = row, .row_scratch = t->xhat, .attend_jvp = tangent_attend, .attend_ctx = t,
                        .row_jac = p->row_jac ? p->row_jac + l * p->row_jac_layer : NULL};
    lens_block_jvp(p->m, &io, l);
}

/* The final norm's JVP in place on t->tx (pre-norm families' layer L). */
static void final_jvp(tangents *t, int B)
{
    const primal *p = t->p;
    lens_block_io io = {.N = B * p->T, .x = t->tx, .h = t->th, .n = t->tn, .cache = (lens_block_cache *)&p->final,
                        .jvp_row = -1, .row_scratch = t->xhat};
    lens_block_jvp(p->m, &io, p->L);
}

/* Flops of one tangent row through the row-wise tail of a block: the
 * MLP's two maps (gate and up counted by lens_ff_cols), norms neglected. */
static double tail_flops(const lens_model *m)
{
    return 2.0 * m->cfg.d_model * ((double)lens_ff_cols(m) + m->cfg.d_ff);
}

/* Whether the sweep of P tangents per token applies the tails as explicit
 * Jacobians: forming them pushes C one-hot tangents per row through each
 * tail (C·T rows), applying them costs 2·C² per row instead of the tail;
 * worth it when P·T·(tail − 2C²) > C·tail (exact, P = C: from T = 2 on),
 * and only within MAX_ROW_JAC. */
static int use_row_jac(const lens_model *m, int T, int P, int top)
{
    const lens_config *c = &m->cfg;
    const double C = c->d_model, tail = tail_flops(m);
    if (top < 1) return 0;
    for (int l = 0; l < top; l++)
        if (!lens_block_has_tail(m, l)) return 0;
    if ((top + 1) * (size_t)T * lens_gemm_packed_size(c->d_model, c->d_model) > MAX_ROW_JAC / sizeof(float)) return 0;
    return (double)P * T * (tail - 2 * C * C) > C * tail;
}

double lens_hta_flops(const lens_model *m, int T, int top, lens_hta_method method, int probes)
{
    const lens_config *c = &m->cfg;
    const double C = c->d_model, QK = (double)c->n_heads * c->d_head_k, VO = (double)c->n_heads * c->d_head_v;
    const int P = method == LENS_HTA_ESTIMATE ? (probes > 0 ? probes : DEFAULT_PROBES) : c->d_model;
    const int jac = use_row_jac(m, T, P, top);
    const double qkv = 2.0 * C * (2 * QK + VO), out = 2.0 * VO * C, attend = 4.0 * T * (QK + VO);
    const double tail = jac ? 2.0 * C * C : tail_flops(m);
    /* every tangent row of every layer; the first layer's q, k, v map one row per tangent */
    const double rows = (double)P * T * T * top;
    const double flops = rows * (out + attend + tail) + (double)P * T * (1 + (double)T * (top - 1)) * qkv;
    return flops + (jac ? (double)top * C * T * tail_flops(m) : 0);
}

/* The row-wise tail Jacobians of layers 0..top-1 into p->row_jac, packed
 * for the GEMM, with t's buffers as scratch (B tangents of T rows at a
 * time) and jac [C][T][C]; -1 when cancelled. */
static int form_row_jacobians(primal *p, tangents *t, int B, int top, float *jac, const lens_hta_opts *opts)
{
    const lens_model *m = p->m;
    for (int l = 0; l < top; l++) {
        if (opts && lens_cancelled(opts->cancel)) return -1;
        lens_block_io io = {.N = B * p->T, .h = t->th, .n = t->tn, .q = t->tq, .k = t->tk, .v = t->tv,
                            .ctx = t->tctx, .ff = t->tff, .cache = &p->cache[l], .jvp_row = -1,
                            .row_scratch = t->xhat, .pool = opts ? opts->pool : NULL};
        lens_block_row_jacobian(m, &io, l, jac);
        lens_block_row_jac_pack(p->row_jac + l * p->row_jac_layer, jac, p->T, p->C);
    }
    return 0;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

void lens_hta_result_free(lens_hta_result *r)
{
    if (!r) return;
    for (int i = 0; i < r->n_layers && r->layers; i++) {
        lens_hta_layer *y = &r->layers[i];
        free(y->norm2), free(y->norm2_stderr), free(y->contrib), free(y->self), free(y->self_rank);
        free(y->by_distance);
    }
    free(r->layers);
    memset(r, 0, sizeof *r);
}

/* contributions, self, self rank and by-distance from norm2 */
static void aggregate(lens_hta_layer *y, int T, int causal)
{
    for (int j = 0; j < T; j++) {
        double sum = 0;
        for (int i = 0; i < T; i++) sum += sqrt(fmax(0.0, (double)y->norm2[(size_t)j * T + i]));
        for (int i = 0; i < T; i++) {
            double s = sqrt(fmax(0.0, (double)y->norm2[(size_t)j * T + i]));
            y->contrib[(size_t)j * T + i] = sum > 0 ? (float)(s / sum) : (i == j ? 1.0f : 0.0f);
        }
        const float *row = y->contrib + (size_t)j * T;
        y->self[j] = row[j];
        int rank = 1;
        for (int i = 0; i < T; i++)
            if (row[i] > row[j]) rank++;
        y->self_rank[j] = rank;
    }
    for (int d = 0; d < T; d++) {
        double sum = 0;
        int n = 0;
        for (int j = 0; j < T; j++) {
            if (j - d >= 0) sum += y->contrib[(size_t)j * T + (j - d)], n++;
            if (d > 0 && !causal && j + d < T) sum += y->contrib[(size_t)j * T + (j + d)], n++;
        }
        y->by_distance[d] = n ? (float)(sum / n) : 0.0f;
    }
}

/* The tangent sweep: one pool task per input token i pushes its P directions
 * (exact: e_{i,c}; estimate: Rademacher probes) through the layers in chunks
 * of B and adds ‖(J dx)_j‖² into column i of the sums, which no other task
 * touches; each thread has its own tangent buffers. */
typedef struct {
    const primal *p;
    tangents *t;               /* [threads] */
    const lens_hta_opts *opts;
    const int *want;           /* [L+1] output slot per layer, -1 = not reported */
    int top, P, B, exact;
    double *sum, *sumsq;       /* [slots][T][T] */
    uint64_t seed;
    atomic_long done;          /* tangents finished, for progress */
    atomic_int cancelled;
} sweep_job;

/* Rademacher probe d of token i: its own stream, so results do not depend
 * on how tokens are spread over threads. */
static void probe(float *row, int C, uint64_t seed, int i, int d, int P)
{
    uint64_t s = (seed + 0x9E3779B97F4A7C15ULL * ((uint64_t)i * P + d + 1)) | 1;
    for (int w = 0; w < 4; w++) xorshift(&s);
    for (int ch = 0; ch < C; ch++) row[ch] = (xorshift(&s) >> 63) ? 1.0f : -1.0f;
}

static void sweep_token(void *ctx, int i)
{
    sweep_job *job = ctx;
    const primal *p = job->p;
    const int T = p->T, C = p->C, L = p->L, P = job->P;
    const size_t TT = (size_t)T * T;
    tangents *t = &job->t[lens_pool_thread_index()];
    const lens_hta_opts *opts = job->opts;
    for (int d0 = 0; d0 < P; d0 += job->B) {
        if (atomic_load(&job->cancelled) || (opts && lens_cancelled(opts->cancel))) {
            atomic_store(&job->cancelled, 1);
            return;
        }
        const int nb = P - d0 < job->B ? P - d0 : job->B;
        memset(t->tx, 0, sizeof(float) * (size_t)nb * T * C);
        for (int k = 0; k < nb; k++) {
            float *row = t->tx + ((size_t)k * T + i) * C;
            if (job->exact) row[d0 + k] = 1.0f;
            else probe(row, C, job->seed, i, d0 + k, P);
        }
        for (int l = 1; l <= job->top; l++) {
            layer_jvp(t, l - 1, nb, l == 1 ? i : -1);
            if (job->want[l] < 0) continue;
            if (l == L) final_jvp(t, nb); /* the last layer: nothing reads tx after */
            const float *y = t->tx;
            double *s1 = job->sum + (size_t)job->want[l] * TT, *s2 = job->sumsq + (size_t)job->want[l] * TT;
            for (int k = 0; k < nb; k++)
                for (int j = 0; j < T; j++) {
                    const float *v = y + ((size_t)k * T + j) * C;
                    double s = 0;
                    for (int ch = 0; ch < C; ch++) s += (double)v[ch] * v[ch];
                    s1[(size_t)j * T + i] += s;
                    s2[(size_t)j * T + i] += s * s;
                }
        }
        long done = atomic_fetch_add(&job->done, nb) + nb;
        if (opts && opts->progress && lens_pool_thread_index() == 0)
            opts->progress(opts->progress_user, (double)done / ((double)T * P));
    }
}

int lens_hidden_attribution(const lens_model *m, const int *ids, const int *type_ids, int T,
                            const lens_hta_opts *opts, lens_hta_result *out, lens_err *err)
{
    memset(out, 0, sizeof *out);
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, C = c->d_model;
    const lens_hta_method method = opts ? opts->method : LENS_HTA_EXACT;
    const int P = method == LENS_HTA_ESTIMATE ? (opts && opts->probes > 0 ? opts->probes : DEFAULT_PROBES) : C;
    if (method == LENS_HTA_ESTIMATE && P < 2)
        return lens_fail(err, LENS_EINVAL, "probes must be >= 2 (the standard error needs two)");
    int want[L + 1]; /* output slot of each layer, -1 = not requested */
    for (int l = 0; l <= L; l++) want[l] = -1;
    int n_out = 0, top = 0;
    if (opts && opts->layers && opts->n_layers > 0) {
        for (int k = 0; k < opts->n_layers; k++) {
            int l = opts->layers[k];
            if (l < 0 || l > L) return lens_fail(err, LENS_EINVAL, "layer %d out of range 0..%d", l, L);
            if (want[l] < 0) want[l] = n_out++;
            if (l > top) top = l;
        }
    } else {
        for (int l = 1; l <= L; l++) want[l] = n_out++;
        top = L;
    }
    float *h0 = malloc(sizeof(float) * (size_t)T * C);
    if (!h0) return lens_fail(err, LENS_ENOMEM, "out of memory");
    if (lens_hta_embed(m, ids, type_ids, T, h0, err)) {
        free(h0);
        return -1;
    }
    out->T = T, out->C = C, out->method = method, out->probes = method == LENS_HTA_ESTIMATE ? P : 0;
    out->n_layers = n_out;
    out->layers = calloc((size_t)n_out, sizeof *out->layers);
    int failed = !out->layers;
    double *sum = NULL, *sumsq = NULL; /* [n_out][T][T] probe sums (estimate) or exact sums */
    const size_t TT = (size_t)T * T;
    if (!failed) {
        for (int l = 0; l <= L; l++) {
            if (want[l] < 0) continue;
            lens_hta_layer *y = &out->layers[want[l]];
            y->layer = l;
            y->norm2 = zalloc(TT, &failed), y->contrib = zalloc(TT, &failed);
            y->self = zalloc((size_t)T, &failed), y->by_distance = zalloc((size_t)T, &failed);
            y->self_rank = calloc((size_t)T, sizeof(int));
            if (!y->self_rank) failed = 1;
            if (method == LENS_HTA_ESTIMATE) y->norm2_stderr = zalloc(TT, &failed);
        }
        sum = calloc((size_t)n_out * TT, sizeof *sum);
        sumsq = calloc((size_t)n_out * TT, sizeof *sumsq);
        if (!sum || !sumsq) failed = 1;
    }
    primal p = {0};
    /* tangents per chunk: all buffers of B*T rows within the scratch budget, shared by the threads */
    const size_t per_tangent = sizeof(float) * (size_t)T * (3 * (size_t)C + 2 * (size_t)c->n_heads * c->d_head_k +
                                                              2 * (size_t)c->n_heads * c->d_head_v + lens_ff_cols(m));
    const size_t budget = opts && opts->max_scratch_bytes ? opts->max_scratch_bytes : DEFAULT_SCRATCH;
    const int threads = lens_pool_threads(opts ? opts->pool : NULL);
    int B = (int)(budget / threads / per_tangent);
    if (B < 1) B = 1;
    if (B > P) B = P;
    tangents *t = calloc((size_t)threads, sizeof *t);
    if (!t) failed = 1;
    if (!failed && primal_init(&p, m, T)) failed = 1;
    float *jac = NULL; /* one layer's row Jacobians before packing */
    if (!failed && use_row_jac(m, T, P, top)) {
        p.row_jac_layer = (size_t)T * lens_gemm_packed_size(C, C);
        p.row_jac = aligned_alloc(64, sizeof(float) * top * p.row_jac_layer);
        jac = malloc(sizeof(float) * (size_t)C * T * C);
        if (!p.row_jac || !jac) failed = 1;
    }
    for (int k = 0; k < threads && !failed; k++)
        if (tangents_init(&t[k], &p, B)) failed = 1;
    if (failed) {
        for (int k = 0; t && k < threads; k++) tangents_free(&t[k]);
        free(t);
        primal_free(&p);
        free(h0), free(sum), free(sumsq), free(jac);
        lens_hta_result_free(out);
        return lens_fail(err, LENS_ENOMEM, "out of memory (T = %d)", T);
    }
    primal_run(&p, h0, NULL, opts ? opts->pool : NULL);
    free(h0);
    int cancelled = p.row_jac && form_row_jacobians(&p, &t[0], B, top, jac, opts);
    free(jac);
    sweep_job job = {
        .p = &p, .t = t, .opts = opts, .want = want, .top = top, .P = P, .B = B,
        .exact = method == LENS_HTA_EXACT, .sum = sum, .sumsq = sumsq,
        .seed = opts && opts->seed ? opts->seed : 1,
    };
    if (top > 0 && !cancelled) lens_pool_run(opts ? opts->pool : NULL, T, sweep_token, &job);
    int rc = cancelled || atomic_load(&job.cancelled) ? lens_fail(err, LENS_ECANCEL, "cancelled") : 0;
    for (int k = 0; k < threads; k++) tangents_free(&t[k]);
    free(t);
    primal_free(&p);
    if (rc == 0)
        for (int l = 0; l <= L; l++) {
            if (want[l] < 0) continue;
            lens_hta_layer *y = &out->layers[want[l]];
            const double *s1 = sum + (size_t)want[l] * TT, *s2 = sumsq + (size_t)want[l] * TT;
            for (size_t e = 0; e < TT; e++) {
                if (l == 0) { /* ∂h^0_j/∂h^0_i = I when i = j: ‖I‖_F² = C, exactly */
                    y->norm2[e] = (e / T == e % T) ? (float)C : 0.0f;
                    continue;
                }
                if (method == LENS_HTA_EXACT) y->norm2[e] = (float)s1[e];
                else {
                    double mean = s1[e] / P, var = (s2[e] - P * mean * mean) / (P - 1);
                    y->norm2[e] = (float)mean;
                    y->norm2_stderr[e] = (float)sqrt(fmax(0.0, var) / P);
                }
            }
            aggregate(y, T, lens_has_cap(c, LENS_CAP_CAUSAL)); /* p is freed by now */
        }
    free(sum), free(sumsq);
    if (rc) lens_hta_result_free(out);
    return rc;
}
