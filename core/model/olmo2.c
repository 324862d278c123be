/* olmo2.c - the OLMo-2 family (HF Olmo2ForCausalLM).
 *
 * Llama's keys, names and MLP, a block of its own: no norm before attention
 * or the MLP; RMSNorms after each (post_attention_layernorm,
 * post_feedforward_layernorm) before the residual sum; q_norm / k_norm over
 * the whole q and k projections (NH DK and NKV DK channels, before RoPE):
 *   x = x + post_attn(Attn(x) W_o),  Attn with q = rope(q_norm(x W_q)), k = rope(k_norm(x W_k))
 *   x = x + post_ff(W_down (silu(x W_gate) * x W_up))
 * then model.norm. Olmo2Config has no head_dim: DK = C / NH.
 * Presets: 1b = OLMo-2-0425-1B, 8b = OLMo-2-1124-7B. */
#include "core/model/decoder.h"

static const lens_config_key olmo2_keys[] = {
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_k), .def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU,
    LENS_DECODER_TIE(0), LENS_DECODER_ATTENTION_BIAS, {0}};

static const lens_tensor_row olmo2_layer_rows[] = {
    LENS_ROW("self_attn.q_proj", LENS_B(q), LENS_T_LINEAR_NB, LENS_D_QK, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.k_proj", LENS_B(k), LENS_T_LINEAR_NB, LENS_D_KV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.v_proj", LENS_B(v), LENS_T_LINEAR_NB, LENS_D_KVV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.o_proj", LENS_B(attn_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_VO, .bias_if = LENS_IF_O_BIAS),
    LENS_ROW("self_attn.q_norm", LENS_B(q_norm), LENS_T_RMSNORM, LENS_D_QK, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("self_attn.k_norm", LENS_B(k_norm), LENS_T_RMSNORM, LENS_D_KV, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("mlp.gate_proj", LENS_B(gate), LENS_T_LINEAR_NB, LENS_D_F, LENS_D_C),
    LENS_ROW("mlp.up_proj", LENS_B(ff_in), LENS_T_LINEAR_NB, LENS_D_F, LENS_D_C),
    LENS_ROW("mlp.down_proj", LENS_B(ff_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_F),
    LENS_ROW("post_attention_layernorm", LENS_B(post_attn), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .init = LENS_INIT_NOISE),
    LENS_ROW("post_feedforward_layernorm", LENS_B(post_ff), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .init = LENS_INIT_NOISE),
    {0}};

static const lens_tensor_section olmo2_tensors[] = {
    {"", 0, lens_decoder_embedding_rows},
    {"model.layers.%d.", 1, olmo2_layer_rows},
    {"", 0, lens_decoder_final_rows},
    {0}};

static void olmo2_block(const lens_model *m, int l, lens_block_prog *p)
{
    const lens_config *c = &m->cfg;
    const int NH = c->n_heads, NKV = lens_kv_heads(c), DK = c->d_head_k;
    if (l == c->n_layers) {
        lens_op_final_norm(p, m);
        return;
    }
    const lens_block *b = &m->p.blocks[l];
    lens_op_linear(p, LENS_R_Q, LENS_R_X, &b->q);
    lens_op_linear(p, LENS_R_K, LENS_R_X, &b->k);
    lens_op_linear(p, LENS_R_V, LENS_R_X, &b->v);
    lens_op_qk_norm(p, LENS_R_Q, &b->q_norm, NH, NH * DK);
    lens_op_qk_norm(p, LENS_R_K, &b->k_norm, NKV, NKV * DK);
    lens_op_rope(p, LENS_R_Q, NH, NULL);
    lens_op_rope(p, LENS_R_K, NKV, NULL);
    lens_op_repeat_kv(p, LENS_R_K, NKV);
    lens_op_repeat_kv(p, LENS_R_V, NKV);
    lens_op_attend(p);
    lens_op_linear(p, LENS_R_H, LENS_R_CTX, &b->attn_out);
    lens_op_norm(p, LENS_R_N, LENS_R_H, &b->post_attn, 2 * l);
    lens_op_add(p, LENS_R_X, LENS_R_N);
    lens_op_tail(p);
    lens_op_gated_mlp(p, LENS_R_X, b);
    lens_op_norm(p, LENS_R_N, LENS_R_H, &b->post_ff, 2 * l + 1);
    lens_op_add(p, LENS_R_X, LENS_R_N);
}

static void olmo2_new_config(lens_config *c)
{
    c->ln_eps = 1e-6f;
    c->rope.theta = 500000.0;
}

static const lens_decoder_preset olmo2_presets[] = {
    {"micro", 2, 32, 4, 2, 8, 64, 1000, 256, 0, 0},
    {"tiny", 2, 128, 4, 4, 32, 256, 1000, 256, 0, 0},
    {"1b", 16, 2048, 16, 16, 128, 8192, 100352, 4096, 0, 1},
    {"8b", 32, 4096, 32, 32, 128, 11008, 100352, 4096, 0, 0},
    {0}};

static int olmo2_preset(lens_config *c, const char *name) { return lens_decoder_apply_preset(olmo2_presets, name, c); }

const lens_family lens_family_olmo2 = {
    .model_type = "olmo2",
    .default_arch = "Olmo2ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Olmo2Model", [LENS_TASK_CAUSAL_LM] = "Olmo2ForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, olmo2_keys},
    .config_hook = lens_decoder_config_hook,
    .base_prefix = "model.",
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,
    .tensors = olmo2_tensors,
    .block = olmo2_block,
    .writer = &(const lens_family_writer){.new_config = olmo2_new_config, .preset = olmo2_preset,
                                          .preset_names = "micro, tiny, 1b, 8b", LENS_DECODER_WRITER,
                                          .bpe_last = "<|endoftext|>"},
};
