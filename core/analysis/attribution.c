/* attribution.c - self-attention attribution, Hao et al. AAAI 2021.
 *
 *     Attr_l = A_l ⊙ (1/m) Σ_k ∂F/∂X |_{X = α_k A_l},   F = p(c | x)
 *
 * (formula, conventions and shapes in attribution.h; docs/attribution.md).
 *
 * How it is computed, for one sequence of T tokens:
 *  - one lens_forward keeps every layer's input hidden state x_l [T][C] and
 *    attention A_l [NH][T][T]; layers below a target layer are never
 *    recomputed, for any step or target layer;
 *  - for target layer l, the steps are m copies of the sequence packed as
 *    rows (copy i = rows i*T .. i*T+T-1), so every linear map of the layers
 *    above l is one GEMM of (copies * T) rows. Layer l itself is linear in
 *    α: ctx(α) = α A v, so attn_out(α) = α (A v W_O) + b_O, computed once;
 *  - the backward goes from F through the classifier, pooler and layers
 *    L..l+1 into layer l's context, where ∂F/∂P_h = dctx_h v_h^T. That is
 *    linear in dctx, so the copies' dctx are summed first and one GEMM per
 *    head gives Σ_k ∂F/∂X at all steps;
 *  - when the copies' activations exceed max_scratch_bytes they go in
 *    batches of fewer copies; F(0) rides along as one more forward-only copy.
 * Only what a backward pass reads is cached per layer (linear maps need no
 * input for dX): q, k, v, probabilities, LayerNorm inputs and statistics,
 * and the GELU input.
 *
 * Threads (the request's lens_pool): the GEMMs of both directions split
 * inside lens_gemm (lens_gemm_linear, lens_gemm_linear_backward); the
 * row-wise steps (residual + LayerNorm, GELU and their backward) run as row
 * chunks (ops.h's row-parallel forms forward, task_job backward) and
 * attention as one task per copy. BLAS calls inside tasks run
 * single-threaded (core/base/pool.h). */
#include "core/analysis/attribution.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/ops.h"

#define DEFAULT_STEPS 20
#define DEFAULT_SCRATCH ((size_t)256 << 20)

/* Forward values one BERT layer's backward reads, for R = copies * T rows. */
typedef struct {
    float *q, *k, *v;              /* [R][NH*DK], [R][NH*DK], [R][NH*DV]; NULL for the target layer */
    float *probs;                  /* [copies][NH][T][T]; NULL for the target layer */
    float *h_attn;                 /* [R][C] LN_attn input: x + attn_out(ctx) */
    float *mean_attn, *rstd_attn;  /* [R] */
    float *ff_pre;                 /* [R][d_ff] GELU input */
    float *h_ff;                   /* [R][C] LN_ff input: a + ff_out(gelu(ff_pre)) */
    float *mean_ff, *rstd_ff;      /* [R] */
} layer_cache;

typedef struct {
    const lens_model *m;
    int T, max_copies, lowest; /* lowest: smallest 0-based target layer */
    int cls_rows;              /* 1: the last layer ran on the [CLS] rows only, row i = copy i */
    layer_cache *cache;        /* [L] */
    lens_pool *pool;           /* threads for the GEMMs of the forward steps */
    /* forward work [R][...]; reused as gradients in the backward */
    float *x, *a, *ctx, *ff;   /* [R][C], [R][C], [R][NH*DV], [R][d_ff] */
    float *dh, *dq, *dk, *dv;  /* [R][C], [R][NH*DK] x2, [R][NH*DV] */
    float *dprobs, *dscores;   /* per pool thread: [NH][T][T], [T][T] */
    float *cls, *pooled, *logits, *dcls, *dpooled, *dpre, *dlogits; /* [copies][C or K] */
    /* target layer, computed once per layer */
    float *v_l, *attn_out_l;   /* [T][NH*DV] values, [T][C] (A v) W_O without bias */
    float *dctx_sum;           /* [T][NH*DV] Σ over copies of dF/dctx */
    float *grad_sum;           /* [NH][T][T] Σ_k ∂F/∂X */
} engine;

static void *alloc_floats(size_t n, int *failed)
{
    void *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) *failed = 1;
    return p;
}

/* Bytes one copy needs in every layer from `lowest` up, and in the work buffers. */
static size_t bytes_per_copy(const lens_config *c, int T, int lowest)
{
    const size_t C = c->d_model, QK = (size_t)c->n_heads * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    const size_t per_target = T * (2 * C + c->d_ff + 4);
    const size_t per_above = T * (2 * QK + VO) + (size_t)c->n_heads * T * T;
    const size_t work = T * (3 * C + VO + c->d_ff + 2 * QK + VO) + 7 * C;
    return sizeof(float) * ((c->n_layers - lowest) * per_target + (c->n_layers - 1 - lowest) * per_above + work);
}

