/* attribution.c - self-attention attribution, Hao et al. AAAI 2021, for
 * sequence classifiers and causal LMs.
 *
 *     Attr_l = A_l ⊙ Σ_k w_k ∂F/∂X |_{X = α_k A_l},   (Riemann: w_k = 1/m; Gauss–Legendre)
 *     F = p(c | x) (classifier) or p(next token = c) at the last position (causal LM)
 *
 * Blocks are post-norm (BERT: h = x + attn(x); a = LN_1(h); x' = LN_2(a +
 * FFN(a))) or pre-norm (GPT-2, LENS_CAP_PRE_NORM: h = x + attn(LN_1(x)); x' =
 * h + FFN(LN_2(h))). Either way the residual stream after the attention half,
 * "mid" h = residual + attn_out(ctx), is followed by one LayerNorm (post:
 * ln_attn, pre: ln_ff) feeding the FFN, which is what makes one engine serve
 * both. F reads one row of the last layer, the objective row: 0 ([CLS]-like
 * first token) for classifiers, T-1 for causal LMs.
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
#include "core/model/arch.h"
#include "core/nn/ops.h"

#define DEFAULT_SCRATCH ((size_t)256 << 20)

/* Forward values one layer's backward reads, for R = copies * T rows. */
typedef struct {
    float *q, *k, *v;              /* [R][NH*DK], [R][NH*DK], [R][NH*DV]; NULL for the target layer */
    float *probs;                  /* [copies][NH][T][T]; NULL for the target layer */
    float *h_attn;                 /* [R][C] mid: residual + attn_out(ctx), input of the mid LayerNorm */
    float *mean_attn, *rstd_attn;  /* [R] mid LayerNorm statistics */
    float *ff_pre;                 /* [R][d_ff] GELU input */
    float *h_ff;                   /* [R][C] post-norm: LN_ff input a + ff_out(gelu(ff_pre));
                                      pre-norm: the layer input, LN_1's input */
    float *mean_ff, *rstd_ff;      /* [R] LN_ff (post) / LN_1 (pre) statistics */
} layer_cache;

typedef struct {
    const lens_model *m;
    int T, max_copies, lowest; /* lowest: smallest 0-based target layer */
    int pre_norm, causal;      /* LENS_CAP_PRE_NORM, LENS_CAP_CAUSAL */
    int lm;                    /* objective: next-token probability (causal LM), else class probability */
    int K;                     /* outputs of the head: labels, or the vocabulary */
    int obj_row;               /* the row F reads: 0 (classifier) or T-1 (causal LM) */
    int cls_rows;              /* 1: the last layer ran on the objective rows only, row i = copy i */
    layer_cache *cache;        /* [L] */
    lens_pool *pool;           /* threads for the GEMMs of the forward steps */
    /* forward work [R][...]; reused as gradients in the backward */
    float *x, *a, *ctx, *ff;   /* [R][C], [R][C], [R][NH*DV], [R][d_ff] */
    float *dh, *dq, *dk, *dv;  /* [R][C], [R][NH*DK] x2, [R][NH*DV] */
    float *dprobs, *dscores;   /* per pool thread: [NH][T][T], [T][T] */
    float *cls, *pooled, *logits, *dcls, *dpooled, *dpre, *dlogits; /* [copies][C or K]; LM: pooled = ln_f(cls) */
    float *mean_f, *rstd_f;    /* LM: [copies] ln_f statistics */
    /* target layer, computed once per layer */
    float *v_l, *attn_out_l;   /* [T][NH*DV] values, [T][C] (A v) W_O without bias */
    float *dctx_sum;           /* [T][NH*DV] Σ over copies of w_k dF/dctx */
    float *grad_sum;           /* [NH][T][T] Σ_k w_k ∂F/∂X */
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
    const size_t work = T * (3 * C + VO + c->d_ff + 2 * QK + VO) + 7 * C +
                        (c->task == LENS_TASK_CAUSAL_LM ? 2 * (size_t)c->vocab_size : 0); /* logits, dlogits */
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
    free(e->dctx_sum), free(e->mean_f), free(e->rstd_f);
}

