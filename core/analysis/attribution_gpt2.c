/* attribution_gpt2.c - self-attention attribution on GPT-2 (Hao et al. 2021),
 * target = a next-token id at the last position.
 *
 *     F(X) = softmax(ln_f(x_L)[T-1] E^T)[target]
 *     Attr_l = A_l ⊙ (1/m) Σ_k ∂F/∂X |_{X = α_k A_l}
 *
 * Same conventions as attribution.h (steps, riemann, completeness, importance
 * I_h = max_ij Attr_h); A_l is causal, so Attr_l is zero above the diagonal.
 * The same machinery as the BERT path: one lens_forward gives x_l, layer l is
 * linear in α up to its output projection (a(α) = α (A v) W_O + b_O, A v W_O
 * computed once), and only layer l's FFN and the layers above are rerun per
 * step, then back-propagated (activation gradients only) into layer l's
 * context, where ∂F/∂P_h = dctx_h v_h^T. The copies run one at a time (T
 * rows each), their GEMMs split over the request's pool: GPT-2 pre-LN
 * blocks, per layer j:
 *     h1 = LN1(x); ctx = attn(h1 W_{Q,K,V}); x2 = x + ctx W_O + b_O;
 *     h2 = LN2(x2); x' = x2 + W2 gelu_tanh(W1 h2 + b1) + b2. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/attribution.h"
#include "core/base/gemm.h"
#include "core/nn/ops.h"

typedef struct {
    float *x, *h1, *mean1, *rstd1, *q, *k, *v, *probs; /* above the target layer only */
    float *x2, *mean2, *rstd2, *ff_pre;                 /* [T][C], [T], [T], [T][d_ff] */
} g_cache;

typedef struct {
    const lens_model *m;
    int T;
    lens_pool *pool;           /* threads for the GEMMs */
    g_cache *cache;            /* [L] */
    float *x, *h, *ctx, *ff;   /* [T][C], [T][C], [T][VO], [T][d_ff] */
    float *dx, *dh, *dctx, *dff, *dq, *dk, *dv, *dprobs, *dscores;
    float *mean_f, *rstd_f, *xf, *logits; /* ln_f statistics [T], output [T][C], [V] */
    float *v_l, *attn_out_l, *grad_sum;   /* target layer: [T][VO], [T][C], [NH][T][T] */
} g_engine;

static void g_free(g_engine *e)
{
    if (e->cache)
        for (int l = 0; l < e->m->cfg.n_layers; l++) {
            g_cache *c = &e->cache[l];
            free(c->x), free(c->h1), free(c->mean1), free(c->rstd1), free(c->q), free(c->k), free(c->v);
            free(c->probs), free(c->x2), free(c->mean2), free(c->rstd2), free(c->ff_pre);
        }
    free(e->cache);
    free(e->x), free(e->h), free(e->ctx), free(e->ff), free(e->dx), free(e->dh), free(e->dctx), free(e->dff);
    free(e->dq), free(e->dk), free(e->dv), free(e->dprobs), free(e->dscores), free(e->mean_f), free(e->rstd_f);
    free(e->xf), free(e->logits), free(e->v_l), free(e->attn_out_l), free(e->grad_sum);
}

static float *g_alloc(size_t n, int *failed)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) *failed = 1;
    return p;
}

static int g_init(g_engine *e, const lens_model *m, int T, lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const size_t C = c->d_model, QK = (size_t)c->n_heads * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    const size_t TT = (size_t)T * T, NH = c->n_heads, F = c->d_ff;
    int failed = 0;
    memset(e, 0, sizeof *e);
    e->m = m, e->T = T, e->pool = pool;
    e->cache = calloc((size_t)c->n_layers, sizeof *e->cache);
    if (!e->cache) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        g_cache *k = &e->cache[l];
        k->x = g_alloc(T * C, &failed), k->h1 = g_alloc(T * C, &failed);
        k->mean1 = g_alloc(T, &failed), k->rstd1 = g_alloc(T, &failed);
        k->q = g_alloc(T * QK, &failed), k->k = g_alloc(T * QK, &failed), k->v = g_alloc(T * VO, &failed);
        k->probs = g_alloc(NH * TT, &failed);
        k->x2 = g_alloc(T * C, &failed), k->mean2 = g_alloc(T, &failed), k->rstd2 = g_alloc(T, &failed);
        k->ff_pre = g_alloc(T * F, &failed);
    }
    e->x = g_alloc(T * C, &failed), e->h = g_alloc(T * C, &failed), e->ctx = g_alloc(T * VO, &failed);
    e->ff = g_alloc(T * F, &failed), e->dx = g_alloc(T * C, &failed), e->dh = g_alloc(T * C, &failed);
    e->dctx = g_alloc(T * VO, &failed), e->dff = g_alloc(T * F, &failed), e->dq = g_alloc(T * QK, &failed);
    e->dk = g_alloc(T * QK, &failed), e->dv = g_alloc(T * VO, &failed), e->dprobs = g_alloc(NH * TT, &failed);
    e->dscores = g_alloc(TT, &failed), e->mean_f = g_alloc(T, &failed), e->rstd_f = g_alloc(T, &failed);
    e->xf = g_alloc(T * C, &failed), e->logits = g_alloc(c->vocab_size, &failed);
    e->v_l = g_alloc(T * VO, &failed), e->attn_out_l = g_alloc(T * C, &failed), e->grad_sum = g_alloc(NH * TT, &failed);
    return failed ? -1 : 0;
}

