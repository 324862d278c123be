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
#include <jansson.h>
#include <string.h>

#include "core/model/decoder.h"

static int llama_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_decoder_parse_keys(root, path, cfg, 0, err) ||
        lens_decoder_parse_act(root, path, "hidden_act", "silu", cfg, err))
        return -1;
    json_t *bias = json_object_get(root, "attention_bias");
    cfg->qkv_bias = cfg->o_bias = json_is_true(bias);
    return lens_config_task(root, path, cfg, err);
}

static int mistral_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_decoder_parse_keys(root, path, cfg, 0, err) ||
        lens_decoder_parse_act(root, path, "hidden_act", "silu", cfg, err) ||
        lens_decoder_parse_window(root, path, cfg, err))
        return -1;
    return lens_config_task(root, path, cfg, err);
}

static int llama_new_config(lens_config *c, const char *task, lens_err *err)
{
    if (lens_decoder_new_config(c, task, "LlamaForCausalLM", err)) return -1;
    c->ln_eps = 1e-5f;
    c->rope = (lens_rope_params){.theta = 500000.0, .type = LENS_ROPE_LLAMA3, .factor = 32.0, .low_freq_factor = 1.0,
                                 .high_freq_factor = 4.0, .original_max_positions = 8192};
    return 0;
}

static int mistral_new_config(lens_config *c, const char *task, lens_err *err)
{
    if (lens_decoder_new_config(c, task, "MistralForCausalLM", err)) return -1;
    c->ln_eps = 1e-5f;
    return 0;
}

static void llama_write_config(FILE *f, const lens_config *c, int random_weights)
{
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"llama\",\n  \"hidden_act\": \"silu\",\n"
               "  \"attention_bias\": %s,\n  \"mlp_bias\": false,\n",
            c->architecture, c->qkv_bias ? "true" : "false");
    lens_decoder_write_common(f, c);
    lens_write_task_tail(f, c, random_weights);
}

static void mistral_write_config(FILE *f, const lens_config *c, int random_weights)
{
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"mistral\",\n  \"hidden_act\": \"silu\",\n",
            c->architecture);
    if (c->sliding_window) fprintf(f, "  \"sliding_window\": %d,\n", c->sliding_window);
    else fprintf(f, "  \"sliding_window\": null,\n");
    lens_decoder_write_common(f, c);
    lens_write_task_tail(f, c, random_weights);
}

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

#define DECODER_FAMILY LENS_DECODER_FAMILY_FNS, .bpe_last = "<|end_of_text|>"

const lens_family lens_family_llama = {
    .model_type = "llama",
    .default_arch = "LlamaForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "LlamaModel", [LENS_TASK_CAUSAL_LM] = "LlamaForCausalLM"},
    .parse_config = llama_parse_config,
    .new_config = llama_new_config,
    .write_config = llama_write_config,
    .preset = llama_preset,
    .preset_names = "micro, tiny, 1b, 8b",
    DECODER_FAMILY,
};

const lens_family lens_family_mistral = {
    .model_type = "mistral",
    .default_arch = "MistralForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "MistralModel", [LENS_TASK_CAUSAL_LM] = "MistralForCausalLM"},
    .parse_config = mistral_parse_config,
    .new_config = mistral_new_config,
    .write_config = mistral_write_config,
    .preset = mistral_preset,
    .preset_names = "micro, tiny, 8b",
    DECODER_FAMILY,
};
