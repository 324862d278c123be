/* head.c - the task heads of every family, forward and backward (head.h
 * has the formulas and shapes). */
#include "core/model/head.h"

#include <math.h>
#include <string.h>

#include "core/nn/ops.h"

/* The gradient buffer of param, or NULL (no map, or no such tensor). */
static float *grad(const lens_grad_map *g, const void *param) { return g && param ? g->of(g, param) : NULL; }

/* ------------------------------------------------------------ classifier */

void lens_classifier_pool(const lens_model *m, float *u, const float *x, const int *row_start, const int *lengths,
                          int S)
{
    const int C = m->cfg.d_model;
    for (int s = 0; s < S; s++) {
        const float *rows = x + (size_t)row_start[s] * C;
        float *us = u + (size_t)s * C;
        memcpy(us, rows, sizeof(float) * C);
        if (!m->cfg.pool_mean) continue;
        for (int t = 1; t < lengths[s]; t++) lens_residual_forward(us, rows + (size_t)t * C, (size_t)C);
        for (int i = 0; i < C; i++) us[i] /= (float)lengths[s];
    }
}

void lens_classifier_unpool(const lens_model *m, float *dx, const float *du, const int *row_start, const int *lengths,
                            int S)
{
    const int C = m->cfg.d_model;
    for (int s = 0; s < S; s++) {
        float *rows = dx + (size_t)row_start[s] * C;
        const float *d = du + (size_t)s * C;
        memset(rows, 0, sizeof(float) * (size_t)lengths[s] * C);
        if (!m->cfg.pool_mean) {
            memcpy(rows, d, sizeof(float) * C);
            continue;
        }
        /* forward: u = (1/T) sum_t x_t */
        for (int t = 0; t < lengths[s]; t++)
            for (int i = 0; i < C; i++) rows[(size_t)t * C + i] = d[i] / (float)lengths[s];
    }
}

void lens_classifier_forward(const lens_model *m, float *pooled, float *logits, const float *u, int S,
                             lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const lens_params *p = &m->p;
    lens_gemm_linear(pooled, u, &p->pooler, S, pool);
    if (p->pooler_ln.w) {
        lens_gelu_rows(pool, pooled, (size_t)c->d_model, S, c->d_model, c->gelu_tanh);
        lens_add_layernorm(pool, pooled, NULL, NULL, pooled, NULL, &p->pooler_ln, S, c->d_model, c->ln_eps);
    } else {
        (c->head_relu ? lens_relu_forward : lens_tanh_forward)(pooled, (size_t)S * c->d_model);
    }
    lens_gemm_linear(logits, pooled, &p->classifier, S, pool);
}

/* dpre (set) from dpooled [S][C] through pooled = LN_p(GELU(pre)), pre given
 * in dpre: per row in place, GELU's output recomputed from pre (the
 * caller's buffers hold no more), LN backward as ops.h's
 * lens_layernorm_backward: dx = rstd (dn - mean(dn) - n mean(dn n)), n the
 * normalised GELU output, dn = dpooled w. Gain and bias gradients through g. */
static void pooler_ln_backward(const lens_model *m, const lens_grad_map *g, float *dpre, float *dpooled, int S)
{
    const lens_config *c = &m->cfg;
    const lens_layernorm *ln = &m->p.pooler_ln;
    const int C = c->d_model;
    float *dw = grad(g, ln->w), *db = grad(g, ln->b);
    for (int s = 0; s < S; s++) {
        const float *pre = dpre + (size_t)s * C;
        float *dy = dpooled + (size_t)s * C;
        double sum = 0, sq = 0;
        for (int i = 0; i < C; i++) {
            float a = pre[i];
            (c->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward)(&a, 1);
            sum += a, sq += (double)a * a;
        }
        const double mean = sum / C, rstd = 1.0 / sqrt(sq / C - mean * mean + c->ln_eps);
        double md = 0, mdn = 0;
        for (int i = 0; i < C; i++) {
            float a = pre[i];
            (c->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward)(&a, 1);
            const double n = (a - mean) * rstd, dn = (double)dy[i] * ln->w[i];
            md += dn, mdn += dn * n;
            if (dw) dw[i] += (float)(n * dy[i]);
            if (db) db[i] += dy[i];
        }
        md /= C, mdn /= C;
        for (int i = 0; i < C; i++) { /* dy becomes d GELU-output, same index */
            float a = pre[i];
            (c->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward)(&a, 1);
            const double n = (a - mean) * rstd;
            dy[i] = (float)(rstd * ((double)dy[i] * ln->w[i] - md - n * mdn));
        }
    }
    /* act = GELU(pre): dpooled becomes d pre, then into dpre */
    lens_gelu_backward_inplace(dpooled, dpre, (size_t)S * C, c->gelu_tanh);
    memcpy(dpre, dpooled, sizeof(float) * (size_t)S * C);
}

