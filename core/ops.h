/* ops.h - the forward operations of BERT and GPT-2, one function each.
 *
 * Shapes: N rows (tokens, packed over a batch), C channels, OC output
 * channels, T tokens of one sequence, NH heads, DK / DV per-head key / value
 * sizes. All arrays are row-major float32. Backward passes will sit next to
 * their forward here (llm.c style). */
#ifndef LENS_OPS_H
#define LENS_OPS_H

#include "model.h"

/* out[N][OC] = inp[N][IC] W + b (W per lin's layout); out must not alias inp. */
void lens_linear_forward(float *out, const float *inp, const lens_linear *lin, int N);

/* out[N][C] = (inp - mean) * rstd * w + b, statistics per row; mean and rstd
 * ([N]) may be NULL. out may alias inp. */
void lens_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const lens_layernorm *ln, int N, int C, float eps);

/* In place on x[n]: exact GELU x * Phi(x) (BERT "gelu") or the tanh
 * approximation (GPT-2 "gelu_new"). */
void lens_gelu_forward(float *x, size_t n);
void lens_gelu_tanh_forward(float *x, size_t n);

/* In place on x[n]: tanh (BERT pooler). */
void lens_tanh_forward(float *x, size_t n);

/* out[n] += inp[n] (residual connection). */
void lens_residual_forward(float *out, const float *inp, size_t n);

/* Softmax of each row of x[rows][cols] in place. With causal != 0, row i only
 * covers columns 0..i and the rest are set to exactly 0. */
void lens_softmax_forward(float *x, int rows, int cols, int causal);

/* Multi-head attention of one sequence.
 *   q, k: [T][NH*DK] (row stride NH*DK), v: [T][NH*DV]
 *   probs: NH blocks of [T][T], head h at probs + h * probs_stride (so the
 *          probabilities can land directly in a caller's [L][NH][...] layout)
 *   out:  [T][NH*DV], head h in columns h*DV .. h*DV+DV-1
 * scores = q_h k_h^T / sqrt(DK), causal mask for GPT-2, softmax, out_h = P v_h. */
void lens_attention_forward(float *out, float *probs, size_t probs_stride, const float *q,
                            const float *k, const float *v, int T, int NH, int DK, int DV, int causal);

#endif
