/* bert.c - the BERT family (HF BertModel, BertForSequenceClassification,
 * BertForMaskedLM), including the identifiable-encoder variant.
 *
 * Config keys: hidden_size, num_hidden_layers, num_attention_heads,
 * intermediate_size, vocab_size, max_position_embeddings, type_vocab_size,
 * layer_norm_eps, hidden_act; identifiable variant: "head_dim_key",
 * "head_dim_value", "head_combination" (docs/identifiable-encoder.md).
 *
 * Block (post-LN):  a = LN(x + Attn(x));  x' = LN(a + FFN(a))
 * with Attn(x) = concat_h softmax(q_h k_h^T / sqrt(DK)) v_h W_O + b_O.
 * LayerNorm statistics slots: 0 embeddings, 1 + 2l attention, 2 + 2l FFN. */
#include "core/model/arch.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/ops.h"

int lens_bert_parse_keys(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_json_int(root, path, "hidden_size", -1, 1, 1 << 16, &cfg->d_model, err) ||
        lens_json_int(root, path, "num_hidden_layers", -1, 1, 1024, &cfg->n_layers, err) ||
        lens_json_int(root, path, "num_attention_heads", -1, 1, 1024, &cfg->n_heads, err) ||
        lens_json_int(root, path, "intermediate_size", -1, 1, 1 << 20, &cfg->d_ff, err) ||
        lens_json_int(root, path, "vocab_size", -1, 1, 1 << 24, &cfg->vocab_size, err) ||
        lens_json_int(root, path, "max_position_embeddings", 512, 1, 1 << 20, &cfg->max_positions, err) ||
        lens_json_int(root, path, "type_vocab_size", 2, 1, 1024, &cfg->type_vocab_size, err) ||
        lens_json_eps(root, path, "layer_norm_eps", 1e-12, &cfg->ln_eps, err))
        return -1;
    const char *act = lens_json_str(root, "hidden_act");
    if (lens_parse_activation(path, act ? act : "gelu", &cfg->gelu_tanh, err)) return -1;
    const char *pos = lens_json_str(root, "position_embedding_type");
    if (pos && strcmp(pos, "absolute") != 0)
        return lens_fail(err, LENS_EFORMAT, "%s: unsupported position_embedding_type \"%s\"", path, pos);
    if (cfg->d_model % cfg->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d",
                         path, cfg->d_model, cfg->n_heads);
    int dh = cfg->d_model / cfg->n_heads;
    if (lens_json_int(root, path, "head_dim_key", dh, 1, 1 << 16, &cfg->d_head_k, err) ||
        lens_json_int(root, path, "head_dim_value", dh, 1, 1 << 16, &cfg->d_head_v, err))
        return -1;
    const char *scale = lens_json_str(root, "attention_scale"); /* identifiable encoders: docs/reproducing.md */
    if (scale && strcmp(scale, "DK") && strcmp(scale, "DV"))
        return lens_fail(err, LENS_EFORMAT, "%s: attention_scale \"%s\" is not DK or DV", path, scale);
    cfg->scale_by_dv = scale && !strcmp(scale, "DV");
    const char *combine = lens_json_str(root, "head_combination");
    if (combine && lens_head_combination_parse(combine, &cfg->head_combination))
        return lens_fail(err, LENS_EFORMAT, "%s: head_combination \"%s\" is not one of concat, sum, sum_adjacent",
                         path, combine);
    return lens_json_int(root, path, "pad_token_id", 0, 0, cfg->vocab_size - 1, &cfg->pad_token_id, err);
}

static int bert_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    return lens_bert_parse_keys(root, path, cfg, err) || lens_config_task(root, path, cfg, err) ? -1 : 0;
}

int lens_new_encoder_task(lens_config *c, const char *task, lens_err *err)
{
    c->task = LENS_TASK_CLASSIFICATION;
    if (task && (lens_task_parse(task, &c->task) || !c->family->task_archs[c->task]))
        return lens_fail(err, LENS_EINVAL, "task \"%s\" is not available for %s", task, c->family->model_type);
    snprintf(c->architecture, sizeof c->architecture, "%s", c->family->task_archs[c->task]);
    if (c->task != LENS_TASK_CLASSIFICATION) return 0;
    static const char *const names[] = {"negative", "positive"};
    c->labels = calloc(2, sizeof *c->labels);
    if (!c->labels) return lens_fail(err, LENS_ENOMEM, "out of memory");
    c->n_labels = 2;
    for (int i = 0; i < 2; i++)
        if (!(c->labels[i] = strdup(names[i]))) return lens_fail(err, LENS_ENOMEM, "out of memory");
    return 0;
}

