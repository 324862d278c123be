/* attribution.c - self-attention attribution, Hao et al. AAAI 2021, for
 * sequence classifiers and causal LMs.
 *
 *     Attr_l = A_l ⊙ (1/m) Σ_k ∂F/∂X |_{X = α_k A_l},
 *     F = p(c | x) (classifier) or p(next token = c) at the last position (causal LM)
 * by default, or its log, the logit z_c, or z_c - z_foil (lens_objective; a
 * causal LM's objective row may be any position)
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
#include "core/model/head.h"
#include "core/nn/ops.h"

#define DEFAULT_SCRATCH ((size_t)256 << 20)

typedef struct {
    const lens_model *m;
    int T, max_copies, lowest; /* lowest: smallest 0-based target layer */
    int causal;                /* LENS_CAP_CAUSAL */
    int lm;                    /* objective: next-token probability (causal LM), else class probability */
    int K;                     /* outputs of the head: labels, or the vocabulary */
    int obj_row;               /* the row F reads: 0 (classifier) or the objective's position (causal LM) */
    lens_objective obj;        /* what F is (obj.position resolved) */
    int cls_rows;              /* 1: the last layer ran on the objective rows only, row i = copy i */
    lens_block_cache *cache;   /* [L], max_copies * T rows: what the family's block backward reads */
    int *pos;                  /* [max_copies * T] position of each row in its copy (RoPE families) */
    float **probs;             /* [L] -> [copies][NH][T][T] above the lowest target layer */
    lens_block_cache final;    /* LM: the final norm's, one row per copy */
    lens_pool *pool;           /* threads for the GEMMs of the forward steps */
    /* the step of the current pass: target layer, its attention A [NH][T][T], α per copy */
    int target, copies;
    const float *A, *alpha;
    const float *weight;       /* [copies] quadrature weights of the copies being differentiated */
    /* block io work [R][...]; the same buffers carry the gradients in the backward */
    float *x, *h, *n, *ctx, *ff;   /* [R][C] x3, [R][NH*DV], [R][lens_ff_cols] */
    float *dq, *dk, *dv;       /* [R][NH*DK] x2, [R][NH*DV] */
    float *dprobs, *dscores;   /* per pool thread: [NH][T][T], [T][T] */
    float *cls, *pooled, *logits, *dcls, *dpre, *dlogits; /* [copies][C or K]; LM: pooled = ln_f(cls) */
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
static size_t bytes_per_copy(const lens_model *m, int T, int lowest)
{
    const lens_config *c = &m->cfg;
    const size_t C = c->d_model, QK = (size_t)c->n_heads * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    size_t layers = 0; /* every layer from lowest: q, k, v and its cache */
    for (int l = lowest; l < c->n_layers; l++) layers += T * (2 * QK + VO + lens_block_cache_floats(m, l, 0));
    const size_t per_above = (size_t)c->n_heads * T * T;
    const size_t work = T * (3 * C + VO + (size_t)lens_ff_cols(m) + 2 * QK + VO) + 7 * C +
                        (c->task == LENS_TASK_CAUSAL_LM ? 2 * (size_t)c->vocab_size : 0); /* logits, dlogits */
    return sizeof(float) * (layers + (c->n_layers - 1 - lowest) * per_above + work);
}

