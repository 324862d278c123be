/* token_identity.c - token identifiability, Brunner et al. ICLR 2020, sec. 4
 * (definitions and shapes in token_identity.h; docs/token-identity.md).
 *
 * Ranking (lens_ti_rank). Every candidate gets a key, larger = nearer:
 *     cosine:  key_j = (q / ‖q‖) · c_j / ‖c_j‖
 *     L2:      key_j = 2 q · c_j − ‖c_j‖²   (= ‖q‖² − ‖q − c_j‖², ‖q‖² is common to the row)
 * so the scores are one GEMM, Sᵀ [n_cand][T] = Cand Qᵀ (the queries packed
 * once as the GEMM's right operand), then a scale per candidate.
 * rank_i = 1 + #{j ≠ own_i : key_j > key_own} (ties in the token's favour).
 * The own keys come from the same kernel and packed queries (one GEMM over
 * the distinct own rows), so they are bit-identical to what the blocks
 * compute and an exact duplicate of the own row ties with it; the rank and
 * the top-k read the same keys, so neighbors[i][0] == own_i exactly when
 * rank_i == 1. Top-k order: key descending, then own first, then lower index.
 *
 * Candidates are taken in blocks (a [block][T] score scratch of at most
 * RANK_SCRATCH floats per pool thread, never [n_cand][T]: T = 128 gives
 * blocks of 2048); blocks run on the pool, and each thread keeps its count of
 * better candidates and a bounded heap of its k best per query, merged at the
 * end. A sentence (n_cand = T <= 512) is one block. The vocabulary ranking
 * stacks the queries of all requested layers into one call, so the embedding
 * table is streamed once for all layers. Measured at BERT-base shape (T = 128,
 * 13 layers, 2 threads, a loaded machine): sentence ranking within the noise
 * of the forward pass, +7% with linear maps (13 GEMMs T x C x C); the
 * vocabulary ranking ~2.2 s on top for all 13 layers (78 GFLOP).
 *
 * Learned maps (lens_ti_fit). Per layer l the ridge regression of
 * Y = h^0 on X = h^l over all N training tokens, with an unpenalised bias:
 *     μx = mean X, μy = mean Y, Xc = X − μx, Yc = Y − μy       [C], [N][C]
 *     A  = Xcᵀ Xc = Σ x xᵀ − N μx μxᵀ                           [C][C]
 *     λ  = ridge · trace(A) / C       (ridge relative to the mean feature variance · N)
 *     W  = (A + λ I)⁻¹ Xcᵀ Yc,   Xcᵀ Yc = Σ x yᵀ − N μx μyᵀ     [C][C]
 *     b  = μy − μx W                                           [C]
 * which is the least-squares solution of [X, 1] [W; b] ≈ Y with the penalty
 * λ‖W‖_F² on W only. Σ [x, 1]ᵀ[x, 1] and Σ [x, 1]ᵀ y are accumulated in double
 * (dsyrk / dgemm over row blocks converted to double, one pool task per
 * layer); A + λI is solved by Cholesky (LAPACKE_dposv). When trace(A) = 0
 * (every training token has the same h^l) λ = 1, so W = 0 and b = μy.
 *
 * Maps file (lens_ti_maps_save / load): F32 tensors "layer.{l}.weight"
 * [C][C], "layer.{l}.bias" [C], "train_rate", "heldout_rate",
 * "identity_heldout_rate" [L+1], "metric" [1]; "ridge", "train_tokens",
 * "heldout_tokens" and "model_fingerprint" [3] as three floats whose sum in double is the exact
 * value (the writer has F32 tensors only; 3 x 24 bits cover a double). */
#include "core/analysis/token_identity.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/io/safetensors.h"

#define RANK_BLOCK 2048        /* at most this many candidate rows per task */
#define RANK_SCRATCH (1 << 18) /* floats of [block][T] scores per thread (1 MiB) */
#define MAX_TOP_K 1024     /* a bound on per-query heaps, well above what anyone reads */
#define FIT_ROW_BLOCK 256  /* rows converted to double per dsyrk / dgemm */
#define DEFAULT_BATCH_TOKENS 2048

/* ------------------------------------------------------------- ranking */

typedef struct {
    float key;
    int idx;
} ranked;

/* 1 when a goes before b: larger key, then the own candidate, then lower index. */
static inline int goes_before(ranked a, ranked b, int own)
{
    if (a.key != b.key) return a.key > b.key;
    if (a.idx == own || b.idx == own) return a.idx == own;
    return a.idx < b.idx;
}

/* A bounded heap of the k best, the worst at the root. */
static void heap_sift_down(ranked *h, int n, int i, int own)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && goes_before(h[worst], h[l], own)) worst = l;
        if (r < n && goes_before(h[worst], h[r], own)) worst = r;
        if (worst == i) return;
        ranked t = h[i];
        h[i] = h[worst], h[worst] = t;
        i = worst;
    }
}

static void heap_offer(ranked *h, int *n, int k, ranked x, int own)
{
    if (*n < k) {
        int i = (*n)++;
        h[i] = x;
        while (i > 0) {
            int parent = (i - 1) / 2;
            if (!goes_before(h[parent], h[i], own)) break; /* the parent must be the worse */
            ranked t = h[i];
            h[i] = h[parent], h[parent] = t;
            i = parent;
        }
    } else if (k > 0 && goes_before(x, h[0], own)) {
        h[0] = x;
        heap_sift_down(h, *n, 0, own);
    }
}

/* Heap -> best first into out (the heap is consumed). */
static void heap_drain(ranked *h, int n, int own, int *out)
{
    while (n > 0) {
        out[n - 1] = h[0].idx; /* the root is the worst of what is left */
        h[0] = h[--n];
        heap_sift_down(h, n, 0, own);
    }
}

static inline float sanitize_key(float k) { return k == k ? k : -INFINITY; }

