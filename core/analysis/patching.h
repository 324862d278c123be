/* patching.h - activation patching (exact grids) and attribution patching:
 * the objective (attribution.h lens_objective) of a corrupted input with one
 * activation of a clean input of the same length patched in.
 *
 * Grids (l 0..L-1, t 0..T-1, h 0..NH-1):
 *  - resid [L][T]: the residual stream row t at the input of block l
 *    (0 = the embedding output; TransformerLens's resid_pre);
 *  - heads [L][NH]: head h's output at every position: its slice ctx_h =
 *    P_h v_h of the attention output before W_O (TransformerLens's hook_z);
 *    heads_pos [L][NH][T] the same at position t only;
 *  - mlps [L]: what layer l's MLP adds to the residual stream (the forward's
 *    MLP hook, block.h lens_block_io.mlp) at every position; mlps_pos
 *    [L][T] at position t only.
 * F of a patched run, and its normalised effect
 *
 *     e = (F_patched − F_corrupt) / (F_clean − F_corrupt),
 *
 * 0 when the piece carries nothing the corrupt run lacks, 1 when it carries
 * everything (NaN when F_clean = F_corrupt).
 *
 * Exact: every patched run starts at block l from the corrupt run's cached
 * residual stream (the blocks below are the corrupt run's), and the runs of
 * one layer (every grid) go through batched lens_forward passes of copies.
 *
 * Attribution patching (Nanda 2023): one forward and one backward of the
 * corrupt run give ∂F/∂a for every activation a, and
 *
 *     F_patched − F_corrupt ≈ (a_clean − a_corrupt) · ∂F/∂a |_corrupt,
 *
 * summed over the patched rows and channels, normalised as above. It is
 * the first-order term of the exact effect: the two agree as the
 * difference shrinks. docs/patching.md states the conventions. */
#ifndef LENS_PATCHING_H
#define LENS_PATCHING_H

#include "core/analysis/attribution.h"

typedef enum {
    LENS_PATCH_RESID,     /* [L][T] */
    LENS_PATCH_HEADS,     /* [L][NH] */
    LENS_PATCH_HEADS_POS, /* [L][NH][T] */
    LENS_PATCH_MLPS,      /* [L] */
    LENS_PATCH_MLPS_POS,  /* [L][T] */
    LENS_PATCH_GRIDS
} lens_patch_grid;

enum { LENS_PATCH_EXACT = 1, LENS_PATCH_ATTRIBUTION = 2 }; /* methods, or-ed */

typedef struct {
    unsigned grids;                  /* bit g set: grid g (lens_patch_grid); 0 = resid */
    unsigned methods;                /* LENS_PATCH_* bits; 0 = exact */
    int target;                      /* class or token id; -1 = the clean run's prediction */
    const lens_objective *objective; /* NULL = the probability of the target (causal LM: at the last position) */
    const volatile int *cancel;
    lens_pool *pool;
} lens_patching_opts;

typedef struct {
    int n;         /* entries: L*T, L*NH, L*NH*T, L, L*T; 0 = not asked for */
    double *value; /* [n] exact F of the patched runs, NULL unless exact */
    double *effect;      /* [n] exact normalised effect (NaN when clean = corrupt), NULL unless exact */
    double *attribution; /* [n] attribution patching's normalised effect, NULL unless asked for */
} lens_patching_grid;

typedef struct {
    int T, n_layers, n_heads;
    int target;
    lens_objective objective; /* as run (position resolved) */
    double clean, corrupt;    /* F of the clean and of the corrupt run */
    lens_patching_grid grid[LENS_PATCH_GRIDS];
} lens_patching_result;

const char *lens_patch_grid_name(lens_patch_grid g); /* "resid", "heads", "heads_pos", "mlps", "mlps_pos" */

/* clean and corrupt: T token ids each (segment 0). 0, or -1 with err
 * (LENS_EINVAL: a model without a classifier or LM head, a bad target, foil
 * or position). */
int lens_patching_run(const lens_model *m, const int *clean, const int *corrupt, int T, const lens_patching_opts *opts,
                      lens_patching_result *out, lens_err *err);
void lens_patching_result_free(lens_patching_result *r);

#endif
