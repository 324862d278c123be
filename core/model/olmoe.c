/* olmoe.c - the OLMoE family (HF OlmoeForCausalLM) on the shared decoder
 * block (decoder.c): pre-norm like Llama (input_layernorm,
 * post_attention_layernorm), q_norm / k_norm RMSNorms over the whole q and
 * k projections (NH DK and NKV DK channels, before RoPE, as OLMo-2), and a
 * mixture of experts on every layer (core/nn/moe.h: router mlp.gate,
 * experts mlp.experts.N.{gate,up,down}_proj, intermediate_size wide; the
 * chosen weights renormalised when norm_topk_prob). OlmoeConfig has no
 * head_dim: DK = C / NH; clip_qkv only null.
 * Presets: 1b-7b = OLMoE-1B-7B-0924; 1b-7b-4l its first 4 of 16 layers
 * (make bench: a PyTorch peer widened to float32 fits beside it). */
#include "core/model/decoder.h"

static const lens_config_key olmoe_keys[] = {
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_k), .def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU,
    LENS_DECODER_TIE(0), LENS_DECODER_ATTENTION_BIAS,
    LENS_KEY("clip_qkv", LENS_KEY_FLOAT, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT | LENS_KEY_NULL_OFF),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(qk_norm), .def = LENS_QK_NORM_WHOLE), LENS_DECODER_EXPERTS("num_experts", 64),
    LENS_DECODER_NORM_TOPK, LENS_DECODER_MOE_EVERY_LAYER, {0}};

static const lens_tensor_row olmoe_layer_rows[] = {
    LENS_ROW("self_attn.q_proj", LENS_B(q), LENS_T_LINEAR_NB, LENS_D_QK, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.k_proj", LENS_B(k), LENS_T_LINEAR_NB, LENS_D_KV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.v_proj", LENS_B(v), LENS_T_LINEAR_NB, LENS_D_KVV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.o_proj", LENS_B(attn_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_VO, .bias_if = LENS_IF_O_BIAS),
    LENS_ROW("self_attn.q_norm", LENS_B(q_norm), LENS_T_RMSNORM, LENS_D_QK, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("self_attn.k_norm", LENS_B(k_norm), LENS_T_RMSNORM, LENS_D_KV, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("mlp.gate", LENS_B(router), LENS_T_LINEAR_NB, LENS_D_E, LENS_D_C),
    LENS_ROW("input_layernorm", LENS_B(ln_attn), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("post_attention_layernorm", LENS_B(ln_ff), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .init = LENS_INIT_NOISE),
    {0}};

static const lens_tensor_row olmoe_expert_rows[] = {
    LENS_ROW("gate_proj", offsetof(lens_moe_expert, gate), LENS_T_LINEAR_NB, LENS_D_FE, LENS_D_C),
    LENS_ROW("up_proj", offsetof(lens_moe_expert, up), LENS_T_LINEAR_NB, LENS_D_FE, LENS_D_C),
    LENS_ROW("down_proj", offsetof(lens_moe_expert, down), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_FE),
    {0}};

static const lens_tensor_section olmoe_tensors[] = {
    {"", 0, lens_decoder_embedding_rows},
    {"model.layers.%d.", 1, olmoe_layer_rows},
    {"model.layers.%d.mlp.experts.%d.", LENS_PER_EXPERT, olmoe_expert_rows},
    {"", 0, lens_decoder_final_rows},
    {0}};

static void olmoe_new_config(lens_config *c) { c->ln_eps = 1e-5f; }

static const lens_decoder_preset olmoe_presets[] = {
    {"micro", 2, 32, 4, 4, 8, 16, 1000, 256, 0, 0},
    {"tiny", 2, 128, 4, 4, 32, 64, 1000, 256, 0, 0},
    {"1b-7b", 16, 2048, 16, 16, 128, 1024, 50304, 4096, 0, 0},
    {"1b-7b-4l", 4, 2048, 16, 16, 128, 1024, 50304, 4096, 0, 0},
    {0}};

static const lens_moe_preset olmoe_moe[] = {{"micro", 8, 3, 0}, {"tiny", 16, 4, 0}, {"1b-7b", 64, 8, 0}, {"1b-7b-4l", 64, 8, 0}, {0}};

static int olmoe_preset(lens_config *c, const char *name)
{
    return lens_moe_apply_preset(olmoe_presets, olmoe_moe, name, c);
}

const lens_family lens_family_olmoe = {
    .model_type = "olmoe",
    .default_arch = "OlmoeForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "OlmoeModel", [LENS_TASK_CAUSAL_LM] = "OlmoeForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, olmoe_keys},
    .base_prefix = "model.",
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,
    .config_hook = lens_decoder_config_hook,
    .tensors = olmoe_tensors,
    .block = lens_decoder_block,
    .writer = &(const lens_family_writer){.new_config = olmoe_new_config, .preset = olmoe_preset,
                                          .preset_names = "micro, tiny, 1b-7b, 1b-7b-4l", LENS_DECODER_WRITER,
                                          .bpe_last = "<|endoftext|>"},
};
