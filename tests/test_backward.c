/* test_backward.c - every backward op in core/nn/ops.c, and the whole-model
 * gradient of core/analysis/attribution.c, against central finite differences.
 *
 * Ops: small random inputs, loss = Σ r_i out_i with fixed random r (summed
 * in double), so dL/dout = r is what each backward is given. The numerical
 * gradient (L(x + ε) − L(x − ε)) / 2ε perturbs the float32 inputs one at a
 * time with ε = 1e-2: truncation error O(ε²) ≈ 1e-5, float32 rounding of the
 * forward ≈ 1e-7 |L| / ε ≈ 1e-5. Tolerance: |analytic − numeric| ≤
 * 1e-4 + 1e-3 |numeric| (TOL_ABS, TOL_REL); measured worst (<= 2e-5) is printed.
 * The erf GELU forward uses a rational erf approximation (|err| ≤ 4e-7) and
 * its backward the exact derivative; the difference is far below tolerance.
 *
 * Whole model: d p(class) / d A_l through every layer above l, the pooler
 * and the classifier, on a tiny random BERT classifier made with lens_mkmodel
 * and on ../shared/models/bert-tiny-sst2 when present:
 *  - d F(αA) / dα at α = 1 (= Σ A ⊙ ∇F(A), the attribution with m = 1,
 *    right) against (F(1.05 A) − F(0.95 A)) / 0.1 from lens_attr_eval;
 *  - 16 random entries ∂F/∂A[h][i][j] against perturbing that entry by ±0.05.
 * Tolerance 1e-2 of the largest |gradient| checked plus 1e-6: F is a float32
 * forward through every layer, so the differences carry ~1e-7 / 0.1 = 1e-6 of
 * rounding, and the step leaves O(0.05²) curvature. The random mkmodel
 * classifier (weights N(0, 0.02)) has p ≈ 0.5 and gradients ~1e-5, which is
 * why the absolute term is that small.
 *
 * Objectives (core/analysis/attribution.h): the same two checks for
 * log_probability, logit and logit_difference on bert-tiny-sst2 and, at a
 * position before the last, on gpt2-tiny-wikitext (F = the objective of the
 * next-token logits there; lens_attr_eval_objective is the numeric side);
 * and the attribution of a logit difference equals the difference of the
 * two logits' attributions (the gradient is linear in F; 1e-5 of the
 * largest entry, float32 sums). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/attribution.h"
#include "core/model/embedding.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "core/nn/ops.h"
#include "tests/check.h"

#define EPS 1e-2
#define TOL_ABS 1e-4
#define TOL_REL 1e-3
#define STEP_MODEL 0.05f
#define TOL_MODEL_REL 1e-2
#define TOL_MODEL_ABS 1e-6

static uint64_t rng_state = 0x1234567887654321ull;

static double uniform(void) /* [0, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static float *random_floats(size_t n, double lo, double hi)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * uniform());
    return x;
}

static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

/* The forward under test: computes out from the op's inputs (held in ctx). */
typedef void (*forward_fn)(void *ctx, float *out);

static double loss_of(forward_fn f, void *ctx, float *out, const float *r, size_t n_out)
{
    f(ctx, out);
    double L = 0;
    for (size_t i = 0; i < n_out; i++) L += (double)r[i] * out[i];
    return L;
}

/* Central differences of the loss w.r.t. each x[i] against analytic[i]. */
static void check_grad(const char *what, forward_fn f, void *ctx, float *x, size_t n, const float *analytic,
                       const float *r, size_t n_out)
{
    float *out = malloc(n_out * sizeof *out), *numeric = malloc(n * sizeof *numeric);
    for (size_t i = 0; i < n; i++) {
        const float keep = x[i];
        x[i] = keep + (float)EPS;
        const double hi = loss_of(f, ctx, out, r, n_out);
        x[i] = keep - (float)EPS;
        const double lo = loss_of(f, ctx, out, r, n_out);
        x[i] = keep;
        numeric[i] = (float)((hi - lo) / (2 * EPS));
    }
    double worst = check_close(what, analytic, numeric, n, TOL_ABS, TOL_REL);
    printf("  %-34s max |analytic - numeric| %.2e over %zu\n", what, worst, n);
    free(out), free(numeric);
}

