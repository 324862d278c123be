/* forward.c - the forward pass over a packed batch, for any family.
 *
 * Rows of all S sequences are packed into N rows, so every linear map is one
 * GEMM of N rows and no padding exists; attention runs per sequence and head.
 * Only what opts->keep asks for is stored in lens_activations; the rest lives
 * in per-call scratch, so concurrent calls on one model never share memory.
 * The embedding (embedding.h) and the task head (head.h) are every
 * family's; the family (arch.h) computes each block on the buffers of
 * lens_block_io (no cache: nothing is kept for a backward). This file owns
 * the buffers, attention per (sequence, head) (the attend hook) and the
 * layer loop (with its cancel check).
 *
 * Threads: everything runs through opts->pool (NULL = the caller alone).
 * Linear maps split over output panels and row blocks (lens_gemm), attention
 * over (sequence, head) pairs, LayerNorm / GELU / residual / softmax over row
 * ranges; each task is single-threaded and no BLAS call is made. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/model/arch.h"
#include "core/model/embedding.h"
#include "core/model/head.h"
#include "core/nn/ops.h"
#include "core/nn/scores.h"
#include "core/base/pool.h"

/* The block buffers (io, handed to lens_block_forward; ff has lens_ff_cols
 * columns, rows padded off 4 KiB multiples, gemm.h) and what attention
 * needs besides. io.v is the kept values' layer slice or v_scratch. */
typedef struct {
    lens_block_io io;
    const lens_model *m;
    lens_activations *act;
    float *v_scratch; /* [N][NH*DV] when values are not kept */
    float *probs; /* [threads][Tmax][Tmax] when attention is not kept */
    int *pos;     /* [N] position of each row in its sequence (io.pos) */
    int Tmax;
    int causal;   /* mask keys after the query: causal families always, encoders on request */
    const lens_forward_opts *opts;  /* ablations and sums (lens_forward_opts), or NULL */
} scratch;

static float *alloc_floats(size_t n, int *failed)
{
    float *p = n ? malloc(n * sizeof(float)) : NULL;
    if (n && !p) *failed = 1;
    return p;
}

static int check_batch(const lens_model *m, const lens_batch *b, size_t *N, int *Tmax, lens_err *err)
{
    const lens_config *c = &m->cfg;
    if (b->n_seqs < 1) return lens_fail(err, LENS_EINVAL, "a batch needs at least one sequence");
    *N = 0, *Tmax = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int T = b->lengths[s];
        if (T < 1) return lens_fail(err, LENS_EINVAL, "sequence %d is empty", s);
        if (T > c->max_positions)
            return lens_fail(err, LENS_ELIMIT, "sequence %d has %d tokens; the model takes at most %d", s, T,
                             c->max_positions);
        *N += (size_t)T;
        *Tmax = T > *Tmax ? T : *Tmax;
    }
    for (size_t n = 0; n < *N; n++) {
        if (b->ids[n] < 0 || b->ids[n] >= c->vocab_size)
            return lens_fail(err, LENS_EINVAL, "token id %d at position %zu is outside the vocabulary [0, %d)",
                             b->ids[n], n, c->vocab_size);
        if (b->type_ids && (b->type_ids[n] < 0 || b->type_ids[n] >= (c->type_vocab_size ? c->type_vocab_size : 1)))
            return lens_fail(err, LENS_EINVAL, "segment id %d at position %zu is outside [0, %d)", b->type_ids[n], n,
                             c->type_vocab_size ? c->type_vocab_size : 1);
    }
    return 0;
}

/* x[N][C] = the embedding of every sequence (embedding.h; statistics in slot 0). */
static void embed(const lens_model *m, const lens_batch *b, lens_activations *act, float *x)
{
    const int C = m->cfg.d_model;
    for (int s = 0; s < b->n_seqs; s++) {
        const size_t r = (size_t)act->row_start[s];
        lens_embed_forward(m, b->ids + r, b->type_ids ? b->type_ids + r : NULL, b->lengths[s], x + r * C, NULL,
                           act->ln_mean ? act->ln_mean + r : NULL, act->ln_rstd ? act->ln_rstd + r : NULL);
    }
}

typedef struct {
    const scratch *w;
    int layer;
} attend_job;

