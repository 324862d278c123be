/* faithfulness.c - deletion / insertion curves and ERASER's
 * comprehensiveness and sufficiency of one sequence per explanation method
 * (faithfulness.h; docs/faithfulness.md).
 *
 * One sequence costs: the clean pass (prediction, F(x)), the method's scores
 * (its own analysis, or T - n + 1 passes for leave-one-out), and one batched
 * forward of the 2 (n_fractions + 5) + 1 perturbed sequences per ordering.
 * With unit heads: the scores, and 2 (n_fractions + 5) + 1 forwards of the
 * sequence with heads masked per ordering (a head mask holds for a batch). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/attention.h"
#include "core/analysis/context_mixing.h"
#include "core/analysis/faithfulness.h"
#include "core/analysis/hidden_attribution.h"
#include "core/analysis/logit_attribution.h"
#include "core/io/tokenizer.h"
#include "core/model/arch.h"

const double lens_faith_eraser_bins[LENS_FAITH_BINS] = {0.01, 0.05, 0.1, 0.2, 0.5};

static const char *const method_names[LENS_FAITH_COUNT] = {
    "random", "attention", "effective-attention", "attention-attribution", "hidden-attribution",
    "rollout", "alti", "globenc", "value-zeroing", "leave-one-out", "logit-attribution"};

const char *lens_faith_method_name(lens_faith_method m)
{
    return (unsigned)m < LENS_FAITH_COUNT ? method_names[m] : "?";
}

int lens_faith_method_parse(const char *name, lens_faith_method *m)
{
    for (int i = 0; i < LENS_FAITH_COUNT; i++)
        if (!strcmp(method_names[i], name)) {
            *m = (lens_faith_method)i;
            return 0;
        }
    return -1;
}

const char *lens_faith_unit_name(lens_faith_unit u) { return u == LENS_FAITH_HEADS ? "heads" : "tokens"; }

static const lens_cm_method cm_of[LENS_FAITH_COUNT] = {
    [LENS_FAITH_ROLLOUT] = LENS_CM_ROLLOUT, [LENS_FAITH_ALTI] = LENS_CM_ALTI,
    [LENS_FAITH_GLOBENC] = LENS_CM_GLOBENC, [LENS_FAITH_VALUE_ZEROING] = LENS_CM_VALUE_ZEROING};

static int is_cm(lens_faith_method m) { return m >= LENS_FAITH_ROLLOUT && m <= LENS_FAITH_VALUE_ZEROING; }

const char *lens_faith_undefined(const lens_model *m, lens_faith_method method, lens_faith_unit unit)
{
    const char *why = NULL;
    if (m->cfg.task != LENS_TASK_CLASSIFICATION && m->cfg.task != LENS_TASK_CAUSAL_LM)
        return "faithfulness needs an objective: a sequence classifier or a causal LM";
    if (!m->tok) return "faithfulness needs the model's tokenizer (which tokens are special)";
    if (unit == LENS_FAITH_HEADS) {
        if (method == LENS_FAITH_ATTRIBUTION)
            return lens_model_supports(m, LENS_ANALYSIS_ATTRIBUTION, &why) ? NULL : why;
        if (method == LENS_FAITH_LOGIT_ATTRIBUTION)
            return lens_model_supports(m, LENS_ANALYSIS_LOGIT_ATTRIBUTION, &why) ? NULL : why;
        return method == LENS_FAITH_RANDOM ? NULL
                                           : "it scores tokens, not heads (unit heads takes random, "
                                             "attention-attribution and logit-attribution)";
    }
    if (method == LENS_FAITH_LOGIT_ATTRIBUTION) return "it scores heads, not tokens (give unit heads)";
    if (method == LENS_FAITH_ATTENTION || method == LENS_FAITH_EFFECTIVE)
        return lens_model_supports(m, LENS_ANALYSIS_ATTENTION, &why) ? NULL : why;
    if (method == LENS_FAITH_ATTRIBUTION) return lens_model_supports(m, LENS_ANALYSIS_ATTRIBUTION, &why) ? NULL : why;
    if (method == LENS_FAITH_HIDDEN)
        return lens_model_supports(m, LENS_ANALYSIS_HIDDEN_ATTRIBUTION, &why) ? NULL : why;
    if (is_cm(method)) {
        if (!lens_model_supports(m, LENS_ANALYSIS_CONTEXT_MIXING, &why)) return why;
        return lens_cm_undefined(m, cm_of[method]);
    }
    return NULL;
}

int lens_faith_count(double f, int n)
{
    const int k = (int)ceil(f * n - 1e-9);
    return k < 0 ? 0 : k > n ? n : k;
}

/* ------------------------------------------------------------ the objective */

