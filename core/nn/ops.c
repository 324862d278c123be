/* ops.c - forward operations and their backward passes (see ops.h for shapes).
 * Each backward quotes the forward line it inverts. */
#include "core/nn/ops.h"

#include "core/base/gemm.h"
#include "core/base/pool.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

void lens_linear_forward(float *out, const float *inp, const lens_linear *lin, int N)
{
    /* Linear: out = inp W^T with W [OC][IC]; Conv1D: out = inp W with W [IC][OC];
     * single-threaded here, forward.c passes its pool to lens_gemm_linear */
    lens_gemm_linear(out, inp, lin, N, NULL);
}

void lens_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const lens_linear *lin, int N)
{
    /* forward: out[N][OC] = inp[N][IC] W (+ b) */
    if (dinp && lin->dtype != LENS_DT_F32) /* BF16/F16 W: the GEMM widens it while packing */
        lens_gemm_linear_backward(dinp, dout, lin, N, 1, NULL);
    else if (dinp) /* dinp += dout W, W as [OC][IC] (Linear) or dout W^T, W [IC][OC] (Conv1D) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, lin->w_in_out ? CblasTrans : CblasNoTrans, N, lin->in,
                    lin->out, 1.0f, dout, lin->out, lin->w, lin->ld, 1.0f, dinp, lin->in);
    if (dweight) {
        if (lin->w_in_out) /* dW[IC][OC] += inp^T dout */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, lin->in, lin->out, N, 1.0f, inp, lin->in,
                        dout, lin->out, 1.0f, dweight, lin->ld);
        else /* dW[OC][IC] += dout^T inp */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, lin->out, lin->in, N, 1.0f, dout, lin->out,
                        inp, lin->in, 1.0f, dweight, lin->ld);
    }
    if (dbias) /* out[n] = ... + b: db += sum over rows of dout */
        for (int n = 0; n < N; n++)
            for (int o = 0; o < lin->out; o++) dbias[o] += dout[(size_t)n * lin->out + o];
}

void lens_linear_jvp(float *dout, const float *dinp, const lens_linear *lin, int N, lens_pool *pool)
{
    /* forward: out = inp W + b, linear in inp except b */
    lens_linear nobias = *lin;
    nobias.b = NULL;
    lens_gemm_linear(dout, dinp, &nobias, N, pool);
}

/* sum_i (x[i] - shift)^p for p = 1 or 2, in double over 8 independent lanes
 * (a single double accumulator cannot vectorise: C forbids reassociating it,
 * and the scalar chain was 2% of a BERT-base forward). */
static double sum_pow_lanes(const float *x, int n, double shift, int p)
{
    double lane[8] = {0}, sum = 0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            const double d = x[i + k] - shift;
            lane[k] += p == 2 ? d * d : d;
        }
    for (int k = 0; k < 8; k++) sum += lane[k];
    for (; i < n; i++) sum += p == 2 ? (x[i] - shift) * (x[i] - shift) : x[i] - shift;
    return sum;
}

void lens_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const lens_layernorm *ln, int N, int C, float eps)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        /* two passes in double: PyTorch's LayerNorm uses a numerically
         * careful (Welford) variance; a one-pass float sum would not match */
        const double m = sum_pow_lanes(x, C, 0.0, 1) / C, var = sum_pow_lanes(x, C, m, 2);
        float s = (float)(1.0 / sqrt(var / C + eps));
        float mf = (float)m;
        if (ln->b)
            for (int i = 0; i < C; i++) y[i] = (x[i] - mf) * s * ln->w[i] + ln->b[i];
        else /* no bias (ModernBERT's norm_bias false) */
            for (int i = 0; i < C; i++) y[i] = (x[i] - mf) * s * ln->w[i];
        if (mean) mean[n] = mf;
        if (rstd) rstd[n] = s;
    }
}

void lens_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *mean, const float *rstd,
                             const lens_layernorm *ln, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        const float m = mean[n], s = rstd[n];
        /* forward: y[i] = (x[i] - mean) * rstd * w[i] + b[i]; with
         * norm = (x - mean) rstd and dnorm = dy w:
         * dx = rstd (dnorm - mean_i(dnorm) - norm mean_i(dnorm norm)) */
        double dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; i++) {
            const double norm = (x[i] - m) * s, dnorm = (double)dy[i] * ln->w[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            const float norm = (x[i] - m) * s, dnorm = dy[i] * ln->w[i];
            dx[i] += s * (dnorm - (float)dnorm_mean - norm * (float)dnorm_norm_mean);
            if (dweight) dweight[i] += norm * dy[i];
            if (dbias) dbias[i] += dy[i];
        }
    }
}