static void engine_free(engine *e)
{
    if (e->cache)
        for (int l = 0; l < e->m->cfg.n_layers; l++) {
            layer_cache *k = &e->cache[l];
            free(k->q), free(k->k), free(k->v), free(k->probs), free(k->h_attn), free(k->mean_attn);
            free(k->rstd_attn), free(k->ff_pre), free(k->h_ff), free(k->mean_ff), free(k->rstd_ff);
        }
    free(e->cache);
    free(e->x), free(e->a), free(e->ctx), free(e->ff), free(e->dh), free(e->dq), free(e->dk), free(e->dv);
    free(e->dprobs), free(e->dscores), free(e->cls), free(e->pooled), free(e->logits), free(e->dcls);
    free(e->dpooled), free(e->dpre), free(e->dlogits), free(e->v_l), free(e->attn_out_l), free(e->grad_sum);
    free(e->dctx_sum);
}

static int engine_init(engine *e, const lens_model *m, int T, int max_copies, int lowest, lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const size_t C = c->d_model, QK = (size_t)c->n_heads * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    const size_t R = (size_t)max_copies * T, NH = c->n_heads, K = c->n_labels, TT = (size_t)T * T;
    int failed = 0;
    memset(e, 0, sizeof *e);
    e->m = m, e->T = T, e->max_copies = max_copies, e->lowest = lowest, e->pool = pool;
    const size_t threads = (size_t)lens_pool_threads(pool);
    e->cache = calloc((size_t)c->n_layers, sizeof *e->cache);
    if (!e->cache) return -1;
    for (int l = lowest; l < c->n_layers; l++) {
        layer_cache *k = &e->cache[l];
        if (l > lowest) {
            k->q = alloc_floats(R * QK, &failed);
            k->k = alloc_floats(R * QK, &failed);
            k->v = alloc_floats(R * VO, &failed);
            k->probs = alloc_floats(max_copies * NH * TT, &failed);
        }
        k->h_attn = alloc_floats(R * C, &failed);
        k->mean_attn = alloc_floats(R, &failed);
        k->rstd_attn = alloc_floats(R, &failed);
        k->ff_pre = alloc_floats(R * c->d_ff, &failed);
        k->h_ff = alloc_floats(R * C, &failed);
        k->mean_ff = alloc_floats(R, &failed);
        k->rstd_ff = alloc_floats(R, &failed);
    }
    e->x = alloc_floats(R * C, &failed);
    e->a = alloc_floats(R * C, &failed);
    e->ctx = alloc_floats(R * VO, &failed);
    e->ff = alloc_floats(R * c->d_ff, &failed);
    e->dh = alloc_floats(R * C, &failed);
    e->dq = alloc_floats(R * QK, &failed);
    e->dk = alloc_floats(R * QK, &failed);
    e->dv = alloc_floats(R * VO, &failed);
    e->dprobs = alloc_floats(threads * NH * TT, &failed);
    e->dscores = alloc_floats(threads * TT, &failed);
    e->cls = alloc_floats(max_copies * C, &failed);
    e->pooled = alloc_floats(max_copies * C, &failed);
    e->dcls = alloc_floats(max_copies * C, &failed);
    e->dpooled = alloc_floats(max_copies * C, &failed);
    e->dpre = alloc_floats(max_copies * C, &failed);
    e->logits = alloc_floats(max_copies * K, &failed);
    e->dlogits = alloc_floats(max_copies * K, &failed);
    e->v_l = alloc_floats(T * VO, &failed);
    e->attn_out_l = alloc_floats(T * C, &failed);
    e->grad_sum = alloc_floats(NH * TT, &failed);
    e->dctx_sum = alloc_floats(T * VO, &failed);
    return failed ? -1 : 0;
}

/* A pool job over `units` rows or copies of layer l: fn(j, u0, u1) runs on
 * units u0 .. u1 - 1, in chunks of `chunk`. */
typedef struct task_job task_job;
struct task_job {
    engine *e;
    int l, units, chunk;
    const float *x_l, *alpha; /* target_forward */
    void (*fn)(const task_job *j, int u0, int u1);
};

static void task_run(void *ctx, int task)
{
    const task_job *j = ctx;
    const int u0 = task * j->chunk, u1 = u0 + j->chunk < j->units ? u0 + j->chunk : j->units;
    j->fn(j, u0, u1);
}

/* Rows go in about 4 chunks a thread (row-wise work is even), copies one at
 * a time (the pool balances them). */
static void run_tasks(task_job *j, int per_copy)
{
    const int parts = 4 * lens_pool_threads(j->e->pool);
    j->chunk = per_copy ? 1 : (j->units + parts - 1) / parts;
    if (j->chunk < 1) j->chunk = 1;
    lens_pool_run(j->e->pool, (j->units + j->chunk - 1) / j->chunk, task_run, j);
}

