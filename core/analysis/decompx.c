/* decompx.c - DecompX's token decomposition through post-norm encoder
 * blocks and the classifier head (formulas in decompx.h, the released
 * code's choices and lensd's in docs/context-mixing.md).
 *
 * Per layer: the real states the decomposition freezes (LayerNorm
 * statistics, the FFN's pre-activation z) from one pass over the T rows;
 * then the T x T vectors: the values of each source as one GEMM of T*T rows
 * (A W_V), the attention mixing per head, W_O as one GEMM of T*T rows, and
 * per output row i one task for the rest (biases, LayerNorms, the FFN as
 * two GEMMs of T rows). Such a pass runs once for the propagated vectors
 * and, only when the caller asks for the layer's own matrix, once from the
 * diagonal (layer 1: one pass is both). Shapes: T tokens, C channels, NH
 * heads of DV value channels (VO = NH*DV), FF the FFN's width, K labels. */
#include "core/analysis/decompx.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/model/arch.h"
#include "core/model/head.h"
#include "core/nn/linear.h"
#include "core/nn/norm.h"
#include "core/nn/ops.h"

/* The maps of one post-norm encoder block, read off its program. */
typedef struct {
    const lens_linear *v, *out, *ff_in, *ff_out;
    const lens_layernorm *ln1, *ln2;
} dx_block;

static const char *block_of(const lens_model *m, int l, dx_block *b)
{
    static const char shape[] = "DecompX follows a post-norm encoder block as its released code does (attention, "
                                "residual, LayerNorm, linear-GELU-linear FFN, residual, LayerNorm); this block's "
                                "FFN or its norms are shaped otherwise (a gated MLP, a mixture of experts)";
    lens_attn_residual s;
    const char *why = lens_block_attn_residual(m, l, &s);
    if (why) return why;
    if (!s.post_norm)
        return "DecompX decomposes post-norm blocks (the paper and its code: BERT, RoBERTa); this block normalises "
               "the residual stream before the attention (pre-norm), which neither defines";
    lens_block_prog p = {0};
    m->cfg.family->block(m, l, &p);
    lens_op op[LENS_BLOCK_MAX_OPS];
    int n = 0, a = -1;
    for (int k = 0; k < p.n; k++)
        if (p.op[k].kind != LENS_OP_TAIL) op[n++] = p.op[k];
    memset(b, 0, sizeof *b);
    for (int k = 0; k < n && a < 0; k++) {
        if (op[k].kind == LENS_OP_ATTEND) a = k;
        else if (op[k].out == LENS_R_V) {
            if (op[k].kind != LENS_OP_LINEAR || op[k].in != LENS_R_X || b->v)
                return "DecompX projects each source's vector by W_V; this block's values are not one linear map of "
                       "the block input";
            b->v = op[k].lin;
        }
    }
    if (!b->v || a < 0 || n != a + 9) return shape;
    const lens_op *o = op + a + 1;
    const lens_reg r = o[0].out, f = o[5].out;
    if (o[2].kind != LENS_OP_NORM || o[2].out != LENS_R_X || o[2].in != r || o[3].kind != LENS_OP_LINEAR ||
        o[3].out != LENS_R_FF || o[3].in != LENS_R_X || o[4].kind != LENS_OP_GELU || o[5].kind != LENS_OP_LINEAR ||
        o[5].in != LENS_R_FF || o[6].kind != LENS_OP_ADD || o[6].out != f || o[6].in != LENS_R_X ||
        o[7].kind != LENS_OP_NORM || o[7].out != LENS_R_X || o[7].in != f)
        return shape;
    b->out = o[0].lin, b->ln1 = o[2].ln, b->ff_in = o[3].lin, b->ff_out = o[5].lin, b->ln2 = o[7].ln;
    return NULL;
}

const char *lens_decompx_undefined(const lens_model *m)
{
    dx_block b;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const char *why = block_of(m, l, &b);
        if (why) return why;
    }
    return NULL;
}

