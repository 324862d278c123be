/* logit_lens.c - hidden states of any layer read through the final norm and
 * the LM head (logit_lens.h has the formulas). */
#include "core/analysis/logit_lens.h"

#include <stdlib.h>
#include <string.h>

#include "core/model/arch.h"
#include "core/model/head.h"

int lens_has_lm_head(const lens_model *m)
{
    return m->cfg.task == LENS_TASK_MASKED_LM || m->cfg.task == LENS_TASK_CAUSAL_LM;
}

int lens_logit_lens(const lens_model *m, const float *x, int R, int layer, float *logits, lens_pool *pool,
                    lens_err *err)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model;
    if (!lens_has_lm_head(m))
        return lens_fail(err, LENS_EINVAL, "%s has no LM head to read hidden states through", c->architecture);
    if (layer < 0 || layer > c->n_layers)
        return lens_fail(err, LENS_EINVAL, "layer %d is outside 0..%d", layer, c->n_layers);
    float *t = malloc(2 * (size_t)R * C * sizeof *t); /* [R][C] the final-normed rows or the MLM head's scratch, [R][C] the norm's */
    if (!t) return lens_fail(err, LENS_ENOMEM, "out of memory for %d rows", R);
    if (c->task == LENS_TASK_CAUSAL_LM) {
        memcpy(t, x, (size_t)R * C * sizeof *t);
        /* hidden[L] is stored after the final norm (as HF); earlier layers get
         * it here, the family's own (ln_f, RMSNorm) */
        lens_block_io io = {.N = R, .x = t, .h = t + (size_t)R * C, .pool = pool};
        if (layer < c->n_layers) lens_block_forward(m, &io, c->n_layers);
        lens_causal_lm_forward(m, logits, t, R, pool);
    } else {
        lens_mlm_forward(m, logits, x, R, &(lens_mlm_rows){.pre = t}, pool);
    }
    free(t);
    return 0;
}