/* x2 (in cache l) -> e->x: x' = x2 + W2 gelu(W1 LN2(x2) + b1) + b2 */
static void g_ffn_forward(g_engine *e, int l)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *b = &e->m->p.blocks[l];
    g_cache *k = &e->cache[l];
    const int T = e->T, C = c->d_model;
    lens_layernorm_forward(e->h, k->mean2, k->rstd2, k->x2, &b->ln_ff, T, C, c->ln_eps);
    lens_gemm_linear(k->ff_pre, e->h, &b->ff_in, T, e->pool);
    memcpy(e->ff, k->ff_pre, sizeof(float) * T * c->d_ff);
    (c->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward)(e->ff, (size_t)T * c->d_ff);
    lens_gemm_linear(e->x, e->ff, &b->ff_out, T, e->pool);
    lens_residual_forward(e->x, k->x2, (size_t)T * C);
}

/* full block l on e->x (above the target) */
static void g_block_forward(g_engine *e, int l)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *b = &e->m->p.blocks[l];
    g_cache *k = &e->cache[l];
    const int T = e->T, C = c->d_model, NH = c->n_heads;
    memcpy(k->x, e->x, sizeof(float) * T * C);
    lens_layernorm_forward(k->h1, k->mean1, k->rstd1, k->x, &b->ln_attn, T, C, c->ln_eps);
    lens_gemm_linear(k->q, k->h1, &b->q, T, e->pool);
    lens_gemm_linear(k->k, k->h1, &b->k, T, e->pool);
    lens_gemm_linear(k->v, k->h1, &b->v, T, e->pool);
    lens_attention_forward(e->ctx, k->probs, (size_t)T * T, k->q, k->k, k->v, T, NH, c->d_head_k, c->d_head_v, 1,
                           c->attn_scale);
    lens_gemm_linear(k->x2, e->ctx, &b->attn_out, T, e->pool);
    lens_residual_forward(k->x2, k->x, (size_t)T * C);
    g_ffn_forward(e, l);
}

/* F = softmax(ln_f(x)[T-1] E^T)[target] */
static double g_head_forward(g_engine *e, int target)
{
    const lens_config *c = &e->m->cfg;
    const int T = e->T, C = c->d_model, V = c->vocab_size;
    const size_t last = (size_t)(T - 1) * C;
    lens_layernorm_forward(e->xf + last, e->mean_f + T - 1, e->rstd_f + T - 1, e->x + last, &e->m->p.ln_final, 1, C,
                           c->ln_eps);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, V, C, 1.0f, e->m->p.tok_emb, C, e->xf + last, 1, 0.0f, e->logits, 1);
    lens_softmax_forward(e->logits, 1, V, 0);
    return e->logits[target];
}

/* F at α (forward only) for target layer l, from x_l; also fills the caches. */
static double g_forward_alpha(g_engine *e, const float *x_l, int l, float alpha, int target)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *b = &e->m->p.blocks[l];
    const int T = e->T, C = c->d_model;
    g_cache *k = &e->cache[l];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < C; j++) {
            const size_t n = (size_t)t * C + j;
            k->x2[n] = x_l[n] + alpha * e->attn_out_l[n] + b->attn_out.b[j];
        }
    g_ffn_forward(e, l);
    for (int j = l + 1; j < c->n_layers; j++) g_block_forward(e, j);
    return g_head_forward(e, target);
}

/* dF/dx2 of FFN block l given dF/dx' in e->dx: result in e->dx. */
static void g_ffn_backward(g_engine *e, int l)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *b = &e->m->p.blocks[l];
    g_cache *k = &e->cache[l];
    const int T = e->T, C = c->d_model;
    /* forward: x' = x2 + ff_out(gelu(ff_in(LN2(x2)))) */
    lens_gemm_linear_backward(e->dff, e->dx, &b->ff_out, T, 0, e->pool);
    lens_gelu_backward_inplace(e->dff, k->ff_pre, (size_t)T * c->d_ff, c->gelu_tanh);
    lens_gemm_linear_backward(e->dh, e->dff, &b->ff_in, T, 0, e->pool);
    lens_layernorm_backward(e->dx, NULL, NULL, e->dh, k->x2, k->mean2, k->rstd2, &b->ln_ff, T, C);
}