/* ---------------------------------------------------------------- linear */

typedef struct {
    float *inp;
    lens_linear lin;
    int N;
} linear_ctx;

static void linear_fwd(void *p, float *out)
{
    linear_ctx *c = p;
    lens_linear_forward(out, c->inp, &c->lin, c->N);
}

static void test_linear(int w_in_out)
{
    const int N = 3, IC = 5, OC = 4;
    const int ld = w_in_out ? OC + 2 : IC; /* Conv1D viewed inside a wider matrix, like GPT-2's c_attn */
    float *W = random_floats((size_t)(w_in_out ? IC : OC) * ld, -1, 1), *b = random_floats(OC, -1, 1);
    linear_ctx c = {random_floats((size_t)N * IC, -1, 1), {.w = W, .b = b, .in = IC, .out = OC, .ld = ld, .w_in_out = w_in_out}, N};
    float *r = random_floats((size_t)N * OC, -1, 1);
    float *dinp = zeros((size_t)N * IC), *dW = zeros((size_t)(w_in_out ? IC : OC) * ld), *db = zeros(OC);
    lens_linear_backward(dinp, dW, db, r, c.inp, &c.lin, N);
    char what[64];
    snprintf(what, sizeof what, "linear %s dinp", w_in_out ? "Conv1D" : "Linear");
    check_grad(what, linear_fwd, &c, c.inp, (size_t)N * IC, dinp, r, (size_t)N * OC);
    /* weights: check every entry the map uses (row stride ld) */
    snprintf(what, sizeof what, "linear %s dW", w_in_out ? "Conv1D" : "Linear");
    check_grad(what, linear_fwd, &c, W, (size_t)(w_in_out ? IC : OC) * ld, dW, r, (size_t)N * OC);
    snprintf(what, sizeof what, "linear %s db", w_in_out ? "Conv1D" : "Linear");
    check_grad(what, linear_fwd, &c, b, OC, db, r, (size_t)N * OC);
    free(W), free(b), free(c.inp), free(r), free(dinp), free(dW), free(db);
}

/* ---------------------------------------------------------------- layernorm */

typedef struct {
    float *inp;
    lens_layernorm ln;
    int N, C;
} ln_ctx;

static void ln_fwd(void *p, float *out)
{
    ln_ctx *c = p;
    lens_layernorm_forward(out, NULL, NULL, c->inp, &c->ln, c->N, c->C, 1e-5f);
}

static void test_layernorm(void)
{
    const int N = 3, C = 8;
    float *w = random_floats(C, 0.5, 1.5), *b = random_floats(C, -1, 1);
    ln_ctx c = {random_floats((size_t)N * C, -2, 2), {w, b}, N, C};
    float *r = random_floats((size_t)N * C, -1, 1), *out = zeros((size_t)N * C);
    float mean[3], rstd[3];
    lens_layernorm_forward(out, mean, rstd, c.inp, &c.ln, N, C, 1e-5f);
    float *dinp = zeros((size_t)N * C), *dw = zeros(C), *db = zeros(C);
    lens_layernorm_backward(dinp, dw, db, r, c.inp, mean, rstd, &c.ln, N, C);
    check_grad("layernorm dinp", ln_fwd, &c, c.inp, (size_t)N * C, dinp, r, (size_t)N * C);
    check_grad("layernorm dweight", ln_fwd, &c, w, C, dw, r, (size_t)N * C);
    check_grad("layernorm dbias", ln_fwd, &c, b, C, db, r, (size_t)N * C);
    free(w), free(b), free(c.inp), free(r), free(out), free(dinp), free(dw), free(db);
}

/* ---------------------------------------------------------------- pointwise */

typedef struct {
    float *inp;
    size_t n;
    void (*op)(float *, size_t);
} pointwise_ctx;