static int bert_new_config(lens_config *c, const char *task, lens_err *err)
{
    c->vocab_size = 30522, c->max_positions = 512, c->type_vocab_size = 2, c->ln_eps = 1e-12f, c->gelu_tanh = 0;
    return lens_new_encoder_task(c, task, err);
}

/* BertConfig keys (RobertaConfig has the same ones; its position table is
 * position_offset rows longer and its bos / eos are <s> = 0, </s> = 2). */
void lens_bert_write_config(FILE *f, const lens_config *c, int random_weights)
{
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"hidden_act\": \"%s\",\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n  \"max_position_embeddings\": %d,\n"
            "  \"type_vocab_size\": %d,\n  \"vocab_size\": %d,\n  \"layer_norm_eps\": %g,\n"
            "  \"hidden_dropout_prob\": 0.0,\n  \"attention_probs_dropout_prob\": 0.0,\n"
            "  \"pad_token_id\": %d,\n  \"position_embedding_type\": \"absolute\",\n"
            "  \"tie_word_embeddings\": true,\n",
            c->family->task_archs[c->task], c->family->model_type, c->gelu_tanh ? "gelu_new" : "gelu", c->d_model,
            c->n_layers, c->n_heads, c->d_ff, c->max_positions + c->position_offset, c->type_vocab_size, c->vocab_size,
            (double)c->ln_eps, c->pad_token_id);
    if (c->position_offset) fprintf(f, "  \"bos_token_id\": 0,\n  \"eos_token_id\": 2,\n");
    const int dh = c->d_model / c->n_heads;
    if (c->d_head_k != dh || c->d_head_v != dh || c->head_combination)
        fprintf(f, "  \"head_dim_key\": %d,\n  \"head_dim_value\": %d,\n  \"head_combination\": \"%s\",\n",
                c->d_head_k, c->d_head_v, lens_head_combination_name(c->head_combination));
    if (c->scale_by_dv) fprintf(f, "  \"attention_scale\": \"DV\",\n");
    lens_write_task_tail(f, c, random_weights);
}

/* Summed heads (model.h): attention.output.dense.weight is [C][DV] in the
 * file; lens_linear describes the concat map NH*DV -> C either way, with
 * row stride DV until the loader tiles it (or NH*DV when the visitor tiles). */
static void walk_summed_output(const lens_config *c, lens_param_visitor *v, lens_linear *lin, const char *base)
{
    const int C = c->d_model, VO = c->n_heads * c->d_head_v;
    char name[256];
    snprintf(name, sizeof name, "%s.weight", base);
    const lens_param_desc d = {.name = name, .ndim = 2, .shape = {C, c->d_head_v}, .kind = LENS_PARAM_WEIGHT,
                               .init_std = 0.02f, .summed = 1};
    lin->w = v->failed ? NULL : v->tensor(v, &d);
    lin->dtype = v->dtype;
    snprintf(name, sizeof name, "%s.bias", base);
    lin->b = lens_walk_tensor(v, name, C, 0, LENS_PARAM_BIAS, 0);
    lin->in = VO, lin->out = C, lin->ld = v->tiles_summed ? VO : c->d_head_v, lin->w_in_out = 0, lin->packed = NULL;
}

/* HF order: embeddings, encoder.layer.{l} (the task head follows). Base-
 * model tensors carry the prefix ("bert."; BertModel checkpoints drop it,
 * the loader copes). */
