/* patching.c - activation patching of the residual stream, exact grid
 * (patching.h).
 *
 * Two plain passes (clean, keeping its hidden states; corrupt), then per
 * layer l the T patched runs as copies of the corrupt sequence in one
 * batch, copy t with row t of the clean x_l written over its own before
 * block l (lens_forward_opts patch_layer / patch_src / patch_rows). A causal
 * LM's logits are [N][V] for all the copies' rows, so the copies go in
 * chunks whose logits stay under CHUNK_BYTES. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/patching.h"

#define CHUNK_BYTES ((size_t)64 << 20)

/* F of sequence s's objective row of a forward's logits */
static double objective_of(const lens_model *m, const lens_activations *act, int s, const lens_objective *o, int target)
{
    const int lm = m->cfg.task == LENS_TASK_CAUSAL_LM, K = lm ? m->cfg.vocab_size : m->cfg.n_labels;
    const float *z = lens_act_logits(m, act, s) + (lm ? (size_t)o->position * K : 0);
    return lens_objective_at(o, z, K, target, NULL);
}

int lens_patching_resid(const lens_model *m, const int *clean, const int *corrupt, int T,
                        const lens_patching_opts *opts, lens_patching_result *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, C = c->d_model;
    const int lm = c->task == LENS_TASK_CAUSAL_LM, K = lm ? c->vocab_size : c->n_labels;
    memset(out, 0, sizeof *out);
    if (!lm && c->task != LENS_TASK_CLASSIFICATION)
        return lens_fail(err, LENS_EINVAL, "patching needs a sequence classifier or a causal LM; this model is %s",
                         lens_task_name(c->task));
    lens_objective obj;
    if (lens_objective_resolve(m, opts->objective, T, &obj, err)) return -1;
    lens_activations act_clean, act_corrupt;
    const lens_batch bc = {.n_seqs = 1, .lengths = &T, .ids = clean}, bx = {.n_seqs = 1, .lengths = &T, .ids = corrupt};
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_LOGITS, .cancel = opts->cancel, .pool = opts->pool};
    if (lens_forward(m, &bc, &fo, &act_clean, err)) return -1;
    fo.keep = LENS_KEEP_LOGITS;
    if (lens_forward(m, &bx, &fo, &act_corrupt, err)) {
        lens_activations_free(&act_clean);
        return -1;
    }
    const float *z = lens_act_logits(m, &act_clean, 0) + (lm ? (size_t)obj.position * K : 0);
    int pred = 0;
    for (int k = 1; k < K; k++) pred = z[k] > z[pred] ? k : pred;
    const int target = opts->target >= 0 ? opts->target : pred;
    int rc = -1;
    /* copies per batch: the logits of a chunk ([copies * T][V] on a causal LM) under CHUNK_BYTES */
    const size_t per_copy = sizeof(float) * (lm ? (size_t)T * K : (size_t)K) + sizeof(float) * (size_t)T * C;
    const int chunk = per_copy * T <= CHUNK_BYTES ? T : (int)(CHUNK_BYTES / per_copy) > 0 ? (int)(CHUNK_BYTES / per_copy) : 1;
    int *ids = malloc(sizeof(int) * chunk * T), *lengths = malloc(sizeof(int) * chunk);
    float *src = malloc(sizeof(float) * chunk * T * C);
    unsigned char *rows = malloc((size_t)chunk * T);
    out->value = malloc(sizeof(double) * L * T);
    out->effect = malloc(sizeof(double) * L * T);
    if (lens_objective_check_target(&obj, target, K, lm, err)) goto done;
    if (!ids || !lengths || !src || !rows || !out->value || !out->effect) {
        lens_fail(err, LENS_ENOMEM, "out of memory for patching %d tokens", T);
        goto done;
    }
    out->T = T, out->n_layers = L, out->target = target, out->objective = obj;
    out->clean = objective_of(m, &act_clean, 0, &obj, target);
    out->corrupt = objective_of(m, &act_corrupt, 0, &obj, target);
    const double gap = out->clean - out->corrupt;
    for (int s = 0; s < chunk; s++) {
        memcpy(ids + (size_t)s * T, corrupt, sizeof(int) * T);
        lengths[s] = T;
    }
    for (int l = 0; l < L; l++) {
        const float *x = lens_act_hidden(m, &act_clean, l, 0); /* [T][C] */
        for (int t0 = 0; t0 < T; t0 += chunk) {
            const int n = T - t0 < chunk ? T - t0 : chunk;
            memset(rows, 0, (size_t)n * T);
            for (int s = 0; s < n; s++) { /* copy s patches position t0 + s */
                memcpy(src + (size_t)s * T * C, x, sizeof(float) * T * C);
                rows[(size_t)s * T + t0 + s] = 1;
            }
            const lens_batch b = {.n_seqs = n, .lengths = lengths, .ids = ids};
            lens_forward_opts po = {.keep = LENS_KEEP_LOGITS, .cancel = opts->cancel, .pool = opts->pool,
                                    .patch_layer = l, .patch_src = src, .patch_rows = rows};
            lens_activations act;
            if (lens_forward(m, &b, &po, &act, err)) goto done;
            for (int s = 0; s < n; s++) {
                const double F = objective_of(m, &act, s, &obj, target);
                out->value[(size_t)l * T + t0 + s] = F;
                out->effect[(size_t)l * T + t0 + s] = gap != 0 ? (F - out->corrupt) / gap : NAN;
            }
            lens_activations_free(&act);
        }
    }
    rc = 0;
done:
    free(ids), free(lengths), free(src), free(rows);
    lens_activations_free(&act_clean);
    lens_activations_free(&act_corrupt);
    if (rc) lens_patching_result_free(out);
    return rc;
}

void lens_patching_result_free(lens_patching_result *r)
{
    free(r->value), free(r->effect);
    memset(r, 0, sizeof *r);
}
