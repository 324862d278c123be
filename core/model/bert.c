/* bert.c - the BERT family (HF BertModel, BertForSequenceClassification,
 * BertForMaskedLM), including the identifiable-encoder variant: its config
 * keys and tensor names (tables), and the post-norm block.
 *
 * Block (post-LN):  a = LN(x + Attn(x));  x' = LN(a + FFN(a))
 * with Attn(x) = concat_h softmax(q_h k_h^T / sqrt(DK)) v_h W_O + b_O.
 * LayerNorm statistics slots: 0 embeddings, 1 + 2l attention, 2 + 2l FFN. */
#include "core/model/arch.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/ops.h"

/* BertConfig keys after lens_hf_size_keys (RobertaConfig has the same
 * ones: its own pad_token_id default follows them in roberta.c). */
static const lens_key_choice attention_scales[] = {{"DK", 0}, {"DV", 1}, {NULL, 0}};
static const lens_key_choice absolute_positions[] = {{"absolute", 0}, {NULL, 0}};

const lens_config_key lens_bert_keys[] = {
    LENS_KEY("max_position_embeddings", LENS_KEY_INT, LENS_C(max_positions), .def = 512, .min = 1, .max = 1 << 20),
    LENS_KEY("type_vocab_size", LENS_KEY_INT, LENS_C(type_vocab_size), .def = 2, .min = 1, .max = 1024),
    LENS_KEY("layer_norm_eps", LENS_KEY_FLOAT, LENS_C(ln_eps), .def = 1e-12, .min = 0, .max = 1,
             .flags = LENS_KEY_OPEN_MIN | LENS_KEY_OPEN_MAX),
    LENS_KEY("hidden_act", LENS_KEY_CHOICE, LENS_C(gelu_tanh), .choices = lens_gelu_choices),
    LENS_KEY("position_embedding_type", LENS_KEY_CHOICE, LENS_KEY_CHECK_ONLY, .choices = absolute_positions),
    /* the identifiable variant (docs/identifiable-encoder.md, docs/reproducing.md) */
    LENS_KEY("head_dim_key", LENS_KEY_INT, LENS_C(d_head_k), .def = 1, .def_dim = LENS_D_DH, .min = 1,
             .max = 1 << 16, .flags = LENS_KEY_IF_CHANGED),
    LENS_KEY("head_dim_value", LENS_KEY_INT, LENS_C(d_head_v), .def = 1, .def_dim = LENS_D_DH, .min = 1,
             .max = 1 << 16, .flags = LENS_KEY_IF_CHANGED),
    LENS_KEY("attention_scale", LENS_KEY_CHOICE, LENS_C(scale_by_dv), .flags = LENS_KEY_IF_CHANGED,
             .choices = attention_scales),
    LENS_KEY("head_combination", LENS_KEY_CHOICE, LENS_C(head_combination), .flags = LENS_KEY_IF_CHANGED,
             .choices = lens_head_combination_choices),
    {0}};

static const lens_config_key bert_pad_keys[] = {
    LENS_KEY("pad_token_id", LENS_KEY_INT, LENS_C(pad_token_id), .min = 0, .max = -1, .max_dim = LENS_D_V),
    {0}};

static void bert_new_config(lens_config *c) { c->vocab_size = 30522; }

/* What config.json carries beyond the keys (no dropout: lensd trains none). */
const char lens_bert_config_constants[] = "{\"hidden_dropout_prob\": 0.0, \"attention_probs_dropout_prob\": 0.0, "
                                          "\"tie_word_embeddings\": true}";

/* HF order: embeddings, encoder.layer.{l}, then the task head. Base-model
 * tensors carry the prefix ("bert."; BertModel checkpoints drop it, the
 * loader copes). Summed heads (model.h): attention.output.dense.weight is
 * [C][DV] in the file. */