struct lens_decompx {
    int T, C, VO, FF, layers_done;
    float *agg;         /* [T][T][C] the propagated vectors (aggregation "vector") */
    float *next;        /* [T][T][C] the layer's own decomposition (aggregation None; only its norms are kept),
                           then the layer's propagated vectors, swapped into agg */
    float *values;      /* [T][T][VO] A W_V, then the attention's mixing of them */
    float *ctx;         /* [T][T][VO] */
    float *ctx0, *pre1, *pre2, *act_in, *slope; /* [T][VO], [T][C], [T][C], [T][FF], [T][FF] */
    double *rstd1, *rstd2; /* [T] */
};

size_t lens_decompx_bytes(const lens_model *m, int T)
{
    const lens_config *c = &m->cfg;
    return sizeof(float) * (size_t)T * T * (2 * (size_t)c->d_model + 2 * (size_t)c->n_heads * c->d_head_v);
}

lens_decompx *lens_decompx_new(const lens_model *m, int T, size_t max_bytes, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const size_t limit = max_bytes ? max_bytes : (size_t)2 << 30, need = lens_decompx_bytes(m, T);
    if (need > limit) {
        int most = T;
        while (most > 1 && lens_decompx_bytes(m, most) > limit) most--;
        lens_fail(err, LENS_ELIMIT, "DecompX keeps T x T vectors of %d channels: %d tokens need %.2f GiB, over "
                  "its %.2f GiB bound (at most %d tokens)", c->d_model, T, need / 1073741824.0, limit / 1073741824.0, most);
        return NULL;
    }
    lens_decompx *d = calloc(1, sizeof *d);
    if (!d) {
        lens_fail(err, LENS_ENOMEM, "out of memory for DecompX");
        return NULL;
    }
    const size_t TT = (size_t)T * T;
    d->T = T, d->C = c->d_model, d->VO = c->n_heads * c->d_head_v, d->FF = c->d_ff;
    d->agg = malloc(sizeof(float) * TT * d->C), d->next = malloc(sizeof(float) * TT * d->C);
    d->values = malloc(sizeof(float) * TT * d->VO), d->ctx = malloc(sizeof(float) * TT * d->VO);
    d->ctx0 = malloc(sizeof(float) * T * d->VO);
    d->pre1 = malloc(sizeof(float) * T * d->C), d->pre2 = malloc(sizeof(float) * T * d->C);
    d->act_in = malloc(sizeof(float) * T * d->FF), d->slope = malloc(sizeof(float) * T * d->FF);
    d->rstd1 = malloc(sizeof(double) * T), d->rstd2 = malloc(sizeof(double) * T);
    if (!d->agg || !d->next || !d->values || !d->ctx || !d->ctx0 || !d->pre1 || !d->pre2 ||
        !d->act_in || !d->slope || !d->rstd1 || !d->rstd2) {
        lens_decompx_free(d);
        lens_fail(err, LENS_ENOMEM, "out of memory for DecompX's %.2f GiB of vectors", need / 1073741824.0);
        return NULL;
    }
    return d;
}

void lens_decompx_free(lens_decompx *d)
{
    if (!d) return;
    free(d->agg), free(d->next), free(d->values), free(d->ctx), free(d->ctx0);
    free(d->pre1), free(d->pre2), free(d->act_in), free(d->slope), free(d->rstd1), free(d->rstd2);
    free(d);
}

const float *lens_decompx_vectors(const lens_decompx *d)
{
    return d->layers_done ? d->agg : NULL;
}

/* ------------------------------------------------------------ the pieces */

/* v[T][n] += w_k b, w_k = |<v_k, b>| / (Σ_k |<v_k, b>| + eps): the released
 * code's bias_decomposer "absdot" (eps 1e-12 there; lensd: 0, and a bias
 * orthogonal to every v_k is then split equally so the sum stays exact). */