void lens_layernorm_jvp(float *dy, const float *dx, const float *inp, const float *mean, const float *rstd,
                        const lens_layernorm *ln, int B, int T, int C, float *xhat_scratch)
{
    for (int t = 0; t < T; t++) {
        float *xh = xhat_scratch;
        for (int i = 0; i < C; i++) xh[i] = (inp[(size_t)t * C + i] - mean[t]) * rstd[t];
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

/* erf(x) as a [-4, 4] minimax rational x P(x^2) / Q(x^2) (|error| <= 4e-7;
 * outside the range erf is +-1 in float). Unlike libm's erff it has no branch
 * or call, so the GELU loop vectorises: libm made GELU 15% of a BERT pass. */
static inline float erf_approx(float a)
{
    const float x = a < -4.0f ? -4.0f : a > 4.0f ? 4.0f : a, x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return x * p / q;
}


void lens_gelu_forward(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erf_approx(x[i] * (float)M_SQRT1_2));
}

/* gelu_tanh(x) = 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3), is
 * x sigma(2u) with sigma(z) = 1 / (1 + e^-z): one lens_exp_approx instead of
 * libm's tanhf, so the loops vectorise (same value to float rounding). */
static inline float sigmoid_2u(float x)
{
    const float s = 0.7978845608028654f; /* sqrt(2/pi) */
    return 1.0f / (1.0f + lens_exp_approx(-2.0f * s * (x + 0.044715f * x * x * x)));
}

void lens_gelu_tanh_forward(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] *= sigmoid_2u(x[i]);
}

/* forward: gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2));
 * gelu'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi) */
static inline float gelu_grad(float x)
{
    const float cdf = 0.5f * (1.0f + erf_approx(x * (float)M_SQRT1_2));
    const float pdf = 0.3989422804014327f * lens_exp_approx(-0.5f * x * x);
    return cdf + x * pdf;
}

/* forward: gelu(x) = 0.5 x (1 + tanh(u)) = x sigma(2u), u = s (x + 0.044715 x^3);
 * gelu'(x) = sigma(2u) + x 2 sigma(2u) (1 - sigma(2u)) s (1 + 3 * 0.044715 x^2)
 * (the same as 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u') */
static inline float gelu_tanh_grad(float x)
{
    const float s = 0.7978845608028654f, g = sigmoid_2u(x);
    return g + 2.0f * x * g * (1.0f - g) * s * (1.0f + 3.0f * 0.044715f * x * x);
}

void lens_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) dinp[i] += gelu_grad(inp[i]) * dout[i];
}

void lens_gelu_tanh_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) dinp[i] += gelu_tanh_grad(inp[i]) * dout[i];
}

void lens_gelu_backward_inplace(float *d, const float *inp, size_t n, int tanh_approx)
{
    if (tanh_approx)
        for (size_t i = 0; i < n; i++) d[i] *= gelu_tanh_grad(inp[i]);
    else
        for (size_t i = 0; i < n; i++) d[i] *= gelu_grad(inp[i]);
}

void lens_gelu_jvp(float *d, const float *inp, int B, size_t n, int tanh_approx)
{
    for (int b = 0; b < B; b++) lens_gelu_backward_inplace(d + (size_t)b * n, inp, n, tanh_approx);
}

void lens_relu_forward(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void lens_relu_backward(float *dinp, const float *out, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) dinp[i] += out[i] > 0.0f ? dout[i] : 0.0f;
}

void lens_tanh_forward(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = tanhf(x[i]);
}

void lens_tanh_backward(float *dinp, const float *out, const float *dout, size_t n)
{
    /* forward: x[i] = tanhf(x[i]); tanh' = 1 - tanh^2 */
    for (size_t i = 0; i < n; i++) dinp[i] += (1.0f - out[i] * out[i]) * dout[i];
}

void lens_residual_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] += inp[i];
}

void lens_residual_backward(float *dinp, const float *dout, size_t n)
{
    /* forward: out[i] += inp[i] */
    for (size_t i = 0; i < n; i++) dinp[i] += dout[i];
}

/* Reductions over 16 independent lanes: C forbids reassociating a float sum,
 * so a plain loop stays scalar; with explicit lanes the compiler vectorises. */