void lens_bert_walk_encoder(const lens_config *c, lens_params *p, lens_param_visitor *v, const char *prefix)
{
    const int C = c->d_model, QK = c->n_heads * c->d_head_k, VO = c->n_heads * c->d_head_v;
    const float sd = 0.02f;
    char n[160];
#define AT(suffix) (snprintf(n, sizeof n, "%s%s", prefix, suffix), n)
    p->tok_emb = lens_walk_tensor(v, AT("embeddings.word_embeddings.weight"), c->vocab_size, C, LENS_PARAM_EMBEDDING, sd);
    p->pos_emb = lens_walk_tensor(v, AT("embeddings.position_embeddings.weight"), c->max_positions + c->position_offset,
                                  C, LENS_PARAM_EMBEDDING, sd);
    p->type_emb = lens_walk_tensor(v, AT("embeddings.token_type_embeddings.weight"), c->type_vocab_size, C,
                                   LENS_PARAM_EMBEDDING, sd);
    lens_walk_layernorm(v, &p->ln_emb, AT("embeddings.LayerNorm"), C);
#undef AT
    for (int l = 0; l < c->n_layers; l++) {
        lens_block *blk = &p->blocks[l];
#define AT(suffix) (snprintf(n, sizeof n, "%sencoder.layer.%d.%s", prefix, l, suffix), n)
        lens_walk_linear(v, &blk->q, AT("attention.self.query"), C, QK, 0, sd);
        lens_walk_linear(v, &blk->k, AT("attention.self.key"), C, QK, 0, sd);
        lens_walk_linear(v, &blk->v, AT("attention.self.value"), C, VO, 0, sd);
        if (c->head_combination) walk_summed_output(c, v, &blk->attn_out, AT("attention.output.dense"));
        else lens_walk_linear(v, &blk->attn_out, AT("attention.output.dense"), VO, C, 0, sd);
        lens_walk_layernorm(v, &blk->ln_attn, AT("attention.output.LayerNorm"), C);
        lens_walk_linear(v, &blk->ff_in, AT("intermediate.dense"), C, c->d_ff, 0, sd);
        lens_walk_linear(v, &blk->ff_out, AT("output.dense"), c->d_ff, C, 0, sd);
        lens_walk_layernorm(v, &blk->ln_ff, AT("output.LayerNorm"), C);
#undef AT
    }
}

/* Heads: BertForSequenceClassification's pooler + classifier,
 * BertForMaskedLM's cls.predictions (decoder weight tied to the word
 * embeddings; HF saves no copy). */
static void bert_walk(const lens_config *c, lens_params *p, lens_param_visitor *v)
{
    const int C = c->d_model;
    lens_bert_walk_encoder(c, p, v, "bert.");
    if (c->task == LENS_TASK_CLASSIFICATION) {
        lens_walk_linear(v, &p->pooler, "bert.pooler.dense", C, C, 0, 0.02f);
        lens_walk_linear(v, &p->classifier, "classifier", C, c->n_labels, 0, 0.02f);
    } else if (c->task == LENS_TASK_MASKED_LM) {
        lens_walk_linear(v, &p->mlm_transform, "cls.predictions.transform.dense", C, C, 0, 0.02f);
        lens_walk_layernorm(v, &p->mlm_ln, "cls.predictions.transform.LayerNorm", C);
        p->mlm_bias = lens_walk_tensor(v, "cls.predictions.bias", c->vocab_size, 0, LENS_PARAM_BIAS, 0);
    }
}

/* What the post-norm block keeps in lens_block_cache.buf, [rows][width]
 * blocks: the two LayerNorms' inputs and statistics and the GELU input;
 * for weight gradients also the inputs of the linear maps. */
typedef struct {
    float *h_attn, *mean_attn, *rstd_attn; /* LN_attn: x + attn_out(ctx) */
    float *ff_pre;                         /* [F] GELU input */
    float *h_ff, *mean_ff, *rstd_ff;       /* LN_ff: a + ff_out(gelu) */
    float *x_in, *ctx, *a, *ff_act;        /* for_weights: q/k/v, attn_out, ff_in, ff_out inputs */
} post_saved;