static void pointwise_fwd(void *p, float *out)
{
    pointwise_ctx *c = p;
    memcpy(out, c->inp, c->n * sizeof *out);
    c->op(out, c->n);
}

static void identity_op(float *x, size_t n) { (void)x, (void)n; }

static void test_pointwise(void)
{
    const size_t n = 40;
    float *r = random_floats(n, -1, 1), *out = zeros(n);
    pointwise_ctx c = {random_floats(n, -4, 4), n, lens_gelu_forward};
    float *d = zeros(n);
    lens_gelu_backward(d, c.inp, r, n);
    check_grad("gelu (erf) dinp", pointwise_fwd, &c, c.inp, n, d, r, n);

    c.op = lens_gelu_tanh_forward;
    memset(d, 0, n * sizeof *d);
    lens_gelu_tanh_backward(d, c.inp, r, n);
    check_grad("gelu (tanh) dinp", pointwise_fwd, &c, c.inp, n, d, r, n);

    /* the in-place variants give the same products */
    float *d2 = malloc(n * sizeof *d2);
    memcpy(d2, r, n * sizeof *d2);
    lens_gelu_backward_inplace(d2, c.inp, n, 1);
    check_close("gelu_backward_inplace (tanh) == gelu_tanh_backward", d2, d, n, 1e-7, 1e-6);
    memset(d, 0, n * sizeof *d);
    lens_gelu_backward(d, c.inp, r, n);
    memcpy(d2, r, n * sizeof *d2);
    lens_gelu_backward_inplace(d2, c.inp, n, 0);
    check_close("gelu_backward_inplace (erf) == gelu_backward", d2, d, n, 1e-7, 1e-6);

    c.op = lens_tanh_forward;
    pointwise_fwd(&c, out);
    memset(d, 0, n * sizeof *d);
    lens_tanh_backward(d, out, r, n);
    check_grad("tanh dinp", pointwise_fwd, &c, c.inp, n, d, r, n);

    /* residual: out = y + inp, so dL/dinp = dL/dout */
    c.op = identity_op;
    memset(d, 0, n * sizeof *d);
    lens_residual_backward(d, r, n);
    check_grad("residual dinp", pointwise_fwd, &c, c.inp, n, d, r, n);
    free(r), free(out), free(c.inp), free(d), free(d2);
}

/* ---------------------------------------------------------------- softmax */

typedef struct {
    float *inp;
    int rows, cols, causal;
} softmax_ctx;

static void softmax_fwd(void *p, float *out)
{
    softmax_ctx *c = p;
    memcpy(out, c->inp, sizeof(float) * c->rows * c->cols);
    lens_softmax_forward(out, c->rows, c->cols, c->causal);
}

static void test_softmax(int causal)
{
    softmax_ctx c = {random_floats(4 * 5, -3, 3), 4, 5, causal};
    float *r = random_floats(20, -1, 1), *probs = zeros(20), *d = zeros(20);
    softmax_fwd(&c, probs);
    lens_softmax_backward(d, probs, r, 4, 5, causal);
    check_grad(causal ? "softmax (causal) dinp" : "softmax dinp", softmax_fwd, &c, c.inp, 20, d, r, 20);
    free(c.inp), free(r), free(probs), free(d);
}

/* ---------------------------------------------------------------- attention */

enum { AT = 4, ANH = 2, ADK = 3, ADV = 2 };
/* the score scale: 1/sqrt(DV), as an "attention_scale": "DV" config, so the check covers a scale other than 1/sqrt(DK) */
#define ASCALE (1.0f / sqrtf((float)ADV))

typedef struct {
    float *q, *k, *v;
    lens_score_fn f;
    float probs[ANH * AT * AT];
} attn_ctx;

static void attn_fwd(void *p, float *out)
{
    attn_ctx *c = p;
    lens_attention_forward(out, c->probs, AT * AT, c->q, c->k, c->v, AT, ANH, ADK, ADV, &c->f);
}

/* out_h = P_h v_h with P given: the map whose gradient dprobs is */
typedef struct {
    float *probs, *v;
} apply_ctx;

