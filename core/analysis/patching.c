/* patching.c - activation patching (exact grids) and attribution patching
 * (patching.h; conventions in docs/patching.md).
 *
 * Exact: two plain passes (clean, keeping its residual stream, head outputs
 * ctx and MLP outputs; corrupt, keeping its residual stream), then per
 * layer l one list of patched runs (every asked grid's), each a copy of the
 * corrupt sequence starting at block l from the corrupt x_l
 * (lens_forward_opts start_x: the blocks below are shared with the corrupt
 * run), its patch written in:
 *   resid (t):        row t of x_l = the clean x_l[t]
 *   heads (h[, t]):   head h's ctx slice of layer l = the clean one (every row, or row t)
 *   mlps ([t]):       layer l's MLP output = the clean one (every row, or row t)
 * The copies go through lens_forward in chunks of at most CHUNK_BYTES of
 * activations; a causal LM computes logits at the objective row only.
 *
 * Attribution: one forward of the corrupt sequence caching what the block
 * backward reads (lens_block_cache), the head, dF/dz, the head's backward
 * and the blocks' backward (block.h), whose hooks hand over ∂F/∂ctx (the
 * attend_backward hook) and ∂F/∂y of each MLP output (mlp_backward); ∂F/∂x_l
 * is the backward's output of block l. Each grid entry is then a dot
 * product (patching.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/patching.h"
#include "core/model/arch.h"
#include "core/model/block.h"
#include "core/model/head.h"
#include "core/nn/ops.h"
#include "core/nn/scores.h"

#define CHUNK_BYTES ((size_t)64 << 20)

const char *lens_patch_grid_name(lens_patch_grid g)
{
    static const char *const names[] = {"resid", "heads", "heads_pos", "mlps", "mlps_pos"};
    return (unsigned)g < LENS_PATCH_GRIDS ? names[g] : "?";
}

/* F of sequence s's objective row of a forward's logits */
static double objective_of(const lens_model *m, const lens_activations *act, int s, const lens_objective *o, int target)
{
    const int lm = m->cfg.task == LENS_TASK_CAUSAL_LM, K = lm ? m->cfg.vocab_size : m->cfg.n_labels;
    const float *z = lens_act_logits(m, act, s) + (lm && !act->logit_rows ? (size_t)o->position * K : 0);
    return lens_objective_at(o, z, K, target, NULL);
}

/* One patched run: its grid, head (heads grids) and position (-1: every row). */
typedef struct {
    lens_patch_grid grid;
    int h, t;
} patch_copy;

/* The shared state of one request's exact and attribution passes. */
typedef struct {
    const lens_model *m;
    const lens_patching_opts *opts;
    int T, L, C, NH, DV, VO, K, lm;
    lens_objective obj;
    int target;
    lens_activations clean, corrupt; /* clean: hidden, ctx, mlp; corrupt: hidden (+ ctx, mlp for attribution) */
    lens_patching_result *out;
} patcher;

/* Index of copy p of layer l in its grid. */
static size_t grid_index(const patcher *pt, int l, const patch_copy *p)
{
    const int T = pt->T, NH = pt->NH;
    switch (p->grid) {
    case LENS_PATCH_RESID:
    case LENS_PATCH_MLPS_POS: return (size_t)l * T + p->t;
    case LENS_PATCH_HEADS: return (size_t)l * NH + p->h;
    case LENS_PATCH_HEADS_POS: return ((size_t)l * NH + p->h) * T + p->t;
    default: return (size_t)l;
    }
}

/* The runs of one layer, in grid order: returns how many went into list. */
static int layer_copies(const patcher *pt, patch_copy *list)
{
    const unsigned g = pt->opts->grids;
    int n = 0;
    for (int k = 0; k < LENS_PATCH_GRIDS; k++) {
        if (!(g & 1u << k)) continue;
        const int heads = k == LENS_PATCH_HEADS || k == LENS_PATCH_HEADS_POS ? pt->NH : 1;
        const int rows = k == LENS_PATCH_HEADS || k == LENS_PATCH_MLPS ? 1 : pt->T;
        for (int h = 0; h < heads; h++)
            for (int t = 0; t < rows; t++)
                list[n++] = (patch_copy){.grid = k, .h = h, .t = rows == 1 ? -1 : t};
    }
    return n;
}

