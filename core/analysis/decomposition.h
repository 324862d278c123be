/* decomposition.h - position / context / residual decomposition of hidden
 * states (Song & Zhong 2023, "Uncovering hidden geometry in Transformers via
 * disentangling position and context").
 *
 * For W windows (contexts) of T tokens and one layer's hidden states
 * h[c][t] in R^C, over the P kept positions (P = T - 1 when position 0 is
 * dropped, as the paper does):
 *   mu     = mean over c, t of h[c][t]                      [C]
 *   pos[t] = mean over c of h[c][t] - mu                    [P][C]
 *   ctx[c] = mean over t of h[c][t] - mu                    [W][C]
 *   resid[c][t] = h[c][t] - mu - pos[t] - ctx[c]            [W][P][C]
 * The design is balanced, so the four parts are orthogonal as W*P x C
 * matrices and sum(|h|^2) = W*P*|mu|^2 + W*sum|pos|^2 + P*sum|ctx|^2 +
 * sum|resid|^2.
 *
 * Streaming: lens_decomp_add runs the forward pass over windows in batches and
 * keeps per layer only sum_c h[c][t] [P][C], the C x C Gram matrix sum h h^T,
 * sum |h|^2 and the per-window means [W][C]; lens_decomp_finish derives every
 * metric from these (docs/decomposition.md has the derivations). Memory is
 * O(L (P C + C^2)) plus W*C floats per layer for the context means. */
#ifndef LENS_DECOMPOSITION_H
#define LENS_DECOMPOSITION_H

#include <stddef.h>

#include "core/base/err.h"
#include "core/io/partial.h"
#include "core/model/model.h"
#include "core/io/tokenizer.h"

#define LENS_DECOMP_DEFAULT_TOP_K 10       /* principal angles between top-k subspaces */
#define LENS_DECOMP_DEFAULT_BATCH_TOKENS 2048 /* tokens per lens_forward call */
#define LENS_DECOMP_SCREENOT_K 20           /* rank bound of the released Table 1 (metrics.py screenNOT) */

typedef struct {
    int keep_first_position; /* 0 (default, as the paper): position 0 is left out of every statistic */
    int top_k;               /* subspace size for principal angles; 0 -> LENS_DECOMP_DEFAULT_TOP_K */
    int batch_tokens;        /* windows per forward call = max(1, batch_tokens / T); 0 -> default */
    int causal;              /* run a BERT model with a causal mask, as the paper does
                              * (lens_forward_opts.causal); GPT-2 is always causal. */
    lens_pool *pool;         /* threads for the forward pass (core/base/pool.h); NULL = calling thread */
    const volatile int *cancel; /* optional: checked between batches and layers -> LENS_ECANCEL */
    void (*progress)(void *user, long windows_done, long windows_total); /* after each batch */
    void *progress_user;
    long windows_total;      /* passed to progress; 0 when unknown */
    /* Definition choices (docs/decomposition.md, docs/reproducing.md). */
    int topics_self_pairs;   /* 1: the within-label mean includes the W pairs a == b (cos 1), as the released
                              * avg_similarity_within(_NoPCA) of uncover-hidden-geometry src/utils/metrics.py */
    int topics_pca;          /* > 0: cosines of ctx projected on its top topics_pca principal axes (the released
                              * avg_similarity_within / _between use 20); 0: raw ctx */
    int screenot_k;          /* ScreeNOT rank bound k; 0 -> LENS_DECOMP_SCREENOT_K; the rank is -1 when
                              * 2k + 1 >= min(P, C) (the imputation needs it) */
    /* Optional: pos and mu of another run (same layers, T and first position): the metrics of pos use
     * reference->layers[l].pos and ctx[c] = mean_t h[c][t] - reference mu, as the released topic and
     * Table 1 runs take them from a larger corpus. Shares, the resid norm and the denominator
     * |H - mean(H)|_op stay those of these windows. Not owned. */
    const struct lens_decomp_result *reference;
    /* Sharding (lensd job run / merge, docs/operations.md): with shard_count
     * > 1, lens_decomp_add accumulates only the batches b (windows
     * [b B, (b + 1) B) of the call, B windows a batch) with b % shard_count ==
     * shard_index, and takes the shift from batch 0 even when batch 0 is
     * another shard's. Every shard then sees exactly the rows and the float
     * Gram blocks of a single run; a merge (lens_decomp_import) only adds
     * double sums in another order. */
    int shard_index, shard_count;
} lens_decomp_opts;

typedef struct {
    int layer;               /* hidden-state index: 0 = embedding output .. L (GPT-2: after ln_f, as HF) */
    /* Shares of sum |h|^2 over the kept tokens; they sum to 1. */
    double share_mean, share_pos, share_ctx, share_resid;
    /* |X|_op / |H - mu|_op with X the W*P x C matrix of pos tiled over
     * windows, ctx tiled over positions, or resid; H - mu likewise. */
    double norm_pos, norm_ctx, norm_resid;
    double pos_stable_rank;  /* sum s^2 / s_1^2 over the singular values s of pos [P][C] */
    double pos_explained_k2, pos_explained_k10;       /* sum_{i<k} s_i / sum s_i (paper) */
    double pos_explained_k2_sq, pos_explained_k10_sq; /* sum_{i<k} s_i^2 / sum s_i^2 */
    int pos_screenot_rank;   /* ScreeNOT (Donoho-Gavish-Romanov, imputation) rank of pos; -1: P too small */
    double pos_screenot_threshold;  /* its singular value threshold */
    double pos_explained_screenot;  /* sum_{i<r} s_i / sum s_i at that rank (released Table 1); 0 when r = -1 */
    float *pos_pca;          /* [P][2] coordinates on the top-2 principal axes (u_i s_i); the sign makes
                              * each column's entry of largest magnitude positive */
    double pos_smoothness;   /* share of the 2-D DCT-II energy of cos(pos_i, pos_j) in the lowest
                              * ceil(P/10) x ceil(P/10) frequencies */
    double max_abs_cos, mean_abs_cos; /* |cos(pos_t, ctx_c)| over all t, c */
    int n_angles;
    double *principal_angles_deg;     /* [n_angles] ascending, between top-k right singular subspaces */
    /* With labels: mean |cos(ctx_a, ctx_b)| over pairs a < b of equal / different label
     * (0 when there is no such pair; the counts say). */
    double topics_within, topics_between;
    long topics_within_pairs, topics_between_pairs;
    double *mean;            /* mu [C] */
    double *pos;             /* [P][C] */
} lens_decomp_layer;

