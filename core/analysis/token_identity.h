/* token_identity.h - token identifiability (Brunner et al. 2020, sec. 4).
 *
 * Paper: G. Brunner, Y. Liu, D. Pascual, O. Richter, M. Ciaramita,
 * R. Wattenhofer, "On Identifiability in Transformers", ICLR 2020.
 *
 * For one sequence of T tokens with hidden states h^l [T][C] (h^0 = the
 * embedding output, as lens_forward keeps it), the hidden vector h^l_i is
 * identified when, among the sentence's layer-0 vectors {h^0_j}, the nearest
 * one to g(h^l_i) is h^0_i. g is the identity (mapping "identity") or a
 * learned linear map g_l(h) = h W_l + b_l fitted by ridge least squares from
 * layer l to layer 0 over a corpus (mapping "linear", lens_ti_fit).
 *
 * rank_i = 1 + #{j : score(q_i, c_j) strictly better than score(q_i, c_own)};
 * rank 1 = identified (ties count in the token's favour). Cosine scores are
 * invariant to scaling q or the candidates; L2 uses the Euclidean distance.
 * Optionally the query is also ranked against the whole input embedding
 * table tok_emb [V][C] with own = the token's id (a vocabulary ranking like
 * ecco's; O(T·V·C) per layer, docs/token-identity.md has the cost).
 *
 * Shapes: T tokens, C = d_model, L layers, V vocabulary. */
#ifndef LENS_TOKEN_IDENTITY_H
#define LENS_TOKEN_IDENTITY_H

#include <stddef.h>

#include "core/base/err.h"
#include "core/model/model.h"
#include "core/base/pool.h"

typedef enum { LENS_TI_COSINE = 0, LENS_TI_L2 = 1 } lens_ti_metric;

/* Learned maps g_l for l = 0..L (g_0 is fitted too: a sanity check that
 * should identify every token). */
typedef struct {
    int n_layers;          /* L + 1 */
    int C;
    float *w;              /* [L+1][C][C]: g_l(h) = h W_l + b_l (row vector h) */
    float *b;              /* [L+1][C] */
    double ridge;          /* the relative ridge the maps were fitted with (lens_ti_fit_opts) */
    lens_ti_metric metric; /* metric of the rates below */
    long train_tokens, heldout_tokens;
    double model_fingerprint; /* a checksum of the model's embeddings: load refuses maps of another model */
    float *train_rate;     /* [L+1] identification rate with the map on the training sequences */
    float *heldout_rate;   /* [L+1] on the held-out sequences (NaN when there were none) */
    float *identity_heldout_rate; /* [L+1] the same held-out tokens without a map (NaN when none) */
} lens_ti_maps;

/* Rank each query row against candidate rows: query [T][C], cand [n_cand][C],
 * own[i] the index of query i's own candidate. rank [T] (1 = identified);
 * neighbors [T][top_k] candidate indices, best first (top_k may be 0,
 * neighbors NULL; top_k > n_cand is clamped, extra slots -1). */
int lens_ti_rank(const float *query, int T, const float *cand, int n_cand, int C, lens_ti_metric metric,
                 const int *own, int top_k, int *rank, int *neighbors, lens_pool *pool, lens_err *err);

typedef struct {
    lens_ti_metric metric;
    int top_k;                 /* neighbours reported per token (0 = none) */
    const int *layers;         /* 0..L; NULL = all of 0..L */
    int n_layers;
    const lens_ti_maps *maps;  /* non-NULL: rank g_l(h^l_i) (mapping "linear"); must match the model */
    int vocabulary;            /* also rank against the whole input embedding table */
    lens_pool *pool;
    const volatile int *cancel;
} lens_ti_opts;

typedef struct {
    int layer;
    float rate;                   /* fraction of tokens with rank 1 */
    float rate_excluding_special; /* over the tokens with special[i] == 0 (NaN when there are none) */
    int *rank;                    /* [T] */
    int *neighbors;               /* [T][top_k] token indices, best first */
    /* vocabulary ranking (opts.vocabulary), else NULL / NaN */
    int *vocab_rank;              /* [T] rank of the token's own id among V */
    int *vocab_neighbors;         /* [T][top_k] token ids, best first */
    float vocab_rate;
} lens_ti_layer;