typedef struct {
    const lens_model *m;
    const int *ids, *types; /* [T], types NULL = segment 0 */
    int T, lm, K;
    lens_objective obj;     /* position resolved: T - 1 on a causal LM */
    int target;
    const lens_faith_opts *o;
} row_ctx;

/* F of each of S sequences (packed ids and types, lengths [S]) into f [S],
 * the heads head_mask ([L][NH], NULL = none) zeroes masked: one forward;
 * the objective's row is each sequence's last on a causal LM. */
static int objective_of(const row_ctx *r, const int *ids, const int *types, const int *lengths, int S,
                        const unsigned char *head_mask, double *f, lens_err *err)
{
    const lens_batch batch = {.n_seqs = S, .lengths = lengths, .ids = ids, .type_ids = r->lm ? NULL : types};
    const lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .cancel = r->o->cancel, .pool = r->o->pool,
                                  .head_mask = head_mask};
    lens_activations act;
    if (lens_forward(r->m, &batch, &fo, &act, err)) return -1;
    for (int s = 0; s < S; s++) {
        const float *z = lens_act_logits(r->m, &act, s) + (r->lm ? (size_t)(lengths[s] - 1) * r->K : 0);
        f[s] = lens_objective_at(&r->obj, z, r->K, r->target, NULL);
    }
    lens_activations_free(&act);
    return 0;
}

/* ------------------------------------------------------------ the scores */

/* The row whose mixing the prediction reads: the objective's position on a
 * causal model, else the first ([CLS], the pooled token). */
static int read_row(const row_ctx *r) { return lens_has_cap(&r->m->cfg, LENS_CAP_CAUSAL) ? r->T - 1 : 0; }

/* raw (effective 0) or effective attention of the last layer, mean over heads, the read row */
static int attention_scores(const row_ctx *r, int effective, float *score, lens_err *err)
{
    const lens_model *m = r->m;
    const lens_config *c = &m->cfg;
    const int T = r->T, L = c->n_layers, NH = c->n_heads, DV = c->d_head_v, row = read_row(r);
    const lens_batch batch = {.n_seqs = 1, .lengths = &r->T, .ids = r->ids, .type_ids = r->lm ? NULL : r->types};
    const lens_forward_opts fo = {.keep = LENS_KEEP_ATTN | (effective ? LENS_KEEP_VALUES : 0), .cancel = r->o->cancel,
                                  .pool = r->o->pool};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, err)) return -1;
    float *eff = effective ? malloc(sizeof(float) * T * T) : NULL;
    int rc = effective && !eff ? lens_fail(err, LENS_ENOMEM, "out of memory for effective attention") : 0;
    memset(score, 0, sizeof(float) * T);
    for (int h = 0; h < NH && !rc; h++) {
        const float *A = lens_act_attn(m, &act, L, h, 0);
        if (effective) {
            rc = lens_attention_effective(A, lens_act_values(m, &act, L, 0) + h * DV, NH * DV, T, DV,
                                          lens_has_cap(c, LENS_CAP_CAUSAL), lens_layer_window(c, L - 1), eff, NULL, err);
            A = eff;
        }
        for (int j = 0; j < T && !rc; j++) score[j] += A[(size_t)row * T + j] / NH;
    }
    free(eff);
    lens_activations_free(&act);
    return rc;
}

