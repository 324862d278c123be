/* patching.h - activation patching of the residual stream (exact grid):
 * the objective (attribution.h lens_objective) of a corrupted input with
 * one residual-stream row of a clean input of the same length patched in.
 *
 * For every layer l (0..L-1: the input of block l, 0 = the embedding
 * output; TransformerLens's resid_pre) and position t, run the corrupt
 * sequence with x_l[t] replaced by the clean run's x_l[t] and every block
 * from l on recomputed; F_lt is the objective of that run, and its
 * normalised effect
 *
 *     e_lt = (F_lt − F_corrupt) / (F_clean − F_corrupt),
 *
 * 0 when the row carries nothing the corrupt run lacks, 1 when it carries
 * everything (NaN when F_clean = F_corrupt). The T patched runs of one layer
 * are one batched lens_forward of T copies (lens_forward_opts patch_*).
 * docs/patching.md states the conventions. */
#ifndef LENS_PATCHING_H
#define LENS_PATCHING_H

#include "core/analysis/attribution.h"

typedef struct {
    int target;                      /* class or token id; -1 = the clean run's prediction */
    const lens_objective *objective; /* NULL = the probability of the target (causal LM: at the last position) */
    const volatile int *cancel;
    lens_pool *pool;
} lens_patching_opts;

typedef struct {
    int T, n_layers;
    int target;
    lens_objective objective; /* as run (position resolved) */
    double clean, corrupt;    /* F of the clean and of the corrupt run */
    double *value;            /* [L][T] F_lt */
    double *effect;           /* [L][T] e_lt (NaN when clean = corrupt) */
} lens_patching_result;

/* clean and corrupt: T token ids each (segment 0). 0, or -1 with err
 * (LENS_EINVAL: a model without a classifier or LM head, a bad target, foil
 * or position). */
int lens_patching_resid(const lens_model *m, const int *clean, const int *corrupt, int T,
                        const lens_patching_opts *opts, lens_patching_result *out, lens_err *err);
void lens_patching_result_free(lens_patching_result *r);

#endif
