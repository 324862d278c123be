/* scores.c - soft-capping and the sliding-window softmax (scores.h). */
#include "core/nn/scores.h"

#include <math.h>
#include <string.h>

#include "core/base/gemm.h"

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

void lens_softmax_window_forward(float *x, int rows, int cols, int causal, int window)
{
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * cols;
        int lo, hi;
        lens_key_band(r, cols, causal, window, &lo, &hi);
        float max = row[lo];
        for (int c = lo + 1; c < hi; c++) max = row[c] > max ? row[c] : max;
        float sum = 0;
        for (int c = lo; c < hi; c++) sum += row[c] = lens_exp_approx(row[c] - max);
        const float inv = 1.0f / sum;
        for (int c = 0; c < cols; c++) row[c] = c >= lo && c < hi ? row[c] * inv : 0.0f;
    }
}

void lens_softmax_window_backward(float *dinp, const float *probs, const float *dout, int rows, int cols, int causal,
                                  int window)
{
    for (int r = 0; r < rows; r++) {
        const float *p = probs + (size_t)r * cols, *dp = dout + (size_t)r * cols;
        float *dx = dinp + (size_t)r * cols;
        int lo, hi;
        lens_key_band(r, cols, causal, window, &lo, &hi);
        float dot = 0;
        for (int c = lo; c < hi; c++) dot += p[c] * dp[c];
        for (int c = lo; c < hi; c++) dx[c] += p[c] * (dp[c] - dot);
    }
}

void lens_softmax_window_jvp(float *t, const float *probs, int rows, int cols, int causal, int window)
{
    for (int r = 0; r < rows; r++) {
        const float *p = probs + (size_t)r * cols;
        float *tr = t + (size_t)r * cols;
        int lo, hi;
        lens_key_band(r, cols, causal, window, &lo, &hi);
        float dot = 0;
        for (int c = lo; c < hi; c++) dot += p[c] * tr[c];
        for (int c = 0; c < cols; c++) tr[c] = c >= lo && c < hi ? p[c] * (tr[c] - dot) : 0.0f;
    }
}

/* Softmax of each row of x [T][T] over its key band with the sink logit z in the denominator. */
static void softmax_sink_forward(float *x, int T, int causal, int window, float z)
{
    for (int r = 0; r < T; r++) {
        float *row = x + (size_t)r * T;
        int lo, hi;
        lens_key_band(r, T, causal, window, &lo, &hi);
        float max = z;
        for (int c = lo; c < hi; c++) max = row[c] > max ? row[c] : max;
        float sum = lens_exp_approx(z - max);
        for (int c = lo; c < hi; c++) sum += row[c] = lens_exp_approx(row[c] - max);
        const float inv = 1.0f / sum;
        for (int c = 0; c < T; c++) row[c] = c >= lo && c < hi ? row[c] * inv : 0.0f;
    }
}

void lens_scores_forward(float *p, int T, const lens_score_fn *f, int h)
{
    if (f->softcap > 0) lens_softcap_forward(p, (size_t)T * T, f->softcap);
    if (f->sinks) softmax_sink_forward(p, T, f->causal, f->window, f->sinks[h]);
    else if (f->window) lens_softmax_window_forward(p, T, T, f->causal, f->window);
    else lens_softmax_forward(p, T, T, f->causal);
}

float lens_scores_sink_backward(const float *p, const float *dp, int T, const lens_score_fn *f)
{
    if (!f->sinks) return 0.0f;
    double dz = 0;
    for (int r = 0; r < T; r++) {
        const float *pr = p + (size_t)r * T, *dpr = dp + (size_t)r * T;
        double mass = 0, dot = 0;
        for (int c = 0; c < T; c++) mass += pr[c], dot += (double)pr[c] * dpr[c];
        dz -= (1.0 - mass) * dot; /* forward: p_sink = exp(z) / sum, dropped (its dP = 0) */
    }
    return (float)dz;
}

void lens_scores_backward(float *ds, const float *p, const float *dp, int T, const lens_score_fn *f)
{
    if (!(f->softcap > 0)) {
        /* P = 0 outside each row's band, so the (causal) softmax backward leaves those entries 0 */
        memset(ds, 0, sizeof(float) * T * T);
        lens_softmax_backward(ds, p, dp, T, T, f->causal);
        return;
    }
    /* forward: P = softmax(y), y = cap tanh(s / cap): ds = P (dp - Σ P dp) (1 - (y / cap)^2), y read from ds */
    for (int r = 0; r < T; r++) {
        const float *pr = p + (size_t)r * T, *dpr = dp + (size_t)r * T;
        float *d = ds + (size_t)r * T;
        float dot = 0;
        for (int c = 0; c < T; c++) dot += pr[c] * dpr[c];
        for (int c = 0; c < T; c++) {
            const float y = d[c] / f->softcap;
            d[c] = pr[c] * (dpr[c] - dot) * (1.0f - y * y);
        }
    }
}

void lens_scores_jvp(float *ds, const float *p, const float *g, int T, const lens_score_fn *f)
{
    for (int t = 0; t < T; t++) {
        const float *pr = p + (size_t)t * T;
        float *s = ds + (size_t)t * T;
        /* forward: y = cap tanh(s / cap) */
        if (f->softcap > 0)
            for (int u = 0; u < T; u++) s[u] *= g[(size_t)t * T + u];
        /* forward: P = softmax(y); masked entries have P = 0, so the full row's JVP keeps them 0 */
        double dot = 0;
        for (int u = 0; u < T; u++) dot += (double)pr[u] * s[u];
        for (int u = 0; u < T; u++) s[u] = pr[u] * (s[u] - (float)dot);
    }
}

void lens_scores_capped(float *y, const float *q, const float *k, size_t ld, int T, int DK, const lens_score_fn *f)
{
    const lens_gemm_args scores = {.M = T, .N = T, .K = DK, .x = q, .ldx = ld, .w = k, .ld = ld, .w_kn = 0,
                                   .alpha = f->scale, .y = y, .ldy = (size_t)T};
    lens_gemm(&scores, NULL);
    if (f->softcap > 0) lens_softcap_forward(y, (size_t)T * T, f->softcap);
}

void lens_scores_capgrad(float *y, int T, const lens_score_fn *f)
{
    for (size_t i = 0; i < (size_t)T * T; i++) {
        const float t = y[i] / f->softcap;
        y[i] = 1.0f - t * t;
    }
}