/* Tokens: Σ_l Σ_h Σ_i Attr_l^h[i][j], the attribution of every attention
 * edge into token j. Heads: max_ij Attr_l^h[i][j], the importance the
 * head-importance job ranks by (head_importance.h). */
static int attribution_scores(const row_ctx *r, float *score, lens_err *err)
{
    const int T = r->T;
    const lens_attr_opts ao = {.steps = r->o->steps > 0 ? r->o->steps : 20, .target = r->target,
                               .objective = &r->obj, .cancel = r->o->cancel, .pool = r->o->pool};
    lens_attribution a;
    if (lens_attribution_run(r->m, r->ids, r->types, T, &ao, &a, err)) return -1;
    if (r->o->unit == LENS_FAITH_HEADS) {
        for (int l = 0; l < a.n_layers; l++)
            memcpy(score + l * a.n_heads, a.layers[l].importance, sizeof(float) * a.n_heads);
        lens_attribution_free(&a);
        return 0;
    }
    memset(score, 0, sizeof(float) * T);
    for (int l = 0; l < a.n_layers; l++)
        for (size_t e = 0; e < (size_t)a.n_heads * T * T; e++) score[e % T] += a.layers[l].attr[e];
    lens_attribution_free(&a);
    return 0;
}

/* hidden-token attribution: c_{row, j} of the last layer (exact Jacobian norms) */
static int hidden_scores(const row_ctx *r, float *score, lens_err *err)
{
    const int top = r->m->cfg.n_layers;
    const lens_hta_opts ho = {.method = LENS_HTA_EXACT, .layers = &top, .n_layers = 1, .cancel = r->o->cancel,
                              .pool = r->o->pool};
    lens_hta_result h;
    if (lens_hidden_attribution(r->m, r->ids, r->types, r->T, &ho, &h, err)) return -1;
    memcpy(score, h.layers[0].contrib + (size_t)read_row(r) * r->T, sizeof(float) * r->T);
    lens_hta_result_free(&h);
    return 0;
}

/* heads: |direct logit attribution| of each head to the target's logit (minus
 * the foil's on a logit difference) at the objective's position, the last */
static int logit_head_scores(const row_ctx *r, float *score, lens_err *err)
{
    const lens_dla_opts o = {.position = r->T - 1, .target = r->target,
                             .foil = r->obj.kind == LENS_OBJ_LOGIT_DIFFERENCE ? r->obj.foil : -1,
                             .cancel = r->o->cancel, .pool = r->o->pool};
    lens_dla_result d;
    if (lens_logit_attribution(r->m, r->ids, r->T, &o, &d, err)) return -1;
    for (int i = 0; i < d.n_layers * d.n_heads; i++) score[i] = (float)fabs(d.heads[i]);
    lens_dla_result_free(&d);
    return 0;
}

/* context mixing: the last layer's rolled-out matrix, the read row */
static int mixing_scores(const row_ctx *r, lens_cm_method method, float *score, lens_err *err)
{
    const int top = r->m->cfg.n_layers;
    const lens_cm_opts co = {.method = method, .layers = &top, .n_layers = 1, .cancel = r->o->cancel,
                             .pool = r->o->pool};
    lens_cm_result cm;
    if (lens_context_mixing(r->m, r->ids, r->types, r->T, &co, &cm, err)) return -1;
    memcpy(score, cm.rollout + (size_t)read_row(r) * r->T, sizeof(float) * r->T);
    lens_cm_result_free(&cm);
    return 0;
}

/* The sequence without the tokens whose drop[t] is set, appended at *n of ids / types. */
static void append_kept(const row_ctx *r, const unsigned char *drop, int *ids, int *types, int *n)
{
    for (int t = 0; t < r->T; t++)
        if (!drop[t]) {
            ids[*n] = r->ids[t], types[*n] = r->types ? r->types[t] : 0;
            (*n)++;
        }
}

