/* attribution.h - self-attention attribution (Hao et al. 2021) and its tree.
 *
 * Paper: Y. Hao, L. Dong, F. Wei, K. Xu, "Self-Attention Attribution:
 * Interpreting Information Interactions Inside Transformer", AAAI 2021
 * (released code: attattr).
 *
 * For a BERT sequence classifier and a target class c with probability
 * F = softmax(logits)[c], the attribution of layer l's attention A_l
 * ([NH][T][T], all heads together) is
 *
 *     Attr_l = A_l ⊙ ∫₀¹ ∂F(X)/∂X |_{X = α A_l} dα
 *            ≈ A_l ⊙ (1/m) Σ_k ∂F/∂X |_{X = α_k A_l}
 *
 * where F(X) runs the model with layer l's attention probabilities replaced
 * by X (every head of layer l scaled together; the layers above compute their
 * own attention normally from their changed inputs). Quadrature of the
 * integral over α (lens_attr_nodes):
 *  - riemann (default, the paper's m-step sum, weights 1/m): "right"
 *    α_k = k/m, k = 1..m (the paper, default); "left" α_k = k/m, k = 0..m-1
 *    (the released code);
 *  - gauss: m-node Gauss–Legendre on [0, 1], Σ_k w_k ∂F/∂X(α_k A_l), exact
 *    for integrands polynomial in α up to degree 2m − 1; the integrand is
 *    smooth in α, so a few nodes reach the accuracy of a 20-step Riemann sum
 *    (measured in docs/attribution.md).
 * Completeness: Σ_hij Attr_l → F(A) − F(0) as m grows. Importance of head
 * h: I_h = max_ij Attr_l,h[i][j].
 *
 * Shapes: T tokens, L layers, NH heads; attributions are [NH][T][T] per
 * layer, row i = query token, column j = attended token. See
 * docs/attribution.md for the conventions, the tree rules and an example. */
#ifndef LENS_ATTRIBUTION_H
#define LENS_ATTRIBUTION_H

#include <stddef.h>

#include "core/model/model.h"

typedef enum { LENS_RIEMANN_RIGHT = 0, LENS_RIEMANN_LEFT = 1 } lens_riemann;

/* What F is, of the head's logits z (a classifier's, or a causal LM's
 * next-token logits at the objective position; docs/attribution.md
 * "Objectives"): probability softmax(z)[t] (the default), log_probability
 * log softmax(z)[t], logit z[t], logit_difference z[t] - z[foil]. */
typedef enum {
    LENS_OBJ_PROBABILITY = 0,
    LENS_OBJ_LOG_PROBABILITY,
    LENS_OBJ_LOGIT,
    LENS_OBJ_LOGIT_DIFFERENCE
} lens_objective_kind;

typedef struct {
    lens_objective_kind kind;
    int position; /* causal LM: the row whose next-token logits F reads, -1 = the last; classifiers: ignored */
    int foil;     /* logit_difference: a class index or token id other than the target; else -1 */
} lens_objective;

const char *lens_objective_name(lens_objective_kind k); /* "probability", "log_probability", ... */
int lens_objective_parse(const char *name, lens_objective_kind *k); /* -1: unknown */
/* *o = asked (NULL: probability at the last position) with its position
 * resolved (classifiers 0, -1 = the last); 0, or -1 with err. */
int lens_objective_resolve(const lens_model *m, const lens_objective *asked, int T, lens_objective *o, lens_err *err);
/* target (and a logit_difference's foil) among the K outputs; lm: token ids, else labels. */
int lens_objective_check_target(const lens_objective *o, int target, int K, int lm, lens_err *err);
/* F of logits z [K] for target; p not NULL: the probabilities into p [K] (p may be z). */
double lens_objective_at(const lens_objective *o, const float *z, int K, int target, float *p);
/* dF/dz [K] in place of p: the probabilities lens_objective_at wrote (any
 * values for the logit objectives, which do not read them). */
void lens_objective_grad(const lens_objective *o, float *p, int K, int target);
typedef enum { LENS_QUAD_RIEMANN = 0, LENS_QUAD_GAUSS = 1 } lens_quadrature;

#define LENS_ATTR_RIEMANN_STEPS 20 /* the paper's m */
#define LENS_ATTR_GAUSS_NODES 6    /* measured: error below riemann-20's on every checkpoint (docs/attribution.md) */

