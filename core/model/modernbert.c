/* modernbert.c - the ModernBERT family (HF ModernBertModel,
 * ModernBertForSequenceClassification, ModernBertForMaskedLM).
 *
 * A pre-norm encoder with LayerNorms without bias (norm_bias false), an
 * embedding norm and a final norm, RoPE, and local layers whose window
 * looks both ways:
 *   x0 = LN_emb(E[id])                                    model.embeddings.{tok_embeddings, norm}
 *   h = LN_attn(x) (layer 0: h = x, attn_norm is the identity)
 *   q | k | v = h Wqkv^T                                  attn.Wqkv, [3 C][C], q | k | v as views
 *   q, k = RoPE: global_rope_theta on global layers, local_rope_theta on local ones
 *   P = softmax(q k^T / sqrt(D)) over all keys (global: layer l with
 *       l % global_attn_every_n_layers == 0) or |i - j| <= local_attention / 2
 *   x = x + (P v) Wo^T                                    attn.Wo
 *   x = x + Wo (act(a) * g),  a | g = LN_mlp(x) Wi^T     mlp.Wi [2 F][C] (HF chunk(2): input | gate,
 *                                                         the first half activated), mlp.Wo, GeGLU
 *   hidden[L] = final_norm(x)
 * Heads: head.dense (no bias), classifier_activation, head.norm; masked LM:
 * decoder tied to the token embeddings plus decoder.bias; classifier: the
 * head on the first row (classifier_pooling cls) or the mean of the rows
 * (mean), then classifier. attention_bias adds Wqkv / Wo biases; mlp_bias,
 * norm_bias, classifier_bias true and decoder_bias false are refused by name,
 * as is transformers 5's rope_parameters. Presets: base = ModernBERT-base,
 * large = ModernBERT-large; random checkpoints get a generated WordPiece
 * vocabulary ([CLS] first), the real ones ship a tokenizer.json. */
#include "core/model/arch.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/nn/glu.h"

static const lens_key_choice modernbert_acts[] = {{"gelu", LENS_GLU_GELU},
                                                  {"gelu_pytorch_tanh", LENS_GLU_GELU_TANH},
                                                  {"gelu_new", LENS_GLU_GELU_TANH},
                                                  {"silu", LENS_GLU_SILU},
                                                  {NULL, 0}};
static const lens_key_choice poolings[] = {{"cls", 0}, {"mean", 1}, {NULL, 0}};

static const lens_config_key modernbert_keys[] = {
    LENS_KEY("max_position_embeddings", LENS_KEY_INT, LENS_C(max_positions), .def = 8192, .min = 1, .max = 1 << 24),
    LENS_KEY("norm_eps", LENS_KEY_FLOAT, LENS_C(ln_eps), .def = 1e-5, .min = 0, .max = 1,
             .flags = LENS_KEY_OPEN_MIN | LENS_KEY_OPEN_MAX),
    LENS_KEY("hidden_activation", LENS_KEY_CHOICE, LENS_C(glu), .def = LENS_GLU_GELU, .choices = modernbert_acts),
    LENS_KEY("classifier_activation", LENS_KEY_CHOICE, LENS_C(gelu_tanh), .choices = lens_gelu_choices),
    LENS_KEY("classifier_pooling", LENS_KEY_CHOICE, LENS_C(pool_mean), .choices = poolings),
    LENS_KEY("pad_token_id", LENS_KEY_INT, LENS_C(pad_token_id), .def = 50283, .min = 0, .max = -1,
             .max_dim = LENS_D_V),
    LENS_KEY("global_rope_theta", LENS_KEY_DOUBLE, LENS_C(rope.theta), .def = 160000, .min = 1, .max = INFINITY,
             .flags = LENS_KEY_OPEN_MIN),
    LENS_KEY("local_rope_theta", LENS_KEY_DOUBLE, LENS_C(rope_local.theta), .def = 10000, .min = 1,
             .max = INFINITY, .flags = LENS_KEY_OPEN_MIN),
    LENS_KEY("global_attn_every_n_layers", LENS_KEY_INT, LENS_C(sliding_pattern), .def = 1, .min = 1,
             .max = 1 << 20),
    LENS_KEY("local_attention", LENS_KEY_INT, LENS_C(sliding_window), .def = 128, .min = 2, .max = 1 << 24),
    LENS_KEY("attention_bias", LENS_KEY_BOOL, LENS_C(qkv_bias)),
    LENS_KEY("attention_bias", LENS_KEY_BOOL, LENS_C(o_bias)),
    LENS_KEY("mlp_bias", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY("norm_bias", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY("classifier_bias", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY("decoder_bias", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .def = 1, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_k), .def = 1, .def_dim = LENS_D_DH),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(window_bidirectional), .def = 1),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(sliding_pattern_offset), .def = 0), /* HF: layer_id % N == 0 is global */
    {0}};

