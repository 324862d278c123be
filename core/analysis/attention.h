/* attention.h - effective attention and attention identifiability.
 *
 * Brunner et al., "On Identifiability in Transformers" (ICLR 2020): a head
 * outputs A V, so any A + Δ with Δ V = 0 gives the same output; effective
 * attention removes from each row of A its component in the left null space
 * of V (projects the row onto col(V)). Bhardwaj et al., "More Identifiable
 * yet Equally Performant Transformers for Text Classification" (ACL 2021):
 * the alternatives must also keep rows stochastic and come from a softmax of
 * query . key, which shrinks the null space. Formulas, tolerances and limits
 * are in core/analysis/attention.c and docs/identifiability.md.
 *
 * Shapes: T tokens of one (unpadded) sequence, DV / DK per-head value / key
 * size, L layers, NH heads. Matrices are row-major float32; the linear
 * algebra runs in double. */
#ifndef LENS_ATTENTION_H
#define LENS_ATTENTION_H

#include <stdatomic.h>

#include "core/base/err.h"
#include "core/model/model.h"
#include "core/base/pool.h"

/* Key-aware local dimension: computed from explicit matrices while the
 * unknowns T * DK stay within this (default) limit. */
#define LENS_ATTN_KEY_AWARE_MAX_UNKNOWNS 1024

typedef enum {
    LENS_KEY_AWARE_OFF = 0,      /* not asked for */
    LENS_KEY_AWARE_EXPLICIT,     /* rank(J) - rank(M J) from explicit matrices */
    LENS_KEY_AWARE_CLOSED_FORM,  /* rank(Q) = T: sum over rows of |supp a_i| - rank([V_supp, 1]) */
    LENS_KEY_AWARE_SKIPPED       /* over the size limit; key_aware_note says why */
} lens_key_aware_method;

const char *lens_key_aware_method_name(lens_key_aware_method m); /* "explicit", ... */

typedef struct {
    int null_component;          /* also produce null = raw - effective */
    int key_aware;               /* compute the key-aware local dimension (needs Q) */
    int key_aware_max_unknowns;  /* 0: LENS_ATTN_KEY_AWARE_MAX_UNKNOWNS */
    int key_aware_dense;         /* 1: rank(J), rank(M J) by dgesdd on the explicit matrices (the method
                                  * before the Gram/inertia one; kept as the benchmark's peer) */
    const volatile int *cancel;  /* optional: non-zero stops the head with LENS_ECANCEL (checked per head,
                                  * per row of the closed form, between the factorisations) */
} lens_attention_opts;

/* Everything reported for one head. Numbers a head could not produce are -1
 * (integers) or NAN (doubles). */
typedef struct {
    int ok;                 /* 0: this head failed, err says why; the others still count */
    lens_err err;
    int T, DV, DK;
    int causal;
    /* Brunner */
    int rank;               /* rank(V) over the last row's keys: all T (encoder, causal) or the last W
                               rows of a sliding window; its own tolerance there */
    int null_dim;           /* keys - rank (keys: T, or W in a sliding window) */
    int identifiable;       /* rank == keys */
    double sigma_max, tol;  /* largest singular value of the full V, tol = sigma_max * eps_f32 * max(T, DV)
                               (the effective rows' tolerance) */
    /* Row-stochastic refinement */
    int rank_v1;            /* rank([V, 1]) over the same keys */
    int stochastic_null_dim;/* keys - rank([V, 1]): alternatives Δ with Δ V = 0, Δ 1 = 0 (per query row) */
    /* Key-aware local dimension (Bhardwaj et al.) */
    lens_key_aware_method key_aware_method;
    int key_aware_dim;      /* dim{J(δK) : J(δK) V = 0}, -1 unless computed */
    int key_aware_unknowns; /* T * DK */
    int rank_q;             /* rank(Q) (-1 when Q was not used) */
    int rank_j, rank_mj;    /* explicit method: rank(J), rank(M J); else -1 */
    char key_aware_note[160];
    /* Statistics, raw vs effective */
    double pearson;         /* over the entries rows may attend (all T*T; causal: j <= i; window W: i-W < j <= i);
                               NAN if a side is constant */
    double special_mass_raw, special_mass_effective; /* mean_i sum_{j special} A[i][j]; NAN without a mask */
    double punct_mass_raw, punct_mass_effective;
    double max_identity_residual; /* max_i ||(A_eff - A)_i V_i|| / ||A V||_F, a self-check */
} lens_head_attention;