const lens_tensor_row lens_bert_embedding_rows[] = {
    LENS_ROW("embeddings.word_embeddings.weight", LENS_P(tok_emb), LENS_T_EMBEDDING, LENS_D_V, LENS_D_C),
    LENS_ROW("embeddings.position_embeddings.weight", LENS_P(pos_emb), LENS_T_EMBEDDING, LENS_D_POS, LENS_D_C),
    LENS_ROW("embeddings.token_type_embeddings.weight", LENS_P(type_emb), LENS_T_EMBEDDING, LENS_D_TYPES, LENS_D_C),
    LENS_ROW("embeddings.LayerNorm", LENS_P(ln_emb), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    {0}};

const lens_tensor_row lens_bert_layer_rows[] = {
    LENS_ROW("attention.self.query", LENS_B(q), LENS_T_LINEAR, LENS_D_QK, LENS_D_C),
    LENS_ROW("attention.self.key", LENS_B(k), LENS_T_LINEAR, LENS_D_QK, LENS_D_C),
    LENS_ROW("attention.self.value", LENS_B(v), LENS_T_LINEAR, LENS_D_VO, LENS_D_C),
    LENS_ROW("attention.output.dense", LENS_B(attn_out), LENS_T_LINEAR, LENS_D_C, LENS_D_VO, .summed = 1),
    LENS_ROW("attention.output.LayerNorm", LENS_B(ln_attn), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    LENS_ROW("intermediate.dense", LENS_B(ff_in), LENS_T_LINEAR, LENS_D_F, LENS_D_C),
    LENS_ROW("output.dense", LENS_B(ff_out), LENS_T_LINEAR, LENS_D_C, LENS_D_F),
    LENS_ROW("output.LayerNorm", LENS_B(ln_ff), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    {0}};

/* BertForSequenceClassification's pooler + classifier, BertForMaskedLM's
 * cls.predictions (decoder weight tied to the word embeddings; HF saves no
 * copy). */
static const lens_tensor_row bert_head_rows[] = {
    LENS_ROW("bert.pooler.dense", LENS_P(pooler), LENS_T_LINEAR, LENS_D_C, LENS_D_C, .when = LENS_IF_CLASSIFIER),
    LENS_ROW("classifier", LENS_P(classifier), LENS_T_LINEAR, LENS_D_LABELS, LENS_D_C, .when = LENS_IF_CLASSIFIER),
    LENS_ROW("cls.predictions.transform.dense", LENS_P(mlm_transform), LENS_T_LINEAR, LENS_D_C, LENS_D_C,
             .when = LENS_IF_MLM),
    LENS_ROW("cls.predictions.transform.LayerNorm", LENS_P(mlm_ln), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE,
             .when = LENS_IF_MLM),
    LENS_ROW("cls.predictions.bias", LENS_P(mlm_bias), LENS_T_VECTOR, LENS_D_V, LENS_D_NONE, .when = LENS_IF_MLM),
    {0}};

static const lens_tensor_section bert_tensors[] = {
    {"bert.", 0, lens_bert_embedding_rows},
    {"bert.encoder.layer.%d.", 1, lens_bert_layer_rows},
    {"", 0, bert_head_rows},
    {0}};

/* x = LN(token + position + segment embeddings). */
void lens_bert_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *mean,
                       float *rstd)
{
    const lens_config *c = &m->cfg;
    lens_embedding_forward(x, ids, type_ids, m->p.tok_emb, m->p.pos_emb, m->p.type_emb, m->p.emb_dtype, T,
                           c->d_model);
    lens_add_layernorm(NULL, x, mean, rstd, x, NULL, &m->p.ln_emb, T, c->d_model, c->ln_eps);
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
    .caps = LENS_CAP_SEGMENTS | LENS_CAP_POOLER | LENS_CAP_TIED_HEAD | LENS_CAP_CLS_FIRST | LENS_CAP_TRAIN,
    .keys = {lens_hf_size_keys, lens_bert_keys, bert_pad_keys},
    .tensors = bert_tensors,
    .embed = lens_bert_embed,
    .block_forward = lens_bert_block_forward,
    .block_backward = lens_bert_block_backward,
    .block_jvp = lens_bert_block_jvp,
    .block_row_jacobian = lens_bert_block_row_jacobian,
    .cache_floats = lens_ln_block_cache_floats,
    .final_forward = NULL,
    .writer = &(const lens_family_writer){.tokenizer_class = "BertTokenizer",
                                          .default_task = LENS_TASK_CLASSIFICATION,
                                          .new_config = bert_new_config,
                                          .config_constants = lens_bert_config_constants},
};