/* ‖c‖² in double, four partial sums (the compiler may vectorise them). */
static double norm2(const float *c, int C)
{
    double a[4] = {0, 0, 0, 0};
    int k = 0;
    for (; k + 4 <= C; k += 4)
        for (int e = 0; e < 4; e++) a[e] += (double)c[k + e] * c[k + e];
    for (; k < C; k++) a[0] += (double)c[k] * c[k];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

/* The candidate's column scale: cosine 1/‖c‖ (0 for a zero row), L2 ‖c‖². */
static float cand_scale(const float *c, int C, lens_ti_metric metric)
{
    const double n2 = norm2(c, C);
    return metric == LENS_TI_COSINE ? (n2 > 0 ? (float)(1.0 / sqrt(n2)) : 0.0f) : (float)n2;
}

static inline float make_key(float dot, float scale, lens_ti_metric metric)
{
    return sanitize_key(metric == LENS_TI_COSINE ? dot * scale : 2.0f * dot - scale);
}

/* What one ranking reads (see the top comment for the keys). The GEMM runs
 * candidates x queries, S [block][T] = Cand_block Qᵀ, with the queries packed
 * once per call (lens_gemm_pack), so no block packs anything. */
typedef struct {
    const float *packed_q;   /* Q [T][C] as the GEMM's W (K = C, N = T): unit rows for cosine */
    int T, C;
    const void *cand;        /* [n_cand][C] of cand_dt (the vocabulary: the embedding table's dtype) */
    lens_dtype cand_dt;
    float *cand_f32;         /* BF16/F16 candidates: [threads][block][C] each block widened, else NULL */
    int n_cand;
    lens_ti_metric metric;
    const int *own;          /* [T] */
    const float *own_key;    /* [T] */
    int k;                   /* heap size: min(top_k, n_cand) */
    int block, n_blocks;     /* candidates per task */
    /* per pool thread (lens_pool_thread_index): nothing is shared between tasks */
    float *scores;           /* [threads][block][T] */
    int *better;             /* [threads][T] */
    float *worst;            /* [threads][T] key of the heap's root when full, else -inf */
    ranked *heaps;           /* [threads][T][k], own candidate excluded */
    int *heap_n;             /* [threads][T] */
    const volatile int *cancel;
    atomic_int failed;       /* 2 cancelled (any task) */
} rank_job;

static void rank_block_task(void *ctx, int b)
{
    rank_job *j = ctx;
    if (j->failed || lens_cancelled(j->cancel)) {
        j->failed = 2;
        return;
    }
    const int th = lens_pool_thread_index(), T = j->T, C = j->C;
    const int j0 = b * j->block, nb = j->n_cand - j0 < j->block ? j->n_cand - j0 : j->block;
    float *scores = j->scores + (size_t)th * j->block * T; /* [nb][T] */
    const float *cb = lens_dtype_at(j->cand, j->cand_dt, (size_t)j0 * C); /* [nb][C] */
    if (j->cand_f32) {
        float *wide = j->cand_f32 + (size_t)th * j->block * C;
        lens_widen(wide, cb, j->cand_dt, (size_t)nb * C);
        cb = wide;
    }
    const lens_gemm_args g = {.M = nb, .N = T, .K = C, .x = cb, .ldx = (size_t)C,
                              .packed = j->packed_q, .alpha = 1.0f, .y = scores, .ldy = (size_t)T};
    lens_gemm(&g, NULL);
    int *better = j->better + (size_t)th * T;
    float *worst = j->worst + (size_t)th * T;
    const int *own = j->own;
    const float *own_key = j->own_key;
    for (int c = 0; c < nb; c++) {
        const int idx = j0 + c;
        const float scale = cand_scale(cb + (size_t)c * C, C, j->metric);
        float *key = scores + (size_t)c * T;
        for (int i = 0; i < T; i++) key[i] = make_key(key[i], scale, j->metric);
        for (int i = 0; i < T; i++) better[i] += (key[i] > own_key[i]) & (own[i] != idx);
        if (j->k == 0) continue;
        for (int i = 0; i < T; i++) {
            if (key[i] < worst[i] || own[i] == idx) continue; /* a cheap superset of "goes before the worst" */
            ranked *heap = j->heaps + ((size_t)th * T + i) * j->k;
            int *hn = &j->heap_n[(size_t)th * T + i];
            heap_offer(heap, hn, j->k, (ranked){key[i], idx}, own[i]);
            if (*hn == j->k) worst[i] = heap[0].key;
        }
    }
}

/* The ranking with a cancel flag; lens_ti_rank's contract otherwise. */
static int rank_core(const float *query, int T, const void *cand, lens_dtype cand_dt, int n_cand, int C,
                     lens_ti_metric metric, const int *own, int top_k, int *rank, int *neighbors, lens_pool *pool,
                     const volatile int *cancel, lens_err *err)
{
    if (T == 0) return 0;
    const int threads = lens_pool_threads(pool);
    rank_job j = {.T = T, .C = C, .cand = cand, .cand_dt = cand_dt, .n_cand = n_cand, .metric = metric, .own = own,
                  .cancel = cancel};
    j.k = top_k < n_cand ? top_k : n_cand;
    /* [block][T] scores per thread within RANK_SCRATCH floats */
    int block = RANK_SCRATCH / T;
    block = block < 16 ? 16 : block > RANK_BLOCK ? RANK_BLOCK : block;
    j.block = block < n_cand ? block : n_cand;
    j.n_blocks = (n_cand + j.block - 1) / j.block;
    const int per_thread = j.n_blocks < threads ? j.n_blocks : threads;
    const size_t packed_bytes = (sizeof(float) * lens_gemm_packed_size(C, T) + 63) / 64 * 64;
    float *unit = NULL, *packed_q = aligned_alloc(64, packed_bytes), *own_key = malloc(sizeof(float) * (size_t)T);
    int *slot = malloc(sizeof(int) * (size_t)n_cand), *own_ids = malloc(sizeof(int) * (size_t)T);
    float *own_rows = NULL, *own_dots = NULL;
    if (metric == LENS_TI_COSINE) unit = malloc(sizeof(float) * (size_t)T * C);
    j.scores = malloc(sizeof(float) * (size_t)per_thread * j.block * T);
    j.better = calloc((size_t)per_thread * T, sizeof(int));
    j.worst = malloc(sizeof(float) * (size_t)per_thread * T);
    j.heap_n = calloc((size_t)per_thread * T, sizeof(int));
    j.heaps = malloc(sizeof(ranked) * ((size_t)per_thread * T * j.k + 1));
    if (cand_dt != LENS_DT_F32) j.cand_f32 = malloc(sizeof(float) * (size_t)per_thread * j.block * C);
    ranked *merged = malloc(sizeof(ranked) * ((size_t)j.k + 1));
    int rc = 0;
    if (!packed_q || !own_key || !slot || !own_ids || (metric == LENS_TI_COSINE && !unit) || !j.scores ||
        !j.better || !j.worst || !j.heap_n || !j.heaps || !merged || (cand_dt != LENS_DT_F32 && !j.cand_f32))
        goto oom;
    for (size_t e = 0; e < (size_t)per_thread * T; e++) j.worst[e] = -INFINITY;
    if (metric == LENS_TI_COSINE)
        for (int i = 0; i < T; i++) {
            const float *q = query + (size_t)i * C;
            const double n2 = norm2(q, C), inv = n2 > 0 ? 1.0 / sqrt(n2) : 0.0;
            for (int k = 0; k < C; k++) unit[(size_t)i * C + k] = (float)(q[k] * inv);
        }
    lens_gemm_pack(packed_q, metric == LENS_TI_COSINE ? unit : query, C, T, (size_t)C, 0);
    j.packed_q = packed_q;

    /* The own keys by the same kernel and packed queries as the blocks (one
     * GEMM over the distinct own candidates), so the own candidate's key is
     * bit-identical to the one its block computes, and an exact duplicate of
     * the own row ties with it. */
    int U = 0;
    for (int c = 0; c < n_cand; c++) slot[c] = -1;
    for (int i = 0; i < T; i++)
        if (slot[own[i]] < 0) slot[own[i]] = U, own_ids[U++] = own[i];
    own_rows = malloc(sizeof(float) * (size_t)U * C);
    own_dots = malloc(sizeof(float) * (size_t)U * T);
    if (!own_rows || !own_dots) goto oom;
    for (int u = 0; u < U; u++)
        lens_widen(own_rows + (size_t)u * C, lens_dtype_at(cand, cand_dt, (size_t)own_ids[u] * C), cand_dt, (size_t)C);
    const lens_gemm_args g = {.M = U, .N = T, .K = C, .x = own_rows, .ldx = (size_t)C, .packed = packed_q,
                              .alpha = 1.0f, .y = own_dots, .ldy = (size_t)T};
    lens_gemm(&g, pool);
    for (int i = 0; i < T; i++) {
        const int u = slot[own[i]];
        own_key[i] = make_key(own_dots[(size_t)u * T + i], cand_scale(own_rows + (size_t)u * C, C, metric), metric);
    }
    j.own_key = own_key;

    lens_pool_run(per_thread > 1 ? pool : NULL, j.n_blocks, rank_block_task, &j);
    if (j.failed) {
        rc = lens_fail(err, LENS_ECANCEL, "cancelled");
        goto done;
    }
    for (int i = 0; i < T; i++) {
        int better = 0, n = 0;
        if (j.k > 0) heap_offer(merged, &n, j.k, (ranked){own_key[i], own[i]}, own[i]);
        for (int t = 0; t < per_thread; t++) {
            better += j.better[(size_t)t * T + i];
            const ranked *h = j.heaps + ((size_t)t * T + i) * j.k;
            const int hn = j.heap_n[(size_t)t * T + i];
            for (int e = 0; e < hn; e++) heap_offer(merged, &n, j.k, h[e], own[i]);
        }
        rank[i] = 1 + better;
        if (top_k > 0) {
            int *out = neighbors + (size_t)i * top_k;
            for (int e = n; e < top_k; e++) out[e] = -1;
            heap_drain(merged, n, own[i], out);
        }
    }
    goto done;
oom:
    rc = lens_fail(err, LENS_ENOMEM, "out of memory ranking %d queries against %d candidates", T, n_cand);
done:
    free(unit), free(packed_q), free(own_key), free(slot), free(own_ids), free(own_rows), free(own_dots);
    free(j.scores), free(j.better), free(j.worst), free(j.heap_n), free(j.heaps), free(merged), free(j.cand_f32);
    return rc;
}

static int check_rank_args(const float *query, int T, const float *cand, int n_cand, int C, lens_ti_metric metric,
                           const int *own, int top_k, const int *rank, const int *neighbors, lens_err *err)
{
    if (T < 0 || n_cand < 1 || C < 1)
        return lens_fail(err, LENS_EINVAL, "ranking needs T >= 0 queries, >= 1 candidate and C >= 1 (got %d, %d, %d)",
                         T, n_cand, C);
    if (metric != LENS_TI_COSINE && metric != LENS_TI_L2)
        return lens_fail(err, LENS_EINVAL, "unknown metric %d (0 = cosine, 1 = l2)", (int)metric);
    if (top_k < 0 || top_k > MAX_TOP_K)
        return lens_fail(err, LENS_EINVAL, "top_k %d outside 0..%d", top_k, MAX_TOP_K);
    if (T > 0 && (!query || !cand || !own || !rank || (top_k > 0 && !neighbors)))
        return lens_fail(err, LENS_EINVAL, "ranking: a required array is NULL");
    for (int i = 0; i < T; i++)
        if (own[i] < 0 || own[i] >= n_cand)
            return lens_fail(err, LENS_EINVAL, "query %d: own candidate %d outside 0..%d", i, own[i], n_cand - 1);
    return 0;
}

int lens_ti_rank(const float *query, int T, const float *cand, int n_cand, int C, lens_ti_metric metric,
                 const int *own, int top_k, int *rank, int *neighbors, lens_pool *pool, lens_err *err)
{
    if (check_rank_args(query, T, cand, n_cand, C, metric, own, top_k, rank, neighbors, err)) return -1;
    return rank_core(query, T, cand, LENS_DT_F32, n_cand, C, metric, own, top_k, rank, neighbors, pool, NULL, err);
}

/* ------------------------------------------------------------ maps */

/* out [T][C] = h [T][C] W_l + b_l */
static void apply_map(const lens_ti_maps *maps, int layer, const float *h, int T, float *out, lens_pool *pool)
{
    const int C = maps->C;
    const lens_gemm_args g = {.M = T, .N = C, .K = C, .x = h, .ldx = (size_t)C,
                              .w = maps->w + (size_t)layer * C * C, .ld = (size_t)C, .w_kn = 1, .alpha = 1.0f,
                              .bias = maps->b + (size_t)layer * C, .y = out, .ldy = (size_t)C};
    lens_gemm(&g, pool);
}

void lens_ti_apply(const lens_ti_maps *maps, int layer, const float *h, int T, float *out)
{
    apply_map(maps, layer, h, T, out, NULL);
}

static int check_maps(const lens_ti_maps *maps, const lens_model *m, lens_err *err)
{
    const lens_config *c = &m->cfg;
    if (!maps->w || !maps->b)
        return lens_fail(err, LENS_EINVAL, "the learned maps are empty");
    if (maps->n_layers != c->n_layers + 1 || maps->C != c->d_model)
        return lens_fail(err, LENS_EINVAL,
                         "the learned maps are for %d layers of width %d; this model has %d (0..%d) of width %d",
                         maps->n_layers, maps->C, c->n_layers + 1, c->n_layers, c->d_model);
    return 0;
}

/* ------------------------------------------------- one sequence, all layers */

typedef struct {
    const lens_ti_opts *opts;
    const lens_ti_maps *maps;
    lens_pool *pool;
    const float *h0;      /* [T][C] */
    const float *hidden;  /* [L+1][T][C] of this (single-sequence) batch */
    float *queries;       /* [n_layers][T][C] the ranked query per layer (mapped or h^l itself) */
    const int *own;       /* [T] = 0..T-1 */
    int T, C;
    lens_ti_result *out;
    atomic_int failed;    /* 1 out of memory, 2 cancelled */
} ti_job;

static void ti_layer_task(void *ctx, int k)
{
    ti_job *j = ctx;
    if (j->failed || lens_cancelled(j->opts->cancel)) {
        if (!j->failed) j->failed = 2;
        return;
    }
    lens_ti_layer *y = &j->out->layers[k];
    const size_t TC = (size_t)j->T * j->C;
    const float *h = j->hidden + (size_t)y->layer * TC;
    float *q = j->queries + (size_t)k * TC;
    if (j->maps) apply_map(j->maps, y->layer, h, j->T, q, NULL);
    else memcpy(q, h, sizeof(float) * TC);
    lens_err err;
    if (rank_core(q, j->T, j->h0, LENS_DT_F32, j->T, j->C, j->opts->metric, j->own, j->out->top_k, y->rank,
                  y->neighbors, NULL, NULL, &err)) {
        j->failed = 1;
        return;
    }
}

static void rates(lens_ti_layer *y, const unsigned char *special, int T)
{
    int hit = 0, plain = 0, plain_hit = 0;
    for (int i = 0; i < T; i++) {
        hit += y->rank[i] == 1;
        if (!special || !special[i]) plain++, plain_hit += y->rank[i] == 1;
    }
    y->rate = (float)hit / T;
    y->rate_excluding_special = plain ? (float)plain_hit / plain : NAN;
}

void lens_ti_result_free(lens_ti_result *r)
{
    if (!r) return;
    for (int k = 0; r->layers && k < r->n_layers; k++) {
        lens_ti_layer *y = &r->layers[k];
        free(y->rank), free(y->neighbors), free(y->vocab_rank), free(y->vocab_neighbors);
    }
    free(r->layers);
    memset(r, 0, sizeof *r);
}

int lens_token_identity(const lens_model *m, const int *ids, const int *type_ids, const unsigned char *special,
                        int T, const lens_ti_opts *opts, lens_ti_result *out, lens_err *err)
{
    memset(out, 0, sizeof *out);
    const lens_ti_opts defaults = {0};
    if (!opts) opts = &defaults;
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, C = c->d_model, V = c->vocab_size;
    if (T < 1 || T > c->max_positions)
        return lens_fail(err, LENS_ELIMIT, "sequence of %d tokens (the model takes 1..%d)", T, c->max_positions);
    if (!ids) return lens_fail(err, LENS_EINVAL, "no token ids");
    if (opts->metric != LENS_TI_COSINE && opts->metric != LENS_TI_L2)
        return lens_fail(err, LENS_EINVAL, "unknown metric %d (0 = cosine, 1 = l2)", (int)opts->metric);
    if (opts->top_k < 0 || opts->top_k > MAX_TOP_K)
        return lens_fail(err, LENS_EINVAL, "top_k %d outside 0..%d", opts->top_k, MAX_TOP_K);
    if (opts->maps && check_maps(opts->maps, m, err)) return -1;
    const int n_layers = opts->layers && opts->n_layers > 0 ? opts->n_layers : L + 1;
    if (opts->n_layers < 0) return lens_fail(err, LENS_EINVAL, "n_layers %d is negative", opts->n_layers);
    if (opts->layers)
        for (int k = 0; k < n_layers; k++) {
            if (opts->layers[k] < 0 || opts->layers[k] > L)
                return lens_fail(err, LENS_EINVAL, "layer %d is outside 0..%d (0 = embeddings, %d = last block)",
                                 opts->layers[k], L, L);
            for (int e = 0; e < k; e++)
                if (opts->layers[e] == opts->layers[k])
                    return lens_fail(err, LENS_EINVAL, "layer %d is listed twice", opts->layers[k]);
        }
    for (int i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return lens_fail(err, LENS_EINVAL, "token id %d at position %d is outside the vocabulary 0..%d", ids[i],
                             i, V - 1);

    const int top_k = opts->top_k;
    const size_t TC = (size_t)T * C;
    out->T = T, out->top_k = top_k, out->n_layers = n_layers;
    out->layers = calloc((size_t)n_layers, sizeof *out->layers);
    int failed = !out->layers;
    for (int k = 0; !failed && k < n_layers; k++) {
        lens_ti_layer *y = &out->layers[k];
        y->layer = opts->layers && opts->n_layers > 0 ? opts->layers[k] : k;
        y->rank = malloc(sizeof(int) * (size_t)T);
        y->neighbors = malloc(sizeof(int) * ((size_t)T * top_k + 1)); /* never NULL, also for top_k 0 */
        y->vocab_rate = NAN;
        if (opts->vocabulary) {
            y->vocab_rank = malloc(sizeof(int) * (size_t)T);
            y->vocab_neighbors = malloc(sizeof(int) * ((size_t)T * top_k + 1));
            if (!y->vocab_rank || !y->vocab_neighbors) failed = 1;
        }
        if (!y->rank || !y->neighbors) failed = 1;
    }
    int *own = malloc(sizeof(int) * (size_t)T);
    float *queries = malloc(sizeof(float) * TC * n_layers);
    lens_activations act = {0};
    int rc = 0;
    if (failed || !own || !queries) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for token identity (T = %d, %d layers)", T, n_layers);
        goto done;
    }
    const lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids, .type_ids = type_ids};
    const lens_forward_opts fopts = {.keep = LENS_KEEP_HIDDEN, .pool = opts->pool, .cancel = opts->cancel};
    if (lens_forward(m, &batch, &fopts, &act, err)) {
        rc = -1;
        goto done;
    }
    for (int i = 0; i < T; i++) own[i] = i;
    ti_job job = {.opts = opts, .maps = opts->maps, .pool = opts->pool, .h0 = act.hidden, .hidden = act.hidden,
                  .queries = queries, .own = own, .T = T, .C = C, .out = out};
    lens_pool_run(opts->pool, n_layers, ti_layer_task, &job);
    if (job.failed) {
        rc = job.failed == 2 ? lens_fail(err, LENS_ECANCEL, "cancelled")
                             : lens_fail(err, LENS_ENOMEM, "out of memory ranking the layers");
        goto done;
    }
    for (int k = 0; k < n_layers; k++) rates(&out->layers[k], special, T);
    if (opts->vocabulary) {
        /* all layers' queries [n_layers][T][C] in one ranking, own = the token's id */
        const size_t NQ = (size_t)n_layers * T;
        int *vocab_own = malloc(sizeof(int) * NQ), *vocab_rank = malloc(sizeof(int) * NQ);
        int *vocab_nb = malloc(sizeof(int) * (NQ * top_k + 1));
        if (!vocab_own || !vocab_rank || !vocab_nb) {
            free(vocab_own), free(vocab_rank), free(vocab_nb);
            rc = lens_fail(err, LENS_ENOMEM, "out of memory for the vocabulary ranking");
            goto done;
        }
        for (size_t r = 0; r < NQ; r++) vocab_own[r] = ids[r % T];
        if (rank_core(queries, (int)NQ, m->p.tok_emb, m->p.emb_dtype, V, C, opts->metric, vocab_own, top_k, vocab_rank,
                      vocab_nb, opts->pool, opts->cancel, err))
            rc = -1;
        for (int k = 0; !rc && k < n_layers; k++) {
            lens_ti_layer *y = &out->layers[k];
            memcpy(y->vocab_rank, vocab_rank + (size_t)k * T, sizeof(int) * T);
            memcpy(y->vocab_neighbors, vocab_nb + (size_t)k * T * top_k, sizeof(int) * T * top_k);
            int hit = 0;
            for (int i = 0; i < T; i++) hit += y->vocab_rank[i] == 1;
            y->vocab_rate = (float)hit / T;
        }
        free(vocab_own), free(vocab_rank), free(vocab_nb);
    }
done:
    lens_activations_free(&act);
    free(own), free(queries);
    if (rc) lens_ti_result_free(out);
    return rc;
}

