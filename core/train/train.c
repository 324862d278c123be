/* train.c - training any family with a block backward, as a classifier,
 * masked LM or causal LM (the tasks its task_archs name): parameters, the
 * forward pass that keeps what backward needs, the backward pass, AdamW,
 * checkpoints. Nothing here names a family: the embedding and the heads
 * are core/model's (embedding.h, head.h, each with its backward), the blocks
 * the family's programs run by block.h (lens_block_forward caching into a
 * lens_block_cache with the linear maps' inputs, lens_block_backward with
 * weight gradients through a lens_grad_map). This file owns the losses and attention over the packed
 * sequences (the attend hooks). A summed-heads BERT (head_combination sum)
 * is explained above tile_summed.
 *
 * Model (no dropout):
 *   x_0 = embed(ids, seg)                        (embedding.h)
 *   per layer l:  x_{l+1} = block_l(x_l)         (the family's)
 *   x_L = final_norm(x_L)                        (pre-norm families)
 *   classifier: logits = head(x_L[first row]);  loss = mean over sequences of -log softmax(logits)[label]
 *   masked LM:  logits = head(x_L) on the masked rows; loss = their mean cross-entropy
 *   causal LM:  logits = head(x_L);  loss = mean next-token cross-entropy
 * Backward walks the same lines in reverse; weight gradients land in one
 * buffer laid out as the parameters.
 *
 * Shapes: S sequences, N packed tokens, C d_model, F d_ff, NH heads, DK / DV
 * per-head key / value size (the identifiable variant has DK != DV), K labels,
 * A = sum over sequences of T*T (one head's attention probabilities). */
#include "core/train/train.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/base/gemm.h"
#include "core/model/arch.h"
#include "core/model/embedding.h"
#include "core/model/head.h"
#include "core/nn/ops.h"
#include "core/base/pool.h"
#include "core/io/safetensors.h"

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[3];
    size_t off, count;
    int decay; /* AdamW weight decay applies (not biases, not LayerNorm) */
    int summed; /* attention.output.dense.weight of a summed-heads model: held
                 * tiled [C][NH*DV] (count), in files compact [C][DV] (shape) */
    lens_param_kind kind; /* initialisation: weights N(0, init_std), norm gains 1, the rest 0 */
    float init_std;
} tensor_info;

/* Rows of LM-head logits computed at a time ([LM_ROWS][V] instead of [N][V]). */
enum { LM_ROWS = 128 };

/* Activations of one batch, grown to the largest batch seen: each block's
 * lens_block_cache (with the linear maps' inputs, for weight gradients)
 * and attention probabilities, and the io buffers of the family's block
 * forward / backward (arch.h). */
typedef struct {
    size_t N, S, A; /* capacity */
    float *emb, *emb_mean, *emb_rstd; /* embedding LayerNorm: [N][C], [N], [N] its input and statistics */
    int *pos;                 /* [N] position of each row in its sequence (RoPE) */
    float *x;                 /* [N][C] residual stream: after the forward, x_L (post-norm) or LN_f(x_L) */
    lens_block_cache *cache;  /* [L], N rows */
    lens_block_cache final;   /* the final norm's (pre-norm families) */
    float *probs;             /* [L][NH][A] */
    float *ctx;               /* [N][NH*DV] forward context / backward dctx */
    float *cls, *pooled, *logits; /* [S][C], [S][C], [S][K] */
    float *lm_logits, *lm_dlogits; /* [LM_ROWS][V] one chunk of LM-head logits and their gradient */
    /* backward: dx = dL/d(stream), scratch */
    float *dx, *dres, *da;    /* [N][C] */
    float *dff;               /* [N][lens_ff_cols] (also the forward's MLP scratch) */
    float *dq, *dk, *dv;      /* [N][NH*DK], [N][NH*DK], [N][NH*DV] */
    float *dprobs, *dscores;      /* [NH][Tmax^2], [Tmax^2] */
    float *dpooled, *dlogits;     /* [S][C], [S][K] */
    float *dw_summed;             /* summed heads: [C][NH*DV] untied output-weight gradient */
    size_t tmax2;
    int *row_start, *attn_start;  /* [S] */
} acts;

struct lens_trainer {
    lens_config cfg;
    lens_params p;        /* views into param */
    float *param, *grad, *m, *v;
    size_t n_param;
    tensor_info *tensors;
    int n_tensors;
    long step;
    acts a;
    lens_pool *pool; /* owned: the forward GEMMs' threads (lens_trainer_set_threads), or NULL */
    lens_model view; /* cfg and p as a lens_model, for the family's block functions */
};

/* ------------------------------------------------------------- parameters */

