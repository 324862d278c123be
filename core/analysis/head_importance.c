/* head_importance.c - head importance and the pruning curve (Hao et al. 2021).
 *
 * Formulas, orders and seeds in head_importance.h; docs/attribution.md.
 * Each example costs one lens_attribution_run over all layers (which also
 * gives its attention probabilities through one plain forward); the curve
 * costs (2 + n_seeds) x 11 masked forward passes over the whole set, in
 * packed batches of at most BATCH_TOKENS tokens. */
#include "core/analysis/head_importance.h"

#include <stdlib.h>
#include <string.h>

#define BATCH_TOKENS 8192

static int cancelled(const volatile int *c) { return lens_cancelled(c); }

int lens_head_accuracy(const lens_model *m, const lens_example *ex, int n, const unsigned char *mask,
                       lens_pool *pool, const volatile int *cancel, int *pred, double *accuracy, lens_err *err)
{
    const int K = m->cfg.n_labels;
    int correct = 0;
    for (int s0 = 0; s0 < n;) {
        int s1 = s0, tokens = 0;
        while (s1 < n && (s1 == s0 || tokens + ex[s1].T <= BATCH_TOKENS)) tokens += ex[s1++].T;
        int *lengths = malloc(sizeof(int) * (s1 - s0)), *ids = malloc(sizeof(int) * tokens),
            *types = malloc(sizeof(int) * tokens);
        if (!lengths || !ids || !types) {
            free(lengths), free(ids), free(types);
            return lens_fail(err, LENS_ENOMEM, "out of memory for a batch of %d tokens", tokens);
        }
        for (int s = s0, at = 0; s < s1; s++) {
            lengths[s - s0] = ex[s].T;
            memcpy(ids + at, ex[s].ids, sizeof(int) * ex[s].T);
            for (int t = 0; t < ex[s].T; t++) types[at + t] = ex[s].type_ids ? ex[s].type_ids[t] : 0;
            at += ex[s].T;
        }
        lens_batch b = {.n_seqs = s1 - s0, .lengths = lengths, .ids = ids, .type_ids = types};
        lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .cancel = cancel, .pool = pool, .head_mask = mask};
        lens_activations act;
        int rc = lens_forward(m, &b, &fo, &act, err);
        free(lengths), free(ids), free(types);
        if (rc) return -1;
        for (int s = s0; s < s1; s++) {
            const float *z = lens_act_logits(m, &act, s - s0);
            int best = 0;
            for (int k = 1; k < K; k++) best = z[k] > z[best] ? k : best;
            if (pred) pred[s] = best;
            correct += best == ex[s].label;
        }
        lens_activations_free(&act);
        s0 = s1;
    }
    *accuracy = n ? (double)correct / n : 0;
    return 0;
}

int lens_heads_pruned(double f, int L, int NH, int floor_count)
{
    /* (f * L) * NH in double, in the released code's order: 0.7 * 12 * 12 = 100.8 -> 100 */
    const int k = floor_count ? (int)(f * L * NH) : (int)(f * (L * NH) + 0.5);
    return k < L * NH ? k : L * NH;
}

void lens_head_order(const float *importance, int H, int *order)
{
    for (int i = 0; i < H; i++) order[i] = i;
    for (int i = 1; i < H; i++) { /* insertion sort: stable, H is small */
        int h = order[i], j = i;
        while (j > 0 && importance[order[j - 1]] > importance[h]) order[j] = order[j - 1], j--;
        order[j] = h;
    }
}

