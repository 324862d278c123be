/* distilbert.c - the DistilBERT family (HF DistilBertModel,
 * DistilBertForSequenceClassification, DistilBertForMaskedLM).
 *
 * Config keys: dim, n_layers, n_heads, hidden_dim, vocab_size,
 * max_position_embeddings, activation, sinusoidal_pos_embds (the sinusoids
 * are stored in position_embeddings.weight like learned ones, so both load
 * alike), pad_token_id; LayerNorm eps is 1e-12 in the modeling code.
 *
 * BERT's post-norm block and embedding without segments (no
 * token_type_embeddings, no pooler), under other names:
 *   distilbert.embeddings.{word_embeddings,position_embeddings,LayerNorm}
 *   distilbert.transformer.layer.{l}.attention.{q_lin,k_lin,v_lin,out_lin}
 *     .sa_layer_norm, .ffn.{lin1,lin2}, .output_layer_norm
 * Heads: pre_classifier + ReLU + classifier on the first token;
 * vocab_transform + activation + vocab_layer_norm + vocab_projector (weight
 * tied to the word embeddings, its bias saved as vocab_projector.bias). */
#include "core/model/arch.h"

#include <jansson.h>
#include <string.h>

static int distilbert_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_json_int(root, path, "dim", -1, 1, 1 << 16, &cfg->d_model, err) ||
        lens_json_int(root, path, "n_layers", -1, 1, 1024, &cfg->n_layers, err) ||
        lens_json_int(root, path, "n_heads", -1, 1, 1024, &cfg->n_heads, err) ||
        lens_json_int(root, path, "hidden_dim", -1, 1, 1 << 20, &cfg->d_ff, err) ||
        lens_json_int(root, path, "vocab_size", -1, 1, 1 << 24, &cfg->vocab_size, err) ||
        lens_json_int(root, path, "max_position_embeddings", 512, 1, 1 << 20, &cfg->max_positions, err) ||
        lens_json_int(root, path, "pad_token_id", 0, 0, cfg->vocab_size - 1, &cfg->pad_token_id, err))
        return -1;
    const char *act = lens_json_str(root, "activation");
    if (lens_parse_activation(path, act ? act : "gelu", &cfg->gelu_tanh, err)) return -1;
    if (cfg->d_model % cfg->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: dim %d is not a multiple of n_heads %d", path, cfg->d_model,
                         cfg->n_heads);
    cfg->d_head_k = cfg->d_head_v = cfg->d_model / cfg->n_heads;
    cfg->ln_eps = 1e-12f, cfg->type_vocab_size = 0, cfg->head_relu = 1;
    return lens_config_task(root, path, cfg, err);
}

static int distilbert_new_config(lens_config *c, const char *task, lens_err *err)
{
    c->vocab_size = 30522, c->max_positions = 512, c->ln_eps = 1e-12f, c->gelu_tanh = 0, c->head_relu = 1;
    return lens_new_encoder_task(c, task, err);
}

static void distilbert_write_config(FILE *f, const lens_config *c, int random_weights)
{
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"distilbert\",\n"
            "  \"activation\": \"%s\",\n  \"dim\": %d,\n  \"n_layers\": %d,\n  \"n_heads\": %d,\n"
            "  \"hidden_dim\": %d,\n  \"max_position_embeddings\": %d,\n  \"vocab_size\": %d,\n"
            "  \"sinusoidal_pos_embds\": false,\n  \"dropout\": 0.0,\n  \"attention_dropout\": 0.0,\n"
            "  \"pad_token_id\": %d,\n  \"tie_weights_\": true,\n",
            c->family->task_archs[c->task], c->gelu_tanh ? "gelu_new" : "gelu", c->d_model, c->n_layers, c->n_heads,
            c->d_ff, c->max_positions, c->vocab_size, c->pad_token_id);
    lens_write_task_tail(f, c, random_weights);
}

