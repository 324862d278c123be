/* head.h - the task heads of every family, written once, each forward next
 * to its backward (activation gradient, and weight gradients through a
 * lens_grad_map when one is given). Which head and which of its variants
 * runs is read from the config and the checkpoint's tensors, never from
 * the family: lens_forward, the attribution engine, the logit lens and the
 * trainer all call these.
 *
 * Shapes: S sequences, R rows, C = d_model, K labels, V vocabulary.
 *
 * Classifier (LENS_TASK_CLASSIFICATION), on the first row of each sequence
 * or the mean of its rows (BERT's pooler + classifier, RoBERTa's
 * classifier.dense + out_proj, DistilBERT's pre_classifier + classifier,
 * ModernBERT's head + classifier; model.h's pooler / classifier):
 *   u_s = x_L[first row of s], or mean_t x_L[rows of s] with cfg.pool_mean
 *   pooled_s = act(u_s W_p + b_p)       act = tanh, or ReLU with cfg.head_relu
 *            = LN_p(GELU(u_s W_p + b_p)) when the pooler has a norm (pooler_ln; GELU per cfg.gelu_tanh)
 *   logits_s = pooled_s W_c + b_c
 * Masked LM (LENS_TASK_MASKED_LM), per row (BERT cls.predictions, RoBERTa
 * lm_head, DistilBERT vocab_transform / vocab_layer_norm / vocab_projector):
 *   pre = x W_t + b_t;  act = GELU(pre);  u = LN_mlm(act);  logits = u E^T + b
 * Causal LM (LENS_TASK_CAUSAL_LM), per row of final-normed states (the
 * final norm belongs to the block stack: family->final_forward):
 *   z = x W_lm^T   (lm_head, or the token embeddings E when tied: lens_lm_decoder)
 *   logits = cap tanh(z / cap)   (cfg.final_softcap, Gemma 2; 0 = z) */
#ifndef LENS_HEAD_H
#define LENS_HEAD_H

#include "core/model/arch.h"

/* u[S][C] = what each sequence's classifier reads of x [N][C] (sequence s:
 * rows row_start[s] .. + lengths[s]): its first row, or the mean of its rows. */
void lens_classifier_pool(const lens_model *m, float *u, const float *x, const int *row_start, const int *lengths,
                          int S);
/* dx[N][C] (set) = dL/dx from du[S][C] = dL/du: pooling's backward. */
void lens_classifier_unpool(const lens_model *m, float *dx, const float *du, const int *row_start, const int *lengths,
                            int S);
/* pooled[S][C], logits[S][K] from u[S][C]. */
void lens_classifier_forward(const lens_model *m, float *pooled, float *logits, const float *u, int S,
                             lens_pool *pool);
/* du[S][C] = dL/du (set) from dlogits [S][K] and the forward's u and
 * pooled; dpre [S][C] scratch; weight gradients through g (NULL: none). */
void lens_classifier_backward(const lens_model *m, const lens_grad_map *g, float *du, float *dpre,
                              const float *dlogits, const float *u, const float *pooled, int S);

/* The masked-LM head's intermediate rows: pre is required (forward-only
 * callers' scratch); act, out, mean, rstd may be NULL (computed in place in
 * pre, statistics not kept), the backward needs them all. */
typedef struct {
    float *pre, *act, *out; /* [R][C] */
    float *mean, *rstd;     /* [R] */
} lens_mlm_rows;
/* logits[R][V] from x[R][C]. */
void lens_mlm_forward(const lens_model *m, float *logits, const float *x, int R, const lens_mlm_rows *k,
                      lens_pool *pool);
/* dx[R][C] = dL/dx (set) from dlogits [R][V] (read) and the forward's x
 * and k; dact, dout [R][C] scratch; weight gradients through g (NULL: none). */
void lens_mlm_backward(const lens_model *m, const lens_grad_map *g, float *dx, const float *dlogits, const float *x,
                       const lens_mlm_rows *k, int R, float *dact, float *dout);

/* logits[R][V] of a causal LM from final-normed rows x[R][C]. */
void lens_causal_lm_forward(const lens_model *m, float *logits, const float *x, int R, lens_pool *pool);
/* dx[R][C] = dL/dx (+= with accumulate, else set) from dlogits [R][V],
 * which becomes dL/dz in place (the soft-cap's chain rule reads the
 * forward's logits); weight gradients through g (NULL: none; x then unread). */
void lens_causal_lm_backward(const lens_model *m, const lens_grad_map *g, float *dx, int accumulate, float *dlogits,
                             const float *logits, const float *x, int R, lens_pool *pool);

#endif
