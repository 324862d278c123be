/* gemma.c - the Gemma and Gemma 2 families (HF GemmaForCausalLM,
 * Gemma2ForCausalLM) on the shared decoder block (decoder.c).
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
 * Presets: gemma 1b = gemma-2b, 8b = gemma-7b; gemma2 1b = gemma-2-2b,
 * 8b = gemma-2-9b. */
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

/* Soft-caps: null = off. */
static const lens_config_key gemma2_keys[] = {
    GEMMA_KEYS,
    LENS_DECODER_WINDOW,
    LENS_KEY("attn_logit_softcapping", LENS_KEY_FLOAT, LENS_C(attn_softcap), .def = 50, .min = 0, .max = INFINITY,
             .flags = LENS_KEY_NULL_OFF | LENS_KEY_OPEN_MIN),
    LENS_KEY("final_logit_softcapping", LENS_KEY_FLOAT, LENS_C(final_softcap), .def = 30, .min = 0, .max = INFINITY,
             .flags = LENS_KEY_NULL_OFF | LENS_KEY_OPEN_MIN),
    LENS_KEY("query_pre_attn_scalar", LENS_KEY_FLOAT, LENS_C(query_pre_attn_scalar), .def = 256, .min = 0,
             .max = INFINITY, .flags = LENS_KEY_OPEN_MIN),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(sliding_alternate), .def = 1),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(post_norms), .def = 1),
    {0}};

/* The embeddings times sqrt(C) (HF's normalizer). */
static int gemma_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    cfg->emb_scale = (float)sqrt((double)cfg->d_model);
    return lens_decoder_config_hook(root, path, cfg, err);
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