typedef struct lens_decomp_result {
    int n_layers;            /* selected layers */
    lens_decomp_layer *layers;
    long n_windows;          /* W */
    int T, P, first_position, d_model;
    int has_labels;
} lens_decomp_result;

typedef struct lens_decomp lens_decomp;

/* layers: hidden-state indices in [0, L], or NULL / n_layers 0 for all L+1.
 * T: window length, 2..max_positions (P = T - 1 >= 1 when position 0 is dropped).
 * opts may be NULL. Returns NULL and fills err on failure. */
lens_decomp *lens_decomp_begin(const lens_model *m, int T, const int *layers, int n_layers,
                               const lens_decomp_opts *opts, lens_err *err);

/* Accumulate n_windows windows ids[n_windows][T] with optional labels
 * [n_windows] (every call must pass labels, or none). Runs lens_forward in
 * batches; a cancelled or failed call leaves the windows of completed batches
 * accumulated. */
int lens_decomp_add(lens_decomp *acc, const int *ids, const int *labels, int n_windows, lens_err *err);

long lens_decomp_windows_done(const lens_decomp *acc);

/* Metrics of every selected layer (needs W >= 2 windows and P >= 2).
 * res is filled on success; free it with lens_decomp_result_free. */
int lens_decomp_finish(lens_decomp *acc, lens_decomp_result *res, lens_err *err);

void lens_decomp_free(lens_decomp *acc);

/* The accumulated state (shift, position sums, Gram, sum of squares per
 * layer; each window's context mean, global index and label) into p's tensors,
 * names prefixed by prefix. */
int lens_decomp_export(const lens_decomp *acc, lens_partial *p, const char *prefix, lens_err *err);
/* Adds an exported state into acc (begun with the same T and layers, no
 * windows of its own); windows_total is the run's W. Shifts must agree bit for
 * bit, a window may come once. After every shard, lens_decomp_complete checks
 * that each window 0..W-1 came, then lens_decomp_finish as usual. */
int lens_decomp_import(lens_decomp *acc, const lens_partial *p, const char *prefix, long windows_total,
                       lens_err *err);
int lens_decomp_complete(lens_decomp *acc, lens_err *err);
void lens_decomp_result_free(lens_decomp_result *res);

/* Texts -> windows. Each text is tokenized without special tokens ([CLS] /
 * [SEP] are dropped; GPT-2 adds none), the token lists are concatenated in
 * order and cut into consecutive windows of T; the tail shorter than T is
 * dropped. With labels [n_texts], the stream restarts whenever the label
 * changes, so no window spans two labels, and *labels_out [n_windows] gives
 * each window's label (NULL without labels). lens may be NULL (strlen).
 * *ids_out is [n_windows][T]; caller frees both. Zero windows is not an error. */
int lens_decomp_windows_from_texts(const lens_tokenizer *tok, const char *const *texts, const size_t *lens,
                                   const int *labels, int n_texts, int T, int **ids_out, int **labels_out,
                                   int *n_windows, lens_err *err);

/* The decomposition of an in-memory tensor h[W][P][C] (for tests and small
 * inputs): mu [C], pos [P][C], ctx [W][C], resid [W][P][C] (resid may be NULL). */
/* ScreeNOT (Donoho, Gavish & Romanov 2023, adaptive hard thresholding with
 * the imputation strategy): sv [n] singular values in descending order of a
 * rows x cols matrix (n = min(rows, cols)), k the rank bound. Returns the
 * number of sv above the threshold (*threshold), or -1 when 2k + 1 >= n. */
int lens_screenot(const double *sv, int n, int rows, int cols, int k, double *threshold);

/* Each window's context mean on the top k principal axes of the context
 * means (the dashboard's "context means coloured by topic"), per selected
 * layer. For W windows (in the accumulator's order, which is the run's
 * after lens_decomp_complete) and X [W][C] the context means minus their
 * mean: coords [W][k] = X V_k with V_k the top k right singular vectors
 * (sign: each column's entry of largest magnitude positive), share [k] =
 * s_i^2 / |X|_F^2, the part of the context means' variance on axis i. */
typedef struct {
    int layer;       /* hidden-state index */
    int k;           /* min(k asked, W - 1, C) */
    long W;
    float *coords;   /* [W][k] */
    double *share;   /* [k] descending */
    long *window;    /* [W] each row's window index in the run */
    int *label;      /* [W] label index, NULL without labels */
} lens_decomp_ctx_pca;

/* One lens_decomp_ctx_pca per selected layer (free with
 * lens_decomp_ctx_pca_free(p, n_layers)); NULL and err on failure. Needs W >= 2. */
lens_decomp_ctx_pca *lens_decomp_ctx_pca_compute(const lens_decomp *acc, int k, lens_err *err);
void lens_decomp_ctx_pca_free(lens_decomp_ctx_pca *p, int n_layers);

void lens_decomp_components(const float *h, int W, int P, int C, double *mu, double *pos, double *ctx,
                            double *resid);

#endif
