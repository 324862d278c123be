/* context_mixing.c - attention rollout, ALTI, GlobEnc and value zeroing of
 * one sequence (formulas and conventions in context_mixing.h, the math and
 * every paper / code / lensd difference in docs/context-mixing.md).
 *
 * One forward pass keeps what every method reads: the hidden states, the
 * attention probabilities, the value vectors and (GlobEnc) the LayerNorm
 * statistics. Then, per layer:
 *  - rollout: R = (mean_h P^h + I) / rowsum;
 *  - ALTI / GlobEnc: the per-head value vectors through W_O^h B, one GEMM
 *    per head (B U[h][j] = v^h_j W_O^h B, B the frozen norms), then the
 *    vectors t_ij = Σ_h P^h_ij U[h][j] + [i == j] x_i measured without
 *    being stored: ALTI one task per source column j, GlobEnc per row i;
 *  - value zeroing: the layer's block program run once per zeroed token
 *    plus once unchanged, the copies packed as rows of one GEMM, from after
 *    W_O: copy j's attention output is the unchanged one less
 *    Σ_h P^h_ij v^h_j W_O^h, the attention with token j's values zeroed
 *    (the probabilities do not read the values); a block that cannot start
 *    there starts at ATTEND, whose hook subtracts P^h_ij v^h_j from ctx;
 * and the rolled-out matrix is the product of the layers' matrices.
 * DecompX is decompx.c's, called layer by layer from the driver below. */
#include "core/analysis/context_mixing.h"
#include "core/analysis/decompx.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/model/arch.h"
#include "core/model/block.h"
#include "core/nn/linear.h"
#include "core/nn/norm.h"

static const char *const method_names[LENS_CM_COUNT] = {
    [LENS_CM_ROLLOUT] = "rollout",
    [LENS_CM_ALTI] = "alti",
    [LENS_CM_GLOBENC] = "globenc",
    [LENS_CM_VALUE_ZEROING] = "value-zeroing",
    [LENS_CM_DECOMPX] = "decompx",
};

const char *lens_cm_method_name(lens_cm_method m)
{
    return (unsigned)m < LENS_CM_COUNT ? method_names[m] : "unknown";
}

int lens_cm_method_parse(const char *name, lens_cm_method *m)
{
    for (int i = 0; i < LENS_CM_COUNT; i++)
        if (!strcmp(name, method_names[i])) {
            *m = (lens_cm_method)i;
            return 0;
        }
    return -1;
}

const char *lens_cm_undefined(const lens_model *m, lens_cm_method method)
{
    if (method == LENS_CM_ROLLOUT || method == LENS_CM_VALUE_ZEROING) return NULL;
    if (method == LENS_CM_DECOMPX) return lens_decompx_undefined(m);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        lens_attn_residual s;
        const char *why = lens_block_attn_residual(m, l, &s);
        if (why) return why;
        if (s.parallel)
            return "a parallel residual (GPT-NeoX) adds the MLP of the block's input beside the attention, which "
                   "the decomposition does not follow";
        if (method == LENS_CM_GLOBENC && s.post_norm && !s.ln2)
            return "GlobEnc reads the second LayerNorm of a post-norm block, which this block does not end with";
    }
    return NULL;
}

/* a norm of c with its statistics frozen on one term (core/nn/norm.h) */
static void frozen_norm(const lens_config *c, const lens_layernorm *ln, float *v, int C, double scale)
{
    lens_norm_frozen(v, C, ln->w, c->norm_unit_offset, c->norm_rms, scale);
}

/* ------------------------------------------------------------ ALTI, GlobEnc */

/* Every norm on the path is frozen per output row i: a fixed linear map B
 * (centre, times the gain) times a scale s_i. So the vector of source j at
 * row i is s_i B t_ij = s_i (Σ_h P^h_ij B U[h][j] + [i == j] B x_i): B goes
 * onto the NH * T vectors U[h][j] = v^h_j W_O^h once per layer, not onto
 * each of the T² t_ij. ALTI then builds each s_i B t_ij in L1 and measures
 * ‖y_i - z_ij‖₁ against the resultant; GlobEnc needs only the length
 * ‖B t_ij‖₂, a quadratic form of the NH weights P^h_ij in the Gram matrix
 * of source j's NH vectors (j == i, with x_i, is built explicitly). */
typedef struct {
    const lens_model *m;
    lens_cm_method method;
    int paper_code, T;
    const float *BU;     /* [T][BU_LD] B v^h_j W_O^h: source j's NH vectors in a row (bu()) */
    const float *BX;     /* [T][C] B x_i */
    const float *P;      /* head h's [T][T] at P + h * P_stride */
    size_t P_stride;
    const float *Y;      /* [T][C] ALTI's resultant y_i */
    const double *ny;    /* [T] ALTI's ‖y_i‖₁ */
    const double *scale; /* [T] s_i */
    double eps;          /* ALTI: added to z - y (the released code's pairwise_distance) */
    const double *gram;  /* GlobEnc: [T][NH][NH] Gram matrix of B U[.][j] */
    float *scratch;      /* [threads][T][C + NH] */
    float *M;            /* [T][T] out */
} decomp_job;