static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) { return ((rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static float rng_normal(uint64_t *s)
{
    return (float)(sqrt(-2.0 * log(rng_uniform(s))) * cos(2.0 * M_PI * rng_uniform(s)));
}

/* Parameter visitor of the family's walker (arch.h): the first walk counts
 * the tensors (t->param NULL), the second binds t->p into t->param and
 * records each tensor's name, file shape, decay and initialisation. */
typedef struct {
    lens_param_visitor v; /* first member */
    lens_trainer *t;
    size_t off;
    int n;
} walker;

static const void *take(lens_param_visitor *v, const lens_param_desc *d)
{
    walker *w = (walker *)v;
    const lens_config *c = &w->t->cfg;
    /* a summed output weight is held tiled, [C][NH*DV] (tile_summed) */
    const size_t count = d->summed ? (size_t)d->shape[0] * c->n_heads * c->d_head_v : lens_param_numel(d);
    if (w->t->tensors) {
        tensor_info *ti = &w->t->tensors[w->n];
        snprintf(ti->name, sizeof ti->name, "%s", d->name);
        ti->ndim = d->ndim;
        for (int i = 0; i < 3; i++) ti->shape[i] = i < d->ndim ? d->shape[i] : 0;
        ti->off = w->off, ti->count = count;
        ti->decay = d->kind == LENS_PARAM_WEIGHT || d->kind == LENS_PARAM_EMBEDDING;
        ti->summed = d->summed;
        ti->kind = d->kind;
        ti->init_std = d->init_std;
    }
    float *p = w->t->param ? w->t->param + w->off : NULL;
    w->off += count;
    w->n++;
    return p;
}

static void walk(lens_trainer *t, walker *w)
{
    *w = (walker){.v = {.tensor = take, .tiles_summed = 1}, .t = t};
    lens_walk_params(&t->cfg, &t->p, &w->v);
}

/* Summed heads (model.h): the trainer keeps W_O tiled, [C][NH*DV] with
 * column m a copy of compact column lens_head_summed_column(m), so forward
 * and backward are the concat model's. Each compact entry has NH copies;
 * they stay equal because they start equal and always get the same
 * gradient (the sum over the copies, see tie_summed_grad). */

/* tiled[C][NH*DV] from compact[C][DV]. */
static void tile_summed(const lens_config *c, float *tiled, const float *compact)
{
    const int DV = c->d_head_v, VO = c->n_heads * DV;
    for (int o = 0; o < c->d_model; o++)
        for (int m = 0; m < VO; m++) tiled[(size_t)o * VO + m] = compact[(size_t)o * DV + lens_head_summed_column(c, m)];
}

/* compact[C][DV] from tiled[C][NH*DV] (one copy of each entry). */
static void compact_summed(const lens_config *c, float *compact, const float *tiled)
{
    const int DV = c->d_head_v, VO = c->n_heads * DV;
    for (int o = 0; o < c->d_model; o++)
        for (int m = 0; m < VO; m++) compact[(size_t)o * DV + lens_head_summed_column(c, m)] = tiled[(size_t)o * VO + m];
}

/* W_cat = W_O tiled, so dL/dW_O[o][j] = sum over the copies m of j of
 * dW_cat[o][m]; that sum is added to every copy of grad [C][NH*DV].
 * untied: [C][NH*DV] gradient of the tiled weight taken as free. */
static void tie_summed_grad(const lens_config *c, float *grad, const float *untied)
{
    const int DV = c->d_head_v, VO = c->n_heads * DV;
    float sum[DV];
    for (int o = 0; o < c->d_model; o++) {
        const float *u = untied + (size_t)o * VO;
        float *g = grad + (size_t)o * VO;
        memset(sum, 0, sizeof sum);
        for (int m = 0; m < VO; m++) sum[lens_head_summed_column(c, m)] += u[m];
        for (int m = 0; m < VO; m++) g[m] += sum[lens_head_summed_column(c, m)];
    }
}

/* Elements of a tensor in checkpoint files. */
static size_t file_count(const tensor_info *ti)
{
    size_t n = 1;
    for (int i = 0; i < ti->ndim; i++) n *= (size_t)ti->shape[i];
    return n;
}

/* Tensor ti of buffer base ([n_param]) as written to files: base + off, or
 * for a summed tensor its compact form in scratch [C][DV]. */
static const float *file_data(const lens_trainer *t, const tensor_info *ti, const float *base, float *scratch)
{
    if (!ti->summed) return base + ti->off;
    compact_summed(&t->cfg, scratch, base + ti->off);
    return scratch;
}

/* Copies src (file layout) into tensor ti of buffer base. */
static void set_from_file(const lens_trainer *t, const tensor_info *ti, float *base, const float *src)
{
    if (ti->summed) tile_summed(&t->cfg, base + ti->off, src);
    else memcpy(base + ti->off, src, ti->count * sizeof(float));
}

static int copy_config(lens_config *dst, const lens_config *src)
{
    *dst = *src;
    dst->labels = NULL;
    if (src->labels) {
        dst->labels = calloc((size_t)src->n_labels, sizeof *dst->labels);
        if (!dst->labels) return -1;
        for (int i = 0; i < src->n_labels; i++)
            if (!(dst->labels[i] = strdup(src->labels[i]))) return -1;
    }
    return 0;
}

lens_trainer *lens_trainer_new(const lens_config *cfg, unsigned long long seed, lens_err *err)
{
    /* the task the config names, as long as the family has an HF class for it (every block has a backward) */
    const lens_family *f = cfg->family;
    const lens_task task = cfg->task;
    if (!f || task == LENS_TASK_ENCODER || !f->task_archs[task] ||
        (task == LENS_TASK_CLASSIFICATION && cfg->n_labels < 2)) {
        lens_fail(err, LENS_EINVAL,
                  "training needs a classification (>= 2 labels), masked-LM or causal-LM config of a family with "
                  "that task (%s%s%s)",
                  f ? f->model_type : "no family", f ? " " : "", f ? lens_task_name(task) : "");
        return NULL;
    }
    lens_trainer *t = calloc(1, sizeof *t);
    if (!t || copy_config(&t->cfg, cfg)) goto oom;
    if (task != LENS_TASK_CLASSIFICATION) t->cfg.n_labels = 0;
    t->cfg.random_weights = 0;
    snprintf(t->cfg.architecture, sizeof t->cfg.architecture, "%s", f->task_archs[task]);
    if (lens_has_cap(cfg, LENS_CAP_SEGMENTS) && !t->cfg.type_vocab_size) t->cfg.type_vocab_size = 2;
    /* per-head sizes as model.h defaults them */
    if (!t->cfg.d_head_k) t->cfg.d_head_k = cfg->d_model / cfg->n_heads;
    if (!t->cfg.d_head_v) t->cfg.d_head_v = cfg->d_model / cfg->n_heads;
    lens_config_set_attn_scale(&t->cfg);
    t->p.blocks = calloc((size_t)cfg->n_layers, sizeof *t->p.blocks);
    if (!t->p.blocks) goto oom;
    walker w;
    walk(t, &w); /* count */
    t->n_param = w.off, t->n_tensors = w.n;
    t->tensors = calloc((size_t)w.n, sizeof *t->tensors);
    t->param = malloc(t->n_param * sizeof(float));
    t->grad = calloc(t->n_param, sizeof(float));
    t->m = calloc(t->n_param, sizeof(float));
    t->v = calloc(t->n_param, sizeof(float));
    if (!t->tensors || !t->param || !t->grad || !t->m || !t->v) goto oom;
    walk(t, &w); /* bind */
    t->view = (lens_model){.cfg = t->cfg, .p = t->p};
    float *compact = NULL;
    if (t->cfg.head_combination) {
        const size_t n = (size_t)cfg->d_model * cfg->d_head_v, tiled = n * cfg->n_heads;
        compact = malloc(n * sizeof(float));
        t->a.dw_summed = malloc(tiled * sizeof(float));
        if (!compact || !t->a.dw_summed) {
            free(compact);
            goto oom;
        }
    }
    uint64_t state = seed;
    for (int i = 0; i < t->n_tensors; i++) {
        const tensor_info *ti = &t->tensors[i];
        float *p = ti->summed ? compact : t->param + ti->off;
        const int random = ti->kind == LENS_PARAM_WEIGHT || ti->kind == LENS_PARAM_EMBEDDING;
        const float fill = ti->kind == LENS_PARAM_NORM_WEIGHT ? 1.0f : 0.0f;
        for (size_t j = 0; j < file_count(ti); j++) p[j] = random ? ti->init_std * rng_normal(&state) : fill;
        if (ti->summed) set_from_file(t, ti, t->param, compact);
    }
    free(compact);
    return t;
oom:
    lens_fail(err, LENS_ENOMEM, "out of memory for the trainer");
    lens_trainer_free(t);
    return NULL;
}

static void acts_free(acts *a, int L)
{
    float **all[] = {&a->emb, &a->emb_mean, &a->emb_rstd, &a->x, &a->probs, &a->ctx, &a->cls, &a->pooled,
                     &a->logits, &a->lm_logits, &a->lm_dlogits, &a->dx, &a->dres, &a->da, &a->dff, &a->dq, &a->dk, &a->dv,
                     &a->dprobs, &a->dscores, &a->dpooled, &a->dlogits, &a->dw_summed};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(*all[i]), *all[i] = NULL;
    for (int l = 0; a->cache && l < L; l++) lens_block_cache_free(&a->cache[l]);
    free(a->cache), a->cache = NULL;
    lens_block_cache_free(&a->final);
    free(a->row_start), free(a->attn_start), free(a->pos);
    a->row_start = a->attn_start = a->pos = NULL;
    a->N = a->S = a->A = a->tmax2 = 0;
}

void lens_trainer_free(lens_trainer *t)
{
    if (!t) return;
    acts_free(&t->a, t->cfg.n_layers);
    lens_pool_free(t->pool);
    free(t->param), free(t->grad), free(t->m), free(t->v), free(t->tensors), free(t->p.blocks);
    lens_config_free(&t->cfg);
    free(t);
}

int lens_trainer_set_threads(lens_trainer *t, int threads, lens_err *err)
{
    lens_pool_free(t->pool);
    t->pool = NULL;
    if (threads > 1 && !(t->pool = lens_pool_create(threads)))
        return lens_fail(err, LENS_ENOMEM, "cannot start %d threads", threads);
    return 0;
}

const lens_config *lens_trainer_config(const lens_trainer *t) { return &t->cfg; }

float *lens_trainer_params(lens_trainer *t, size_t *n)
{
    if (n) *n = t->n_param;
    return t->param;
}

float *lens_trainer_grads(lens_trainer *t, size_t *n)
{
    if (n) *n = t->n_param;
    return t->grad;
}

int lens_trainer_tensor(const lens_trainer *t, int i, const char **name, size_t *offset, size_t *count)
{
    if (i < 0 || i >= t->n_tensors) return -1;
    if (name) *name = t->tensors[i].name;
    if (offset) *offset = t->tensors[i].off;
    if (count) *count = t->tensors[i].count;
    return 0;
}

void lens_trainer_zero_grad(lens_trainer *t) { memset(t->grad, 0, t->n_param * sizeof(float)); }

/* The gradient of a parameter tensor: same offset in the gradient buffer. */
static float *G(const lens_trainer *t, const float *param) { return t->grad + (param - t->param); }


int lens_trainer_load_weights(lens_trainer *t, const char *dir, int *n_loaded, lens_err *err)
{
    lens_weights *w = lens_weights_open(dir, err);
    if (!w) return -1;
    int loaded = 0;
    for (int i = 0; i < t->n_tensors; i++) {
        const tensor_info *ti = &t->tensors[i];
        const char *name = ti->name;
        const char *prefix = t->cfg.family->base_prefix;
        if (!lens_weights_has(w, name) && !strncmp(name, prefix, strlen(prefix))) name += strlen(prefix);
        if (!lens_weights_has(w, name)) continue;
        const float *src = lens_weights_get(w, name, ti->ndim, ti->shape, err);
        if (!src) {
            lens_weights_close(w);
            return -1;
        }
        set_from_file(t, ti, t->param, src);
        loaded++;
    }
    lens_weights_close(w);
    if (n_loaded) *n_loaded = loaded;
    if (!loaded) return lens_fail(err, LENS_EFORMAT, "%s: no tensor of the model found", dir);
    return 0;
}

/* ------------------------------------------------------------ activations */

static int grow(float **p, size_t n)
{
    float *q = realloc(*p, (n ? n : 1) * sizeof(float));
    if (!q) return -1;
    *p = q;
    return 0;
}

static int acts_reserve(lens_trainer *t, size_t N, size_t S, size_t A, size_t tmax2)
{
    acts *a = &t->a;
    const lens_config *c = &t->cfg;
    const size_t C = (size_t)c->d_model, L = (size_t)c->n_layers, F = (size_t)lens_ff_cols(&t->view), NH = (size_t)c->n_heads;
    const size_t QK = NH * c->d_head_k, VO = NH * c->d_head_v, K = (size_t)c->n_labels;
    int failed = 0;
    if (N > a->N) {
        if (t->p.ln_emb.w) failed |= grow(&a->emb, N * C) | grow(&a->emb_mean, N) | grow(&a->emb_rstd, N);
        if (c->task == LENS_TASK_CAUSAL_LM && !a->lm_logits)
            failed |= grow(&a->lm_logits, (size_t)LM_ROWS * c->vocab_size) |
                      grow(&a->lm_dlogits, (size_t)LM_ROWS * c->vocab_size);
        int *pos = realloc(a->pos, N * sizeof(int));
        if (pos) a->pos = pos;
        failed |= !pos;
        if (!a->cache) failed |= !(a->cache = calloc(L, sizeof *a->cache));
        for (size_t l = 0; l < L && !failed; l++) {
            lens_block_cache_free(&a->cache[l]);
            failed |= lens_block_cache_init(&a->cache[l], &t->view, (int)l, (int)N, 1);
        }
        lens_block_cache_free(&a->final);
        failed |= lens_block_cache_init(&a->final, &t->view, c->n_layers, (int)N, 1);
        failed |= grow(&a->x, N * C) | grow(&a->ctx, N * VO);
        failed |= grow(&a->dx, N * C) | grow(&a->dres, N * C) | grow(&a->da, N * C);
        failed |= grow(&a->dff, N * F) | grow(&a->dq, N * QK) | grow(&a->dk, N * QK) | grow(&a->dv, N * VO);
        if (!failed) a->N = N;
    }
    if (S > a->S) {
        failed |= grow(&a->cls, S * C) | grow(&a->pooled, S * C) | grow(&a->logits, S * K) |
                  grow(&a->dpooled, S * C) | grow(&a->dlogits, S * K);
        int *rs = realloc(a->row_start, S * sizeof(int)), *as = rs ? realloc(a->attn_start, S * sizeof(int)) : NULL;
        if (rs) a->row_start = rs;
        if (as) a->attn_start = as;
        failed |= !rs || !as;
        if (!failed) a->S = S;
    }
    if (A > a->A) {
        failed |= grow(&a->probs, L * NH * A);
        if (!failed) a->A = A;
    }
    if (tmax2 > a->tmax2) {
        failed |= grow(&a->dprobs, NH * tmax2) | grow(&a->dscores, tmax2);
        if (!failed) a->tmax2 = tmax2;
    }
    return failed ? -1 : 0;
}

/* ---------------------------------------------------------- forward / backward */

/* The attention of every sequence of the batch, for the family's blocks. */
typedef struct {
    lens_trainer *t;
    const lens_batch *b;
    size_t A;
    int layer; /* backward: the layer whose summed output weight maps to dw_summed */
} batch_attention;

/* attend hook: ctx = attention per sequence, probabilities kept for the backward */
static void train_attend(lens_block_io *io, int l)
{
    const batch_attention *ba = io->attend_ctx;
    const lens_config *c = &ba->t->cfg;
    const acts *a = &ba->t->a;
    const int NH = c->n_heads, DK = c->d_head_k, DV = c->d_head_v, causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    const size_t QK = (size_t)NH * DK, VO = (size_t)NH * DV;
    float *probs = a->probs + (size_t)l * NH * ba->A;
    const lens_score_fn f = lens_model_scores(&ba->t->view, l, causal);
    for (int s = 0; s < ba->b->n_seqs; s++) {
        const size_t r = (size_t)a->row_start[s];
        lens_attention_forward(io->ctx + r * VO, probs + a->attn_start[s], ba->A, io->q + r * QK, io->k + r * QK,
                               io->v + r * VO, ba->b->lengths[s], NH, DK, DV, &f);
    }
}

/* attend_backward hook: dq, dk, dv from dctx per sequence */
static int train_attend_backward(lens_block_io *io, int l)
{
    const batch_attention *ba = io->attend_ctx;
    const lens_config *c = &ba->t->cfg;
    const acts *a = &ba->t->a;
    const int NH = c->n_heads, DK = c->d_head_k, DV = c->d_head_v, causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    const size_t QK = (size_t)NH * DK, VO = (size_t)NH * DV, N = (size_t)io->N;
    const float *probs = a->probs + (size_t)l * NH * ba->A;
    const lens_block_cache *k = io->cache;
    const lens_score_fn f = lens_model_scores(&ba->t->view, l, causal);
    float *dsinks = f.sinks && io->grads ? io->grads->of(io->grads, f.sinks) : NULL; /* gpt-oss */
    memset(io->q, 0, N * QK * sizeof(float));
    memset(io->k, 0, N * QK * sizeof(float));
    memset(io->v, 0, N * VO * sizeof(float));
    for (int s = 0; s < ba->b->n_seqs; s++) {
        const size_t r = (size_t)a->row_start[s];
        lens_attention_backward(io->q + r * QK, io->k + r * QK, io->v + r * VO, a->dprobs, a->tmax2, a->dscores,
                                io->ctx + r * VO, k->q + r * QK, k->k + r * QK, k->v + r * VO,
                                probs + a->attn_start[s], ba->A, ba->b->lengths[s], NH, DK, DV, &f);
        for (int h = 0; dsinks && h < NH; h++) /* the dP of each head the call left in dprobs */
            dsinks[h] += lens_scores_sink_backward(probs + a->attn_start[s] + h * ba->A, a->dprobs + h * a->tmax2,
                                                   ba->b->lengths[s], &f);
    }
    return 0;
}

/* Segment ids for the embedding: only families with segments read them. */
static const int *segments(const lens_trainer *t, const lens_batch *b, int r)
{
    return b->type_ids && lens_has_cap(&t->cfg, LENS_CAP_SEGMENTS) ? b->type_ids + r : NULL;
}

/* The embedding, then the family's blocks (caching for the backward) and
 * final norm: a->x = x_L, or final_norm(x_L) for pre-norm families. */
static void forward(lens_trainer *t, const lens_batch *b, size_t N, size_t A)
{
    const lens_config *c = &t->cfg;
    acts *a = &t->a;
    const int C = c->d_model, n = (int)N;
    for (int s = 0; s < b->n_seqs; s++) {
        const int r = a->row_start[s];
        lens_embed_forward(&t->view, b->ids + r, segments(t, b, r), b->lengths[s], a->x + (size_t)r * C,
                           a->emb ? a->emb + (size_t)r * C : NULL, a->emb ? a->emb_mean + r : NULL,
                           a->emb ? a->emb_rstd + r : NULL);
        for (int i = 0; i < b->lengths[s]; i++) a->pos[r + i] = i;
    }
    batch_attention ba = {.t = t, .b = b, .A = A};
    lens_block_io io = {.N = n, .x = a->x, .h = a->dres, .n = a->da, .ctx = a->ctx, .ff = a->dff, .pos = a->pos,
                        .pool = t->pool, .attend = train_attend, .attend_ctx = &ba};
    for (int l = 0; l < c->n_layers; l++) {
        io.cache = &a->cache[l];
        io.q = io.cache->q, io.k = io.cache->k, io.v = io.cache->v;
        lens_block_forward(&t->view, &io, l);
    }
    io.cache = &a->final;
    lens_block_forward(&t->view, &io, c->n_layers);
}

/* The gradient buffer of a parameter of the embedding or a head. */
static float *param_grad(const lens_grad_map *g, const float *param) { return G(g->ctx, param); }

/* Weight gradients for the family's block backward: a parameter's gradient
 * sits at the same offset of t->grad, except a summed output weight's, which
 * goes to dw_summed to be tied (tie_summed_grad). */
static float *grad_of(const lens_grad_map *g, const float *param)
{
    const batch_attention *ba = g->ctx;
    const lens_trainer *t = ba->t;
    if (t->cfg.head_combination && param == t->p.blocks[ba->layer].attn_out.w) return t->a.dw_summed;
    return G(t, param);
}

/* From a->dx = dL/d(forward output a->x) down to the embeddings,
 * accumulating weight gradients: the family's final norm and block
 * backward, then the embedding's (the forward's lines in reverse). */
static void backward(lens_trainer *t, const lens_batch *b, size_t N, size_t A)
{
    const lens_config *c = &t->cfg;
    const lens_params *p = &t->p;
    acts *a = &t->a;
    const int C = c->d_model, S = b->n_seqs, n = (int)N;
    batch_attention ba = {.t = t, .b = b, .A = A};
    const lens_grad_map grads = {.of = grad_of, .ctx = &ba}, param_grads = {.of = param_grad, .ctx = t};
    lens_block_io io = {.N = n, .x = a->dx, .h = a->dres, .n = a->da, .q = a->dq, .k = a->dk, .v = a->dv,
                        .ctx = a->ctx, .ff = a->dff, .pos = a->pos, .pool = t->pool, .grads = &grads,
                        .attend_backward = train_attend_backward, .attend_ctx = &ba};
    io.cache = &a->final;
    lens_block_backward(&t->view, &io, c->n_layers);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        io.cache = &a->cache[l];
        ba.layer = l;
        if (c->head_combination) memset(a->dw_summed, 0, (size_t)C * c->n_heads * c->d_head_v * sizeof(float));
        lens_block_backward(&t->view, &io, l);
        if (c->head_combination) tie_summed_grad(c, G(t, p->blocks[l].attn_out.w), a->dw_summed);
    }
    for (int s = 0; s < S; s++) {
        const size_t r = (size_t)a->row_start[s];
        lens_embed_backward(&t->view, &param_grads, a->dx + r * C, b->ids + r, segments(t, b, (int)r), b->lengths[s],
                            a->emb ? a->emb + r * C : NULL, a->emb ? a->emb_mean + r : NULL,
                            a->emb ? a->emb_rstd + r : NULL, a->dres + r * C);
    }
}

/* Checks the batch, sizes the activations and runs the encoder. */
static int encode(lens_trainer *t, const lens_batch *b, size_t *N_out, size_t *A_out, lens_err *err)
{
    const lens_config *c = &t->cfg;
    const int S = b->n_seqs;
    if (S < 1) return lens_fail(err, LENS_EINVAL, "a batch needs at least one sequence");
    size_t N = 0, A = 0, tmax2 = 0;
    for (int s = 0; s < S; s++) {
        const int T = b->lengths[s];
        if (T < 1 || T > c->max_positions)
            return lens_fail(err, LENS_ELIMIT, "sequence %d has %d tokens (1..%d)", s, T, c->max_positions);
        N += (size_t)T, A += (size_t)T * T;
        if ((size_t)T * T > tmax2) tmax2 = (size_t)T * T;
    }
    for (size_t i = 0; i < N; i++) {
        if (b->ids[i] < 0 || b->ids[i] >= c->vocab_size)
            return lens_fail(err, LENS_EINVAL, "token id %d outside the vocabulary", b->ids[i]);
        if (b->type_ids && lens_has_cap(c, LENS_CAP_SEGMENTS) && (b->type_ids[i] < 0 || b->type_ids[i] >= c->type_vocab_size))
            return lens_fail(err, LENS_EINVAL, "segment id %d out of range", b->type_ids[i]);
    }
    if (acts_reserve(t, N, (size_t)S, A, tmax2)) return lens_fail(err, LENS_ENOMEM, "out of memory for %zu tokens", N);
    acts *a = &t->a;
    for (int s = 0, r = 0, q = 0; s < S; s++) {
        a->row_start[s] = r, a->attn_start[s] = q;
        r += b->lengths[s], q += b->lengths[s] * b->lengths[s];
    }
    forward(t, b, N, A);
    *N_out = N, *A_out = A;
    return 0;
}


/* -log softmax(z)[y] over K logits; dz = (softmax(z) - onehot(y)) * scale
 * (dz may be z). The LM heads have K = V, tens of thousands, so every loop
 * is one the compiler vectorises: maximum and sum over 8 lanes (the sum in
 * double), lens_exp_approx (core/nn/ops.h). The loss keeps ~1e-7 relative accuracy, which
 * the finite-difference tests need. */
static double cross_entropy(const float *z, int K, int y, float *dz, double scale)
{
    enum { LANES = 8 };
    float lane_max[LANES];
    for (int l = 0; l < LANES; l++) lane_max[l] = z[0];
    int j = 0;
    for (; j + LANES <= K; j += LANES)
        for (int l = 0; l < LANES; l++) lane_max[l] = z[j + l] > lane_max[l] ? z[j + l] : lane_max[l];
    float mx = z[0];
    for (int l = 0; l < LANES; l++) mx = lane_max[l] > mx ? lane_max[l] : mx;
    for (; j < K; j++) mx = z[j] > mx ? z[j] : mx;
    const double zy = z[y]; /* before dz, which may overwrite z */
    for (j = 0; j < K; j++) dz[j] = lens_exp_approx(z[j] - mx);
    double lane_sum[LANES] = {0}, sum = 0;
    for (j = 0; j + LANES <= K; j += LANES)
        for (int l = 0; l < LANES; l++) lane_sum[l] += dz[j + l];
    for (; j < K; j++) sum += dz[j];
    for (int l = 0; l < LANES; l++) sum += lane_sum[l];
    const float norm = (float)(scale / sum);
    for (j = 0; j < K; j++) dz[j] *= norm;
    dz[y] -= (float)scale;
    return log(sum) + mx - zy;
}

int lens_trainer_batch(lens_trainer *t, const lens_batch *b, const int *labels, int backward_pass, float *loss,
                       float *logits, lens_err *err)
{
    const int S = b->n_seqs, K = t->cfg.n_labels;
    if (t->cfg.task != LENS_TASK_CLASSIFICATION) return lens_fail(err, LENS_EINVAL, "not a classification trainer");
    for (int s = 0; s < S; s++)
        if (labels[s] < 0 || labels[s] >= K) return lens_fail(err, LENS_EINVAL, "label %d outside [0, %d)", labels[s], K);
    size_t N, A;
    if (encode(t, b, &N, &A, err)) return -1;
    acts *a = &t->a;
    const int C = t->cfg.d_model;
    lens_classifier_pool(&t->view, a->cls, a->x, a->row_start, b->lengths, S);
    lens_classifier_forward(&t->view, a->pooled, a->logits, a->cls, S, t->pool);
    /* loss = mean_s -log softmax(logits_s)[y_s]; dlogits = (softmax - onehot) / S */
    double total = 0;
    for (int s = 0; s < S; s++)
        total += cross_entropy(a->logits + (size_t)s * K, K, labels[s], a->dlogits + (size_t)s * K, 1.0 / S);
    if (loss) *loss = (float)(total / S);
    if (logits) memcpy(logits, a->logits, (size_t)S * K * sizeof(float));
    if (backward_pass) {
        /* du in dpooled, scattered to the rows the classifier read */
        const lens_grad_map grads = {.of = param_grad, .ctx = t};
        lens_classifier_backward(&t->view, &grads, a->dpooled, a->dres, a->dlogits, a->cls, a->pooled, S);
        memset(a->dx, 0, N * C * sizeof(float));
        lens_classifier_unpool(&t->view, a->dx, a->dpooled, a->row_start, b->lengths, S);
        backward(t, b, N, A);
    }
    return 0;
}

int lens_trainer_mlm_batch(lens_trainer *t, const lens_batch *b, const int *targets, int backward_pass,
                           float *loss, int *n_predicted, lens_err *err)
{
    const lens_config *c = &t->cfg;
    const int C = c->d_model, V = c->vocab_size;
    if (c->task != LENS_TASK_MASKED_LM) return lens_fail(err, LENS_EINVAL, "not a masked-LM trainer");
    size_t N, A;
    if (encode(t, b, &N, &A, err)) return -1;
    acts *a = &t->a;
    int M = 0;
    for (size_t i = 0; i < N; i++) {
        if (targets[i] >= V) return lens_fail(err, LENS_EINVAL, "target %d outside the vocabulary", targets[i]);
        M += targets[i] >= 0;
    }
    if (n_predicted) *n_predicted = M;
    if (loss) *loss = 0;
    if (!M) return 0; /* nothing to predict: no loss, no gradient */
    /* only the M predicted rows go through the head (head.h) */
    float *xm = malloc(sizeof(float) * (size_t)M * C * 7), *h = xm + (size_t)M * C, *g = h + (size_t)M * C;
    float *u = g + (size_t)M * C, *du = u + (size_t)M * C, *dg = du + (size_t)M * C, *dxm = dg + (size_t)M * C;
    float *logits = malloc(sizeof(float) * (size_t)M * V), *mean = malloc(sizeof(float) * M * 2);
    int *rows = malloc(sizeof(int) * M);
    if (!xm || !logits || !mean || !rows) {
        free(xm), free(logits), free(mean), free(rows);
        return lens_fail(err, LENS_ENOMEM, "out of memory for %d predictions", M);
    }
    const lens_mlm_rows k = {.pre = h, .act = g, .out = u, .mean = mean, .rstd = mean + M};
    for (size_t i = 0, m = 0; i < N; i++)
        if (targets[i] >= 0) rows[m] = (int)i, memcpy(xm + m * C, a->x + i * C, sizeof(float) * C), m++;
    lens_mlm_forward(&t->view, logits, xm, M, &k, t->pool);
    double total = 0;
    for (int m = 0; m < M; m++)
        total += cross_entropy(logits + (size_t)m * V, V, targets[rows[m]], logits + (size_t)m * V, 1.0 / M);
    if (loss) *loss = (float)(total / M);
    if (backward_pass) { /* cross_entropy wrote the gradient over the logits */
        const lens_grad_map grads = {.of = param_grad, .ctx = t};
        lens_mlm_backward(&t->view, &grads, dxm, logits, xm, &k, M, dg, du);
        memset(a->dx, 0, N * C * sizeof(float));
        for (int m = 0; m < M; m++) memcpy(a->dx + (size_t)rows[m] * C, dxm + (size_t)m * C, sizeof(float) * C);
        backward(t, b, N, A);
    }
    free(xm), free(logits), free(mean), free(rows);
    return 0;
}

int lens_trainer_causal_batch(lens_trainer *t, const lens_batch *b, int backward_pass, float *loss,
                              int *n_predicted, float *logits, lens_err *err)
{
    const lens_config *c = &t->cfg;
    const int C = c->d_model, V = c->vocab_size;
    if (c->task != LENS_TASK_CAUSAL_LM) return lens_fail(err, LENS_EINVAL, "not a causal-LM trainer");
    size_t N, A;
    if (encode(t, b, &N, &A, err)) return -1;
    acts *a = &t->a;
    /* row i of sequence s predicts ids[i + 1] when i + 1 is still in s */
    int M = 0;
    for (int s = 0; s < b->n_seqs; s++) M += b->lengths[s] - 1;
    if (n_predicted) *n_predicted = M;
    /* logits = head(a->x) (head.h: after the final norm), LM_ROWS rows at a time; loss = mean over the M
     * predictions of -log softmax(logits_i)[ids[i + 1]] */
    const lens_grad_map grads = {.of = param_grad, .ctx = t};
    if (backward_pass) memset(a->dx, 0, N * C * sizeof(float));
    double total = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const int r0 = a->row_start[s], T = b->lengths[s];
        for (int i0 = 0; i0 < T; i0 += LM_ROWS) {
            const int rows = T - i0 < LM_ROWS ? T - i0 : LM_ROWS;
            const size_t r = (size_t)r0 + i0;
            lens_causal_lm_forward(&t->view, a->lm_logits, a->x + r * C, rows, t->pool);
            if (logits) memcpy(logits + r * V, a->lm_logits, (size_t)rows * V * sizeof(float));
            for (int i = 0; i < rows; i++) {
                const float *z = a->lm_logits + (size_t)i * V;
                float *dz = a->lm_dlogits + (size_t)i * V;
                if (i0 + i + 1 < T) total += cross_entropy(z, V, b->ids[r + i + 1], dz, M ? 1.0 / M : 0);
                else memset(dz, 0, V * sizeof(float)); /* the last position predicts nothing */
            }
            if (backward_pass && M)
                lens_causal_lm_backward(&t->view, &grads, a->dx + r * C, 1, a->lm_dlogits, a->lm_logits, a->x + r * C,
                                        rows, t->pool);
        }
    }
    if (loss) *loss = M ? (float)(total / M) : 0.0f;
    if (backward_pass && M) backward(t, b, N, A);
    return 0;
}

/* AdamW on n parameters: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * p -= lr (m / c1 / (sqrt(v / c2) + eps) + wd p), g = grad * scale (clipping).
 * no-math-errno lets the compiler vectorise sqrtf (v >= 0 always). */
__attribute__((optimize("no-math-errno"))) static void adamw_update(float *restrict p, const float *restrict g,
                                                                    float *restrict m, float *restrict v, size_t n,
                                                                    float lr, float wd, float scale, float inv_c1,
                                                                    float inv_c2)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    for (size_t j = 0; j < n; j++) {
        const float gj = g[j] * scale;
        m[j] = b1 * m[j] + (1 - b1) * gj;
        v[j] = b2 * v[j] + (1 - b2) * gj * gj;
        p[j] -= lr * ((m[j] * inv_c1) / (sqrtf(v[j] * inv_c2) + eps) + wd * p[j]);
    }
}

