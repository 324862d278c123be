/* glu.h - gated MLP activations (Shazeer 2020): out = act(gate) * up, with
 * act = SiLU (SwiGLU: Llama, Mistral, Qwen), the tanh GELU (GeGLU: Gemma's
 * gelu_pytorch_tanh) or the exact GELU (ModernBERT's "gelu"); forward,
 * backward and JVP side by side.
 *
 * Shapes: N rows of F channels; gate and up may be views with a row stride
 * (ld, in floats), out / gradients / tangents use the same strides.
 *   SiLU(g) = g s(g), s = logistic;   SiLU'(g) = s(g) (1 + g (1 - s(g)))
 *   GELU_tanh(g) = g/2 (1 + tanh(k (g + 0.044715 g^3))), k = sqrt(2/pi)
 *   GELU(g) = g Phi(g);   GELU'(g) = Phi(g) + g phi(g)  (Phi, phi: the normal cdf, pdf)
 *   d out = act'(g) dg * u + act(g) du
 * gpt-oss's clamped SwiGLU (GptOssExperts, alpha 1.702, limit L = 7) also
 * transforms the up half:
 *   out = act(g) * (clamp(u, -L, L) + 1),  act(g) = m s(alpha m),  m = min(g, L)
 *   act'(g) = s(alpha m) (1 + alpha m (1 - s(alpha m))) for g < L, 0 above;
 *   d(clamp(u) + 1)/du = 1 inside (-L, L), 0 outside (the clamps' derivative
 *   is taken as 0 where they bind) */
#ifndef LENS_GLU_H
#define LENS_GLU_H

#include <stddef.h>

typedef enum { LENS_GLU_NONE = 0, LENS_GLU_SILU = 1, LENS_GLU_GELU_TANH = 2, LENS_GLU_GELU = 3, LENS_GLU_CLAMPED_SWIGLU = 4 } lens_glu;
#define LENS_GLU_CLAMP_ALPHA 1.702f
#define LENS_GLU_CLAMP_LIMIT 7.0f

/* out[N][F] = act(gate) * up; out may alias gate or up. */
void lens_glu_forward(float *out, const float *gate, const float *up, int N, int F, size_t ld, lens_glu act);
/* dgate, dup [N][F] += from dout (dgate, dup may be NULL). */
void lens_glu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int N, int F,
                       size_t ld, lens_glu act);
/* The same in place: d holds dout on entry and dgate on exit; dup is set. */
void lens_glu_backward_inplace(float *d, float *dup, const float *gate, const float *up, int N, int F, size_t ld,
                               lens_glu act);
/* tout[N][F] = act'(g) tg * u + act(g) tu. */
void lens_glu_jvp(float *tout, const float *tgate, const float *tup, const float *gate, const float *up, int N, int F,
                  size_t ld, lens_glu act);

/* act(x) and act'(x) of one value. */
void lens_glu_act(lens_glu act, float x, float *y, float *dy);
/* The up half's factor of one value and its derivative: u, 1 except for the clamped SwiGLU. */
void lens_glu_up(lens_glu act, float u, float *y, float *dy);

#endif