/* BU's rows: source j's NH vectors side by side, then 16 floats, so that
 * neither the rows nor a source's vectors sit a multiple of 4 KiB apart
 * (NH vectors T * C apart put all of one source's in the same cache sets:
 * ALTI's columns ran at a quarter of their speed). */
static size_t bu_ld(int NH, int C)
{
    return (size_t)NH * C + 16;
}

static const float *bu(const decomp_job *d, int h, int j)
{
    return d->BU + (size_t)j * bu_ld(d->m->cfg.n_heads, d->m->cfg.d_model) + (size_t)h * d->m->cfg.d_model;
}

/* B v in place: the post-norm path's frozen norms with scale 1 (LN1, and
 * GlobEnc's LN2 after it); nothing on a pre-norm block. */
static void apply_b(const lens_model *m, const lens_attn_residual *s, lens_cm_method method, float *v)
{
    if (!s->ln1) return;
    frozen_norm(&m->cfg, s->ln1, v, m->cfg.d_model, 1.0);
    if (method == LENS_CM_GLOBENC) frozen_norm(&m->cfg, s->ln2, v, m->cfg.d_model, 1.0);
}

/* Σ_k |s z_k - y_k + eps| in 8 double lanes (vectorised; one sum would be
 * a chain of C dependent additions). */