/* ------------------------------------------------------------ fitting */

void lens_ti_maps_free(lens_ti_maps *maps)
{
    if (!maps) return;
    free(maps->w), free(maps->b), free(maps->train_rate), free(maps->heldout_rate), free(maps->identity_heldout_rate);
    memset(maps, 0, sizeof *maps);
}

static int maps_alloc(lens_ti_maps *maps, int n_layers, int C)
{
    memset(maps, 0, sizeof *maps);
    maps->n_layers = n_layers, maps->C = C;
    maps->w = malloc(sizeof(float) * (size_t)n_layers * C * C);
    maps->b = malloc(sizeof(float) * (size_t)n_layers * C);
    maps->train_rate = malloc(sizeof(float) * (size_t)n_layers);
    maps->heldout_rate = malloc(sizeof(float) * (size_t)n_layers);
    maps->identity_heldout_rate = malloc(sizeof(float) * (size_t)n_layers);
    if (!maps->w || !maps->b || !maps->train_rate || !maps->heldout_rate || !maps->identity_heldout_rate) {
        lens_ti_maps_free(maps);
        return -1;
    }
    return 0;
}

/* One forward chunk: sequences [s0, s1) of a batch. */
typedef struct {
    const lens_batch *batch;
    int s0, s1;
    size_t tok0, n_tokens;
} chunk;