static void engine_free(engine *e)
{
    for (int l = 0; e->cache && l < e->m->cfg.n_layers; l++) lens_block_cache_free(&e->cache[l]);
    for (int l = 0; e->probs && l < e->m->cfg.n_layers; l++) free(e->probs[l]);
    free(e->cache), free(e->probs), free(e->pos);
    lens_block_cache_free(&e->final);
    free(e->x), free(e->h), free(e->n), free(e->ctx), free(e->ff), free(e->dq), free(e->dk), free(e->dv);
    free(e->dprobs), free(e->dscores), free(e->cls), free(e->pooled), free(e->logits), free(e->dcls);
    free(e->dpre), free(e->dlogits), free(e->grad_sum), free(e->dctx_sum);
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
    e->causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    e->lm = lm, e->K = (int)K, e->obj_row = lm ? T - 1 : 0;
    const size_t threads = (size_t)lens_pool_threads(pool);
    e->cache = calloc((size_t)c->n_layers, sizeof *e->cache);
    e->probs = calloc((size_t)c->n_layers, sizeof *e->probs);
    e->pos = malloc(sizeof(int) * R);
    if (!e->cache || !e->probs || !e->pos) return -1;
    for (size_t r = 0; r < R; r++) e->pos[r] = (int)(r % (size_t)T);
    for (int l = lowest; l < c->n_layers; l++) {
        if (lens_block_cache_init(&e->cache[l], m, l, (int)R, 0)) failed = 1;
        if (l > lowest) e->probs[l] = alloc_floats(max_copies * NH * TT, &failed);
    }
    if (lens_block_cache_init(&e->final, m, c->n_layers, max_copies, 0)) failed = 1;
    e->x = alloc_floats(R * C, &failed);
    e->h = alloc_floats(R * C, &failed);
    e->n = alloc_floats(R * C, &failed);
    e->ctx = alloc_floats(R * VO, &failed);
    e->ff = alloc_floats(R * lens_ff_cols(m), &failed); /* gated MLPs: gate and up */
    e->dq = alloc_floats(R * QK, &failed);
    e->dk = alloc_floats(R * QK, &failed);
    e->dv = alloc_floats(R * VO, &failed);
    e->dprobs = alloc_floats(threads * NH * TT, &failed);
    e->dscores = alloc_floats(threads * TT, &failed);
    e->cls = alloc_floats(max_copies * C, &failed);
    e->pooled = alloc_floats(max_copies * C, &failed);
    e->dcls = alloc_floats(max_copies * C, &failed);
    e->dpre = alloc_floats(max_copies * C, &failed);
    e->logits = alloc_floats(max_copies * K, &failed);
    e->dlogits = alloc_floats(max_copies * K, &failed);
    e->grad_sum = alloc_floats(NH * TT, &failed);
    e->dctx_sum = alloc_floats(T * VO, &failed);
    return failed ? -1 : 0;
}

/* A pool job over the copies of layer l: fn(j, c0, c1) runs on copies c0 .. c1 - 1. */
typedef struct task_job task_job;
struct task_job {
    engine *e;
    lens_block_io *io;
    int l, units;
    void (*fn)(const task_job *j, int u0, int u1);
};

static void task_run(void *ctx, int task)
{
    const task_job *j = ctx;
    j->fn(j, task, task + 1);
}

/* Copies one at a time (the pool balances them). */
static void run_copies(task_job *j) { lens_pool_run(j->e->pool, j->units, task_run, j); }

/* forward: attention of copies c0 .. c1 - 1 above the target layer */
static void attention_copies(const task_job *j, int c0, int c1)
{
    const lens_config *c = &j->e->m->cfg;
    const lens_block_io *io = j->io;
    const int T = j->e->T, NH = c->n_heads;
    const size_t QK = (size_t)NH * c->d_head_k, VO = (size_t)NH * c->d_head_v, TT = (size_t)T * T;
    const lens_score_fn f = lens_model_scores(j->e->m, j->l, j->e->causal);
    for (int i = c0; i < c1; i++) {
        const size_t r = (size_t)i * T;
        lens_attention_forward(io->ctx + r * VO, j->e->probs[j->l] + i * NH * TT, TT, io->q + r * QK, io->k + r * QK,
                               io->v + r * VO, T, NH, c->d_head_k, c->d_head_v, &f);
    }
}

/* forward (target layer): ctx_h = (α_i A_h) v_h in copy i, the attention
 * probabilities scaled by the copy's α */