/* Backward from F into dF/dctx of target layer l (e->dctx). */
static void g_backward(g_engine *e, int l, int target)
{
    const lens_config *c = &e->m->cfg;
    const int T = e->T, C = c->d_model, V = c->vocab_size, NH = c->n_heads, L = c->n_layers;
    const size_t QK = (size_t)NH * c->d_head_k, VO = (size_t)NH * c->d_head_v, TT = (size_t)T * T;
    const size_t last = (size_t)(T - 1) * C;
    /* forward: F = p_target, p = softmax(z): dF/dz_k = p_t (δ_tk - p_k); z = xf E^T */
    const float pt = e->logits[target];
    for (int k = 0; k < V; k++) e->logits[k] = pt * ((k == target) - e->logits[k]);
    memset(e->dh, 0, sizeof(float) * T * C);
    cblas_sgemv(CblasRowMajor, CblasTrans, V, C, 1.0f, e->m->p.tok_emb, C, e->logits, 1, 0.0f, e->dh + last, 1);
    memset(e->dx, 0, sizeof(float) * T * C);
    lens_layernorm_backward(e->dx + last, NULL, NULL, e->dh + last, e->x + last, e->mean_f + T - 1,
                            e->rstd_f + T - 1, &e->m->p.ln_final, 1, C);
    for (int j = L - 1; j > l; j--) {
        const lens_block *b = &e->m->p.blocks[j];
        g_cache *k = &e->cache[j];
        g_ffn_backward(e, j);
        /* forward: x2 = x + attn_out(attn(LN1(x) W_{Q,K,V})) */
        lens_gemm_linear_backward(e->dctx, e->dx, &b->attn_out, T, 0, e->pool);
        memset(e->dq, 0, sizeof(float) * T * QK);
        memset(e->dk, 0, sizeof(float) * T * QK);
        memset(e->dv, 0, sizeof(float) * T * VO);
        lens_attention_backward(e->dq, e->dk, e->dv, e->dprobs, TT, e->dscores, e->dctx, k->q, k->k, k->v, k->probs,
                                TT, T, NH, c->d_head_k, c->d_head_v, 1, c->attn_scale);
        lens_gemm_linear_backward(e->dh, e->dq, &b->q, T, 0, e->pool);
        lens_gemm_linear_backward(e->dh, e->dk, &b->k, T, 1, e->pool);
        lens_gemm_linear_backward(e->dh, e->dv, &b->v, T, 1, e->pool);
        lens_layernorm_backward(e->dx, NULL, NULL, e->dh, k->x, k->mean1, k->rstd1, &b->ln_attn, T, C);
    }
    g_ffn_backward(e, l);
    lens_gemm_linear_backward(e->dctx, e->dx, &e->m->p.blocks[l].attn_out, T, 0, e->pool);
}

/* v = LN1(x_l) W_V + b_V; attn_out_l = (P v) W_O without bias. */
static void g_prepare(g_engine *e, const float *x_l, int l, const float *P)
{
    const lens_config *c = &e->m->cfg;
    const lens_block *b = &e->m->p.blocks[l];
    const int T = e->T, C = c->d_model, DV = c->d_head_v;
    const size_t VO = (size_t)c->n_heads * DV, TT = (size_t)T * T;
    lens_layernorm_forward(e->h, NULL, NULL, x_l, &b->ln_attn, T, C, c->ln_eps);
    lens_gemm_linear(e->v_l, e->h, &b->v, T, e->pool);
    for (int h = 0; h < c->n_heads; h++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, P + h * TT, T, e->v_l + h * DV,
                    (int)VO, 0.0f, e->ctx + h * DV, (int)VO);
    lens_linear no_bias = b->attn_out;
    no_bias.b = NULL;
    lens_gemm_linear(e->attn_out_l, e->ctx, &no_bias, T, e->pool);
}