/* Next chunk after *ch of about batch_tokens tokens (at least one sequence); 0 when done. */
static int next_chunk(const lens_batch *b, chunk *ch, int batch_tokens)
{
    int s0 = ch->batch ? ch->s1 : 0;
    size_t tok0 = ch->batch ? ch->tok0 + ch->n_tokens : 0;
    if (!b || s0 >= b->n_seqs) return 0;
    int s1 = s0;
    size_t n = 0;
    while (s1 < b->n_seqs && (s1 == s0 || n + (size_t)b->lengths[s1] <= (size_t)batch_tokens)) n += b->lengths[s1++];
    *ch = (chunk){.batch = b, .s0 = s0, .s1 = s1, .tok0 = tok0, .n_tokens = n};
    return 1;
}

static int chunk_forward(const lens_model *m, const chunk *ch, const lens_ti_fit_opts *o, lens_activations *act,
                         lens_err *err)
{
    const lens_batch *b = ch->batch;
    const lens_batch sub = {.n_seqs = ch->s1 - ch->s0, .lengths = b->lengths + ch->s0, .ids = b->ids + ch->tok0,
                            .type_ids = b->type_ids ? b->type_ids + ch->tok0 : NULL};
    const lens_forward_opts fopts = {.keep = LENS_KEEP_HIDDEN, .pool = o->pool, .cancel = o->cancel};
    return lens_forward(m, &sub, &fopts, act, err);
}