static void apply_fwd(void *p, float *out)
{
    apply_ctx *c = p;
    for (int h = 0; h < ANH; h++)
        for (int i = 0; i < AT; i++)
            for (int d = 0; d < ADV; d++) {
                double s = 0;
                for (int j = 0; j < AT; j++) s += (double)c->probs[h * AT * AT + i * AT + j] * c->v[j * ANH * ADV + h * ADV + d];
                out[i * ANH * ADV + h * ADV + d] = (float)s;
            }
}

/* causal, a sliding window of 2 (Mistral), a soft-cap of 0.5 (Gemma 2's tanh, small enough to bend
 * these scores), each checked against finite differences of the forward */
static void test_attention(int causal, int window, float softcap)
{
    attn_ctx c = {random_floats(AT * ANH * ADK, -1, 1), random_floats(AT * ANH * ADK, -1, 1),
                  random_floats(AT * ANH * ADV, -1, 1),
                  {.scale = ASCALE, .softcap = softcap, .causal = causal || window, .window = window}, {0}};
    const size_t n_out = AT * ANH * ADV;
    float *r = random_floats(n_out, -1, 1), *out = zeros(n_out);
    attn_fwd(&c, out);
    float *dq = zeros(AT * ANH * ADK), *dk = zeros(AT * ANH * ADK), *dv = zeros(AT * ANH * ADV);
    float dprobs[ANH * AT * AT], dscores[AT * AT];
    lens_attention_backward(dq, dk, dv, dprobs, AT * AT, dscores, r, c.q, c.k, c.v, c.probs, AT * AT, AT, ANH,
                            ADK, ADV, &c.f);
    char what[64], mode[40];
    snprintf(mode, sizeof mode, "%s%s%s", causal ? " (causal)" : "", window ? " (window 2)" : "",
             softcap > 0 ? " (soft-cap)" : "");
    snprintf(what, sizeof what, "attention%s dq", mode);
    check_grad(what, attn_fwd, &c, c.q, AT * ANH * ADK, dq, r, n_out);
    snprintf(what, sizeof what, "attention%s dk", mode);
    check_grad(what, attn_fwd, &c, c.k, AT * ANH * ADK, dk, r, n_out);
    snprintf(what, sizeof what, "attention%s dv", mode);
    check_grad(what, attn_fwd, &c, c.v, AT * ANH * ADV, dv, r, n_out);
    apply_ctx a = {c.probs, c.v};
    snprintf(what, sizeof what, "attention%s dprobs", mode);
    check_grad(what, apply_fwd, &a, c.probs, ANH * AT * AT, dprobs, r, n_out);
    /* dq/dk/dv NULL: only dprobs, same values */
    float dprobs2[ANH * AT * AT];
    lens_attention_backward(NULL, NULL, NULL, dprobs2, AT * AT, NULL, r, c.q, c.k, c.v, c.probs, AT * AT, AT, ANH,
                            ADK, ADV, &c.f);
    check_close("attention dprobs alone == with dq/dk/dv", dprobs2, dprobs, ANH * AT * AT, 0, 0);
    free(c.q), free(c.k), free(c.v), free(r), free(out), free(dq), free(dk), free(dv);
}

/* ---------------------------------------------------------------- embedding */

/* The shared embedding (core/model/embedding.h) on a hand-built model of
 * V 5, C 4, T 4: its tables and LayerNorm as the parameters probed. */
typedef struct {
    lens_model m;
    float *tok, *pos, *type, *ln_w, *ln_b; /* [5][4], [6][4], [2][4], [4], [4] */
    float *grads[5];                       /* the same order */
    int ids[4], type_ids[4];
} emb_ctx;

static void emb_fwd(void *p, float *out)
{
    emb_ctx *c = p;
    lens_embed_forward(&c->m, c->ids, c->type_ids, 4, out, NULL, NULL, NULL);
}