/* sum[c] += Σ_n y[n][c] over y [N][C] */
static void add_rows(double *sum, const float *y, int N, int C)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) sum[c] += y[(size_t)n * C + c];
}

/* One (sequence, head) pair, as lens_attention_forward does for one head:
 * P = softmax(attn_scale q_h k_h^T) (causal for decoders or on request), ctx_h = P v_h;
 * soft-capped scores and the layer's sliding window when the config has them. */
static void attend_task(void *ctx, int task)
{
    const attend_job *j = ctx;
    const scratch *w = j->w;
    const lens_config *c = &w->m->cfg;
    const lens_activations *act = w->act;
    const int NH = c->n_heads, DK = c->d_head_k, DV = c->d_head_v, QK = NH * DK, VO = NH * DV;
    const int s = task / NH, h = task % NH, T = act->lengths[s];
    const size_t r = (size_t)act->row_start[s];
    /* kept layout [L][NH][sum T*T]: heads of one sequence are attn_layer_size
     * apart; unkept probabilities go to this thread's scratch block */
    float *probs = act->attn ? act->attn + ((size_t)j->layer * NH + h) * act->attn_layer_size + act->attn_start[s]
                             : w->probs + (size_t)lens_pool_thread_index() * w->Tmax * w->Tmax;
    const lens_forward_opts *o = w->opts;
    if (o && o->head_mask && !o->head_mask[j->layer * NH + h]) { /* pruned: P_h = 0, so ctx_h = 0 (or the fill) */
        memset(probs, 0, sizeof(float) * T * T);
        const float *fill = o->head_fill ? o->head_fill + (size_t)j->layer * VO + h * DV : NULL;
        for (int t = 0; t < T; t++) {
            float *y = w->io.ctx + (r + t) * VO + h * DV;
            if (fill) memcpy(y, fill, sizeof(float) * DV);
            else memset(y, 0, sizeof(float) * DV);
        }
        return;
    }
    const lens_gemm_args scores = {.M = T, .N = T, .K = DK, .x = w->io.q + r * QK + h * DK, .ldx = (size_t)QK,
                                   .w = w->io.k + r * QK + h * DK, .ld = (size_t)QK, .w_kn = 0,
                                   .alpha = c->attn_scale, .y = probs, .ldy = (size_t)T};
    lens_gemm(&scores, NULL);
    const lens_score_fn f = lens_model_scores(w->m, j->layer, w->causal);
    lens_scores_forward(probs, T, &f, h);
    const lens_gemm_args context = {.M = T, .N = DV, .K = T, .x = probs, .ldx = (size_t)T,
                                    .w = w->io.v + r * VO + h * DV, .ld = (size_t)VO, .w_kn = 1, .alpha = 1.0f,
                                    .y = w->io.ctx + r * VO + h * DV, .ldy = (size_t)VO};
    lens_gemm(&context, NULL);
}

/* io->ctx = per-sequence multi-head attention of q, k, v, one task per
 * (sequence, head); probabilities kept in act->attn for this layer or in
 * scratch. */
static void attend(lens_block_io *io, int layer)
{
    scratch *w = (scratch *)io; /* io is the first member */
    attend_job j = {.w = w, .layer = layer};
    lens_pool_run(io->pool, w->act->n_seqs * w->m->cfg.n_heads, attend_task, &j);
    const int NH = w->m->cfg.n_heads, DV = w->m->cfg.d_head_v, VO = NH * DV;
    const lens_forward_opts *o = w->opts;
    if (o && o->patch_heads && layer == o->patch_layer)
        for (int n = 0; n < io->N; n++)
            for (int h = 0; h < NH; h++)
                if (o->patch_heads[(size_t)n * NH + h])
                    memcpy(io->ctx + (size_t)n * VO + h * DV, o->patch_ctx + (size_t)n * VO + h * DV,
                           sizeof(float) * DV);
    if (w->act->ctx) memcpy(w->act->ctx + (size_t)layer * io->N * VO, io->ctx, sizeof(float) * io->N * VO);
    if (o && o->ctx_sum) add_rows(o->ctx_sum + (size_t)layer * VO, io->ctx, io->N, VO);
}

/* What layer l's MLP adds to the residual stream, y [N][C]: patched rows
 * replaced, then summed and kept, then replaced when
 * lens_forward_opts.mlp_mask ablates it. */