/* Per layer: G = Σ [x,1]ᵀ[x,1] (upper triangle) [C+1][C+1], XY = Σ [x,1]ᵀ y [C+1][C]. */
typedef struct {
    int C, n_layers;
    double *G, *XY;          /* [L+1][C+1][C+1], [L+1][C+1][C] */
    const float *hidden;     /* [L+1][N][C] of the current chunk */
    size_t N;
    lens_ti_maps *maps;
    double ridge;
    atomic_int failed;       /* 1 out of memory, 3 solve failed */
    int failed_layer, info;
} fit_job;

static void accumulate_task(void *ctx, int l)
{
    fit_job *j = ctx;
    const int C = j->C, CA = C + 1;
    double *buf = malloc(sizeof(double) * (size_t)FIT_ROW_BLOCK * (CA + C)); /* Xa [rb][C+1], Y [rb][C] */
    if (!buf) {
        j->failed = 1;
        return;
    }
    double *xa = buf, *yd = buf + (size_t)FIT_ROW_BLOCK * CA;
    const float *x = j->hidden + (size_t)l * j->N * C, *y = j->hidden;
    double *G = j->G + (size_t)l * CA * CA, *XY = j->XY + (size_t)l * CA * C;
    for (size_t r0 = 0; r0 < j->N; r0 += FIT_ROW_BLOCK) {
        const int rb = j->N - r0 < FIT_ROW_BLOCK ? (int)(j->N - r0) : FIT_ROW_BLOCK;
        for (int r = 0; r < rb; r++) {
            const float *xr = x + (r0 + r) * C, *yr = y + (r0 + r) * C;
            double *xo = xa + (size_t)r * CA, *yo = yd + (size_t)r * C;
            for (int k = 0; k < C; k++) xo[k] = xr[k], yo[k] = yr[k];
            xo[C] = 1.0;
        }
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, CA, rb, 1.0, xa, CA, 1.0, G, CA);
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CA, C, rb, 1.0, xa, CA, yd, C, 1.0, XY, C);
    }
    free(buf);
}

/* The ridge solution of the top comment for layer l from G and XY. */
static void solve_task(void *ctx, int l)
{
    fit_job *j = ctx;
    const int C = j->C, CA = C + 1;
    const double *G = j->G + (size_t)l * CA * CA, *XY = j->XY + (size_t)l * CA * C;
    double *A = malloc(sizeof(double) * (size_t)C * C), *B = malloc(sizeof(double) * (size_t)C * C);
    double *mx = malloc(sizeof(double) * (size_t)C * 2);
    if (!A || !B || !mx) {
        free(A), free(B), free(mx);
        j->failed = 1;
        return;
    }
    double *my = mx + C;
    const double N = G[(size_t)C * CA + C];
    for (int i = 0; i < C; i++) mx[i] = G[(size_t)i * CA + C] / N, my[i] = XY[(size_t)C * C + i] / N;
    double trace = 0;
    for (int i = 0; i < C; i++) {
        for (int k = i; k < C; k++) A[(size_t)i * C + k] = G[(size_t)i * CA + k] - N * mx[i] * mx[k];
        for (int k = 0; k < i; k++) A[(size_t)i * C + k] = 0; /* lower triangle unread by 'U' */
        trace += A[(size_t)i * C + i];
        for (int k = 0; k < C; k++) B[(size_t)i * C + k] = XY[(size_t)i * C + k] - N * mx[i] * my[k];
    }
    const double lambda = trace > 0 ? j->ridge * trace / C : 1.0;
    for (int i = 0; i < C; i++) A[(size_t)i * C + i] += lambda;
    lapack_int info = LAPACKE_dposv(LAPACK_ROW_MAJOR, 'U', C, C, A, C, B, C);
    if (info != 0) {
        j->failed_layer = l, j->info = (int)info;
        j->failed = 3;
    } else {
        float *W = j->maps->w + (size_t)l * C * C, *b = j->maps->b + (size_t)l * C;
        for (size_t e = 0; e < (size_t)C * C; e++) W[e] = (float)B[e];
        for (int k = 0; k < C; k++) {
            double s = my[k];
            for (int i = 0; i < C; i++) s -= mx[i] * B[(size_t)i * C + k];
            b[k] = (float)s;
        }
    }
    free(A), free(B), free(mx);
}

/* Second pass: identified tokens per layer over one chunk. */
typedef struct {
    const lens_ti_maps *maps;  /* NULL: identity */
    lens_ti_metric metric;
    const float *hidden;       /* [L+1][N][C] */
    const int *lengths;        /* [S] of the chunk */
    int n_seqs, C, Tmax;
    size_t N;
    long *hits;                /* [L+1] accumulated */
    int failed;
} eval_job;