/* The FFN half of BERT layer l on x = a (post-LN_attn) for R rows:
 * h_ff = a + W2 gelu(W1 a + b1) + b2, x = LN_ff(h_ff). */
static void ffn_forward(engine *e, int l, int R)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *blk = &e->m->p.blocks[l];
    layer_cache *k = &e->cache[l];
    lens_gemm_linear(k->ff_pre, e->a, &blk->ff_in, R, e->pool);
    memcpy(e->ff, k->ff_pre, sizeof(float) * R * c->d_ff);
    lens_gelu_rows(e->pool, e->ff, (size_t)c->d_ff, R, c->d_ff, c->gelu_tanh);
    lens_gemm_linear(k->h_ff, e->ff, &blk->ff_out, R, e->pool);
    lens_add_layernorm(e->pool, e->x, k->mean_ff, k->rstd_ff, k->h_ff, e->a, &blk->ln_ff, R, c->d_model, c->ln_eps);
}

/* forward: attention of copies c0 .. c1 - 1 */
static void attention_copies(const task_job *j, int c0, int c1)
{
    const lens_config *c = &j->e->m->cfg;
    layer_cache *k = &j->e->cache[j->l];
    const int T = j->e->T, NH = c->n_heads;
    const size_t QK = (size_t)NH * c->d_head_k, VO = (size_t)NH * c->d_head_v, TT = (size_t)T * T;
    for (int i = c0; i < c1; i++) {
        const size_t r = (size_t)i * T;
        lens_attention_forward(j->e->ctx + r * VO, k->probs + i * NH * TT, TT, k->q + r * QK, k->k + r * QK,
                               k->v + r * VO, T, NH, c->d_head_k, c->d_head_v, 0, c->attn_scale);
    }
}

/* Full BERT layer l (above the target) on e->x for `copies` copies; with
 * cls_only (the last layer) only each copy's [CLS] row past the attention. */
static void layer_forward(engine *e, int l, int copies, int cls_only)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *blk = &e->m->p.blocks[l];
    layer_cache *k = &e->cache[l];
    const int T = e->T, R = copies * T, C = c->d_model;
    const size_t VO = (size_t)c->n_heads * c->d_head_v;
    lens_gemm_linear(k->q, e->x, &blk->q, R, e->pool);
    lens_gemm_linear(k->k, e->x, &blk->k, R, e->pool);
    lens_gemm_linear(k->v, e->x, &blk->v, R, e->pool);
    task_job j = {.e = e, .l = l, .units = copies, .fn = attention_copies};
    run_tasks(&j, 1);
    /* F reads only the [CLS] row of the last layer's output: past the
     * attention, the last layer runs on one row per copy (row i = copy i) */
    int rows = R;
    if (cls_only) {
        for (int i = 1; i < copies; i++) { /* row i*T -> row i; i < i*T, so no source is overwritten first */
            memmove(e->ctx + i * VO, e->ctx + (size_t)i * T * VO, sizeof(float) * VO);
            memmove(e->x + (size_t)i * C, e->x + (size_t)i * T * C, sizeof(float) * C);
        }
        rows = copies;
    }
    lens_gemm_linear(k->h_attn, e->ctx, &blk->attn_out, rows, e->pool);
    lens_add_layernorm(e->pool, e->a, k->mean_attn, k->rstd_attn, k->h_attn, e->x, &blk->ln_attn, rows, C, c->ln_eps);
    ffn_forward(e, l, rows);
}

/* forward (target layer): h_attn = x_l + alpha (A v W_O) + b_O, then
 * a = LN_attn(h_attn), for copies c0 .. c1 - 1 */
static void target_copies(const task_job *j, int c0, int c1)
{
    const engine *e = j->e;
    const lens_config *c = &e->m->cfg;
    const lens_block *blk = &e->m->p.blocks[j->l];
    layer_cache *k = &e->cache[j->l];
    const int T = e->T, C = c->d_model;
    for (int i = c0; i < c1; i++) {
        const size_t r = (size_t)i * T;
        float *h = k->h_attn + r * C;
        for (int t = 0; t < T; t++)
            for (int d = 0; d < C; d++) {
                const size_t n = (size_t)t * C + d;
                h[n] = j->alpha[i] * e->attn_out_l[n] + blk->attn_out.b[d] + j->x_l[n];
            }
        lens_layernorm_forward(e->a + r * C, k->mean_attn + r, k->rstd_attn + r, h, &blk->ln_attn, T, C,
                               c->ln_eps);
    }
}

/* Target layer l with its attention probabilities scaled by alpha[i] in copy i:
 * h_attn = x_l + alpha (A v W_O) + b_O, then LN and the FFN. */
static void target_forward(engine *e, int l, const float *x_l, const float *alpha, int copies)
{
    task_job j = {.e = e, .l = l, .units = copies, .x_l = x_l, .alpha = alpha, .fn = target_copies};
    run_tasks(&j, 1);
    ffn_forward(e, l, copies * e->T);
}