/* F(x) - F(x \ {j}) for every removable j, one batch; the others score 0 */
static int leave_one_out_scores(const row_ctx *r, const unsigned char *removable, double full, float *score,
                                lens_err *err)
{
    const int T = r->T;
    int S = 0;
    for (int t = 0; t < T; t++) S += removable[t];
    int *ids = malloc(sizeof(int) * (size_t)(S ? S : 1) * T), *types = malloc(sizeof(int) * (size_t)(S ? S : 1) * T);
    int *lengths = malloc(sizeof(int) * (S ? S : 1));
    unsigned char *drop = calloc((size_t)T, 1);
    double *f = malloc(sizeof(double) * (S ? S : 1));
    if (!ids || !types || !lengths || !drop || !f) {
        free(ids), free(types), free(lengths), free(drop), free(f);
        return lens_fail(err, LENS_ENOMEM, "out of memory for leave-one-out");
    }
    int rc = 0, n = 0, s = 0;
    for (int t = 0; t < T; t++) {
        if (!removable[t]) continue;
        drop[t] = 1;
        append_kept(r, drop, ids, types, &n);
        drop[t] = 0;
        lengths[s++] = T - 1;
    }
    if (S) rc = objective_of(r, ids, types, lengths, S, NULL, f, err);
    memset(score, 0, sizeof(float) * T);
    for (int t = 0, k = 0; t < T && !rc; t++)
        if (removable[t]) score[t] = (float)(full - f[k++]);
    free(ids), free(types), free(lengths), free(drop), free(f);
    return rc;
}

/* ------------------------------------------------------------ the curves */