static void eval_task(void *ctx, int l)
{
    eval_job *j = ctx;
    const int C = j->C;
    const float *h = j->hidden + (size_t)l * j->N * C;
    float *mapped = j->maps ? malloc(sizeof(float) * j->N * C) : NULL;
    int *own = malloc(sizeof(int) * (size_t)j->Tmax), *rank = malloc(sizeof(int) * (size_t)j->Tmax);
    if ((j->maps && !mapped) || !own || !rank) {
        free(mapped), free(own), free(rank);
        j->failed = 1;
        return;
    }
    if (j->maps) {
        apply_map(j->maps, l, h, (int)j->N, mapped, NULL);
        h = mapped;
    }
    for (int i = 0; i < j->Tmax; i++) own[i] = i;
    size_t row = 0;
    long hits = 0;
    for (int s = 0; s < j->n_seqs; s++) {
        const int T = j->lengths[s];
        const float *h0 = j->hidden + row * C;
        lens_err err;
        if (rank_core(h + row * C, T, h0, LENS_DT_F32, T, C, j->metric, own, 0, rank, NULL, NULL, NULL, &err)) {
            j->failed = 1;
            break;
        }
        for (int i = 0; i < T; i++) hits += rank[i] == 1;
        row += (size_t)T;
    }
    j->hits[l] += hits;
    free(mapped), free(own), free(rank);
}

static int check_batch_arg(const lens_model *m, const lens_batch *b, const char *what, long *tokens, lens_err *err)
{
    *tokens = 0;
    if (!b || b->n_seqs == 0) return 0;
    if (b->n_seqs < 0 || !b->lengths || !b->ids)
        return lens_fail(err, LENS_EINVAL, "%s: a batch of %d sequences without lengths or ids", what, b->n_seqs);
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->lengths[s] < 1 || b->lengths[s] > m->cfg.max_positions)
            return lens_fail(err, b->lengths[s] < 1 ? LENS_EINVAL : LENS_ELIMIT,
                             "%s: sequence %d has %d tokens (the model takes 1..%d)", what, s, b->lengths[s],
                             m->cfg.max_positions);
        *tokens += b->lengths[s];
    }
    return 0;
}

/* A checksum of the first rows of the token and position embeddings,
 * weighted by position so that permutations differ: two checkpoints of the
 * same shape but different weights get different values. */
static double model_fingerprint(const lens_model *m)
{
    const int C = m->cfg.d_model;
    const size_t n_tok = (size_t)(m->cfg.vocab_size < 64 ? m->cfg.vocab_size : 64) * C;
    const size_t n_pos = (size_t)(m->cfg.max_positions < 16 ? m->cfg.max_positions : 16) * C;
    const lens_dtype dt = m->p.emb_dtype;
    double s = 0;
    float x;
    for (size_t i = 0; i < n_tok; i++)
        lens_widen(&x, lens_dtype_at(m->p.tok_emb, dt, i), dt, 1), s += (double)x * (double)(1 + i % 13);
    for (size_t i = 0; m->p.pos_emb && i < n_pos; i++) /* RoPE: none */
        lens_widen(&x, lens_dtype_at(m->p.pos_emb, dt, i), dt, 1), s += (double)x * (double)(1 + i % 7);
    return s;
}

/* opts with the defaults filled in, or -1 and err says why. */
static int fit_opts(const lens_ti_fit_opts *opts, lens_ti_fit_opts *o, lens_err *err)
{
    const lens_ti_fit_opts defaults = {0};
    *o = opts ? *opts : defaults;
    if (!(o->ridge >= 0) || !isfinite(o->ridge))
        return lens_fail(err, LENS_EINVAL, "ridge %g must be a finite number >= 0 (0 = %g)", o->ridge,
                         LENS_TI_DEFAULT_RIDGE);
    if (o->ridge == 0) o->ridge = LENS_TI_DEFAULT_RIDGE;
    if (o->batch_tokens < 0) return lens_fail(err, LENS_EINVAL, "batch_tokens %d is negative", o->batch_tokens);
    if (o->batch_tokens == 0) o->batch_tokens = DEFAULT_BATCH_TOKENS;
    if (o->metric != LENS_TI_COSINE && o->metric != LENS_TI_L2)
        return lens_fail(err, LENS_EINVAL, "unknown metric %d (0 = cosine, 1 = l2)", (int)o->metric);
    return 0;
}

/* Work done so far (tokens through a forward pass) out of total, for opts.progress. */
typedef struct {
    double done, total;
} fit_work;

static void work_done(const lens_ti_fit_opts *o, fit_work *w, size_t tokens)
{
    w->done += (double)tokens;
    if (o->progress && w->total > 0) o->progress(o->progress_user, w->done / w->total);
}

static int accumulate(const lens_model *m, const lens_batch *train, const lens_ti_fit_opts *o, double *G, double *XY,
                      fit_work *work, lens_err *err)
{
    const int NL = m->cfg.n_layers + 1;
    fit_job fj = {.C = m->cfg.d_model, .n_layers = NL, .G = G, .XY = XY};
    lens_activations act = {0};
    chunk ch = {0};
    while (next_chunk(train, &ch, o->batch_tokens)) {
        if (lens_cancelled(o->cancel)) return lens_fail(err, LENS_ECANCEL, "cancelled while fitting");
        if (chunk_forward(m, &ch, o, &act, err)) return -1;
        fj.hidden = act.hidden, fj.N = ch.n_tokens;
        lens_pool_run(o->pool, NL, accumulate_task, &fj);
        lens_activations_free(&act);
        if (fj.failed) return lens_fail(err, LENS_ENOMEM, "out of memory accumulating the normal equations");
        work_done(o, work, ch.n_tokens);
    }
    return 0;
}

static int count_hits(const lens_model *m, const lens_batch *b, const lens_ti_maps *maps, const lens_ti_fit_opts *o,
                      long *hits, long *hits_identity, fit_work *work, lens_err *err)
{
    const int NL = m->cfg.n_layers + 1;
    lens_activations act = {0};
    chunk ec = {0};
    while (next_chunk(b, &ec, o->batch_tokens)) {
        if (lens_cancelled(o->cancel)) return lens_fail(err, LENS_ECANCEL, "cancelled while measuring the rates");
        if (chunk_forward(m, &ec, o, &act, err)) return -1;
        int Tmax = 0;
        for (int s = ec.s0; s < ec.s1; s++) Tmax = b->lengths[s] > Tmax ? b->lengths[s] : Tmax;
        eval_job ej = {.maps = maps, .metric = o->metric, .hidden = act.hidden, .lengths = b->lengths + ec.s0,
                       .n_seqs = ec.s1 - ec.s0, .C = m->cfg.d_model, .Tmax = Tmax, .N = ec.n_tokens, .hits = hits};
        if (hits) lens_pool_run(o->pool, NL, eval_task, &ej);
        if (hits_identity && !ej.failed) {
            ej.maps = NULL, ej.hits = hits_identity;
            lens_pool_run(o->pool, NL, eval_task, &ej);
        }
        lens_activations_free(&act);
        if (ej.failed) return lens_fail(err, LENS_ENOMEM, "out of memory measuring the rates");
        work_done(o, work, ec.n_tokens);
    }
    return 0;
}

