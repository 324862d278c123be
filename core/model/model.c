/* model.c - loading BERT / GPT-2 checkpoints and running their forward pass.
 *
 * Loading binds every HF tensor name to a named pointer in lens_params after
 * checking its shape; matrices stay in the checkpoint's dtype, served from
 * the mapping (BF16/F16 are widened inside the GEMM's packing, F32 ones are
 * packed once here), and only biases and norm weights are widened to float32.
 * The forward pass works on packed rows: the N tokens of all sequences of a
 * batch go through every linear map as one GEMM, attention runs per sequence,
 * so padding is never computed.
 *
 * BERT block (post-LN):  a = LN(x + Attn(x));      x' = LN(a + FFN(a))
 * GPT-2 block (pre-LN):  a = x + Attn(LN1(x));     x' = a + FFN(LN2(a))
 * with Attn(x) = concat_h softmax(q_h k_h^T / sqrt(DK)) v_h  W_O + b_O. */
#include "core/model/arch.h"
#include "core/io/partial.h"

#include <stdarg.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/model/block.h"
#include "core/nn/ops.h"

/* ---------------------------------------------------------------- loading */

/* Loading visitor: each tensor the family's walker names is looked up in
 * the checkpoint with its shape checked; base-model checkpoints (BertModel,
 * GPT2Model) store the names without the family's base prefix, which the
 * first tensor decides for all. A wrapper's text tower has its names under
 * "language_model." (HF's release layout: "language_model.model.layers.0...",
 * "language_model.lm_head.weight") or after the base prefix (transformers
 * >= 4.52 saves "model.language_model.layers.0...", "lm_head.weight"), also
 * decided by the first tensor. */
typedef struct {
    lens_param_visitor v; /* first member */
    lens_weights *w;
    lens_params *p;       /* emb_dtype set from the first embedding table */
    const char *base_prefix;
    int strip;            /* -1: not decided yet, 0 / 1 */
    int tower;            /* text tower: -1 not decided yet, 1 release layout, 2 the newer one; 0 no tower */
    int n_emb;            /* embedding tables bound so far */
    size_t n_params;
    lens_err *err;
} binder;

/* Matrices in the file's dtype (no copy), vectors as float32. */
static const void *bind_tensor(lens_param_visitor *v, const lens_param_desc *d)
{
    binder *b = (binder *)v;
    const char *name = d->name;
    const size_t plen = strlen(b->base_prefix);
    const int prefixed = plen && !strncmp(name, b->base_prefix, plen);
    char tower[512];
    if (b->tower) {
        if (b->tower < 0) {
            snprintf(tower, sizeof tower, "language_model.%s", name);
            b->tower = lens_weights_has(b->w, tower) ? 1 : 2;
        }
        if (b->tower == 1) snprintf(tower, sizeof tower, "language_model.%s", name);
        else if (prefixed) snprintf(tower, sizeof tower, "%slanguage_model.%s", b->base_prefix, name + plen);
        else snprintf(tower, sizeof tower, "%s", name);
        name = tower;
    } else {
        if (b->strip < 0 && prefixed) b->strip = !lens_weights_has(b->w, name);
        if (prefixed && b->strip == 1) name += plen;
    }
    v->dtype = LENS_DT_F32;
    const int matrix = d->kind == LENS_PARAM_WEIGHT || d->kind == LENS_PARAM_EMBEDDING;
    const void *p = matrix ? lens_weights_get_raw(b->w, name, d->ndim, d->shape, &v->dtype, b->err)
                           : lens_weights_get(b->w, name, d->ndim, d->shape, b->err);
    if (p && d->kind == LENS_PARAM_EMBEDDING) {
        /* one dtype for tok/pos/type tables: the embedding reads them in one pass */
        if (b->n_emb++ && v->dtype != b->p->emb_dtype) {
            lens_fail(b->err, LENS_EFORMAT, "%s: embedding tables in mixed dtypes (%s is %s, the first one %s)",
                      name, name, lens_dtype_name(v->dtype), lens_dtype_name(b->p->emb_dtype));
            p = NULL;
        } else b->p->emb_dtype = v->dtype;
    }
    if (p) b->n_params += lens_param_numel(d);
    else v->failed = 1;
    return p;
}

/* ---------------------------------------------------------------- packing */

/* Floats of W's storage from its first to its last element. */
static size_t linear_extent(const lens_linear *lin)
{
    const size_t rows = lin->w_in_out ? (size_t)lin->in : (size_t)lin->out;
    const size_t cols = lin->w_in_out ? (size_t)lin->out : (size_t)lin->in;
    return (rows - 1) * (size_t)lin->ld + cols;
}

/* The linear maps of the model in load order: [L][BLOCK_MAPS] block maps,
 * then heads; entries whose weight is not bound are skipped by the callers. */