/* Classifier on the [CLS] row of each copy: F[i] = softmax(W_c tanh(W_p x + b_p) + b_c)[target]. */
static void head_forward(engine *e, int copies, int target, double *F)
{
    const lens_config *c = &e->m->cfg;
    const int C = c->d_model, K = c->n_labels;
    const size_t stride = e->cls_rows ? 1 : (size_t)e->T;
    for (int i = 0; i < copies; i++) memcpy(e->cls + (size_t)i * C, e->x + i * stride * C, sizeof(float) * C);
    lens_gemm_linear(e->pooled, e->cls, &e->m->p.pooler, copies, e->pool);
    lens_tanh_forward(e->pooled, (size_t)copies * C);
    lens_gemm_linear(e->logits, e->pooled, &e->m->p.classifier, copies, e->pool);
    for (int i = 0; i < copies; i++) {
        float *z = e->logits + (size_t)i * K;
        lens_softmax_forward(z, 1, K, 0); /* logits -> probabilities in place */
        F[i] = z[target];
    }
}

/* dF/dx_L for the first `copies` copies, into e->x (zero except [CLS] rows). */
static void head_backward(engine *e, int copies, int target)
{
    const lens_config *c = &e->m->cfg;
    const int C = c->d_model, K = c->n_labels, R = copies * e->T;
    /* forward: F = p_target, p = softmax(z): dF/dz_k = p_t (δ_tk - p_k) */
    for (int i = 0; i < copies; i++) {
        const float *p = e->logits + (size_t)i * K;
        for (int k = 0; k < K; k++) e->dlogits[(size_t)i * K + k] = p[target] * ((k == target) - p[k]);
    }
    memset(e->dpooled, 0, sizeof(float) * copies * C);
    memset(e->dpre, 0, sizeof(float) * copies * C);
    memset(e->dcls, 0, sizeof(float) * copies * C);
    lens_linear_backward(e->dpooled, NULL, NULL, e->dlogits, NULL, &e->m->p.classifier, copies);
    lens_tanh_backward(e->dpre, e->pooled, e->dpooled, (size_t)copies * C);
    lens_linear_backward(e->dcls, NULL, NULL, e->dpre, NULL, &e->m->p.pooler, copies);
    const size_t stride = e->cls_rows ? 1 : (size_t)e->T;
    memset(e->x, 0, sizeof(float) * R * C);
    for (int i = 0; i < copies; i++) memcpy(e->x + i * stride * C, e->dcls + (size_t)i * C, sizeof(float) * C);
}

/* backward, rows r0 .. r1 - 1: dh = dF/dh_ff from dx = dF/d(layer output)
 * (forward: x = LN_ff(h_ff)), and da = dh (h_ff's residual branch) */
static void ln_ff_backward_rows(const task_job *j, int r0, int r1)
{
    const engine *e = j->e;
    const size_t C = e->m->cfg.d_model;
    const layer_cache *k = &e->cache[j->l];
    float *dh = e->dh + r0 * C;
    memset(dh, 0, sizeof(float) * (r1 - r0) * C);
    lens_layernorm_backward(dh, NULL, NULL, e->x + r0 * C, k->h_ff + r0 * C, k->mean_ff + r0, k->rstd_ff + r0,
                            &e->m->p.blocks[j->l].ln_ff, r1 - r0, C);
    memcpy(e->a + r0 * C, dh, sizeof(float) * (r1 - r0) * C);
}

/* backward (forward: ff = gelu(ff_pre)), in place on dff */
static void gelu_backward_rows(const task_job *j, int r0, int r1)
{
    const lens_config *c = &j->e->m->cfg;
    const size_t F = c->d_ff;
    lens_gelu_backward_inplace(j->e->ff + r0 * F, j->e->cache[j->l].ff_pre + r0 * F, (r1 - r0) * F, c->gelu_tanh);
}

/* backward: dh = dF/dh_attn from da (forward: a = LN_attn(h_attn)) */
static void ln_attn_backward_rows(const task_job *j, int r0, int r1)
{
    const engine *e = j->e;
    const size_t C = e->m->cfg.d_model;
    const layer_cache *k = &e->cache[j->l];
    float *dh = e->dh + r0 * C;
    memset(dh, 0, sizeof(float) * (r1 - r0) * C);
    lens_layernorm_backward(dh, NULL, NULL, e->a + r0 * C, k->h_attn + r0 * C, k->mean_attn + r0,
                            k->rstd_attn + r0, &e->m->p.blocks[j->l].ln_attn, r1 - r0, C);
}

/* backward of the attention of copies c0 .. c1 - 1: dq, dk, dv from dctx,
 * and dx = dh (h_attn's residual branch) for the q/k/v paths to add to */