typedef struct {
    int T, top_k, n_layers;
    lens_ti_layer *layers;
} lens_ti_result;

/* Rankings for one sequence (ids [T], type_ids [T] or NULL; special [T] or
 * NULL = none special): one forward pass keeping hidden states, then
 * lens_ti_rank per requested layer. */
int lens_token_identity(const lens_model *m, const int *ids, const int *type_ids, const unsigned char *special,
                        int T, const lens_ti_opts *opts, lens_ti_result *out, lens_err *err);
void lens_ti_result_free(lens_ti_result *r);

/* ------------------------------------------------------------ learned maps */

#define LENS_TI_DEFAULT_RIDGE 1e-3

typedef struct {
    double ridge;              /* λ = ridge · trace(XᵀX) / C on the centred features; 0 -> LENS_TI_DEFAULT_RIDGE */
    lens_ti_metric metric;     /* for the reported rates */
    int batch_tokens;          /* tokens per forward call; 0 -> 2048 */
    lens_pool *pool;
    const volatile int *cancel;
    void (*progress)(void *user, double fraction);
    void *progress_user;
} lens_ti_fit_opts;

/* Fit g_l for every layer from the sequences of train (a lens_batch of many
 * sequences, run in chunks of about batch_tokens), then report the rates on
 * train and heldout (heldout may be NULL or have no sequences). The normal
 * equations are accumulated in double over all tokens and solved with
 * LAPACKE (Cholesky). */
int lens_ti_fit(const lens_model *m, const lens_batch *train, const lens_batch *heldout,
                const lens_ti_fit_opts *opts, lens_ti_maps *out, lens_err *err);

/* The stages of lens_ti_fit, for fits sharded over processes (lensd job,
 * docs/operations.md). G [L+1][C+1][C+1] (upper triangle) and XY
 * [L+1][C+1][C] are the normal equations Σ [x,1]ᵀ[x,1] and Σ [x,1]ᵀ y of
 * each layer; accumulate adds train's tokens to them (zero them first), so
 * the sums over disjoint sets of sequences add. solve allocates out with the
 * maps (rates NaN, token counts 0). count adds to hits [L+1] the tokens of b
 * identified through maps, and to hits_identity [L+1] (may be NULL) those
 * identified without a map; set_rates turns counts into out's rates over its
 * train_tokens / heldout_tokens. Progress is each call's own fraction. */
int lens_ti_accumulate(const lens_model *m, const lens_batch *train, const lens_ti_fit_opts *opts, double *G,
                       double *XY, lens_err *err);
int lens_ti_solve(const lens_model *m, const double *G, const double *XY, const lens_ti_fit_opts *opts,
                  lens_ti_maps *out, lens_err *err);
int lens_ti_count(const lens_model *m, const lens_batch *b, const lens_ti_maps *maps, const lens_ti_fit_opts *opts,
                  long *hits, long *hits_identity, lens_err *err);
void lens_ti_set_rates(lens_ti_maps *maps, const long *train_hits, const long *heldout_hits,
                       const long *identity_heldout_hits);

/* g_l applied to rows h [T][C] -> out [T][C]. */
void lens_ti_apply(const lens_ti_maps *maps, int layer, const float *h, int T, float *out);

/* Safetensors file with tensors "layer.{l}.weight" [C][C], "layer.{l}.bias"
 * [C], the rates and the model fingerprint; load checks L, C and the
 * fingerprint against m (maps of another model of the same shape are
 * refused with LENS_EFORMAT). */
#define LENS_TI_MAPS_FILE "token_identity_maps.safetensors"
int lens_ti_maps_save(const lens_ti_maps *maps, const char *path, lens_err *err);
int lens_ti_maps_load(const char *path, const lens_model *m, lens_ti_maps *out, lens_err *err);
void lens_ti_maps_free(lens_ti_maps *maps);

#endif