static post_saved post_slots(const lens_config *c, const lens_block_cache *k)
{
    const size_t R = (size_t)k->rows, C = c->d_model, F = c->d_ff, VO = (size_t)c->n_heads * c->d_head_v;
    post_saved s;
    float *p = k->buf;
    s.h_attn = p, p += R * C;
    s.mean_attn = p, p += R;
    s.rstd_attn = p, p += R;
    s.ff_pre = p, p += R * F;
    s.h_ff = p, p += R * C;
    s.mean_ff = p, p += R;
    s.rstd_ff = p, p += R;
    s.x_in = s.ctx = s.a = s.ff_act = NULL;
    if (k->for_weights) {
        s.x_in = p, p += R * C;
        s.ctx = p, p += R * VO;
        s.a = p, p += R * C;
        s.ff_act = p;
    }
    return s;
}

/* a = LN(x + Attn(x)); x' = LN(a + FFN(a)), both in place on io->x. With
 * io->cache the LayerNorm statistics go there (not to io->ln_mean). */
void lens_bert_block_forward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff, VO = c->n_heads * c->d_head_v;
    const post_saved s = io->cache ? post_slots(c, io->cache) : (post_saved){0};
    const int w = io->cache && io->cache->for_weights;
    if (w) memcpy(s.x_in, io->x, sizeof(float) * io->N * C);
    lens_gemm_linear(io->q, io->x, &blk->q, io->N, io->pool);
    lens_gemm_linear(io->k, io->x, &blk->k, io->N, io->pool);
    lens_gemm_linear(io->v, io->x, &blk->v, io->N, io->pool);
    io->attend(io, l);
    const int N = io->N; /* the hook may have kept fewer rows */
    if (w) memcpy(s.ctx, io->ctx, sizeof(float) * N * VO);
    float *h = io->cache ? s.h_attn : io->h;
    lens_gemm_linear(h, io->ctx, &blk->attn_out, N, io->pool);
    lens_add_layernorm(io->pool, io->x, io->cache ? s.mean_attn : lens_ln_slot(io, io->ln_mean, 1 + 2 * l),
                       io->cache ? s.rstd_attn : lens_ln_slot(io, io->ln_rstd, 1 + 2 * l), h, io->x, &blk->ln_attn,
                       N, C, c->ln_eps);
    if (w) memcpy(s.a, io->x, sizeof(float) * N * C);
    if (io->cache) { /* the GELU input is saved, so GELU runs after the product */
        lens_gemm_linear_ld(io->ff, io->ff_ld, io->x, (size_t)C, &blk->ff_in, N, io->pool);
        lens_block_copy_rows(s.ff_pre, io->ff, io->ff_ld, N, F);
        lens_gelu_rows(io->pool, io->ff, io->ff_ld, N, F, c->gelu_tanh);
    } else { /* fused into the product's tiles while they are in L1 */
        lens_gemm_linear_post(io->ff, io->ff_ld, io->x, (size_t)C, &blk->ff_in, N,
                              c->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward, io->pool);
    }
    if (w) lens_block_copy_rows(s.ff_act, io->ff, io->ff_ld, N, F);
    h = io->cache ? s.h_ff : io->h;
    lens_gemm_linear_ld(h, (size_t)C, io->ff, io->ff_ld, &blk->ff_out, N, io->pool);
    lens_add_layernorm(io->pool, io->x, io->cache ? s.mean_ff : lens_ln_slot(io, io->ln_mean, 2 + 2 * l),
                       io->cache ? s.rstd_ff : lens_ln_slot(io, io->ln_rstd, 2 + 2 * l), h, io->x, &blk->ln_ff, N, C,
                       c->ln_eps);
}

/* Backward of lens_bert_block_forward: io->x = dL/dx' in, dL/dx out
 * (io->ff: [N][F] contiguous). */