static void absdot(float *v, int T, int n, const float *b, int paper_code)
{
    if (!b) return;
    double w[T], sum = 0;
    for (int k = 0; k < T; k++) {
        double dot = 0;
        for (int e = 0; e < n; e++) dot += (double)v[(size_t)k * n + e] * b[e];
        w[k] = fabs(dot), sum += w[k];
    }
    for (int k = 0; k < T; k++) {
        const double share = paper_code ? w[k] / (sum + 1e-12) : sum > 0 ? w[k] / sum : 1.0 / T;
        if (share == 0) continue;
        for (int e = 0; e < n; e++) v[(size_t)k * n + e] += (float)(share * b[e]);
    }
}

/* the "ZO" slope act(z) / z of an activation at its real input z: the
 * released code's act(z) / (z + 1e-12); lensd's exact ratio, its limit at 0 */
static float zo_slope(float act, float z, double limit0, int paper_code)
{
    if (paper_code) return (float)(act / (z + 1e-12));
    return z != 0.0f ? act / z : (float)limit0;
}

/* 1/sqrt(var + eps) of each row of x [T][C] (biased variance; RMSNorm: mean square) */
static void norm_rstd(const lens_config *c, const float *x, int T, double *rstd)
{
    const int C = c->d_model;
    for (int i = 0; i < T; i++) {
        const float *r = x + (size_t)i * C;
        double mean = 0, var = 0;
        if (!c->norm_rms) {
            for (int k = 0; k < C; k++) mean += r[k];
            mean /= C;
        }
        for (int k = 0; k < C; k++) var += (r[k] - mean) * (r[k] - mean);
        rstd[i] = 1.0 / sqrt(var / C + c->ln_eps);
    }
}

/* y [T][C] = the real norm of x with its statistics rstd (LayerNorm / RMSNorm) */
static void norm_rows(const lens_config *c, const lens_layernorm *ln, float *y, const float *x, const double *rstd,
                      int T)
{
    const int C = c->d_model;
    for (int i = 0; i < T; i++) {
        float *r = y + (size_t)i * C;
        memcpy(r, x + (size_t)i * C, sizeof(float) * C);
        lens_norm_frozen(r, C, ln->w, c->norm_unit_offset, c->norm_rms, rstd[i]);
        if (ln->b)
            for (int k = 0; k < C; k++) r[k] += ln->b[k];
    }
}

/* The real states of layer l the decomposition freezes: rstd1 of the pre-LN1
 * states x + Attn(x), z = LN1(.) W_1 + b_1 and the ZO slopes act(z) / z,
 * rstd2 of the pre-LN2 states LN1(.) + FFN(LN1(.)). */
static void real_states(lens_decompx *d, const lens_model *m, const lens_activations *act, int l, const dx_block *b,
                        int paper_code, lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const int T = d->T, C = d->C, VO = d->VO, FF = d->FF, NH = c->n_heads, DV = c->d_head_v;
    const float *x = lens_act_hidden(m, act, l, 0), *V = lens_act_values(m, act, l + 1, 0);
    const float *P = lens_act_attn(m, act, l + 1, 0, 0);
    memset(d->ctx0, 0, sizeof(float) * T * VO);
    for (int h = 0; h < NH; h++) /* ctx0_h = P^h v_h */
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                const float a = P[h * act->attn_layer_size + (size_t)i * T + j];
                for (int e = 0; e < DV; e++) d->ctx0[(size_t)i * VO + h * DV + e] += a * V[(size_t)j * VO + h * DV + e];
            }
    lens_gemm_linear(d->pre1, d->ctx0, b->out, T, pool);
    for (size_t n = 0; n < (size_t)T * C; n++) d->pre1[n] += x[n];
    norm_rstd(c, d->pre1, T, d->rstd1);
    float *a1 = d->pre2; /* LN1's output, then the pre-LN2 states */
    norm_rows(c, b->ln1, a1, d->pre1, d->rstd1, T);
    lens_gemm_linear(d->act_in, a1, b->ff_in, T, pool);
    memcpy(d->slope, d->act_in, sizeof(float) * T * FF);
    (c->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward)(d->slope, (size_t)T * FF);
    float *ffn = d->pre1; /* read by LN1 already */
    lens_gemm_linear(ffn, d->slope, b->ff_out, T, pool);
    for (size_t n = 0; n < (size_t)T * C; n++) a1[n] += ffn[n];
    norm_rstd(c, d->pre2, T, d->rstd2);
    for (size_t n = 0; n < (size_t)T * FF; n++) d->slope[n] = zo_slope(d->slope[n], d->act_in[n], 0.5, paper_code);
}