static int engine_init(engine *e, const lens_model *m, int T, int max_copies, int lowest, lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const size_t C = c->d_model, QK = (size_t)c->n_heads * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    const int lm = c->task == LENS_TASK_CAUSAL_LM;
    const size_t R = (size_t)max_copies * T, NH = c->n_heads, K = lm ? c->vocab_size : c->n_labels, TT = (size_t)T * T;
    int failed = 0;
    memset(e, 0, sizeof *e);
    e->m = m, e->T = T, e->max_copies = max_copies, e->lowest = lowest, e->pool = pool;
    e->pre_norm = lens_has_cap(c, LENS_CAP_PRE_NORM), e->causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    e->lm = lm, e->K = (int)K, e->obj_row = lm ? T - 1 : 0;
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
    e->mean_f = alloc_floats(max_copies, &failed);
    e->rstd_f = alloc_floats(max_copies, &failed);
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

/* The LayerNorm after the mid residual: post-norm ln_attn, pre-norm ln_2. */
static const lens_layernorm *mid_ln(const engine *e, int l)
{
    const lens_block *blk = &e->m->p.blocks[l];
    return e->pre_norm ? &blk->ln_ff : &blk->ln_attn;
}

/* The FFN half of layer l on a = LN_mid(mid) for R rows:
 * post-norm: h_ff = a + W2 gelu(W1 a + b1) + b2, x = LN_ff(h_ff);
 * pre-norm:  x = mid + W2 gelu(W1 a + b1) + b2. */
static void ffn_forward(engine *e, int l, int R)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *blk = &e->m->p.blocks[l];
    layer_cache *k = &e->cache[l];
    lens_gemm_linear(k->ff_pre, e->a, &blk->ff_in, R, e->pool);
    memcpy(e->ff, k->ff_pre, sizeof(float) * R * c->d_ff);
    lens_gelu_rows(e->pool, e->ff, (size_t)c->d_ff, R, c->d_ff, c->gelu_tanh);
    if (e->pre_norm) {
        lens_gemm_linear(e->x, e->ff, &blk->ff_out, R, e->pool);
        lens_residual_layernorm(e->pool, e->x, k->h_attn, NULL, NULL, NULL, NULL, R, c->d_model, c->ln_eps);
        return;
    }
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
                               k->v + r * VO, T, NH, c->d_head_k, c->d_head_v, j->e->causal, c->attn_scale);
    }
}

/* Full layer l (above the target) on e->x for `copies` copies; with
 * cls_only (the last layer) only each copy's objective row past the
 * attention. Pre-norm: LN_1's input (the layer input) is kept in h_ff. */
static void layer_forward(engine *e, int l, int copies, int cls_only)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *blk = &e->m->p.blocks[l];
    layer_cache *k = &e->cache[l];
    const int T = e->T, R = copies * T, C = c->d_model, r = e->obj_row;
    const size_t VO = (size_t)c->n_heads * c->d_head_v;
    const float *in = e->x;
    if (e->pre_norm) { /* forward: n1 = LN_1(x) */
        memcpy(k->h_ff, e->x, sizeof(float) * R * C);
        lens_add_layernorm(e->pool, e->a, k->mean_ff, k->rstd_ff, k->h_ff, NULL, &blk->ln_attn, R, C, c->ln_eps);
        in = e->a;
    }
    lens_gemm_linear(k->q, in, &blk->q, R, e->pool);
    lens_gemm_linear(k->k, in, &blk->k, R, e->pool);
    lens_gemm_linear(k->v, in, &blk->v, R, e->pool);
    task_job j = {.e = e, .l = l, .units = copies, .fn = attention_copies};
    run_tasks(&j, 1);
    /* F reads only the objective row of the last layer's output: past the
     * attention, the last layer runs on one row per copy (row i = copy i) */
    int rows = R;
    if (cls_only) {
        for (int i = 0; i < copies; i++) { /* row i*T + r -> row i <= i*T + r: sources are read before overwritten */
            const size_t from = (size_t)i * T + r;
            if (from == (size_t)i) continue;
            memmove(e->ctx + i * VO, e->ctx + from * VO, sizeof(float) * VO);
            memmove(e->x + (size_t)i * C, e->x + from * C, sizeof(float) * C);
        }
        rows = copies;
    }
    /* forward: mid = x + attn_out(ctx); a = LN_mid(mid) */
    lens_gemm_linear(k->h_attn, e->ctx, &blk->attn_out, rows, e->pool);
    lens_add_layernorm(e->pool, e->a, k->mean_attn, k->rstd_attn, k->h_attn, e->x, mid_ln(e, l), rows, C, c->ln_eps);
    ffn_forward(e, l, rows);
}