static float *emb_grad(const lens_grad_map *g, const float *param)
{
    emb_ctx *c = g->ctx;
    const float *params[5] = {c->tok, c->pos, c->type, c->ln_w, c->ln_b};
    for (int i = 0; i < 5; i++)
        if (param == params[i]) return c->grads[i];
    return NULL;
}

/* BERT's form (token + position + segment, LayerNorm; id 2 repeated), and
 * RoBERTa's padding-aware positions (pad id 1 at position 1, the others from
 * padding_idx + 1) with an embedding scale of 2 (Gemma's √C) and no norm. */
static void test_embedding(void)
{
    for (int roberta = 0; roberta < 2; roberta++) {
        emb_ctx c = {.tok = random_floats(5 * 4, -1, 1), .pos = random_floats(6 * 4, -1, 1),
                     .type = random_floats(2 * 4, -1, 1), .ln_w = random_floats(4, 0.5, 1.5),
                     .ln_b = random_floats(4, -0.5, 0.5), .ids = {2, 4, 2, 3}, .type_ids = {0, 1, 1, 0}};
        for (int i = 0; i < 5; i++) c.grads[i] = zeros(6 * 4);
        c.m.cfg = (lens_config){.d_model = 4, .vocab_size = 5, .ln_eps = 1e-5f};
        c.m.p = (lens_params){.tok_emb = c.tok, .pos_emb = c.pos, .type_emb = c.type, .ln_emb = {c.ln_w, c.ln_b}};
        if (roberta) {
            c.m.cfg.position_offset = 2, c.m.cfg.pad_token_id = 1, c.m.cfg.emb_scale = 2.0f;
            c.m.p.ln_emb = (lens_layernorm){0};
            c.ids[1] = 1;
        }
        float x[16], pre[16], mean[4], rstd[4], de[16], *r = random_floats(16, -1, 1);
        lens_embed_forward(&c.m, c.ids, c.type_ids, 4, x, pre, mean, rstd);
        const lens_grad_map g = {.of = emb_grad, .ctx = &c};
        lens_embed_backward(&c.m, &g, r, c.ids, c.type_ids, 4, pre, mean, rstd, de);
        const char *what = roberta ? "embedding (RoBERTa positions, scale 2)" : "embedding (BERT, LayerNorm)";
        char name[96];
        float *params[5] = {c.tok, c.pos, c.type, c.ln_w, c.ln_b};
        const size_t sizes[5] = {20, 24, 8, 4, 4};
        const char *names[5] = {"dtok", "dpos", "dtype", "dln_w", "dln_b"};
        for (int i = 0; i < (roberta ? 3 : 5); i++) {
            snprintf(name, sizeof name, "%s %s", what, names[i]);
            check_grad(name, emb_fwd, &c, params[i], sizes[i], c.grads[i], r, 16);
        }
        for (int i = 0; i < 5; i++) free(params[i]), free(c.grads[i]);
        free(r);
    }
}

/* ---------------------------------------------------------------- whole model */

