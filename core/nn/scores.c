/* scores.c - soft-capping and the sliding-window softmax (scores.h). */
#include "core/nn/scores.h"

#include <math.h>

#include "core/nn/ops.h"

void lens_softcap_forward(float *x, size_t n, float cap)
{
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void lens_softcap_backward(float *dinp, const float *out, const float *dout, size_t n, float cap)
{
    for (size_t i = 0; i < n; i++) {
        const float t = out[i] / cap;
        dinp[i] += (1.0f - t * t) * dout[i];
    }
}

void lens_softcap_jvp(float *t, const float *out, size_t n, float cap)
{
    for (size_t i = 0; i < n; i++) {
        const float y = out[i] / cap;
        t[i] *= 1.0f - y * y;
    }
}

static inline int window_start(int row, int window) { return row - window + 1 > 0 ? row - window + 1 : 0; }

void lens_softmax_window_forward(float *x, int rows, int cols, int window)
{
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * cols;
        const int lo = window_start(r, window), hi = r + 1 < cols ? r + 1 : cols;
        float max = row[lo];
        for (int c = lo + 1; c < hi; c++) max = row[c] > max ? row[c] : max;
        float sum = 0;
        for (int c = lo; c < hi; c++) sum += row[c] = lens_exp_approx(row[c] - max);
        const float inv = 1.0f / sum;
        for (int c = 0; c < cols; c++) row[c] = c >= lo && c < hi ? row[c] * inv : 0.0f;
    }
}

void lens_softmax_window_backward(float *dinp, const float *probs, const float *dout, int rows, int cols, int window)
{
    for (int r = 0; r < rows; r++) {
        const float *p = probs + (size_t)r * cols, *dp = dout + (size_t)r * cols;
        float *dx = dinp + (size_t)r * cols;
        const int lo = window_start(r, window), hi = r + 1 < cols ? r + 1 : cols;
        float dot = 0;
        for (int c = lo; c < hi; c++) dot += p[c] * dp[c];
        for (int c = lo; c < hi; c++) dx[c] += p[c] * (dp[c] - dot);
    }
}

void lens_softmax_window_jvp(float *t, const float *probs, int rows, int cols, int window)
{
    for (int r = 0; r < rows; r++) {
        const float *p = probs + (size_t)r * cols;
        float *tr = t + (size_t)r * cols;
        const int lo = window_start(r, window), hi = r + 1 < cols ? r + 1 : cols;
        float dot = 0;
        for (int c = lo; c < hi; c++) dot += p[c] * tr[c];
        for (int c = 0; c < cols; c++) tr[c] = c >= lo && c < hi ? p[c] * (tr[c] - dot) : 0.0f;
    }
}