float lens_trainer_step(lens_trainer *t, float lr, float wd, float max_norm)
{
    double sq = 0;
    for (int i = 0; i < t->n_tensors; i++) {
        const tensor_info *ti = &t->tensors[i];
        double part = 0;
        for (size_t j = ti->off; j < ti->off + ti->count; j++) part += (double)t->grad[j] * t->grad[j];
        sq += ti->summed ? part / t->cfg.n_heads : part; /* NH equal copies of each entry */
    }
    const float norm = (float)sqrt(sq);
    const float scale = max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0f;
    t->step++;
    const float c1 = 1.0f - powf(0.9f, (float)t->step), c2 = 1.0f - powf(0.999f, (float)t->step);
    for (int i = 0; i < t->n_tensors; i++) {
        const tensor_info *ti = &t->tensors[i];
        adamw_update(t->param + ti->off, t->grad + ti->off, t->m + ti->off, t->v + ti->off, ti->count, lr,
                     ti->decay ? wd : 0.0f, scale, 1.0f / c1, 1.0f / c2);
    }
    return norm;
}

/* ------------------------------------------------------------ checkpoints */

/* from_dir/name copied to to_dir/to_name (to_name NULL: name). */
static int copy_file_as(const char *from_dir, const char *to_dir, const char *name, const char *to_name, int required,
                        lens_err *err)
{
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/%s", from_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", to_dir, to_name ? to_name : name);
    if (!strcmp(src, dst)) return 0;
    FILE *in = fopen(src, "rb");
    if (!in) return required ? lens_fail(err, LENS_ENOENT, "%s: %s", src, strerror(errno)) : 0;
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return lens_fail(err, LENS_EIO, "%s: %s", dst, strerror(errno));
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    if (ferror(out) | fclose(out)) return lens_fail(err, LENS_EIO, "%s: write failed", dst);
    return 0;
}

