/* head_importance.h - head importance over a labelled dataset and the head
 * pruning curve (Hao et al., AAAI 2021, section 4.2 / figure 3).
 *
 * For a BERT sequence classifier and examples (ids, label):
 *  - attribution importance I_h = max_ij Attr_h[i][j] (core/analysis/attribution.h,
 *    target = the gold label or the predicted class, opts.target_gold), averaged
 *    over the examples (the released code sums; the order is the same);
 *  - attention-score importance (the paper's baseline) S_h = max_ij A_h[i][j],
 *    the largest attention probability of head h, averaged over the examples;
 *  - accuracy after pruning floor or round(f * L * NH) heads (opts.prune_floor) for f = 0, 0.1, .., 1:
 *    the least important heads first (ascending importance, ties by the
 *    lower layer * NH + head index) for each importance, and in a random
 *    order (Fisher-Yates with xorshift64*, seeds seed .. seed + n_seeds - 1),
 *    averaged over the seeds. A pruned head has zero attention probabilities
 *    and zero output (lens_forward_opts.head_mask). docs/attribution.md. */
#ifndef LENS_HEAD_IMPORTANCE_H
#define LENS_HEAD_IMPORTANCE_H

#include "core/analysis/attribution.h"

typedef struct {
    const int *ids;      /* [T] */
    const int *type_ids; /* [T] or NULL */
    int T;
    int label;           /* gold class index */
} lens_example;

typedef struct {
    int steps;                  /* attribution steps or nodes; 0 = the quadrature's default */
    lens_riemann riemann;
    lens_quadrature quadrature; /* default riemann (attribution.h) */
    int target_gold;            /* 1: attribute towards the gold label, as the released
                                 * examples/prune_head_with_attr.py (attattr); 0: the predicted class */
    int prune_floor;            /* 1: prune floor(f * L * NH) heads (the released int(prune_rate * L * NH));
                                 * 0: round(f * L * NH) */
    int n_seeds;                /* random orders averaged; 0 = 3 */
    unsigned long long seed;    /* first seed; 0 = 1 */
    lens_pool *pool;            /* forward-pass threads; NULL = the caller */
    const volatile int *cancel; /* non-zero stops with LENS_ECANCEL */
    void (*progress)(void *user, double fraction);
    void *progress_user;
    /* Sharding (lensd job run / merge, docs/operations.md). LENS_HEAD_EXAMPLES
     * computes only the examples e with e % shard_count == shard_index and
     * stores their per-head maxima in example_attr / example_attn [n][L*NH]
     * (out gets no importance and no curve); LENS_HEAD_FINISH reads every
     * example's maxima from those arrays and computes the means and the
     * pruning curve. Summing in example order either way makes both stages
     * give bit for bit what LENS_HEAD_ALL (0, the default) gives. */
    int stage;
    int shard_index, shard_count;
    double *example_attr, *example_attn;
} lens_head_opts;

enum { LENS_HEAD_ALL = 0, LENS_HEAD_EXAMPLES = 1, LENS_HEAD_FINISH = 2 };

#define LENS_PRUNE_POINTS 11 /* 0%, 10%, .., 100% */

typedef struct {
    int n_layers, n_heads, n_examples;
    float *attr_importance; /* [L][NH] mean over examples of max_ij Attr */
    float *attn_importance; /* [L][NH] mean over examples of max_ij A */
    int n_pruned[LENS_PRUNE_POINTS];
    double fraction[LENS_PRUNE_POINTS];
    double acc_attr[LENS_PRUNE_POINTS], acc_attn[LENS_PRUNE_POINTS];
    double acc_random[LENS_PRUNE_POINTS]; /* mean over the seeds */
    int n_seeds;
} lens_head_importance;

int lens_head_importance_run(const lens_model *m, const lens_example *ex, int n, const lens_head_opts *opts,
                             lens_head_importance *out, lens_err *err);
void lens_head_importance_free(lens_head_importance *h);

/* Predicted class of every example with heads masked by mask ([L][NH], 0 =
 * pruned; NULL = none) into pred[n]; *accuracy = fraction equal to label. */
int lens_head_accuracy(const lens_model *m, const lens_example *ex, int n, const unsigned char *mask,
                       lens_pool *pool, const volatile int *cancel, int *pred, double *accuracy, lens_err *err);

/* Heads pruned at fraction f of H: floor (the released code) or round. */
int lens_heads_pruned(double f, int L, int NH, int floor_count);

/* Pruning order: heads [L*NH] ascending by importance (ties: lower index). */
void lens_head_order(const float *importance, int H, int *order);
/* A random permutation of 0..H-1 from seed (xorshift64*, Fisher-Yates). */
void lens_head_shuffle(unsigned long long seed, int H, int *order);

#endif
