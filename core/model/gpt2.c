/* gpt2.c - the GPT-2 family (HF GPT2Model, GPT2LMHeadModel).
 *
 * Config keys: n_embd, n_layer, n_head, n_inner, n_positions, vocab_size,
 * layer_norm_epsilon, activation_function (default gelu_new).
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

static int gpt2_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_json_int(root, path, "n_embd", -1, 1, 1 << 16, &cfg->d_model, err) ||
        lens_json_int(root, path, "n_layer", -1, 1, 1024, &cfg->n_layers, err) ||
        lens_json_int(root, path, "n_head", -1, 1, 1024, &cfg->n_heads, err) ||
        lens_json_int(root, path, "vocab_size", -1, 1, 1 << 24, &cfg->vocab_size, err) ||
        lens_json_int(root, path, "n_positions", 1024, 1, 1 << 20, &cfg->max_positions, err) ||
        lens_json_eps(root, path, "layer_norm_epsilon", 1e-5, &cfg->ln_eps, err))
        return -1;
    if (lens_json_int(root, path, "n_inner", 4 * cfg->d_model, 1, 1 << 20, &cfg->d_ff, err)) return -1;
    const char *act = lens_json_str(root, "activation_function");
    if (lens_parse_activation(path, act ? act : "gelu_new", &cfg->gelu_tanh, err)) return -1;
    if (cfg->d_model % cfg->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: n_embd %d is not a multiple of n_head %d", path,
                         cfg->d_model, cfg->n_heads);
    json_t *scale = json_object_get(root, "scale_attn_weights");
    json_t *by_layer = json_object_get(root, "scale_attn_by_inverse_layer_idx");
    json_t *reorder = json_object_get(root, "reorder_and_upcast_attn");
    if (json_is_false(scale) || json_is_true(by_layer) || json_is_true(reorder))
        return lens_fail(err, LENS_EFORMAT, "%s: non-default GPT-2 attention scaling is not supported", path);
    cfg->d_head_k = cfg->d_head_v = cfg->d_model / cfg->n_heads;
    cfg->type_vocab_size = 0;
    return lens_config_task(root, path, cfg, err);
}


static int gpt2_new_config(lens_config *c, const char *task, lens_err *err)
{
    if (task && strcmp(task, lens_task_name(LENS_TASK_CAUSAL_LM)))
        return lens_fail(err, LENS_EINVAL, "task \"%s\" is not available for gpt2 (causal-lm)", task);
    c->task = LENS_TASK_CAUSAL_LM;
    snprintf(c->architecture, sizeof c->architecture, "GPT2LMHeadModel");
    c->vocab_size = 50257, c->max_positions = 1024, c->ln_eps = 1e-5f, c->gelu_tanh = 1;
    return 0;
}

/* HF GPT2Config of a GPT2LMHeadModel (no dropout: lensd trains none).
 * bos/eos = the last id: <|endoftext|> in GPT-2's vocabulary (50256) and in
 * the ones `train vocab --bpe` writes. */
static void gpt2_write_config(FILE *f, const lens_config *c, int random_weights)
{
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_positions\": %d,\n"
            "  \"n_ctx\": %d,\n  \"n_inner\": %d,\n  \"vocab_size\": %d,\n  \"layer_norm_epsilon\": %g,\n"
            "  \"activation_function\": \"%s\",\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n"
            "  \"attn_pdrop\": 0.0,\n  \"initializer_range\": 0.02,\n  \"tie_word_embeddings\": true,\n"
            "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n%s  \"lensd_task\": \"%s\"\n}\n",
            c->architecture, c->d_model, c->n_layers, c->n_heads, c->max_positions, c->max_positions, c->d_ff,
            c->vocab_size, (double)c->ln_eps, c->gelu_tanh ? "gelu_new" : "gelu", c->vocab_size - 1,
            c->vocab_size - 1, random_weights ? "  \"lensd_random_weights\": true,\n" : "", lens_task_name(c->task));
}

/* HF GPT2LMHeadModel order ("transformer." names; the LM head is wte, so no
 * tensor of its own). c_attn [C][3C] = [W_q | W_k | W_v] is one tensor; q, k,
 * v are views of it with row stride 3C. The two residual projections
 * (attn.c_proj, mlp.c_proj) start at 0.02 / sqrt(2 L), as HF and the GPT-2
 * paper initialise them. */
static void gpt2_walk(const lens_config *c, lens_params *p, lens_param_visitor *v)
{
    const int C = c->d_model;
    const float sd = 0.02f, sd_proj = 0.02f / sqrtf(2.0f * c->n_layers);
    p->tok_emb = lens_walk_tensor(v, "transformer.wte.weight", c->vocab_size, C, LENS_PARAM_EMBEDDING, sd);
    p->pos_emb = lens_walk_tensor(v, "transformer.wpe.weight", c->max_positions, C, LENS_PARAM_EMBEDDING, sd);
    p->type_emb = NULL;
    for (int l = 0; l < c->n_layers; l++) {
        lens_block *blk = &p->blocks[l];
        char n[128];
#define AT(suffix) (snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), n)
        lens_linear qkv;
        lens_walk_layernorm(v, &blk->ln_attn, AT("ln_1"), C);
        lens_walk_linear(v, &qkv, AT("attn.c_attn"), C, 3 * C, 1, sd);
        lens_walk_linear(v, &blk->attn_out, AT("attn.c_proj"), C, C, 1, sd_proj);
        lens_walk_layernorm(v, &blk->ln_ff, AT("ln_2"), C);
        lens_walk_linear(v, &blk->ff_in, AT("mlp.c_fc"), C, c->d_ff, 1, sd);
        lens_walk_linear(v, &blk->ff_out, AT("mlp.c_proj"), c->d_ff, C, 1, sd_proj);
#undef AT
        lens_linear *views[3] = {&blk->q, &blk->k, &blk->v};
        for (int i = 0; i < 3; i++) {
            *views[i] = qkv;
            views[i]->w = qkv.w ? lens_dtype_at(qkv.w, qkv.dtype, (size_t)i * C) : NULL;
            views[i]->b = qkv.b ? qkv.b + i * C : NULL;
            views[i]->out = C;
        }
    }
    lens_walk_layernorm(v, &p->ln_final, "transformer.ln_f", C);
}

/* x = token + position embeddings. */
static void gpt2_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *mean,
                       float *rstd)
{
    (void)type_ids, (void)mean, (void)rstd; /* no segments, no embedding LayerNorm */
    lens_embedding_forward(x, ids, NULL, m->p.tok_emb, m->p.pos_emb, NULL, m->p.emb_dtype, T, m->cfg.d_model);
}

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
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_TIED_HEAD | LENS_CAP_TRAIN | LENS_CAP_BYTE_BPE,
    .tokenizer_class = NULL, /* GPT2Tokenizer is what the files mean; mkmodel writes no tokenizer_config */
    .bpe_last = "<|endoftext|>",
    .parse_config = gpt2_parse_config,
    .new_config = gpt2_new_config,
    .write_config = gpt2_write_config,
    .walk = gpt2_walk,
    .embed = gpt2_embed,
    .block = gpt2_block,
};
