/* logit_attribution.c - direct logit attribution (formulas and convention in
 * logit_attribution.h, docs/logit-attribution.md).
 *
 * One forward pass keeps the hidden states, the attention probabilities, the
 * value vectors and the norm statistics. Then:
 *  - u [C] = dout W_U with dout = e_target (- e_foil): the LM head's input
 *    gradient, one row (no V x C pass over the vocabulary);
 *  - per layer, the NH head outputs at p as one GEMM of NH rows through W_O
 *    without its bias (row h holds ctx_h[p] = Σ_j P^h_pj v^h_j in head h's
 *    columns);
 *  - every term through the final norm with its statistics frozen at p
 *    (core/nn/norm.h lens_norm_frozen), then · u, in double. */
#include "core/analysis/logit_attribution.h"

#include <stdlib.h>
#include <string.h>

#include "core/model/block.h"
#include "core/nn/linear.h"
#include "core/nn/norm.h"

void lens_dla_result_free(lens_dla_result *r)
{
    free(r->heads), free(r->mlps);
    memset(r, 0, sizeof *r);
}

/* f(v) · u: v through the final norm frozen at scale, dotted with u (v is overwritten) */
static double term(const lens_model *m, float *v, double scale, const float *u)
{
    const lens_config *c = &m->cfg;
    lens_norm_frozen(v, c->d_model, m->p.ln_final.w, c->norm_unit_offset, c->norm_rms, scale);
    double s = 0;
    for (int k = 0; k < c->d_model; k++) s += (double)v[k] * u[k];
    return s;
}

int lens_logit_attribution(const lens_model *m, const int *ids, int T, const lens_dla_opts *o, lens_dla_result *out,
                           lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads, DV = c->d_head_v, VO = NH * DV, C = c->d_model, V = c->vocab_size;
    const int p = o->position;
    memset(out, 0, sizeof *out);
    const char *why = NULL;
    if (!lens_model_supports(m, LENS_ANALYSIS_LOGIT_ATTRIBUTION, &why)) return lens_fail(err, LENS_EINVAL, "%s", why);
    if (p < 0 || p >= T) return lens_fail(err, LENS_EINVAL, "position %d is outside the %d tokens", p, T);
    if (o->target < 0 || o->target >= V || o->foil >= V)
        return lens_fail(err, LENS_EINVAL, "target and foil must be token ids in [0, %d)", V);
    if (o->foil == o->target) return lens_fail(err, LENS_EINVAL, "the foil is the target: their difference is 0");
    out->n_layers = L, out->n_heads = NH;
    out->heads = calloc((size_t)L * NH, sizeof(double));
    out->mlps = calloc((size_t)L, sizeof(double));
    float *dout = calloc((size_t)V, sizeof(float)), *u = malloc(sizeof(float) * C);
    float *rows = malloc(sizeof(float) * (size_t)NH * VO), *heads = malloc(sizeof(float) * (size_t)NH * C);
    float *v = malloc(sizeof(float) * C), *attn = malloc(sizeof(float) * C);
    lens_activations act = {0};
    int rc = 0;
    if (!out->heads || !out->mlps || !dout || !u || !rows || !heads || !v || !attn) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for the logit attribution");
        goto done;
    }
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_LN,
                                  .cancel = o->cancel, .pool = o->pool};
    if ((rc = lens_forward(m, &b, &fo, &act, err))) goto done;
    /* u = W_U[target] - W_U[foil] */
    dout[o->target] = 1.0f;
    if (o->foil >= 0) dout[o->foil] = -1.0f;
    const lens_linear lm = lens_lm_decoder(m);
    lens_gemm_linear_backward(u, dout, &lm, 1, 0, o->pool);
    /* the final norm's statistics at p (slot 2L) and its output there */
    const double scale = act.ln_rstd[(size_t)2 * L * T + p];
    const float *final = lens_act_hidden(m, &act, L, 0) + (size_t)p * C;
    const float *beta = m->p.ln_final.b;
    double logit = 0, beta_u = 0;
    for (int k = 0; k < C; k++) logit += (double)final[k] * u[k], beta_u += beta ? (double)beta[k] * u[k] : 0;
    out->logit = logit;
    memcpy(v, lens_act_hidden(m, &act, 0, 0) + (size_t)p * C, sizeof(float) * C);
    out->embed = term(m, v, scale, u);
    out->bias = beta_u;
    for (int l = 0; l < L; l++) {
        lens_attn_residual s;
        lens_block_attn_residual(m, l, &s); /* defined: lens_model_supports checked every layer */
        const float *P = lens_act_attn(m, &act, l + 1, 0, 0), *Vl = lens_act_values(m, &act, l + 1, 0);
        memset(rows, 0, sizeof(float) * (size_t)NH * VO);
        for (int h = 0; h < NH; h++) /* row h: ctx_h[p] in head h's columns */
            for (int j = 0; j < T; j++) {
                const float a = P[h * act.attn_layer_size + (size_t)p * T + j];
                if (a == 0.0f) continue;
                for (int d = 0; d < DV; d++) rows[(size_t)h * VO + h * DV + d] += a * Vl[(size_t)j * VO + h * DV + d];
            }
        lens_linear w_o = *s.out;
        w_o.b = NULL;
        lens_gemm_linear(heads, rows, &w_o, NH, o->pool);
        for (int k = 0; k < C; k++) attn[k] = s.out->b ? s.out->b[k] : 0.0f;
        for (int h = 0; h < NH; h++) {
            for (int k = 0; k < C; k++) attn[k] += heads[(size_t)h * C + k];
            out->heads[(size_t)l * NH + h] = term(m, heads + (size_t)h * C, scale, u);
        }
        if (s.out->b) {
            memcpy(v, s.out->b, sizeof(float) * C);
            out->bias += term(m, v, scale, u);
        }
        double heads_sum = 0;
        for (int h = 0; h < NH; h++) heads_sum += out->heads[(size_t)l * NH + h];
        if (l < L - 1) { /* m_l = x_{l+1} - x_l - attention output */
            const float *x0 = lens_act_hidden(m, &act, l, 0) + (size_t)p * C;
            const float *x1 = lens_act_hidden(m, &act, l + 1, 0) + (size_t)p * C;
            for (int k = 0; k < C; k++) v[k] = x1[k] - x0[k] - attn[k];
            out->mlps[l] = term(m, v, scale, u);
        } else {
            /* x_L is kept only through the final norm, but f(x_L) = final(x_L) - β exactly, so
             * f(m_{L-1}) = f(x_L) - f(x_{L-1}) - f(attention output): what the other terms leave of
             * logit - β·u (the reference computes the MLP's own output and agrees) */
            double rest = out->embed + out->bias - beta_u + heads_sum;
            for (int k = 0; k < l; k++) rest += out->mlps[k];
            for (int k = 0; k < l * NH; k++) rest += out->heads[k];
            out->mlps[l] = logit - beta_u - rest;
        }
    }
    out->total = out->embed + out->bias;
    for (int k = 0; k < L * NH; k++) out->total += out->heads[k];
    for (int l = 0; l < L; l++) out->total += out->mlps[l];
done:
    lens_activations_free(&act);
    free(dout), free(u), free(rows), free(heads), free(v), free(attn);
    if (rc) lens_dla_result_free(out);
    return rc;
}
