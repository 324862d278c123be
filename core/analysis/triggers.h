/* triggers.h - adversarial triggers from attribution (Hao et al., AAAI 2021,
 * section 4.4).
 *
 * Pattern extraction, per source example (ids, label), on a BERT classifier
 * (rule LENS_TRIGGER_RULE_LENSD; the released rule is below):
 *   S = Σ_l Σ_h Attr_l,h    ([T][T], target = the predicted class)
 * the top_k (default 3) pairs (i, j), i != j, both content tokens (not the
 * first, [CLS], nor the last, [SEP], position) by S; the pattern is the
 * token pair in position order (a before b) with the relative positions of
 * its first occurrence, r = (p - 1) / (T - 2). Per class c the trigger
 * is the pattern found in the top pairs of the most source examples
 * predicted as c (ties: the larger summed S); gold labels of the sources
 * are not used.
 * LENS_TRIGGER_RULE_RELEASED replaces S by Attr_l*,h* of the head holding
 * the largest entry over all layers and heads, and takes its top_k (2)
 * entries over all i, j; relative positions may then lie outside 0..1
 * ([CLS] at -1 / (T - 2)), and insertion clamps them to the content.
 * Attack: each victim of label v gets the trigger of the other label with
 * the most occurrences, its two tokens inserted at the same relative
 * positions of the victim's content (a at round(r_a n), then b at
 * round(r_b (n + 1)), at least one after a; n = content tokens); accuracy
 * per victim label before and after. docs/attribution.md. */
#ifndef LENS_TRIGGERS_H
#define LENS_TRIGGERS_H

#include "core/analysis/head_importance.h"

/* Which (i, j) pairs of a source example make its patterns. */
typedef enum {
    LENS_TRIGGER_RULE_LENSD = 0,    /* top_k pairs of S = sum over heads and layers, content tokens, i != j */
    LENS_TRIGGER_RULE_RELEASED = 1, /* attattr examples/run_adver_connection.py: the single head (over all
                                     * layers) holding the largest attribution entry, its top_k entries,
                                     * any i, j ([CLS], [SEP] and i == j allowed) */
} lens_trigger_rule;

#define LENS_TRIGGER_MAX_TOP_K 20

/* What one source example contributes: its predicted class and its top
 * pairs as token patterns (deduplicated, in rank order). */
typedef struct {
    int cls;              /* predicted class; -1 when the example was too short to give pairs */
    int n;                /* patterns, <= top_k */
    int a[LENS_TRIGGER_MAX_TOP_K], b[LENS_TRIGGER_MAX_TOP_K];              /* token ids, a before b */
    double pos_a[LENS_TRIGGER_MAX_TOP_K], pos_b[LENS_TRIGGER_MAX_TOP_K]; /* relative positions */
    double score[LENS_TRIGGER_MAX_TOP_K];                                 /* S of the pair */
} lens_trigger_source;

typedef struct {
    int steps;                  /* 0 = the quadrature's default */
    lens_riemann riemann;
    lens_quadrature quadrature; /* default riemann (attribution.h) */
    lens_trigger_rule rule;
    int top_k;                  /* pairs per source example; 0 = 3 (lensd rule) or 2 (released rule) */
    lens_pool *pool;
    const volatile int *cancel;
    void (*progress)(void *user, double fraction);
    void *progress_user;
    /* Sharding (lensd job run / merge): LENS_TRIGGER_SOURCES fills sources[e]
     * for the source examples e % shard_count == shard_index only (no
     * triggers, no attack); LENS_TRIGGER_FINISH takes every source's patterns
     * from sources[n_src] and runs the selection and the attack. Patterns are
     * counted in source order either way, so both stages give exactly what
     * LENS_TRIGGER_ALL (0) gives. */
    int stage;
    int shard_index, shard_count;
    lens_trigger_source *sources;
} lens_trigger_opts;

enum { LENS_TRIGGER_ALL = 0, LENS_TRIGGER_SOURCES = 1, LENS_TRIGGER_FINISH = 2 };

typedef struct {
    int found;            /* 0: no source example predicted as this class */
    int token_a, token_b; /* ids, a before b */
    double pos_a, pos_b;  /* relative content positions in 0..1 */
    int count;            /* source examples predicted as the class whose top pairs hold it */
    double score;         /* Σ of its S over those examples */
} lens_trigger;

typedef struct {
    int n_labels;
    lens_trigger *triggers;   /* [K] by the class the sources were predicted as */
    int *n_victims;           /* [K] by victim label */
    int *trigger_label;       /* [K] whose trigger the victims of a label got; -1 none */
    double *acc_before, *acc_after; /* [K]; 0 with no victims */
    double total_before, total_after;
} lens_trigger_result;

int lens_triggers_run(const lens_model *m, const lens_example *src, int n_src, const lens_example *victims,
                      int n_victims, const lens_trigger_opts *opts, lens_trigger_result *out, lens_err *err);
void lens_trigger_result_free(lens_trigger_result *r);

/* The victim's ids with the trigger inserted (T + 2 ids into out). */
void lens_trigger_insert(const lens_trigger *t, const int *ids, int T, int *out);

#endif
