/* scores.h - what modern models do to attention scores and logits:
 * soft-capping (Gemma 2) and the sliding-window softmax, causal (Mistral,
 * Gemma 2 / 3's local layers) or bidirectional (ModernBERT's local layers);
 * forward, backward and JVP side by side.
 *
 *   softcap:  y = cap tanh(x / cap);   dy/dx = 1 - tanh^2(x / cap) = 1 - (y / cap)^2
 *   window:   row i of a [T][T] score block keeps the columns of its key band
 *             (lens_key_band), softmax over them, every other entry exactly 0:
 *             causal, max(0, i - W + 1) .. i (HF's sliding-window mask: key j is
 *             seen when i - j < W); bidirectional, |i - j| <= W / 2 (ModernBERT's
 *             local_attention W: HF's window_mask, flash-attention's (W/2, W/2)). */
#ifndef LENS_SCORES_H
#define LENS_SCORES_H

#include <stddef.h>

/* The keys row i of T attends, [*lo, *hi): all, j <= i (causal), i - W < j <= i
 * (causal, window W > 0), or |i - j| <= W / 2 (window W > 0 without causal). */
static inline void lens_key_band(int i, int T, int causal, int window, int *lo, int *hi)
{
    const int before = !window ? i : causal ? window - 1 : window / 2;
    const int after = causal ? 0 : !window ? T : window / 2;
    *lo = i - before > 0 ? i - before : 0;
    *hi = after < T - i ? i + after + 1 : T;
}

/* How one layer turns scale q k^T into attention probabilities, for every
 * caller (forward.c's attend_task, ops.h's lens_attention_*, hence the
 * attribution and HTA hooks and the trainer):
 *   P = softmax over row i's visible keys (lens_key_band) of softcap(scale q_i k_j)
 * With attention sinks (gpt-oss) head h's learned logit z_h joins every
 * row's denominator and is dropped after it, so a row sums to 1 - p_sink:
 *   P_ij = exp(y_ij) / (exp(z_h) + sum_j' exp(y_ij'))
 * The derivatives in y are the softmax's, P (dP - sum_j P dP), since the
 * dropped sink entry has dP = 0; the sink's own gradient is
 *   dz_h = -sum_i p_sink,i sum_j P_ij dP_ij,   p_sink,i = 1 - sum_j P_ij. */
typedef struct lens_score_fn {
    float scale;
    float softcap; /* 0 = none */
    int causal;
    int window;    /* 0 = none; > 0 a sliding window, causal or bidirectional (lens_key_band) */
    const float *sinks; /* [NH] the layer's sink logits (gpt-oss self_attn.sinks), or NULL */
} lens_score_fn;

/* p [T][T] = probabilities of head h from the scaled scores s = scale q k^T in place. */
void lens_scores_forward(float *p, int T, const lens_score_fn *f, int h);
/* dL/dz of a head's sink logit from its P and dp = dL/dP (0 without sinks). */
float lens_scores_sink_backward(const float *p, const float *dp, int T, const lens_score_fn *f);
/* ds [T][T] = dL/ds (set) from dp = dL/dP and the forward's P. With a
 * soft-cap ds must hold the capped scores softcap(s) on entry (the chain
 * rule reads them in place: lens_scores_capped). */
void lens_scores_backward(float *ds, const float *p, const float *dp, int T, const lens_score_fn *f);
/* ds [T][T] = tangent of P from the tangent of s in place; g [T][T] the
 * soft-cap's derivative 1 - (softcap(s) / cap)^2 (lens_scores_capped then
 * lens_scores_capgrad), ignored without a soft-cap. */
void lens_scores_jvp(float *ds, const float *p, const float *g, int T, const lens_score_fn *f);
/* y [T][T] = softcap(scale q_h k_h^T) of one head (q, k rows of stride ld). */
void lens_scores_capped(float *y, const float *q, const float *k, size_t ld, int T, int DK, const lens_score_fn *f);
/* y = 1 - (y / cap)^2 in place. */
void lens_scores_capgrad(float *y, int T, const lens_score_fn *f);

/* x[n] = cap tanh(x / cap) in place (cap > 0). */
void lens_softcap_forward(float *x, size_t n, float cap);
/* dinp[n] += (1 - (out / cap)^2) dout, out = the forward's output. */
void lens_softcap_backward(float *dinp, const float *out, const float *dout, size_t n, float cap);
/* t[n] = (1 - (out / cap)^2) t in place. */
void lens_softcap_jvp(float *t, const float *out, size_t n, float cap);

/* Softmax of each row of x [rows][cols] over its key band (lens_key_band) in place. */
void lens_softmax_window_forward(float *x, int rows, int cols, int causal, int window);
/* dinp += P (dout - sum P dout) over each row's band. */
void lens_softmax_window_backward(float *dinp, const float *probs, const float *dout, int rows, int cols, int causal,
                                  int window);
/* t = P (t - sum P t) over each row's band, in place. */
void lens_softmax_window_jvp(float *t, const float *probs, int rows, int cols, int causal, int window);

#endif