/* Buffers of one chunk of n copies of T rows. */
typedef struct {
    int *ids, *lengths, *rows;    /* [n*T], [n], [n]: the objective row of each copy */
    float *start, *ctx, *mlp;     /* [n*T][C], [n*T][VO], [n*T][C] */
    unsigned char *heads, *mlp_rows; /* [n*T][NH], [n*T] */
} chunk_bufs;

static void chunk_free(chunk_bufs *b)
{
    free(b->ids), free(b->lengths), free(b->rows), free(b->start), free(b->ctx), free(b->mlp);
    free(b->heads), free(b->mlp_rows);
}

static int chunk_alloc(chunk_bufs *b, const patcher *pt, int n)
{
    const size_t R = (size_t)n * pt->T;
    b->ids = malloc(sizeof(int) * R), b->lengths = malloc(sizeof(int) * n), b->rows = malloc(sizeof(int) * n);
    b->start = malloc(sizeof(float) * R * pt->C), b->ctx = malloc(sizeof(float) * R * pt->VO);
    b->mlp = malloc(sizeof(float) * R * pt->C);
    b->heads = malloc(R * pt->NH), b->mlp_rows = malloc(R);
    return b->ids && b->lengths && b->rows && b->start && b->ctx && b->mlp && b->heads && b->mlp_rows ? 0 : -1;
}

/* Copies [0, n) of list at layer l, patched, through one forward; their F into the grids. */
static int run_chunk(patcher *pt, chunk_bufs *b, int l, const patch_copy *list, int n, const int *corrupt,
                     lens_err *err)
{
    const int T = pt->T, C = pt->C, VO = pt->VO, NH = pt->NH, DV = pt->DV;
    const size_t TC = (size_t)T * C, TV = (size_t)T * VO;
    const float *x_clean = lens_act_hidden(pt->m, &pt->clean, l, 0), *x_corrupt = lens_act_hidden(pt->m, &pt->corrupt, l, 0);
    const float *ctx_clean = lens_act_ctx(pt->m, &pt->clean, l + 1, 0), *mlp_clean = lens_act_mlp(pt->m, &pt->clean, l + 1, 0);
    memset(b->heads, 0, (size_t)n * T * NH);
    memset(b->mlp_rows, 0, (size_t)n * T);
    int any_head = 0, any_mlp = 0;
    for (int s = 0; s < n; s++) {
        const patch_copy *p = &list[s];
        memcpy(b->ids + (size_t)s * T, corrupt, sizeof(int) * T);
        b->lengths[s] = T, b->rows[s] = pt->obj.position;
        float *x = b->start + s * TC;
        memcpy(x, x_corrupt, sizeof(float) * TC);
        const int t0 = p->t < 0 ? 0 : p->t, t1 = p->t < 0 ? T : p->t + 1;
        if (p->grid == LENS_PATCH_RESID) memcpy(x + (size_t)p->t * C, x_clean + (size_t)p->t * C, sizeof(float) * C);
        if (p->grid == LENS_PATCH_HEADS || p->grid == LENS_PATCH_HEADS_POS) {
            for (int t = t0; t < t1; t++) {
                memcpy(b->ctx + s * TV + (size_t)t * VO + p->h * DV, ctx_clean + (size_t)t * VO + p->h * DV,
                       sizeof(float) * DV);
                b->heads[((size_t)s * T + t) * NH + p->h] = 1;
            }
            any_head = 1;
        }
        if (p->grid == LENS_PATCH_MLPS || p->grid == LENS_PATCH_MLPS_POS) {
            for (int t = t0; t < t1; t++) {
                memcpy(b->mlp + s * TC + (size_t)t * C, mlp_clean + (size_t)t * C, sizeof(float) * C);
                b->mlp_rows[(size_t)s * T + t] = 1;
            }
            any_mlp = 1;
        }
    }
    const lens_batch batch = {.n_seqs = n, .lengths = b->lengths, .ids = b->ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .cancel = pt->opts->cancel, .pool = pt->opts->pool,
                                  .patch_layer = l, .start_x = b->start,
                                  .patch_ctx = b->ctx, .patch_heads = any_head ? b->heads : NULL,
                                  .patch_mlp = b->mlp, .patch_mlp_rows = any_mlp ? b->mlp_rows : NULL,
                                  .logit_rows = pt->lm ? b->rows : NULL};
    lens_activations act;
    if (lens_forward(pt->m, &batch, &fo, &act, err)) return -1;
    const double gap = pt->out->clean - pt->out->corrupt;
    for (int s = 0; s < n; s++) {
        const double F = objective_of(pt->m, &act, s, &pt->obj, pt->target);
        const lens_patching_grid *g = &pt->out->grid[list[s].grid];
        const size_t i = grid_index(pt, l, &list[s]);
        g->value[i] = F;
        g->effect[i] = gap != 0 ? (F - pt->out->corrupt) / gap : NAN;
    }
    lens_activations_free(&act);
    return 0;
}

