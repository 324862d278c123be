/* gpt_neox.c - the GPT-NeoX family (HF GPTNeoXForCausalLM: Pythia).
 *
 * Config keys and tensor names: the tables neox_keys (after the decoder
 * shape keys) and neox_tensors. attention.query_key_value [3C][C] is in
 * HF's per-head layout (output rows h*3D .. h*3D+D-1 are q_h, the next D
 * k_h, then v_h): blk->q holds the fused map (out = 3C); blk->k, blk->v are
 * unused. Partial rotary: the first int(D * rotary_pct) channels of each
 * head rotate.
 *
 * Block: h = LN1(x); q, k, v = split(h W_qkv + b); q, k = RoPE on R channels
 *   parallel:  x' = x + Attn(h) W_o + W2 act(W1 LN2(x))
 *   else:      a = x + Attn(h) W_o;  x' = a + W2 act(W1 LN2(a))
 * LayerNorm statistics: slot 2l LN1, 2l + 1 LN2, 2L final_layer_norm (the
 * final norm is GPT-2's). The fused q/k/v output [N][3C] lives in the MLP
 * buffer (lens_ff_cols counts it).
 * Presets: 1b = pythia-1b, 8b = pythia-6.9b. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/model/decoder.h"

/* After the sizes and positions (decoder.h); attention_bias true only. */
static const lens_config_key neox_keys[] = {
    LENS_KEY("layer_norm_eps", LENS_KEY_FLOAT, LENS_C(ln_eps), .def = 1e-5, .min = 0, .max = 1,
             .flags = LENS_KEY_OPEN_MIN | LENS_KEY_OPEN_MAX),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_k), .def = 1, .def_dim = LENS_D_DH),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_head_v), .def = 1, .def_dim = LENS_D_DH),
    LENS_KEY("attention_bias", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .def = 1, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY("hidden_act", LENS_KEY_CHOICE, LENS_C(gelu_tanh), .choices = lens_gelu_choices),
    LENS_KEY("rotary_emb_base", LENS_KEY_DOUBLE, LENS_C(rope.theta), .alias = "rope_theta", .def = 10000, .min = 1,
             .max = INFINITY, .flags = LENS_KEY_OPEN_MIN),
    LENS_KEY("use_parallel_residual", LENS_KEY_BOOL, LENS_C(parallel_residual), .def = 1),
    LENS_KEY("tie_word_embeddings", LENS_KEY_BOOL, LENS_C(tie_word_embeddings)),
    {0}};

/* Partial rotary: the first int(D * rotary_pct) channels of each head (even). */
static const lens_config_key rotary_pct = LENS_KEY("rotary_pct", LENS_KEY_DOUBLE, LENS_KEY_CHECK_ONLY, .def = 0.25,
                                                   .min = 0, .max = 1);

static int neox_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    double pct;
    if (lens_config_key_read(root, path, cfg, &rotary_pct, &pct, err)) return -1;
    cfg->rope.dim = (int)(cfg->d_head_k * pct) & ~1;
    return 0;
}

static int neox_config_extra(json_t *root, const lens_config *c)
{
    const double pct = c->d_head_k ? (double)c->rope.dim / c->d_head_k : 0;
    return json_object_set_new(root, "rotary_pct", json_real(pct)) || lens_decoder_config_ids(root, c);
}

