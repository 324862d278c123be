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

static int roberta_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_bert_parse_keys(root, path, cfg, err)) return -1;
    if (!json_object_get(root, "pad_token_id")) cfg->pad_token_id = 1;
    cfg->position_offset = cfg->pad_token_id + 1;
    if (cfg->max_positions <= cfg->position_offset)
        return lens_fail(err, LENS_EFORMAT, "%s: max_position_embeddings %d leaves no position after padding_idx %d",
                         path, cfg->max_positions, cfg->pad_token_id);
    cfg->max_positions -= cfg->position_offset; /* tokens, not table rows */
    return lens_config_task(root, path, cfg, err);
}

static int roberta_new_config(lens_config *c, const char *task, lens_err *err)
{
    /* roberta-base: GPT-2's byte-level BPE plus <s> <pad> </s> <unk> and <mask> */
    c->vocab_size = 50265, c->max_positions = 512, c->type_vocab_size = 1, c->ln_eps = 1e-5f, c->gelu_tanh = 0;
    c->pad_token_id = 1, c->position_offset = 2;
    return lens_new_encoder_task(c, task, err);
}

static void roberta_walk(const lens_config *c, lens_params *p, lens_param_visitor *v)
{
    const int C = c->d_model;
    lens_bert_walk_encoder(c, p, v, "roberta.");
    if (c->task == LENS_TASK_CLASSIFICATION) {
        lens_walk_linear(v, &p->pooler, "classifier.dense", C, C, 0, 0.02f);
        lens_walk_linear(v, &p->classifier, "classifier.out_proj", C, c->n_labels, 0, 0.02f);
    } else if (c->task == LENS_TASK_MASKED_LM) {
        /* lm_head.decoder.weight is the word embeddings (tied, not saved);
         * its bias is lm_head.bias */
        lens_walk_linear(v, &p->mlm_transform, "lm_head.dense", C, C, 0, 0.02f);
        lens_walk_layernorm(v, &p->mlm_ln, "lm_head.layer_norm", C);
        p->mlm_bias = lens_walk_tensor(v, "lm_head.bias", c->vocab_size, 0, LENS_PARAM_BIAS, 0);
    }
}

const lens_family lens_family_roberta = {
    .model_type = "roberta",
    .base_prefix = "roberta.",
    .default_arch = "RobertaModel",
    .task_archs = {[LENS_TASK_ENCODER] = "RobertaModel", [LENS_TASK_CLASSIFICATION] = "RobertaForSequenceClassification",
                   [LENS_TASK_MASKED_LM] = "RobertaForMaskedLM"},
    .caps = LENS_CAP_POOLER | LENS_CAP_TIED_HEAD | LENS_CAP_CLS_FIRST | LENS_CAP_BYTE_BPE,
    .tokenizer_class = "RobertaTokenizer",
    .bpe_first = {"<s>", "<pad>", "</s>", "<unk>"}, /* as roberta-base */
    .bpe_last = "<mask>",
    .parse_config = roberta_parse_config,
    .new_config = roberta_new_config,
    .write_config = lens_bert_write_config,
    .walk = roberta_walk,
    .block_forward = lens_bert_block_forward,
    .block_backward = lens_bert_block_backward,
    .block_jvp = lens_bert_block_jvp,
    .block_row_jacobian = lens_bert_block_row_jacobian,
    .cache_floats = lens_ln_block_cache_floats,
    .final_forward = NULL,
};
