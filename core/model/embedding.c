/* embedding.c - the input embedding of every family and its backward
 * (embedding.h has the formula). */
#include "core/model/embedding.h"

#include <string.h>

#include "core/nn/ops.h"

/* Row of the position table for token t; *seen counts the real tokens so far. */
static int position_of(const lens_config *c, const int *ids, int t, int *seen)
{
    if (!c->position_offset) return t;
    const int real = ids[t] != c->pad_token_id;
    *seen += real;
    return real ? c->pad_token_id + *seen : c->pad_token_id;
}

static float scale_of(const lens_config *c) { return c->emb_scale > 0 ? c->emb_scale : 1.0f; }

void lens_embed_forward(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *pre,
                        float *mean, float *rstd)
{
    const lens_config *c = &m->cfg;
    const lens_params *p = &m->p;
    const int C = c->d_model;
    const lens_dtype dt = p->emb_dtype;
    const float scale = scale_of(c);
    float *e = p->ln_emb.w && pre ? pre : x;
    for (int t = 0, seen = 0; t < T; t++) {
        float *row = e + (size_t)t * C;
        lens_widen(row, lens_dtype_at(p->tok_emb, dt, (size_t)ids[t] * C), dt, (size_t)C);
        if (scale != 1.0f)
            for (int i = 0; i < C; i++) row[i] *= scale;
        if (p->pos_emb)
            lens_widen_add(row, lens_dtype_at(p->pos_emb, dt, (size_t)position_of(c, ids, t, &seen) * C), dt,
                           (size_t)C);
        if (p->type_emb)
            lens_widen_add(row, lens_dtype_at(p->type_emb, dt, (size_t)(type_ids ? type_ids[t] : 0) * C), dt,
                           (size_t)C);
    }
    if (p->ln_emb.w) lens_add_layernorm(NULL, x, mean, rstd, e, NULL, &p->ln_emb, T, C, c->ln_eps);
}

/* dtable[row] += s · d (a NULL gradient: the table is frozen). */
static void add_row(float *dtable, int row, const float *d, float s, int C)
{
    if (!dtable) return;
    float *r = dtable + (size_t)row * C;
    for (int i = 0; i < C; i++) r[i] += s * d[i];
}

void lens_embed_backward(const lens_model *m, const lens_grad_map *g, const float *dx, const int *ids,
                         const int *type_ids, int T, const float *pre, const float *mean, const float *rstd,
                         float *de)
{
    const lens_config *c = &m->cfg;
    const lens_params *p = &m->p;
    const int C = c->d_model;
    if (p->ln_emb.w) { /* x = LN_emb(e) */
        memset(de, 0, sizeof(float) * (size_t)T * C);
        lens_layernorm_backward(de, g->of(g, p->ln_emb.w), p->ln_emb.b ? g->of(g, p->ln_emb.b) : NULL, dx, pre, mean,
                                rstd, &p->ln_emb, T, C);
        dx = de;
    }
    /* e_t = s tok[id_t] + pos[p_t] + type[seg_t] */
    const float scale = scale_of(c);
    float *dtok = g->of(g, p->tok_emb), *dpos = p->pos_emb ? g->of(g, p->pos_emb) : NULL;
    float *dtype = p->type_emb ? g->of(g, p->type_emb) : NULL;
    for (int t = 0, seen = 0; t < T; t++) {
        const float *d = dx + (size_t)t * C;
        add_row(dtok, ids[t], d, scale, C);
        if (p->pos_emb) add_row(dpos, position_of(c, ids, t, &seen), d, 1.0f, C);
        add_row(dtype, type_ids ? type_ids[t] : 0, d, 1.0f, C);
    }
}
