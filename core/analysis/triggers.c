/* triggers.c - adversarial triggers from attribution patterns (Hao et al. 2021).
 *
 * Rules in triggers.h and docs/attribution.md. Costs one attribution over
 * all layers per source example and two forward passes over the victims. */
#include "core/analysis/triggers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int label, a, b;
    double pos_a, pos_b;
    int count;
    double score;
} pattern;

/* Top k pairs of S[T][T] into pi/pj: among content tokens 1..T-2 with
 * i != j (all = 0), or over every i, j (all = 1). */
static int top_pairs(const double *S, int T, int k, int all, int *pi, int *pj)
{
    int n = 0;
    const int lo = all ? 0 : 1, hi = all ? T : T - 1;
    for (int i = lo; i < hi; i++)
        for (int j = lo; j < hi; j++) {
            if (i == j && !all) continue;
            const double v = S[(size_t)i * T + j];
            int at = n < k ? n++ : k;
            if (at == k && v <= S[(size_t)pi[k - 1] * T + pj[k - 1]]) continue;
            if (at == k) at = k - 1;
            while (at > 0 && S[(size_t)pi[at - 1] * T + pj[at - 1]] < v) pi[at] = pi[at - 1], pj[at] = pj[at - 1], at--;
            pi[at] = i, pj[at] = j;
        }
    return n;
}

/* S [T][T] = the head of the released rule (run_adver_connection.py): per
 * layer the head of the layer's largest entry (first in head, i, j order),
 * kept over the layers when its maximum is strictly larger. */
static void released_head(const lens_attribution *a, int L, int NH, size_t TT, double *S)
{
    const float *best = NULL;
    float best_max = 0;
    for (int l = 0; l < L; l++) {
        const float *x = a->layers[l].attr;
        size_t arg = 0;
        for (size_t k = 1; k < (size_t)NH * TT; k++) arg = x[k] > x[arg] ? k : arg;
        if (!best || x[arg] > best_max) best = x + arg / TT * TT, best_max = x[arg];
    }
    for (size_t ij = 0; ij < TT; ij++) S[ij] = best[ij];
}

void lens_trigger_insert(const lens_trigger *t, const int *ids, int T, int *out)
{
    const int n = T - 2; /* content tokens 1..T-2 */
    int oa = (int)lround(t->pos_a * n), ob = (int)lround(t->pos_b * (n + 1));
    oa = oa < 0 ? 0 : oa > n ? n : oa;
    ob = ob < oa + 1 ? oa + 1 : ob > n + 1 ? n + 1 : ob;
    /* content with a at offset oa, then b at offset ob of the n + 1 tokens */
    int content[n + 2], w = 0;
    for (int i = 0; i < n; i++) {
        if (i == oa) content[w++] = t->token_a;
        content[w++] = ids[1 + i];
    }
    if (oa == n) content[w++] = t->token_a;
    /* now n + 1 tokens; put b before the token at offset ob */
    out[0] = ids[0];
    int o = 1;
    for (int i = 0; i < n + 1; i++) {
        if (i == ob) out[o++] = t->token_b;
        out[o++] = content[i];
    }
    if (ob == n + 1) out[o++] = t->token_b;
    out[o] = ids[T - 1];
}

static int accuracy_per_label(const lens_model *m, const lens_example *ex, int n, const lens_trigger_opts *o,
                              double *acc, double *total, lens_err *err)
{
    const int K = m->cfg.n_labels;
    int *pred = malloc(sizeof(int) * (n ? n : 1)), *seen = calloc((size_t)K, sizeof(int));
    if (!pred || !seen) {
        free(pred), free(seen);
        return lens_fail(err, LENS_ENOMEM, "out of memory");
    }
    double all;
    int rc = lens_head_accuracy(m, ex, n, NULL, o ? o->pool : NULL, o ? o->cancel : NULL, pred, &all, err);
    if (!rc) {
        for (int k = 0; k < K; k++) acc[k] = 0;
        for (int i = 0; i < n; i++) seen[ex[i].label]++, acc[ex[i].label] += pred[i] == ex[i].label;
        for (int k = 0; k < K; k++) acc[k] = seen[k] ? acc[k] / seen[k] : 0;
        *total = all;
    }
    free(pred), free(seen);
    return rc;
}

/* The patterns of one source example: its top pairs by S (rule in
 * triggers.h) as token pairs in position order, each once. */
