/* gpt_oss.c - the gpt-oss family (HF GptOssForCausalLM) on the shared
 * decoder block (decoder.c): pre-norm RMSNorm (input_layernorm,
 * post_attention_layernorm), q/k/v/o with biases, GQA, and
 *  - attention sinks: self_attn.sinks [NH], a learned logit per head in
 *    every softmax denominator, dropped after it (rows of P sum to < 1;
 *    core/nn/scores.h);
 *  - layer_types alternating "sliding_attention" (sliding_window) and
 *    "full_attention", layer 0 windowed;
 *  - RoPE with rope_scaling yarn (core/nn/rope.h; HF's default when the
 *    config has none: factor 32, beta_fast 32, beta_slow 1, truncate false,
 *    original_max_position_embeddings 4096), its attention factor folded
 *    into the score scale;
 *  - a mixture of experts on every layer (core/nn/moe.h): router
 *    mlp.router (weight and bias), top num_experts_per_tok, softmax over the
 *    top-k logits (= the full softmax renormalised over the chosen: norm_topk);
 *    the experts as stacked tensors mlp.experts.gate_up_proj [E][C][2F]
 *    (gate and up interleaved along the last axis), gate_up_proj_bias
 *    [E][2F], down_proj [E][F][C], down_proj_bias [E][C], F =
 *    intermediate_size, and the clamped SwiGLU (alpha 1.702, limit 7: glu.h).
 * Weights are read in BF16 / F16 / F32 with the HF names. MXFP4 checkpoints
 * (quantization_config, *_blocks / *_scales tensors) are refused at load with
 * the reason: dequantise them to BF16 first (transformers'
 * Mxfp4Config(dequantize=True), then save_pretrained).
 * Presets: micro / tiny / small for tests, 20b = gpt-oss-20b, 120b = gpt-oss-120b. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/model/decoder.h"

/* hidden_act "silu" names gpt-oss's clamped SwiGLU (GptOssExperts), the only activation it has. */
static const lens_key_choice gpt_oss_acts[] = {{"silu", LENS_GLU_CLAMPED_SWIGLU}, {NULL, 0}};

static const lens_config_key gpt_oss_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 64),
    LENS_KEY("hidden_act", LENS_KEY_CHOICE, LENS_C(glu), .def = LENS_GLU_CLAMPED_SWIGLU, .choices = gpt_oss_acts),
    LENS_KEY("swiglu_alpha", LENS_KEY_DOUBLE, LENS_KEY_CHECK_ONLY, .def = 1.702, /* glu.h */
             .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY("swiglu_limit", LENS_KEY_DOUBLE, LENS_KEY_CHECK_ONLY, .def = 7.0,
             .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_DECODER_TIE(0),
    LENS_KEY("attention_bias", LENS_KEY_BOOL, LENS_C(qkv_bias), .def = 1),
    LENS_KEY("attention_bias", LENS_KEY_BOOL, LENS_C(o_bias), .def = 1),
    LENS_KEY("sliding_window", LENS_KEY_INT, LENS_C(sliding_window), .def = 128, .min = 1, .max = 1 << 24,
             .flags = LENS_KEY_NULL_OFF),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(sliding_pattern), .def = 2), /* layer_types' default: odd layers full */
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(sliding_pattern_offset), .def = 1),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(attn_sinks), .def = 1),
    LENS_DECODER_EXPERTS("num_local_experts", 128),
    LENS_DECODER_MOE_EVERY_LAYER,
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(norm_topk), .def = 1),
    {0}};

static const lens_tensor_row gpt_oss_layer_rows[] = {
    LENS_ROW("self_attn.sinks", LENS_B(sinks), LENS_T_VECTOR, LENS_D_NH, LENS_D_NONE, .when = LENS_IF_SINKS,
             .init = LENS_INIT_NOISE),
    LENS_ROW("mlp.router", LENS_B(router), LENS_T_LINEAR, LENS_D_E, LENS_D_C, .when = LENS_IF_MOE),
    LENS_ROW("mlp.experts.gate_up_proj", LENS_B(experts) + offsetof(lens_moe_expert, gate_up), LENS_T_EXPERTS,
             LENS_D_C, LENS_D_2FE, .when = LENS_IF_MOE, .init = LENS_INIT_NOISE),
    LENS_ROW("mlp.experts.down_proj", LENS_B(experts) + offsetof(lens_moe_expert, down), LENS_T_EXPERTS, LENS_D_FE,
             LENS_D_C, .when = LENS_IF_MOE, .init = LENS_INIT_NOISE),
    {0}};