void lens_bert_block_backward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff;
    const post_saved s = post_slots(c, io->cache);
    int N = io->N;
    /* forward: x' = LN_ff(h_ff), h_ff = a + ff_out(gelu(ff_pre)), ff_pre = ff_in(a) */
    lens_block_layernorm_backward(io, io->h, 0, io->x, s.h_ff, s.mean_ff, s.rstd_ff, &blk->ln_ff, N, C);
    memcpy(io->n, io->h, sizeof(float) * N * C);
    lens_block_linear_backward(io, io->ff, 0, io->h, s.ff_act, &blk->ff_out, N);
    lens_gelu_backward_rows(io->pool, io->ff, s.ff_pre, (size_t)F, N, F, c->gelu_tanh);
    lens_block_linear_backward(io, io->n, 1, io->ff, s.a, &blk->ff_in, N);
    /* forward: a = LN_attn(h_attn), h_attn = x + attn_out(ctx) */
    lens_block_layernorm_backward(io, io->h, 0, io->n, s.h_attn, s.mean_attn, s.rstd_attn, &blk->ln_attn, N, C);
    lens_block_linear_backward(io, io->ctx, 0, io->h, s.ctx, &blk->attn_out, N);
    memcpy(io->x, io->h, sizeof(float) * N * C);
    if (io->attend_backward(io, l)) return;
    N = io->N; /* the hook may have expanded compacted rows */
    /* forward: q, k, v = x W_{Q,K,V} + b */
    lens_block_linear_backward(io, io->x, 1, io->q, s.x_in, &blk->q, N);
    lens_block_linear_backward(io, io->x, 1, io->k, s.x_in, &blk->k, N);
    lens_block_linear_backward(io, io->x, 1, io->v, s.x_in, &blk->v, N);
}

/* JVP of the block's row-wise tail: io->x = d x' from io->h = d h_attn
 * (h_attn = x + attn_out(ctx)); io->h, io->n, io->ff scratch. */
static void bert_tail_jvp(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, T = io->cache->rows, B = io->N / T, N = io->N;
    const post_saved s = post_slots(c, io->cache);
    /* a = LN_attn(h_attn); h_ff = a + ff_out(gelu(ff_in(a))); x' = LN_ff(h_ff) */
    lens_layernorm_jvp(io->n, io->h, s.h_attn, s.mean_attn, s.rstd_attn, &blk->ln_attn, B, T, C, io->row_scratch);
    lens_block_gelu_mlp_jvp(m, blk, io, io->h, io->n, s.ff_pre);
    lens_residual_forward(io->h, io->n, (size_t)N * C);
    lens_layernorm_jvp(io->x, io->h, s.h_ff, s.mean_ff, s.rstd_ff, &blk->ln_ff, B, T, C, io->row_scratch);
}

/* JVP of lens_bert_block_forward for the B = io->N / rows tangents in io->x. */
void lens_bert_block_jvp(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, N = io->N;
    lens_block_linear_jvp(io, io->q, io->x, &blk->q, io->h, io->ff);
    lens_block_linear_jvp(io, io->k, io->x, &blk->k, io->h, io->ff);
    lens_block_linear_jvp(io, io->v, io->x, &blk->v, io->h, io->ff);
    io->attend_jvp(io, l);
    /* h_attn = x + attn_out(ctx) */
    lens_linear_jvp(io->h, io->ctx, &blk->attn_out, N, io->pool);
    lens_residual_forward(io->h, io->x, (size_t)N * C);
    if (io->row_jac) lens_block_row_jac_apply(io, io->x, io->h, io->row_jac, C);
    else bert_tail_jvp(m, io, l);
}

void lens_bert_block_row_jacobian(const lens_model *m, lens_block_io *io, int l, float *jac)
{
    lens_block_row_jacobian(io, m->cfg.d_model, jac, bert_tail_jvp, m, l);
}

const lens_family lens_family_bert = {
    .model_type = "bert",
    .base_prefix = "bert.",
    .default_arch = "BertModel",
    .task_archs = {[LENS_TASK_ENCODER] = "BertModel", [LENS_TASK_CLASSIFICATION] = "BertForSequenceClassification",
                   [LENS_TASK_MASKED_LM] = "BertForMaskedLM"},
    .caps = LENS_CAP_SEGMENTS | LENS_CAP_POOLER | LENS_CAP_TIED_HEAD | LENS_CAP_CLS_FIRST,
    .tokenizer_class = "BertTokenizer",
    .parse_config = bert_parse_config,
    .new_config = bert_new_config,
    .write_config = lens_bert_write_config,
    .walk = bert_walk,
    .block_forward = lens_bert_block_forward,
    .block_backward = lens_bert_block_backward,
    .block_jvp = lens_bert_block_jvp,
    .block_row_jacobian = lens_bert_block_row_jacobian,
    .cache_floats = lens_ln_block_cache_floats,
    .final_forward = NULL,
};