/* Every exact grid: per layer its copies, in chunks. */
static int exact_grids(patcher *pt, const int *corrupt, lens_err *err)
{
    const lens_config *c = &pt->m->cfg;
    const int T = pt->T, max_copies = T + pt->NH + pt->NH * T + 1 + T;
    /* what one copy holds in the forward (its rows' buffers) and here, bounding a chunk */
    const size_t per_copy = sizeof(float) * (size_t)T *
                                (4 * (size_t)pt->C + 2 * (size_t)c->n_heads * c->d_head_k + 3 * (size_t)pt->VO +
                                 (size_t)lens_ff_cols(pt->m) + pt->NH) +
                            sizeof(float) * (size_t)pt->K;
    int chunk = (int)(CHUNK_BYTES / per_copy);
    chunk = chunk < 1 ? 1 : chunk > max_copies ? max_copies : chunk;
    patch_copy *list = malloc(sizeof *list * max_copies);
    chunk_bufs b = {0};
    int rc = -1;
    if (!list || chunk_alloc(&b, pt, chunk)) {
        lens_fail(err, LENS_ENOMEM, "out of memory for patching %d tokens", T);
        goto done;
    }
    const int n = layer_copies(pt, list);
    for (int l = 0; l < pt->L; l++)
        for (int s0 = 0; s0 < n; s0 += chunk)
            if (run_chunk(pt, &b, l, list + s0, n - s0 < chunk ? n - s0 : chunk, corrupt, err)) goto done;
    rc = 0;
done:
    free(list);
    chunk_free(&b);
    return rc;
}

/* ------------------------------------------------------------ attribution patching */

/* The corrupt run's forward with caches and its backward: the gradients of F. */
typedef struct {
    const patcher *pt;
    lens_block_cache *cache; /* [L] */
    lens_block_cache final;
    float *probs;            /* [L][NH][T][T] */
    float *x, *h, *n, *ctx, *ff, *dq, *dk, *dv, *dprobs, *dscores;
    float *dx;               /* [L][T][C] ∂F/∂x_l (block l's input) */
    float *dctx;             /* [L][T][VO] ∂F/∂ctx_l */
    float *dmlp;             /* [L][T][C] ∂F/∂y_l */
    float *u, *pooled, *logits, *capped, *dpre; /* the head: [C], [C], [K], [K], [C] */
} grad_pass;

static void grad_free(grad_pass *g)
{
    for (int l = 0; g->cache && l < g->pt->L; l++) lens_block_cache_free(&g->cache[l]);
    free(g->cache);
    lens_block_cache_free(&g->final);
    free(g->probs), free(g->x), free(g->h), free(g->n), free(g->ctx), free(g->ff), free(g->dq), free(g->dk);
    free(g->dv), free(g->dprobs), free(g->dscores), free(g->dx), free(g->dctx), free(g->dmlp);
    free(g->u), free(g->pooled), free(g->logits), free(g->capped), free(g->dpre);
}

static int grad_alloc(grad_pass *g, const patcher *pt)
{
    const lens_config *c = &pt->m->cfg;
    const size_t T = (size_t)pt->T, L = (size_t)pt->L, C = (size_t)pt->C, QK = (size_t)c->n_heads * c->d_head_k;
    int failed = 0;
    g->pt = pt;
    g->cache = calloc(L, sizeof *g->cache);
    if (!g->cache) return -1;
    for (int l = 0; l < pt->L; l++) failed |= lens_block_cache_init(&g->cache[l], pt->m, l, pt->T, 0);
    failed |= lens_block_cache_init(&g->final, pt->m, pt->L, pt->T, 0);
    float **f[] = {&g->probs, &g->x, &g->h, &g->n, &g->ctx, &g->ff, &g->dq, &g->dk, &g->dv, &g->dprobs, &g->dscores,
                   &g->dx, &g->dctx, &g->dmlp, &g->u, &g->pooled, &g->logits, &g->capped, &g->dpre};
    const size_t sizes[] = {L * pt->NH * T * T, T * C, T * C, T * C, T * pt->VO, T * lens_ff_cols(pt->m), T * QK,
                            T * QK, T * pt->VO, pt->NH * T * T, T * T, L * T * C, L * T * pt->VO, L * T * C, C, C,
                            pt->K, pt->K, C};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (!(*f[i] = calloc(sizes[i] ? sizes[i] : 1, sizeof(float)))) failed = 1;
    return failed ? -1 : 0;
}

