/* gpt_neox.c - the GPT-NeoX family (HF GPTNeoXForCausalLM: Pythia).
 *
 * Config keys: hidden_size, num_hidden_layers, num_attention_heads,
 * intermediate_size, vocab_size, max_position_embeddings, layer_norm_eps,
 * rotary_pct (partial rotary: the first int(D * rotary_pct) channels of each
 * head rotate), rotary_emb_base (or rope_theta), use_parallel_residual,
 * hidden_act (gelu = exact erf, gelu_new), tie_word_embeddings (false),
 * attention_bias (true only).
 *
 * Tensors: gpt_neox.embed_in.weight [V][C];
 *   gpt_neox.layers.{l}.input_layernorm, post_attention_layernorm (LayerNorm w, b)
 *   gpt_neox.layers.{l}.attention.query_key_value [3C][C] + [3C], HF's per-head
 *     layout: output rows h*3D .. h*3D+D-1 are q_h, the next D k_h, then v_h
 *   gpt_neox.layers.{l}.attention.dense [C][C]
 *   gpt_neox.layers.{l}.mlp.dense_h_to_4h [F][C], dense_4h_to_h [C][F]
 *   gpt_neox.final_layer_norm; embed_out.weight [V][C]
 * blk->q holds the fused map (out = 3C); blk->k, blk->v are unused.
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

#include "core/base/gemm.h"
#include "core/model/decoder.h"
#include "core/nn/ops.h"
#include "core/nn/rope.h"

static int neox_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_decoder_parse_shape(root, path, cfg, err) ||
        lens_json_eps(root, path, "layer_norm_eps", 1e-5, &cfg->ln_eps, err))
        return -1;
    if (cfg->d_model % cfg->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", path,
                         cfg->d_model, cfg->n_heads);
    /* the fused q/k/v output [N][3C] is computed in the MLP buffer */
    if (cfg->d_ff < 3 * cfg->d_model)
        return lens_fail(err, LENS_EFORMAT, "%s: intermediate_size %d below 3 x hidden_size is not supported", path,
                         cfg->d_ff);
    if (json_is_false(json_object_get(root, "attention_bias")))
        return lens_fail(err, LENS_EFORMAT, "%s: attention_bias false is not supported", path);
    const char *act = lens_json_str(root, "hidden_act");
    if (lens_parse_activation(path, act ? act : "gelu", &cfg->gelu_tanh, err)) return -1;
    const int D = cfg->d_model / cfg->n_heads;
    cfg->d_head_k = cfg->d_head_v = D;
    json_t *pct = json_object_get(root, "rotary_pct");
    const double rotary_pct = json_is_number(pct) ? json_number_value(pct) : 0.25;
    if (!(rotary_pct >= 0 && rotary_pct <= 1))
        return lens_fail(err, LENS_EFORMAT, "%s: rotary_pct must be in [0, 1]", path);
    cfg->rope.dim = (int)(D * rotary_pct) & ~1;
    json_t *base = json_object_get(root, "rotary_emb_base");
    if (!json_is_number(base)) base = json_object_get(root, "rope_theta");
    cfg->rope.theta = json_is_number(base) ? json_number_value(base) : 10000.0;
    if (!(cfg->rope.theta > 1)) return lens_fail(err, LENS_EFORMAT, "%s: rotary_emb_base must be > 1", path);
    json_t *parallel = json_object_get(root, "use_parallel_residual");
    cfg->parallel_residual = parallel ? json_is_true(parallel) : 1;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    cfg->tie_word_embeddings = json_is_true(tie);
    cfg->type_vocab_size = 0;
    return lens_config_task(root, path, cfg, err);
}

static int neox_new_config(lens_config *c, const char *task, lens_err *err)
{
    if (lens_decoder_new_config(c, task, "GPTNeoXForCausalLM", err)) return -1;
    c->norm_rms = 0, c->glu = LENS_GLU_NONE, c->ln_eps = 1e-5f, c->gelu_tanh = 0, c->parallel_residual = 1;
    return 0;
}

static void neox_write_config(FILE *f, const lens_config *c, int random_weights)
{
    const double pct = c->d_head_k ? (double)c->rope.dim / c->d_head_k : 0;
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"gpt_neox\",\n  \"hidden_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"layer_norm_eps\": %g,\n"
            "  \"rotary_pct\": %g,\n  \"rotary_emb_base\": %.17g,\n  \"use_parallel_residual\": %s,\n"
            "  \"hidden_act\": \"%s\",\n  \"tie_word_embeddings\": %s,\n  \"attention_bias\": true,\n"
            "  \"initializer_range\": %g,\n  \"bos_token_id\": 0,\n  \"eos_token_id\": %d,\n",
            c->architecture, c->d_model, c->n_layers, c->n_heads, c->d_ff, c->vocab_size, c->max_positions,
            (double)c->ln_eps, pct, c->rope.theta, c->parallel_residual ? "true" : "false",
            c->gelu_tanh ? "gelu_new" : "gelu", c->tie_word_embeddings ? "true" : "false",
            c->init_range > 0 ? (double)c->init_range : 0.02, c->vocab_size - 1);
    lens_write_task_tail(f, c, random_weights);
}

static void neox_walk(const lens_config *c, lens_params *p, lens_param_visitor *v)
{
    const int C = c->d_model, F = c->d_ff;
    const float sd = c->init_range > 0 ? c->init_range : 0.02f;
    p->tok_emb = lens_walk_tensor(v, "gpt_neox.embed_in.weight", c->vocab_size, C, LENS_PARAM_EMBEDDING, sd);
    p->pos_emb = p->type_emb = NULL;
    for (int l = 0; l < c->n_layers; l++) {
        lens_block *blk = &p->blocks[l];
        char n[128];
#define AT(suffix) (snprintf(n, sizeof n, "gpt_neox.layers.%d.%s", l, suffix), n)
        lens_walk_layernorm(v, &blk->ln_attn, AT("input_layernorm"), C);
        lens_walk_layernorm(v, &blk->ln_ff, AT("post_attention_layernorm"), C);
        lens_walk_linear(v, &blk->q, AT("attention.query_key_value"), C, 3 * C, 0, sd);
        lens_walk_linear(v, &blk->attn_out, AT("attention.dense"), C, C, 0, sd);
        lens_walk_linear(v, &blk->ff_in, AT("mlp.dense_h_to_4h"), C, F, 0, sd);
        lens_walk_linear(v, &blk->ff_out, AT("mlp.dense_4h_to_h"), F, C, 0, sd);
#undef AT
        blk->k = blk->v = (lens_linear){0};
    }
    lens_walk_layernorm(v, &p->ln_final, "gpt_neox.final_layer_norm", C);
    p->lm_head = (lens_linear){0};
    if (!c->tie_word_embeddings && c->task == LENS_TASK_CAUSAL_LM)
        lens_walk_linear_bias(v, &p->lm_head, "embed_out", C, c->vocab_size, 0, sd);
}

static void neox_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *mean,
                       float *rstd)
{
    (void)type_ids, (void)mean, (void)rstd;
    lens_decoder_embed(m, ids, NULL, T, x, NULL, NULL);
}

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
    lens_op_rope(p, LENS_R_Q, c->n_heads);
    lens_op_rope(p, LENS_R_K, c->n_heads);
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
    .bpe_last = "<|endoftext|>",
    .parse_config = neox_parse_config,
    .new_config = neox_new_config,
    .write_config = neox_write_config,
    .walk = neox_walk,
    .embed = neox_embed,
    .block = neox_block,
    .preset = neox_preset,
    .preset_names = "micro, tiny, 1b, 8b",
};