typedef struct {
    int steps;                  /* m: gradient evaluations (Riemann steps or Gauss nodes); 0 = the default above */
    lens_riemann riemann;       /* default right; riemann quadrature only */
    lens_quadrature quadrature; /* default riemann */
    int target;                 /* class index; -1 = the predicted class */
    const lens_objective *objective; /* NULL = the probability of the target (causal LM: at the last position) */
    const int *layers;          /* 1-based layers to attribute; NULL = all */
    int n_layers;               /* entries in layers */
    size_t max_scratch_bytes;   /* activations of one batch of steps; 0 = 256 MiB */
    const volatile int *cancel; /* optional; non-zero stops with LENS_ECANCEL */
    lens_pool *pool;            /* threads for the forward pass (core/base/pool.h); NULL = the caller alone */
    /* optional: called after each target layer with the fraction of layers done (0..1] */
    void (*progress)(void *user, double fraction);
    void *progress_user;
} lens_attr_opts;

typedef struct {
    int layer;          /* 1..L */
    float *attr;        /* [NH][T][T] */
    float *importance;  /* [NH]: max_ij attr[h][i][j] */
    double f_zero;      /* F with this layer's attention scaled by 0 */
    double attr_sum;    /* Σ_hij attr: ≈ f_full - f_zero */
} lens_attr_layer;

typedef struct {
    int T, n_heads;
    int target;         /* class index attributed */
    int predicted;      /* argmax of the logits (at the objective position) */
    lens_objective objective; /* as run: position resolved (classifiers 0) */
    double f_full;      /* F(A): the objective of the unmodified model */
    int steps;
    lens_riemann riemann;
    lens_quadrature quadrature;
    int n_layers;       /* entries in layers */
    lens_attr_layer *layers;
} lens_attribution;

/* Attribution of one sequence (ids, type_ids NULL = segment 0, T tokens) on
 * a sequence classifier (target = a class index) or a causal LM (F = p(next
 * token = target) at the last position, target a token id; -1 = the most
 * probable; type_ids ignored; A_l is causal, so Attr_l is zero above the
 * diagonal), or of opts->objective. Returns 0, or -1 with err filled
 * (LENS_EINVAL for a model lens_model_supports refuses, a bad target,
 * foil, position or layer). */
int lens_attribution_run(const lens_model *m, const int *ids, const int *type_ids, int T,
                         const lens_attr_opts *opts, lens_attribution *out, lens_err *err);
void lens_attribution_free(lens_attribution *a);

/* The α schedule of m evaluations: alpha[k] in [0, 1] and weights with
 * ∫₀¹ g(α) dα ≈ Σ_k weight[k] g(alpha[k]) / divisor. Riemann: weight 1,
 * divisor m (the sum divided once, as the paper's formula); gauss:
 * Gauss–Legendre weights on [0, 1] (summing to 1), divisor 1. Returns the
 * divisor, or 0 for m < 1 or an unknown rule. */
double lens_attr_nodes(lens_quadrature q, lens_riemann r, int m, double *alpha, double *weight);

/* m-point Gauss–Legendre rule on [-1, 1]: the roots x of P_m by Newton's
 * method from Tricomi's cos guess, weights 2 / ((1 − x²) P_m'(x)²);
 * x ascending. */
void lens_gauss_legendre(int m, double *x, double *w);

/* F = p(target | ids) with layer's (1-based) attention probabilities
 * replaced by probs [NH][T][T] (any values: rows need not sum to 1; zeros
 * remove a head), the layers above recomputing theirs. For gradient checks
 * and ablations; one lens_forward plus the layers above per call. */
int lens_attr_eval(const lens_model *m, const int *ids, const int *type_ids, int T, int layer,
                   const float *probs, int target, double *F, lens_err *err);
/* The same for an objective (NULL: lens_attr_eval's probability). */
int lens_attr_eval_objective(const lens_model *m, const int *ids, const int *type_ids, int T, int layer,
                             const float *probs, int target, const lens_objective *objective, double *F,
                             lens_err *err);

/* The attribution tree (attattr's attribution_tree.py, any depth). */
typedef struct {
    int token;
    int layer; /* root: L; others: the layer of the edge that reached them */
} lens_attr_node;

typedef struct {
    int layer;   /* 1-based layer whose attribution gave the edge */
    int from, to;/* query token -> attended token (parent -> child) */
    float score; /* attribution normalised by the layer's max excluding row 0 */
} lens_attr_edge;

typedef struct {
    int root;
    float threshold;
    int n_nodes, n_edges;
    lens_attr_node *nodes; /* root first, then in the order reached */
    lens_attr_edge *edges; /* in the order added */
} lens_attr_tree;

/* attr: L layers of [NH][T][T] (layer 1 first), e.g. the layers of a
 * lens_attribution run over all layers. threshold: 0.4 in the paper. */
int lens_attr_tree_build(const float *const *attr, int L, int NH, int T, float threshold,
                         lens_attr_tree *tree, lens_err *err);
void lens_attr_tree_free(lens_attr_tree *tree);

#endif