/* One head.
 *   A         [T][T] row-stochastic attention probabilities (causal: zero above the diagonal)
 *   V         [T][DV] with row stride ldv (a head's columns of the [T][NH*DV] value matrix)
 *   Q         [T][DK] with row stride ldq (queries, before the 1/sqrt(DK) scale); may be
 *             NULL when opts->key_aware is 0
 *   window    0, or the layer's sliding window W (lens_layer_window): each row projects
 *             onto the values of the keys of its band (scores.h lens_key_band: causal
 *             i - W + 1 .. i; without causal |i - j| <= W / 2, ModernBERT), not the prefix
 *   special, punct  [T] token masks (1 = special / punctuation), or NULL
 *   effective [T][T] out (may be NULL), null [T][T] out (may be NULL; raw - effective)
 * Returns 0, or -1 with err filled (also copied to res->err) when this head's
 * computation failed (bad arguments, out of memory, LAPACK info != 0). */
int lens_attention_head(const float *A, const float *V, int ldv, const float *Q, int ldq, int T, int DV, int DK,
                        int causal, int window, const unsigned char *special, const unsigned char *punct,
                        const lens_attention_opts *opts, float *effective, float *null, lens_head_attention *res,
                        lens_err *err);

/* Only the effective matrix and rank(V): the fast path the benchmark times.
 * effective [T][T] out; *rank out (may be NULL). */
int lens_attention_effective(const float *A, const float *V, int ldv, int T, int DV, int causal, int window,
                             float *effective, int *rank, lens_err *err);

/* special / punct masks of a token sequence: for encoders the tokenizer's
 * special tokens (lens_tokenizer_is_special: [CLS], [SEP], [PAD], [MASK],
 * [UNK], ...); GPT-2 the first token (the attention sink); punctuation: the piece without
 * "##" / "Ġ" is non-empty and only Unicode punctuation (P*) characters. */
void lens_attention_token_masks(const lens_model *m, const int *ids, int T, unsigned char *special,
                                unsigned char *punct);

typedef struct {
    const int *layers; int n_layers;   /* 1..L; NULL = all */
    const int *heads; int n_heads;     /* 0..NH-1; NULL = all */
    const unsigned char *special, *punct; /* [T] or NULL (then lens_attention_token_masks is used when ids given) */
    const int *ids;                    /* [T] token ids of the sequence, optional (for the masks) */
    int want_effective;                /* store effective matrices */
    int verify_scores;                 /* recompute softmax(Q K^T / sqrt(DK)) and report max |diff| vs kept A */
    lens_attention_opts head;
    lens_pool *pool;                   /* heads of a layer run as tasks of this pool; NULL = in order on the caller */
    atomic_int *heads_done;            /* optional: incremented as each head finishes ok (progress for a watcher) */
} lens_attention_request;

typedef struct {
    int T, n_layers, n_heads;  /* selected counts */
    int *layers, *heads;       /* [n_layers] 1-based, [n_heads] */
    lens_head_attention *head; /* [n_layers][n_heads] */
    float *effective;          /* [n_layers][n_heads][T][T] when asked for, else NULL */
    float *null;               /* same, when head.null_component */
    double scores_max_diff;    /* verify_scores: max |softmax(QK^T/sqrt DK) - A|, else NAN */
    int n_failed;              /* heads with ok == 0 */
} lens_attention_result;

/* All selected heads of sequence seq. act must keep LENS_KEEP_ATTN and
 * LENS_KEEP_VALUES, and LENS_KEEP_HIDDEN when queries are needed (key-aware
 * dimension, verify_scores). Fails for bad requests, missing memory, or
 * req->head.cancel set (LENS_ECANCEL: checked per layer, per head and inside
 * the key-aware step); a head whose linear algebra fails is reported in its
 * own entry. */
int lens_attention_analyze(const lens_model *m, const lens_activations *act, int seq,
                           const lens_attention_request *req, lens_attention_result *res, lens_err *err);
void lens_attention_result_free(lens_attention_result *res);

#endif