static void attention_backward_copies(const task_job *j, int c0, int c1)
{
    const engine *e = j->e;
    const lens_config *c = &e->m->cfg;
    const layer_cache *k = &e->cache[j->l];
    const int T = e->T, NH = c->n_heads, thread = lens_pool_thread_index();
    const size_t C = c->d_model, QK = (size_t)NH * c->d_head_k, VO = (size_t)NH * c->d_head_v, TT = (size_t)T * T;
    for (int i = c0; i < c1; i++) {
        const size_t r = (size_t)i * T;
        float *dq = e->dq + r * QK, *dk = e->dk + r * QK, *dv = e->dv + r * VO;
        memcpy(e->x + r * C, e->dh + r * C, sizeof(float) * T * C);
        memset(dq, 0, sizeof(float) * T * QK);
        memset(dk, 0, sizeof(float) * T * QK);
        memset(dv, 0, sizeof(float) * T * VO);
        lens_attention_backward(dq, dk, dv, e->dprobs + thread * NH * TT, TT, e->dscores + thread * TT,
                                e->ctx + r * VO, k->q + r * QK, k->k + r * QK, k->v + r * VO,
                                k->probs + i * NH * TT, TT, T, NH, c->d_head_k, c->d_head_v, 0, c->attn_scale);
    }
}

/* Backward of BERT layer l for all copies: e->x holds dF/d(layer output) and
 * gets dF/d(layer input), unless l is the target layer: then e->ctx gets
 * dF/dctx. With cls_only everything up to dctx covers row i = copy i. */
static void layer_backward(engine *e, int l, int copies, int is_target, int cls_only)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *blk = &e->m->p.blocks[l];
    const int T = e->T, C = c->d_model, R = cls_only ? copies : copies * T, Rq = copies * T;
    const size_t VO = (size_t)c->n_heads * c->d_head_v;
    float *dh = e->dh, *dctx = e->ctx;
    task_job j = {.e = e, .l = l, .units = R};
    j.fn = ln_ff_backward_rows, run_tasks(&j, 0);
    /* forward: h_ff = ff_out(gelu(ff_in(a))) + a */
    lens_gemm_linear_backward(e->ff, dh, &blk->ff_out, R, 0, e->pool);
    j.fn = gelu_backward_rows, run_tasks(&j, 0);
    lens_gemm_linear_backward(e->a, e->ff, &blk->ff_in, R, 1, e->pool);
    j.fn = ln_attn_backward_rows, run_tasks(&j, 0);
    /* forward: h_attn = attn_out(ctx) + x */
    lens_gemm_linear_backward(dctx, dh, &blk->attn_out, R, 0, e->pool);
    if (is_target) return;
    if (cls_only) { /* back to all rows: row i -> row i*T, the other rows get no gradient */
        for (int i = copies - 1; i >= 1; i--) {
            memmove(dctx + (size_t)i * T * VO, dctx + i * VO, sizeof(float) * VO);
            memmove(dh + (size_t)i * T * C, dh + (size_t)i * C, sizeof(float) * C);
            memset(dctx + i * VO, 0, sizeof(float) * VO);
            memset(dh + (size_t)i * C, 0, sizeof(float) * C);
        }
        for (int i = 0; i < copies; i++) {
            memset(dctx + ((size_t)i * T + 1) * VO, 0, sizeof(float) * (T - 1) * VO);
            memset(dh + ((size_t)i * T + 1) * C, 0, sizeof(float) * (T - 1) * C);
        }
    }
    j = (task_job){.e = e, .l = l, .units = copies, .fn = attention_backward_copies};
    run_tasks(&j, 1);
    /* forward: q, k, v = x W_{Q,K,V} + b (attention and q, k, v cover every row) */
    lens_gemm_linear_backward(e->x, e->dq, &blk->q, Rq, 1, e->pool);
    lens_gemm_linear_backward(e->x, e->dk, &blk->k, Rq, 1, e->pool);
    lens_gemm_linear_backward(e->x, e->dv, &blk->v, Rq, 1, e->pool);
}

/* Σ over the copies of dF/dctx, then per head ∂F/∂P_h += dctx_h v_h^T
 * (forward: ctx_h = P_h v_h). */
static void accumulate_grad(engine *e, int copies)
{
    const lens_config *c = &e->m->cfg;
    const int T = e->T, NH = c->n_heads, DV = c->d_head_v;
    const size_t VO = (size_t)NH * DV, TT = (size_t)T * T;
    float *dctx_sum = e->dctx_sum;
    memcpy(dctx_sum, e->ctx, sizeof(float) * T * VO);
    for (int i = 1; i < copies; i++) lens_residual_forward(dctx_sum, e->ctx + (size_t)i * T * VO, (size_t)T * VO);
    for (int h = 0; h < NH; h++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DV, 1.0f, dctx_sum + h * DV, (int)VO,
                    e->v_l + h * DV, (int)VO, 1.0f, e->grad_sum + h * TT, T);
}