static void model_gradient(const char *name, const lens_model *m, const int *ids, int T, int target,
                           const lens_objective *obj)
{
    const lens_config *c = &m->cfg;
    const int NH = c->n_heads;
    const size_t TT = (size_t)T * T;
    lens_err err = {0};
    /* A_l of every layer from a plain forward */
    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids};
    lens_forward_opts fo = {.keep = LENS_KEEP_ATTN};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, &err)) {
        CHECK(0, "%s: forward: %s", name, err.msg);
        return;
    }
    int layers_to_check[2] = {1, c->n_layers};
    for (int li = 0; li < (c->n_layers > 1 ? 2 : 1); li++) {
        const int layer = layers_to_check[li];
        const float *A = lens_act_attn(m, &act, layer, 0, 0); /* heads TT apart */
        lens_attr_opts o = {.steps = 1, .riemann = LENS_RIEMANN_RIGHT, .target = target, .layers = &layer, .n_layers = 1,
                            .objective = obj};
        lens_attribution at;
        if (lens_attribution_run(m, ids, NULL, T, &o, &at, &err)) {
            CHECK(0, "%s: attribution: %s", name, err.msg);
            continue;
        }
        target = at.target;
        float *X = malloc(sizeof(float) * NH * TT);
        double Fp, Fm, F1;
        /* d F(αA) / dα at 1 */
        for (size_t i = 0; i < NH * TT; i++) X[i] = (1 + STEP_MODEL) * A[i];
        lens_attr_eval_objective(m, ids, NULL, T, layer, X, target, obj, &Fp, &err);
        for (size_t i = 0; i < NH * TT; i++) X[i] = (1 - STEP_MODEL) * A[i];
        lens_attr_eval_objective(m, ids, NULL, T, layer, X, target, obj, &Fm, &err);
        memcpy(X, A, sizeof(float) * NH * TT);
        lens_attr_eval_objective(m, ids, NULL, T, layer, X, target, obj, &F1, &err);
        const double dalpha = (Fp - Fm) / (2 * STEP_MODEL);
        CHECK(fabs(F1 - at.f_full) < 1e-5, "%s layer %d: F(A) from lens_attr_eval %.7f vs the forward's %.7f",
              name, layer, F1, at.f_full);
        CHECK(fabs(at.layers[0].attr_sum - dalpha) <= TOL_MODEL_REL * fabs(dalpha) + TOL_MODEL_ABS,
              "%s layer %d: dF(aA)/da analytic %.6g vs numeric %.6g", name, layer, at.layers[0].attr_sum, dalpha);
        printf("  %s layer %d: dF(aA)/da at a=1: analytic %.6g, numeric %.6g\n", name, layer,
               at.layers[0].attr_sum, dalpha);
        /* single entries: ∇F(A) = attr / A (m = 1, α = 1) */
        double worst = 0, largest = 0;
        int n_checked = 0;
        float got[16], want[16];
        for (int probe = 0; probe < 16; probe++) {
            const size_t idx = (size_t)(uniform() * NH * TT) % (NH * TT);
            if (A[idx] < 1e-6f) continue;
            const float step = STEP_MODEL;
            X[idx] = A[idx] + step;
            lens_attr_eval_objective(m, ids, NULL, T, layer, X, target, obj, &Fp, &err);
            X[idx] = A[idx] - step;
            lens_attr_eval_objective(m, ids, NULL, T, layer, X, target, obj, &Fm, &err);
            X[idx] = A[idx];
            want[n_checked] = (float)((Fp - Fm) / (2 * step));
            got[n_checked] = at.layers[0].attr[idx] / A[idx];
            largest = fmax(largest, fabs(want[n_checked]));
            worst = fmax(worst, fabs(got[n_checked] - want[n_checked]));
            n_checked++;
        }
        char what[96];
        snprintf(what, sizeof what, "%s layer %d dF/dA entries", name, layer);
        check_close(what, got, want, (size_t)n_checked, TOL_MODEL_REL * largest + TOL_MODEL_ABS, 0);
        printf("  %s: %d entries, max |analytic - numeric| %.2e (largest |grad| %.2e)\n", what, n_checked, worst,
               largest);
        free(X);
        lens_attribution_free(&at);
    }
    lens_activations_free(&act);
}

