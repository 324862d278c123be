/* model.c - loading BERT / GPT-2 checkpoints and running their forward pass.
 *
 * Loading binds every HF tensor name to a named pointer in lens_params after
 * checking its shape (lens_weights_get); nothing is copied for F32 files.
 * The forward pass works on packed rows: the N tokens of all sequences of a
 * batch go through every linear map as one GEMM, attention runs per sequence,
 * so padding is never computed.
 *
 * BERT block (post-LN):  a = LN(x + Attn(x));      x' = LN(a + FFN(a))
 * GPT-2 block (pre-LN):  a = x + Attn(LN1(x));     x' = a + FFN(LN2(a))
 * with Attn(x) = concat_h softmax(q_h k_h^T / sqrt(DK)) v_h  W_O + b_O. */
#include "core/model/model.h"
#include "core/io/partial.h"

#include <stdarg.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/ops.h"

/* ---------------------------------------------------------------- loading */

typedef struct {
    lens_weights *w;
    const char *prefix; /* "bert." / "transformer." / "" */
    size_t n_params;
    lens_err *err;
} binder;

static const float *bind(binder *b, int ndim, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The tensor named prefix + fmt, with shape [d0] or [d0][d1]; NULL on error. */
static const float *bind(binder *b, int ndim, int64_t d0, int64_t d1, const char *fmt, ...)
{
    char name[256];
    int n = snprintf(name, sizeof name, "%s", b->prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name + n, sizeof name - (size_t)n, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {d0, d1};
    const float *p = lens_weights_get(b->w, name, ndim, shape, b->err);
    if (p) b->n_params += (size_t)(d0 * (ndim == 2 ? d1 : 1));
    return p;
}

/* HF nn.Linear: weight [out][in], bias [out]. */
static int bind_linear(binder *b, lens_linear *lin, int in, int out, const char *name)
{
    lin->w = bind(b, 2, out, in, "%s.weight", name);
    lin->b = lin->w ? bind(b, 1, out, 0, "%s.bias", name) : NULL;
    lin->in = in, lin->out = out, lin->ld = in, lin->w_in_out = 0;
    return lin->w && lin->b ? 0 : -1;
}

/* GPT-2 Conv1D: weight [in][out], bias [out]. */
static int bind_conv1d(binder *b, lens_linear *lin, int in, int out, const char *name)
{
    lin->w = bind(b, 2, in, out, "%s.weight", name);
    lin->b = lin->w ? bind(b, 1, out, 0, "%s.bias", name) : NULL;
    lin->in = in, lin->out = out, lin->ld = out, lin->w_in_out = 1;
    return lin->w && lin->b ? 0 : -1;
}

static int bind_layernorm(binder *b, lens_layernorm *ln, int C, const char *name)
{
    ln->w = bind(b, 1, C, 0, "%s.weight", name);
    ln->b = ln->w ? bind(b, 1, C, 0, "%s.bias", name) : NULL;
    return ln->w && ln->b ? 0 : -1;
}

static int bind_bert(binder *b, const lens_config *c, lens_params *p)
{
    const int C = c->d_model, QK = c->n_heads * c->d_head_k, VO = c->n_heads * c->d_head_v;
    const int attn_in = c->head_combination ? c->d_head_v : VO; /* summed heads: [C][DV], tiled by expand_summed_heads */
    b->prefix = lens_weights_has(b->w, "bert.embeddings.word_embeddings.weight") ? "bert." : "";
    p->tok_emb = bind(b, 2, c->vocab_size, C, "embeddings.word_embeddings.weight");
    p->pos_emb = p->tok_emb ? bind(b, 2, c->max_positions, C, "embeddings.position_embeddings.weight") : NULL;
    p->type_emb = p->pos_emb ? bind(b, 2, c->type_vocab_size, C, "embeddings.token_type_embeddings.weight") : NULL;
    if (!p->type_emb || bind_layernorm(b, &p->ln_emb, C, "embeddings.LayerNorm")) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        lens_block *blk = &p->blocks[l];
        char at[96], name[128];
        snprintf(at, sizeof at, "encoder.layer.%d", l);
#define NAME(suffix) (snprintf(name, sizeof name, "%s.%s", at, suffix), name)
        if (bind_linear(b, &blk->q, C, QK, NAME("attention.self.query")) ||
            bind_linear(b, &blk->k, C, QK, NAME("attention.self.key")) ||
            bind_linear(b, &blk->v, C, VO, NAME("attention.self.value")) ||
            bind_linear(b, &blk->attn_out, attn_in, C, NAME("attention.output.dense")) ||
            bind_layernorm(b, &blk->ln_attn, C, NAME("attention.output.LayerNorm")) ||
            bind_linear(b, &blk->ff_in, C, c->d_ff, NAME("intermediate.dense")) ||
            bind_linear(b, &blk->ff_out, c->d_ff, C, NAME("output.dense")) ||
            bind_layernorm(b, &blk->ln_ff, C, NAME("output.LayerNorm")))
            return -1;
#undef NAME
    }
    if (c->task == LENS_TASK_CLASSIFICATION) {
        if (bind_linear(b, &p->pooler, C, C, "pooler.dense")) return -1;
        b->prefix = "";
        return bind_linear(b, &p->classifier, C, c->n_labels, "classifier");
    }
    if (c->task == LENS_TASK_MASKED_LM) {
        b->prefix = "cls.predictions.";
        if (bind_linear(b, &p->mlm_transform, C, C, "transform.dense") ||
            bind_layernorm(b, &p->mlm_ln, C, "transform.LayerNorm"))
            return -1;
        p->mlm_bias = bind(b, 1, c->vocab_size, 0, "bias");
        return p->mlm_bias ? 0 : -1;
    }
    return 0;
}

static int bind_gpt2(binder *b, const lens_config *c, lens_params *p)
{
    const int C = c->d_model;
    b->prefix = lens_weights_has(b->w, "transformer.wte.weight") ? "transformer." : "";
    p->tok_emb = bind(b, 2, c->vocab_size, C, "wte.weight");
    p->pos_emb = p->tok_emb ? bind(b, 2, c->max_positions, C, "wpe.weight") : NULL;
    if (!p->pos_emb) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        lens_block *blk = &p->blocks[l];
        char name[128];
#define NAME(suffix) (snprintf(name, sizeof name, "h.%d.%s", l, suffix), name)
        lens_linear qkv;
        if (bind_layernorm(b, &blk->ln_attn, C, NAME("ln_1")) ||
            bind_conv1d(b, &qkv, C, 3 * C, NAME("attn.c_attn")) ||
            bind_conv1d(b, &blk->attn_out, C, C, NAME("attn.c_proj")) ||
            bind_layernorm(b, &blk->ln_ff, C, NAME("ln_2")) ||
            bind_conv1d(b, &blk->ff_in, C, c->d_ff, NAME("mlp.c_fc")) ||
            bind_conv1d(b, &blk->ff_out, c->d_ff, C, NAME("mlp.c_proj")))
            return -1;
#undef NAME
        /* c_attn is [C][3C] = [W_q | W_k | W_v]: three views with row stride 3C */
        lens_linear *views[3] = {&blk->q, &blk->k, &blk->v};
        for (int i = 0; i < 3; i++) {
            *views[i] = qkv;
            views[i]->w = qkv.w + i * C;
            views[i]->b = qkv.b + i * C;
            views[i]->out = C;
        }
    }
    return bind_layernorm(b, &p->ln_final, C, "ln_f");
}