/* attend hook: ctx of the one sequence, probabilities kept for the backward */
static void grad_attend(lens_block_io *io, int l)
{
    const grad_pass *g = io->attend_ctx;
    const patcher *pt = g->pt;
    const lens_config *c = &pt->m->cfg;
    const size_t TT = (size_t)pt->T * pt->T;
    const lens_score_fn f = lens_model_scores(pt->m, l, lens_has_cap(c, LENS_CAP_CAUSAL));
    lens_attention_forward(io->ctx, g->probs + (size_t)l * pt->NH * TT, TT, io->q, io->k, io->v, pt->T, pt->NH,
                           c->d_head_k, c->d_head_v, &f);
}

/* attend_backward hook: ∂F/∂ctx kept, then dq, dk, dv */
static int grad_attend_backward(lens_block_io *io, int l)
{
    const grad_pass *g = io->attend_ctx;
    const patcher *pt = g->pt;
    const lens_config *c = &pt->m->cfg;
    const size_t T = (size_t)pt->T, TT = T * T, QK = (size_t)c->n_heads * c->d_head_k;
    const lens_score_fn f = lens_model_scores(pt->m, l, lens_has_cap(c, LENS_CAP_CAUSAL));
    memcpy(g->dctx + (size_t)l * T * pt->VO, io->ctx, sizeof(float) * T * pt->VO);
    memset(io->q, 0, sizeof(float) * T * QK);
    memset(io->k, 0, sizeof(float) * T * QK);
    memset(io->v, 0, sizeof(float) * T * pt->VO);
    lens_attention_backward(io->q, io->k, io->v, g->dprobs, TT, g->dscores, io->ctx, io->cache->q, io->cache->k,
                            io->cache->v, g->probs + (size_t)l * pt->NH * TT, TT, pt->T, pt->NH, c->d_head_k,
                            c->d_head_v, &f);
    return 0;
}

static void grad_mlp_backward(lens_block_io *io, int l, const float *dy)
{
    const grad_pass *g = io->attend_ctx;
    const size_t TC = (size_t)g->pt->T * g->pt->C;
    memcpy(g->dmlp + (size_t)l * TC, dy, sizeof(float) * TC);
}

/* Forward of the corrupt sequence from its embedding (the corrupt pass's
 * x_0), the head at the objective, dF/dz, and the backward to x_0. */
static void grad_run(grad_pass *g)
{
    const patcher *pt = g->pt;
    const lens_model *m = pt->m;
    const int T = pt->T, C = pt->C, L = pt->L, K = pt->K;
    lens_pool *pool = pt->opts->pool;
    memcpy(g->x, lens_act_hidden(m, &pt->corrupt, 0, 0), sizeof(float) * T * C);
    lens_block_io io = {.N = T, .x = g->x, .h = g->h, .n = g->n, .ctx = g->ctx, .ff = g->ff, .pool = pool,
                        .attend = grad_attend, .attend_ctx = g};
    for (int l = 0; l <= L; l++) {
        io.cache = l < L ? &g->cache[l] : &g->final;
        io.q = io.cache->q, io.k = io.cache->k, io.v = io.cache->v;
        lens_block_forward(m, &io, l);
    }
    /* the head: z = head(final_norm(x_L)) at the objective (head.h), then dF/dz in place */
    float *dlast = g->n; /* ∂F/∂x_L, [T][C] */
    memset(dlast, 0, sizeof(float) * T * C);
    const int row0 = 0;
    if (pt->lm) {
        lens_causal_lm_forward(m, g->logits, g->x + (size_t)pt->obj.position * C, 1, pool);
        memcpy(g->capped, g->logits, sizeof(float) * K);
        lens_objective_at(&pt->obj, g->logits, K, pt->target, g->logits);
        lens_objective_grad(&pt->obj, g->logits, K, pt->target);
        lens_causal_lm_backward(m, NULL, dlast + (size_t)pt->obj.position * C, 0, g->logits, g->capped, NULL, 1, pool);
    } else {
        lens_classifier_pool(m, g->u, g->x, &row0, &T, 1);
        lens_classifier_forward(m, g->pooled, g->logits, g->u, 1, pool);
        lens_objective_at(&pt->obj, g->logits, K, pt->target, g->logits);
        lens_objective_grad(&pt->obj, g->logits, K, pt->target);
        float *du = g->h; /* [C], free until the backward */
        lens_classifier_backward(m, NULL, du, g->dpre, g->logits, g->u, g->pooled, 1);
        lens_classifier_unpool(m, dlast, du, &row0, &T, 1);
    }
    memcpy(g->x, dlast, sizeof(float) * T * C);
    io = (lens_block_io){.N = T, .x = g->x, .h = g->h, .n = g->n, .q = g->dq, .k = g->dk, .v = g->dv, .ctx = g->ctx,
                         .ff = g->ff, .pool = pool, .attend_backward = grad_attend_backward,
                         .mlp_backward = grad_mlp_backward, .attend_ctx = g};
    for (int l = L; l >= 0; l--) {
        io.cache = l < L ? &g->cache[l] : &g->final;
        lens_block_backward(m, &io, l);
        if (l < L) memcpy(g->dx + (size_t)l * T * C, g->x, sizeof(float) * T * C);
    }
}