/* every objective's gradient by finite differences, and the difference's attribution by linearity */
static void objectives(const char *model, const lens_model *m, const int *ids, int T, int target, int foil,
                       int position)
{
    static const lens_objective_kind kinds[] = {LENS_OBJ_LOG_PROBABILITY, LENS_OBJ_LOGIT, LENS_OBJ_LOGIT_DIFFERENCE};
    for (int k = 0; k < 3; k++) {
        const lens_objective obj = {.kind = kinds[k], .position = position,
                                    .foil = kinds[k] == LENS_OBJ_LOGIT_DIFFERENCE ? foil : -1};
        char name[128];
        snprintf(name, sizeof name, "%s %s", model, lens_objective_name(kinds[k]));
        model_gradient(name, m, ids, T, target, &obj);
    }
    lens_err err = {0};
    const int layer = 1;
    lens_attribution a[3];
    const lens_objective objs[3] = {{LENS_OBJ_LOGIT_DIFFERENCE, position, foil}, {LENS_OBJ_LOGIT, position, -1},
                                    {LENS_OBJ_LOGIT, position, -1}};
    const int targets[3] = {target, target, foil};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        const lens_attr_opts o = {.steps = 4, .target = targets[i], .layers = &layer, .n_layers = 1, .objective = &objs[i]};
        ok &= !lens_attribution_run(m, ids, NULL, T, &o, &a[i], &err);
    }
    CHECK(ok, "%s: attributions of the logits: %s", model, err.msg);
    if (!ok) return;
    const size_t n = (size_t)m->cfg.n_heads * T * T;
    float *want = malloc(sizeof(float) * n);
    double largest = 0;
    for (size_t i = 0; want && i < n; i++) {
        want[i] = a[1].layers[0].attr[i] - a[2].layers[0].attr[i];
        largest = fmax(largest, fabs(want[i]));
    }
    char what[160];
    snprintf(what, sizeof what, "%s: attribution of logit_difference = logit(target) - logit(foil)", model);
    if (want) check_close(what, a[0].layers[0].attr, want, n, 1e-5 * largest + 1e-9, 0);
    CHECK(fabs(a[0].f_full - (a[1].f_full - a[2].f_full)) < 1e-5 * fmax(1, fabs(a[0].f_full)),
          "%s: F = z_target - z_foil (%.7f vs %.7f - %.7f)", model, a[0].f_full, a[1].f_full, a[2].f_full);
    free(want);
    for (int i = 0; i < 3; i++) lens_attribution_free(&a[i]);
}

static void test_model(void)
{
    char dir[] = "/tmp/lens-test-backward-XXXXXX";
    lens_err err = {0};
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    if (lens_mkmodel("bert", "tiny", "classification", 7, dir, &err)) {
        CHECK(0, "mkmodel: %s", err.msg);
    } else {
        lens_model *m = lens_model_load(dir, &err);
        CHECK(m != NULL, "load: %s", err.msg);
        if (m) {
            /* random weights N(0, 0.02) leave p(class) ≈ 0.5 and gradients tiny; still exact */
            int ids[9] = {2, 40, 41, 57, 90, 33, 71, 64, 3};
            model_gradient("mkmodel bert tiny", m, ids, 9, -1, NULL);
            lens_model_free(m);
        }
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);

    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared/models/bert-tiny-sst2 not found: whole-model gradient on the trained classifier");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert-tiny-sst2", shared);
    lens_model *m = lens_model_load(path, &err);
    CHECK(m != NULL, "load %s: %s", path, err.msg);
    if (!m) return;
    /* "it 's a charming and often affecting journey ." (golden.json example 0) */
    int ids[12] = {101, 2009, 1005, 1055, 1037, 11951, 1998, 2411, 12473, 4990, 1012, 102};
    model_gradient("bert-tiny-sst2", m, ids, 12, -1, NULL);
    objectives("bert-tiny-sst2", m, ids, 12, 1, 0, -1);
    lens_model_free(m);
    /* a causal LM, at a position before the last */
    snprintf(path, sizeof path, "%s/models/gpt2-tiny-wikitext", shared);
    m = lens_model_load(path, &err);
    CHECK(m != NULL, "load %s: %s", path, err.msg);
    if (!m) return;
    int gids[9] = {464, 3290, 373, 257, 1310, 286, 262, 995, 13};
    objectives("gpt2-tiny-wikitext", m, gids, 9, 262, 286, 5);
    lens_model_free(m);
}

int main(void)
{
    test_linear(0);
    test_linear(1);
    test_layernorm();
    test_pointwise();
    test_softmax(0);
    test_softmax(1);
    test_attention(0, 0, 0);
    test_attention(1, 0, 0);
    test_attention(1, 2, 0);
    test_attention(1, 0, 0.5f);
    test_attention(1, 2, 0.5f);
    test_embedding();
    test_model();
    return check_done("test_backward");
}