/* ---------------------------------------------------------------- packing */

/* Floats of W's storage from its first to its last element. */
static size_t linear_extent(const lens_linear *lin)
{
    const size_t rows = lin->w_in_out ? (size_t)lin->in : (size_t)lin->out;
    const size_t cols = lin->w_in_out ? (size_t)lin->out : (size_t)lin->in;
    return (rows - 1) * (size_t)lin->ld + cols;
}

/* The linear maps of the model in load order: [L][6] block maps, then heads;
 * entries whose weight is not bound are skipped by the callers. */
static int model_linears(lens_model *m, lens_linear **out)
{
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        lens_block *blk = &m->p.blocks[l];
        lens_linear *maps[6] = {&blk->q, &blk->k, &blk->v, &blk->attn_out, &blk->ff_in, &blk->ff_out};
        for (int i = 0; i < 6; i++) out[n++] = maps[i];
    }
    out[n++] = &m->p.pooler;
    out[n++] = &m->p.classifier;
    out[n++] = &m->p.mlm_transform;
    return n;
}

/* head_combination sum: W_O [C][DV] becomes W_cat [C][NH*DV] with
 * W_cat[:, m] = W_O[:, lens_head_summed_column(m)], since
 *   sum_h o_h W_O^T = concat_h(o_h) [W_O ... W_O]^T          (SUM)
 * and likewise for the reference code's adjacent-feature sum. From then on
 * the model is a concat model: forward, head masks, per-head values and the
 * attribution analyses need no case of their own. expanded: [L][C][NH*DV]. */