/* v = x_l W_V + b_V and attn_out_l = (P v) W_O without bias: the part of
 * layer l's attention output that scales with α (P = A_l, or any [NH][T][T]). */
static void prepare_layer(engine *e, const float *x_l, int l, const float *P)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *blk = &e->m->p.blocks[l];
    const int T = e->T, DV = c->d_head_v;
    const size_t VO = (size_t)c->n_heads * DV, TT = (size_t)T * T;
    lens_gemm_linear(e->v_l, x_l, &blk->v, T, e->pool);
    for (int h = 0; h < c->n_heads; h++) /* forward: ctx_h = P_h v_h */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, P + h * TT, T, e->v_l + h * DV,
                    (int)VO, 0.0f, e->ctx + h * DV, (int)VO);
    lens_linear no_bias = blk->attn_out;
    no_bias.b = NULL;
    lens_gemm_linear(e->attn_out_l, e->ctx, &no_bias, T, e->pool);
}

static int cancelled(const lens_attr_opts *o) { return o && lens_cancelled(o->cancel); }

/* One target layer l (0-based): attribution into out, F(0) into *f_zero. */
static int attribute_layer(engine *e, const lens_activations *act, int l, int target, int steps,
                           lens_riemann riemann, const lens_attr_opts *o, lens_attr_layer *out, lens_err *err)
{
    const lens_model *m = e->m;
    const lens_config *c = &m->cfg;
    const int T = e->T, NH = c->n_heads, L = c->n_layers;
    const size_t TT = (size_t)T * T;
    const float *x_l = lens_act_hidden(m, act, l, 0);
    const float *A = act->attn + (size_t)l * NH * act->attn_layer_size; /* one sequence: heads TT apart */

    prepare_layer(e, x_l, l, A);
    memset(e->grad_sum, 0, sizeof(float) * NH * TT);

    float alpha[e->max_copies];
    double F[e->max_copies];
    int zero_done = 0;
    out->f_zero = 0;
    for (int k0 = 0; k0 < steps;) {
        /* copies k0 .. k0+n-1 get gradients; one more forward-only copy at α = 0 first time */
        const int extra = zero_done ? 0 : 1;
        int n = e->max_copies - extra;
        if (n > steps - k0) n = steps - k0;
        for (int i = 0; i < n; i++) alpha[i] = (float)(k0 + i + (riemann == LENS_RIEMANN_RIGHT)) / steps;
        if (extra) alpha[n] = 0.0f;
        const int copies = n + extra;
        target_forward(e, l, x_l, alpha, copies);
        e->cls_rows = l < L - 1;
        for (int j = l + 1; j < L; j++) {
            if (cancelled(o)) return lens_fail(err, LENS_ECANCEL, "attribution cancelled at layer %d", l + 1);
            layer_forward(e, j, copies, j == L - 1);
        }
        head_forward(e, copies, target, F);
        if (extra) out->f_zero = F[n], zero_done = 1;
        head_backward(e, n, target);
        for (int j = L - 1; j >= l; j--) layer_backward(e, j, n, j == l, j == L - 1 && j > l);
        accumulate_grad(e, n);
        k0 += n;
    }
    /* Attr = A ⊙ (1/m) Σ_k ∂F/∂X(α_k A) */
    double sum = 0;
    for (int h = 0; h < NH; h++) {
        float best = -INFINITY;
        for (size_t ij = 0; ij < TT; ij++) {
            const float v = A[h * TT + ij] * e->grad_sum[h * TT + ij] / steps;
            out->attr[h * TT + ij] = v;
            sum += v;
            best = v > best ? v : best;
        }
        out->importance[h] = best;
    }
    out->attr_sum = sum;
    return 0;
}

static int check_model(const lens_model *m, lens_err *err)
{
    if (m->cfg.arch != LENS_ARCH_BERT || m->cfg.task != LENS_TASK_CLASSIFICATION)
        return lens_fail(err, LENS_EINVAL, "attribution needs a BERT sequence classifier; this model is %s",
                         m->cfg.architecture);
    return 0;
}