/* Value heads as wide as key heads, RoPE over the whole (even) head on both
 * kinds of layers. */
static int modernbert_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (json_object_get(root, "rope_parameters"))
        return lens_fail(err, LENS_EFORMAT, "%s: \"rope_parameters\" is not supported (global_rope_theta and "
                         "local_rope_theta are)", path);
    if (cfg->d_head_k % 2)
        return lens_fail(err, LENS_EFORMAT, "%s: head size %d (hidden_size / num_attention_heads) must be even for RoPE",
                         path, cfg->d_head_k);
    cfg->d_head_v = cfg->rope.dim = cfg->rope_local.dim = cfg->d_head_k;
    return 0;
}

static int modernbert_config_extra(json_t *root, const lens_config *c)
{
    return json_object_set_new(root, "initializer_range", lens_json_float(c->init_range > 0 ? c->init_range : 0.02f));
}

static const lens_tensor_row modernbert_embedding_rows[] = {
    LENS_ROW("embeddings.tok_embeddings.weight", LENS_P(tok_emb), LENS_T_EMBEDDING, LENS_D_V, LENS_D_C),
    LENS_ROW("embeddings.norm", LENS_P(ln_emb), LENS_T_LAYERNORM_NB, LENS_D_C, LENS_D_NONE, .init = LENS_INIT_NOISE),
    {0}};