static void expand_summed_heads(lens_model *m, float *expanded)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model, DV = c->d_head_v, VO = c->n_heads * DV;
    for (int l = 0; l < c->n_layers; l++) {
        lens_linear *lin = &m->p.blocks[l].attn_out;
        float *w = expanded + (size_t)l * C * VO;
        for (int o = 0; o < C; o++)
            for (int col = 0; col < VO; col++)
                w[(size_t)o * VO + col] = lin->w[(size_t)o * DV + lens_head_summed_column(c, col)];
        lens_weights_release(m->weights, lin->w, (size_t)C * DV);
        lin->w = w, lin->in = VO, lin->ld = VO;
    }
}

/* Every linear map's weight copied once into the GEMM panel layout (one
 * 64-byte aligned allocation), so no forward call repacks weights. Each
 * layer's mapped pages are released after its maps are packed, keeping peak
 * RSS near the checkpoint size instead of twice it. The tied LM decoder is
 * not packed: it is the embedding table, which must stay as is, and a second
 * copy would cost V x C floats; the GEMM packs it panel by panel per call. */
static int pack_weights(lens_model *m, lens_err *err)
{
    lens_linear **lins = malloc(sizeof *lins * ((size_t)m->cfg.n_layers * 6 + 3));
    if (!lins) return lens_fail(err, LENS_ENOMEM, "out of memory");
    const lens_config *c = &m->cfg;
    /* summed heads: the expanded output weights [L][C][NH*DV] lead the
     * allocation; attn_out.in is already the expanded NH*DV for sizing */
    const int summed = c->arch == LENS_ARCH_BERT && c->head_combination;
    const size_t expanded =
        summed ? ((size_t)c->n_layers * c->d_model * c->n_heads * c->d_head_v + 15) & ~(size_t)15 : 0;
    for (int l = 0; summed && l < c->n_layers; l++) m->p.blocks[l].attn_out.in = c->n_heads * c->d_head_v;
    const int n = model_linears(m, lins);
    size_t total = expanded;
    for (int i = 0; i < n; i++)
        if (lins[i]->w) total += (lens_gemm_packed_size(lins[i]->in, lins[i]->out) + 15) & ~(size_t)15;
    m->packed = total ? aligned_alloc(64, total * sizeof(float)) : NULL;
    if (total && !m->packed) {
        free(lins);
        return lens_fail(err, LENS_ENOMEM, "out of memory packing %zu MiB of weights", total * sizeof(float) >> 20);
    }
    if (summed) expand_summed_heads(m, m->packed);
    float *dst = m->packed + expanded;
    for (int i = 0, released = 0; i < n; i++) {
        lens_linear *lin = lins[i];
        if (lin->w) {
            lens_gemm_pack(dst, lin->w, lin->in, lin->out, (size_t)lin->ld, lin->w_in_out);
            lin->packed = dst;
            dst += (lens_gemm_packed_size(lin->in, lin->out) + 15) & ~(size_t)15;
        }
        /* release only whole layers: GPT-2's q, k, v are views of one tensor */
        if (i == n - 1 || (i + 1) % 6 == 0) {
            for (; released <= i; released++)
                if (lins[released]->w) lens_weights_release(m->weights, lins[released]->w, linear_extent(lins[released]));
        }
    }
    free(lins);
    return 0;
}

lens_model *lens_model_load(const char *dir, lens_err *err)
{
    lens_model *m = calloc(1, sizeof *m);
    char path[4096];
    if (!m) {
        lens_fail(err, LENS_ENOMEM, "out of memory");
        return NULL;
    }
    m->dir = strdup(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!m->dir) {
        lens_fail(err, LENS_ENOMEM, "out of memory");
        goto fail;
    }
    if (lens_config_load(path, &m->cfg, err)) goto fail;
    m->p.blocks = calloc((size_t)m->cfg.n_layers, sizeof *m->p.blocks);
    if (!m->p.blocks) {
        lens_fail(err, LENS_ENOMEM, "out of memory");
        goto fail;
    }
    if (!(m->weights = lens_weights_open(dir, err))) goto fail;
    binder b = {.w = m->weights, .err = err};
    if ((m->cfg.arch == LENS_ARCH_BERT ? bind_bert : bind_gpt2)(&b, &m->cfg, &m->p)) goto fail;
    m->n_params = b.n_params;
    if (pack_weights(m, err)) goto fail;
    /* no tokenizer files: the model serves input_ids (m->tok stays NULL) */
    if (!(m->tok = lens_tokenizer_load(dir, err)) && err->code != LENS_ENOENT) goto fail;
    if (m->tok && lens_tokenizer_vocab_size(m->tok) > m->cfg.vocab_size) {
        lens_fail(err, LENS_EFORMAT, "%s: tokenizer has %d tokens but the model's vocab_size is %d", dir,
                  lens_tokenizer_vocab_size(m->tok), m->cfg.vocab_size);
        goto fail;
    }
    return m;
fail:
    lens_model_free(m);
    return NULL;
}

