/* gemma.c - the Gemma, Gemma 2 and Gemma 3 families (HF GemmaForCausalLM,
 * Gemma2ForCausalLM, Gemma3ForCausalLM of model_type gemma3_text) on the
 * shared decoder block (decoder.c).
 *
 * Both: RMSNorm gain 1 + w (GemmaRMSNorm), embeddings times sqrt(C) (HF's
 * normalizer, a tensor in the model dtype: float32 here), GeGLU with the
 * tanh GELU, tied LM head, head_dim (default 256).
 * Config keys: the common decoder keys (decoder.h) plus
 *   gemma    hidden_activation (default gelu_pytorch_tanh), attention_bias
 *   gemma2   + query_pre_attn_scalar (scores scaled by its -1/2 power),
 *            attn_logit_softcapping, final_logit_softcapping (null = off),
 *            sliding_window on even layers (HF: layer_idx % 2 == 0 is local),
 *            pre_feedforward_layernorm and post-norms after attention and MLP
 *   gemma3_text  Gemma 2's keys and norms (soft-caps null by default) plus
 *            q_norm / k_norm per head (1 + w), sliding_window on all but every
 *            sliding_window_pattern-th layer (or as layer_types lists), the
 *            window layers' RoPE at rope_local_base_freq without scaling,
 *            the global ones' at rope_theta with rope_scaling
 * Presets: gemma 1b = gemma-2b, 8b = gemma-7b; gemma2 1b = gemma-2-2b,
 * 8b = gemma-2-9b; gemma3_text 1b = gemma-3-1b, 4b / 12b the text towers of
 * gemma-3-4b / 12b. Gemma3ForConditionalGeneration's checkpoints (model_type
 * gemma3) are read as their text tower (config.c, model.c): its
 * text_config over Gemma3TextConfig's defaults, the vision tensors
 * ignored. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/model/decoder.h"

#define GEMMA_KEYS                                                                                                 \
    LENS_DECODER_HEAD_DIM(.def = 256),                                                                             \
    LENS_KEY("hidden_activation", LENS_KEY_CHOICE, LENS_C(glu), .alias = "hidden_act", .def = LENS_GLU_GELU_TANH,  \
             .choices = lens_glu_choices),                                                                         \
    LENS_DECODER_TIE(1), LENS_DECODER_ATTENTION_BIAS,                                                              \
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(norm_unit_offset), .def = 1)

static const lens_config_key gemma_keys[] = {GEMMA_KEYS, {0}};

/* Gemma 2 and 3: the window, soft-caps (null = off) with their defaults,
 * query_pre_attn_scalar, post-norms. */
#define GEMMA2_KEYS(attn_cap, final_cap)                                                                           \
    GEMMA_KEYS, LENS_DECODER_WINDOW,                                                                               \
    LENS_KEY("attn_logit_softcapping", LENS_KEY_FLOAT, LENS_C(attn_softcap), .def = (attn_cap), .min = 0,          \
             .max = INFINITY, .flags = LENS_KEY_NULL_OFF | LENS_KEY_OPEN_MIN),                                     \
    LENS_KEY("final_logit_softcapping", LENS_KEY_FLOAT, LENS_C(final_softcap), .def = (final_cap), .min = 0,       \
             .max = INFINITY, .flags = LENS_KEY_NULL_OFF | LENS_KEY_OPEN_MIN),                                     \
    LENS_KEY("query_pre_attn_scalar", LENS_KEY_FLOAT, LENS_C(query_pre_attn_scalar), .def = 256, .min = 0,         \
             .max = INFINITY, .flags = LENS_KEY_OPEN_MIN),                                                         \
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(post_norms), .def = 1),                                                    \
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(sliding_pattern_offset), .def = 1) /* HF: (layer + 1) % N */

static const lens_config_key gemma2_keys[] = {
    GEMMA2_KEYS(50, 30),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(sliding_pattern), .def = 2), /* even layers local */
    {0}};

/* Gemma 3: no soft-caps unless configured, q/k norms, every
 * sliding_window_pattern-th layer global (layer_types, when given, is read
 * by the hook), the local layers' RoPE base. use_bidirectional_attention
 * (EmbeddingGemma) is refused. */
static const lens_config_key gemma3_keys[] = {
    GEMMA2_KEYS(0, 0),
    LENS_KEY("sliding_window_pattern", LENS_KEY_INT, LENS_C(sliding_pattern), .def = 6, .min = 1, .max = 1 << 20),
    LENS_KEY("rope_local_base_freq", LENS_KEY_DOUBLE, LENS_C(rope_local.theta), .def = 10000, .min = 1,
             .max = INFINITY, .flags = LENS_KEY_OPEN_MIN),
    LENS_KEY("use_bidirectional_attention", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(qk_norm), .def = 1),
    {0}};

/* The embeddings times sqrt(C) (HF's normalizer). */
static int gemma_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    cfg->emb_scale = (float)sqrt((double)cfg->d_model);
    return lens_decoder_config_hook(root, path, cfg, err);
}

/* Gemma's hook, layer_types, and the local layers' RoPE: default type at
 * rope_local_base_freq over the whole head (HF's rotary_emb_local);
 * rope_theta and rope_scaling are the global layers'. transformers 5's
 * rope_parameters is refused rather than read as defaults. */
static int gemma3_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (json_object_get(root, "rope_parameters"))
        return lens_fail(err, LENS_EFORMAT, "%s: \"rope_parameters\" is not supported (rope_theta, "
                         "rope_local_base_freq and rope_scaling are)", path);
    if (lens_decoder_layer_types(root, path, cfg, err) || gemma_config_hook(root, path, cfg, err)) return -1;
    cfg->rope_local.dim = cfg->rope.dim;
    return 0;
}