static int source_patterns(const lens_model *m, const lens_example *src, const lens_trigger_opts *opts, int top_k,
                           int released, lens_trigger_source *out, lens_err *err)
{
    const int L = m->cfg.n_layers, NH = m->cfg.n_heads, T = src->T;
    memset(out, 0, sizeof *out);
    out->cls = -1;
    /* lensd: fewer than two content tokens; released: [CLS] [SEP] alone has no content to place */
    if (T < (released ? 3 : 4)) return 0;
    lens_attr_opts ao = {.steps = opts ? opts->steps : 0, .riemann = opts ? opts->riemann : LENS_RIEMANN_RIGHT,
                         .quadrature = opts ? opts->quadrature : LENS_QUAD_RIEMANN,
                         .target = -1, .cancel = opts ? opts->cancel : NULL, .pool = opts ? opts->pool : NULL};
    lens_attribution a;
    if (lens_attribution_run(m, src->ids, src->type_ids, T, &ao, &a, err)) return -1;
    const size_t TT = (size_t)T * T;
    double *S = calloc(TT, sizeof(double));
    int pi[LENS_TRIGGER_MAX_TOP_K], pj[LENS_TRIGGER_MAX_TOP_K];
    if (!S) {
        lens_attribution_free(&a);
        return lens_fail(err, LENS_ENOMEM, "out of memory for triggers");
    }
    if (released) released_head(&a, L, NH, TT, S);
    else
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NH; h++)
                for (size_t ij = 0; ij < TT; ij++) S[ij] += a.layers[l].attr[h * TT + ij];
    out->cls = a.target; /* the predicted class: the pairs support predicting it */
    lens_attribution_free(&a);
    const int np = top_pairs(S, T, top_k, released, pi, pj);
    for (int q = 0; q < np; q++) {
        const int p0 = pi[q] < pj[q] ? pi[q] : pj[q], p1 = pi[q] < pj[q] ? pj[q] : pi[q];
        const int ta = src->ids[p0], tb = src->ids[p1];
        int dup = 0; /* a pattern counts once per example */
        for (int r = 0; r < out->n; r++) dup |= out->a[r] == ta && out->b[r] == tb;
        if (dup) continue;
        out->a[out->n] = ta, out->b[out->n] = tb;
        out->pos_a[out->n] = (p0 - 1) / (double)(T - 2), out->pos_b[out->n] = (p1 - 1) / (double)(T - 2);
        out->score[out->n++] = S[(size_t)pi[q] * T + pj[q]];
    }
    free(S);
    return 0;
}

/* Counts a source's patterns into the table (first appearance order). */
static int add_patterns(const lens_trigger_source *src, pattern **pat, int *n_pat, int *cap, lens_err *err)
{
    for (int q = 0; src->cls >= 0 && q < src->n; q++) {
        int f = 0;
        while (f < *n_pat && !((*pat)[f].label == src->cls && (*pat)[f].a == src->a[q] && (*pat)[f].b == src->b[q]))
            f++;
        if (f == *n_pat) {
            if (*n_pat == *cap) {
                *cap = *cap ? 2 * *cap : 64;
                pattern *g = realloc(*pat, sizeof **pat * *cap);
                if (!g) return lens_fail(err, LENS_ENOMEM, "out of memory for patterns");
                *pat = g;
            }
            (*pat)[(*n_pat)++] = (pattern){src->cls, src->a[q], src->b[q], src->pos_a[q], src->pos_b[q], 0, 0};
        }
        (*pat)[f].count++, (*pat)[f].score += src->score[q];
    }
    return 0;
}

