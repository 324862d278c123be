/* llama.c - the Llama and Mistral families (HF LlamaForCausalLM,
 * MistralForCausalLM) on the shared decoder block (decoder.c has the block
 * and the tensor names).
 *
 * Config keys: the common decoder keys (decoder.h) plus
 *   llama    hidden_act (silu), attention_bias (q/k/v/o biases, default false),
 *            rope_scaling {"rope_type": "llama3", factor, low_freq_factor,
 *            high_freq_factor, original_max_position_embeddings}
 *   mistral  hidden_act, sliding_window (null or absent = full attention)
 * Presets: 1b = Llama-3.2-1B, 8b = Llama-3.1-8B (llama3 rope scaling
 * factor 32 / 8, low 1, high 4, original 8192, rope_theta 500000);
 * mistral 8b = Mistral-7B-v0.1 (sliding_window 4096; no 1b exists). */
#include <string.h>

#include "core/model/decoder.h"

static const lens_config_key llama_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU, LENS_DECODER_TIE(0),
    LENS_DECODER_ATTENTION_BIAS, {0}};

static const lens_config_key mistral_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU, LENS_DECODER_TIE(0),
    LENS_DECODER_WINDOW, {0}};

/* Llama 3's rope scaling (factor 32: 3.2-1B; the 8b preset sets 8) */
static void llama_new_config(lens_config *c)
{
    c->ln_eps = 1e-5f;
    c->rope = (lens_rope_params){.theta = 500000.0, .type = LENS_ROPE_LLAMA3, .factor = 32.0, .low_freq_factor = 1.0,
                                 .high_freq_factor = 4.0, .original_max_positions = 8192};
}

static void mistral_new_config(lens_config *c) { c->ln_eps = 1e-5f; }

/* micro / tiny: tests (4 heads over 2 kv heads, head_dim 8 / 32, mistral's
 * window 4 below the test lengths). */
static const lens_decoder_preset llama_presets[] = {
    {"micro", 2, 32, 4, 2, 8, 64, 1000, 256, 0, 0},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 0, 0},
    {"1b", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 0, 1},
    {"8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 0, 0},
    {0}};

static const lens_decoder_preset mistral_presets[] = {
    {"micro", 2, 32, 4, 2, 8, 64, 1000, 256, 4, 0},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 16, 0},
    {"8b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 4096, 0},
    {0}};

static int llama_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(llama_presets, name, c)) return -1;
    if (!strcmp(name, "8b")) c->rope.factor = 8.0; /* Llama-3.1; 3.2-1B has 32 */
    return 0;
}

static int mistral_preset(lens_config *c, const char *name)
{
    return lens_decoder_apply_preset(mistral_presets, name, c);
}

#define DECODER_FAMILY LENS_DECODER_FAMILY_FNS, .config_hook = lens_decoder_config_hook
#define DECODER_WRITER LENS_DECODER_WRITER, .bpe_last = "<|end_of_text|>"

const lens_family lens_family_llama = {
    .model_type = "llama",
    .default_arch = "LlamaForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "LlamaModel", [LENS_TASK_CAUSAL_LM] = "LlamaForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, llama_keys},
    DECODER_FAMILY,
    .writer = &(const lens_family_writer){.new_config = llama_new_config, .preset = llama_preset,
                                          .preset_names = "micro, tiny, 1b, 8b", DECODER_WRITER},
};

const lens_family lens_family_mistral = {
    .model_type = "mistral",
    .default_arch = "MistralForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "MistralModel", [LENS_TASK_CAUSAL_LM] = "MistralForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, mistral_keys},
    DECODER_FAMILY,
    .writer = &(const lens_family_writer){.new_config = mistral_new_config, .preset = mistral_preset,
                                          .preset_names = "micro, tiny, 8b", DECODER_WRITER},
};