static unsigned long long xorshift64s(unsigned long long *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

void lens_head_shuffle(unsigned long long seed, int H, int *order)
{
    unsigned long long s = seed * 0x9E3779B97F4A7C15ULL + 1; /* never 0 */
    for (int i = 0; i < H; i++) order[i] = i;
    for (int i = H - 1; i > 0; i--) {
        int j = (int)(xorshift64s(&s) % (unsigned long long)(i + 1));
        int t = order[i];
        order[i] = order[j], order[j] = t;
    }
}

typedef struct {
    const lens_head_opts *o;
    double done, total;
} progress_state;

static void report(progress_state *p, double add)
{
    p->done += add;
    if (p->o && p->o->progress) p->o->progress(p->o->progress_user, p->total > 0 ? p->done / p->total : 1);
}

/* Accuracy with the first n_pruned heads of order masked. */
static int pruned_accuracy(const lens_model *m, const lens_example *ex, int n, const int *order, int n_pruned,
                           unsigned char *mask, const lens_head_opts *o, double *acc, lens_err *err)
{
    const int H = m->cfg.n_layers * m->cfg.n_heads;
    memset(mask, 1, (size_t)H);
    for (int i = 0; i < n_pruned; i++) mask[order[i]] = 0;
    return lens_head_accuracy(m, ex, n, mask, o ? o->pool : NULL, o ? o->cancel : NULL, NULL, acc, err);
}

int lens_head_importance_run(const lens_model *m, const lens_example *ex, int n, const lens_head_opts *opts,
                             lens_head_importance *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads, H = L * NH;
    memset(out, 0, sizeof *out);
    const char *why = NULL;
    if (!lens_model_supports(m, LENS_ANALYSIS_HEAD_IMPORTANCE, &why))
        return lens_fail(err, LENS_EINVAL, "head importance: %s; this model is %s", why, c->architecture);
    if (n < 1) return lens_fail(err, LENS_EINVAL, "head importance needs at least one example");
    for (int i = 0; i < n; i++)
        if (ex[i].label < 0 || ex[i].label >= c->n_labels)
            return lens_fail(err, LENS_EINVAL, "example %d: label %d is not in 0..%d", i, ex[i].label,
                             c->n_labels - 1);
    const int n_seeds = opts && opts->n_seeds > 0 ? opts->n_seeds : 3;
    const unsigned long long seed = opts && opts->seed ? opts->seed : 1;
    out->n_layers = L, out->n_heads = NH, out->n_examples = n, out->n_seeds = n_seeds;
    out->attr_importance = calloc((size_t)H, sizeof(float));
    out->attn_importance = calloc((size_t)H, sizeof(float));
    double *attr_sum = calloc((size_t)H, sizeof(double)), *attn_sum = calloc((size_t)H, sizeof(double));
    int *order = malloc(sizeof(int) * H);
    unsigned char *mask = malloc((size_t)H);
    int rc = 0;
    if (!out->attr_importance || !out->attn_importance || !attr_sum || !attn_sum || !order || !mask) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for head importance");
        goto done;
    }
    /* progress: an attribution counts L units per example, a masked pass over the set n / 4 */
    const int stage = opts ? opts->stage : LENS_HEAD_ALL;
    const int shards = stage == LENS_HEAD_EXAMPLES && opts->shard_count > 0 ? opts->shard_count : 1;
    const int shard = shards > 1 ? opts->shard_index : 0;
    if (stage != LENS_HEAD_ALL && (!opts->example_attr || !opts->example_attn || shard < 0 || shard >= shards)) {
        rc = lens_fail(err, LENS_EINVAL, "head importance stage %d needs example arrays and a shard in range", stage);
        goto done;
    }
    const long mine = stage == LENS_HEAD_FINISH ? 0 : (n - shard + shards - 1) / shards;
    const double curve = stage == LENS_HEAD_EXAMPLES ? 0 : LENS_PRUNE_POINTS * (2.0 + n_seeds) * n / 4;
    progress_state ps = {.o = opts, .total = (double)mine * L + curve};
    for (int e = 0; e < n && !rc; e++) {
        double *ex_attr = stage ? opts->example_attr + (size_t)e * H : NULL;
        double *ex_attn = stage ? opts->example_attn + (size_t)e * H : NULL;
        if (stage == LENS_HEAD_FINISH) {
            for (int i = 0; i < H; i++) attr_sum[i] += ex_attr[i], attn_sum[i] += ex_attn[i];
            continue;
        }
        if (e % shards != shard) continue;
        if (cancelled(opts ? opts->cancel : NULL)) {
            rc = lens_fail(err, LENS_ECANCEL, "head importance cancelled at example %d", e);
            break;
        }
        lens_attr_opts ao = {.steps = opts ? opts->steps : 0, .riemann = opts ? opts->riemann : LENS_RIEMANN_RIGHT,
                             .quadrature = opts ? opts->quadrature : LENS_QUAD_RIEMANN,
                             .target = opts && opts->target_gold ? ex[e].label : -1,
                             .cancel = opts ? opts->cancel : NULL, .pool = opts ? opts->pool : NULL};
        lens_attribution a;
        if (lens_attribution_run(m, ex[e].ids, ex[e].type_ids, ex[e].T, &ao, &a, err)) {
            rc = -1;
            break;
        }
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NH; h++) {
                attr_sum[l * NH + h] += a.layers[l].importance[h];
                if (ex_attr) ex_attr[l * NH + h] = a.layers[l].importance[h];
            }
        lens_attribution_free(&a);
        /* attention probabilities: one plain forward of the example */
        lens_batch b = {.n_seqs = 1, .lengths = &ex[e].T, .ids = ex[e].ids, .type_ids = ex[e].type_ids};
        lens_forward_opts fo = {.keep = LENS_KEEP_ATTN, .cancel = ao.cancel, .pool = ao.pool};
        lens_activations act;
        if (lens_forward(m, &b, &fo, &act, err)) {
            rc = -1;
            break;
        }
        const size_t TT = (size_t)ex[e].T * ex[e].T;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NH; h++) {
                const float *A = lens_act_attn(m, &act, l + 1, h, 0);
                float best = 0;
                for (size_t ij = 0; ij < TT; ij++) best = A[ij] > best ? A[ij] : best;
                attn_sum[l * NH + h] += best;
                if (ex_attn) ex_attn[l * NH + h] = best;
            }
        lens_activations_free(&act);
        report(&ps, L);
    }
    if (rc || stage == LENS_HEAD_EXAMPLES) goto done;
    for (int i = 0; i < H; i++) out->attr_importance[i] = (float)(attr_sum[i] / n);
    for (int i = 0; i < H; i++) out->attn_importance[i] = (float)(attn_sum[i] / n);
    for (int p = 0; p < LENS_PRUNE_POINTS && !rc; p++) {
        const double f = p / (double)(LENS_PRUNE_POINTS - 1);
        const int k = lens_heads_pruned(f, L, NH, opts && opts->prune_floor);
        out->fraction[p] = f, out->n_pruned[p] = k;
        lens_head_order(out->attr_importance, H, order);
        rc = pruned_accuracy(m, ex, n, order, k, mask, opts, &out->acc_attr[p], err);
        report(&ps, n / 4.0);
        if (!rc) {
            lens_head_order(out->attn_importance, H, order);
            rc = pruned_accuracy(m, ex, n, order, k, mask, opts, &out->acc_attn[p], err);
            report(&ps, n / 4.0);
        }
        double sum = 0;
        for (int s = 0; s < n_seeds && !rc; s++) {
            double acc;
            lens_head_shuffle(seed + (unsigned long long)s, H, order);
            rc = pruned_accuracy(m, ex, n, order, k, mask, opts, &acc, err);
            sum += acc;
            report(&ps, n / 4.0);
        }
        out->acc_random[p] = sum / n_seeds;
    }
done:
    free(attr_sum), free(attn_sum), free(order), free(mask);
    if (rc || (opts && opts->stage == LENS_HEAD_EXAMPLES)) lens_head_importance_free(out); /* examples: no result */
    return rc;
}

void lens_head_importance_free(lens_head_importance *h)
{
    free(h->attr_importance), free(h->attn_importance);
    memset(h, 0, sizeof *h);
}
