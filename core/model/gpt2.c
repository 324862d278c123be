/* gpt2.c - the GPT-2 family (HF GPT2Model, GPT2LMHeadModel).
 *
 * Config keys and tensor names: the tables gpt2_keys, gpt2_tensors.
 *
 * Block (pre-LN):  a = x + Attn(LN1(x));  x' = a + FFN(LN2(a)), then ln_f
 * after the last block (HF hidden_states[L] has it applied).
 * LayerNorm statistics slots: 2l ln_1, 2l + 1 ln_2, 2L ln_f. */
#include "core/model/arch.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/ops.h"

/* GPT2Config keys; the three attention switches only at their defaults. */
static const lens_config_key gpt2_keys[] = {
    LENS_KEY("n_embd", LENS_KEY_INT, LENS_C(d_model), .min = 1, .max = 1 << 16, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("n_layer", LENS_KEY_INT, LENS_C(n_layers), .min = 1, .max = 1024, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("n_head", LENS_KEY_INT, LENS_C(n_heads), .min = 1, .max = 1024, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("vocab_size", LENS_KEY_INT, LENS_C(vocab_size), .min = 1, .max = 1 << 24, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("n_positions", LENS_KEY_INT, LENS_C(max_positions), .def = 1024, .min = 1, .max = 1 << 20),
    LENS_KEY("layer_norm_epsilon", LENS_KEY_FLOAT, LENS_C(ln_eps), .def = 1e-5, .min = 0, .max = 1,
             .flags = LENS_KEY_OPEN_MIN | LENS_KEY_OPEN_MAX),
    LENS_KEY("n_inner", LENS_KEY_INT, LENS_C(d_ff), .def = 4, .def_dim = LENS_D_C, .min = 1, .max = 1 << 20),
    LENS_KEY("activation_function", LENS_KEY_CHOICE, LENS_C(gelu_tanh), .def = 1, .choices = lens_gelu_choices),
    LENS_KEY("scale_attn_weights", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .def = 1, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY("scale_attn_by_inverse_layer_idx", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY("reorder_and_upcast_attn", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_k), .def = 1, .def_dim = LENS_D_DH),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_v), .def = 1, .def_dim = LENS_D_DH),
    {0}};

static void gpt2_new_config(lens_config *c) { c->vocab_size = 50257; }

/* bos/eos = the last id: <|endoftext|> in GPT-2's vocabulary (50256) and in
 * the ones `train vocab --bpe` writes. */
static int gpt2_config_extra(json_t *root, const lens_config *c)
{
    return json_object_set_new(root, "n_ctx", json_integer(c->max_positions)) ||
           json_object_set_new(root, "bos_token_id", json_integer(c->vocab_size - 1)) ||
           json_object_set_new(root, "eos_token_id", json_integer(c->vocab_size - 1));
}

/* HF GPT2LMHeadModel order ("transformer." names; the LM head is wte, so no
 * tensor of its own). c_attn [C][3C] = [W_q | W_k | W_v] is one tensor; q, k,
 * v are views of it with row stride 3C. The two residual projections
 * (attn.c_proj, mlp.c_proj) start at 0.02 / sqrt(2 L), as HF and the GPT-2
 * paper initialise them. */
static const lens_tensor_row gpt2_embedding_rows[] = {
    LENS_ROW("wte.weight", LENS_P(tok_emb), LENS_T_EMBEDDING, LENS_D_V, LENS_D_C),
    LENS_ROW("wpe.weight", LENS_P(pos_emb), LENS_T_EMBEDDING, LENS_D_POS, LENS_D_C),
    {0}};

static const lens_tensor_row gpt2_layer_rows[] = {
    LENS_ROW("ln_1", LENS_B(ln_attn), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    LENS_ROW("attn.c_attn", 0, LENS_T_CONV1D, LENS_D_QKV, LENS_D_C, .split = LENS_SPLIT_QKV),
    LENS_ROW("attn.c_proj", LENS_B(attn_out), LENS_T_CONV1D, LENS_D_C, LENS_D_VO, .init = LENS_INIT_RESID),
    LENS_ROW("ln_2", LENS_B(ln_ff), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    LENS_ROW("mlp.c_fc", LENS_B(ff_in), LENS_T_CONV1D, LENS_D_F, LENS_D_C),
    LENS_ROW("mlp.c_proj", LENS_B(ff_out), LENS_T_CONV1D, LENS_D_C, LENS_D_F, .init = LENS_INIT_RESID),
    {0}};

static const lens_tensor_row gpt2_final_rows[] = {
    LENS_ROW("ln_f", LENS_P(ln_final), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    {0}};

static const lens_tensor_section gpt2_tensors[] = {
    {"transformer.", 0, gpt2_embedding_rows},
    {"transformer.h.%d.", 1, gpt2_layer_rows},
    {"transformer.", 0, gpt2_final_rows},
    {0}};

/* a = x + Attn(LN1(x)); x' = a + FFN(LN2(a)); ln_f after the last block. */
static void gpt2_block(const lens_model *m, int l, lens_block_prog *p)
{
    if (l == m->cfg.n_layers) {
        lens_op_final_norm(p, m);
        return;
    }
    const lens_block *b = &m->p.blocks[l];
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_attn, 2 * l);
    lens_op_linear(p, LENS_R_Q, LENS_R_H, &b->q);
    lens_op_linear(p, LENS_R_K, LENS_R_H, &b->k);
    lens_op_linear(p, LENS_R_V, LENS_R_H, &b->v);
    lens_op_attend(p);
    lens_op_linear(p, LENS_R_H, LENS_R_CTX, &b->attn_out);
    lens_op_add(p, LENS_R_X, LENS_R_H);
    lens_op_tail(p);
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_ff, 2 * l + 1);
    lens_op_linear(p, LENS_R_FF, LENS_R_H, &b->ff_in);
    lens_op_gelu(p);
    lens_op_linear(p, LENS_R_H, LENS_R_FF, &b->ff_out);
    lens_op_add(p, LENS_R_X, LENS_R_H);
}

const lens_family lens_family_gpt2 = {
    .model_type = "gpt2",
    .base_prefix = "transformer.",
    .default_arch = "GPT2LMHeadModel",
    .task_archs = {[LENS_TASK_ENCODER] = "GPT2Model", [LENS_TASK_CAUSAL_LM] = "GPT2LMHeadModel"},
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_TIED_HEAD | LENS_CAP_BYTE_BPE,
    .keys = {gpt2_keys},
    .tensors = gpt2_tensors,
    .block = gpt2_block,
    .writer = &(const lens_family_writer){
        .tokenizer_class = NULL, /* GPT2Tokenizer is what the files mean; mkmodel writes no tokenizer_config */
        .bpe_last = "<|endoftext|>",
        .default_task = LENS_TASK_CAUSAL_LM,
        .new_config = gpt2_new_config,
        /* no dropout: lensd trains none */
        .config_constants = "{\"resid_pdrop\": 0.0, \"embd_pdrop\": 0.0, \"attn_pdrop\": 0.0, "
                            "\"initializer_range\": 0.02, \"tie_word_embeddings\": true}",
        .config_extra = gpt2_config_extra},
};