static double l1_distance(const float *z, double s, const float *y, double eps, int C)
{
    double acc[8] = {0};
    int k = 0;
    for (; k + 8 <= C; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += fabs(s * z[k + l] - y[k + l] + eps);
    for (; k < C; k++) acc[0] += fabs(s * z[k] - y[k] + eps);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Σ_k a_k b_k in 8 double lanes */
static double dot(const float *a, const float *b, int C)
{
    double acc[8] = {0};
    int k = 0;
    for (; k + 8 <= C; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)a[k + l] * b[k + l];
    for (; k < C; k++) acc[0] += (double)a[k] * b[k];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

enum { ROWS = 4, COLS = 16 }; /* alti_rows' block: z0..z3 name its rows */

/* Σ_t |s z_t - y_t + eps| of COLS columns into 8 double lanes */
static void l1_add(double *acc, const float *z, double s, const float *y, double eps)
{
    for (int t = 0; t < COLS; t++) acc[t % 8] += fabs(s * z[t] - y[t] + eps);
}

/* ALTI, column j, rows i0..i0+n (n <= ROWS), p [NH][ROWS] their weights
 * P^h_ij: z_ij = Σ_h P^h_ij BU[h][j] (+ BX_j at i == j) built COLS columns
 * at a time in registers, the rows sharing each load of source j's NH
 * vectors, and nd_i = ‖y_i - s_i z_ij‖₁ summed in 8 double lanes as the
 * columns go: the rank-NH products' flops bound it, not loads and stores. */
static void alti_rows(const decomp_job *d, int j, int i0, int n, const float *p, double *nd)
{
    const int C = d->m->cfg.d_model, NH = d->m->cfg.n_heads;
    double acc[ROWS][8] = {{0}};
    int k0 = 0;
    for (; k0 + COLS <= C; k0 += COLS) {
        float z0[COLS] = {0}, z1[COLS] = {0}, z2[COLS] = {0}, z3[COLS] = {0};
        for (int h = 0; h < NH; h++) {
            const float *u = bu(d, h, j) + k0, *a = p + h * ROWS;
            for (int t = 0; t < COLS; t++) {
                const float v = u[t];
                z0[t] = fmaf(a[0], v, z0[t]), z1[t] = fmaf(a[1], v, z1[t]);
                z2[t] = fmaf(a[2], v, z2[t]), z3[t] = fmaf(a[3], v, z3[t]);
            }
        }
        float *z[ROWS] = {z0, z1, z2, z3};
        if (j >= i0 && j < i0 + n)
            for (int t = 0; t < COLS; t++) z[j - i0][t] += d->BX[(size_t)j * C + k0 + t];
        for (int r = 0; r < n; r++) l1_add(acc[r], z[r], d->scale[i0 + r], d->Y + (size_t)(i0 + r) * C + k0, d->eps);
    }
    for (int r = 0; r < n; r++) { /* the last C % COLS columns */
        const int i = i0 + r;
        for (int k = k0; k < C; k++) {
            float zk = 0;
            for (int h = 0; h < NH; h++) zk += p[h * ROWS + r] * bu(d, h, j)[k];
            if (i == j) zk += d->BX[(size_t)j * C + k];
            acc[r][0] += fabs(d->scale[i] * zk - d->Y[(size_t)i * C + k] + d->eps);
        }
        nd[r] = ((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3])) + ((acc[r][4] + acc[r][5]) + (acc[r][6] + acc[r][7]));
    }
}

/* ALTI, column j: M_ij = max(0, ‖y_i‖₁ - ‖y_i - s_i z_ij‖₁) for every row i. */
static void alti_column(void *ctx, int j)
{
    const decomp_job *d = ctx;
    const int C = d->m->cfg.d_model, NH = d->m->cfg.n_heads;
    float *p = d->scratch + (size_t)lens_pool_thread_index() * d->T * (C + NH);
    for (int i0 = 0; i0 < d->T; i0 += ROWS) {
        const int n = d->T - i0 < ROWS ? d->T - i0 : ROWS;
        double nd[ROWS];
        for (int h = 0; h < NH; h++) /* p [NH][ROWS]: rows past n weigh 0 */
            for (int r = 0; r < ROWS; r++)
                p[h * ROWS + r] = r < n ? d->P[h * d->P_stride + (size_t)(i0 + r) * d->T + j] : 0.0f;
        alti_rows(d, j, i0, n, p, nd);
        for (int r = 0; r < n; r++) {
            const int i = i0 + r;
            d->M[(size_t)i * d->T + j] = (float)(d->ny[i] - nd[r] > 0 ? d->ny[i] - nd[r] : 0);
        }
    }
}

/* GlobEnc, row i: ‖s_i B t_ij‖₂ = s_i sqrt(pᵀ G_j p) with p = P^._ij for j != i;
 * at j == i (x_i too) the vector is built. */
static void globenc_row(void *ctx, int i)
{
    const decomp_job *d = ctx;
    const int T = d->T, C = d->m->cfg.d_model, NH = d->m->cfg.n_heads;
    for (int j = 0; j < T; j++) {
        double q = 0;
        if (j == i) {
            float *z = d->scratch + (size_t)lens_pool_thread_index() * T * (C + NH);
            memcpy(z, d->BX + (size_t)i * C, sizeof(float) * C);
            for (int h = 0; h < NH; h++) {
                const float w = d->P[h * d->P_stride + (size_t)i * T + i], *u = bu(d, h, i);
                for (int k = 0; k < C; k++) z[k] += w * u[k];
            }
            q = dot(z, z, C);
        } else {
            const double *g = d->gram + (size_t)j * NH * NH;
            float *p = d->scratch + (size_t)lens_pool_thread_index() * T * (C + NH);
            for (int h = 0; h < NH; h++) p[h] = d->P[h * d->P_stride + (size_t)i * T + j];
            for (int h = 0; h < NH; h++) { /* pᵀ G p, G symmetric */
                if (p[h] == 0) continue;
                double gh = 0.5 * g[h * NH + h] * p[h];
                for (int e = 0; e < h; e++) gh += g[h * NH + e] * p[e];
                q += 2 * p[h] * gh;
            }
        }
        d->M[(size_t)i * T + j] = (float)(d->scale[i] * sqrt(q > 0 ? q : 0));
    }
}

/* GlobEnc: G_j[h][e] = <B U[h][j], B U[e][j]>, one task per source j */
static void gram_task(void *ctx, int j)
{
    const decomp_job *d = ctx;
    const int C = d->m->cfg.d_model, NH = d->m->cfg.n_heads;
    double *g = (double *)d->gram + (size_t)j * NH * NH;
    for (int h = 0; h < NH; h++)
        for (int e = 0; e <= h; e++)
            g[h * NH + e] = g[e * NH + h] = dot(bu(d, h, j), bu(d, e, j), C);
}

typedef struct {
    const lens_model *m;
    const lens_attn_residual *s;
    lens_cm_method method;
    float *w, *packed; /* packed NULL: the kernel reads w */
} b_weights_job;

/* Head h's DV rows of W~: W_O's rows k as x W_O reads them, widened, then
 * B on each; packed when the kernel reads panels. */
static void b_weights_head(void *ctx, int h)
{
    const b_weights_job *j = ctx;
    const lens_config *c = &j->m->cfg;
    const int C = c->d_model, DV = c->d_head_v;
    const lens_linear *wo = j->s->out;
    float *w = j->w + (size_t)h * DV * C;
    if (wo->w_in_out) /* Conv1D: [in][out], rows k as they are */
        for (int d = 0; d < DV; d++)
            lens_widen(w + (size_t)d * C, lens_dtype_at(wo->w, wo->dtype, (size_t)(h * DV + d) * wo->ld), wo->dtype,
                       (size_t)C);
    else { /* Linear: [out][in], the head's DV inputs of each stored row n transposed into column n */
        float col[DV];
        for (int n = 0; n < C; n++) {
            lens_widen(col, lens_dtype_at(wo->w, wo->dtype, (size_t)n * wo->ld + (size_t)h * DV), wo->dtype, (size_t)DV);
            for (int d = 0; d < DV; d++) w[(size_t)d * C + n] = col[d];
        }
    }
    for (int d = 0; d < DV; d++) apply_b(j->m, j->s, j->method, w + (size_t)d * C);
    if (j->packed) lens_gemm_pack(j->packed + h * lens_gemm_packed_size(DV, C), w, DV, C, (size_t)C, 1);
}

/* W~ [VO][C] = W_O B, one pool task per head; then BU[h] = V_h W~^h, B
 * applied to VO rows instead of NH * T. Packed per head (lens_gemm_pack)
 * when the GEMM kernel reads packed panels. */
static float *b_weights(const lens_model *m, const lens_attn_residual *s, lens_cm_method method, lens_pool *pool,
                        float **packed)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model, NH = c->n_heads, VO = NH * c->d_head_v;
    b_weights_job j = {.m = m, .s = s, .method = method, .w = malloc(sizeof(float) * (size_t)VO * C)};
    *packed = NULL;
    if (lens_gemm_packs_weights() && j.w) {
        const size_t head = lens_gemm_packed_size(c->d_head_v, C);
        if (!(j.packed = aligned_alloc(64, ((sizeof(float) * head * NH) + 63) & ~(size_t)63))) {
            free(j.w);
            return NULL;
        }
    }
    if (!j.w) return NULL;
    lens_pool_run(pool, NH, b_weights_head, &j);
    *packed = j.packed;
    return j.w;
}

typedef struct {
    const float *V, *P, *W, *packed; /* packed: W~ per head in panels, or NULL */
    size_t P_stride;
    float *BU, *ctx;                 /* ctx [T][VO] NULL: not wanted */
    int T, C, DV, VO;
} head_job;

static void head_gemms(void *ctx, int h)
{
    const head_job *j = ctx;
    const int T = j->T, C = j->C, DV = j->DV, VO = j->VO;
    const lens_gemm_args u = {.M = T, .N = C, .K = DV, .x = j->V + (size_t)h * DV, .ldx = (size_t)VO,
                              .packed = j->packed ? j->packed + h * lens_gemm_packed_size(DV, C) : NULL,
                              .w = j->W + (size_t)h * DV * C, .w_dtype = LENS_DT_F32, .ld = (size_t)C, .w_kn = 1,
                              .alpha = 1.0f, .y = j->BU + (size_t)h * C, .ldy = bu_ld(VO / DV, C)};
    lens_gemm(&u, NULL);
    if (!j->ctx) return;
    const lens_gemm_args g = {.M = T, .N = DV, .K = T, .x = j->P + h * j->P_stride, .ldx = (size_t)T,
                              .w = j->V + (size_t)h * DV, .w_dtype = LENS_DT_F32, .ld = (size_t)VO, .w_kn = 1,
                              .alpha = 1.0f, .y = j->ctx + (size_t)h * DV, .ldy = (size_t)VO};
    lens_gemm(&g, NULL);
}

/* M [T][T] of ALTI / GlobEnc for block l from the kept activations. */
static int decompose(const lens_model *m, const lens_cm_opts *o, const lens_activations *act, int l, float *M,
                     lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int T = act->n_tokens, C = c->d_model, NH = c->n_heads, DV = c->d_head_v, VO = NH * DV;
    lens_attn_residual s;
    const char *why = lens_block_attn_residual(m, l, &s);
    if (why) return lens_fail(err, LENS_EINVAL, "%s", why);
    const int globenc = o->method == LENS_CM_GLOBENC, threads = lens_pool_threads(o->pool);
    /* GlobEnc reads only LN1's scale, kept by the forward; ALTI the resultant y_i itself */
    const int need_y = !globenc || (s.ln1 && s.slot1 < 0);
    float *packed = NULL, *W = b_weights(m, &s, o->method, o->pool, &packed);
    float *BU = malloc(sizeof(float) * (size_t)T * bu_ld(NH, C)), *BX = malloc(sizeof(float) * (size_t)T * C);
    float *Y = need_y ? malloc(sizeof(float) * (size_t)T * C) : NULL;
    float *ctx = need_y ? malloc(sizeof(float) * (size_t)T * VO) : NULL;
    float *scratch = malloc(sizeof(float) * (size_t)threads * T * (C + NH));
    double *scale = malloc(sizeof(double) * T), *ny = malloc(sizeof(double) * T);
    double *gram = globenc ? malloc(sizeof(double) * (size_t)T * NH * NH) : NULL;
    int rc = 0;
    if (!W || !BU || !BX || (need_y && (!Y || !ctx)) || !scratch || !scale || !ny || (globenc && !gram)) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for the per-head value vectors of %d tokens", T);
        goto done;
    }
    /* BU[h] = V_h W~^h: head h's value columns times its DV rows of W~; with y, the context P^h V_h too: one
     * task per head (one pool barrier, not one per GEMM) */
    head_job hj = {.V = lens_act_values(m, act, l + 1, 0), .P = lens_act_attn(m, act, l + 1, 0, 0),
                   .P_stride = act->attn_layer_size, .W = W, .packed = packed, .BU = BU, .ctx = ctx, .T = T, .C = C,
                   .DV = DV, .VO = VO};
    lens_pool_run(o->pool, NH, head_gemms, &hj);
    const float *x = lens_act_hidden(m, act, l, 0), *P = hj.P;
    memcpy(BX, x, sizeof(float) * T * C);
    for (int i = 0; i < T; i++) apply_b(m, &s, o->method, BX + (size_t)i * C);
    if (need_y) { /* the sublayer's output before any norm, y_i = Σ_j t_ij + b_O = x_i + ctx_i W_O + b_O */
        lens_gemm_linear(Y, ctx, s.out, T, o->pool);
        for (size_t e = 0; e < (size_t)T * C; e++) Y[e] += x[e];
    }
    const float *rstd1 = s.ln1 && s.slot1 >= 0 ? act->ln_rstd + (size_t)s.slot1 * T : NULL;
    const float *rstd2 = globenc && s.post_norm ? act->ln_rstd + (size_t)s.slot2 * T : NULL;
    for (int i = 0; i < T; i++) {
        scale[i] = 1;
        if (!s.ln1) continue;
        if (globenc && !need_y) { /* LN1's own 1/sqrt(var + eps), as the forward kept it */
            scale[i] = (double)rstd1[i] * rstd2[i];
            continue;
        }
        /* post-norm: LN(y) = Σ_j g ⊙ (t_ij - mean t_ij) s_i + g ⊙ (b_O - mean b_O) s_i + β */
        float *y = Y + (size_t)i * C;
        double mean = 0, var = 0;
        if (!c->norm_rms) {
            for (int k = 0; k < C; k++) mean += y[k];
            mean /= C;
        }
        for (int k = 0; k < C; k++) var += (y[k] - mean) * (y[k] - mean);
        const double rstd = 1.0 / sqrt(var / C + c->ln_eps);
        /* ALTI's released code divides by torch.std (unbiased, C - 1) of the pre-LN states, its eps added to
         * the states (no effect on a standard deviation); lensd by the LayerNorm's own 1/sqrt(var + eps).
         * GlobEnc's N-Enc adds LN2 frozen on each term (the FFN skipped, LN1's bias dropped). */
        scale[i] = o->method == LENS_CM_ALTI && o->paper_code ? 1.0 / sqrt(var / (C - 1)) : rstd;
        if (globenc) scale[i] *= rstd2[i];
        else { /* ALTI's resultant: LN1 of y with the same frozen statistics, plus β */
            frozen_norm(c, s.ln1, y, C, scale[i]);
            for (int k = 0; k < C; k++) y[k] += s.ln1->b ? s.ln1->b[k] : 0.0f;
        }
    }
    decomp_job d = {.m = m, .method = o->method, .paper_code = o->paper_code, .T = T, .BU = BU, .BX = BX, .P = P,
                    .P_stride = act->attn_layer_size, .Y = Y, .ny = ny, .scale = scale, .gram = gram,
                    .scratch = scratch, .M = M,
                    /* the released code (post-norm encoders) measures F.pairwise_distance(z, y, p=1), which adds
                     * its eps 1e-6 to z - y */
                    .eps = o->method == LENS_CM_ALTI && o->paper_code && s.ln1 ? 1e-6 : 0};
    if (globenc) {
        lens_pool_run(o->pool, T, gram_task, &d);
        lens_pool_run(o->pool, T, globenc_row, &d);
    } else {
        for (int i = 0; i < T; i++) ny[i] = l1_distance(Y + (size_t)i * C, 0, Y + (size_t)i * C, 0, C);
        lens_pool_run(o->pool, T, alti_column, &d);
    }
    /* rows sum to one, except GlobEnc's released code, which rolls out the raw norms */
    for (int i = 0; i < T && !(globenc && o->paper_code); i++) {
        float *row = M + (size_t)i * T;
        double sum = 0;
        for (int j = 0; j < T; j++) sum += row[j];
        if (sum > 0)
            for (int j = 0; j < T; j++) row[j] = (float)(row[j] / sum);
    }
done:
    free(W), free(packed), free(BU), free(BX), free(Y), free(ctx), free(scratch), free(scale), free(ny), free(gram);
    return rc;
}

