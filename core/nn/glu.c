/* glu.c - gated MLP activations (glu.h has the formulas). */
#include "core/nn/glu.h"

#include <math.h>

void lens_glu_act(lens_glu act, float x, float *y, float *dy)
{
    if (act == LENS_GLU_SILU) {
        const float s = 1.0f / (1.0f + expf(-x));
        *y = x * s;
        *dy = s * (1.0f + x * (1.0f - s));
    } else if (act == LENS_GLU_CLAMPED_SWIGLU) { /* m = min(x, L): m s(alpha m), derivative 0 above L */
        const float m = x < LENS_GLU_CLAMP_LIMIT ? x : LENS_GLU_CLAMP_LIMIT;
        const float s = 1.0f / (1.0f + expf(-LENS_GLU_CLAMP_ALPHA * m));
        *y = m * s;
        *dy = x < LENS_GLU_CLAMP_LIMIT ? s * (1.0f + LENS_GLU_CLAMP_ALPHA * m * (1.0f - s)) : 0.0f;
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

void lens_glu_up(lens_glu act, float u, float *y, float *dy)
{
    if (act != LENS_GLU_CLAMPED_SWIGLU) {
        *y = u, *dy = 1.0f;
        return;
    }
    const float L = LENS_GLU_CLAMP_LIMIT; /* clamp(u, -L, L) + 1 */
    *y = (u < -L ? -L : u > L ? L : u) + 1.0f;
    *dy = u > -L && u < L ? 1.0f : 0.0f;
}

void lens_glu_forward(float *out, const float *gate, const float *up, int N, int F, size_t ld, lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy, v, dv;
            lens_glu_act(act, gate[i], &y, &dy);
            lens_glu_up(act, up[i], &v, &dv);
            out[i] = y * v;
        }
}

void lens_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int N, int F,
                       size_t ld, lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy, v, dv;
            lens_glu_act(act, gate[i], &y, &dy);
            lens_glu_up(act, up[i], &v, &dv);
            /* forward: out = act(g) v(u) */
            if (dgate) dgate[i] += dout[i] * dy * v;
            if (dup) dup[i] += dout[i] * y * dv;
        }
}

void lens_glu_jvp(float *tout, const float *tgate, const float *tup, const float *gate, const float *up, int N, int F,
                  size_t ld, lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy, v, dv;
            lens_glu_act(act, gate[i], &y, &dy);
            lens_glu_up(act, up[i], &v, &dv);
            tout[i] = dy * tgate[i] * v + y * dv * tup[i];
        }
}

void lens_glu_backward_inplace(float *d, float *dup, const float *gate, const float *up, int N, int F, size_t ld,
                               lens_glu act)
{
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            const size_t i = (size_t)n * ld + f;
            float y, dy, v, dv;
            lens_glu_act(act, gate[i], &y, &dy);
            lens_glu_up(act, up[i], &v, &dv);
            dup[i] = d[i] * y * dv;
            d[i] *= dy * v;
        }
}
