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
#include "core/nn/ops.h"

#define DEFAULT_PROBES 16
#define DEFAULT_SCRATCH ((size_t)256 << 20)

/* What one layer's JVP reads from the primal pass ([T] rows). ln1 / ln2:
 * BERT ln_attn / ln_ff (post-LN, input = residual sum), GPT-2 ln_1 / ln_2
 * (pre-LN, input = the residual stream). */
typedef struct {
    float *q, *k, *v;          /* [T][NH*DK], [T][NH*DK], [T][NH*DV] */
    float *probs;              /* [NH][T][T] */
    float *ln1_in, *ln2_in;    /* [T][C] */
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd; /* [T] */
    float *gelu_grad;          /* [T][d_ff] GELU'(input): every tangent's FFN JVP multiplies by it */
} layer_cache;

typedef struct {
    const lens_model *m;
    int T, L, C, QK, VO, F, NH, causal;
    layer_cache *cache;        /* [L] */
    float *lnf_in, *lnf_mean, *lnf_rstd; /* GPT-2 ln_f: [T][C], [T], [T] */
    /* primal work [T][...] */
    float *x, *a, *ctx, *ff;
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
        for (int l = 0; l < p->L; l++) {
            layer_cache *c = &p->cache[l];
            free(c->q), free(c->k), free(c->v), free(c->probs), free(c->ln1_in), free(c->ln2_in);
            free(c->ln1_mean), free(c->ln1_rstd), free(c->ln2_mean), free(c->ln2_rstd), free(c->gelu_grad);
        }
    free(p->cache);
    free(p->lnf_in), free(p->lnf_mean), free(p->lnf_rstd);
    free(p->x), free(p->a), free(p->ctx), free(p->ff);
    memset(p, 0, sizeof *p);
}

static int primal_init(primal *p, const lens_model *m, int T)
{
    const lens_config *c = &m->cfg;
    memset(p, 0, sizeof *p);
    p->m = m, p->T = T, p->L = c->n_layers, p->C = c->d_model, p->NH = c->n_heads, p->F = c->d_ff;
    p->QK = c->n_heads * c->d_head_k, p->VO = c->n_heads * c->d_head_v;
    p->causal = c->arch == LENS_ARCH_GPT2;
    int failed = 0;
    const size_t t = (size_t)T;
    p->cache = calloc((size_t)p->L, sizeof *p->cache);
    if (!p->cache) return -1;
    for (int l = 0; l < p->L; l++) {
        layer_cache *lc = &p->cache[l];
        lc->q = zalloc(t * p->QK, &failed), lc->k = zalloc(t * p->QK, &failed), lc->v = zalloc(t * p->VO, &failed);
        lc->probs = zalloc((size_t)p->NH * t * t, &failed);
        lc->ln1_in = zalloc(t * p->C, &failed), lc->ln2_in = zalloc(t * p->C, &failed);
        lc->ln1_mean = zalloc(t, &failed), lc->ln1_rstd = zalloc(t, &failed);
        lc->ln2_mean = zalloc(t, &failed), lc->ln2_rstd = zalloc(t, &failed);
        lc->gelu_grad = zalloc(t * p->F, &failed);
    }
    p->lnf_in = zalloc(t * p->C, &failed), p->lnf_mean = zalloc(t, &failed), p->lnf_rstd = zalloc(t, &failed);
    p->x = zalloc(t * p->C, &failed), p->a = zalloc(t * p->C, &failed);
    p->ctx = zalloc(t * (p->VO > p->C ? p->VO : p->C), &failed), p->ff = zalloc(t * p->F, &failed);
    if (failed) {
        primal_free(p);
        return -1;
    }
    return 0;
}

/* x <- GELU(x), grad <- GELU'(x) (of the input), for n values. */
static void gelu_forward_keep_grad(float *x, float *grad, size_t n, int tanh_approx)
{
    for (size_t i = 0; i < n; i++) grad[i] = 1.0f;
    lens_gelu_backward_inplace(grad, x, n, tanh_approx);
    (tanh_approx ? lens_gelu_tanh_forward : lens_gelu_forward)(x, n);
}