void lens_classifier_backward(const lens_model *m, const lens_grad_map *g, float *du, float *dpre,
                              const float *dlogits, const float *u, const float *pooled, int S)
{
    const lens_params *p = &m->p;
    const size_t n = (size_t)S * m->cfg.d_model;
    /* logits = pooled W_c + b_c: dpooled (in du) = dlogits W_c */
    memset(du, 0, sizeof(float) * n);
    lens_linear_backward(du, grad(g, p->classifier.w), grad(g, p->classifier.b), dlogits, pooled, &p->classifier, S);
    if (p->pooler_ln.w) { /* pooled = LN_p(GELU(pre)), pre recomputed into dpre */
        lens_gemm_linear(dpre, u, &p->pooler, S, NULL);
        pooler_ln_backward(m, g, dpre, du, S);
    } else { /* pooled = act(pre) */
        memset(dpre, 0, sizeof(float) * n);
        (m->cfg.head_relu ? lens_relu_backward : lens_tanh_backward)(dpre, pooled, du, n);
    }
    /* pre = u W_p + b_p */
    memset(du, 0, sizeof(float) * n);
    lens_linear_backward(du, grad(g, p->pooler.w), grad(g, p->pooler.b), dpre, u, &p->pooler, S);
}

/* ------------------------------------------------------------ masked LM */

/* The MLM decoder: the tied token embeddings plus the MLM bias. */
static lens_linear mlm_decoder(const lens_model *m)
{
    lens_linear decoder = lens_lm_decoder(m);
    decoder.b = m->p.mlm_bias;
    return decoder;
}

void lens_mlm_forward(const lens_model *m, float *logits, const float *x, int R, const lens_mlm_rows *k,
                      lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model;
    lens_gemm_linear(k->pre, x, &m->p.mlm_transform, R, pool);
    float *act = k->pre;
    if (k->act) act = memcpy(k->act, k->pre, sizeof(float) * (size_t)R * C);
    lens_gelu_rows(pool, act, (size_t)C, R, C, c->gelu_tanh);
    float *out = k->out ? k->out : act;
    lens_add_layernorm(pool, out, k->mean, k->rstd, act, NULL, &m->p.mlm_ln, R, C, c->ln_eps);
    const lens_linear decoder = mlm_decoder(m);
    lens_gemm_linear(logits, out, &decoder, R, pool);
}

void lens_mlm_backward(const lens_model *m, const lens_grad_map *g, float *dx, const float *dlogits, const float *x,
                       const lens_mlm_rows *k, int R, float *dact, float *dout)
{
    const lens_config *c = &m->cfg;
    const lens_params *p = &m->p;
    const int C = c->d_model;
    const size_t n = (size_t)R * C;
    /* logits = out E^T + b */
    const lens_linear decoder = mlm_decoder(m);
    memset(dout, 0, sizeof(float) * n);
    lens_linear_backward(dout, grad(g, decoder.w), grad(g, decoder.b), dlogits, k->out, &decoder, R);
    /* out = LN_mlm(act) */
    memset(dact, 0, sizeof(float) * n);
    lens_layernorm_backward(dact, grad(g, p->mlm_ln.w), grad(g, p->mlm_ln.b), dout, k->act, k->mean, k->rstd,
                            &p->mlm_ln, R, C);
    /* act = GELU(pre) */
    lens_gelu_backward_inplace(dact, k->pre, n, c->gelu_tanh);
    /* pre = x W_t + b_t */
    memset(dx, 0, sizeof(float) * n);
    lens_linear_backward(dx, grad(g, p->mlm_transform.w), grad(g, p->mlm_transform.b), dact, x, &p->mlm_transform, R);
}

/* ------------------------------------------------------------ causal LM */

void lens_causal_lm_forward(const lens_model *m, float *logits, const float *x, int R, lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const lens_linear decoder = lens_lm_decoder(m);
    lens_gemm_linear(logits, x, &decoder, R, pool);
    if (c->final_softcap > 0) lens_softcap_forward(logits, (size_t)R * c->vocab_size, c->final_softcap);
}

void lens_causal_lm_backward(const lens_model *m, const lens_grad_map *g, float *dx, int accumulate, float *dlogits,
                             const float *logits, const float *x, int R, lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    /* logits = cap tanh(z / cap): dz = (1 - (logits / cap)^2) dlogits */
    if (c->final_softcap > 0) lens_softcap_jvp(dlogits, logits, (size_t)R * c->vocab_size, c->final_softcap);
    /* z = x W^T */
    const lens_linear decoder = lens_lm_decoder(m);
    if (!g) { /* the activation gradient only: the packed GEMM on the pool */
        lens_gemm_linear_backward(dx, dlogits, &decoder, R, accumulate, pool);
        return;
    }
    if (!accumulate) memset(dx, 0, sizeof(float) * (size_t)R * c->d_model);
    lens_linear_backward(dx, grad(g, decoder.w), grad(g, decoder.b), dlogits, x, &decoder, R);
}