typedef struct {
    const lens_decompx *d;
    const lens_model *m;
    const dx_block *b;
    const float *P; /* head h's [T][T] at P + h * P_stride */
    size_t P_stride;
    const float *V;      /* [T][VO] the values with their bias (the diagonal start), or NULL */
    const float *bias;   /* [C] the attention's bias W_O b_V + b_O (diagonal start: b_O) */
    const float *x;      /* [T][C] the layer input (diagonal start), or NULL */
    const float *in;     /* [T][T][C] the decomposition of the layer input, or NULL: the diagonal x */
    float *out;          /* [T][T][C] */
    float *scratch;      /* [threads][T][FF + C] */
    float *M;            /* [T][T] */
    int paper_code;
    const volatile int *cancel; /* rows not yet started are skipped once set */
} dx_pass;

/* ctx[i][k] = Σ_s P^h_is values[s][k] per head, or (diagonal start) P^h_ik v^h_k */
static void mix_row(void *ctx, int i)
{
    const dx_pass *p = ctx;
    const lens_config *c = &p->m->cfg;
    const int T = p->d->T, VO = p->d->VO, NH = c->n_heads, DV = c->d_head_v;
    float *row = p->d->ctx + (size_t)i * T * VO;
    memset(row, 0, sizeof(float) * T * VO);
    for (int h = 0; h < NH; h++)
        for (int s = 0; s < T; s++) {
            const float a = p->P[h * p->P_stride + (size_t)i * T + s];
            if (a == 0.0f) continue;
            if (!p->in) {
                for (int e = 0; e < DV; e++) row[(size_t)s * VO + h * DV + e] = a * p->V[(size_t)s * VO + h * DV + e];
                continue;
            }
            const float *src = p->d->values + (size_t)s * T * VO + h * DV;
            for (int k = 0; k < T; k++)
                for (int e = 0; e < DV; e++) row[(size_t)k * VO + h * DV + e] += a * src[(size_t)k * VO + e];
        }
}

/* row i of the layer after the attention: residual, biases, LN1, FFN, LN2; its norms into M */
static void block_row(void *ctx, int i)
{
    const dx_pass *p = ctx;
    const lens_config *c = &p->m->cfg;
    const lens_decompx *d = p->d;
    const dx_block *b = p->b;
    const int T = d->T, C = d->C, FF = d->FF;
    if (lens_cancelled(p->cancel)) return;
    float *t = p->out + (size_t)i * T * C;
    float *f1 = p->scratch + (size_t)lens_pool_thread_index() * T * (FF + C), *f2 = f1 + (size_t)T * FF;
    if (p->in) /* + the residual: the decomposition of x_i */
        for (size_t n = 0; n < (size_t)T * C; n++) t[n] += p->in[(size_t)i * T * C + n];
    else
        for (int e = 0; e < C; e++) t[(size_t)i * C + e] += p->x[(size_t)i * C + e];
    absdot(t, T, C, p->bias, p->paper_code);
    for (int k = 0; k < T; k++)
        lens_norm_frozen(t + (size_t)k * C, C, b->ln1->w, c->norm_unit_offset, c->norm_rms, d->rstd1[i]);
    absdot(t, T, C, b->ln1->b, p->paper_code);
    lens_linear w1 = *b->ff_in, w2 = *b->ff_out;
    w1.b = w2.b = NULL;
    lens_gemm_linear(f1, t, &w1, T, NULL);
    absdot(f1, T, FF, b->ff_in->b, p->paper_code);
    const float *slope = d->slope + (size_t)i * FF;
    for (int k = 0; k < T; k++)
        for (int e = 0; e < FF; e++) f1[(size_t)k * FF + e] *= slope[e];
    lens_gemm_linear(f2, f1, &w2, T, NULL);
    absdot(f2, T, C, b->ff_out->b, p->paper_code);
    for (size_t n = 0; n < (size_t)T * C; n++) t[n] += f2[n];
    for (int k = 0; k < T; k++)
        lens_norm_frozen(t + (size_t)k * C, C, b->ln2->w, c->norm_unit_offset, c->norm_rms, d->rstd2[i]);
    absdot(t, T, C, b->ln2->b, p->paper_code);
    double norm[T], sum = 0;
    for (int k = 0; k < T; k++) {
        double s = 0;
        for (int e = 0; e < C; e++) s += (double)t[(size_t)k * C + e] * t[(size_t)k * C + e];
        norm[k] = sqrt(s), sum += norm[k];
    }
    /* the released code returns the raw norms (output_builder "norm"); lensd rows sum to one */
    for (int k = 0; k < T; k++) p->M[(size_t)i * T + k] = (float)(p->paper_code || sum == 0 ? norm[k] : norm[k] / sum);
}