/* forward (target layer): mid = x_l + alpha (A v W_O) + b_O, then
 * a = LN_mid(mid), for copies c0 .. c1 - 1 */
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
        lens_layernorm_forward(e->a + r * C, k->mean_attn + r, k->rstd_attn + r, h, mid_ln(e, j->l), T, C,
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

/* The tied LM decoder: logits = t E^T. */
static lens_linear lm_decoder(const engine *e)
{
    const lens_config *c = &e->m->cfg;
    return (lens_linear){.w = e->m->p.tok_emb, .in = c->d_model, .out = c->vocab_size, .ld = c->d_model};
}

/* softmax(z)[target] over K logits in double with libm's exp, and, when p
 * is not NULL, every probability into p [K]. F(A) and F(0) come out of two
 * different forward paths, and the completeness gap is their difference:
 * the forward's float32 softmax (lens_exp_approx, float sums) over GPT-2's
 * 50257 tokens set a floor of 4e-5 .. 7e-5 on it. */
static double softmax_at(const float *z, int K, int target, float *p)
{
    double zmax = z[0], sum = 0;
    for (int k = 1; k < K; k++) zmax = z[k] > zmax ? z[k] : zmax;
    for (int k = 0; k < K; k++) sum += exp(z[k] - zmax);
    const double f = exp(z[target] - zmax) / sum;
    for (int k = 0; p && k < K; k++) p[k] = (float)(exp(z[k] - zmax) / sum); /* p may be z */
    return f;
}

/* The head on the objective row of each copy, F[i] = softmax(z)[target] with
 * classifier: z = W_c act(W_p x + b_p) + b_c (act tanh, or ReLU);
 * causal LM:  z = ln_f(x) E^T. */
static void head_forward(engine *e, int copies, int target, double *F)
{
    const lens_config *c = &e->m->cfg;
    const int C = c->d_model, K = e->K;
    const size_t stride = e->cls_rows ? 1 : (size_t)e->T, r = e->cls_rows ? 0 : (size_t)e->obj_row;
    for (int i = 0; i < copies; i++) memcpy(e->cls + (size_t)i * C, e->x + (i * stride + r) * C, sizeof(float) * C);
    if (e->lm) {
        const lens_linear dec = lm_decoder(e);
        lens_layernorm_forward(e->pooled, e->mean_f, e->rstd_f, e->cls, &e->m->p.ln_final, copies, C, c->ln_eps);
        lens_gemm_linear(e->logits, e->pooled, &dec, copies, e->pool);
    } else {
        lens_gemm_linear(e->pooled, e->cls, &e->m->p.pooler, copies, e->pool);
        (c->head_relu ? lens_relu_forward : lens_tanh_forward)(e->pooled, (size_t)copies * C);
        lens_gemm_linear(e->logits, e->pooled, &e->m->p.classifier, copies, e->pool);
    }
    for (int i = 0; i < copies; i++) { /* logits -> probabilities in place */
        float *z = e->logits + (size_t)i * K;
        F[i] = softmax_at(z, K, target, z);
    }
}

/* dF/dx_L for the first `copies` copies, into e->x (zero except objective rows). */
static void head_backward(engine *e, int copies, int target)
{
    const lens_config *c = &e->m->cfg;
    const int C = c->d_model, K = e->K, R = copies * e->T;
    /* forward: F = p_target, p = softmax(z): dF/dz_k = p_t (δ_tk - p_k) */
    for (int i = 0; i < copies; i++) {
        const float *p = e->logits + (size_t)i * K;
        for (int k = 0; k < K; k++) e->dlogits[(size_t)i * K + k] = p[target] * ((k == target) - p[k]);
    }
    memset(e->dpooled, 0, sizeof(float) * copies * C);
    memset(e->dpre, 0, sizeof(float) * copies * C);
    memset(e->dcls, 0, sizeof(float) * copies * C);
    if (e->lm) { /* forward: z = ln_f(x) E^T */
        const lens_linear dec = lm_decoder(e);
        lens_gemm_linear_backward(e->dpooled, e->dlogits, &dec, copies, 0, e->pool);
        lens_layernorm_backward(e->dcls, NULL, NULL, e->dpooled, e->cls, e->mean_f, e->rstd_f, &e->m->p.ln_final,
                                copies, C);
    } else {
        lens_linear_backward(e->dpooled, NULL, NULL, e->dlogits, NULL, &e->m->p.classifier, copies);
        (c->head_relu ? lens_relu_backward : lens_tanh_backward)(e->dpre, e->pooled, e->dpooled, (size_t)copies * C);
        lens_linear_backward(e->dcls, NULL, NULL, e->dpre, NULL, &e->m->p.pooler, copies);
    }
    const size_t stride = e->cls_rows ? 1 : (size_t)e->T, r = e->cls_rows ? 0 : (size_t)e->obj_row;
    memset(e->x, 0, sizeof(float) * R * C);
    for (int i = 0; i < copies; i++) memcpy(e->x + (i * stride + r) * C, e->dcls + (size_t)i * C, sizeof(float) * C);
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

/* backward: dh = dF/dmid from da (forward: a = LN_mid(mid)); pre-norm
 * adds to dh = dx, the gradient of the residual x' = mid + FFN(a) */
static void ln_attn_backward_rows(const task_job *j, int r0, int r1)
{
    const engine *e = j->e;
    const size_t C = e->m->cfg.d_model;
    const layer_cache *k = &e->cache[j->l];
    float *dh = e->dh + r0 * C;
    if (e->pre_norm) memcpy(dh, e->x + r0 * C, sizeof(float) * (r1 - r0) * C);
    else memset(dh, 0, sizeof(float) * (r1 - r0) * C);
    lens_layernorm_backward(dh, NULL, NULL, e->a + r0 * C, k->h_attn + r0 * C, k->mean_attn + r0,
                            k->rstd_attn + r0, mid_ln(e, j->l), r1 - r0, C);
}

/* backward (pre-norm): dx += LN_1 backward of dn1 = e->a (forward: n1 = LN_1(x)) */
static void ln1_backward_rows(const task_job *j, int r0, int r1)
{
    const engine *e = j->e;
    const size_t C = e->m->cfg.d_model;
    const layer_cache *k = &e->cache[j->l];
    lens_layernorm_backward(e->x + r0 * C, NULL, NULL, e->a + r0 * C, k->h_ff + r0 * C, k->mean_ff + r0,
                            k->rstd_ff + r0, &e->m->p.blocks[j->l].ln_attn, r1 - r0, C);
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
                                k->probs + i * NH * TT, TT, T, NH, c->d_head_k, c->d_head_v, e->causal, c->attn_scale);
    }
}