/* ------------------------------------------------------------ value zeroing */

/* Block buffers for copies of one sequence: copy 0 unchanged, copy 1 + j
 * with token j's value vectors zeroed (all heads, bias included, as the
 * released code zeroes value_layer[:, :, j]). */
typedef struct {
    lens_block_io io;
    int T, NH, DV, C, first; /* first: the chunk's first copy */
    const float *ctx0;    /* [T][NH*DV] P v, the unchanged attention output */
    const float *P;       /* head h's [T][T] at P + h * P_stride */
    size_t P_stride;
    const float *V;       /* [T][NH*DV] */
    /* after W_O (lens_block_attn_out): */
    const float *out0;    /* [T][C] the unchanged attention output ctx0 W_O + b_O */
    const float *U;       /* [T][NH][C] v^h_j W_O^h: source j's rows, copy j's output out0 - P^h_ij U[j][h] */
    float *out;           /* the register the copies' outputs go in */
} vz_buffers;

/* ctx of copy 1 + j = ctx0 - P^h_ij v^h_j: the probabilities do not read the values. */
static void vz_attend(lens_block_io *io, int l)
{
    (void)l;
    const vz_buffers *z = io->attend_ctx;
    const int T = z->T, DV = z->DV, VO = z->NH * z->DV;
    for (int c = 0; c < io->N / T; c++) {
        float *ctx = io->ctx + (size_t)c * T * VO;
        memcpy(ctx, z->ctx0, sizeof(float) * T * VO);
        const int j = z->first + c - 1;
        if (j < 0) continue;
        for (int h = 0; h < z->NH; h++)
            for (int i = 0; i < T; i++) {
                const float a = z->P[h * z->P_stride + (size_t)i * T + j];
                if (a == 0.0f) continue;
                float *out = ctx + (size_t)i * VO + h * DV;
                const float *v = z->V + (size_t)j * VO + h * DV;
                for (int d = 0; d < DV; d++) out[d] -= a * v[d];
            }
    }
}