#define LANES 16

static float max_lanes(const float *x, int n)
{
    float lane[LANES], max = x[0];
    int i = 0;
    if (n >= LANES) {
        for (int k = 0; k < LANES; k++) lane[k] = x[k];
        for (i = LANES; i + LANES <= n; i += LANES)
            for (int k = 0; k < LANES; k++) lane[k] = x[i + k] > lane[k] ? x[i + k] : lane[k];
        for (int k = 0; k < LANES; k++) max = lane[k] > max ? lane[k] : max;
    }
    for (; i < n; i++) max = x[i] > max ? x[i] : max;
    return max;
}

static float sum_lanes(const float *x, int n)
{
    float lane[LANES] = {0}, sum = 0;
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) lane[k] += x[i + k];
    for (int k = 0; k < LANES; k++) sum += lane[k];
    for (; i < n; i++) sum += x[i];
    return sum;
}

void lens_softmax_forward(float *x, int rows, int cols, int causal)
{
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * cols;
        const int valid = causal ? r + 1 : cols;
        const float max = max_lanes(row, valid);
        for (int c = 0; c < valid; c++) row[c] = lens_exp_approx(row[c] - max);
        const float inv = 1.0f / sum_lanes(row, valid);
        for (int c = 0; c < valid; c++) row[c] *= inv;
        for (int c = valid; c < cols; c++) row[c] = 0.0f;
    }
}

void lens_softmax_backward(float *dinp, const float *probs, const float *dout, int rows, int cols,
                           int causal)
{
    for (int r = 0; r < rows; r++) {
        const float *p = probs + (size_t)r * cols, *dp = dout + (size_t)r * cols;
        float *dx = dinp + (size_t)r * cols;
        const int valid = causal ? r + 1 : cols;
        /* forward: row[c] = exp(x[c] - max) / sum; dx[c] = p[c] (dp[c] - sum_c' p[c'] dp[c']) */
        float dot = 0;
        for (int c = 0; c < valid; c++) dot += p[c] * dp[c];
        for (int c = 0; c < valid; c++) dx[c] += p[c] * (dp[c] - dot);
    }
}

void lens_attention_forward(float *out, float *probs, size_t probs_stride, const float *q,
                            const float *k, const float *v, int T, int NH, int DK, int DV, const lens_score_fn *f)
{
    const int qk_stride = NH * DK, v_stride = NH * DV;
    for (int h = 0; h < NH; h++) {
        float *p = probs + h * probs_stride;
        /* scores[T][T] = scale q_h k_h^T: W = k_h^T, k_h rows are W's columns */
        const lens_gemm_args scores = {.M = T, .N = T, .K = DK, .x = q + h * DK, .ldx = qk_stride,
                                       .w = k + h * DK, .ld = qk_stride, .w_kn = 0, .alpha = f->scale,
                                       .y = p, .ldy = T};
        lens_gemm(&scores, NULL);
        lens_scores_forward(p, T, f, h);
        /* out_h[T][DV] = P v_h */
        const lens_gemm_args context = {.M = T, .N = DV, .K = T, .x = p, .ldx = T, .w = v + h * DV,
                                        .ld = v_stride, .w_kn = 1, .alpha = 1.0f, .y = out + h * DV,
                                        .ldy = v_stride};
        lens_gemm(&context, NULL);
    }
}

void lens_attention_backward(float *dq, float *dk, float *dv, float *dprobs, size_t dprobs_stride,
                             float *dscores, const float *dout, const float *q, const float *k,
                             const float *v, const float *probs, size_t probs_stride, int T, int NH,
                             int DK, int DV, const lens_score_fn *f)
{
    const int qk_stride = NH * DK, v_stride = NH * DV;
    for (int h = 0; h < NH; h++) {
        const float *p = probs + h * probs_stride;
        float *dp = dprobs + h * dprobs_stride;
        /* forward: out_h = P v_h  =>  dP = dout_h v_h^T, dv_h += P^T dout_h */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DV, 1.0f, dout + h * DV, v_stride,
                    v + h * DV, v_stride, 0.0f, dp, T);
        if (dv)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, DV, T, 1.0f, p, T, dout + h * DV, v_stride,
                        1.0f, dv + h * DV, v_stride);
        if (!dq && !dk) continue;
        /* forward: P = softmax(softcap(scores)) (the soft-cap's chain rule reads the capped scores) */
        if (f->softcap > 0) lens_scores_capped(dscores, q + h * DK, k + h * DK, (size_t)qk_stride, T, DK, f);
        lens_scores_backward(dscores, p, dp, T, f);
        /* forward: scores = scale q_h k_h^T */
        if (dq)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DK, T, f->scale, dscores, T, k + h * DK,
                        qk_stride, 1.0f, dq + h * DK, qk_stride);
        if (dk)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, DK, T, f->scale, dscores, T, q + h * DK,
                        qk_stride, 1.0f, dk + h * DK, qk_stride);
    }
}