int lens_attribution_run(const lens_model *m, const int *ids, const int *type_ids, int T,
                         const lens_attr_opts *opts, lens_attribution *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads;
    memset(out, 0, sizeof *out);
    if (c->arch == LENS_ARCH_GPT2 && c->task == LENS_TASK_CAUSAL_LM) /* target = next-token id */
        return lens_attribution_gpt2_run(m, ids, T, opts, out, err);
    if (check_model(m, err)) return -1;
    const int steps = opts && opts->steps ? opts->steps : DEFAULT_STEPS;
    const lens_riemann riemann = opts ? opts->riemann : LENS_RIEMANN_RIGHT;
    if (steps < 1 || steps > 10000) return lens_fail(err, LENS_EINVAL, "steps must be in 1..10000, not %d", steps);
    if (riemann != LENS_RIEMANN_RIGHT && riemann != LENS_RIEMANN_LEFT)
        return lens_fail(err, LENS_EINVAL, "riemann must be right or left");
    const int n_sel = opts && opts->layers ? opts->n_layers : L;
    if (n_sel < 1 || n_sel > L) return lens_fail(err, LENS_EINVAL, "between 1 and %d layers, not %d", L, n_sel);
    int lowest = L;
    for (int i = 0; i < n_sel; i++) {
        const int layer = opts && opts->layers ? opts->layers[i] : i + 1;
        if (layer < 1 || layer > L) return lens_fail(err, LENS_EINVAL, "layer %d is not in 1..%d", layer, L);
        lowest = layer - 1 < lowest ? layer - 1 : lowest;
    }

    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids, .type_ids = type_ids};
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_LOGITS,
                            .cancel = opts ? opts->cancel : NULL,
                            .pool = opts ? opts->pool : NULL};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, err)) return -1;
    const float *z = lens_act_logits(m, &act, 0);
    int pred = 0;
    for (int k = 1; k < c->n_labels; k++) pred = z[k] > z[pred] ? k : pred;
    const int target = opts && opts->target >= 0 ? opts->target : pred;
    if (target >= c->n_labels) {
        lens_activations_free(&act);
        return lens_fail(err, LENS_EINVAL, "target %d is not a label index in 0..%d", target, c->n_labels - 1);
    }
    double zmax = z[0], zsum = 0;
    for (int k = 1; k < c->n_labels; k++) zmax = z[k] > zmax ? z[k] : zmax;
    for (int k = 0; k < c->n_labels; k++) zsum += exp(z[k] - zmax);

    const size_t budget = opts && opts->max_scratch_bytes ? opts->max_scratch_bytes : DEFAULT_SCRATCH;
    size_t per = bytes_per_copy(c, T, lowest), fit = budget / per;
    int max_copies = fit < 2 ? 2 : fit > (size_t)steps + 1 ? steps + 1 : (int)fit;
    engine e;
    out->layers = calloc((size_t)n_sel, sizeof *out->layers);
    if (!out->layers || engine_init(&e, m, T, max_copies, lowest, opts ? opts->pool : NULL)) {
        if (out->layers) engine_free(&e); /* engine_init leaves e freeable */
        lens_activations_free(&act);
        lens_attribution_free(out);
        return lens_fail(err, LENS_ENOMEM, "out of memory for attribution of %d tokens", T);
    }
    out->T = T, out->n_heads = NH, out->target = target, out->predicted = pred;
    out->f_full = exp(z[target] - zmax) / zsum;
    out->steps = steps, out->riemann = riemann, out->n_layers = n_sel;
    int rc = 0;
    for (int i = 0; i < n_sel && !rc; i++) {
        lens_attr_layer *ly = &out->layers[i];
        ly->layer = opts && opts->layers ? opts->layers[i] : i + 1;
        ly->attr = malloc(sizeof(float) * NH * T * T);
        ly->importance = malloc(sizeof(float) * NH);
        if (!ly->attr || !ly->importance) rc = lens_fail(err, LENS_ENOMEM, "out of memory for attributions");
        else rc = attribute_layer(&e, &act, ly->layer - 1, target, steps, riemann, opts, ly, err);
        if (!rc && opts && opts->progress) opts->progress(opts->progress_user, (double)(i + 1) / n_sel);
    }
    engine_free(&e);
    lens_activations_free(&act);
    if (rc) lens_attribution_free(out);
    return rc;
}

int lens_attr_eval(const lens_model *m, const int *ids, const int *type_ids, int T, int layer,
                   const float *probs, int target, double *F, lens_err *err)
{
    const lens_config *c = &m->cfg;
    if (check_model(m, err)) return -1;
    if (layer < 1 || layer > c->n_layers) return lens_fail(err, LENS_EINVAL, "layer %d is not in 1..%d", layer, c->n_layers);
    if (target < 0 || target >= c->n_labels) return lens_fail(err, LENS_EINVAL, "target %d is not a label index", target);
    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids, .type_ids = type_ids};
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, err)) return -1;
    engine e;
    if (engine_init(&e, m, T, 1, layer - 1, NULL)) {
        engine_free(&e);
        lens_activations_free(&act);
        return lens_fail(err, LENS_ENOMEM, "out of memory for %d tokens", T);
    }
    const float one = 1.0f;
    prepare_layer(&e, lens_act_hidden(m, &act, layer - 1, 0), layer - 1, probs);
    target_forward(&e, layer - 1, lens_act_hidden(m, &act, layer - 1, 0), &one, 1);
    e.cls_rows = layer < c->n_layers;
    for (int j = layer; j < c->n_layers; j++) layer_forward(&e, j, 1, j == c->n_layers - 1);
    head_forward(&e, 1, target, F);
    engine_free(&e);
    lens_activations_free(&act);
    return 0;
}

