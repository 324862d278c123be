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

#include <string.h>

/* LayerNorm eps is 1e-12 in the modeling code, not a key. */
static const lens_config_key distilbert_keys[] = {
    LENS_KEY("dim", LENS_KEY_INT, LENS_C(d_model), .min = 1, .max = 1 << 16, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("n_layers", LENS_KEY_INT, LENS_C(n_layers), .min = 1, .max = 1024, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("n_heads", LENS_KEY_INT, LENS_C(n_heads), .min = 1, .max = 1024, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("hidden_dim", LENS_KEY_INT, LENS_C(d_ff), .min = 1, .max = 1 << 20, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("vocab_size", LENS_KEY_INT, LENS_C(vocab_size), .min = 1, .max = 1 << 24, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("max_position_embeddings", LENS_KEY_INT, LENS_C(max_positions), .def = 512, .min = 1, .max = 1 << 20),
    LENS_KEY("pad_token_id", LENS_KEY_INT, LENS_C(pad_token_id), .min = 0, .max = -1, .max_dim = LENS_D_V),
    LENS_KEY("activation", LENS_KEY_CHOICE, LENS_C(gelu_tanh), .choices = lens_gelu_choices),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_k), .def = 1, .def_dim = LENS_D_DH),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_v), .def = 1, .def_dim = LENS_D_DH),
    LENS_KEY(NULL, LENS_KEY_FLOAT, LENS_C(ln_eps), .def = 1e-12),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(head_relu), .def = 1),
    {0}};

static void distilbert_new_config(lens_config *c) { c->vocab_size = 30522; }

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
    .keys = {distilbert_keys},
    .tensors = distilbert_tensors,
    .block = lens_bert_block,
    .writer = &(const lens_family_writer){
        .tokenizer_class = "DistilBertTokenizer", .default_task = LENS_TASK_CLASSIFICATION,
        .new_config = distilbert_new_config,
        .config_constants = "{\"sinusoidal_pos_embds\": false, \"dropout\": 0.0, \"attention_dropout\": 0.0, "
                            "\"tie_weights_\": true}"},
};