/* copy c of the chunk's attention output: out0 less token j's rank-NH part */
static void vz_out(void *ctx, int c)
{
    const vz_buffers *z = ctx;
    const int T = z->T, NH = z->NH, C = z->C, j = z->first + c - 1;
    float *out = z->out + (size_t)c * T * C;
    memcpy(out, z->out0, sizeof(float) * T * C);
    for (int i = 0; j >= 0 && i < T; i++)
        for (int h = 0; h < NH; h++) {
            const float a = z->P[h * z->P_stride + (size_t)i * T + j], *u = z->U + ((size_t)j * NH + h) * C;
            if (a == 0.0f) continue;
            for (int k = 0; k < C; k++) out[(size_t)i * C + k] -= a * u[k];
        }
}

/* U [T][NH][C]: head h's values through its DV rows of W_O (as x W_O reads them), one GEMM per head. */
static void vz_values_out(const lens_model *m, const lens_linear *wo, const float *V, int T, float *U, lens_pool *pool)
{
    const int C = m->cfg.d_model, NH = m->cfg.n_heads, DV = m->cfg.d_head_v;
    for (int h = 0; h < NH; h++) {
        const size_t at = wo->w_in_out ? (size_t)h * DV * wo->ld : (size_t)h * DV;
        const lens_gemm_args g = {.M = T, .N = C, .K = DV, .x = V + (size_t)h * DV, .ldx = (size_t)NH * DV,
                                  .w = lens_dtype_at(wo->w, wo->dtype, at), .w_dtype = wo->dtype, .ld = (size_t)wo->ld,
                                  .w_kn = wo->w_in_out, .alpha = 1.0f, .y = U + (size_t)h * C, .ldy = (size_t)NH * C};
        lens_gemm(&g, pool);
    }
}