int lens_ti_accumulate(const lens_model *m, const lens_batch *train, const lens_ti_fit_opts *opts, double *G,
                       double *XY, lens_err *err)
{
    lens_ti_fit_opts o;
    long tokens;
    if (fit_opts(opts, &o, err) || check_batch_arg(m, train, "training texts", &tokens, err)) return -1;
    fit_work work = {0, (double)tokens};
    return accumulate(m, train, &o, G, XY, &work, err);
}

int lens_ti_solve(const lens_model *m, const double *G, const double *XY, const lens_ti_fit_opts *opts,
                  lens_ti_maps *out, lens_err *err)
{
    memset(out, 0, sizeof *out);
    lens_ti_fit_opts o;
    if (fit_opts(opts, &o, err)) return -1;
    const int NL = m->cfg.n_layers + 1, C = m->cfg.d_model;
    if (maps_alloc(out, NL, C)) return lens_fail(err, LENS_ENOMEM, "out of memory for %d maps of %d x %d", NL, C, C);
    out->ridge = o.ridge, out->metric = o.metric;
    out->model_fingerprint = model_fingerprint(m);
    for (int l = 0; l < NL; l++) out->train_rate[l] = out->heldout_rate[l] = out->identity_heldout_rate[l] = NAN;
    fit_job fj = {.C = C, .n_layers = NL, .maps = out, .ridge = o.ridge, .G = (double *)G, .XY = (double *)XY};
    lens_pool_run(o.pool, NL, solve_task, &fj);
    if (!fj.failed) return 0;
    lens_ti_maps_free(out);
    if (fj.failed == 3)
        return lens_fail(err, LENS_EINVAL,
                         "layer %d: the ridge system is not positive definite (LAPACK info %d; non-finite hidden "
                         "states?)",
                         fj.failed_layer, fj.info);
    return lens_fail(err, LENS_ENOMEM, "out of memory solving the normal equations");
}

int lens_ti_count(const lens_model *m, const lens_batch *b, const lens_ti_maps *maps, const lens_ti_fit_opts *opts,
                  long *hits, long *hits_identity, lens_err *err)
{
    lens_ti_fit_opts o;
    long tokens;
    if (fit_opts(opts, &o, err) || check_batch_arg(m, b, "texts", &tokens, err)) return -1;
    if (maps && (maps->n_layers != m->cfg.n_layers + 1 || maps->C != m->cfg.d_model))
        return lens_fail(err, LENS_EINVAL, "maps of %d layers x %d do not fit the model", maps->n_layers, maps->C);
    fit_work work = {0, (double)tokens};
    return count_hits(m, b, maps, &o, hits, hits_identity, &work, err);
}

int lens_ti_fit(const lens_model *m, const lens_batch *train, const lens_batch *heldout,
                const lens_ti_fit_opts *opts, lens_ti_maps *out, lens_err *err)
{
    memset(out, 0, sizeof *out);
    lens_ti_fit_opts o;
    const int NL = m->cfg.n_layers + 1, CA = m->cfg.d_model + 1;
    long train_tokens, heldout_tokens;
    if (fit_opts(opts, &o, err) || check_batch_arg(m, train, "training texts", &train_tokens, err) ||
        check_batch_arg(m, heldout, "held-out texts", &heldout_tokens, err))
        return -1;
    if (train_tokens < 2)
        return lens_fail(err, LENS_EINVAL, "fitting the maps needs at least 2 training tokens (got %ld)",
                         train_tokens);
    double *G = calloc((size_t)NL * CA * CA, sizeof(double));
    double *XY = calloc((size_t)NL * CA * (CA - 1), sizeof(double));
    long *hits = calloc((size_t)NL * 3, sizeof(long)); /* train, held-out mapped, held-out identity */
    fit_work work = {0, 2.0 * train_tokens + heldout_tokens};
    int rc = 0;
    if (!G || !XY || !hits)
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for the normal equations (%d layers, C = %d)", NL, CA - 1);
    if (!rc) rc = accumulate(m, train, &o, G, XY, &work, err);
    if (!rc) rc = lens_ti_solve(m, G, XY, &o, out, err);
    if (!rc) { /* rates: train with the maps, held-out with the maps and without */
        out->train_tokens = train_tokens, out->heldout_tokens = heldout_tokens;
        rc = count_hits(m, train, out, &o, hits, NULL, &work, err);
        if (!rc && heldout) rc = count_hits(m, heldout, out, &o, hits + NL, hits + 2 * NL, &work, err);
    }
    if (!rc) lens_ti_set_rates(out, hits, hits + NL, hits + 2 * NL);
    free(G), free(XY), free(hits);
    if (rc) lens_ti_maps_free(out);
    return rc;
}

void lens_ti_set_rates(lens_ti_maps *maps, const long *train_hits, const long *heldout_hits,
                       const long *identity_heldout_hits)
{
    const long tr = maps->train_tokens, ho = maps->heldout_tokens;
    for (int l = 0; l < maps->n_layers; l++) {
        maps->train_rate[l] = tr ? (float)((double)train_hits[l] / tr) : NAN;
        maps->heldout_rate[l] = ho ? (float)((double)heldout_hits[l] / ho) : NAN;
        maps->identity_heldout_rate[l] = ho ? (float)((double)identity_heldout_hits[l] / ho) : NAN;
    }
}

/* --------------------------------------------------------- save / load */

/* A double (or a count) as three floats whose double sum is exact. */
static void split3(double v, float out[3])
{
    out[0] = (float)v;
    out[1] = (float)(v - out[0]);
    out[2] = (float)(v - out[0] - out[1]);
}

static double join3(const float in[3]) { return ((double)in[0] + in[1]) + in[2]; }

int lens_ti_maps_save(const lens_ti_maps *maps, const char *path, lens_err *err)
{
    const int NL = maps->n_layers, C = maps->C;
    if (NL < 1 || C < 1 || !maps->w || !maps->b || !maps->train_rate || !maps->heldout_rate ||
        !maps->identity_heldout_rate)
        return lens_fail(err, LENS_EINVAL, "%s: nothing to save (maps are empty)", path);
    const int n = 2 * NL + 8;
    lens_st_out *t = calloc((size_t)n, sizeof *t);
    char (*names)[32] = calloc((size_t)2 * NL, sizeof *names);
    if (!t || !names) {
        free(t), free(names);
        return lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
    }
    float ridge[3], train_tokens[3], heldout_tokens[3], fingerprint[3], metric = (float)maps->metric;
    split3(maps->ridge, ridge);
    split3(maps->model_fingerprint, fingerprint);
    split3((double)maps->train_tokens, train_tokens);
    split3((double)maps->heldout_tokens, heldout_tokens);
    int k = 0;
    for (int l = 0; l < NL; l++) {
        snprintf(names[2 * l], sizeof names[0], "layer.%d.weight", l);
        snprintf(names[2 * l + 1], sizeof names[0], "layer.%d.bias", l);
        t[k++] = (lens_st_out){.name = names[2 * l], .ndim = 2, .shape = {C, C}, .data = maps->w + (size_t)l * C * C};
        t[k++] = (lens_st_out){.name = names[2 * l + 1], .ndim = 1, .shape = {C}, .data = maps->b + (size_t)l * C};
    }
    t[k++] = (lens_st_out){.name = "train_rate", .ndim = 1, .shape = {NL}, .data = maps->train_rate};
    t[k++] = (lens_st_out){.name = "heldout_rate", .ndim = 1, .shape = {NL}, .data = maps->heldout_rate};
    t[k++] = (lens_st_out){.name = "identity_heldout_rate", .ndim = 1, .shape = {NL},
                           .data = maps->identity_heldout_rate};
    t[k++] = (lens_st_out){.name = "metric", .ndim = 1, .shape = {1}, .data = &metric};
    t[k++] = (lens_st_out){.name = "ridge", .ndim = 1, .shape = {3}, .data = ridge};
    t[k++] = (lens_st_out){.name = "train_tokens", .ndim = 1, .shape = {3}, .data = train_tokens};
    t[k++] = (lens_st_out){.name = "heldout_tokens", .ndim = 1, .shape = {3}, .data = heldout_tokens};
    t[k++] = (lens_st_out){.name = "model_fingerprint", .ndim = 1, .shape = {3}, .data = fingerprint};
    int rc = lens_st_write(path, t, k, err);
    free(t), free(names);
    return rc;
}