/* Σ_{rows t0..t1-1, channels c0..c0+w-1} (clean − corrupt) · grad, of [T][ld] arrays */
static double delta_dot(const float *clean, const float *corrupt, const float *grad, size_t ld, int t0, int t1, int c0,
                        int w)
{
    double sum = 0;
    for (int t = t0; t < t1; t++)
        for (int k = c0; k < c0 + w; k++) {
            const size_t i = (size_t)t * ld + k;
            sum += ((double)clean[i] - corrupt[i]) * grad[i];
        }
    return sum;
}

/* Every asked grid by attribution patching. */
static int attribution_grids(patcher *pt, lens_err *err)
{
    grad_pass g = {0};
    if (grad_alloc(&g, pt)) {
        grad_free(&g);
        return lens_fail(err, LENS_ENOMEM, "out of memory for attribution patching of %d tokens", pt->T);
    }
    grad_run(&g);
    const lens_model *m = pt->m;
    const int T = pt->T, C = pt->C, VO = pt->VO, DV = pt->DV;
    const double gap = pt->out->clean - pt->out->corrupt;
    patch_copy *list = malloc(sizeof *list * (T + pt->NH + pt->NH * T + 1 + T));
    if (!list) {
        grad_free(&g);
        return lens_fail(err, LENS_ENOMEM, "out of memory for attribution patching of %d tokens", T);
    }
    const int n = layer_copies(pt, list);
    for (int l = 0; l < pt->L; l++) {
        const float *x1 = lens_act_hidden(m, &pt->clean, l, 0), *x0 = lens_act_hidden(m, &pt->corrupt, l, 0);
        const float *c1 = lens_act_ctx(m, &pt->clean, l + 1, 0), *c0 = lens_act_ctx(m, &pt->corrupt, l + 1, 0);
        const float *y1 = lens_act_mlp(m, &pt->clean, l + 1, 0), *y0 = lens_act_mlp(m, &pt->corrupt, l + 1, 0);
        const float *dx = g.dx + (size_t)l * T * C, *dctx = g.dctx + (size_t)l * T * VO, *dy = g.dmlp + (size_t)l * T * C;
        for (int s = 0; s < n; s++) {
            const patch_copy *p = &list[s];
            const int t0 = p->t < 0 ? 0 : p->t, t1 = p->t < 0 ? T : p->t + 1;
            double a;
            if (p->grid == LENS_PATCH_RESID) a = delta_dot(x1, x0, dx, C, t0, t1, 0, C);
            else if (p->grid == LENS_PATCH_HEADS || p->grid == LENS_PATCH_HEADS_POS)
                a = delta_dot(c1, c0, dctx, VO, t0, t1, p->h * DV, DV);
            else a = delta_dot(y1, y0, dy, C, t0, t1, 0, C);
            pt->out->grid[p->grid].attribution[grid_index(pt, l, p)] = gap != 0 ? a / gap : NAN;
        }
    }
    free(list);
    grad_free(&g);
    return 0;
}

/* ------------------------------------------------------------ the request */

/* Grid g's size, or 0 when it is not asked for. */
static int grid_size(const patcher *pt, int g)
{
    if (!(pt->opts->grids & 1u << g)) return 0;
    const int L = pt->L, T = pt->T, NH = pt->NH;
    const int n[LENS_PATCH_GRIDS] = {L * T, L * NH, L * NH * T, L, L * T};
    return n[g];
}