void lens_attribution_free(lens_attribution *a)
{
    if (a->layers)
        for (int i = 0; i < a->n_layers; i++) free(a->layers[i].attr), free(a->layers[i].importance);
    free(a->layers);
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------------ tree
 * attattr's examples/attribution_tree.py, for any number of layers L (the
 * released script hard-codes 12); docs/attribution.md states the rules. */

enum { NODE_ABSENT = -1, NODE_OPEN = 0, NODE_FIXED = 1 };

int lens_attr_tree_build(const float *const *attr, int L, int NH, int T, float threshold,
                         lens_attr_tree *tree, lens_err *err)
{
    memset(tree, 0, sizeof *tree);
    if (L < 1 || NH < 1 || T < 2) return lens_fail(err, LENS_EINVAL, "a tree needs >= 1 layer and >= 2 tokens");
    const size_t TT = (size_t)T * T;
    float *prop = malloc(sizeof(float) * L * TT); /* per layer: Σ_h attr / |max over rows 1..T-1| */
    double *total = calloc(TT, sizeof(double));   /* Σ_l Σ_h attr */
    int *state = malloc(sizeof(int) * T);
    tree->nodes = malloc(sizeof(lens_attr_node) * T);
    tree->edges = malloc(sizeof(lens_attr_edge) * T);
    if (!prop || !total || !state || !tree->nodes || !tree->edges) {
        free(prop), free(total), free(state), lens_attr_tree_free(tree);
        return lens_fail(err, LENS_ENOMEM, "out of memory for the attribution tree");
    }
    for (int l = 0; l < L; l++) {
        float *p = prop + l * TT;
        for (size_t ij = 0; ij < TT; ij++) {
            double s = 0;
            for (int h = 0; h < NH; h++) s += attr[l][h * TT + ij];
            p[ij] = (float)s;
            total[ij] += s;
        }
        float max = -INFINITY; /* rows 1.. : the [CLS] row is left out of the normaliser */
        for (size_t ij = T; ij < TT; ij++) max = p[ij] > max ? p[ij] : max;
        const float scale = fabsf(max);
        for (size_t ij = 0; ij < TT; ij++) {
            const float v = scale > 0 ? p[ij] / scale : 0.0f;
            p[ij] = v > threshold ? v : 0.0f;
        }
    }
    /* root: largest Σ_j max(0, total[i][j]) over j != i, among rows i >= 1
     * (ties: the larger i, as the reversed argsort does) */
    int root = T - 1;
    double best = -1;
    for (int i = 1; i < T; i++) {
        double s = 0;
        for (int j = 0; j < T; j++)
            if (j != i && total[(size_t)i * T + j] > 0) s += total[(size_t)i * T + j];
        if (s >= best) best = s, root = i;
    }
    tree->root = root;
    tree->threshold = threshold;
    for (int i = 0; i < T; i++) state[i] = NODE_ABSENT;
    state[root] = NODE_OPEN;
    tree->nodes[tree->n_nodes++] = (lens_attr_node){root, L};
#define ADD_EDGE(li, i, j)                                                                               \
    do {                                                                                                 \
        tree->edges[tree->n_edges++] = (lens_attr_edge){(li) + 1, (i), (j), prop[(li) * TT + (size_t)(i) * T + (j)]}; \
        tree->nodes[tree->n_nodes++] = (lens_attr_node){(j), (li) + 1};                                  \
    } while (0)
    if (L >= 2) { /* second-to-last layer: children of the root */
        const int li = L - 2;
        for (int j = 0; j < T; j++)
            if (j != root && prop[li * TT + (size_t)root * T + j] > threshold) {
                state[j] = NODE_OPEN;
                state[root] = NODE_FIXED;
                ADD_EDGE(li, root, j);
            }
    }
    for (int li = L - 3; li >= 0; li--)
        for (int i = 1; i < T; i++)
            for (int j = 0; j < T; j++) {
                /* an edge only from a node in the tree to a token not yet in it; the
                 * parent becomes fixed when it gains its first child below the root layer */
                if (prop[li * TT + (size_t)i * T + j] < threshold || state[i] == NODE_ABSENT) continue;
                if (state[j] != NODE_ABSENT) continue;
                state[i] = NODE_FIXED;
                state[j] = NODE_OPEN;
                ADD_EDGE(li, i, j);
            }
#undef ADD_EDGE
    free(prop), free(total), free(state);
    return 0;
}

void lens_attr_tree_free(lens_attr_tree *tree)
{
    free(tree->nodes), free(tree->edges);
    memset(tree, 0, sizeof *tree);
}
