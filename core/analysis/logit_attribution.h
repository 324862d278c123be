/* logit_attribution.h - direct logit attribution of a decoder: the
 * contribution of the embedding, of every attention head and of every MLP
 * to one logit (or a logit difference) at one position, through the final
 * norm with its scale frozen at the full forward's value (the convention of
 * TransformerLens's residual-stream decomposition, docs/logit-attribution.md).
 *
 * For a pre-norm decoder the residual stream at position p before the final
 * norm is a sum of what each piece wrote into it,
 *
 *     x_L = e + Σ_l (Σ_h o_{l,h} + b_O,l) + Σ_l m_l,   o_{l,h} = Σ_j P^h_pj v^h_j W_O^h,
 *
 * and the final norm is linear in x once its scale r (1 / σ, or 1 / rms)
 * is frozen: f(v) = γ ⊙ (v − mean v) r (RMSNorm: γ ⊙ v r), final(x) = f(x) + β.
 * With u = W_U[target] (− W_U[foil]) the logit (difference) is
 *
 *     logit = f(e)·u + Σ f(o_{l,h})·u + Σ f(m_l)·u + bias,   bias = Σ_l f(b_O,l)·u + β·u,
 *
 * The MLP term of layer l is read as x_{l+1} − x_l − attention output (so a
 * parallel residual's MLP is one too); x_L is kept only through the final
 * norm, whose output minus β is f(x_L) exactly, so the last MLP's term is
 * what the other terms leave of logit − β·u and `total` equals `logit` up
 * to rounding: the check of every term is the PyTorch reference
 * (tests/reference/logit_attribution_reference.py), which computes each
 * piece's own output. Soft-capped logits (Gemma 2) are attributed before
 * the cap.
 *
 * Defined when every block adds its attention output to the residual stream
 * as it is (lens_block_attn_residual, not post-norm) and the model is a
 * causal LM (LENS_ANALYSIS_LOGIT_ATTRIBUTION). */
#ifndef LENS_LOGIT_ATTRIBUTION_H
#define LENS_LOGIT_ATTRIBUTION_H

#include "core/model/model.h"

typedef struct {
    int position;            /* 0..T-1 */
    int target, foil;        /* token ids; foil -1 = none */
    const volatile int *cancel;
    lens_pool *pool;
} lens_dla_opts;

typedef struct {
    int n_layers, n_heads;
    double logit;   /* the model's logit of target (minus foil's) at position, before any soft-cap */
    double total;   /* embed + Σ heads + Σ mlps + bias */
    double embed, bias;
    double *heads;  /* [L][NH] */
    double *mlps;   /* [L] */
} lens_dla_result;

int lens_logit_attribution(const lens_model *m, const int *ids, int T, const lens_dla_opts *opts,
                           lens_dla_result *out, lens_err *err);
void lens_dla_result_free(lens_dla_result *r);

#endif
