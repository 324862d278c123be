/* qwen.c - the Qwen2 and Qwen3 families (HF Qwen2ForCausalLM,
 * Qwen3ForCausalLM) on the shared decoder block (decoder.c).
 *
 * Config keys: the common decoder keys (decoder.h) plus the tables here:
 *   qwen2  q/k/v always have biases, o_proj none
 *   qwen3  attention_bias (q/k/v/o), per-head RMSNorm self_attn.q_norm /
 *          k_norm on q and k before RoPE
 * Presets: qwen2 1b = Qwen2.5-1.5B, 8b = Qwen2.5-7B; qwen3 1b = Qwen3-1.7B,
 * 8b = Qwen3-8B. */
#include <string.h>

#include "core/model/decoder.h"

/* use_sliding_window: only false (Qwen2.5 ships it off) */
#define NO_SLIDING LENS_KEY("use_sliding_window", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT)

static const lens_config_key qwen2_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU, LENS_DECODER_TIE(0), NO_SLIDING,
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(qkv_bias), .def = 1), {0}};

/* head_dim: Qwen3Config's default 128 when absent */
static const lens_config_key qwen3_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 128), LENS_DECODER_SILU, LENS_DECODER_TIE(0), LENS_DECODER_ATTENTION_BIAS,
    NO_SLIDING, LENS_KEY(NULL, LENS_KEY_INT, LENS_C(qk_norm), .def = 1), {0}};

static void qwen_new_config(lens_config *c) { c->rope.theta = 1000000.0; }

static const lens_decoder_preset qwen2_presets[] = {
    {"micro", 2, 32, 4, 2, 8, 64, 1000, 256, 0, 1},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 0, 1},
    {"1b", 28, 1536, 12, 2, 128, 8960, 151936, 32768, 0, 1},
    {"8b", 28, 3584, 28, 4, 128, 18944, 152064, 32768, 0, 0},
    {0}};

/* head_dim 16 with hidden 32 / 4 heads: NH * DK = 64 != C, as Qwen3's 128 x 32 != 4096 */
static const lens_decoder_preset qwen3_presets[] = {
    {"micro", 2, 32, 4, 2, 16, 64, 1000, 256, 0, 1},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 0, 1},
    {"1b", 28, 2048, 16, 8, 128, 6144, 151936, 40960, 0, 1},
    {"8b", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 0, 0},
    {0}};

static int qwen2_preset(lens_config *c, const char *name) { return lens_decoder_apply_preset(qwen2_presets, name, c); }
static int qwen3_preset(lens_config *c, const char *name) { return lens_decoder_apply_preset(qwen3_presets, name, c); }

#define QWEN_FAMILY LENS_DECODER_FAMILY_FNS, .config_hook = lens_decoder_config_hook
#define QWEN_WRITER LENS_DECODER_WRITER, .bpe_last = "<|endoftext|>", .preset_names = "micro, tiny, 1b, 8b", \
                    .new_config = qwen_new_config

const lens_family lens_family_qwen2 = {
    .model_type = "qwen2",
    .default_arch = "Qwen2ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Qwen2Model", [LENS_TASK_CAUSAL_LM] = "Qwen2ForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, qwen2_keys},
    QWEN_FAMILY,
    .writer = &(const lens_family_writer){.preset = qwen2_preset, QWEN_WRITER},
};

const lens_family lens_family_qwen3 = {
    .model_type = "qwen3",
    .default_arch = "Qwen3ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Qwen3Model", [LENS_TASK_CAUSAL_LM] = "Qwen3ForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, qwen3_keys},
    QWEN_FAMILY,
    .writer = &(const lens_family_writer){.preset = qwen3_preset, QWEN_WRITER},
};