/* The layers from h^0; hidden [L+1][T][C] when non-NULL. */
static void primal_run(primal *p, const float *h0, float *hidden)
{
    const lens_model *m = p->m;
    const lens_config *c = &m->cfg;
    const int T = p->T, C = p->C;
    const size_t TC = (size_t)T * C;
    memcpy(p->x, h0, sizeof(float) * TC);
    if (hidden) memcpy(hidden, h0, sizeof(float) * TC);
    for (int l = 0; l < p->L; l++) {
        const lens_block *b = &m->p.blocks[l];
        layer_cache *lc = &p->cache[l];
        const size_t TT = (size_t)T * T;
        if (c->arch == LENS_ARCH_BERT) {
            /* a = LN_attn(x + attn_out(attention(x Wq, x Wk, x Wv))) */
            lens_linear_forward(lc->q, p->x, &b->q, T);
            lens_linear_forward(lc->k, p->x, &b->k, T);
            lens_linear_forward(lc->v, p->x, &b->v, T);
            lens_attention_forward(p->ctx, lc->probs, TT, lc->q, lc->k, lc->v, T, p->NH, c->d_head_k, c->d_head_v, 0,
                                   c->attn_scale);
            lens_linear_forward(lc->ln1_in, p->ctx, &b->attn_out, T);
            lens_residual_forward(lc->ln1_in, p->x, TC);
            lens_layernorm_forward(p->a, lc->ln1_mean, lc->ln1_rstd, lc->ln1_in, &b->ln_attn, T, C, c->ln_eps);
            /* x' = LN_ff(a + ff_out(gelu(a W_in))) */
            lens_linear_forward(p->ff, p->a, &b->ff_in, T);
            gelu_forward_keep_grad(p->ff, lc->gelu_grad, (size_t)T * p->F, c->gelu_tanh);
            lens_linear_forward(lc->ln2_in, p->ff, &b->ff_out, T);
            lens_residual_forward(lc->ln2_in, p->a, TC);
            lens_layernorm_forward(p->x, lc->ln2_mean, lc->ln2_rstd, lc->ln2_in, &b->ln_ff, T, C, c->ln_eps);
        } else {
            /* x2 = x + attn_out(attention(ln_1(x))) */
            memcpy(lc->ln1_in, p->x, sizeof(float) * TC);
            lens_layernorm_forward(p->a, lc->ln1_mean, lc->ln1_rstd, lc->ln1_in, &b->ln_attn, T, C, c->ln_eps);
            lens_linear_forward(lc->q, p->a, &b->q, T);
            lens_linear_forward(lc->k, p->a, &b->k, T);
            lens_linear_forward(lc->v, p->a, &b->v, T);
            lens_attention_forward(p->ctx, lc->probs, TT, lc->q, lc->k, lc->v, T, p->NH, c->d_head_k, c->d_head_v, 1,
                                   c->attn_scale);
            lens_linear_forward(lc->ln2_in, p->ctx, &b->attn_out, T);
            lens_residual_forward(lc->ln2_in, p->x, TC);
            /* x' = x2 + ff_out(gelu(ln_2(x2) W_in)) */
            lens_layernorm_forward(p->a, lc->ln2_mean, lc->ln2_rstd, lc->ln2_in, &b->ln_ff, T, C, c->ln_eps);
            lens_linear_forward(p->ff, p->a, &b->ff_in, T);
            gelu_forward_keep_grad(p->ff, lc->gelu_grad, (size_t)T * p->F, c->gelu_tanh);
            lens_linear_forward(p->x, p->ff, &b->ff_out, T);
            lens_residual_forward(p->x, lc->ln2_in, TC);
        }
        if (hidden) memcpy(hidden + (size_t)(l + 1) * TC, p->x, sizeof(float) * TC);
    }
    if (c->arch == LENS_ARCH_GPT2) { /* HF hidden_states[L] has ln_f applied */
        memcpy(p->lnf_in, p->x, sizeof(float) * TC);
        lens_layernorm_forward(p->a, p->lnf_mean, p->lnf_rstd, p->lnf_in, &m->p.ln_final, T, C, c->ln_eps);
        if (hidden) memcpy(hidden + (size_t)p->L * TC, p->a, sizeof(float) * TC);
    }
}

