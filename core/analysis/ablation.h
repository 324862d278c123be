/* ablation.h - head and MLP ablation: the objective (attribution.h
 * lens_objective) of one sequence with and without a set of attention heads
 * and MLPs knocked out, on any family (encoders and decoders).
 *
 * Ablating head h of layer l replaces its context rows ctx_h = P_h v_h (the
 * head's input to the attention output map, so its output ctx_h W_O^h) at
 * every position by
 *  - zero: 0 (the output bias b_O stays: it is no head's), as HF head_mask = 0;
 *  - mean: the mean of ctx_h over the reference rows (every position of the
 *    request, or of the reference sequences), the same vector at every position.
 * Ablating the MLP of layer l replaces what it adds to the residual stream
 * (after its down projection, and after a post-MLP norm where the family has
 * one; a post-norm block's sum goes on into its norm) by zero or by its mean
 * over the reference rows. Everything else, and every layer above, is
 * recomputed (lens_forward_opts head_mask / head_fill / mlp_mask / mlp_fill).
 * docs/ablation.md states the conventions. */
#ifndef LENS_ABLATION_H
#define LENS_ABLATION_H

#include "core/analysis/attribution.h"

typedef enum { LENS_ABLATE_ZERO = 0, LENS_ABLATE_MEAN = 1 } lens_ablate_mode;

typedef struct {
    const unsigned char *heads; /* [L][NH]: 1 = ablate; NULL = no head */
    const unsigned char *mlps;  /* [L]: 1 = ablate; NULL = no MLP */
    lens_ablate_mode mode;
    /* mean: the reference sequences (packed ids, their lengths); n_ref 0 = the request's own positions */
    const int *ref_ids;
    const int *ref_lengths;
    int n_ref;
    int target;                      /* class or token id; -1 = the clean run's prediction */
    const lens_objective *objective; /* NULL = the probability of the target (causal LM: at the last position) */
    const volatile int *cancel;
    lens_pool *pool;
} lens_ablation_opts;

typedef struct {
    int K;                    /* outputs: classes, or the vocabulary */
    int target, predicted;    /* predicted: the clean run's argmax */
    lens_objective objective; /* as run (position resolved) */
    double clean, ablated;    /* the objective without and with the ablation */
    float *logits_clean, *logits_ablated; /* [K] at the objective's row */
} lens_ablation_result;

/* ids, type_ids (NULL = segment 0) of T tokens. Returns 0, or -1 with err
 * (LENS_EINVAL: a bad target, foil or position, an empty reference). */
int lens_ablation_run(const lens_model *m, const int *ids, const int *type_ids, int T, const lens_ablation_opts *opts,
                      lens_ablation_result *out, lens_err *err);
void lens_ablation_result_free(lens_ablation_result *r);

#endif