static void vz_free(vz_buffers *z)
{
    lens_block_io *io = &z->io;
    free(io->x), free(io->h), free(io->n), free(io->q), free(io->k), free(io->v), free(io->ctx), free(io->ff);
    free((int *)io->pos);
    free((float *)z->ctx0), free((float *)z->U), free((float *)z->out0);
}

/* 1 - cos(a, b); a zero vector is at distance 1 (sklearn's cosine_distances). */
static double cosine_distance(const float *a, const float *b, int C)
{
    const double ab = dot(a, b, C), aa = dot(a, a, C), bb = dot(b, b, C);
    return aa > 0 && bb > 0 ? 1.0 - ab / sqrt(aa * bb) : 1.0;
}

/* M [T][T]: M[i][j] = cosine distance between block l's output at i with and
 * without token j's values, rows normalised to sum to one. */
static int value_zeroing(const lens_model *m, const lens_cm_opts *o, const lens_activations *act, int l, float *M,
                         lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int T = act->n_tokens, C = c->d_model, NH = c->n_heads, DV = c->d_head_v, VO = NH * DV;
    const int QK = NH * c->d_head_k, FF = lens_ff_cols(m);
    const size_t per_row = (size_t)3 * C + 2 * QK + 2 * VO + FF + 1;
    /* Chunks of 32 MiB of rows (or the request's bound when smaller): measured on BERT-base at T = 128 (AMD
     * EPYC Zen 4, 2 threads), value zeroing took 11.5 s in chunks of 32 MiB, 12.2 s of 16 and 13.4 s of 256,
     * whose buffers fall out of the caches between the block's ops. */
    const size_t chunk = (size_t)32 << 20;
    const size_t budget = o->max_scratch_bytes && o->max_scratch_bytes < chunk ? o->max_scratch_bytes : chunk;
    int copies = (int)(budget / (per_row * sizeof(float) * T));
    if (copies < 1) copies = 1;
    if (copies > T + 1) copies = T + 1;
    const size_t R = (size_t)copies * T;
    vz_buffers z = {.T = T, .NH = NH, .DV = DV, .C = C, .P = lens_act_attn(m, act, l + 1, 0, 0),
                    .P_stride = act->attn_layer_size, .V = lens_act_values(m, act, l + 1, 0)};
    lens_block_io *io = &z.io;
    io->x = malloc(sizeof(float) * R * C), io->h = malloc(sizeof(float) * R * C), io->n = malloc(sizeof(float) * R * C);
    io->q = malloc(sizeof(float) * R * QK), io->k = malloc(sizeof(float) * R * QK);
    io->v = malloc(sizeof(float) * R * VO), io->ctx = malloc(sizeof(float) * R * VO);
    io->ff = malloc(sizeof(float) * R * FF);
    int *pos = malloc(sizeof(int) * R);
    float *ctx0 = calloc((size_t)T * VO, sizeof(float)), *ref = malloc(sizeof(float) * (size_t)T * C);
    /* each copy from after W_O when the block allows it: W_O once for the values, not per copy */
    const lens_linear *wo = NULL;
    const int out_reg = lens_block_attn_out(m, l, &wo);
    float *U = out_reg >= 0 ? malloc(sizeof(float) * (size_t)T * NH * C) : NULL;
    float *out0 = out_reg >= 0 ? malloc(sizeof(float) * (size_t)T * C) : NULL;
    io->pos = pos, z.ctx0 = ctx0, z.U = U, z.out0 = out0;
    if (!io->x || !io->h || !io->n || !io->q || !io->k || !io->v || !io->ctx || !io->ff || !pos || !ctx0 || !ref ||
        (out_reg >= 0 && (!U || !out0))) {
        vz_free(&z), free(ref);
        return lens_fail(err, LENS_ENOMEM, "out of memory for %d copies of %d tokens", copies, T);
    }
    for (size_t r = 0; r < R; r++) pos[r] = (int)(r % (size_t)T);
    for (int h = 0; h < NH; h++) /* ctx0_h = P^h v_h */
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                const float a = z.P[h * z.P_stride + (size_t)i * T + j];
                if (a == 0.0f) continue;
                for (int d = 0; d < DV; d++) ctx0[(size_t)i * VO + h * DV + d] += a * z.V[(size_t)j * VO + h * DV + d];
            }
    if (out_reg >= 0) {
        vz_values_out(m, wo, z.V, T, U, o->pool);
        lens_gemm_linear(out0, ctx0, wo, T, o->pool);
    }
    io->pool = o->pool, io->attend = vz_attend, io->attend_ctx = &z, io->jvp_row = -1;
    const float *x = lens_act_hidden(m, act, l, 0);
    int rc = 0;
    for (z.first = 0; z.first < T + 1; z.first += copies) {
        if (lens_cancelled(o->cancel)) {
            rc = lens_fail(err, LENS_ECANCEL, "cancelled in value zeroing of layer %d", l + 1);
            break;
        }
        const int n = T + 1 - z.first < copies ? T + 1 - z.first : copies;
        for (int k = 0; k < n; k++) memcpy(io->x + (size_t)k * T * C, x, sizeof(float) * T * C);
        io->N = n * T;
        if (out_reg >= 0) {
            z.out = lens_block_register(io, out_reg);
            lens_pool_run(o->pool, n, vz_out, &z);
            lens_block_forward_after_attn_out(m, io, l);
        } else {
            lens_block_forward_from_attend(m, io, l); /* q, k, v unread: vz_attend makes ctx from ctx0 */
        }
        for (int k = 0; k < n; k++) {
            const float *out = io->x + (size_t)k * T * C;
            const int j = z.first + k - 1;
            if (j < 0) {
                memcpy(ref, out, sizeof(float) * T * C);
                continue;
            }
            for (int i = 0; i < T; i++)
                M[(size_t)i * T + j] = (float)cosine_distance(out + (size_t)i * C, ref + (size_t)i * C, C);
        }
    }
    for (int i = 0; i < T && !rc; i++) { /* score_matrix / np.sum(score_matrix, axis=-1) */
        double sum = 0;
        for (int j = 0; j < T; j++) sum += M[(size_t)i * T + j];
        if (sum > 0)
            for (int j = 0; j < T; j++) M[(size_t)i * T + j] = (float)(M[(size_t)i * T + j] / sum);
    }
    vz_free(&z), free(ref);
    return rc;
}