static void target_copies(const task_job *j, int c0, int c1)
{
    const engine *e = j->e;
    const lens_config *c = &e->m->cfg;
    const lens_block_io *io = j->io;
    const int T = e->T, DV = c->d_head_v;
    const size_t VO = (size_t)c->n_heads * DV, TT = (size_t)T * T;
    for (int i = c0; i < c1; i++)
        for (int h = 0; h < c->n_heads; h++) {
            const size_t r = (size_t)i * T * VO + (size_t)h * DV;
            const lens_gemm_args context = {.M = T, .N = DV, .K = T, .x = e->A + h * TT, .ldx = (size_t)T,
                                            .w = io->v + r, .ld = VO, .w_kn = 1, .alpha = e->alpha[i],
                                            .y = io->ctx + r, .ldy = VO};
            lens_gemm(&context, NULL);
        }
}

/* attend hook: the target layer's α-scaled A, the others' own attention;
 * the last layer then keeps only each copy's objective row (F reads no
 * other), row i*T + r -> row i (sources are read before overwritten). */
static void engine_attend(lens_block_io *io, int l)
{
    engine *e = io->attend_ctx;
    const lens_config *c = &e->m->cfg;
    task_job j = {.e = e, .io = io, .l = l, .units = e->copies, .fn = l == e->target ? target_copies : attention_copies};
    run_copies(&j);
    if (l != c->n_layers - 1 || l == e->target) return;
    const int T = e->T, C = c->d_model;
    const size_t VO = (size_t)c->n_heads * c->d_head_v;
    for (int i = 0; i < e->copies; i++) {
        const size_t from = (size_t)i * T + e->obj_row;
        if (from == (size_t)i) continue;
        memmove(io->ctx + i * VO, io->ctx + from * VO, sizeof(float) * VO);
        memmove(io->x + (size_t)i * C, io->x + from * C, sizeof(float) * C);
    }
    io->N = e->copies;
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

/* backward of the attention of copies c0 .. c1 - 1: dq, dk, dv from dctx */
static void attention_backward_copies(const task_job *j, int c0, int c1)
{
    const engine *e = j->e;
    const lens_config *c = &e->m->cfg;
    const lens_block_io *io = j->io;
    const lens_block_cache *k = io->cache;
    const int T = e->T, NH = c->n_heads, thread = lens_pool_thread_index();
    const size_t QK = (size_t)NH * c->d_head_k, VO = (size_t)NH * c->d_head_v, TT = (size_t)T * T;
    const lens_score_fn f = lens_model_scores(e->m, j->l, e->causal);
    for (int i = c0; i < c1; i++) {
        const size_t r = (size_t)i * T;
        float *dq = io->q + r * QK, *dk = io->k + r * QK, *dv = io->v + r * VO;
        memset(dq, 0, sizeof(float) * T * QK);
        memset(dk, 0, sizeof(float) * T * QK);
        memset(dv, 0, sizeof(float) * T * VO);
        lens_attention_backward(dq, dk, dv, e->dprobs + thread * NH * TT, TT, e->dscores + thread * TT,
                                io->ctx + r * VO, k->q + r * QK, k->k + r * QK, k->v + r * VO,
                                e->probs[j->l] + i * NH * TT, TT, T, NH, c->d_head_k, c->d_head_v, &f);
    }
}

/* Σ over the copies of dF/dctx, then per head ∂F/∂P_h += dctx_h v_h^T
 * (forward: ctx_h = P_h v_h; every copy has the same v). */
static void accumulate_grad(engine *e, const lens_block_io *io)
{
    const lens_config *c = &e->m->cfg;
    const int T = e->T, NH = c->n_heads, DV = c->d_head_v;
    const size_t VO = (size_t)NH * DV, TT = (size_t)T * T;
    float *dctx_sum = e->dctx_sum;
    memset(dctx_sum, 0, sizeof(float) * T * VO); /* Σ_i w_i dF/dctx_i; Riemann's w_i = 1 keeps the sum exact */
    for (int i = 0; i < e->copies; i++)
        cblas_saxpy(T * (int)VO, e->weight[i], io->ctx + (size_t)i * T * VO, 1, dctx_sum, 1);
    for (int h = 0; h < NH; h++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DV, 1.0f, dctx_sum + h * DV, (int)VO,
                    io->cache->v + h * DV, (int)VO, 1.0f, e->grad_sum + h * TT, T);
}

/* attend_backward hook: the last layer's compacted rows go back to all
 * rows; the target layer stops at dF/dctx (summed into grad_sum). */
static int engine_attend_backward(lens_block_io *io, int l)
{
    engine *e = io->attend_ctx;
    const lens_config *c = &e->m->cfg;
    if (l == e->target) {
        accumulate_grad(e, io);
        return 1;
    }
    if (l == c->n_layers - 1 && e->cls_rows) {
        expand_rows(io->ctx, (size_t)c->n_heads * c->d_head_v, e->copies, e->T, e->obj_row);
        expand_rows(io->x, (size_t)c->d_model, e->copies, e->T, e->obj_row);
        io->N = e->copies * e->T;
    }
    task_job j = {.e = e, .io = io, .l = l, .units = e->copies, .fn = attention_backward_copies};
    run_copies(&j);
    return 0;
}

/* The block io over e's work buffers for layer l, `rows` rows. */
static lens_block_io engine_io(engine *e, int l, int rows)
{
    lens_block_io io = {.N = rows, .x = e->x, .h = e->h, .n = e->n, .ctx = e->ctx, .ff = e->ff, .pool = e->pool, .cache = &e->cache[l], .pos = e->pos,
                        .attend = engine_attend, .attend_backward = engine_attend_backward, .attend_ctx = e};
    return io;
}

/* Layers target .. L-1 for e->copies copies of x_l [T][C], the target
 * layer's attention A scaled by alpha[i] in copy i. */
static int forward_copies(engine *e, const float *x_l, int l, const float *A, const float *alpha, int copies,
                          const lens_attr_opts *o);

/* The final norm (the family's) on `copies` rows of x, in place, cached for its backward. */
static lens_block_io final_io(engine *e, float *x, float *scratch, int copies)
{
    lens_block_io io = {.N = copies, .x = x, .h = scratch, .pool = e->pool, .cache = &e->final};
    return io;
}

static const char *const objective_names[] = {
    [LENS_OBJ_PROBABILITY] = "probability",
    [LENS_OBJ_LOG_PROBABILITY] = "log_probability",
    [LENS_OBJ_LOGIT] = "logit",
    [LENS_OBJ_LOGIT_DIFFERENCE] = "logit_difference",
};

const char *lens_objective_name(lens_objective_kind k)
{
    return (unsigned)k <= LENS_OBJ_LOGIT_DIFFERENCE ? objective_names[k] : "unknown";
}

int lens_objective_parse(const char *name, lens_objective_kind *k)
{
    for (int i = 0; i <= LENS_OBJ_LOGIT_DIFFERENCE; i++)
        if (!strcmp(name, objective_names[i])) {
            *k = (lens_objective_kind)i;
            return 0;
        }
    return -1;
}

/* F of logits z [K] for target (docs/attribution.md "Objectives"), softmax in
 * double with libm's exp; when p is not NULL every probability goes into p
 * [K] (p may be z; the logit objectives leave z as it is). F(A) and F(0) come
 * out of two different forward paths, and the completeness gap is their
 * difference: the forward's float32 softmax (lens_exp_approx, float sums)
 * over GPT-2's 50257 tokens set a floor of 4e-5 .. 7e-5 on it. */
double lens_objective_at(const lens_objective *o, const float *z, int K, int target, float *p)
{
    if (o->kind == LENS_OBJ_LOGIT) return z[target];
    if (o->kind == LENS_OBJ_LOGIT_DIFFERENCE) return (double)z[target] - z[o->foil];
    double zmax = z[0], sum = 0;
    for (int k = 1; k < K; k++) zmax = z[k] > zmax ? z[k] : zmax;
    for (int k = 0; k < K; k++) sum += exp(z[k] - zmax);
    const double f = o->kind == LENS_OBJ_LOG_PROBABILITY ? z[target] - zmax - log(sum) : exp(z[target] - zmax) / sum;
    for (int k = 0; p && k < K; k++) p[k] = (float)(exp(z[k] - zmax) / sum); /* p may be z */
    return f;
}

/* dF/dz in place of p = softmax(z) (of z for the logit objectives):
 *   probability F = p_t:           dF/dz_k = p_t (δ_tk - p_k)
 *   log_probability F = log p_t:   dF/dz_k = δ_tk - p_k
 *   logit F = z_t:                 dF/dz_k = δ_tk
 *   logit_difference F = z_t - z_f: dF/dz_k = δ_tk - δ_fk */
void lens_objective_grad(const lens_objective *o, float *p, int K, int target)
{
    const float p_target = p[target];
    switch (o->kind) {
    case LENS_OBJ_PROBABILITY:
        for (int k = 0; k < K; k++) p[k] = p_target * ((k == target) - p[k]);
        break;
    case LENS_OBJ_LOG_PROBABILITY:
        for (int k = 0; k < K; k++) p[k] = (float)(k == target) - p[k];
        break;
    default:
        memset(p, 0, sizeof(float) * K);
        p[target] = 1.0f;
        if (o->kind == LENS_OBJ_LOGIT_DIFFERENCE) p[o->foil] = -1.0f;
    }
}

/* The head (head.h) on the objective row of each copy, F[i] = the objective of z with
 * classifier: z = W_c act(W_p final_norm(x) + b_p) + b_c (act tanh, ReLU, or
 *             LN(GELU); final_norm: a pre-norm family's, none for post-norm ones);
 * causal LM:  z = final_norm(x) E^T (soft-capped when the config says). */
static void head_forward(engine *e, int copies, int target, double *F)
{
    const lens_config *c = &e->m->cfg;
    const int C = c->d_model, K = e->K;
    const size_t stride = e->cls_rows ? 1 : (size_t)e->T, r = e->cls_rows ? 0 : (size_t)e->obj_row;
    for (int i = 0; i < copies; i++) memcpy(e->cls + (size_t)i * C, e->x + (i * stride + r) * C, sizeof(float) * C);
    if (e->lm) {
        memcpy(e->pooled, e->cls, sizeof(float) * copies * C);
        lens_block_io io = final_io(e, e->pooled, e->dpre, copies);
        lens_block_forward(e->m, &io, c->n_layers);
        lens_causal_lm_forward(e->m, e->logits, e->pooled, copies, e->pool);
        /* the capped logits for head_backward's chain rule (dlogits is free until then) */
        if (c->final_softcap > 0) memcpy(e->dlogits, e->logits, sizeof(float) * copies * K);
    } else {
        lens_block_io io = final_io(e, e->cls, e->dpre, copies);
        lens_block_forward(e->m, &io, c->n_layers);
        lens_classifier_forward(e->m, e->pooled, e->logits, e->cls, copies, e->pool);
    }
    for (int i = 0; i < copies; i++) { /* logits -> probabilities in place */
        float *z = e->logits + (size_t)i * K;
        F[i] = lens_objective_at(&e->obj, z, K, target, z);
    }
}

/* dF/dx_L for the first `copies` copies, into e->x (zero except objective rows). */
static void head_backward(engine *e, int copies, int target)
{
    const lens_config *c = &e->m->cfg;
    const int C = c->d_model, K = e->K, R = copies * e->T;
    for (int i = 0; i < copies; i++) lens_objective_grad(&e->obj, e->logits + (size_t)i * K, K, target);
    if (e->lm) { /* forward: z = final_norm(x) E^T (the capped z kept in e->dlogits) */
        lens_causal_lm_backward(e->m, NULL, e->dcls, 0, e->logits, e->dlogits, NULL, copies, e->pool);
        lens_block_io io = final_io(e, e->dcls, e->dpre, copies);
        lens_block_backward(e->m, &io, c->n_layers);
    } else { /* forward: z = classifier(final_norm(x)) */
        lens_classifier_backward(e->m, NULL, e->dcls, e->dpre, e->logits, e->cls, e->pooled, copies);
        lens_block_io io = final_io(e, e->dcls, e->dpre, copies);
        lens_block_backward(e->m, &io, c->n_layers);
    }
    const size_t stride = e->cls_rows ? 1 : (size_t)e->T, r = e->cls_rows ? 0 : (size_t)e->obj_row;
    memset(e->x, 0, sizeof(float) * R * C);
    for (int i = 0; i < copies; i++) memcpy(e->x + (i * stride + r) * C, e->dcls + (size_t)i * C, sizeof(float) * C);
}

static int cancelled(const lens_attr_opts *o) { return o && lens_cancelled(o->cancel); }

/* *o = the objective asked for (NULL: probability at the last position), its
 * position resolved; 0, or -1 with err (the field named in the message). */
int lens_objective_resolve(const lens_model *m, const lens_objective *asked, int T, lens_objective *o, lens_err *err)
{
    const int lm = m->cfg.task == LENS_TASK_CAUSAL_LM;
    *o = asked ? *asked : (lens_objective){.kind = LENS_OBJ_PROBABILITY, .position = -1, .foil = -1};
    if ((unsigned)o->kind > LENS_OBJ_LOGIT_DIFFERENCE) return lens_fail(err, LENS_EINVAL, "unknown objective kind");
    if (!lm) o->position = 0;
    else if (o->position < 0) o->position = T - 1;
    else if (o->position >= T)
        return lens_fail(err, LENS_EINVAL, "objective position %d is outside the %d tokens", o->position, T);
    if (o->kind != LENS_OBJ_LOGIT_DIFFERENCE && o->foil >= 0)
        return lens_fail(err, LENS_EINVAL, "a foil needs the objective logit_difference");
    return 0;
}

/* target and, for logit_difference, the foil among the K outputs */
int lens_objective_check_target(const lens_objective *o, int target, int K, int lm, lens_err *err)
{
    const char *what = lm ? "a token id" : "a label index";
    if (target < 0 || target >= K) return lens_fail(err, LENS_EINVAL, "target %d is not %s in 0..%d", target, what, K - 1);
    if (o->kind != LENS_OBJ_LOGIT_DIFFERENCE) return 0;
    if (o->foil < 0 || o->foil >= K)
        return lens_fail(err, LENS_EINVAL, "logit_difference needs a foil, %s in 0..%d", what, K - 1);
    if (o->foil == target) return lens_fail(err, LENS_EINVAL, "the foil is the target: their difference is 0");
    return 0;
}

static int forward_copies(engine *e, const float *x_l, int l, const float *A, const float *alpha, int copies,
                          const lens_attr_opts *o)
{
    const lens_model *m = e->m;
    const int T = e->T, C = m->cfg.d_model, L = m->cfg.n_layers;
    e->target = l, e->A = A, e->alpha = alpha, e->copies = copies;
    for (int i = 0; i < copies; i++) memcpy(e->x + (size_t)i * T * C, x_l, sizeof(float) * T * C);
    for (int j = l; j < L; j++) {
        if (cancelled(o)) return -1;
        lens_block_io io = engine_io(e, j, copies * T);
        io.q = io.cache->q, io.k = io.cache->k, io.v = io.cache->v;
        lens_block_forward(m, &io, j);
    }
    e->cls_rows = l < L - 1;
    return 0;
}

/* The backward of the first n copies from the head down to the target
 * layer's dF/dctx (the attend_backward hook accumulates it). */
static void backward_copies(engine *e, int n, int target)
{
    const lens_model *m = e->m;
    const int L = m->cfg.n_layers;
    head_backward(e, n, target);
    e->copies = n;
    for (int j = L - 1; j >= e->target; j--) {
        lens_block_io io = engine_io(e, j, j == L - 1 && e->cls_rows ? n : n * e->T);
        io.q = e->dq, io.k = e->dk, io.v = e->dv;
        lens_block_backward(m, &io, j);
    }
}

/* One target layer l (0-based): attribution into out, F(0) into *f_zero. */
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
    const int T = e->T, NH = c->n_heads;
    const size_t TT = (size_t)T * T;
    const float *x_l = lens_act_hidden(m, act, l, 0);
    const float *A = act->attn + (size_t)l * NH * act->attn_layer_size; /* one sequence: heads TT apart */

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
        e->weight = s->weight + k0;
        if (extra) alpha[n] = 0.0f;
        const int copies = n + extra;
        if (forward_copies(e, x_l, l, A, alpha, copies, o))
            return lens_fail(err, LENS_ECANCEL, "attribution cancelled at layer %d", l + 1);
        head_forward(e, copies, target, F);
        if (extra) out->f_zero = F[n], zero_done = 1;
        backward_copies(e, n, target);
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

    /* causal LM: the next token after the objective's position; segments mean nothing to it */
    const int lm = c->task == LENS_TASK_CAUSAL_LM, K = lm ? c->vocab_size : c->n_labels;
    lens_objective obj;
    if (lens_objective_resolve(m, opts ? opts->objective : NULL, T, &obj, err)) return -1;
    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids, .type_ids = lm ? NULL : type_ids};
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_LOGITS,
                            .cancel = opts ? opts->cancel : NULL,
                            .pool = opts ? opts->pool : NULL};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, err)) return -1;
    const float *z = lens_act_logits(m, &act, 0) + (size_t)obj.position * K;
    int pred = 0;
    for (int k = 1; k < K; k++) pred = z[k] > z[pred] ? k : pred;
    const int target = opts && opts->target >= 0 ? opts->target : pred;
    if (lens_objective_check_target(&obj, target, K, lm, err)) {
        lens_activations_free(&act);
        return -1;
    }

    const size_t budget = opts && opts->max_scratch_bytes ? opts->max_scratch_bytes : DEFAULT_SCRATCH;
    size_t per = bytes_per_copy(m, T, lowest), fit = budget / per;
    int max_copies = fit < 2 ? 2 : fit > (size_t)steps + 1 ? steps + 1 : (int)fit;
    engine e;
    out->layers = calloc((size_t)n_sel, sizeof *out->layers);
    schedule sched;
    const int no_sched = schedule_init(&sched, quad, riemann, steps);
    if (no_sched || !out->layers || engine_init(&e, m, T, max_copies, lowest, opts ? opts->pool : NULL)) {
        if (!no_sched && out->layers) engine_free(&e); /* engine_init leaves e freeable */
        schedule_free(&sched);
        lens_activations_free(&act);
        lens_attribution_free(out);
        return lens_fail(err, LENS_ENOMEM, "out of memory for attribution of %d tokens", T);
    }
    e.obj = obj, e.obj_row = obj.position;
    out->T = T, out->n_heads = NH, out->target = target, out->predicted = pred, out->objective = obj;
    out->f_full = lens_objective_at(&obj, z, K, target, NULL);
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
    return lens_attr_eval_objective(m, ids, type_ids, T, layer, probs, target, NULL, F, err);
}

int lens_attr_eval_objective(const lens_model *m, const int *ids, const int *type_ids, int T, int layer,
                             const float *probs, int target, const lens_objective *objective, double *F,
                             lens_err *err)
{
    const lens_config *c = &m->cfg;
    if (check_model(m, err)) return -1;
    if (layer < 1 || layer > c->n_layers) return lens_fail(err, LENS_EINVAL, "layer %d is not in 1..%d", layer, c->n_layers);
    const int lm = c->task == LENS_TASK_CAUSAL_LM, K = lm ? c->vocab_size : c->n_labels;
    lens_objective obj;
    if (lens_objective_resolve(m, objective, T, &obj, err) || lens_objective_check_target(&obj, target, K, lm, err))
        return -1;
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
    e.obj = obj, e.obj_row = obj.position;
    forward_copies(&e, lens_act_hidden(m, &act, layer - 1, 0), layer - 1, probs, &one, 1, NULL);
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
