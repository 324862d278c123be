/* decompx.h - DecompX (Modarressi, Fayyaz, Aghazadeh, Yaghoobzadeh &
 * Pilehvar 2023, mohsenfayyaz/DecompX): each position's hidden state as a
 * sum of one vector per input token, propagated through every sublayer of a
 * post-norm encoder block and on through the classifier head. Served by
 * context_mixing.h ("method": "decompx"); the math and every paper / code /
 * lensd difference are in docs/context-mixing.md.
 *
 * Per layer, from the decomposition A [T][T][C] of its input (A[i][k]: token
 * k's part of position i; the embedding layer's is the diagonal x_i):
 *   attention   t_ik = Σ_h Σ_s P^h_is (A[s][k] W_V^h) W_O^h + A[i][k]
 *   biases      b (W_O b_V + b_O, LayerNorm's β, b_1, b_2) split over k by
 *               w_k = |<t_ik, b>| / Σ_k' |<t_ik', b>| ("absdot")
 *   LayerNorm   γ ⊙ (t_ik − mean t_ik) / σ_i, σ_i the real state's (frozen)
 *   FFN         (t_ik W_1 + b_1 share) ⊙ act(z_i) / z_i, then W_2 (+ b_2 share),
 *               z_i the real pre-activation ("GeLU_ZO"); added to t_ik
 *   LayerNorm 2 as LayerNorm 1, on the real pre-LN2 statistics
 * so Σ_k A'[i][k] is the layer's output row i. The per-layer matrix is
 * ‖A'[i][k]‖ with A the diagonal (the released code's aggregation None);
 * the rolled-out one propagates A (aggregation "vector"). The classifier:
 * the first row's vectors through the pooler (tanh, or ReLU, "ZO" as the
 * FFN) and the classifier, biases by absdot: [T][K] summing to the logits. */
#ifndef LENS_DECOMPX_H
#define LENS_DECOMPX_H

#include "core/model/block.h"

typedef struct lens_decompx lens_decompx;

/* NULL when every block of m is a post-norm encoder block DecompX follows,
 * else a sentence saying why not. */
const char *lens_decompx_undefined(const lens_model *m);

/* State for one sequence of T tokens: T² · (2C + 2 NH·DV) floats (the
 * propagated vectors before and after a layer, the latter first holding the
 * layer's own ones; the values and their attention mixing). NULL with
 * LENS_ELIMIT when that exceeds max_bytes (0: 2 GiB), LENS_ENOMEM out of
 * memory. */
lens_decompx *lens_decompx_new(const lens_model *m, int T, size_t max_bytes, lens_err *err);
/* Bytes lens_decompx_new keeps for T tokens. */
size_t lens_decompx_bytes(const lens_model *m, int T);
void lens_decompx_free(lens_decompx *d);

/* Layer l (0-based block; called for l = 0, 1, ... in order) from act
 * (hidden states, attention, values of one sequence): M [T][T] the layer's
 * own matrix, or NULL when it is not wanted (after layer 1 that skips one
 * of the layer's two passes), agg [T][T] the propagated vectors' norms
 * (paper_code: raw norms; else rows normalised to sum to one). LENS_ECANCEL
 * on cancel. */
int lens_decompx_layer(lens_decompx *d, const lens_model *m, const lens_activations *act, int l, int paper_code,
                       lens_pool *pool, const volatile int *cancel, float *M, float *agg, lens_err *err);

/* Floating-point operations of lens_decompx_layer for layers 1..top, top
 * the last of layers [n_layers] (1-based, ascending; NULL: all L), with the
 * own matrix of those layers only (the API's cost model; the forward and
 * the classifier not included). */
double lens_decompx_flops(const lens_model *m, int T, const int *layers, int n_layers);

/* The propagated vectors [T][T][C] after the last layer run: row i, token k. */
const float *lens_decompx_vectors(const lens_decompx *d);

/* out [T][K]: token k's part of each logit of a classifier, from the
 * vectors after layer L. 1 when m is no classifier DecompX follows (a
 * normed pooler), 0 done, else an error. */
int lens_decompx_classifier(lens_decompx *d, const lens_model *m, const lens_activations *act, int paper_code,
                            lens_pool *pool, float *out, lens_err *err);

#endif