/* One pass of layer l: out [T][T][C] from in (NULL: the diagonal x, the
 * values with their bias), norms into M. */
static int pass(lens_decompx *d, const lens_model *m, const lens_activations *act, int l, const dx_block *b,
                const float *in, float *out, float *M, int paper_code, lens_pool *pool, const volatile int *cancel,
                lens_err *err)
{
    const int T = d->T, C = d->C, FF = d->FF;
    const size_t TT = (size_t)T * T;
    float *scratch = malloc(sizeof(float) * (size_t)lens_pool_threads(pool) * T * (FF + C));
    float *bias = malloc(sizeof(float) * C);
    if (!scratch || !bias) {
        free(scratch), free(bias);
        return lens_fail(err, LENS_ENOMEM, "out of memory for DecompX's FFN rows of %d tokens", T);
    }
    dx_pass p = {.d = d, .m = m, .b = b, .P = lens_act_attn(m, act, l + 1, 0, 0), .P_stride = act->attn_layer_size,
                 .V = lens_act_values(m, act, l + 1, 0), .x = lens_act_hidden(m, act, l, 0), .in = in, .out = out,
                 .scratch = scratch, .M = M, .bias = bias, .paper_code = paper_code, .cancel = cancel};
    lens_linear w_v = *b->v, w_o = *b->out;
    w_v.b = w_o.b = NULL;
    /* the attention's bias: b_O, plus (propagated vectors) b_V through W_O, which the diagonal start
     * leaves inside each source's value (the released code's two branches) */
    memset(bias, 0, sizeof(float) * C);
    if (in && b->v->b) lens_gemm_linear(bias, b->v->b, &w_o, 1, NULL);
    if (b->out->b)
        for (int e = 0; e < C; e++) bias[e] += b->out->b[e];
    if (in) lens_gemm_linear(d->values, in, &w_v, (int)TT, pool);
    lens_pool_run(pool, T, mix_row, &p);
    lens_gemm_linear(out, d->ctx, &w_o, (int)TT, pool);
    lens_pool_run(pool, T, block_row, &p);
    free(scratch), free(bias);
    return lens_cancelled(cancel) ? lens_fail(err, LENS_ECANCEL, "cancelled in DecompX of layer %d", l + 1) : 0;
}

int lens_decompx_layer(lens_decompx *d, const lens_model *m, const lens_activations *act, int l, int paper_code,
                       lens_pool *pool, const volatile int *cancel, float *M, float *agg, lens_err *err)
{
    dx_block b;
    const char *why = block_of(m, l, &b);
    if (why) return lens_fail(err, LENS_EINVAL, "%s", why);
    real_states(d, m, act, l, &b, paper_code, pool);
    int rc;
    if (l == 0) { /* the first layer's input decomposes as the diagonal: its own and its propagated pass are one */
        if ((rc = pass(d, m, act, l, &b, NULL, d->agg, agg, paper_code, pool, cancel, err))) return rc;
        if (M) memcpy(M, agg, sizeof(float) * d->T * d->T);
    } else {
        /* the layer's own vectors go to next, which the propagated pass then overwrites: only their norms stay */
        if (M && (rc = pass(d, m, act, l, &b, NULL, d->next, M, paper_code, pool, cancel, err))) return rc;
        if ((rc = pass(d, m, act, l, &b, d->agg, d->next, agg, paper_code, pool, cancel, err))) return rc;
        float *swap = d->agg;
        d->agg = d->next, d->next = swap;
    }
    d->layers_done = l + 1;
    return 0;
}