lens_model *lens_model_tokenizer_only(const char *dir, lens_err *err)
{
    lens_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        lens_fail(err, LENS_ENOMEM, "out of memory");
        return NULL;
    }
    if (!(m->tok = lens_tokenizer_load(dir, err))) {
        lens_model_free(m);
        return NULL;
    }
    m->tokenizer_only = 1;
    m->cfg.vocab_size = lens_tokenizer_vocab_size(m->tok);
    m->cfg.max_positions = INT_MAX;
    return m;
}

void lens_model_free(lens_model *m)
{
    if (!m) return;
    lens_tokenizer_free(m->tok);
    lens_weights_close(m->weights);
    free(m->packed);
    free(m->p.blocks);
    lens_config_free(&m->cfg);
    free(m->dir);
    free(m);
}

const char *lens_analysis_name(lens_analysis a)
{
    static const char *const names[LENS_ANALYSIS_COUNT] = {
        [LENS_ANALYSIS_FORWARD] = "forward",
        [LENS_ANALYSIS_ATTENTION] = "attention",
        [LENS_ANALYSIS_ATTRIBUTION] = "attribution",
        [LENS_ANALYSIS_ATTRIBUTION_TREE] = "attribution_tree",
        [LENS_ANALYSIS_HEAD_IMPORTANCE] = "head_importance",
        [LENS_ANALYSIS_TRIGGERS] = "adversarial_triggers",
        [LENS_ANALYSIS_TOKEN_IDENTITY] = "token_identity",
        [LENS_ANALYSIS_HIDDEN_ATTRIBUTION] = "hidden_attribution",
        [LENS_ANALYSIS_DECOMPOSITION] = "decomposition",
    };
    return (unsigned)a < LENS_ANALYSIS_COUNT ? names[a] : "unknown";
}

int lens_model_supports(const lens_model *m, lens_analysis a, const char **why)
{
    const lens_config *c = &m->cfg;
    const int classifier = c->task == LENS_TASK_CLASSIFICATION;
    const int causal_lm = c->task == LENS_TASK_CAUSAL_LM;
    const char *no = NULL;
    if (m->tokenizer_only) a = LENS_ANALYSIS_COUNT; /* only tokenize */
    switch (a) {
    case LENS_ANALYSIS_ATTRIBUTION:
        if (!classifier && !causal_lm)
            no = "attribution needs a sequence classifier (class probability) or a causal LM (next-token probability)";
        break;
    case LENS_ANALYSIS_ATTRIBUTION_TREE:
        if (!classifier || c->arch != LENS_ARCH_BERT)
            no = "the attribution tree is defined for BERT classifiers only (its root is the [CLS] token)";
        break;
    case LENS_ANALYSIS_HEAD_IMPORTANCE:
    case LENS_ANALYSIS_TRIGGERS:
        if (!classifier || c->arch != LENS_ARCH_BERT)
            no = "this dataset analysis is defined for BERT sequence classifiers only";
        break;
    case LENS_ANALYSIS_FORWARD:
    case LENS_ANALYSIS_ATTENTION:
    case LENS_ANALYSIS_TOKEN_IDENTITY:
    case LENS_ANALYSIS_HIDDEN_ATTRIBUTION:
    case LENS_ANALYSIS_DECOMPOSITION:
        break;
    default:
        no = m->tokenizer_only ? "this folder holds only tokenizer files: tokenize is all it serves" : "unknown analysis";
    }
    if (why) *why = no;
    return no == NULL;
}

unsigned long long lens_model_fingerprint(const lens_model *m)
{
    const lens_config *c = &m->cfg;
    const int shape[] = {c->n_layers, c->n_heads, c->d_model, c->d_ff, c->d_head_k, c->d_head_v,
                         c->vocab_size, c->max_positions, c->n_labels, (int)c->task};
    uint64_t h = lens_fnv1a64(LENS_FNV1A64_INIT, c->architecture, strlen(c->architecture));
    h = lens_fnv1a64(h, shape, sizeof shape);
    h = lens_fnv1a64(h, m->p.tok_emb, sizeof(float) * (size_t)c->vocab_size * c->d_model);
    const lens_linear *head = &m->p.classifier;
    if (head->w) h = lens_fnv1a64(h, head->w, sizeof(float) * (size_t)(head->w_in_out ? head->in : head->out) * head->ld);
    return h;
}