static unsigned long long splitmix64(unsigned long long *x)
{
    unsigned long long z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* order [n]: the removable positions (or heads), best first (score NULL: a random
 * permutation from the state *rng). */
static void rank_tokens(const unsigned char *removable, int T, const float *score, unsigned long long *rng, int *order)
{
    int n = 0;
    for (int t = 0; t < T; t++)
        if (removable[t]) order[n++] = t;
    if (!score) { /* Fisher-Yates */
        for (int i = n - 1; i > 0; i--) {
            const int j = (int)(splitmix64(rng) % (unsigned long long)(i + 1)), v = order[i];
            order[i] = order[j], order[j] = v;
        }
        return;
    }
    for (int i = 1; i < n; i++) /* insertion sort, stable (ties keep position order): n is a sentence's length */
        for (int k = i; k > 0 && score[order[k]] > score[order[k - 1]]; k--) {
            const int v = order[k];
            order[k] = order[k - 1], order[k - 1] = v;
        }
}

/* For each of the n_k counts k: the sequence without the top k (deletion)
 * and the one with only them and the kept tokens (insertion), one batch;
 * del / ins [n_k] get their F. */
static int curves_of(const row_ctx *r, const unsigned char *removable, const int *order, int n, const int *counts,
                     int n_k, double *del, double *ins, lens_err *err)
{
    const int T = r->T, S = 2 * n_k;
    int *ids = malloc(sizeof(int) * (size_t)S * T), *types = malloc(sizeof(int) * (size_t)S * T);
    int *lengths = malloc(sizeof(int) * S);
    unsigned char *drop = malloc((size_t)T);
    double *f = malloc(sizeof(double) * S);
    int rc = 0, used = 0;
    if (!ids || !types || !lengths || !drop || !f) {
        free(ids), free(types), free(lengths), free(drop), free(f);
        return lens_fail(err, LENS_ENOMEM, "out of memory for the curves");
    }
    for (int q = 0; q < n_k; q++) {
        const int k = counts[q];
        memset(drop, 0, (size_t)T); /* deletion: drop the top k */
        for (int i = 0; i < k; i++) drop[order[i]] = 1;
        append_kept(r, drop, ids, types, &used);
        lengths[2 * q] = T - k;
        for (int t = 0; t < T; t++) drop[t] = removable[t]; /* insertion: drop every removable token but the top k */
        for (int i = 0; i < k; i++) drop[order[i]] = 0;
        append_kept(r, drop, ids, types, &used);
        lengths[2 * q + 1] = T - n + k;
    }
    rc = objective_of(r, ids, types, lengths, S, NULL, f, err);
    for (int q = 0; q < n_k && !rc; q++) del[q] = f[2 * q], ins[q] = f[2 * q + 1];
    free(ids), free(types), free(lengths), free(drop), free(f);
    return rc;
}

/* The same for heads (n = L * NH): the top k masked (deletion), all but
 * them masked (insertion); one forward each, as a mask holds for a batch. */
static int head_curves_of(const row_ctx *r, const int *order, int n, const int *counts, int n_k, double *del,
                          double *ins, lens_err *err)
{
    unsigned char *keep = malloc((size_t)n);
    int rc = keep ? 0 : lens_fail(err, LENS_ENOMEM, "out of memory for the head curves");
    for (int q = 0; q < n_k && !rc; q++)
        for (int inserting = 0; inserting < 2 && !rc; inserting++) {
            memset(keep, inserting ? 0 : 1, (size_t)n);
            for (int i = 0; i < counts[q]; i++) keep[order[i]] = (unsigned char)inserting;
            rc = objective_of(r, r->ids, r->types, &r->T, 1, keep, inserting ? ins + q : del + q, err);
        }
    free(keep);
    return rc;
}

static int method_scores(const row_ctx *r, lens_faith_method method, const unsigned char *removable, double full,
                         float *score, lens_err *err)
{
    switch (method) {
    case LENS_FAITH_ATTENTION: return attention_scores(r, 0, score, err);
    case LENS_FAITH_EFFECTIVE: return attention_scores(r, 1, score, err);
    case LENS_FAITH_ATTRIBUTION: return attribution_scores(r, score, err);
    case LENS_FAITH_HIDDEN: return hidden_scores(r, score, err);
    case LENS_FAITH_LEAVE_ONE_OUT: return leave_one_out_scores(r, removable, full, score, err);
    case LENS_FAITH_LOGIT_ATTRIBUTION: return logit_head_scores(r, score, err);
    default: return mixing_scores(r, cm_of[method], score, err);
    }
}

int lens_faith_run(const lens_model *m, const int *ids, const int *type_ids, int T, lens_faith_method method,
                   const lens_faith_opts *opts, lens_faith_row *out, lens_err *err)
{
    memset(out, 0, sizeof *out);
    if ((unsigned)method >= LENS_FAITH_COUNT) return lens_fail(err, LENS_EINVAL, "unknown faithfulness method");
    const char *why = lens_faith_undefined(m, method, opts->unit);
    if (why) return lens_fail(err, LENS_EINVAL, "%s: %s", lens_faith_method_name(method), why);
    const int nf = opts->n_fractions;
    for (int q = 0; q < nf; q++)
        if (!(opts->fractions[q] >= 0 && opts->fractions[q] <= 1))
            return lens_fail(err, LENS_EINVAL, "fraction %g is outside [0, 1]", opts->fractions[q]);
    row_ctx r = {.m = m, .ids = ids, .types = type_ids, .T = T, .lm = m->cfg.task == LENS_TASK_CAUSAL_LM, .o = opts};
    r.K = r.lm ? m->cfg.vocab_size : m->cfg.n_labels;
    if (lens_objective_resolve(m, opts->objective, T, &r.obj, err)) return -1;
    if (r.lm) r.T = T = r.obj.position + 1; /* later tokens cannot change the objective */

    /* the clean pass: the prediction, F(x) */
    const lens_batch batch = {.n_seqs = 1, .lengths = &r.T, .ids = ids, .type_ids = r.lm ? NULL : type_ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .cancel = opts->cancel, .pool = opts->pool};
    lens_activations act;
    if (lens_forward(m, &batch, &fo, &act, err)) return -1;
    const float *z = lens_act_logits(m, &act, 0) + (r.lm ? (size_t)(T - 1) * r.K : 0);
    int predicted = 0;
    for (int k = 1; k < r.K; k++) predicted = z[k] > z[predicted] ? k : predicted;
    r.target = opts->target >= 0 ? opts->target : predicted;
    int rc = lens_objective_check_target(&r.obj, r.target, r.K, r.lm, err);
    if (!rc) out->full = lens_objective_at(&r.obj, z, r.K, r.target, NULL);
    lens_activations_free(&act);
    if (rc) return -1;
    out->target = r.target;
    if (r.lm) r.obj.position = -1; /* each perturbed sequence's last row */

    const int heads = opts->unit == LENS_FAITH_HEADS, N = heads ? m->cfg.n_layers * m->cfg.n_heads : T;
    unsigned char *removable = malloc((size_t)N);
    float *score = malloc(sizeof(float) * N);
    int *order = malloc(sizeof(int) * N), *counts = malloc(sizeof(int) * (nf + LENS_FAITH_BINS));
    double *del = malloc(sizeof(double) * (nf + LENS_FAITH_BINS)), *ins = malloc(sizeof(double) * (nf + LENS_FAITH_BINS));
    out->deletion = calloc((size_t)(nf ? nf : 1), sizeof(double));
    out->insertion = calloc((size_t)(nf ? nf : 1), sizeof(double));
    rc = removable && score && order && counts && del && ins && out->deletion && out->insertion
             ? 0 : lens_fail(err, LENS_ENOMEM, "out of memory for faithfulness");
    int n = 0;
    if (heads && !rc) memset(removable, 1, (size_t)N), n = N; /* every head */
    for (int t = 0; t < T && !rc && !heads; t++) {
        removable[t] = !lens_tokenizer_is_special(m->tok, ids[t]) && !(r.lm && t == T - 1);
        n += removable[t];
    }
    if (!rc && !heads && n == T) /* no special token to keep: the last token stays, so no input is empty */
        removable[T - 1] = 0, n--;
    out->n_removable = n;
    for (int q = 0; q < nf && !rc; q++) counts[q] = lens_faith_count(opts->fractions[q], n);
    for (int b = 0; b < LENS_FAITH_BINS && !rc; b++) counts[nf + b] = lens_faith_count(lens_faith_eraser_bins[b], n);
    if (!rc && method != LENS_FAITH_RANDOM) rc = method_scores(&r, method, removable, out->full, score, err);
    const int orderings = method == LENS_FAITH_RANDOM ? (opts->random_orderings > 0 ? opts->random_orderings : 1) : 1;
    for (int o = 0; o < orderings && !rc; o++) {
        unsigned long long rng = opts->seed ^ ((unsigned long long)opts->row << 20) ^ (unsigned long long)o << 44;
        splitmix64(&rng);
        rank_tokens(removable, N, method == LENS_FAITH_RANDOM ? NULL : score, &rng, order);
        rc = heads ? head_curves_of(&r, order, n, counts, nf + LENS_FAITH_BINS, del, ins, err)
                   : curves_of(&r, removable, order, n, counts, nf + LENS_FAITH_BINS, del, ins, err);
        for (int q = 0; q < nf && !rc; q++)
            out->deletion[q] += del[q] / orderings, out->insertion[q] += ins[q] / orderings;
        for (int b = 0; b < LENS_FAITH_BINS && !rc; b++)
            out->eraser_deletion[b] += del[nf + b] / orderings, out->eraser_insertion[b] += ins[nf + b] / orderings;
    }
    if (!rc) { /* empty: every removable token (or head) gone */
        counts[0] = n; /* with every one removed the order does not matter */
        rc = heads ? head_curves_of(&r, order, n, counts, 1, del, ins, err)
                   : curves_of(&r, removable, order, n, counts, 1, del, ins, err);
        out->empty = del[0];
    }
    free(removable), free(score), free(order), free(counts), free(del), free(ins);
    if (rc) lens_faith_row_free(out);
    return rc;
}

void lens_faith_row_free(lens_faith_row *r)
{
    free(r->deletion), free(r->insertion);
    r->deletion = r->insertion = NULL;
}