void lens_attention_jvp(float *dout, const float *dq, const float *dk, const float *dv, const float *q,
                        const float *k, const float *v, const float *probs, size_t probs_stride, int B, int T,
                        int NH, int DK, int DV, const lens_score_fn *f, float *dS)
{
    const int QK = NH * DK, VO = NH * DV;
    float *g = dS + (size_t)T * T; /* the soft-cap's derivative, once per head */
    for (int h = 0; h < NH; h++) {
        const float *P = probs + h * probs_stride;
        if (f->softcap > 0) {
            lens_scores_capped(g, q + h * DK, k + h * DK, (size_t)QK, T, DK, f);
            lens_scores_capgrad(g, T, f);
        }
        for (int b = 0; b < B; b++) {
            const size_t rq = (size_t)b * T * QK + (size_t)h * DK, rv = (size_t)b * T * VO + (size_t)h * DV;
            /* forward: scores = scale q_h k_h^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DK, f->scale, dq + rq, QK, k + h * DK, QK,
                        0.0f, dS, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DK, f->scale, q + h * DK, QK, dk + rq, QK,
                        1.0f, dS, T);
            /* forward: P = softmax(softcap(scores)) */
            lens_scores_jvp(dS, P, g, T, f);
            /* forward: out_h = P v_h */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, dS, T, v + h * DV, VO, 0.0f,
                        dout + rv, VO);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, P, T, dv + rv, VO, 1.0f, dout + rv,
                        VO);
        }
    }
}

/* ---------------------------------------------------------- row-parallel ops */

/* Row ranges for elementwise work: a few per thread, each at least 8 rows. */
static int row_tasks(lens_pool *pool, int rows)
{
    int n = 2 * lens_pool_threads(pool);
    if (n > rows / 8) n = rows / 8;
    return n > 1 ? n : 1;
}

static void task_rows(int task, int n_tasks, int rows, int *r0, int *r1)
{
    *r0 = (int)((long)rows * task / n_tasks);
    *r1 = (int)((long)rows * (task + 1) / n_tasks);
}

typedef struct {
    float *out, *mean, *rstd;
    size_t ld;                   /* gelu: row stride of out */
    const float *dout, *cmean, *crstd; /* backward: gradient in, the forward's statistics */
    const float *inp, *residual; /* residual may be NULL */
    float *residual_out;         /* when set, inp + residual is also stored here (GPT-2 stream) */
    const float *up;             /* glu: the up map's rows (out holds the gate's) */
    const lens_layernorm *ln;
    int N, C, n_tasks, gelu_tanh, glu;
    float eps;
} rows_job;

/* out = LN(inp + residual) on rows r0..r1 (inp += residual first, in place,
 * as the unfused code did: out may alias inp). */
static void add_layernorm_task(void *ctx, int task)
{
    const rows_job *j = ctx;
    int r0, r1;
    task_rows(task, j->n_tasks, j->N, &r0, &r1);
    const size_t off = (size_t)r0 * j->C, n = (size_t)(r1 - r0) * j->C;
    float *inp = (float *)j->inp + off;
    if (j->residual) lens_residual_forward(inp, j->residual + off, n);
    lens_layernorm_forward(j->out + off, j->mean ? j->mean + r0 : NULL, j->rstd ? j->rstd + r0 : NULL, inp, j->ln,
                           r1 - r0, j->C, j->eps);
}

/* x += h then out = LN(x): the GPT-2 residual stream and the next pre-LN. */
static void residual_layernorm_task(void *ctx, int task)
{
    const rows_job *j = ctx;
    int r0, r1;
    task_rows(task, j->n_tasks, j->N, &r0, &r1);
    const size_t off = (size_t)r0 * j->C, n = (size_t)(r1 - r0) * j->C;
    lens_residual_forward(j->residual_out + off, j->inp + off, n);
    if (j->ln)
        lens_layernorm_forward(j->out + off, j->mean ? j->mean + r0 : NULL, j->rstd ? j->rstd + r0 : NULL,
                               j->residual_out + off, j->ln, r1 - r0, j->C, j->eps);
}