static void mlp_hook(lens_block_io *io, int l, float *y)
{
    const scratch *w = (const scratch *)io;
    const lens_forward_opts *o = w->opts;
    const int C = w->m->cfg.d_model;
    if (o->patch_mlp_rows && l == o->patch_layer)
        for (int n = 0; n < io->N; n++)
            if (o->patch_mlp_rows[n]) memcpy(y + (size_t)n * C, o->patch_mlp + (size_t)n * C, sizeof(float) * C);
    if (w->act->mlp) memcpy(w->act->mlp + (size_t)l * io->N * C, y, sizeof(float) * io->N * C);
    if (o->mlp_sum) add_rows(o->mlp_sum + (size_t)l * C, y, io->N, C);
    if (!o->mlp_mask || o->mlp_mask[l]) return;
    for (int n = 0; n < io->N; n++) {
        if (o->mlp_fill) memcpy(y + (size_t)n * C, o->mlp_fill + (size_t)l * C, sizeof(float) * C);
        else memset(y + (size_t)n * C, 0, sizeof(float) * C);
    }
}

/* The task head (head.h) on the final hidden states io.x [N][C]. */
static int task_head(const lens_model *m, lens_activations *act, scratch *w)
{
    const lens_config *c = &m->cfg;
    const int N = act->n_tokens, C = c->d_model;
    int failed = 0;
    if (c->task == LENS_TASK_CLASSIFICATION) {
        act->pooled = alloc_floats((size_t)act->n_seqs * C, &failed);
        act->logits = alloc_floats((size_t)act->n_seqs * c->n_labels, &failed);
        if (failed) return -1;
        lens_classifier_pool(m, w->io.h, w->io.x, act->row_start, act->lengths, act->n_seqs);
        lens_classifier_forward(m, act->pooled, act->logits, w->io.h, act->n_seqs, w->io.pool);
    } else if (c->task == LENS_TASK_MASKED_LM || c->task == LENS_TASK_CAUSAL_LM) {
        const int *rows = w->opts ? w->opts->logit_rows : NULL;
        const int R = rows ? act->n_seqs : N;
        act->logits = alloc_floats((size_t)R * c->vocab_size, &failed);
        if (failed) return -1;
        const float *x = w->io.x;
        if (rows) { /* one row per sequence, gathered into io.n */
            for (int s = 0; s < R; s++)
                memcpy(w->io.n + (size_t)s * C, w->io.x + (size_t)(act->row_start[s] + rows[s]) * C,
                       sizeof(float) * C);
            x = w->io.n;
            act->logit_rows = 1;
        }
        if (c->task == LENS_TASK_CAUSAL_LM) lens_causal_lm_forward(m, act->logits, x, R, w->io.pool);
        else lens_mlm_forward(m, act->logits, x, R, &(lens_mlm_rows){.pre = w->io.h}, w->io.pool);
    }
    return 0;
}