double lens_decompx_flops(const lens_model *m, int T, const int *layers, int n_layers)
{
    const lens_config *c = &m->cfg;
    const double t = T, C = c->d_model, VO = (double)c->n_heads * c->d_head_v, FF = c->d_ff;
    const int top = layers ? (n_layers > 0 ? layers[n_layers - 1] : 0) : c->n_layers;
    /* the layer's own matrix for every asked layer after the first (layer 1's is its propagated pass) */
    const int own = layers ? n_layers - (n_layers > 0 && layers[0] == 1) : c->n_layers - 1;
    /* real_states: W_O, W_1 and W_2 over T rows; a pass: T² rows through W_O, W_1 and W_2, the propagated one
     * also through W_V and the attention's mixing of T sources for each of them */
    const double states = 2 * t * (VO * C + 2 * C * FF), own_pass = 2 * t * t * (VO * C + 2 * C * FF);
    const double propagated = own_pass + 2 * t * t * C * VO + 2 * t * t * t * VO;
    return top < 1 ? 0 : top * states + own * own_pass + top * propagated;
}

int lens_decompx_classifier(lens_decompx *d, const lens_model *m, const lens_activations *act, int paper_code,
                            lens_pool *pool, float *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const lens_params *p = &m->p;
    const int T = d->T, C = d->C, K = c->n_labels;
    if (c->task != LENS_TASK_CLASSIFICATION || p->pooler_ln.w || K < 1) return 1;
    if (d->layers_done != c->n_layers)
        return lens_fail(err, LENS_EINVAL, "DecompX's classifier reads the vectors after layer %d", c->n_layers);
    float *u = malloc(sizeof(float) * (T + 1) * C), *z = malloc(sizeof(float) * C), *pooled = malloc(sizeof(float) * T * C);
    if (!u || !z || !pooled) {
        free(u), free(z), free(pooled);
        return lens_fail(err, LENS_ENOMEM, "out of memory for DecompX's classifier");
    }
    /* u[k] = token k's part of what the head reads (the first row, or the mean of the rows); u[T] the real one */
    const int first = 0, len = T;
    memset(u, 0, sizeof(float) * (T + 1) * C);
    for (int i = 0; i < (c->pool_mean ? T : 1); i++)
        for (size_t n = 0; n < (size_t)T * C; n++) u[n] += d->agg[(size_t)i * T * C + n] / (c->pool_mean ? T : 1);
    lens_classifier_pool(m, u + (size_t)T * C, lens_act_hidden(m, act, c->n_layers, 0), &first, &len, 1);
    lens_gemm_linear(z, u + (size_t)T * C, &p->pooler, 1, NULL); /* the real pre-activation */
    lens_linear w_p = p->pooler, w_c = p->classifier;
    w_p.b = w_c.b = NULL;
    lens_gemm_linear(pooled, u, &w_p, T, pool);
    absdot(pooled, T, C, p->pooler.b, paper_code);
    for (int e = 0; e < C; e++) { /* tanh (ReLU: DistilBERT's pre_classifier) by its ZO slope */
        float a = z[e];
        (c->head_relu ? lens_relu_forward : lens_tanh_forward)(&a, 1);
        const float s = zo_slope(a, z[e], c->head_relu ? 0.0 : 1.0, paper_code);
        for (int k = 0; k < T; k++) pooled[(size_t)k * C + e] *= s;
    }
    lens_gemm_linear(out, pooled, &w_c, T, pool);
    absdot(out, T, K, p->classifier.b, paper_code);
    free(u), free(z), free(pooled);
    return 0;
}
