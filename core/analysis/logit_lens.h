/* logit_lens.h - the logit lens (nostalgebraist 2020, "interpreting GPT: the
 * logit lens"; TransformerLens' accumulated-residual readout): a hidden
 * state of any layer read out through the model's final norm and LM head as
 * if it were the last layer's.
 *
 * For rows x[R][C] of hidden layer l (0 = embedding output .. L):
 *   GPT-2 (causal LM): logits = LN_f(x) E^T      (layer L is already LN_f'd:
 *                                                  read as is, equal to the model's logits)
 *   other causal LMs:  the family's final norm (RMSNorm for Llama-style), then
 *                      the causal-LM head (head.h: lm_head or tied E, Gemma 2's final soft-cap)
 *   BERT (masked LM):  logits = LN_mlm(GELU(x W_t + b_t)) E^T + b_dec
 *                      (post-LN blocks: every layer's output is already normalized)
 * E is the tied token embedding [V][C]. Only models with an LM head
 * (LENS_TASK_MASKED_LM, LENS_TASK_CAUSAL_LM) have a readout. */
#ifndef LENS_LOGIT_LENS_H
#define LENS_LOGIT_LENS_H

#include "core/base/err.h"
#include "core/model/model.h"

/* 1 when m has an LM head to read through. */
int lens_has_lm_head(const lens_model *m);

/* logits[R][V] for rows x[R][C] (copied; x is not changed) of hidden layer
 * `layer`. Fails with LENS_EINVAL for a model without an LM head,
 * LENS_ENOMEM when scratch cannot be allocated. */
int lens_logit_lens(const lens_model *m, const float *x, int R, int layer, float *logits, lens_pool *pool,
                    lens_err *err);

#endif