/* Rows of `copies` copies compacted to one row each (row i = copy i's row
 * r) go back to all rows: row i -> row i*T + r, the other rows get 0.
 * Descending i: a destination i*T + r >= i never holds an unmoved source. */
static void expand_rows(float *x, size_t width, int copies, int T, int r)
{
    for (int i = copies - 1; i >= 0; i--) {
        const size_t to = (size_t)i * T + r;
        if (to != (size_t)i) memmove(x + to * width, x + i * width, sizeof(float) * width);
    }
    for (int i = 0; i < copies; i++) {
        memset(x + (size_t)i * T * width, 0, sizeof(float) * r * width);
        memset(x + ((size_t)i * T + r + 1) * width, 0, sizeof(float) * (T - 1 - r) * width);
    }
}

/* Backward of layer l for all copies: e->x holds dF/d(layer output) and
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
    /* forward, post-norm: x' = LN_ff(h_ff), h_ff = ff_out(gelu(ff_in(a))) + a;
     *          pre-norm:  x' = mid + ff_out(gelu(ff_in(a))) */
    if (e->pre_norm) lens_gemm_linear_backward(e->ff, e->x, &blk->ff_out, R, 0, e->pool);
    else {
        j.fn = ln_ff_backward_rows, run_tasks(&j, 0);
        lens_gemm_linear_backward(e->ff, dh, &blk->ff_out, R, 0, e->pool);
    }
    j.fn = gelu_backward_rows, run_tasks(&j, 0);
    lens_gemm_linear_backward(e->a, e->ff, &blk->ff_in, R, !e->pre_norm, e->pool);
    j.fn = ln_attn_backward_rows, run_tasks(&j, 0);
    /* forward: mid = attn_out(ctx) + x */
    lens_gemm_linear_backward(dctx, dh, &blk->attn_out, R, 0, e->pool);
    if (is_target) return;
    if (cls_only) {
        expand_rows(dctx, VO, copies, T, e->obj_row);
        expand_rows(dh, (size_t)C, copies, T, e->obj_row);
    }
    j = (task_job){.e = e, .l = l, .units = copies, .fn = attention_backward_copies};
    run_tasks(&j, 1);
    /* forward: q, k, v = in W_{Q,K,V} + b, in = x (post-norm) or LN_1(x)
     * (attention and q, k, v cover every row) */
    float *din = e->pre_norm ? e->a : e->x;
    lens_gemm_linear_backward(din, e->dq, &blk->q, Rq, !e->pre_norm, e->pool);
    lens_gemm_linear_backward(din, e->dk, &blk->k, Rq, 1, e->pool);
    lens_gemm_linear_backward(din, e->dv, &blk->v, Rq, 1, e->pool);
    if (e->pre_norm) {
        j = (task_job){.e = e, .l = l, .units = Rq, .fn = ln1_backward_rows};
        run_tasks(&j, 0);
    }
}