static const lens_tensor_row modernbert_layer_rows[] = {
    LENS_ROW("attn_norm", LENS_B(ln_attn), LENS_T_LAYERNORM_NB, LENS_D_C, LENS_D_NONE,
             .when = LENS_IF_NOT_FIRST_LAYER, .init = LENS_INIT_NOISE),
    LENS_ROW("attn.Wqkv", 0, LENS_T_LINEAR_NB, LENS_D_QKV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS,
             .split = LENS_SPLIT_QKV),
    LENS_ROW("attn.Wo", LENS_B(attn_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_VO, .bias_if = LENS_IF_O_BIAS,
             .init = LENS_INIT_RESID),
    LENS_ROW("mlp_norm", LENS_B(ln_ff), LENS_T_LAYERNORM_NB, LENS_D_C, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("mlp.Wi", 0, LENS_T_LINEAR_NB, LENS_D_2F, LENS_D_C, .split = LENS_SPLIT_GATE_UP),
    LENS_ROW("mlp.Wo", LENS_B(ff_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_F, .init = LENS_INIT_RESID),
    {0}};

/* The final norm, then ModernBertPredictionHead (head.dense, head.norm)
 * with the masked LM's decoder bias or the classifier. */
static const lens_tensor_row modernbert_head_rows[] = {
    LENS_ROW("model.final_norm", LENS_P(ln_final), LENS_T_LAYERNORM_NB, LENS_D_C, LENS_D_NONE,
             .init = LENS_INIT_NOISE),
    LENS_ROW("head.dense", LENS_P(mlm_transform), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_C, .when = LENS_IF_MLM),
    LENS_ROW("head.norm", LENS_P(mlm_ln), LENS_T_LAYERNORM_NB, LENS_D_C, LENS_D_NONE, .when = LENS_IF_MLM,
             .init = LENS_INIT_NOISE),
    LENS_ROW("decoder.bias", LENS_P(mlm_bias), LENS_T_VECTOR, LENS_D_V, LENS_D_NONE, .when = LENS_IF_MLM),
    LENS_ROW("head.dense", LENS_P(pooler), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_C, .when = LENS_IF_CLASSIFIER),
    LENS_ROW("head.norm", LENS_P(pooler_ln), LENS_T_LAYERNORM_NB, LENS_D_C, LENS_D_NONE, .when = LENS_IF_CLASSIFIER,
             .init = LENS_INIT_NOISE),
    LENS_ROW("classifier", LENS_P(classifier), LENS_T_LINEAR, LENS_D_LABELS, LENS_D_C, .when = LENS_IF_CLASSIFIER),
    {0}};

static const lens_tensor_section modernbert_tensors[] = {
    {"model.", 0, modernbert_embedding_rows},
    {"model.layers.%d.", 1, modernbert_layer_rows},
    {"", 0, modernbert_head_rows},
    {0}};

/* Norm statistics: slot 0 the embedding norm, 2l layer l's attn_norm (l >=
 * 1), 2l + 1 its mlp_norm, 2L the final norm. */
static void modernbert_block(const lens_model *m, int l, lens_block_prog *p)
{
    const lens_config *c = &m->cfg;
    if (l == c->n_layers) {
        lens_op_final_norm(p, m);
        return;
    }
    const lens_block *b = &m->p.blocks[l];
    const lens_reg in = l ? LENS_R_H : LENS_R_X; /* layer 0: no attn_norm */
    if (l) lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_attn, 2 * l);
    lens_op_linear(p, LENS_R_Q, in, &b->q);
    lens_op_linear(p, LENS_R_K, in, &b->k);
    lens_op_linear(p, LENS_R_V, in, &b->v);
    lens_op_rope(p, LENS_R_Q, c->n_heads, lens_layer_rope(c, l));
    lens_op_rope(p, LENS_R_K, c->n_heads, lens_layer_rope(c, l));
    lens_op_attend(p);
    lens_op_linear(p, LENS_R_H, LENS_R_CTX, &b->attn_out);
    lens_op_add(p, LENS_R_X, LENS_R_H);
    lens_op_tail(p);
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_ff, 2 * l + 1);
    lens_op_gated_mlp(p, LENS_R_H, b);
    lens_op_add(p, LENS_R_X, LENS_R_H);
}

/* micro / tiny: 3 layers, layer 0 global, 1 and 2 local (window 4 / 16),
 * WordPiece's [PAD] 0; base / large: ModernBERT-base / -large. */
static const struct {
    const char *name;
    int layers, hidden, heads, ff, vocab, positions, window, pad;
    float init;
} presets[] = {
    {"micro", 3, 32, 4, 48, 1000, 512, 4, 0, 0.25f},
    {"tiny", 3, 128, 4, 192, 1000, 512, 16, 0, 0.02f},
    {"base", 22, 768, 12, 1152, 50368, 8192, 128, 50283, 0.02f},
    {"large", 28, 1024, 16, 2624, 50368, 8192, 128, 50283, 0.02f},
};

static int modernbert_preset(lens_config *c, const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        if (strcmp(presets[i].name, name)) continue;
        c->n_layers = presets[i].layers, c->d_model = presets[i].hidden, c->n_heads = presets[i].heads;
        c->d_ff = presets[i].ff, c->vocab_size = presets[i].vocab, c->max_positions = presets[i].positions;
        c->sliding_window = presets[i].window, c->pad_token_id = presets[i].pad, c->init_range = presets[i].init;
        c->d_head_k = c->d_head_v = c->rope.dim = c->rope_local.dim = c->d_model / c->n_heads;
        c->sliding_pattern = 3;
        return 0;
    }
    return -1;
}

const lens_family lens_family_modernbert = {
    .model_type = "modernbert",
    .base_prefix = "model.",
    .default_arch = "ModernBertModel",
    .task_archs = {[LENS_TASK_ENCODER] = "ModernBertModel",
                   [LENS_TASK_CLASSIFICATION] = "ModernBertForSequenceClassification",
                   [LENS_TASK_MASKED_LM] = "ModernBertForMaskedLM"},
    .caps = LENS_CAP_PRE_NORM | LENS_CAP_POOLER | LENS_CAP_TIED_HEAD | LENS_CAP_CLS_FIRST,
    .keys = {lens_hf_size_keys, modernbert_keys},
    .config_hook = modernbert_config_hook,
    .tensors = modernbert_tensors,
    .block = modernbert_block,
    .writer = &(const lens_family_writer){.tokenizer_class = "BertTokenizer",
                                          .default_task = LENS_TASK_CLASSIFICATION,
                                          .preset = modernbert_preset,
                                          .preset_names = "micro, tiny, base, large",
                                          .config_constants = "{\"attention_dropout\": 0.0, \"embedding_dropout\": "
                                                              "0.0, \"mlp_dropout\": 0.0, \"classifier_dropout\": 0.0, "
                                                              "\"tie_word_embeddings\": true}",
                                          .config_extra = modernbert_config_extra},
};
