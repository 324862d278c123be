/* scores.h - what modern decoders do to attention scores and logits:
 * soft-capping (Gemma 2) and the sliding-window causal softmax (Mistral,
 * Gemma 2's local layers); forward, backward and JVP side by side.
 *
 *   softcap:  y = cap tanh(x / cap);   dy/dx = 1 - tanh^2(x / cap) = 1 - (y / cap)^2
 *   window:   row i of a [T][T] score block keeps columns max(0, i - W + 1) .. i
 *             (HF's sliding-window mask: key j is seen when i - j < W), softmax
 *             over them, every other entry exactly 0. */
#ifndef LENS_SCORES_H
#define LENS_SCORES_H

#include <stddef.h>

/* x[n] = cap tanh(x / cap) in place (cap > 0). */
void lens_softcap_forward(float *x, size_t n, float cap);
/* dinp[n] += (1 - (out / cap)^2) dout, out = the forward's output. */
void lens_softcap_backward(float *dinp, const float *out, const float *dout, size_t n, float cap);
/* t[n] = (1 - (out / cap)^2) t in place. */
void lens_softcap_jvp(float *t, const float *out, size_t n, float cap);

/* Softmax of each row of x [rows][cols] over its window (above) in place. */
void lens_softmax_window_forward(float *x, int rows, int cols, int window);
/* dinp += P (dout - sum P dout) over each row's window. */
void lens_softmax_window_backward(float *dinp, const float *probs, const float *dout, int rows, int cols, int window);
/* t = P (t - sum P t) over each row's window, in place. */
void lens_softmax_window_jvp(float *t, const float *probs, int rows, int cols, int window);

#endif