/* Σ over the copies of w_i dF/dctx, then per head ∂F/∂P_h += dctx_h v_h^T
 * (forward: ctx_h = P_h v_h). Riemann's w_i = 1 leaves the sum exact. */
static void accumulate_grad(engine *e, int copies, const float *w)
{
    const lens_config *c = &e->m->cfg;
    const int T = e->T, NH = c->n_heads, DV = c->d_head_v;
    const size_t VO = (size_t)NH * DV, TT = (size_t)T * T;
    float *dctx_sum = e->dctx_sum;
    memset(dctx_sum, 0, sizeof(float) * T * VO);
    for (int i = 0; i < copies; i++) cblas_saxpy(T * (int)VO, w[i], e->ctx + (size_t)i * T * VO, 1, dctx_sum, 1);
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
    if (e->pre_norm) { /* the values read LN_1(x_l) */
        lens_layernorm_forward(e->a, NULL, NULL, x_l, &blk->ln_attn, T, c->d_model, c->ln_eps);
        x_l = e->a;
    }
    lens_gemm_linear(e->v_l, x_l, &blk->v, T, e->pool);
    for (int h = 0; h < c->n_heads; h++) /* forward: ctx_h = P_h v_h */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, P + h * TT, T, e->v_l + h * DV,
                    (int)VO, 0.0f, e->ctx + h * DV, (int)VO);
    lens_linear no_bias = blk->attn_out;
    no_bias.b = NULL;
    lens_gemm_linear(e->attn_out_l, e->ctx, &no_bias, T, e->pool);
}

static int cancelled(const lens_attr_opts *o) { return o && lens_cancelled(o->cancel); }