static void gelu_task(void *ctx, int task)
{
    const rows_job *j = ctx;
    int r0, r1;
    task_rows(task, j->n_tasks, j->N, &r0, &r1);
    for (int r = r0; r < r1; r++)
        (j->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward)(j->out + (size_t)r * j->ld, (size_t)j->C);
}

static void glu_task(void *ctx, int task)
{
    const rows_job *j = ctx;
    int r0, r1;
    task_rows(task, j->n_tasks, j->N, &r0, &r1);
    const size_t off = (size_t)r0 * j->ld;
    lens_glu_forward(j->out + off, j->out + off, j->up + off, r1 - r0, j->C, j->ld, (lens_glu)j->glu);
}

void lens_add_layernorm(lens_pool *pool, float *out, float *mean, float *rstd, float *inp, const float *residual,
                          const lens_layernorm *ln, int N, int C, float eps)
{
    rows_job j = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .residual = residual, .ln = ln, .N = N,
                  .C = C, .eps = eps, .n_tasks = row_tasks(pool, N)};
    lens_pool_run(pool, j.n_tasks, add_layernorm_task, &j);
}

void lens_residual_layernorm(lens_pool *pool, float *x, const float *h, float *out, float *mean, float *rstd,
                               const lens_layernorm *ln, int N, int C, float eps)
{
    rows_job j = {.out = out, .mean = mean, .rstd = rstd, .inp = h, .residual_out = x, .ln = ln, .N = N, .C = C,
                  .eps = eps, .n_tasks = row_tasks(pool, N)};
    lens_pool_run(pool, j.n_tasks, residual_layernorm_task, &j);
}

void lens_gelu_rows(lens_pool *pool, float *x, size_t ld, int N, int C, int tanh_approx)
{
    rows_job j = {.out = x, .ld = ld, .N = N, .C = C, .gelu_tanh = tanh_approx, .n_tasks = row_tasks(pool, N)};
    lens_pool_run(pool, j.n_tasks, gelu_task, &j);
}

void lens_glu_rows(lens_pool *pool, float *gate, const float *up, size_t ld, int N, int F, lens_glu act)
{
    rows_job j = {.out = gate, .up = up, .ld = ld, .N = N, .C = F, .glu = (int)act, .n_tasks = row_tasks(pool, N)};
    lens_pool_run(pool, j.n_tasks, glu_task, &j);
}

/* dinp += LN backward of dout on rows r0..r1 */
static void layernorm_backward_task(void *ctx, int task)
{
    const rows_job *j = ctx;
    int r0, r1;
    task_rows(task, j->n_tasks, j->N, &r0, &r1);
    const size_t off = (size_t)r0 * j->C;
    lens_layernorm_backward(j->out + off, NULL, NULL, j->dout + off, j->inp + off, j->cmean + r0, j->crstd + r0, j->ln,
                            r1 - r0, j->C);
}

void lens_layernorm_backward_rows(lens_pool *pool, float *dinp, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, const lens_layernorm *ln, int N, int C)
{
    rows_job j = {.out = dinp, .dout = dout, .inp = inp, .cmean = mean, .crstd = rstd, .ln = ln, .N = N, .C = C,
                  .n_tasks = row_tasks(pool, N)};
    lens_pool_run(pool, j.n_tasks, layernorm_backward_task, &j);
}

static void gelu_backward_task(void *ctx, int task)
{
    const rows_job *j = ctx;
    int r0, r1;
    task_rows(task, j->n_tasks, j->N, &r0, &r1);
    for (int r = r0; r < r1; r++)
        lens_gelu_backward_inplace(j->out + (size_t)r * j->ld, j->inp + (size_t)r * j->ld, (size_t)j->C, j->gelu_tanh);
}

void lens_gelu_backward_rows(lens_pool *pool, float *d, const float *inp, size_t ld, int N, int C, int tanh_approx)
{
    rows_job j = {.out = d, .inp = inp, .ld = ld, .N = N, .C = C, .gelu_tanh = tanh_approx,
                  .n_tasks = row_tasks(pool, N)};
    lens_pool_run(pool, j.n_tasks, gelu_backward_task, &j);
}
