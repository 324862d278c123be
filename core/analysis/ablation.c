/* ablation.c - head and MLP ablation (ablation.h; conventions in
 * docs/ablation.md).
 *
 * Three passes of lens_forward at most: the mean pass over the reference
 * rows (mean mode with reference sequences; with none, the clean pass sums
 * the request's own rows), the clean pass, and the ablated pass with the
 * head mask and the MLP mask (forward.c replaces the heads' context rows in
 * its attend hook and the MLPs' outputs in the block's MLP hook). */
#include <stdlib.h>
#include <string.h>

#include "core/analysis/ablation.h"

/* fill [n] = sum / rows as floats */
static void mean_of(float *fill, const double *sum, size_t n, double rows)
{
    for (size_t i = 0; i < n; i++) fill[i] = (float)(sum[i] / rows);
}

/* One pass over batch; logits [K] of the objective row into z (NULL: no head). */
static int run(const lens_model *m, const lens_batch *batch, lens_forward_opts *fo, int row, float *z, lens_err *err)
{
    lens_activations act;
    fo->keep = z ? LENS_KEEP_LOGITS : 0;
    if (lens_forward(m, batch, fo, &act, err)) return -1;
    if (z) {
        const int K = m->cfg.task == LENS_TASK_CAUSAL_LM ? m->cfg.vocab_size : m->cfg.n_labels;
        memcpy(z, lens_act_logits(m, &act, 0) + (size_t)row * K, sizeof(float) * K);
    }
    lens_activations_free(&act);
    return 0;
}

int lens_ablation_run(const lens_model *m, const int *ids, const int *type_ids, int T, const lens_ablation_opts *opts,
                      lens_ablation_result *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads, C = c->d_model, VO = NH * c->d_head_v;
    const int lm = c->task == LENS_TASK_CAUSAL_LM, K = lm ? c->vocab_size : c->n_labels;
    memset(out, 0, sizeof *out);
    if (!lm && c->task != LENS_TASK_CLASSIFICATION)
        return lens_fail(err, LENS_EINVAL, "ablation needs a sequence classifier or a causal LM; this model is %s",
                         lens_task_name(c->task));
    const int mean = opts->mode == LENS_ABLATE_MEAN;
    if (opts->mode != LENS_ABLATE_ZERO && !mean) return lens_fail(err, LENS_EINVAL, "mode must be zero or mean");
    if (mean && opts->n_ref < 0) return lens_fail(err, LENS_EINVAL, "a negative number of reference sequences");
    lens_objective obj;
    if (lens_objective_resolve(m, opts->objective, T, &obj, err)) return -1;

    unsigned char *head_keep = malloc((size_t)L * NH), *mlp_keep = malloc((size_t)L);
    double *ctx_sum = mean ? calloc((size_t)L * VO, sizeof(double)) : NULL;
    double *mlp_sum = mean ? calloc((size_t)L * C, sizeof(double)) : NULL;
    float *head_fill = mean ? malloc(sizeof(float) * L * VO) : NULL;
    float *mlp_fill = mean ? malloc(sizeof(float) * L * C) : NULL;
    out->logits_clean = malloc(sizeof(float) * K);
    out->logits_ablated = malloc(sizeof(float) * K);
    int rc = -1;
    if (!head_keep || !mlp_keep || !out->logits_clean || !out->logits_ablated ||
        (mean && (!ctx_sum || !mlp_sum || !head_fill || !mlp_fill))) {
        lens_fail(err, LENS_ENOMEM, "out of memory for an ablation of %d tokens", T);
        goto done;
    }
    for (int i = 0; i < L * NH; i++) head_keep[i] = !(opts->heads && opts->heads[i]);
    for (int l = 0; l < L; l++) mlp_keep[l] = !(opts->mlps && opts->mlps[l]);

    const lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids, .type_ids = lm ? NULL : type_ids};
    double rows = T;
    lens_forward_opts fo = {.cancel = opts->cancel, .pool = opts->pool};
    if (mean && opts->n_ref > 0) { /* the reference rows' sums */
        const lens_batch ref = {.n_seqs = opts->n_ref, .lengths = opts->ref_lengths, .ids = opts->ref_ids};
        fo.ctx_sum = ctx_sum, fo.mlp_sum = mlp_sum;
        if (run(m, &ref, &fo, 0, NULL, err)) goto done;
        rows = 0;
        for (int s = 0; s < opts->n_ref; s++) rows += opts->ref_lengths[s];
        fo.ctx_sum = NULL, fo.mlp_sum = NULL;
    } else if (mean) { /* the clean pass sums the request's rows */
        fo.ctx_sum = ctx_sum, fo.mlp_sum = mlp_sum;
    }
    if (run(m, &batch, &fo, obj.position, out->logits_clean, err)) goto done;
    const float *z = out->logits_clean;
    for (int k = 1; k < K; k++) out->predicted = z[k] > z[out->predicted] ? k : out->predicted;
    out->target = opts->target >= 0 ? opts->target : out->predicted;
    if (lens_objective_check_target(&obj, out->target, K, lm, err)) goto done;
    if (mean) {
        mean_of(head_fill, ctx_sum, (size_t)L * VO, rows);
        mean_of(mlp_fill, mlp_sum, (size_t)L * C, rows);
    }
    fo = (lens_forward_opts){.cancel = opts->cancel, .pool = opts->pool, .head_mask = head_keep,
                             .head_fill = head_fill, .mlp_mask = mlp_keep, .mlp_fill = mlp_fill};
    if (run(m, &batch, &fo, obj.position, out->logits_ablated, err)) goto done;
    out->K = K, out->objective = obj;
    out->clean = lens_objective_at(&obj, out->logits_clean, K, out->target, NULL);
    out->ablated = lens_objective_at(&obj, out->logits_ablated, K, out->target, NULL);
    rc = 0;
done:
    free(head_keep), free(mlp_keep), free(ctx_sum), free(mlp_sum), free(head_fill), free(mlp_fill);
    if (rc) lens_ablation_result_free(out);
    return rc;
}

void lens_ablation_result_free(lens_ablation_result *r)
{
    free(r->logits_clean), free(r->logits_ablated);
    memset(r, 0, sizeof *r);
}
