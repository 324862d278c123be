/* mixtral.c - the Mixtral family (HF MixtralForCausalLM) on the shared
 * decoder block (decoder.c) with a mixture-of-experts MLP on every layer
 * (core/nn/moe.h): router block_sparse_moe.gate, experts
 * block_sparse_moe.experts.N.w1 (gate), w3 (up), w2 (down), each
 * intermediate_size wide; softmax, top num_experts_per_tok, and the chosen
 * weights always renormalised (MixtralSparseMoeBlock).
 *
 * Config keys: the common decoder keys plus head_dim, hidden_act,
 * sliding_window (null = full attention), num_local_experts,
 * num_experts_per_tok; router_jitter_noise and the aux-loss keys only train.
 * Presets: 8x7b = Mixtral-8x7B-v0.1. */
#include "core/model/decoder.h"

static const lens_config_key mixtral_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU, LENS_DECODER_TIE(0),
    LENS_DECODER_WINDOW, LENS_DECODER_EXPERTS("num_local_experts", 8), LENS_DECODER_MOE_EVERY_LAYER,
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(norm_topk), .def = 1), {0}};

static const lens_tensor_row mixtral_router_rows[] = {
    LENS_ROW("gate", LENS_B(router), LENS_T_LINEAR_NB, LENS_D_E, LENS_D_C, .when = LENS_IF_MOE), {0}};

static const lens_tensor_row mixtral_expert_rows[] = {
    LENS_ROW("w1", offsetof(lens_moe_expert, gate), LENS_T_LINEAR_NB, LENS_D_FE, LENS_D_C, .when = LENS_IF_MOE),
    LENS_ROW("w2", offsetof(lens_moe_expert, down), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_FE, .when = LENS_IF_MOE),
    LENS_ROW("w3", offsetof(lens_moe_expert, up), LENS_T_LINEAR_NB, LENS_D_FE, LENS_D_C, .when = LENS_IF_MOE),
    {0}};

static const lens_tensor_section mixtral_tensors[] = {
    {"", 0, lens_decoder_embedding_rows},
    {"model.layers.%d.", 1, lens_decoder_layer_rows},
    {"model.layers.%d.block_sparse_moe.", 1, mixtral_router_rows},
    {"model.layers.%d.block_sparse_moe.experts.%d.", LENS_PER_EXPERT, mixtral_expert_rows},
    {"", 0, lens_decoder_final_rows},
    {0}};

static void mixtral_new_config(lens_config *c)
{
    c->ln_eps = 1e-5f;
    c->rope.theta = 1000000.0;
}

/* micro / tiny: tests (4 experts, 2 routed; mixtral's window 4 below the test lengths) */
static const lens_decoder_preset mixtral_presets[] = {
    {"micro", 2, 32, 4, 2, 8, 24, 1000, 256, 4, 0},
    {"tiny", 2, 128, 4, 2, 32, 128, 1000, 256, 16, 0},
    {"8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 0, 0},
    {0}};

static const lens_moe_preset mixtral_moe[] = {{"micro", 4, 2, 0}, {"tiny", 8, 2, 0}, {"8x7b", 8, 2, 0}, {0}};

static int mixtral_preset(lens_config *c, const char *name)
{
    return lens_moe_apply_preset(mixtral_presets, mixtral_moe, name, c);
}

const lens_family lens_family_mixtral = {
    .model_type = "mixtral",
    .default_arch = "MixtralForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "MixtralModel", [LENS_TASK_CAUSAL_LM] = "MixtralForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, mixtral_keys},
    .base_prefix = "model.",
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,
    .config_hook = lens_decoder_config_hook,
    .tensors = mixtral_tensors,
    .block = lens_decoder_block,
    .writer = &(const lens_family_writer){.new_config = mixtral_new_config, .preset = mixtral_preset,
                                          .preset_names = "micro, tiny, 8x7b", LENS_DECODER_WRITER,
                                          .bpe_last = "<|end_of_text|>"},
};
