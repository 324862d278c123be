/* ops.c - forward operations (see ops.h for shapes). */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

void lens_linear_forward(float *out, const float *inp, const lens_linear *lin, int N)
{
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * lin->out;
        if (lin->b) memcpy(row, lin->b, sizeof(float) * lin->out);
        else memset(row, 0, sizeof(float) * lin->out);
    }
    /* Linear: out = inp W^T with W [OC][IC]; Conv1D: out = inp W with W [IC][OC] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, lin->w_in_out ? CblasNoTrans : CblasTrans,
                N, lin->out, lin->in, 1.0f, inp, lin->in, lin->w, lin->ld, 1.0f, out, lin->out);
}

void lens_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const lens_layernorm *ln, int N, int C, float eps)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        /* two passes in double: PyTorch's LayerNorm uses a numerically
         * careful (Welford) variance; a one-pass float sum would not match */
        double sum = 0;
        for (int i = 0; i < C; i++) sum += x[i];
        double m = sum / C, var = 0;
        for (int i = 0; i < C; i++) {
            double d = x[i] - m;
            var += d * d;
        }
        float s = (float)(1.0 / sqrt(var / C + eps));
        float mf = (float)m;
        for (int i = 0; i < C; i++) y[i] = (x[i] - mf) * s * ln->w[i] + ln->b[i];
        if (mean) mean[n] = mf;
        if (rstd) rstd[n] = s;
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

/* exp(x) = 2^n exp(r), n = round(x log2 e), |r| <= ln2 / 2, degree-6
 * polynomial for exp(r) (relative error <= 1e-7), 2^n built in the exponent
 * bits. Branch-free for the same reason as erf_approx. */
static inline float exp_approx(float x)
{
    x = x < -87.3f ? -87.3f : x > 88.7f ? 88.7f : x;
    const float n = rintf(x * 1.44269504088896341f);
    const float r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

void lens_gelu_forward(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erf_approx(x[i] * (float)M_SQRT1_2));
}

void lens_gelu_tanh_forward(float *x, size_t n)
{
    const float s = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(s * (v + 0.044715f * v * v * v)));
    }
}

void lens_tanh_forward(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = tanhf(x[i]);
}

void lens_residual_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] += inp[i];
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
        for (int c = 0; c < valid; c++) row[c] = exp_approx(row[c] - max);
        const float inv = 1.0f / sum_lanes(row, valid);
        for (int c = 0; c < valid; c++) row[c] *= inv;
        for (int c = valid; c < cols; c++) row[c] = 0.0f;
    }
}

void lens_attention_forward(float *out, float *probs, size_t probs_stride, const float *q,
                            const float *k, const float *v, int T, int NH, int DK, int DV, int causal)
{
    const int qk_stride = NH * DK, v_stride = NH * DV;
    const float scale = 1.0f / sqrtf((float)DK);
    for (int h = 0; h < NH; h++) {
        float *p = probs + h * probs_stride;
        /* scores[T][T] = q_h k_h^T / sqrt(DK) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DK, scale,
                    q + h * DK, qk_stride, k + h * DK, qk_stride, 0.0f, p, T);
        lens_softmax_forward(p, T, T, causal);
        /* out_h[T][DV] = P v_h */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f,
                    p, T, v + h * DV, v_stride, 0.0f, out + h * DV, v_stride);
    }
}
