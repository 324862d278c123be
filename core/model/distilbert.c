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

static void distilbert_walk(const lens_config *c, lens_params *p, lens_param_visitor *v)
{
    const int C = c->d_model;
    const float sd = 0.02f;
    p->tok_emb = lens_walk_tensor(v, "distilbert.embeddings.word_embeddings.weight", c->vocab_size, C,
                                  LENS_PARAM_EMBEDDING, sd);
    p->pos_emb = lens_walk_tensor(v, "distilbert.embeddings.position_embeddings.weight", c->max_positions, C,
                                  LENS_PARAM_EMBEDDING, sd);
    p->type_emb = NULL;
    lens_walk_layernorm(v, &p->ln_emb, "distilbert.embeddings.LayerNorm", C);
    for (int l = 0; l < c->n_layers; l++) {
        lens_block *blk = &p->blocks[l];
        char n[128];
#define AT(suffix) (snprintf(n, sizeof n, "distilbert.transformer.layer.%d.%s", l, suffix), n)
        lens_walk_linear(v, &blk->q, AT("attention.q_lin"), C, C, 0, sd);
        lens_walk_linear(v, &blk->k, AT("attention.k_lin"), C, C, 0, sd);
        lens_walk_linear(v, &blk->v, AT("attention.v_lin"), C, C, 0, sd);
        lens_walk_linear(v, &blk->attn_out, AT("attention.out_lin"), C, C, 0, sd);
        lens_walk_layernorm(v, &blk->ln_attn, AT("sa_layer_norm"), C);
        lens_walk_linear(v, &blk->ff_in, AT("ffn.lin1"), C, c->d_ff, 0, sd);
        lens_walk_linear(v, &blk->ff_out, AT("ffn.lin2"), c->d_ff, C, 0, sd);
        lens_walk_layernorm(v, &blk->ln_ff, AT("output_layer_norm"), C);
#undef AT
    }
    if (c->task == LENS_TASK_CLASSIFICATION) {
        lens_walk_linear(v, &p->pooler, "pre_classifier", C, C, 0, sd);
        lens_walk_linear(v, &p->classifier, "classifier", C, c->n_labels, 0, sd);
    } else if (c->task == LENS_TASK_MASKED_LM) {
        lens_walk_linear(v, &p->mlm_transform, "vocab_transform", C, C, 0, sd);
        lens_walk_layernorm(v, &p->mlm_ln, "vocab_layer_norm", C);
        p->mlm_bias = lens_walk_tensor(v, "vocab_projector.bias", c->vocab_size, 0, LENS_PARAM_BIAS, 0);
    }
}

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
    .walk = distilbert_walk,
    .block_forward = lens_bert_block_forward,
    .block_backward = lens_bert_block_backward,
    .block_jvp = lens_bert_block_jvp,
    .block_row_jacobian = lens_bert_block_row_jacobian,
    .cache_floats = lens_ln_block_cache_floats,
    .final_forward = NULL,
};