static int file_exists(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

/* The tokenizer files of from_dir, whichever it has, as HF names them: a
 * tokenizer.json, a WordPiece vocab.txt, a byte-level BPE vocab.json +
 * merges.txt (or OpenAI's originals encoder.json + vocab.bpe, same
 * formats), special_tokens_map.json. At least one vocabulary. */
static int copy_tokenizer(const char *from_dir, const char *to_dir, lens_err *err)
{
    const int openai = !file_exists(from_dir, "vocab.json") && file_exists(from_dir, "encoder.json");
    const char *const files[][2] = {{"tokenizer.json", NULL},
                                    {"vocab.txt", NULL},
                                    {openai ? "encoder.json" : "vocab.json", "vocab.json"},
                                    {openai ? "vocab.bpe" : "merges.txt", "merges.txt"},
                                    {"special_tokens_map.json", NULL}};
    int vocabularies = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        if (!file_exists(from_dir, files[i][0])) continue;
        if (copy_file_as(from_dir, to_dir, files[i][0], files[i][1], 1, err)) return -1;
        vocabularies += i < 3;
    }
    if (!vocabularies)
        return lens_fail(err, LENS_ENOENT, "%s: no tokenizer.json, vocab.txt, vocab.json or encoder.json", from_dir);
    return 0;
}

