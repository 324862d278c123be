/* embedding.h - the input embedding of every family, written once and
 * driven by the checkpoint's tables and config, not by the family:
 *
 *   e_t = s · tok[id_t] (+ pos[p_t]) (+ type[seg_t]);   x_t = LN_emb(e_t) or e_t
 *
 *   s      cfg.emb_scale (Gemma: sqrt(C)), 0 = 1
 *   pos    when p.pos_emb (BERT, GPT-2, RoBERTa, DistilBERT; RoPE families have none);
 *          p_t = t, or with cfg.position_offset (RoBERTa, HF's
 *          create_position_ids_from_input_ids) padding_idx + the number of
 *          non-pad tokens up to t for a real token, padding_idx for a pad
 *   type   when p.type_emb (segments; seg NULL = all 0)
 *   LN_emb when p.ln_emb.w (the post-norm encoders)
 *
 * Shapes: T tokens of one sequence, C = d_model. Tables are read in the
 * checkpoint's dtype (p.emb_dtype), widened per row; ids are checked by
 * the caller (lens_forward, the trainer). */
#ifndef LENS_EMBEDDING_H
#define LENS_EMBEDDING_H

#include "core/model/arch.h"

/* x[T][C] = the embedding of ids [T] (type_ids [T] or NULL). With an
 * embedding LayerNorm: its statistics to mean, rstd [T] when not NULL, and
 * the normed input e to pre [T][C] when not NULL (the backward reads it;
 * NULL = normed in place). */
void lens_embed_forward(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *pre,
                        float *mean, float *rstd);

/* Weight gradients of the embedding (accumulated through g, tied tables
 * included) from dx [T][C] = dL/dx, for the forward's ids, type_ids and,
 * with an embedding LayerNorm, its pre, mean, rstd; de [T][C] scratch. */
void lens_embed_backward(const lens_model *m, const lens_grad_map *g, const float *dx, const int *ids,
                         const int *type_ids, int T, const float *pre, const float *mean, const float *rstd,
                         float *de);

#endif