int lens_attribution_gpt2_run(const lens_model *m, const int *ids, int T, const lens_attr_opts *opts,
                              lens_attribution *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads, V = c->vocab_size;
    memset(out, 0, sizeof *out);
    const int steps = opts && opts->steps ? opts->steps : 20;
    const lens_riemann riemann = opts ? opts->riemann : LENS_RIEMANN_RIGHT;
    if (steps < 1 || steps > 10000) return lens_fail(err, LENS_EINVAL, "steps must be in 1..10000, not %d", steps);
    if (riemann != LENS_RIEMANN_RIGHT && riemann != LENS_RIEMANN_LEFT)
        return lens_fail(err, LENS_EINVAL, "riemann must be right or left");
    const int n_sel = opts && opts->layers ? opts->n_layers : L;
    if (n_sel < 1 || n_sel > L) return lens_fail(err, LENS_EINVAL, "between 1 and %d layers, not %d", L, n_sel);
    for (int i = 0; i < n_sel; i++) {
        const int layer = opts && opts->layers ? opts->layers[i] : i + 1;
        if (layer < 1 || layer > L) return lens_fail(err, LENS_EINVAL, "layer %d is not in 1..%d", layer, L);
    }
    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids};
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_LOGITS,
                            .cancel = opts ? opts->cancel : NULL, .pool = opts ? opts->pool : NULL};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, err)) return -1;
    const float *z = lens_act_logits(m, &act, 0) + (size_t)(T - 1) * V;
    int pred = 0;
    for (int k = 1; k < V; k++) pred = z[k] > z[pred] ? k : pred;
    const int target = opts && opts->target >= 0 ? opts->target : pred;
    if (target >= V) {
        lens_activations_free(&act);
        return lens_fail(err, LENS_EINVAL, "target %d is not a token id in 0..%d", target, V - 1);
    }
    double zmax = z[0], zsum = 0;
    for (int k = 1; k < V; k++) zmax = z[k] > zmax ? z[k] : zmax;
    for (int k = 0; k < V; k++) zsum += exp(z[k] - zmax);
    g_engine e;
    out->layers = calloc((size_t)n_sel, sizeof *out->layers);
    if (!out->layers || g_init(&e, m, T, opts ? opts->pool : NULL)) {
        if (out->layers) g_free(&e);
        lens_activations_free(&act);
        lens_attribution_free(out);
        return lens_fail(err, LENS_ENOMEM, "out of memory for attribution of %d tokens", T);
    }
    out->T = T, out->n_heads = NH, out->target = target, out->predicted = pred;
    out->f_full = exp(z[target] - zmax) / zsum;
    out->steps = steps, out->riemann = riemann, out->n_layers = n_sel;
    const size_t TT = (size_t)T * T, VO = (size_t)NH * c->d_head_v;
    const int DV = c->d_head_v;
    int rc = 0;
    for (int i = 0; i < n_sel && !rc; i++) {
        lens_attr_layer *ly = &out->layers[i];
        ly->layer = opts && opts->layers ? opts->layers[i] : i + 1;
        const int l = ly->layer - 1;
        ly->attr = malloc(sizeof(float) * NH * TT);
        ly->importance = malloc(sizeof(float) * NH);
        if (!ly->attr || !ly->importance) {
            rc = lens_fail(err, LENS_ENOMEM, "out of memory for attributions");
            break;
        }
        const float *x_l = lens_act_hidden(m, &act, l, 0);
        const float *A = act.attn + (size_t)l * NH * act.attn_layer_size;
        g_prepare(&e, x_l, l, A);
        memset(e.grad_sum, 0, sizeof(float) * NH * TT);
        ly->f_zero = g_forward_alpha(&e, x_l, l, 0.0f, target);
        for (int k = 0; k < steps && !rc; k++) {
            if (opts && lens_cancelled(opts->cancel)) {
                rc = lens_fail(err, LENS_ECANCEL, "attribution cancelled at layer %d", l + 1);
                break;
            }
            const float alpha = (float)(k + (riemann == LENS_RIEMANN_RIGHT)) / steps;
            g_forward_alpha(&e, x_l, l, alpha, target);
            g_backward(&e, l, target);
            for (int h = 0; h < NH; h++) /* ∂F/∂P_h += dctx_h v_h^T (forward: ctx_h = P_h v_h) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DV, 1.0f, e.dctx + h * DV, (int)VO,
                            e.v_l + h * DV, (int)VO, 1.0f, e.grad_sum + h * TT, T);
        }
        if (rc) break;
        double sum = 0;
        for (int h = 0; h < NH; h++) {
            float best = -INFINITY;
            for (size_t ij = 0; ij < TT; ij++) {
                const float v = A[h * TT + ij] * e.grad_sum[h * TT + ij] / steps;
                ly->attr[h * TT + ij] = v;
                sum += v;
                best = v > best ? v : best;
            }
            ly->importance[h] = best;
        }
        ly->attr_sum = sum;
        if (opts && opts->progress) opts->progress(opts->progress_user, (double)(i + 1) / n_sel);
    }
    g_free(&e);
    lens_activations_free(&act);
    if (rc) lens_attribution_free(out);
    return rc;
}