static int layout(const lens_model *m, const lens_batch *b, unsigned keep, size_t N, int Tmax,
                  lens_activations *act, scratch *w)
{
    const lens_config *c = &m->cfg;
    const size_t C = (size_t)c->d_model, L = (size_t)c->n_layers;
    const size_t QK = (size_t)c->n_heads * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    int failed = 0;
    act->n_seqs = b->n_seqs;
    act->n_tokens = (int)N;
    act->n_layers = (int)L;
    act->lengths = malloc(sizeof(int) * b->n_seqs);
    act->row_start = malloc(sizeof(int) * b->n_seqs);
    act->attn_start = malloc(sizeof(size_t) * b->n_seqs);
    if (!act->lengths || !act->row_start || !act->attn_start) return -1;
    size_t rows = 0, attn = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        act->lengths[s] = b->lengths[s];
        act->row_start[s] = (int)rows;
        act->attn_start[s] = attn;
        rows += (size_t)b->lengths[s];
        attn += (size_t)b->lengths[s] * b->lengths[s];
    }
    act->attn_layer_size = attn;
    if (keep & LENS_KEEP_HIDDEN) act->hidden = alloc_floats((L + 1) * N * C, &failed);
    if (keep & LENS_KEEP_ATTN) act->attn = alloc_floats(L * c->n_heads * attn, &failed);
    if (keep & LENS_KEEP_VALUES) act->values = alloc_floats(L * N * VO, &failed);
    if (keep & LENS_KEEP_CTX) act->ctx = alloc_floats(L * N * VO, &failed);
    if (keep & LENS_KEEP_MLP) act->mlp = alloc_floats(L * N * C, &failed);
    if ((keep & LENS_KEEP_ROUTER) && c->n_experts)
        act->route = alloc_floats(L * N * (2 * (size_t)c->top_k + c->n_experts), &failed);
    if (keep & LENS_KEEP_LN) {
        act->ln_mean = alloc_floats((2 * L + 1) * N, &failed);
        act->ln_rstd = alloc_floats((2 * L + 1) * N, &failed);
    }
    lens_block_io *io = &w->io;
    io->N = (int)N;
    io->x = alloc_floats(N * C, &failed);
    io->h = alloc_floats(N * C, &failed);
    io->n = alloc_floats(N * C, &failed); /* the programs' second scratch */
    io->q = alloc_floats(N * QK, &failed);
    io->k = alloc_floats(N * QK, &failed);
    io->ctx = alloc_floats(N * VO, &failed);
    /* a gated MLP keeps gate and up side by side: [N][2 d_ff] */
    const size_t ff_cols = (size_t)lens_ff_cols(m);
    io->ff_ld = ff_cols + (ff_cols % 1024 == 0 ? 16 : 0);
    io->ff = alloc_floats(N * io->ff_ld, &failed);
    io->ln_mean = act->ln_mean, io->ln_rstd = act->ln_rstd;
    io->attend = attend;
    w->pos = malloc(sizeof(int) * (N ? N : 1));
    if (!w->pos) failed = 1;
    for (int s = 0; w->pos && s < b->n_seqs; s++)
        for (int t = 0; t < b->lengths[s]; t++) w->pos[act->row_start[s] + t] = t;
    io->pos = w->pos;
    if (!act->values) w->v_scratch = alloc_floats(N * VO, &failed);
    if (!act->attn) w->probs = alloc_floats((size_t)lens_pool_threads(io->pool) * Tmax * Tmax, &failed);
    return failed ? -1 : 0;
}

static void scratch_free(scratch *w)
{
    lens_block_io *io = &w->io;
    free(io->x), free(io->h), free(io->n), free(io->q), free(io->k), free(io->ctx), free(io->ff);
    free(w->v_scratch), free(w->probs), free(w->pos);
}

static void keep_hidden(lens_activations *act, const float *x, int layer, int C)
{
    if (act->hidden)
        memcpy(act->hidden + (size_t)layer * act->n_tokens * C, x, sizeof(float) * act->n_tokens * C);
}

int lens_forward(const lens_model *m, const lens_batch *batch, const lens_forward_opts *opts,
                 lens_activations *act, lens_err *err)
{
    const lens_config *c = &m->cfg;
    const unsigned keep = opts ? opts->keep : 0;
    const int C = c->d_model, L = c->n_layers;
    memset(act, 0, sizeof *act);
    size_t N = 0;
    int Tmax = 0;
    if (check_batch(m, batch, &N, &Tmax, err)) return -1;
    scratch w = {.io = {.pool = opts ? opts->pool : NULL},
                 .m = m,
                 .act = act,
                 .Tmax = Tmax,
                 .causal = lens_has_cap(c, LENS_CAP_CAUSAL) || (opts && opts->causal),
                 .opts = opts};
    if (opts && (opts->mlp_mask || opts->mlp_sum || opts->patch_mlp_rows || (keep & LENS_KEEP_MLP)))
        w.io.mlp = mlp_hook;
    const int start = opts && opts->start_x ? opts->patch_layer : 0;
    if (start < 0 || start >= L) return lens_fail(err, LENS_EINVAL, "patch layer %d outside 0..%d", start, L - 1);
    if (layout(m, batch, keep, N, Tmax, act, &w)) {
        lens_fail(err, LENS_ENOMEM, "out of memory for a batch of %zu tokens", N);
        goto fail;
    }

    if (opts && opts->start_x) memcpy(w.io.x, opts->start_x, sizeof(float) * N * C);
    else embed(m, batch, act, w.io.x);
    keep_hidden(act, w.io.x, start, C);
    for (int l = start; l < L; l++) {
        if (opts && lens_cancelled(opts->cancel)) {
            lens_fail(err, LENS_ECANCEL, "cancelled at layer %d of %d", l, L);
            goto fail;
        }
        /* this layer's kept values, or scratch */
        w.io.v = act->values ? act->values + (size_t)l * N * c->n_heads * c->d_head_v : w.v_scratch;
        w.io.route = act->route ? act->route + (size_t)l * N * (2 * (size_t)c->top_k + c->n_experts) : NULL;
        lens_block_forward(m, &w.io, l);
        if (l == L - 1) lens_block_forward(m, &w.io, L); /* the final norm, if the family has one */
        keep_hidden(act, w.io.x, l + 1, C);
    }
    if ((keep & LENS_KEEP_LOGITS) && task_head(m, act, &w)) {
        lens_fail(err, LENS_ENOMEM, "out of memory for the logits of %zu tokens", N);
        goto fail;
    }
    scratch_free(&w);
    return 0;
fail:
    scratch_free(&w);
    lens_activations_free(act);
    return -1;
}