void lens_gauss_legendre(int m, double *x, double *w)
{
    for (int i = 0; i < (m + 1) / 2; i++) {
        /* the i-th largest root; Newton converges quadratically from here */
        double z = cos(M_PI * (i + 0.75) / (m + 0.5)), dp = 1;
        for (int it = 0; it < 100; it++) {
            double p0 = 1, p1 = z; /* P_0, P_1, then (k+1) P_{k+1} = (2k+1) z P_k − k P_{k−1} */
            for (int k = 1; k < m; k++) {
                const double p2 = ((2 * k + 1) * z * p1 - k * p0) / (k + 1);
                p0 = p1, p1 = p2;
            }
            dp = m * (z * p1 - p0) / (z * z - 1); /* P_m' from P_m and P_{m−1} */
            const double dz = p1 / dp;
            z -= dz;
            if (fabs(dz) < 1e-15) break;
        }
        x[m - 1 - i] = z, x[i] = -z;
        w[i] = w[m - 1 - i] = 2 / ((1 - z * z) * dp * dp);
    }
}

double lens_attr_nodes(lens_quadrature q, lens_riemann r, int m, double *alpha, double *weight)
{
    if (m < 1) return 0;
    if (q == LENS_QUAD_GAUSS) { /* [-1, 1] -> [0, 1]: α = (1 + x) / 2, w / 2 */
        lens_gauss_legendre(m, alpha, weight);
        for (int k = 0; k < m; k++) alpha[k] = (1 + alpha[k]) / 2, weight[k] /= 2;
        return 1;
    }
    if (q != LENS_QUAD_RIEMANN || (r != LENS_RIEMANN_RIGHT && r != LENS_RIEMANN_LEFT)) return 0;
    for (int k = 0; k < m; k++) alpha[k] = (double)(k + (r == LENS_RIEMANN_RIGHT)) / m, weight[k] = 1;
    return m;
}

/* The m evaluations of lens_attr_nodes, as the engine takes them. */
typedef struct {
    int m;
    float *alpha, *weight; /* [m] */
    double divisor;
} schedule;

static void schedule_free(schedule *s) { free(s->alpha), free(s->weight); }

/* -1 when out of memory (q and r are checked by the caller) */
static int schedule_init(schedule *s, lens_quadrature q, lens_riemann r, int m)
{
    double *a = malloc(sizeof(double) * m), *w = malloc(sizeof(double) * m);
    s->m = m, s->alpha = malloc(sizeof(float) * m), s->weight = malloc(sizeof(float) * m);
    const int ok = a && w && s->alpha && s->weight;
    if (ok) {
        s->divisor = lens_attr_nodes(q, r, m, a, w);
        for (int k = 0; k < m; k++) s->alpha[k] = (float)a[k], s->weight[k] = (float)w[k];
    }
    free(a), free(w);
    return ok ? 0 : -1;
}