int lens_triggers_run(const lens_model *m, const lens_example *src, int n_src, const lens_example *victims,
                      int n_victims, const lens_trigger_opts *opts, lens_trigger_result *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int K = c->n_labels;
    const int released = opts && opts->rule == LENS_TRIGGER_RULE_RELEASED;
    const int top_k = opts && opts->top_k > 0 ? opts->top_k : released ? 2 : 3;
    memset(out, 0, sizeof *out);
    const char *why = NULL;
    if (!lens_model_supports(m, LENS_ANALYSIS_TRIGGERS, &why))
        return lens_fail(err, LENS_EINVAL, "triggers: %s; this model is %s", why, c->architecture);
    if (n_src < 1 || n_victims < 1)
        return lens_fail(err, LENS_EINVAL, "triggers need at least one source and one victim example");
    for (int i = 0; i < n_src + n_victims; i++) {
        const lens_example *e = i < n_src ? &src[i] : &victims[i - n_src];
        if (e->label < 0 || e->label >= K)
            return lens_fail(err, LENS_EINVAL, "example %d: label %d is not in 0..%d", i, e->label, K - 1);
    }
    out->n_labels = K;
    out->triggers = calloc((size_t)K, sizeof *out->triggers);
    out->n_victims = calloc((size_t)K, sizeof(int));
    out->trigger_label = malloc(sizeof(int) * K);
    out->acc_before = calloc((size_t)K, sizeof(double));
    out->acc_after = calloc((size_t)K, sizeof(double));
    pattern *pat = NULL;
    int n_pat = 0, cap = 0, rc = 0;
    lens_example *attacked = calloc((size_t)n_victims, sizeof *attacked);
    int *ids = NULL;
    if (!out->triggers || !out->n_victims || !out->trigger_label || !out->acc_before || !out->acc_after ||
        !attacked) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for triggers");
        goto done;
    }
    const int stage = opts ? opts->stage : LENS_TRIGGER_ALL;
    const int shards = stage == LENS_TRIGGER_SOURCES && opts->shard_count > 1 ? opts->shard_count : 1;
    const int shard = shards > 1 ? opts->shard_index : 0;
    if (top_k > LENS_TRIGGER_MAX_TOP_K || (stage != LENS_TRIGGER_ALL && !opts->sources)) {
        rc = lens_fail(err, LENS_EINVAL, "triggers: top_k over %d, or a stage without its sources array",
                       LENS_TRIGGER_MAX_TOP_K);
        goto done;
    }
    for (int e = 0; e < n_src && !rc; e++) {
        lens_trigger_source one, *ps = stage == LENS_TRIGGER_ALL ? &one : &opts->sources[e];
        if (stage != LENS_TRIGGER_FINISH) {
            if (e % shards != shard) continue;
            rc = source_patterns(m, &src[e], opts, top_k, released, ps, err);
            if (opts && opts->progress) opts->progress(opts->progress_user, 0.9 * (e + 1) / n_src);
        }
        if (!rc && stage != LENS_TRIGGER_SOURCES) rc = add_patterns(ps, &pat, &n_pat, &cap, err);
    }
    if (stage == LENS_TRIGGER_SOURCES) goto done;
    if (rc) goto done;
    for (int f = 0; f < n_pat; f++) {
        lens_trigger *t = &out->triggers[pat[f].label];
        if (!t->found || pat[f].count > t->count || (pat[f].count == t->count && pat[f].score > t->score))
            *t = (lens_trigger){1, pat[f].a, pat[f].b, pat[f].pos_a, pat[f].pos_b, pat[f].count, pat[f].score};
    }
    for (int v = 0; v < K; v++) {
        out->trigger_label[v] = -1;
        for (int k = 0; k < K; k++)
            if (k != v && out->triggers[k].found &&
                (out->trigger_label[v] < 0 || out->triggers[k].count > out->triggers[out->trigger_label[v]].count))
                out->trigger_label[v] = k;
    }
    size_t total = 0;
    for (int i = 0; i < n_victims; i++) total += (size_t)victims[i].T + 2;
    ids = malloc(sizeof(int) * total);
    if (!ids) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for attacked examples");
        goto done;
    }
    for (int i = 0, at = 0; i < n_victims; i++) {
        const lens_example *v = &victims[i];
        const int k = out->trigger_label[v->label];
        out->n_victims[v->label]++;
        attacked[i] = *v;
        attacked[i].type_ids = NULL; /* single-sentence input: segment 0 */
        /* no trigger for this label, a too-short victim or no room: unchanged */
        if (k < 0 || v->T < 2 || v->T + 2 > c->max_positions) continue;
        lens_trigger_insert(&out->triggers[k], v->ids, v->T, ids + at);
        attacked[i].ids = ids + at, attacked[i].T = v->T + 2;
        at += v->T + 2;
    }
    rc = accuracy_per_label(m, victims, n_victims, opts, out->acc_before, &out->total_before, err);
    if (!rc) rc = accuracy_per_label(m, attacked, n_victims, opts, out->acc_after, &out->total_after, err);
    if (!rc && opts && opts->progress) opts->progress(opts->progress_user, 1.0);
done:
    free(pat), free(attacked), free(ids);
    if (rc || (opts && opts->stage == LENS_TRIGGER_SOURCES)) lens_trigger_result_free(out); /* sources: no result */
    return rc;
}

void lens_trigger_result_free(lens_trigger_result *r)
{
    free(r->triggers), free(r->n_victims), free(r->trigger_label), free(r->acc_before), free(r->acc_after);
    memset(r, 0, sizeof *r);
}