static const lens_tensor_row distilbert_embedding_rows[] = {
    LENS_ROW("word_embeddings.weight", LENS_P(tok_emb), LENS_T_EMBEDDING, LENS_D_V, LENS_D_C),
    LENS_ROW("position_embeddings.weight", LENS_P(pos_emb), LENS_T_EMBEDDING, LENS_D_POS, LENS_D_C),
    LENS_ROW("LayerNorm", LENS_P(ln_emb), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    {0}};

static const lens_tensor_row distilbert_layer_rows[] = {
    LENS_ROW("attention.q_lin", LENS_B(q), LENS_T_LINEAR, LENS_D_QK, LENS_D_C),
    LENS_ROW("attention.k_lin", LENS_B(k), LENS_T_LINEAR, LENS_D_QK, LENS_D_C),
    LENS_ROW("attention.v_lin", LENS_B(v), LENS_T_LINEAR, LENS_D_VO, LENS_D_C),
    LENS_ROW("attention.out_lin", LENS_B(attn_out), LENS_T_LINEAR, LENS_D_C, LENS_D_VO),
    LENS_ROW("sa_layer_norm", LENS_B(ln_attn), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    LENS_ROW("ffn.lin1", LENS_B(ff_in), LENS_T_LINEAR, LENS_D_F, LENS_D_C),
    LENS_ROW("ffn.lin2", LENS_B(ff_out), LENS_T_LINEAR, LENS_D_C, LENS_D_F),
    LENS_ROW("output_layer_norm", LENS_B(ln_ff), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    {0}};

static const lens_tensor_row distilbert_head_rows[] = {
    LENS_ROW("pre_classifier", LENS_P(pooler), LENS_T_LINEAR, LENS_D_C, LENS_D_C, .when = LENS_IF_CLASSIFIER),
    LENS_ROW("classifier", LENS_P(classifier), LENS_T_LINEAR, LENS_D_LABELS, LENS_D_C, .when = LENS_IF_CLASSIFIER),
    LENS_ROW("vocab_transform", LENS_P(mlm_transform), LENS_T_LINEAR, LENS_D_C, LENS_D_C, .when = LENS_IF_MLM),
    LENS_ROW("vocab_layer_norm", LENS_P(mlm_ln), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE, .when = LENS_IF_MLM),
    LENS_ROW("vocab_projector.bias", LENS_P(mlm_bias), LENS_T_VECTOR, LENS_D_V, LENS_D_NONE, .when = LENS_IF_MLM),
    {0}};

static const lens_tensor_section distilbert_tensors[] = {
    {"distilbert.embeddings.", 0, distilbert_embedding_rows},
    {"distilbert.transformer.layer.%d.", 1, distilbert_layer_rows},
    {"", 0, distilbert_head_rows},
    {0}};

const lens_family lens_family_distilbert = {
    .model_type = "distilbert",
    .base_prefix = "distilbert.",
    .default_arch = "DistilBertModel",
    .task_archs = {[LENS_TASK_ENCODER] = "DistilBertModel",
                   [LENS_TASK_CLASSIFICATION] = "DistilBertForSequenceClassification",
                   [LENS_TASK_MASKED_LM] = "DistilBertForMaskedLM"},
    .caps = LENS_CAP_POOLER | LENS_CAP_TIED_HEAD | LENS_CAP_CLS_FIRST,
    .tokenizer_class = "DistilBertTokenizer",
    .parse_config = distilbert_parse_config,
    .new_config = distilbert_new_config,
    .write_config = distilbert_write_config,
    .tensors = distilbert_tensors,
    .embed = lens_bert_embed, /* type_emb NULL: tok + pos, then LayerNorm */
    .block_forward = lens_bert_block_forward,
    .block_backward = lens_bert_block_backward,
    .block_jvp = lens_bert_block_jvp,
    .block_row_jacobian = lens_bert_block_row_jacobian,
    .cache_floats = lens_ln_block_cache_floats,
    .final_forward = NULL,
};
