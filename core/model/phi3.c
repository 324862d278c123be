/* phi3.c - the Phi-3 family (HF Phi3ForCausalLM: Phi-3 / 3.5 mini and
 * medium, Phi-4-mini) on the shared decoder block (decoder.c).
 *
 * What differs from Llama is storage and RoPE, not the block:
 *   self_attn.qkv_proj [(NH + 2 NKV) DK][C]   q | k | v, bound as views (no bias)
 *   mlp.gate_up_proj [2F][C]                 gate | up (HF's chunk(2) order), views
 *   partial_rotary_factor f                  RoPE on the first int(DK f) channels
 *                                            of each head (rotate_half within them)
 *   sliding_window                           every layer (null: full attention)
 * rope_scaling "longrope" (the 128k models) is refused by name: its factors
 * depend on the sequence length.
 * Presets: 4b = Phi-3-mini-4k (3.8 B; head_dim 96, window 2047). */
#include <jansson.h>
#include <string.h>

#include "core/model/decoder.h"

static const lens_config_key phi3_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU, LENS_DECODER_TIE(0),
    LENS_DECODER_WINDOW, {0}};

static const lens_config_key partial_rotary = LENS_KEY("partial_rotary_factor", LENS_KEY_DOUBLE, LENS_KEY_CHECK_ONLY,
                                                       .def = 1, .min = 0, .max = 1,
                                                       .flags = LENS_KEY_OPEN_MIN);

static int phi3_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    double f;
    if (lens_decoder_config_hook(root, path, cfg, err) || lens_config_key_read(root, path, cfg, &partial_rotary, &f, err))
        return -1;
    cfg->rope.dim = (int)(cfg->d_head_k * f);
    if (cfg->rope.dim < 2 || cfg->rope.dim % 2)
        return lens_fail(err, LENS_EFORMAT, "%s: partial_rotary_factor %g gives %d rotary channels (even, >= 2 needed)",
                         path, f, cfg->rope.dim);
    return 0;
}

static int phi3_config_extra(json_t *root, const lens_config *c)
{
    return json_object_set_new(root, "partial_rotary_factor", json_real((double)c->rope.dim / c->d_head_k)) ||
           lens_decoder_config_extra(root, c);
}

static const lens_tensor_row phi3_layer_rows[] = {
    LENS_ROW("self_attn.qkv_proj", 0, LENS_T_LINEAR_NB, LENS_D_QKV, LENS_D_C, .split = LENS_SPLIT_QKV),
    LENS_ROW("self_attn.o_proj", LENS_B(attn_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_VO),
    LENS_ROW("mlp.gate_up_proj", 0, LENS_T_LINEAR_NB, LENS_D_2F, LENS_D_C, .split = LENS_SPLIT_GATE_UP),
    LENS_ROW("mlp.down_proj", LENS_B(ff_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_F),
    LENS_ROW("input_layernorm", LENS_B(ln_attn), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("post_attention_layernorm", LENS_B(ln_ff), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .init = LENS_INIT_NOISE),
    {0}};

static const lens_tensor_section phi3_tensors[] = {
    {"", 0, lens_decoder_embedding_rows},
    {"model.layers.%d.", 1, phi3_layer_rows},
    {"", 0, lens_decoder_final_rows},
    {0}};

static void phi3_new_config(lens_config *c) { c->ln_eps = 1e-5f; }

/* micro: half the head rotates and a window of 4 below the test lengths;
 * tiny: three quarters rotate (Phi-4-mini's factor) */
static const lens_decoder_preset phi3_presets[] = {
    {"micro", 2, 32, 4, 2, 8, 64, 1000, 256, 4, 0},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 0, 0},
    {"4b", 32, 3072, 32, 32, 96, 8192, 32064, 4096, 2047, 0},
    {0}};

static int phi3_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(phi3_presets, name, c)) return -1;
    if (!strcmp(name, "micro")) c->rope.dim = c->d_head_k / 2;
    if (!strcmp(name, "tiny")) c->rope.dim = c->d_head_k * 3 / 4;
    return 0;
}

const lens_family lens_family_phi3 = {
    .model_type = "phi3",
    .default_arch = "Phi3ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Phi3Model", [LENS_TASK_CAUSAL_LM] = "Phi3ForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, phi3_keys},
    .base_prefix = "model.",
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,
    .config_hook = phi3_config_hook,
    .tensors = phi3_tensors,
    .block = lens_decoder_block,
    .writer = &(const lens_family_writer){.default_task = LENS_TASK_CAUSAL_LM, .new_config = phi3_new_config,
                                          .preset = phi3_preset, .preset_names = "micro, tiny, 4b",
                                          .config_constants = "{\"attention_dropout\": 0.0}",
                                          .config_extra = phi3_config_extra, .bpe_last = "<|endoftext|>"},
};
