/* roberta.c - the RoBERTa family (HF RobertaModel,
 * RobertaForSequenceClassification, RobertaForMaskedLM).
 *
 * BERT's config keys, encoder and post-norm block (bert.c) under
 * "roberta.", with two differences:
 *  - position ids start after the padding id: pos = padding_idx + cumsum of
 *    the non-pad mask for real tokens, padding_idx for pad tokens (HF's
 *    create_position_ids_from_input_ids), so the table has padding_idx + 1
 *    more rows than the longest input (514 for 512 tokens);
 *  - the heads: classifier.dense + tanh + classifier.out_proj on <s>
 *    (the same math as BERT's pooler + classifier), lm_head.dense + GELU +
 *    lm_head.layer_norm + decoder tied to the word embeddings + lm_head.bias.
 * One segment (type_vocab_size 1): text pairs are a tokenizer template
 * (<s> A </s></s> B </s>), not segment embeddings. */
#include "core/model/arch.h"

#include <jansson.h>
#include <string.h>

#include "core/nn/ops.h"

const lens_config_key lens_roberta_pad_keys[] = {
    LENS_KEY("pad_token_id", LENS_KEY_INT, LENS_C(pad_token_id), .def = 1, .min = 0, .max = -1,
             .max_dim = LENS_D_V),
    {0}};

/* Positions: the table's first padding_idx + 1 rows are not token positions. */
int lens_roberta_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    (void)root;
    cfg->position_offset = cfg->pad_token_id + 1;
    if (cfg->max_positions <= cfg->position_offset)
        return lens_fail(err, LENS_EFORMAT, "%s: max_position_embeddings %d leaves no position after padding_idx %d",
                         path, cfg->max_positions, cfg->pad_token_id);
    cfg->max_positions -= cfg->position_offset; /* tokens, not table rows */
    return 0;
}

/* The table's rows, and roberta-base's <s> = 0, </s> = 2. */
int lens_roberta_config_extra(json_t *root, const lens_config *c)
{
    return json_object_set_new(root, "max_position_embeddings", json_integer(c->max_positions + c->position_offset)) ||
           json_object_set_new(root, "bos_token_id", json_integer(0)) ||
           json_object_set_new(root, "eos_token_id", json_integer(2));
}

/* roberta-base: GPT-2's byte-level BPE plus <s> <pad> </s> <unk> and
 * <mask>, one segment, positions after padding_idx 1 */
static void roberta_new_config(lens_config *c)
{
    c->vocab_size = 50265, c->type_vocab_size = 1, c->ln_eps = 1e-5f, c->position_offset = c->pad_token_id + 1;
}

/* RobertaForSequenceClassification's classifier.dense + out_proj,
 * RobertaForMaskedLM's lm_head (lm_head.decoder.weight is the word
 * embeddings, tied and not saved; its bias is lm_head.bias). */
static const lens_tensor_row roberta_head_rows[] = {
    LENS_ROW("classifier.dense", LENS_P(pooler), LENS_T_LINEAR, LENS_D_C, LENS_D_C, .when = LENS_IF_CLASSIFIER),
    LENS_ROW("classifier.out_proj", LENS_P(classifier), LENS_T_LINEAR, LENS_D_LABELS, LENS_D_C,
             .when = LENS_IF_CLASSIFIER),
    LENS_ROW("lm_head.dense", LENS_P(mlm_transform), LENS_T_LINEAR, LENS_D_C, LENS_D_C, .when = LENS_IF_MLM),
    LENS_ROW("lm_head.layer_norm", LENS_P(mlm_ln), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE, .when = LENS_IF_MLM),
    LENS_ROW("lm_head.bias", LENS_P(mlm_bias), LENS_T_VECTOR, LENS_D_V, LENS_D_NONE, .when = LENS_IF_MLM),
    {0}};

const lens_tensor_section lens_roberta_tensors[] = {
    {"roberta.", 0, lens_bert_embedding_rows},
    {"roberta.encoder.layer.%d.", 1, lens_bert_layer_rows},
    {"", 0, roberta_head_rows},
    {0}};

const lens_family lens_family_roberta = {
    .model_type = "roberta",
    .base_prefix = "roberta.",
    .default_arch = "RobertaModel",
    .task_archs = {[LENS_TASK_ENCODER] = "RobertaModel", [LENS_TASK_CLASSIFICATION] = "RobertaForSequenceClassification",
                   [LENS_TASK_MASKED_LM] = "RobertaForMaskedLM"},
    .caps = LENS_CAP_POOLER | LENS_CAP_TIED_HEAD | LENS_CAP_CLS_FIRST | LENS_CAP_BYTE_BPE,
    .keys = {lens_hf_size_keys, lens_bert_keys, lens_roberta_pad_keys},
    .config_hook = lens_roberta_config_hook,
    .tensors = lens_roberta_tensors,
    .block = lens_bert_block,
    .writer = &(const lens_family_writer){.tokenizer_class = "RobertaTokenizer",
                                          .bpe_first = {"<s>", "<pad>", "</s>", "<unk>"}, /* as roberta-base */
                                          .bpe_last = "<mask>",
                                          .default_task = LENS_TASK_CLASSIFICATION,
                                          .new_config = roberta_new_config,
                                          .config_constants = lens_bert_config_constants,
                                          .config_extra = lens_roberta_config_extra},
};