int lens_hta_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *h0, lens_err *err)
{
    const lens_config *c = &m->cfg;
    if (T < 1 || T > c->max_positions)
        return lens_fail(err, LENS_ELIMIT, "sequence of %d tokens (the model takes 1..%d)", T, c->max_positions);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size) return lens_fail(err, LENS_EINVAL, "token id %d out of range", ids[t]);
    lens_embedding_forward(h0, ids, c->arch == LENS_ARCH_BERT ? type_ids : NULL, m->p.tok_emb, m->p.pos_emb,
                           c->arch == LENS_ARCH_BERT ? m->p.type_emb : NULL, T, c->d_model);
    if (c->arch == LENS_ARCH_BERT)
        lens_layernorm_forward(h0, NULL, NULL, h0, &m->p.ln_emb, T, c->d_model, c->ln_eps);
    return 0;
}

int lens_hta_forward_from(const lens_model *m, const float *h0, int T, float *hidden, lens_err *err)
{
    primal p;
    if (primal_init(&p, m, T)) return lens_fail(err, LENS_ENOMEM, "out of memory");
    primal_run(&p, h0, hidden);
    primal_free(&p);
    return 0;
}

/* ---- JVPs over B tangents, R = B*T rows ---- */

/* forward: y = (x - mean) * rstd * w + b, per row of x [T][C].
 * JVP: dy = w ⊙ rstd (dx - mean(dx) - xhat mean(xhat ⊙ dx)), xhat = (x - mean) rstd,
 * for each of the B tangents dx [B][T][C]; dy may alias dx. */
static void layernorm_jvp(float *dy, const float *dx, const float *x, const float *mean, const float *rstd,
                          const lens_layernorm *ln, int B, int T, int C, float *xhat_scratch)
{
    for (int t = 0; t < T; t++) {
        float *xh = xhat_scratch;
        for (int i = 0; i < C; i++) xh[i] = (x[(size_t)t * C + i] - mean[t]) * rstd[t];
        for (int b = 0; b < B; b++) {
            const float *d = dx + ((size_t)b * T + t) * C;
            float *y = dy + ((size_t)b * T + t) * C;
            /* 16 partial sums in float, so the loop vectorises without reassociating */
            float pd[16] = {0}, pxd[16] = {0};
            int i = 0;
            for (; i + 16 <= C; i += 16)
                for (int l = 0; l < 16; l++) pd[l] += d[i + l], pxd[l] += xh[i + l] * d[i + l];
            double md = 0, mxd = 0;
            for (; i < C; i++) md += d[i], mxd += (double)xh[i] * d[i];
            for (int l = 0; l < 16; l++) md += pd[l], mxd += pxd[l];
            const float mdf = (float)(md / C), mxdf = (float)(mxd / C);
            for (int c = 0; c < C; c++) y[c] = ln->w[c] * rstd[t] * (d[c] - mdf - xh[c] * mxdf);
        }
    }
}

/* forward: ctx_h = P_h v_h, P_h = softmax(q_h k_h^T / sqrt(DK)) (causal: GPT-2).
 * JVP per tangent and head (scale = lens_config.attn_scale, 1/sqrt(DK) unless the config says DV):
 *   dS = scale (dq_h k_h^T + q_h dk_h^T)
 *   dP = P ⊙ (dS − rowsum(P ⊙ dS))          (masked entries have P = 0)
 *   dctx_h = dP v_h + P dv_h */
static void attention_jvp(float *dctx, const float *dq, const float *dk, const float *dv, const layer_cache *lc,
                          int B, int T, int NH, int DK, int DV, float scale, float *dS)
{
    const int QK = NH * DK, VO = NH * DV;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *P = lc->probs + (size_t)h * T * T;
            const size_t rq = (size_t)b * T * QK + (size_t)h * DK, rv = (size_t)b * T * VO + (size_t)h * DV;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DK, scale, dq + rq, QK, lc->k + h * DK, QK,
                        0.0f, dS, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DK, scale, lc->q + h * DK, QK, dk + rq, QK,
                        1.0f, dS, T);
            for (int t = 0; t < T; t++) {
                const float *p = P + (size_t)t * T;
                float *s = dS + (size_t)t * T;
                double dot = 0;
                for (int u = 0; u < T; u++) dot += (double)p[u] * s[u];
                for (int u = 0; u < T; u++) s[u] = p[u] * (s[u] - (float)dot);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, dS, T, lc->v + h * DV, VO, 0.0f,
                        dctx + rv, VO);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, P, T, dv + rv, VO, 1.0f,
                        dctx + rv, VO);
        }
}

