/* rope.c - rotary position embeddings (rope.h has the layout and formulas). */
#include "core/nn/rope.h"

#include <math.h>

void lens_rope_inv_freq(const lens_rope_params *p, double *inv_freq)
{
    const int half = p->dim / 2;
    for (int i = 0; i < half; i++) {
        double f = pow(p->theta, -2.0 * i / p->dim);
        if (p->type == LENS_ROPE_LINEAR) f /= p->factor;
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