/* ------------------------------------------------------------ rollout */

/* M [T][T] = (mean_h P^h + I) / rowsum: compute_joint_attention's augmented matrix. */
static void rollout_layer(const lens_model *m, const lens_activations *act, int l, float *M)
{
    const int T = act->n_tokens, NH = m->cfg.n_heads;
    const float *P = lens_act_attn(m, act, l + 1, 0, 0);
    for (int i = 0; i < T; i++) {
        double sum = 0;
        for (int j = 0; j < T; j++) {
            double a = 0;
            for (int h = 0; h < NH; h++) a += P[h * act->attn_layer_size + (size_t)i * T + j];
            a = a / NH + (i == j);
            M[(size_t)i * T + j] = (float)a;
            sum += a;
        }
        for (int j = 0; j < T; j++) M[(size_t)i * T + j] = (float)(M[(size_t)i * T + j] / sum);
    }
}

/* joint [T][T] = M joint (joint_attentions[i] = aug[i].dot(joint_attentions[i - 1])), in double. */
static int roll(float *joint, const float *M, int T)
{
    double *acc = calloc((size_t)T * T, sizeof(double));
    if (!acc) return -1;
    for (int i = 0; i < T; i++) /* row i = Σ_k M_ik joint_k: rows of joint, vectorised */
        for (int k = 0; k < T; k++) {
            const double a = M[(size_t)i * T + k];
            if (a == 0) continue;
            for (int j = 0; j < T; j++) acc[(size_t)i * T + j] += a * joint[(size_t)k * T + j];
        }
    for (size_t n = 0; n < (size_t)T * T; n++) joint[n] = (float)acc[n];
    free(acc);
    return 0;
}

