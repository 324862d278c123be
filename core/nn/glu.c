/* glu.c - gated MLP activations (glu.h has the formulas). */
#include "core/nn/glu.h"

#include <math.h>

void lens_glu_act(lens_glu act, float x, float *y, float *dy)
{
    if (act == LENS_GLU_SILU) {
        const float s = 1.0f / (1.0f + expf(-x));
        *y = x * s;
        *dy = s * (1.0f + x * (1.0f - s));
    } else if (act == LENS_GLU_GELU) { /* exact: x Phi(x), d = Phi(x) + x phi(x) */
        const float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
        *y = x * cdf;
        *dy = cdf + x * 0.3989422804014327f * expf(-0.5f * x * x);
    } else {
        const float k = 0.7978845608028654f, c = 0.044715f;
        const float t = tanhf(k * (x + c * x * x * x));
        *y = 0.5f * x * (1.0f + t);
        *dy = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
    }
}

void lens_glu_forward(float *out, const float *gate, const float *up, int N, int F, size_t ld, lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy;
            lens_glu_act(act, gate[i], &y, &dy);
            out[i] = y * up[i];
        }
}

void lens_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int N, int F,
                       size_t ld, lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy;
            lens_glu_act(act, gate[i], &y, &dy);
            /* forward: out = act(g) u */
            if (dgate) dgate[i] += dout[i] * dy * up[i];
            if (dup) dup[i] += dout[i] * y;
        }
}

void lens_glu_jvp(float *tout, const float *tgate, const float *tup, const float *gate, const float *up, int N, int F,
                  size_t ld, lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy;
            lens_glu_act(act, gate[i], &y, &dy);
            tout[i] = dy * tgate[i] * up[i] + y * tup[i];
        }
}

void lens_glu_backward_inplace(float *d, float *dup, const float *gate, const float *up, int N, int F, size_t ld,
                               lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy;
            lens_glu_act(act, gate[i], &y, &dy);
            dup[i] = d[i] * y;
            d[i] *= dy * up[i];
        }
}
