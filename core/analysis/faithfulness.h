/* faithfulness.h - do an explanation's token scores rank what the model
 * uses? Deletion and insertion curves of one sequence per explanation
 * method, ERASER's comprehensiveness and sufficiency (DeYoung et al., ACL
 * 2020), and a seeded random ordering as the baseline.
 *
 * For one sequence x of T tokens, F(x) is the objective (attribution.h
 * lens_objective) of the target (the full input's prediction unless given),
 * fixed for every perturbed input. The n removable tokens are every token
 * that is not special (lens_tokenizer_is_special), and on a causal LM not
 * the objective's position (the input is cut after it: later tokens cannot
 * change it); on an input without special tokens the last token stays. A method's scores s [T] order them (descending, ties by
 * position); r_k = the top k. Removing a token deletes it from the sequence
 * (ERASER's "x \ r": the others close up and take the freed positions).
 * With k(f) = ceil(f n):
 *     deletion D(f)  = F(x \ r_k(f))
 *     insertion I(f) = F(r_k(f) and the special tokens)
 * at each fraction f, and at ERASER's bins b in {0.01, 0.05, 0.1, 0.2,
 * 0.5}. full = F(x), empty = F(special tokens only) = D(1) = I(0).
 * docs/faithfulness.md states how each method's matrix becomes s, and the
 * table the job makes of these numbers. */
#ifndef LENS_FAITHFULNESS_H
#define LENS_FAITHFULNESS_H

#include "core/analysis/attribution.h"

typedef enum {
    LENS_FAITH_RANDOM,          /* a seeded random ordering: the baseline */
    LENS_FAITH_ATTENTION,       /* raw attention, last layer, mean over heads, the read row */
    LENS_FAITH_EFFECTIVE,       /* effective attention (Brunner et al.), the same row */
    LENS_FAITH_ATTRIBUTION,     /* attention attribution (Hao et al.): Σ_l Σ_h Σ_i Attr_l^h[i][j] */
    LENS_FAITH_HIDDEN,          /* hidden-token attribution: the last layer's contribution row */
    LENS_FAITH_ROLLOUT,         /* context mixing: the last layer's rolled-out row */
    LENS_FAITH_ALTI,
    LENS_FAITH_GLOBENC,
    LENS_FAITH_VALUE_ZEROING,
    LENS_FAITH_LEAVE_ONE_OUT,   /* occlusion: F(x) - F(x \ {j}) (gradient-free) */
    LENS_FAITH_LOGIT_ATTRIBUTION, /* heads only: |direct logit attribution| of each head (causal LMs) */
    LENS_FAITH_COUNT
} lens_faith_method;

#define LENS_FAITH_BINS 5
extern const double lens_faith_eraser_bins[LENS_FAITH_BINS]; /* 0.01, 0.05, 0.1, 0.2, 0.5 */

/* What is removed or kept: tokens (deleted from the sequence) or attention
 * heads (zero-ablated, lens_forward_opts.head_mask: probabilities and output
 * zero). With heads the n = L * NH heads are ranked, all removable, r_k
 * masked in D(f) and all but r_k in I(f); empty = F(every head masked).
 * Head scores: attention-attribution's importance max_ij Attr_l^h[i][j] (as
 * the head-importance job), |logit-attribution| (causal LMs), random. */
typedef enum { LENS_FAITH_TOKENS, LENS_FAITH_HEADS } lens_faith_unit;

const char *lens_faith_method_name(lens_faith_method m); /* "random", "attention", ... */
int lens_faith_method_parse(const char *name, lens_faith_method *m); /* -1: unknown */
const char *lens_faith_unit_name(lens_faith_unit u);                 /* "tokens", "heads" */
/* NULL when method ranks unit on m, else a sentence saying why not. */
const char *lens_faith_undefined(const lens_model *m, lens_faith_method method, lens_faith_unit unit);

typedef struct {
    const double *fractions; /* [n_fractions] in [0, 1] */
    int n_fractions;
    lens_faith_unit unit;            /* tokens (0, the default) or heads */
    int target;                      /* class or token id; -1 = the full input's prediction */
    const lens_objective *objective; /* NULL = the probability of the target (causal LM: the last position) */
    int steps;                       /* attention attribution's m; 0 = 20 */
    unsigned long long seed;         /* random: ordering o of row is drawn from (seed, row, o) */
    int row;
    int random_orderings;            /* random: curves averaged over this many orderings; 0 = 1 */
    const volatile int *cancel;      /* optional; non-zero stops with LENS_ECANCEL */
    lens_pool *pool;
} lens_faith_opts;

typedef struct {
    int n_removable, target; /* n_removable: tokens, or L * NH heads */
    double full, empty;
    double *deletion, *insertion; /* [n_fractions] D(f), I(f) */
    double eraser_deletion[LENS_FAITH_BINS], eraser_insertion[LENS_FAITH_BINS];
} lens_faith_row;

/* The curves of one sequence (ids, type_ids NULL = segment 0, T tokens)
 * under method's ordering. Returns 0, or -1 with err (LENS_EINVAL: a task
 * without an objective, a method undefined on m, a bad target, fraction or
 * position; LENS_ECANCEL). */
int lens_faith_run(const lens_model *m, const int *ids, const int *type_ids, int T, lens_faith_method method,
                   const lens_faith_opts *opts, lens_faith_row *out, lens_err *err);
void lens_faith_row_free(lens_faith_row *r);

/* k(f) = ceil(f n), the tokens removed or kept at fraction f */
int lens_faith_count(double f, int n);

#endif