static int write_config(const lens_trainer *t, const char *dir, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return lens_config_save(path, &t->cfg, 0, NULL, err);
}

/* Writes n_sets copies of the tensor list into one safetensors file: set i
 * holds buffer bases[i] ([n_param], parameters or a moment) under the names
 * prefixes[i] + name, summed tensors in their compact file layout. */
static int write_tensors(const lens_trainer *t, const char *path, int n_sets, const float *const *bases,
                         const char *const *prefixes, lens_err *err)
{
    const int n = n_sets * t->n_tensors;
    size_t scratch_size = 0;
    for (int i = 0; i < t->n_tensors; i++)
        if (t->tensors[i].summed) scratch_size += file_count(&t->tensors[i]);
    lens_st_out *out = calloc((size_t)n, sizeof *out);
    char(*names)[176] = calloc((size_t)n, sizeof *names);
    float *scratch = malloc((scratch_size * n_sets + 1) * sizeof(float)), *next = scratch;
    if (!out || !names || !scratch) {
        free(out), free(names), free(scratch);
        return lens_fail(err, LENS_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        const tensor_info *ti = &t->tensors[i % t->n_tensors];
        const float *data = file_data(t, ti, bases[i / t->n_tensors], next);
        if (ti->summed) next += file_count(ti);
        snprintf(names[i], sizeof names[i], "%s%s", prefixes[i / t->n_tensors], ti->name);
        out[i] = (lens_st_out){.name = names[i], .ndim = ti->ndim,
                               .shape = {ti->shape[0], ti->shape[1], ti->shape[2]},
                               .data = data};
    }
    int rc = lens_st_write(path, out, n, err);
    free(out), free(names), free(scratch);
    return rc;
}

/* tokenizer_config.json: from_dir's (or an empty one) with model_max_length
 * set to the model's positions, so that a Hugging Face tokenizer truncating
 * to it never yields a position the model has no embedding for. */
static int write_tokenizer_config(const char *from_dir, const char *to_dir, int max_positions, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", from_dir);
    json_error_t jerr;
    json_t *root = NULL;
    FILE *f = fopen(path, "r");
    if (f) {
        /* integers as reals: transformers spells "no limit" as a 31-digit integer */
        root = json_loadf(f, JSON_DECODE_INT_AS_REAL, &jerr);
        fclose(f);
        if (!json_is_object(root)) {
            json_decref(root);
            return lens_fail(err, LENS_EFORMAT, "%s: not a JSON object", path);
        }
    } else if (!(root = json_object())) {
        return lens_fail(err, LENS_ENOMEM, "out of memory");
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", to_dir);
    const int rc = json_object_set_new(root, "model_max_length", json_integer(max_positions)) ||
                   json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc ? lens_fail(err, LENS_EIO, "%s: write failed", path) : 0;
}

int lens_trainer_save(const lens_trainer *t, const char *dir, const char *tokenizer_dir, int with_state,
                      const char *extra, lens_err *err)
{
    if (mkdir(dir, 0755) && errno != EEXIST) return lens_fail(err, LENS_EIO, "%s: %s", dir, strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const float *params[1] = {t->param}, *moments[2] = {t->m, t->v};
    const char *plain[1] = {""}, *moment_names[2] = {"exp_avg.", "exp_avg_sq."};
    if (write_tensors(t, path, 1, params, plain, err) || write_config(t, dir, err)) return -1;
    if (tokenizer_dir && (copy_tokenizer(tokenizer_dir, dir, err) ||
                          write_tokenizer_config(tokenizer_dir, dir, t->cfg.max_positions, err)))
        return -1;
    if (!with_state) return 0;
    /* moments as two tensor sets in one file: "exp_avg.<name>", "exp_avg_sq.<name>" */
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (write_tensors(t, path, 2, moments, moment_names, err)) return -1;
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return lens_fail(err, LENS_EIO, "%s: %s", path, strerror(errno));
    fprintf(f, "{\"global_step\": %ld%s%s}\n", t->step, extra ? ", " : "", extra ? extra : "");
    if (ferror(f) | fclose(f)) return lens_fail(err, LENS_EIO, "%s: write failed", path);
    return 0;
}

int lens_trainer_load_state(lens_trainer *t, const char *dir, long *step, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    FILE *f = fopen(path, "r");
    if (!f) return lens_fail(err, LENS_ENOENT, "%s: %s", path, strerror(errno));
    long s = -1;
    if (fscanf(f, " {\"global_step\": %ld", &s) != 1 || s < 0) {
        fclose(f);
        return lens_fail(err, LENS_EFORMAT, "%s: no global_step", path);
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    lens_safetensors st;
    if (lens_st_open(path, &st, err)) return -1;
    for (int i = 0; i < 2 * t->n_tensors; i++) {
        const tensor_info *ti = &t->tensors[i % t->n_tensors];
        const int sq = i >= t->n_tensors;
        char name[160];
        snprintf(name, sizeof name, "%s.%s", sq ? "exp_avg_sq" : "exp_avg", ti->name);
        const lens_st_tensor *x = lens_st_find(&st, name);
        if (!x || x->dtype != LENS_DT_F32 || x->nbytes != file_count(ti) * sizeof(float)) {
            lens_st_close(&st);
            return lens_fail(err, LENS_EFORMAT, "%s: %s missing or of the wrong size", path, name);
        }
        set_from_file(t, ti, sq ? t->v : t->m, (const float *)x->data);
    }
    lens_st_close(&st);
    t->step = s;
    if (step) *step = s;
    return 0;
}
