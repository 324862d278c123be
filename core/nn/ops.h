/* ops.h - the forward operations of BERT and GPT-2, one function each.
 *
 * Shapes: N rows (tokens, packed over a batch), C channels, OC output
 * channels, T tokens of one sequence, NH heads, DK / DV per-head key / value
 * sizes. All arrays are row-major float32.
 *
 * Each backward pass sits next to its forward (llm.c style) and ACCUMULATES
 * into its gradient outputs (d* += ...), so a tensor read by two ops (a
 * residual stream) gets both contributions; callers zero gradients first.
 * Backward passes give gradients with respect to activations; weight
 * gradients are computed only when their (optional) outputs are non-NULL. */
#ifndef LENS_OPS_H
#define LENS_OPS_H

#include <math.h>
#include <stdint.h>

#include "core/base/dtype.h"
#include "core/base/pool.h"
#include "core/nn/glu.h"
#include "core/nn/linear.h"
#include "core/nn/scores.h"

/* exp(x) = 2^n exp(r), n = round(x log2 e), |r| <= ln2 / 2, degree-6
 * polynomial for exp(r) (relative error <= 1e-7), 2^n built in the exponent
 * bits. Branch-free, so loops calling it vectorise (libm's expf is a call per
 * element); used by the softmax and GELU of ops.c and the trainer's losses. */
static inline float lens_exp_approx(float x)
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

/* out[N][OC] = inp[N][IC] W + b (W per lin's layout); out must not alias inp. */
void lens_linear_forward(float *out, const float *inp, const lens_linear *lin, int N);
/* dinp[N][IC] += dout[N][OC] (dout/dinp of out = inp W + b). dweight (W's
 * layout and row stride lin->ld) and dbias [OC] are accumulated only when
 * non-NULL, and only then is inp [N][IC] read (may be NULL otherwise).
 * dinp may be NULL (weight gradients only). */
void lens_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const lens_linear *lin, int N);
/* JVP: dout[N][OC] = dinp[N][IC] W, the linear part (GEMM on pool). */
void lens_linear_jvp(float *dout, const float *dinp, const lens_linear *lin, int N, lens_pool *pool);

/* out[N][C] = (inp - mean) * rstd * w + b, statistics per row; mean and rstd
 * ([N]) may be NULL. out may alias inp. */
void lens_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const lens_layernorm *ln, int N, int C, float eps);
/* dinp[N][C] += d LN / d inp applied to dout[N][C], from the forward's inp,
 * mean and rstd [N]; dweight / dbias [C] accumulated when non-NULL. dinp
 * must not alias dout. */
void lens_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *mean, const float *rstd,
                             const lens_layernorm *ln, int N, int C);
/* JVP for B tangents dx [B][T][C] of the forward's inp [T][C] (mean, rstd
 * [T]): dy = w ⊙ rstd (dx - mean(dx) - xhat mean(xhat ⊙ dx)), xhat =
 * (inp - mean) rstd; dy may alias dx; xhat_scratch [C]. */
void lens_layernorm_jvp(float *dy, const float *dx, const float *inp, const float *mean, const float *rstd,
                        const lens_layernorm *ln, int B, int T, int C, float *xhat_scratch);

/* In place on x[n]: exact GELU x * Phi(x) (BERT "gelu") or the tanh
 * approximation (GPT-2 "gelu_new"). */
void lens_gelu_forward(float *x, size_t n);
void lens_gelu_tanh_forward(float *x, size_t n);
/* dinp[n] += GELU'(inp) * dout, inp = the forward's input (pre-activation).
 * The erf backward is the derivative of the exact GELU,
 * Phi(x) + x phi(x), not of the erf approximation the forward evaluates
 * (they differ by < 1e-6). dinp must not alias dout. */
void lens_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void lens_gelu_tanh_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* d[n] = GELU'(inp) * d in place (the FFN's hidden gradient needs no sum). */
void lens_gelu_backward_inplace(float *d, const float *inp, size_t n, int tanh_approx);
/* JVP for B tangents d [B][n] of the forward's input inp [n]: d *= GELU'(inp). */
void lens_gelu_jvp(float *d, const float *inp, int B, size_t n, int tanh_approx);

/* In place on x[n]: max(x, 0) (DistilBERT's pre_classifier). */
void lens_relu_forward(float *x, size_t n);
/* dinp[n] += (out > 0) dout, out = the forward's output. */
void lens_relu_backward(float *dinp, const float *out, const float *dout, size_t n);

/* In place on x[n]: tanh (BERT pooler). */
void lens_tanh_forward(float *x, size_t n);
/* dinp[n] += (1 - out^2) dout, out = the forward's output tanh(x). */
void lens_tanh_backward(float *dinp, const float *out, const float *dout, size_t n);

/* out[n] += inp[n] (residual connection). */
void lens_residual_forward(float *out, const float *inp, size_t n);
/* out = out + inp: dinp[n] += dout (the gradient w.r.t. out passes through
 * unchanged, so the caller keeps using dout for the other branch). */
void lens_residual_backward(float *dinp, const float *dout, size_t n);