/* The F32 tensor `name` with exactly shape [d0] or [d0][d1] (d1 < 0: 1-D). */
static const float *load_tensor(const lens_safetensors *st, const char *path, const char *name, int64_t d0,
                                int64_t d1, lens_err *err)
{
    const lens_st_tensor *t = lens_st_find(st, name);
    if (!t) {
        lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' is missing (not a token identity maps file?)", path, name);
        return NULL;
    }
    const int ndim = d1 < 0 ? 1 : 2;
    if (t->dtype != LENS_DT_F32 || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        char have[64] = "";
        for (int d = 0, n = 0; d < t->ndim && n < (int)sizeof have - 24; d++)
            n += snprintf(have + n, sizeof have - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        if (ndim == 2)
            lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' is %s [%s], expected F32 [%lld, %lld] for this model", path,
                      name, t->dtype == LENS_DT_F32 ? "F32" : "not F32", have, (long long)d0, (long long)d1);
        else
            lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' is %s [%s], expected F32 [%lld] for this model", path, name,
                      t->dtype == LENS_DT_F32 ? "F32" : "not F32", have, (long long)d0);
        return NULL;
    }
    return t->data;
}

static int all_finite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

int lens_ti_maps_load(const char *path, const lens_model *m, lens_ti_maps *out, lens_err *err)
{
    memset(out, 0, sizeof *out);
    const int NL = m->cfg.n_layers + 1, C = m->cfg.d_model;
    lens_safetensors st;
    if (lens_st_open(path, &st, err)) return -1; /* ENOENT / EIO / EFORMAT with the reason */
    int rc = 0;
    /* the layer count first, so a file for another model says so */
    int file_layers = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const char *name = st.tensors[i].name, *digits = name + 6;
        char *end;
        if (strncmp(name, "layer.", 6) || *digits < '0' || *digits > '9') continue;
        const long l = strtol(digits, &end, 10);
        if (*end == '.' && l < 1000000 && l + 1 > file_layers) file_layers = (int)l + 1;
    }
    const lens_st_tensor *w0 = lens_st_find(&st, "layer.0.weight");
    if (file_layers != NL || (w0 && w0->ndim == 2 && w0->shape[0] != C)) {
        rc = lens_fail(err, LENS_EFORMAT,
                       "%s: the maps are for %d layers (0..%d) of width %lld; this model has %d (0..%d) of width %d",
                       path, file_layers, file_layers - 1, w0 && w0->ndim >= 1 ? (long long)w0->shape[0] : -1LL, NL,
                       NL - 1, C);
        goto done;
    }
    if (maps_alloc(out, NL, C)) {
        rc = lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int l = 0; l < NL; l++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%d.weight", l);
        const float *w = load_tensor(&st, path, name, C, C, err);
        snprintf(name, sizeof name, "layer.%d.bias", l);
        const float *b = w ? load_tensor(&st, path, name, C, -1, err) : NULL;
        if (!w || !b) {
            rc = -1;
            goto done;
        }
        if (!all_finite(w, (size_t)C * C) || !all_finite(b, (size_t)C)) {
            rc = lens_fail(err, LENS_EFORMAT, "%s: layer %d map has non-finite values (corrupt file?)", path, l);
            goto done;
        }
        memcpy(out->w + (size_t)l * C * C, w, sizeof(float) * (size_t)C * C);
        memcpy(out->b + (size_t)l * C, b, sizeof(float) * (size_t)C);
    }
    const float *tr = load_tensor(&st, path, "train_rate", NL, -1, err);
    const float *hr = tr ? load_tensor(&st, path, "heldout_rate", NL, -1, err) : NULL;
    const float *ir = hr ? load_tensor(&st, path, "identity_heldout_rate", NL, -1, err) : NULL;
    const float *metric = ir ? load_tensor(&st, path, "metric", 1, -1, err) : NULL;
    const float *ridge = metric ? load_tensor(&st, path, "ridge", 3, -1, err) : NULL;
    const float *tt = ridge ? load_tensor(&st, path, "train_tokens", 3, -1, err) : NULL;
    const float *ht = tt ? load_tensor(&st, path, "heldout_tokens", 3, -1, err) : NULL;
    const float *fp = ht ? load_tensor(&st, path, "model_fingerprint", 3, -1, err) : NULL;
    if (!fp) {
        rc = -1;
        goto done;
    }
    const double want = model_fingerprint(m);
    if (!(fabs(join3(fp) - want) <= 1e-9 * fmax(1.0, fabs(want)))) {
        rc = lens_fail(err, LENS_EFORMAT, "%s: the maps were fitted on another model (its embeddings differ)", path);
        goto done;
    }
    out->model_fingerprint = want;
    memcpy(out->train_rate, tr, sizeof(float) * NL);
    memcpy(out->heldout_rate, hr, sizeof(float) * NL);
    memcpy(out->identity_heldout_rate, ir, sizeof(float) * NL);
    out->ridge = join3(ridge);
    const double ntrain = join3(tt), nheld = join3(ht);
    if (metric[0] != 0.0f && metric[0] != 1.0f) {
        rc = lens_fail(err, LENS_EFORMAT, "%s: metric %g is neither 0 (cosine) nor 1 (l2)", path, (double)metric[0]);
        goto done;
    }
    if (!(out->ridge > 0) || !isfinite(out->ridge) || !(ntrain >= 0 && ntrain < 9e15) ||
        !(nheld >= 0 && nheld < 9e15) || ntrain != floor(ntrain) || nheld != floor(nheld)) {
        rc = lens_fail(err, LENS_EFORMAT, "%s: ridge or token counts are invalid (corrupt file?)", path);
        goto done;
    }
    out->metric = metric[0] == 1.0f ? LENS_TI_L2 : LENS_TI_COSINE;
    out->train_tokens = (long)ntrain, out->heldout_tokens = (long)nheld;
done:
    lens_st_close(&st);
    if (rc) lens_ti_maps_free(out);
    return rc;
}