enum { DENSE_MAPS = 8, BLOCK_MAPS = DENSE_MAPS + 4 * LENS_MOE_MAX_EXPERTS, HEAD_MAPS = 4 };
static int model_linears(lens_model *m, lens_linear **out)
{
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        lens_block *blk = &m->p.blocks[l];
        lens_linear *maps[DENSE_MAPS] = {&blk->q, &blk->k, &blk->v, &blk->attn_out, &blk->gate, &blk->ff_in,
                                         &blk->ff_out, &blk->router};
        for (int i = 0; i < DENSE_MAPS; i++) out[n++] = maps[i];
        for (int e = 0; e < LENS_MOE_MAX_EXPERTS; e++) {
            lens_moe_expert *ex = &blk->experts[e];
            out[n++] = &ex->gate, out[n++] = &ex->up, out[n++] = &ex->down, out[n++] = &ex->gate_up;
        }
    }
    out[n++] = &m->p.pooler;
    out[n++] = &m->p.classifier;
    out[n++] = &m->p.mlm_transform;
    out[n++] = &m->p.lm_head;
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
        float *w = expanded + (size_t)l * C * VO, *row = expanded + (size_t)c->n_layers * C * VO; /* row: [DV] */
        for (int o = 0; o < C; o++) {
            lens_widen(row, lens_dtype_at(lin->w, lin->dtype, (size_t)o * DV), lin->dtype, (size_t)DV);
            for (int col = 0; col < VO; col++) w[(size_t)o * VO + col] = row[lens_head_summed_column(c, col)];
        }
        lens_weights_release(m->weights, lin->w, (size_t)C * DV * lens_dtype_size(lin->dtype));
        lin->w = w, lin->in = VO, lin->ld = VO, lin->dtype = LENS_DT_F32;
    }
}

/* Every linear map's weight copied once into the GEMM panel layout (one
 * 64-byte aligned allocation), so no forward call repacks weights: F32 maps
 * as floats, BF16/F16 maps in their own 16 bits (lens_gemm_pack_half; the
 * kernels widen them as they load them, so the resident weights stay half
 * the size of float32 ones). Each layer's mapped pages are released after
 * its maps are packed, keeping peak RSS near the checkpoint size instead of
 * twice it. The tied LM
 * decoder is not packed either: it is the embedding table, which must stay
 * as is, and a second copy would cost V x C floats. Nothing is packed for
 * the OpenBLAS path (lens_gemm_packs_weights), which reads W as mapped. */
/* Floats a map's panels take in the model's allocation (64-byte multiples). */
static size_t panel_floats(const lens_linear *lin)
{
    const size_t elements = lens_gemm_packed_size(lin->in, lin->out);
    return ((lin->dtype == LENS_DT_F32 ? elements : (elements + 1) / 2) + 15) & ~(size_t)15;
}