static const lens_tensor_section gpt_oss_tensors[] = {
    {"", 0, lens_decoder_embedding_rows},
    {"model.layers.%d.", 1, lens_decoder_layer_rows},
    {"model.layers.%d.", 1, gpt_oss_layer_rows},
    {"", 0, lens_decoder_final_rows},
    {0}};

/* HF's rope_scaling when the config has none (GptOssConfig). */
static void gpt_oss_default_yarn(lens_rope_params *r)
{
    r->type = LENS_ROPE_YARN;
    r->factor = 32.0, r->beta_fast = 32.0, r->beta_slow = 1.0, r->truncate = 0;
    r->original_max_positions = 4096;
    r->attention_factor = 0.1 * log(r->factor) + 1.0;
}

/* MXFP4 checkpoints refused by name, rope_scaling (yarn by default),
 * layer_types. */
static int gpt_oss_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    const json_t *quant = json_object_get(root, "quantization_config");
    if (quant && !json_is_null(quant)) {
        const char *method = json_string_value(json_object_get(quant, "quant_method"));
        return lens_fail(err, LENS_EFORMAT,
                         "%s: \"quantization_config\" (quant_method \"%.32s\") is not supported: lensd reads gpt-oss "
                         "weights in BF16, F16 or F32; dequantise the MXFP4 experts first (transformers "
                         "Mxfp4Config(dequantize=True), then save_pretrained)",
                         path, method ? method : "?");
    }
    if (json_object_get(root, "rope_parameters"))
        return lens_fail(err, LENS_EFORMAT, "%s: \"rope_parameters\" is not supported (rope_theta and rope_scaling are)",
                         path);
    if (lens_decoder_config_hook(root, path, cfg, err) || lens_decoder_layer_types(root, path, cfg, err)) return -1;
    const json_t *scaling = json_object_get(root, "rope_scaling");
    if (!scaling) gpt_oss_default_yarn(&cfg->rope);
    return 0;
}

static void gpt_oss_new_config(lens_config *c)
{
    c->ln_eps = 1e-5f;
    c->rope.theta = 150000.0;
    gpt_oss_default_yarn(&c->rope);
}

/* micro / tiny / small: tests (window 4 / 16 / 32 below the test lengths); 20b / 120b the real ones */
static const lens_decoder_preset gpt_oss_presets[] = {
    {"micro", 2, 32, 4, 2, 16, 24, 1000, 256, 4, 0},
    {"tiny", 2, 128, 4, 2, 32, 128, 1000, 256, 16, 0},
    {"small", 4, 256, 8, 4, 32, 256, 1000, 512, 32, 0},
    {"20b", 24, 2880, 64, 8, 64, 2880, 201088, 131072, 128, 0},
    {"120b", 36, 2880, 64, 8, 64, 2880, 201088, 131072, 128, 0},
    {0}};

static const lens_moe_preset gpt_oss_moe[] = {
    {"micro", 4, 2, 0}, {"tiny", 8, 2, 0}, {"small", 8, 2, 0}, {"20b", 32, 4, 0}, {"120b", 128, 4, 0}, {0}};

/* The test presets' YaRN: factor 4 over 64 original positions (max_positions = 256 = 4 * 64), so
 * the ramp between kept and interpolated channels falls inside the micro head. */
static int gpt_oss_preset(lens_config *c, const char *name)
{
    if (lens_moe_apply_preset(gpt_oss_presets, gpt_oss_moe, name, c)) return -1;
    c->sliding_pattern = 2, c->sliding_pattern_offset = 1;
    if (c->max_positions < 4096) {
        c->rope.factor = 4.0, c->rope.original_max_positions = c->max_positions / 4;
        c->rope.attention_factor = 0.1 * log(c->rope.factor) + 1.0;
    }
    return 0;
}

const lens_family lens_family_gpt_oss = {
    .model_type = "gpt_oss",
    .default_arch = "GptOssForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "GptOssModel", [LENS_TASK_CAUSAL_LM] = "GptOssForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, gpt_oss_keys},
    .base_prefix = "model.",
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,
    .config_hook = gpt_oss_config_hook,
    .tensors = gpt_oss_tensors,
    .block = lens_decoder_block,
    .writer = &(const lens_family_writer){.new_config = gpt_oss_new_config, .preset = gpt_oss_preset,
                                          .preset_names = "micro, tiny, small, 20b, 120b",
                                          .default_task = LENS_TASK_CAUSAL_LM,
                                          .config_constants = LENS_DECODER_CONSTANTS,
                                          .config_extra = lens_decoder_config_extra_layer_types,
                                          .bpe_last = "<|endoftext|>"},
};