static const lens_tensor_row neox_layer_rows[] = {
    LENS_ROW("input_layernorm", LENS_B(ln_attn), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    LENS_ROW("post_attention_layernorm", LENS_B(ln_ff), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    LENS_ROW("attention.query_key_value", LENS_B(q), LENS_T_LINEAR, LENS_D_QKV, LENS_D_C),
             /* per-head layout: one map */
    LENS_ROW("attention.dense", LENS_B(attn_out), LENS_T_LINEAR, LENS_D_C, LENS_D_VO),
    LENS_ROW("mlp.dense_h_to_4h", LENS_B(ff_in), LENS_T_LINEAR, LENS_D_F, LENS_D_C),
    LENS_ROW("mlp.dense_4h_to_h", LENS_B(ff_out), LENS_T_LINEAR, LENS_D_C, LENS_D_F),
    {0}};

static const lens_tensor_row neox_rows[] = {
    LENS_ROW("gpt_neox.embed_in.weight", LENS_P(tok_emb), LENS_T_EMBEDDING, LENS_D_V, LENS_D_C),
    {0}};

static const lens_tensor_row neox_final_rows[] = {
    LENS_ROW("gpt_neox.final_layer_norm", LENS_P(ln_final), LENS_T_LAYERNORM, LENS_D_C, LENS_D_NONE),
    LENS_ROW("embed_out", LENS_P(lm_head), LENS_T_LINEAR_NB, LENS_D_V, LENS_D_C, .when = LENS_IF_UNTIED_LM),
    {0}};

static const lens_tensor_section neox_tensors[] = {
    {"", 0, neox_rows},
    {"gpt_neox.layers.%d.", 1, neox_layer_rows},
    {"", 0, neox_final_rows},
    {0}};

/* h = LN1(x); q, k, v = split(h W_qkv + b), q, k rotated; then
 *   parallel:  x' = x + MLP(LN2(x)) + Attn W_o (the MLP term added first, as HF)
 *   else:      a = x + Attn W_o;  x' = a + MLP(LN2(a)) */
static void neox_block(const lens_model *m, int l, lens_block_prog *p)
{
    const lens_config *c = &m->cfg;
    if (l == c->n_layers) {
        lens_op_final_norm(p, m);
        return;
    }
    const lens_block *b = &m->p.blocks[l];
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_attn, 2 * l);
    lens_op_linear(p, LENS_R_FF, LENS_R_H, &b->q); /* the fused map */
    lens_op_split_qkv(p);
    lens_op_rope(p, LENS_R_Q, c->n_heads, NULL);
    lens_op_rope(p, LENS_R_K, c->n_heads, NULL);
    lens_op_attend(p);
    lens_op_linear(p, LENS_R_N, LENS_R_CTX, &b->attn_out);
    if (!c->parallel_residual) {
        lens_op_add(p, LENS_R_X, LENS_R_N);
        lens_op_tail(p);
    }
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_ff, 2 * l + 1);
    lens_op_linear(p, LENS_R_FF, LENS_R_H, &b->ff_in);
    lens_op_gelu(p);
    lens_op_linear(p, LENS_R_H, LENS_R_FF, &b->ff_out);
    lens_op_add(p, LENS_R_X, LENS_R_H);
    if (c->parallel_residual) lens_op_add(p, LENS_R_X, LENS_R_N);
}

/* micro / tiny: head size 8 / 32 with rotary_pct 0.25 and 0.5 (2 / 16 channels rotate) */
static const lens_decoder_preset neox_presets[] = {
    {"micro", 2, 32, 4, 4, 8, 128, 1000, 256, 0, 0},
    {"tiny", 2, 128, 4, 4, 32, 512, 1000, 256, 0, 0},
    {"1b", 16, 2048, 8, 8, 256, 8192, 50304, 2048, 0, 0},
    {"8b", 32, 4096, 32, 32, 128, 16384, 50432, 2048, 0, 0},
    {0}};

static int neox_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(neox_presets, name, c)) return -1;
    c->n_kv_heads = 0;
    c->rope.dim = (int)(c->d_head_k * (strcmp(name, "tiny") ? 0.25 : 0.5)) & ~1;
    return 0;
}

const lens_family lens_family_gpt_neox = {
    .model_type = "gpt_neox",
    .base_prefix = "gpt_neox.",
    .default_arch = "GPTNeoXForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "GPTNeoXModel", [LENS_TASK_CAUSAL_LM] = "GPTNeoXForCausalLM"},
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,
    .keys = {lens_hf_size_keys, lens_decoder_positions_keys, neox_keys},
    .config_hook = neox_config_hook,
    .tensors = neox_tensors,
    .block = neox_block,
    .writer = &(const lens_family_writer){.bpe_last = "<|endoftext|>", .default_task = LENS_TASK_CAUSAL_LM,
                                          .preset = neox_preset, .preset_names = "micro, tiny, 1b, 8b",
                                          .config_extra = neox_config_extra},
};