void lens_activations_free(lens_activations *act)
{
    free(act->lengths), free(act->row_start), free(act->attn_start);
    free(act->hidden), free(act->attn), free(act->values);
    free(act->ln_mean), free(act->ln_rstd), free(act->pooled), free(act->logits), free(act->route);
    free(act->ctx), free(act->mlp);
    memset(act, 0, sizeof *act);
}

const float *lens_act_hidden(const lens_model *m, const lens_activations *a, int layer, int s)
{
    if (!a->hidden || layer < 0 || layer > a->n_layers || s < 0 || s >= a->n_seqs) return NULL;
    return a->hidden + ((size_t)layer * a->n_tokens + a->row_start[s]) * m->cfg.d_model;
}

const float *lens_act_attn(const lens_model *m, const lens_activations *a, int layer, int head, int s)
{
    if (!a->attn || layer < 1 || layer > a->n_layers || head < 0 || head >= m->cfg.n_heads || s < 0 ||
        s >= a->n_seqs)
        return NULL;
    return a->attn + ((size_t)(layer - 1) * m->cfg.n_heads + head) * a->attn_layer_size + a->attn_start[s];
}

const float *lens_act_values(const lens_model *m, const lens_activations *a, int layer, int s)
{
    if (!a->values || layer < 1 || layer > a->n_layers || s < 0 || s >= a->n_seqs) return NULL;
    const size_t VO = (size_t)m->cfg.n_heads * m->cfg.d_head_v;
    return a->values + ((size_t)(layer - 1) * a->n_tokens + a->row_start[s]) * VO;
}

const float *lens_act_logits(const lens_model *m, const lens_activations *a, int s)
{
    if (!a->logits || s < 0 || s >= a->n_seqs) return NULL;
    if (m->cfg.task == LENS_TASK_CLASSIFICATION) return a->logits + (size_t)s * m->cfg.n_labels;
    if (a->logit_rows) return a->logits + (size_t)s * m->cfg.vocab_size;
    return a->logits + (size_t)a->row_start[s] * m->cfg.vocab_size;
}

const float *lens_act_ctx(const lens_model *m, const lens_activations *a, int layer, int s)
{
    if (!a->ctx || layer < 1 || layer > a->n_layers || s < 0 || s >= a->n_seqs) return NULL;
    const size_t VO = (size_t)m->cfg.n_heads * m->cfg.d_head_v;
    return a->ctx + ((size_t)(layer - 1) * a->n_tokens + a->row_start[s]) * VO;
}

const float *lens_act_mlp(const lens_model *m, const lens_activations *a, int layer, int s)
{
    if (!a->mlp || layer < 1 || layer > a->n_layers || s < 0 || s >= a->n_seqs) return NULL;
    return a->mlp + ((size_t)(layer - 1) * a->n_tokens + a->row_start[s]) * m->cfg.d_model;
}

const float *lens_act_route(const lens_model *m, const lens_activations *a, int layer, int s)
{
    const lens_config *c = &m->cfg;
    if (!a->route || layer < 1 || layer > a->n_layers || !lens_layer_moe(c, layer - 1) || s < 0 || s >= a->n_seqs)
        return NULL;
    const size_t RF = 2 * (size_t)c->top_k + c->n_experts;
    return a->route + ((size_t)(layer - 1) * a->n_tokens + a->row_start[s]) * RF;
}