/* Softmax of each row of x[rows][cols] in place. With causal != 0, row i only
 * covers columns 0..i and the rest are set to exactly 0. */
void lens_softmax_forward(float *x, int rows, int cols, int causal);
/* dinp[rows][cols] += P * (dout - sum_c P dout) per row, P = the forward's
 * output; with causal, entries above the diagonal get nothing (their
 * scores were never used). dinp must not alias dout. */
void lens_softmax_backward(float *dinp, const float *probs, const float *dout, int rows, int cols,
                           int causal);

/* Multi-head attention of one sequence.
 *   q, k: [T][NH*DK] (row stride NH*DK), v: [T][NH*DV]
 *   probs: NH blocks of [T][T], head h at probs + h * probs_stride (so the
 *          probabilities can land directly in a caller's [L][NH][...] layout)
 *   out:  [T][NH*DV], head h in columns h*DV .. h*DV+DV-1
 * scores = f->scale q_h k_h^T (lens_config.attn_scale: 1/sqrt(DK), or 1/sqrt(DV) for an
 * identifiable encoder trained as declare-lab's code), then f's soft-cap and causal / windowed
 * softmax (scores.h, lens_layer_scores), out_h = P v_h. */
void lens_attention_forward(float *out, float *probs, size_t probs_stride, const float *q,
                            const float *k, const float *v, int T, int NH, int DK, int DV, const lens_score_fn *f);
/* Backward of lens_attention_forward for one sequence.
 *   dout: [T][NH*DV] gradient of out; q, k, v, probs as in the forward
 *   dprobs: NH blocks of [T][T] at dprobs_stride: SET (not accumulated) to
 *           dL/dP_h = dout_h v_h^T, the gradient w.r.t. the probabilities
 *   dq, dk: [T][NH*DK], dv: [T][NH*DV], accumulated; any may be NULL
 *   dscores: [T][T] scratch, used when dq or dk is non-NULL
 * dscores = softcap'(scores) softmax_backward(dP) (lens_scores_backward);
 * dq_h += scale dscores k_h, dk_h += scale dscores^T q_h, dv_h += P^T dout_h. */
void lens_attention_backward(float *dq, float *dk, float *dv, float *dprobs, size_t dprobs_stride,
                             float *dscores, const float *dout, const float *q, const float *k,
                             const float *v, const float *probs, size_t probs_stride, int T, int NH,
                             int DK, int DV, const lens_score_fn *f);
/* JVP of lens_attention_forward for B tangents of one sequence: dq, dk
 * [B][T][NH*DK], dv [B][T][NH*DV] -> dout [B][T][NH*DV] (set), from the
 * forward's q, k, v and probs (NH blocks of [T][T] at probs_stride); dS
 * [T][T] scratch, [2][T][T] when f has a soft-cap (its derivative per head).
 * Per tangent and head:
 *   dS = softcap'(scores) ⊙ scale (dq_h k_h^T + q_h dk_h^T);
 *   dP = P ⊙ (dS − rowsum(P ⊙ dS)) (masked entries have P = 0); dout_h = dP v_h + P dv_h. */
void lens_attention_jvp(float *dout, const float *dq, const float *dk, const float *dv, const float *q,
                        const float *k, const float *v, const float *probs, size_t probs_stride, int B, int T,
                        int NH, int DK, int DV, const lens_score_fn *f, float *dS);

/* Row-parallel forms on a lens_pool (NULL: the calling thread), a few row
 * ranges per thread; each row is computed as by the single-row ops above,
 * so results do not depend on the pool.
 * lens_add_layernorm: out[N][C] = LN(inp (+ residual)); inp += residual in
 *   place first when residual is given; out may alias inp; mean, rstd may be NULL.
 * lens_residual_layernorm: x[N][C] += h, then out = LN(x) when ln is not NULL.
 * lens_gelu_rows: x[N][C] (row stride ld) = GELU(x).
 * lens_glu_rows: gate[N][F] (row stride ld, as up's) = act(gate) up (lens_glu_forward). */
void lens_add_layernorm(lens_pool *pool, float *out, float *mean, float *rstd, float *inp, const float *residual,
                        const lens_layernorm *ln, int N, int C, float eps);
void lens_residual_layernorm(lens_pool *pool, float *x, const float *h, float *out, float *mean, float *rstd,
                             const lens_layernorm *ln, int N, int C, float eps);
void lens_gelu_rows(lens_pool *pool, float *x, size_t ld, int N, int C, int tanh_approx);
void lens_glu_rows(lens_pool *pool, float *gate, const float *up, size_t ld, int N, int F, lens_glu act);
/* Backward forms, activation gradients only:
 * lens_layernorm_backward_rows: dinp[N][C] += LN backward of dout (as lens_layernorm_backward);
 * lens_gelu_backward_rows: d[N][C] (row stride ld) *= GELU'(inp) (same stride). */
void lens_layernorm_backward_rows(lens_pool *pool, float *dinp, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, const lens_layernorm *ln, int N, int C);
void lens_gelu_backward_rows(lens_pool *pool, float *d, const float *inp, size_t ld, int N, int C, int tanh_approx);

#endif