/* the linear part of out = inp W + b */
static void linear_jvp(float *dout, const float *dinp, const lens_linear *lin, int R)
{
    lens_linear nobias = *lin;
    nobias.b = NULL;
    lens_gemm_linear(dout, dinp, &nobias, R, NULL);
}

/* each of the B blocks of x [B][n] times g [n], elementwise (a JVP through an elementwise op) */
static void scale_rows(float *x, const float *g, int B, size_t n)
{
    for (int b = 0; b < B; b++) {
        float *xb = x + (size_t)b * n;
        for (size_t e = 0; e < n; e++) xb[e] *= g[e];
    }
}

typedef struct {
    float *tx, *tn, *tq, *tk, *tv, *tctx, *th, *tff, *dS, *xhat;
    float *rows_in, *rows_out; /* [B][C], [B][max(QK, VO)]: the one non-zero row of each tangent (first layer) */
} tangents;

static void tangents_free(tangents *t)
{
    free(t->tx), free(t->tn), free(t->tq), free(t->tk), free(t->tv), free(t->tctx), free(t->th), free(t->tff);
    free(t->dS), free(t->xhat), free(t->rows_in), free(t->rows_out);
    memset(t, 0, sizeof *t); /* tangents_init frees on failure and its caller frees every set again */
}

static int tangents_init(tangents *t, const primal *p, int B)
{
    int failed = 0;
    const size_t R = (size_t)B * p->T;
    memset(t, 0, sizeof *t);
    t->tx = zalloc(R * p->C, &failed), t->tn = zalloc(R * p->C, &failed), t->th = zalloc(R * p->C, &failed);
    t->tq = zalloc(R * p->QK, &failed), t->tk = zalloc(R * p->QK, &failed);
    t->tv = zalloc(R * p->VO, &failed), t->tctx = zalloc(R * p->VO, &failed), t->tff = zalloc(R * p->F, &failed);
    t->dS = zalloc((size_t)p->T * p->T, &failed), t->xhat = zalloc((size_t)p->C, &failed);
    t->rows_in = zalloc((size_t)B * p->C, &failed);
    t->rows_out = zalloc((size_t)B * (p->QK > p->VO ? p->QK : p->VO), &failed);
    if (failed) tangents_free(t);
    return failed ? -1 : 0;
}

/* The q, k, v tangents from in [B][T][C]. row >= 0: every tangent of in is
 * zero except its row `row` (the first layer sees one input token's
 * directions), so the maps run on those B rows and the rest is zero. */
static void qkv_jvp(const primal *p, tangents *t, const lens_block *b, const float *in, int B, int row)
{
    const int T = p->T, C = p->C, R = B * T;
    if (row < 0) {
        linear_jvp(t->tq, in, &b->q, R);
        linear_jvp(t->tk, in, &b->k, R);
        linear_jvp(t->tv, in, &b->v, R);
        return;
    }
    for (int k = 0; k < B; k++) memcpy(t->rows_in + (size_t)k * C, in + ((size_t)k * T + row) * C, sizeof(float) * C);
    float *outs[3] = {t->tq, t->tk, t->tv};
    const lens_linear *maps[3] = {&b->q, &b->k, &b->v};
    for (int m = 0; m < 3; m++) {
        const int W = maps[m]->out;
        linear_jvp(t->rows_out, t->rows_in, maps[m], B);
        memset(outs[m], 0, sizeof(float) * (size_t)R * W);
        for (int k = 0; k < B; k++)
            memcpy(outs[m] + ((size_t)k * T + row) * W, t->rows_out + (size_t)k * W, sizeof(float) * W);
    }
}

