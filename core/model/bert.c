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

/* a = LN(x + Attn(x)); x' = LN(a + FFN(a)), statistics in slots 1 + 2l and
 * 2 + 2l; the row-wise tail starts at the attention's residual sum. */
void lens_bert_block(const lens_model *m, int l, lens_block_prog *p)
{
    if (l == m->cfg.n_layers) return; /* post-norm: no final norm */
    const lens_block *b = &m->p.blocks[l];
    lens_op_linear(p, LENS_R_Q, LENS_R_X, &b->q);
    lens_op_linear(p, LENS_R_K, LENS_R_X, &b->k);
    lens_op_linear(p, LENS_R_V, LENS_R_X, &b->v);
    lens_op_attend(p);
    lens_op_linear(p, LENS_R_H, LENS_R_CTX, &b->attn_out);
    lens_op_add(p, LENS_R_H, LENS_R_X);
    lens_op_tail(p);
    lens_op_norm(p, LENS_R_X, LENS_R_H, &b->ln_attn, 1 + 2 * l);
    lens_op_linear(p, LENS_R_FF, LENS_R_X, &b->ff_in);
    lens_op_gelu(p);
    lens_op_linear(p, LENS_R_H, LENS_R_FF, &b->ff_out);
    lens_op_add(p, LENS_R_H, LENS_R_X);
    lens_op_norm(p, LENS_R_X, LENS_R_H, &b->ln_ff, 2 + 2 * l);
}

const lens_family lens_family_bert = {
    .model_type = "bert",
    .base_prefix = "bert.",
    .default_arch = "BertModel",
    .task_archs = {[LENS_TASK_ENCODER] = "BertModel", [LENS_TASK_CLASSIFICATION] = "BertForSequenceClassification",
                   [LENS_TASK_MASKED_LM] = "BertForMaskedLM"},
    .caps = LENS_CAP_SEGMENTS | LENS_CAP_POOLER | LENS_CAP_TIED_HEAD | LENS_CAP_CLS_FIRST,
    .keys = {lens_hf_size_keys, lens_bert_keys, bert_pad_keys},
    .tensors = bert_tensors,
    .block = lens_bert_block,
    .writer = &(const lens_family_writer){.tokenizer_class = "BertTokenizer",
                                          .default_task = LENS_TASK_CLASSIFICATION,
                                          .new_config = bert_new_config,
                                          .config_constants = lens_bert_config_constants},
};
