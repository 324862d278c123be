/* norm.c - RMSNorm forward, backward and JVP (norm.h has the formulas). */
#include "core/nn/norm.h"

#include <math.h>

static inline float gain(const float *w, int unit_offset, int i) { return unit_offset ? 1.0f + w[i] : w[i]; }

/* r = 1 / sqrt(mean x^2 + eps) of one row, the square sum in double. */
static float row_rstd(const float *x, int C, float eps)
{
    double ss = 0;
    for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / C + eps));
}

void lens_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int unit_offset, int N, int C,
                          float eps)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        const float r = row_rstd(x, C, eps);
        for (int i = 0; i < C; i++) y[i] = x[i] * r * gain(w, unit_offset, i);
        if (rstd) rstd[n] = r;
    }
}

void lens_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *rstd,
                           const float *w, int unit_offset, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        const float r = rstd[n];
        /* forward: y_i = g_i x_i r; d r / d x_j = -r^3 x_j / C */
        double dot = 0;
        for (int i = 0; i < C; i++) dot += (double)gain(w, unit_offset, i) * x[i] * dy[i];
        const float k = (float)(dot * r * r * r / C);
        for (int j = 0; j < C; j++) dx[j] += r * gain(w, unit_offset, j) * dy[j] - k * x[j];
        if (dweight)
            for (int i = 0; i < C; i++) dweight[i] += dy[i] * x[i] * r;
    }
}

void lens_rmsnorm_backward_inplace(float *d, float *dweight, const float *inp, const float *rstd, const float *w,
                                   int unit_offset, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *dy = d + (size_t)n * C;
        const float r = rstd[n];
        double dot = 0;
        for (int i = 0; i < C; i++) dot += (double)gain(w, unit_offset, i) * x[i] * dy[i];
        const float k = (float)(dot * r * r * r / C);
        if (dweight)
            for (int i = 0; i < C; i++) dweight[i] += dy[i] * x[i] * r;
        for (int j = 0; j < C; j++) dy[j] = r * gain(w, unit_offset, j) * dy[j] - k * x[j];
    }
}

void lens_rmsnorm_jvp(float *tout, const float *tinp, const float *inp, const float *rstd, const float *w,
                      int unit_offset, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *tx = tinp + (size_t)n * C;
        float *ty = tout + (size_t)n * C;
        const float r = rstd[n];
        double dot = 0;
        for (int i = 0; i < C; i++) dot += (double)x[i] * tx[i];
        const float k = (float)(dot * r * r / C);
        for (int i = 0; i < C; i++) ty[i] = r * gain(w, unit_offset, i) * (tx[i] - x[i] * k);
    }
}

void lens_norm_frozen(float *v, int C, const float *w, int unit_offset, int rms, double scale)
{
    double mean = 0;
    if (!rms) { /* in 8 double lanes: one sum would be a chain of C dependent additions */
        double acc[8] = {0};
        int k = 0;
        for (; k + 8 <= C; k += 8)
            for (int l = 0; l < 8; l++) acc[l] += v[k + l];
        for (; k < C; k++) acc[0] += v[k];
        mean = (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) / C;
    }
    for (int k = 0; k < C; k++) v[k] = (float)((v[k] - mean) * scale) * (unit_offset ? 1.0f + w[k] : w[k]);
}