/* One layer's JVP: t->tx [B][T][C] in, t->tx out; row as for qkv_jvp. */
static void layer_jvp(const primal *p, tangents *t, int l, int B, int row)
{
    const lens_model *m = p->m;
    const lens_config *c = &m->cfg;
    const lens_block *b = &m->p.blocks[l];
    const layer_cache *lc = &p->cache[l];
    const int T = p->T, C = p->C, R = B * T;
    const size_t RC = (size_t)R * C;
    if (c->arch == LENS_ARCH_BERT) {
        qkv_jvp(p, t, b, t->tx, B, row);
        attention_jvp(t->tctx, t->tq, t->tk, t->tv, lc, B, T, p->NH, c->d_head_k, c->d_head_v, c->attn_scale, t->dS);
        linear_jvp(t->th, t->tctx, &b->attn_out, R);
        lens_residual_forward(t->th, t->tx, RC);
        layernorm_jvp(t->tn, t->th, lc->ln1_in, lc->ln1_mean, lc->ln1_rstd, &b->ln_attn, B, T, C, t->xhat);
        linear_jvp(t->tff, t->tn, &b->ff_in, R);
        scale_rows(t->tff, lc->gelu_grad, B, (size_t)T * p->F);
        linear_jvp(t->th, t->tff, &b->ff_out, R);
        lens_residual_forward(t->th, t->tn, RC);
        layernorm_jvp(t->tx, t->th, lc->ln2_in, lc->ln2_mean, lc->ln2_rstd, &b->ln_ff, B, T, C, t->xhat);
    } else {
        layernorm_jvp(t->tn, t->tx, lc->ln1_in, lc->ln1_mean, lc->ln1_rstd, &b->ln_attn, B, T, C, t->xhat);
        qkv_jvp(p, t, b, t->tn, B, row); /* ln_1's JVP keeps the other rows zero */
        attention_jvp(t->tctx, t->tq, t->tk, t->tv, lc, B, T, p->NH, c->d_head_k, c->d_head_v, c->attn_scale, t->dS);
        linear_jvp(t->th, t->tctx, &b->attn_out, R);
        lens_residual_forward(t->tx, t->th, RC);
        layernorm_jvp(t->tn, t->tx, lc->ln2_in, lc->ln2_mean, lc->ln2_rstd, &b->ln_ff, B, T, C, t->xhat);
        linear_jvp(t->tff, t->tn, &b->ff_in, R);
        scale_rows(t->tff, lc->gelu_grad, B, (size_t)T * p->F);
        linear_jvp(t->th, t->tff, &b->ff_out, R);
        lens_residual_forward(t->tx, t->th, RC);
    }
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
    const lens_model *m = p->m;
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
            layer_jvp(p, t, l - 1, nb, l == 1 ? i : -1);
            if (job->want[l] < 0) continue;
            const float *y = t->tx;
            if (l == L && m->cfg.arch == LENS_ARCH_GPT2) { /* ln_f */
                layernorm_jvp(t->tn, t->tx, p->lnf_in, p->lnf_mean, p->lnf_rstd, &m->p.ln_final, nb, T, C, t->xhat);
                y = t->tn;
            }
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
                                                              2 * (size_t)c->n_heads * c->d_head_v + c->d_ff);
    const size_t budget = opts && opts->max_scratch_bytes ? opts->max_scratch_bytes : DEFAULT_SCRATCH;
    const int threads = lens_pool_threads(opts ? opts->pool : NULL);
    int B = (int)(budget / threads / per_tangent);
    if (B < 1) B = 1;
    if (B > P) B = P;
    tangents *t = calloc((size_t)threads, sizeof *t);
    if (!t) failed = 1;
    if (!failed && primal_init(&p, m, T)) failed = 1;
    for (int k = 0; k < threads && !failed; k++)
        if (tangents_init(&t[k], &p, B)) failed = 1;
    if (failed) {
        for (int k = 0; t && k < threads; k++) tangents_free(&t[k]);
        free(t);
        primal_free(&p);
        free(h0), free(sum), free(sumsq);
        lens_hta_result_free(out);
        return lens_fail(err, LENS_ENOMEM, "out of memory (T = %d)", T);
    }
    primal_run(&p, h0, NULL);
    free(h0);
    sweep_job job = {
        .p = &p, .t = t, .opts = opts, .want = want, .top = top, .P = P, .B = B,
        .exact = method == LENS_HTA_EXACT, .sum = sum, .sumsq = sumsq,
        .seed = opts && opts->seed ? opts->seed : 1,
    };
    if (top > 0) lens_pool_run(opts ? opts->pool : NULL, T, sweep_token, &job);
    int rc = atomic_load(&job.cancelled) ? lens_fail(err, LENS_ECANCEL, "cancelled") : 0;
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
            aggregate(y, T, p.causal || c->arch == LENS_ARCH_GPT2);
        }
    free(sum), free(sumsq);
    if (rc) lens_hta_result_free(out);
    return rc;
}