/* micro: head_dim 16 over hidden 32 and one kv head (gemma-2b is MQA). */
static const lens_decoder_preset gemma_presets[] = {
    {"micro", 2, 32, 4, 1, 16, 64, 1000, 256, 0, 1},
    {"tiny", 2, 128, 4, 1, 32, 256, 1000, 256, 0, 1},
    {"1b", 18, 2048, 8, 1, 256, 16384, 256000, 8192, 0, 1},
    {"8b", 28, 3072, 16, 16, 256, 24576, 256000, 8192, 0, 1},
    {0}};

static const lens_decoder_preset gemma2_presets[] = {
    {"micro", 2, 32, 4, 2, 16, 64, 1000, 256, 4, 1},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 16, 1},
    {"1b", 26, 2304, 8, 4, 256, 9216, 256000, 8192, 4096, 1},
    {"8b", 42, 3584, 16, 8, 256, 14336, 256000, 8192, 4096, 1},
    {0}};

/* micro: 3 layers, the third global; 1b = gemma-3-1b, 4b / 12b = the text
 * towers of gemma-3-4b / 12b (rope_scaling linear 8 on the global layers,
 * as micro has). */
static const lens_decoder_preset gemma3_presets[] = {
    {"micro", 3, 32, 4, 2, 16, 64, 1000, 256, 4, 1},
    {"tiny", 6, 128, 4, 2, 32, 256, 1000, 256, 16, 1},
    {"1b", 26, 1152, 4, 1, 256, 6912, 262144, 32768, 512, 1},
    {"4b", 34, 2560, 8, 4, 256, 10240, 262208, 131072, 1024, 1},
    {"12b", 48, 3840, 16, 8, 256, 15360, 262208, 131072, 1024, 1},
    {0}};

static int gemma_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(gemma_presets, name, c)) return -1;
    c->emb_scale = (float)sqrt((double)c->d_model);
    return 0;
}

static int gemma2_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(gemma2_presets, name, c)) return -1;
    c->emb_scale = (float)sqrt((double)c->d_model);
    c->query_pre_attn_scalar = (float)c->d_head_k; /* gemma-2-2b / 9b: 256 = head_dim */
    if (!strcmp(name, "micro")) c->attn_softcap = 5.0f, c->final_softcap = 3.0f; /* caps the test scores reach */
    return 0;
}

static int gemma3_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(gemma3_presets, name, c)) return -1;
    c->emb_scale = (float)sqrt((double)c->d_model);
    c->query_pre_attn_scalar = (float)c->d_head_k; /* 256 = head_dim */
    c->sliding_pattern = !strcmp(name, "micro") ? 3 : 6;
    c->rope_local.dim = c->rope.dim;
    if (strcmp(name, "1b")) c->rope.type = LENS_ROPE_LINEAR, c->rope.factor = 8.0;
    return 0;
}

static void gemma3_new_config(lens_config *c) { c->rope.theta = 1000000.0; }

#define GEMMA_FAMILY LENS_DECODER_FAMILY_FNS, .config_hook = gemma_config_hook
#define GEMMA_WRITER LENS_DECODER_WRITER, .bpe_last = "<eos>", .preset_names = "micro, tiny, 1b, 8b"

const lens_family lens_family_gemma = {
    .model_type = "gemma",
    .default_arch = "GemmaForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "GemmaModel", [LENS_TASK_CAUSAL_LM] = "GemmaForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, gemma_keys},
    GEMMA_FAMILY,
    .writer = &(const lens_family_writer){.preset = gemma_preset, GEMMA_WRITER},
};

const lens_family lens_family_gemma2 = {
    .model_type = "gemma2",
    .default_arch = "Gemma2ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Gemma2Model", [LENS_TASK_CAUSAL_LM] = "Gemma2ForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, gemma2_keys},
    GEMMA_FAMILY,
    .writer = &(const lens_family_writer){.preset = gemma2_preset, GEMMA_WRITER},
};

/* Gemma3TextConfig's defaults: Gemma3ForConditionalGeneration's config.json
 * (model_type gemma3) lists only the text_config keys that differ. */
static const char gemma3_class_defaults[] =
    "{\"vocab_size\": 262208, \"hidden_size\": 2304, \"intermediate_size\": 9216, \"num_hidden_layers\": 26,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 256,"
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": true, \"rope_theta\": 1000000.0, \"attention_bias\": false,"
    " \"query_pre_attn_scalar\": 256, \"sliding_window\": 4096, \"final_logit_softcapping\": null,"
    " \"attn_logit_softcapping\": null, \"rope_scaling\": null, \"rope_local_base_freq\": 10000.0,"
    " \"sliding_window_pattern\": 6}";

const lens_family lens_family_gemma3_text = {
    .model_type = "gemma3_text",
    .default_arch = "Gemma3ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Gemma3TextModel", [LENS_TASK_CAUSAL_LM] = "Gemma3ForCausalLM"},
    .class_defaults = gemma3_class_defaults,
    .keys = {lens_hf_size_keys, lens_decoder_keys, gemma3_keys},
    LENS_DECODER_FAMILY_FNS,
    .config_hook = gemma3_config_hook,
    .writer = &(const lens_family_writer){.new_config = gemma3_new_config, .preset = gemma3_preset,
                                          .default_task = LENS_TASK_CAUSAL_LM,
                                          .config_constants = LENS_DECODER_CONSTANTS,
                                          .config_extra = lens_decoder_config_extra_layer_types, .bpe_last = "<eos>",
                                          .preset_names = "micro, tiny, 1b, 4b, 12b"},
};
