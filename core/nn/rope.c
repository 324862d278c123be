/* rope.c - rotary position embeddings (rope.h has the layout and formulas). */
#include "core/nn/rope.h"

#include <math.h>

/* The channel where d rotations fit the original length (HF find_correction_dim). */
static double yarn_dim(double rotations, const lens_rope_params *p)
{
    return p->dim * log(p->original_max_positions / (rotations * 2.0 * M_PI)) / (2.0 * log(p->theta));
}

void lens_rope_inv_freq(const lens_rope_params *p, double *inv_freq)
{
    const int half = p->dim / 2;
    double lo = 0, hi = 0;
    if (p->type == LENS_ROPE_YARN) { /* HF find_correction_range */
        lo = yarn_dim(p->beta_fast, p), hi = yarn_dim(p->beta_slow, p);
        if (p->truncate) lo = floor(lo), hi = ceil(hi);
        lo = lo > 0 ? lo : 0, hi = hi < p->dim - 1 ? hi : p->dim - 1;
        if (lo == hi) hi += 0.001;
    }
    for (int i = 0; i < half; i++) {
        double f = pow(p->theta, -2.0 * i / p->dim);
        if (p->type == LENS_ROPE_LINEAR) f /= p->factor;
        else if (p->type == LENS_ROPE_YARN) {
            const double ramp = (i - lo) / (hi - lo), keep = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
            f = f / p->factor * (1.0 - keep) + f * keep;
        }
        else if (p->type == LENS_ROPE_LLAMA3) {
            const double old = p->original_max_positions, wavelen = 2.0 * M_PI / f;
            const double low_wavelen = old / p->low_freq_factor, high_wavelen = old / p->high_freq_factor;
            if (wavelen > low_wavelen) f /= p->factor; /* low frequencies: fully scaled */
            else if (wavelen >= high_wavelen) {         /* medium: interpolated */
                const double s = (old / wavelen - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
                f = (1.0 - s) * f / p->factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

/* Rotates the first R channels of every head of x [N][NH*D] by sign * angle. */
static void rotate(float *x, const int *pos, int N, int NH, int D, int R, const double *inv_freq, double sign)
{
    const int half = R / 2;
    for (int n = 0; n < N; n++) {
        float *row = x + (size_t)n * NH * D;
        for (int i = 0; i < half; i++) {
            const double a = sign * (pos ? pos[n] : n) * inv_freq[i];
            const float c = (float)cos(a), s = (float)sin(a);
            for (int h = 0; h < NH; h++) {
                float *x1 = row + (size_t)h * D + i, *x2 = x1 + half;
                const float a1 = *x1, a2 = *x2;
                *x1 = a1 * c - a2 * s;
                *x2 = a2 * c + a1 * s;
            }
        }
    }
}

void lens_rope_forward(float *x, const int *pos, int N, int NH, int D, int R, const double *inv_freq)
{
    rotate(x, pos, N, NH, D, R, inv_freq, 1.0);
}

void lens_rope_backward(float *d, const int *pos, int N, int NH, int D, int R, const double *inv_freq)
{
    /* y = R(a) x, so dx = R(a)^T dy = R(-a) dy */
    rotate(d, pos, N, NH, D, R, inv_freq, -1.0);
}