/* ------------------------------------------------------------ driver */

void lens_cm_result_free(lens_cm_result *r)
{
    free(r->layers), free(r->contrib), free(r->rollout), free(r->classifier);
    memset(r, 0, sizeof *r);
}

int lens_context_mixing(const lens_model *m, const int *ids, const int *type_ids, int T, const lens_cm_opts *o,
                        lens_cm_result *out, lens_err *err)
{
    const int L = m->cfg.n_layers;
    memset(out, 0, sizeof *out);
    if ((unsigned)o->method >= LENS_CM_COUNT) return lens_fail(err, LENS_EINVAL, "unknown context-mixing method");
    const char *why = lens_cm_undefined(m, o->method);
    if (why) return lens_fail(err, LENS_EINVAL, "%s is undefined for this model: %s", lens_cm_method_name(o->method), why);
    const int n = o->layers ? o->n_layers : L;
    for (int k = 0; k < n; k++)
        if (o->layers && (o->layers[k] < 1 || o->layers[k] > L || (k && o->layers[k] <= o->layers[k - 1])))
            return lens_fail(err, LENS_EINVAL, "layers must be ascending within 1..%d", L);
    if (n < 1) return lens_fail(err, LENS_EINVAL, "no layers asked for");
    const int top = o->layers ? o->layers[n - 1] : L;
    const size_t TT = (size_t)T * T;
    out->T = T, out->n_layers = n;
    out->layers = malloc(sizeof(int) * n);
    out->contrib = malloc(sizeof(float) * n * TT);
    out->rollout = malloc(sizeof(float) * n * TT);
    float *M = malloc(sizeof(float) * TT), *joint = malloc(sizeof(float) * TT);
    lens_activations act = {0};
    lens_decompx *dx = NULL;
    int rc = 0;
    if (o->method == LENS_CM_DECOMPX && !(dx = lens_decompx_new(m, T, o->max_scratch_bytes, err))) {
        rc = -1;
        goto done;
    }
    if (!out->layers || !out->contrib || !out->rollout || !M || !joint) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for %d layers of %d x %d matrices", n, T, T);
        goto done;
    }
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids, .type_ids = type_ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_LN,
                                  .cancel = o->cancel, .pool = o->pool};
    if ((rc = lens_forward(m, &b, &fo, &act, err))) goto done;
    for (int l = 0, k = 0; l < top && !rc; l++) {
        if (lens_cancelled(o->cancel)) {
            rc = lens_fail(err, LENS_ECANCEL, "cancelled at layer %d of %d", l + 1, top);
            break;
        }
        const int asked = k < n && (o->layers ? o->layers[k] : k + 1) == l + 1;
        switch (o->method) {
        case LENS_CM_ROLLOUT: rollout_layer(m, &act, l, M); break;
        case LENS_CM_VALUE_ZEROING: rc = value_zeroing(m, o, &act, l, M, err); break;
        case LENS_CM_DECOMPX: /* its own matrix only for the layers asked (the other pass runs for the rollout) */
            rc = lens_decompx_layer(dx, m, &act, l, o->paper_code, o->pool, o->cancel, asked ? M : NULL, joint, err);
            break;
        default: rc = decompose(m, o, &act, l, M, err);
        }
        if (rc) break;
        if (dx) {} /* joint: the norms of the vectors DecompX propagates, not a product */
        else if (l == 0) memcpy(joint, M, sizeof(float) * TT);
        else if (roll(joint, M, T)) rc = lens_fail(err, LENS_ENOMEM, "out of memory for the rollout");
        if (!rc && asked) {
            out->layers[k] = l + 1;
            memcpy(out->contrib + k * TT, M, sizeof(float) * TT);
            memcpy(out->rollout + k * TT, joint, sizeof(float) * TT);
            k++;
        }
    }
    if (!rc && dx && top == L) { /* per-token, per-class contributions of a classifier */
        out->classifier = malloc(sizeof(float) * T * (m->cfg.n_labels > 0 ? m->cfg.n_labels : 1));
        if (!out->classifier) rc = lens_fail(err, LENS_ENOMEM, "out of memory for DecompX's classifier");
        else if ((rc = lens_decompx_classifier(dx, m, &act, o->paper_code, o->pool, out->classifier, err)) == 1)
            free(out->classifier), out->classifier = NULL, rc = 0;
        else if (!rc) out->n_classes = m->cfg.n_labels;
    }
done:
    lens_activations_free(&act);
    lens_decompx_free(dx);
    free(M), free(joint);
    if (rc) lens_cm_result_free(out);
    return rc;
}