/* One target layer l (0-based): attribution into out, F(0) into *f_zero. */
static int attribute_layer(engine *e, const lens_activations *act, int l, int target, const schedule *s,
                           const lens_attr_opts *o, lens_attr_layer *out, lens_err *err)
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
    for (int k0 = 0; k0 < s->m;) {
        if (cancelled(o)) return lens_fail(err, LENS_ECANCEL, "attribution cancelled at layer %d", l + 1);
        /* copies k0 .. k0+n-1 get gradients; one more forward-only copy at α = 0 first time */
        const int extra = zero_done ? 0 : 1;
        int n = e->max_copies - extra;
        if (n > s->m - k0) n = s->m - k0;
        memcpy(alpha, s->alpha + k0, sizeof(float) * n);
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
        accumulate_grad(e, n, s->weight + k0);
        k0 += n;
    }
    /* Attr = A ⊙ Σ_k w_k ∂F/∂X(α_k A) / divisor */
    double sum = 0;
    for (int h = 0; h < NH; h++) {
        float best = -INFINITY;
        for (size_t ij = 0; ij < TT; ij++) {
            const float v = A[h * TT + ij] * e->grad_sum[h * TT + ij] / s->divisor;
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
    const char *why = NULL;
    if (!lens_model_supports(m, LENS_ANALYSIS_ATTRIBUTION, &why))
        return lens_fail(err, LENS_EINVAL, "%s; this model is %s", why, m->cfg.architecture);
    return 0;
}

int lens_attribution_run(const lens_model *m, const int *ids, const int *type_ids, int T,
                         const lens_attr_opts *opts, lens_attribution *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads;
    memset(out, 0, sizeof *out);
    if (check_model(m, err)) return -1;
    const lens_riemann riemann = opts ? opts->riemann : LENS_RIEMANN_RIGHT;
    const lens_quadrature quad = opts ? opts->quadrature : LENS_QUAD_RIEMANN;
    if (quad != LENS_QUAD_RIEMANN && quad != LENS_QUAD_GAUSS)
        return lens_fail(err, LENS_EINVAL, "quadrature must be riemann or gauss");
    const int steps = opts && opts->steps ? opts->steps
                      : quad == LENS_QUAD_GAUSS ? LENS_ATTR_GAUSS_NODES : LENS_ATTR_RIEMANN_STEPS;
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

    /* causal LM: the next token after the last position; segments mean nothing to it */
    const int lm = c->task == LENS_TASK_CAUSAL_LM, K = lm ? c->vocab_size : c->n_labels;
    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids, .type_ids = lm ? NULL : type_ids};
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_LOGITS,
                            .cancel = opts ? opts->cancel : NULL,
                            .pool = opts ? opts->pool : NULL};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, err)) return -1;
    const float *z = lens_act_logits(m, &act, 0) + (lm ? (size_t)(T - 1) * K : 0);
    int pred = 0;
    for (int k = 1; k < K; k++) pred = z[k] > z[pred] ? k : pred;
    const int target = opts && opts->target >= 0 ? opts->target : pred;
    if (target >= K) {
        lens_activations_free(&act);
        return lm ? lens_fail(err, LENS_EINVAL, "target %d is not a token id in 0..%d", target, K - 1)
                  : lens_fail(err, LENS_EINVAL, "target %d is not a label index in 0..%d", target, K - 1);
    }

    const size_t budget = opts && opts->max_scratch_bytes ? opts->max_scratch_bytes : DEFAULT_SCRATCH;
    size_t per = bytes_per_copy(c, T, lowest), fit = budget / per;
    int max_copies = fit < 2 ? 2 : fit > (size_t)steps + 1 ? steps + 1 : (int)fit;
    engine e;
    schedule sched;
    out->layers = calloc((size_t)n_sel, sizeof *out->layers);
    const int no_sched = schedule_init(&sched, quad, riemann, steps);
    if (no_sched || !out->layers || engine_init(&e, m, T, max_copies, lowest, opts ? opts->pool : NULL)) {
        if (!no_sched && out->layers) engine_free(&e); /* engine_init leaves e freeable */
        schedule_free(&sched);
        lens_activations_free(&act);
        lens_attribution_free(out);
        return lens_fail(err, LENS_ENOMEM, "out of memory for attribution of %d tokens", T);
    }
    out->T = T, out->n_heads = NH, out->target = target, out->predicted = pred;
    out->f_full = softmax_at(z, K, target, NULL);
    out->steps = steps, out->riemann = riemann, out->quadrature = quad, out->n_layers = n_sel;
    int rc = 0;
    for (int i = 0; i < n_sel && !rc; i++) {
        lens_attr_layer *ly = &out->layers[i];
        ly->layer = opts && opts->layers ? opts->layers[i] : i + 1;
        ly->attr = malloc(sizeof(float) * NH * T * T);
        ly->importance = malloc(sizeof(float) * NH);
        if (!ly->attr || !ly->importance) rc = lens_fail(err, LENS_ENOMEM, "out of memory for attributions");
        else rc = attribute_layer(&e, &act, ly->layer - 1, target, &sched, opts, ly, err);
        if (!rc && opts && opts->progress) opts->progress(opts->progress_user, (double)(i + 1) / n_sel);
    }
    engine_free(&e);
    schedule_free(&sched);
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
    const int K = c->task == LENS_TASK_CAUSAL_LM ? c->vocab_size : c->n_labels;
    if (target < 0 || target >= K) return lens_fail(err, LENS_EINVAL, "target %d is not a label index or token id", target);
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