static int alloc_grids(patcher *pt, unsigned methods)
{
    int failed = 0;
    for (int k = 0; k < LENS_PATCH_GRIDS; k++) {
        lens_patching_grid *g = &pt->out->grid[k];
        g->n = grid_size(pt, k);
        if (!g->n) continue;
        if (methods & LENS_PATCH_EXACT) {
            g->value = malloc(sizeof(double) * g->n), g->effect = malloc(sizeof(double) * g->n);
            failed |= !g->value || !g->effect;
        }
        if (methods & LENS_PATCH_ATTRIBUTION) failed |= !(g->attribution = malloc(sizeof(double) * g->n));
    }
    return failed ? -1 : 0;
}

int lens_patching_run(const lens_model *m, const int *clean, const int *corrupt, int T, const lens_patching_opts *opts,
                      lens_patching_result *out, lens_err *err)
{
    const lens_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    lens_patching_opts o = *opts;
    o.grids = o.grids ? o.grids : 1u << LENS_PATCH_RESID;
    o.methods = o.methods ? o.methods : LENS_PATCH_EXACT;
    patcher pt = {.m = m, .opts = &o, .T = T, .L = c->n_layers, .C = c->d_model, .NH = c->n_heads,
                  .DV = c->d_head_v, .VO = c->n_heads * c->d_head_v, .lm = c->task == LENS_TASK_CAUSAL_LM, .out = out};
    pt.K = pt.lm ? c->vocab_size : c->n_labels;
    if (!pt.lm && c->task != LENS_TASK_CLASSIFICATION)
        return lens_fail(err, LENS_EINVAL, "patching needs a sequence classifier or a causal LM; this model is %s",
                         lens_task_name(c->task));
    if (o.grids >> LENS_PATCH_GRIDS || o.methods > (LENS_PATCH_EXACT | LENS_PATCH_ATTRIBUTION))
        return lens_fail(err, LENS_EINVAL, "unknown patching grid or method");
    if (lens_objective_resolve(m, opts->objective, T, &pt.obj, err)) return -1;
    const int attribution = o.methods & LENS_PATCH_ATTRIBUTION;
    const lens_batch bc = {.n_seqs = 1, .lengths = &T, .ids = clean}, bx = {.n_seqs = 1, .lengths = &T, .ids = corrupt};
    const int row = pt.obj.position;
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_LOGITS | LENS_KEEP_CTX | LENS_KEEP_MLP,
                            .cancel = o.cancel, .pool = o.pool, .logit_rows = pt.lm ? &row : NULL};
    if (lens_forward(m, &bc, &fo, &pt.clean, err)) return -1;
    fo.keep = LENS_KEEP_HIDDEN | LENS_KEEP_LOGITS | (attribution ? LENS_KEEP_CTX | LENS_KEEP_MLP : 0);
    int rc = -1;
    if (lens_forward(m, &bx, &fo, &pt.corrupt, err)) goto done;
    const float *z = lens_act_logits(m, &pt.clean, 0);
    int pred = 0;
    for (int k = 1; k < pt.K; k++) pred = z[k] > z[pred] ? k : pred;
    pt.target = o.target >= 0 ? o.target : pred;
    if (lens_objective_check_target(&pt.obj, pt.target, pt.K, pt.lm, err)) goto done;
    out->T = T, out->n_layers = pt.L, out->n_heads = pt.NH, out->target = pt.target, out->objective = pt.obj;
    out->clean = objective_of(m, &pt.clean, 0, &pt.obj, pt.target);
    out->corrupt = objective_of(m, &pt.corrupt, 0, &pt.obj, pt.target);
    if (alloc_grids(&pt, o.methods)) {
        lens_fail(err, LENS_ENOMEM, "out of memory for the patching grids of %d tokens", T);
        goto done;
    }
    if ((o.methods & LENS_PATCH_EXACT) && exact_grids(&pt, corrupt, err)) goto done;
    if (attribution && attribution_grids(&pt, err)) goto done;
    rc = 0;
done:
    lens_activations_free(&pt.clean);
    lens_activations_free(&pt.corrupt);
    if (rc) lens_patching_result_free(out);
    return rc;
}

void lens_patching_result_free(lens_patching_result *r)
{
    for (int k = 0; k < LENS_PATCH_GRIDS; k++)
        free(r->grid[k].value), free(r->grid[k].effect), free(r->grid[k].attribution);
    memset(r, 0, sizeof *r);
}