static int pack_weights(lens_model *m, lens_err *err)
{
    lens_linear **lins = malloc(sizeof *lins * ((size_t)m->cfg.n_layers * BLOCK_MAPS + HEAD_MAPS));
    if (!lins) return lens_fail(err, LENS_ENOMEM, "out of memory");
    const lens_config *c = &m->cfg;
    /* summed heads: the expanded output weights [L][C][NH*DV] (float32, and a
     * [DV] row to widen into) lead the allocation; attn_out.in is already the
     * expanded NH*DV for sizing */
    const int summed = c->head_combination != LENS_HEADS_CONCAT;
    const size_t expanded =
        summed ? ((size_t)c->n_layers * c->d_model * c->n_heads * c->d_head_v + c->d_head_v + 15) & ~(size_t)15 : 0;
    for (int l = 0; summed && l < c->n_layers; l++) m->p.blocks[l].attn_out.in = c->n_heads * c->d_head_v;
    const int n = model_linears(m, lins), pack = lens_gemm_packs_weights();
    size_t total = expanded;
    for (int i = 0; pack && i < n; i++) {
        /* summed output weights (block map 3) are float32 once expanded */
        const int expanded_map = summed && i < BLOCK_MAPS * c->n_layers && i % BLOCK_MAPS == 3;
        lens_linear as_packed = *lins[i];
        if (expanded_map) as_packed.dtype = LENS_DT_F32;
        if (lins[i]->w) total += panel_floats(&as_packed);
    }
    m->packed = total ? lens_gemm_alloc_packed(total) : NULL;
    if (total && !m->packed) {
        free(lins);
        return lens_fail(err, LENS_ENOMEM, "out of memory packing %zu MiB of weights", total * sizeof(float) >> 20);
    }
    if (summed) expand_summed_heads(m, m->packed);
    float *dst = m->packed + expanded;
    for (int i = 0, released = 0; i < n; i++) {
        lens_linear *lin = lins[i];
        if (pack && lin->w) {
            if (lin->dtype == LENS_DT_F32) lens_gemm_pack(dst, lin->w, lin->in, lin->out, (size_t)lin->ld, lin->w_in_out);
            else lens_gemm_pack_half((uint16_t *)dst, lin->w, lin->in, lin->out, (size_t)lin->ld, lin->w_in_out);
            lin->packed = dst;
            dst += panel_floats(lin);
        }
        /* release only whole layers: GPT-2's q, k, v are views of one tensor */
        if (i == n - 1 || (i + 1) % BLOCK_MAPS == 0) {
            for (; released <= i; released++)
                if (lins[released]->packed)
                    lens_weights_release(m->weights, lins[released]->w,
                                         linear_extent(lins[released]) * lens_dtype_size(lins[released]->dtype));
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
    binder b = {.v = {.tensor = bind_tensor}, .w = m->weights, .p = &m->p, .base_prefix = m->cfg.family->base_prefix,
                .strip = -1, .tower = -m->cfg.text_tower, .err = err};
    lens_walk_params(&m->cfg, &m->p, &b.v);
    if (b.v.failed) goto fail;
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
        [LENS_ANALYSIS_CONTEXT_MIXING] = "context_mixing",
        [LENS_ANALYSIS_LOGIT_ATTRIBUTION] = "logit_attribution",
        [LENS_ANALYSIS_ROUTER] = "router",
    };
    return (unsigned)a < LENS_ANALYSIS_COUNT ? names[a] : "unknown";
}

/* The rules are capabilities of the family plus the task and the config:
 * the attribution engine runs a classifier head that reads the first token
 * (after the final norm of a pre-norm family), or the pre-norm causal block
 * with its LM head (core/analysis/attribution*); the tree and the dataset
 * analyses of classifiers read the first token of a post-norm encoder as the
 * summary of the input. */
int lens_model_supports(const lens_model *m, lens_analysis a, const char **why)
{
    const lens_config *c = &m->cfg;
    const int classifier = c->task == LENS_TASK_CLASSIFICATION;
    const int causal_lm = c->task == LENS_TASK_CAUSAL_LM;
    const int pre_norm = lens_has_cap(c, LENS_CAP_PRE_NORM);
    const int cls_classifier = classifier && lens_has_cap(c, LENS_CAP_CLS_FIRST) && lens_has_cap(c, LENS_CAP_POOLER);
    const char *no = NULL;
    if (m->tokenizer_only) a = LENS_ANALYSIS_COUNT; /* only tokenize */
    switch (a) {
    case LENS_ANALYSIS_ATTRIBUTION:
        if (!classifier && !causal_lm)
            no = "attribution needs a sequence classifier (class probability) or a causal LM (next-token probability)";
        else if (classifier && c->pool_mean)
            no = "attribution follows the first token through the last layer; this classifier pools the mean of "
                 "every token (classifier_pooling mean)";
        else if (classifier ? !lens_has_cap(c, LENS_CAP_POOLER) : !pre_norm)
            no = "attribution runs classifiers with a pooler and pre-norm causal LMs; this model is neither";
        break;
    case LENS_ANALYSIS_ATTRIBUTION_TREE:
        if (!cls_classifier || pre_norm)
            no = "the attribution tree is defined for classifiers whose first token is a [CLS]-like summary "
                 "(its root)";
        break;
    case LENS_ANALYSIS_HEAD_IMPORTANCE:
    case LENS_ANALYSIS_TRIGGERS:
        if (!cls_classifier || pre_norm)
            no = "this dataset analysis is defined for sequence classifiers whose first token is a [CLS]-like "
                 "summary";
        break;
    case LENS_ANALYSIS_LOGIT_ATTRIBUTION:
        if (!causal_lm || !pre_norm) {
            no = "direct logit attribution is defined for pre-norm causal LMs (a decoder's logits)";
            break;
        }
        for (int l = 0; l < c->n_layers && !no; l++) {
            lens_attn_residual s;
            no = lens_block_attn_residual(m, l, &s);
        }
        break;
    case LENS_ANALYSIS_ROUTER:
        if (!c->n_experts) no = "this model has no mixture-of-experts layers, so no router";
        break;
    case LENS_ANALYSIS_FORWARD:
    case LENS_ANALYSIS_ATTENTION:
    case LENS_ANALYSIS_TOKEN_IDENTITY:
    case LENS_ANALYSIS_HIDDEN_ATTRIBUTION:
    case LENS_ANALYSIS_DECOMPOSITION:
    case LENS_ANALYSIS_CONTEXT_MIXING: /* each method says whether the blocks define it (a 422 on method) */
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
    h = lens_fnv1a64(h, m->p.tok_emb, lens_dtype_size(m->p.emb_dtype) * (size_t)c->vocab_size * c->d_model);
    const lens_linear *head = &m->p.classifier;
    if (head->w)
        h = lens_fnv1a64(h, head->w,
                         lens_dtype_size(head->dtype) * (size_t)(head->w_in_out ? head->in : head->out) * head->ld);
    return h;
}
