/* norm.h - RMSNorm (Llama, Mistral, Qwen, Gemma) and the per-head QK-norm
 * of Qwen3, each with its backward and JVP next to its forward.
 *
 * Shapes: N rows of C channels, row-major float32; QK-norm sees the
 * [N][NH*D] query or key buffer as N*NH rows of one head's D channels.
 *   y = x * r * g,  r = 1 / sqrt(mean_c x^2 + eps),  g = w  (Llama: LlamaRMSNorm)
 *                                                    g = 1 + w (Gemma: GemmaRMSNorm)
 * The sum of squares runs in double: HF upcasts to float32 for the statistic,
 * and a float32 sum would differ from the float64 reference at C = 4096. */
#ifndef LENS_NORM_H
#define LENS_NORM_H

#include <stddef.h>

/* out[N][C] = RMSNorm(inp); rstd [N] (r per row) may be NULL; out may alias inp. */
void lens_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int unit_offset, int N, int C,
                          float eps);
/* dinp[N][C] += d y / d x applied to dout, from the forward's inp and rstd:
 *   dx_j = r g_j dy_j - r^3 x_j / C * sum_i g_i x_i dy_i;
 * dweight [C] += sum_n dy x r when non-NULL (d g / d w = 1 in both forms).
 * dinp must not alias dout. */
void lens_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *rstd,
                           const float *w, int unit_offset, int N, int C);
/* The same in place: d holds dy on entry and dx on exit (set, not accumulated). */
void lens_rmsnorm_backward_inplace(float *d, float *dweight, const float *inp, const float *rstd, const float *w,
                                   int unit_offset, int N, int C);
/* v [C] = g ⊙ (v - mean v) * scale (rms: no centring): LayerNorm or RMSNorm
 * with its statistics frozen (scale = the r of the whole sum), applied to one
 * term of the sum it normalises; linear in v, so the terms add up to the
 * normalised sum minus the bias (context mixing, direct logit attribution). */
void lens_norm_frozen(float *v, int C, const float *w, int unit_offset, int rms, double scale);
/* tout[N][C] = d y applied to the tangent tinp (tout may alias tinp): ty_i = r g_i (tx_i - x_i r^2 (x . tx) / C). */
void lens_rmsnorm_jvp(float *tout, const float *tinp, const float *inp, const float *rstd, const float *w,
                      int unit_offset, int N, int C);

/* QK-norm: RMSNorm with weight w [D] over each head of x [N][NH*D] (Qwen3
 * q_norm / k_norm, applied before RoPE); rstd [N*NH] or NULL. */
static inline void lens_qk_norm_forward(float *x, float *rstd, const float *w, int N, int NH, int D, float eps)
{
    lens_rmsnorm_forward(x, rstd, x, w, 0, N * NH, D, eps);
}
static inline void lens_qk_norm_backward(float *dx, float *dweight, const float *dout, const float *x,
                                         const float *rstd, const float *w, int N, int NH, int D)
{
    lens_rmsnorm_backward(dx, dweight, dout, x, rstd, w, 0, N * NH, D);
}
static inline void lens_qk_norm_jvp(float *tout, const float *tx, const float *x, const float *rstd, const float *w,
                                    int N, int NH, int D)
{
    lens_rmsnorm_jvp(tout, tx, x, rstd, w, 0, N * NH, D);
}

#endif
