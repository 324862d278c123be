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

/* What the pre-norm block keeps in lens_block_cache.buf, [rows][width]
 * blocks: the two LayerNorms' inputs (the residual stream before and after
 * attention) and statistics and the GELU input; for weight gradients also
 * the inputs of the linear maps. */
typedef struct {
    float *x_in, *mean1, *rstd1;   /* LN_1: the block input */
    float *mid, *mean2, *rstd2;    /* LN_2: x + attn_out(ctx) */
    float *ff_pre;                 /* [F] GELU input */
    float *h1, *ctx, *h2, *ff_act; /* for_weights: q/k/v, attn_out, ff_in, ff_out inputs */
} pre_saved;

static pre_saved pre_slots(const lens_config *c, const lens_block_cache *k)
{
    const size_t R = (size_t)k->rows, C = c->d_model, F = c->d_ff, VO = (size_t)c->n_heads * c->d_head_v;
    pre_saved s;
    float *p = k->buf;
    s.x_in = p, p += R * C;
    s.mean1 = p, p += R;
    s.rstd1 = p, p += R;
    s.mid = p, p += R * C;
    s.mean2 = p, p += R;
    s.rstd2 = p, p += R;
    s.ff_pre = p, p += R * F;
    s.h1 = s.ctx = s.h2 = s.ff_act = NULL;
    if (k->for_weights) {
        s.h1 = p, p += R * C;
        s.ctx = p, p += R * VO;
        s.h2 = p, p += R * C;
        s.ff_act = p;
    }
    return s;
}

/* a = x + Attn(LN1(x)); x' = a + FFN(LN2(a)), in place on io->x. With
 * io->cache the LayerNorm statistics go there (not to io->ln_mean). */
static void gpt2_block_forward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff, VO = c->n_heads * c->d_head_v;
    const pre_saved s = io->cache ? pre_slots(c, io->cache) : (pre_saved){0};
    const int w = io->cache && io->cache->for_weights;
    if (io->cache) memcpy(s.x_in, io->x, sizeof(float) * io->N * C);
    lens_add_layernorm(io->pool, io->h, io->cache ? s.mean1 : lens_ln_slot(io, io->ln_mean, 2 * l),
                       io->cache ? s.rstd1 : lens_ln_slot(io, io->ln_rstd, 2 * l), io->x, NULL, &blk->ln_attn, io->N,
                       C, c->ln_eps);
    if (w) memcpy(s.h1, io->h, sizeof(float) * io->N * C);
    lens_gemm_linear(io->q, io->h, &blk->q, io->N, io->pool);
    lens_gemm_linear(io->k, io->h, &blk->k, io->N, io->pool);
    lens_gemm_linear(io->v, io->h, &blk->v, io->N, io->pool);
    io->attend(io, l);
    const int N = io->N; /* the hook may have kept fewer rows */
    if (w) memcpy(s.ctx, io->ctx, sizeof(float) * N * VO);
    lens_gemm_linear(io->h, io->ctx, &blk->attn_out, N, io->pool);
    lens_residual_layernorm(io->pool, io->x, io->h, io->h, io->cache ? s.mean2 : lens_ln_slot(io, io->ln_mean, 2 * l + 1),
                            io->cache ? s.rstd2 : lens_ln_slot(io, io->ln_rstd, 2 * l + 1), &blk->ln_ff, N, C,
                            c->ln_eps);
    if (io->cache) memcpy(s.mid, io->x, sizeof(float) * N * C);
    if (w) memcpy(s.h2, io->h, sizeof(float) * N * C);
    lens_gemm_linear_ld(io->ff, io->ff_ld, io->h, (size_t)C, &blk->ff_in, N, io->pool);
    if (io->cache) lens_block_copy_rows(s.ff_pre, io->ff, io->ff_ld, N, F);
    lens_gelu_rows(io->pool, io->ff, io->ff_ld, N, F, c->gelu_tanh);
    if (w) lens_block_copy_rows(s.ff_act, io->ff, io->ff_ld, N, F);
    lens_gemm_linear_ld(io->h, (size_t)C, io->ff, io->ff_ld, &blk->ff_out, N, io->pool);
    lens_residual_layernorm(io->pool, io->x, io->h, NULL, NULL, NULL, NULL, N, C, c->ln_eps);
}

/* Backward of gpt2_block_forward: io->x = dL/dx' in, dL/dx out (io->ff:
 * [N][F] contiguous). */
static void gpt2_block_backward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff;
    const pre_saved s = pre_slots(c, io->cache);
    int N = io->N;
    /* forward: x' = mid + ff_out(gelu(ff_in(LN_2(mid)))): dmid = dx' + the FFN branch, in io->x */
    lens_block_linear_backward(io, io->ff, 0, io->x, s.ff_act, &blk->ff_out, N);
    lens_gelu_backward_rows(io->pool, io->ff, s.ff_pre, (size_t)F, N, F, c->gelu_tanh);
    lens_block_linear_backward(io, io->n, 0, io->ff, s.h2, &blk->ff_in, N);
    lens_block_layernorm_backward(io, io->x, 1, io->n, s.mid, s.mean2, s.rstd2, &blk->ln_ff, N, C);
    /* forward: mid = x + attn_out(ctx): dx = dmid + the attention branch */
    lens_block_linear_backward(io, io->ctx, 0, io->x, s.ctx, &blk->attn_out, N);
    if (io->attend_backward(io, l)) return;
    N = io->N; /* the hook may have expanded compacted rows */
    /* forward: q, k, v = h1 W_{Q,K,V} + b, h1 = LN_1(x) */
    lens_block_linear_backward(io, io->n, 0, io->q, s.h1, &blk->q, N);
    lens_block_linear_backward(io, io->n, 1, io->k, s.h1, &blk->k, N);
    lens_block_linear_backward(io, io->n, 1, io->v, s.h1, &blk->v, N);
    lens_block_layernorm_backward(io, io->x, 1, io->n, s.x_in, s.mean1, s.rstd1, &blk->ln_attn, N, C);
}

/* JVP of the block's row-wise tail: io->x = d x' from io->h = d mid
 * (mid = x + attn_out(ctx)); io->n, io->ff scratch. */
static void gpt2_tail_jvp(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, T = io->cache->rows, B = io->N / T, N = io->N;
    const pre_saved s = pre_slots(c, io->cache);
    /* x' = mid + ff_out(gelu(ff_in(LN_2(mid)))) */
    lens_layernorm_jvp(io->n, io->h, s.mid, s.mean2, s.rstd2, &blk->ln_ff, B, T, C, io->row_scratch);
    lens_block_gelu_mlp_jvp(m, blk, io, io->x, io->n, s.ff_pre);
    lens_residual_forward(io->x, io->h, (size_t)N * C);
}

/* JVP of gpt2_block_forward for the B = io->N / rows tangents in io->x. */
static void gpt2_block_jvp(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const lens_block_cache *k = io->cache;
    const int C = c->d_model, T = k->rows, B = io->N / T, N = io->N;
    const pre_saved s = pre_slots(c, k);
    lens_layernorm_jvp(io->n, io->x, s.x_in, s.mean1, s.rstd1, &blk->ln_attn, B, T, C, io->row_scratch);
    /* LN_1's JVP keeps the zero rows of a one-row input zero */
    lens_block_linear_jvp(io, io->q, io->n, &blk->q, io->h, io->ff);
    lens_block_linear_jvp(io, io->k, io->n, &blk->k, io->h, io->ff);
    lens_block_linear_jvp(io, io->v, io->n, &blk->v, io->h, io->ff);
    io->attend_jvp(io, l);
    /* mid = x + attn_out(ctx) */
    lens_linear_jvp(io->h, io->ctx, &blk->attn_out, N, io->pool);
    lens_residual_forward(io->h, io->x, (size_t)N * C);
    if (io->row_jac) lens_block_row_jac_apply(io, io->x, io->h, io->row_jac, C);
    else gpt2_tail_jvp(m, io, l);
}

static void gpt2_block_row_jacobian(const lens_model *m, lens_block_io *io, int l, float *jac)
{
    lens_block_row_jacobian(io, m->cfg.d_model, jac, gpt2_tail_jvp, m, l);
}

/* Final cache: ln_f's input [rows][C] and statistics [rows] x2. */
size_t lens_ln_final_cache_floats(const lens_config *c, int for_weights)
{
    (void)for_weights;
    return (size_t)c->d_model + 2;
}

/* x = ln_f(x), statistics in slot 2L (or, with io->cache, the input and
 * statistics there). */
void lens_ln_final_forward(const lens_model *m, lens_block_io *io)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, C = c->d_model;
    float *mean = lens_ln_slot(io, io->ln_mean, 2 * L), *rstd = lens_ln_slot(io, io->ln_rstd, 2 * L);
    if (io->cache) {
        const size_t R = (size_t)io->cache->rows;
        memcpy(io->cache->buf, io->x, sizeof(float) * io->N * C);
        mean = io->cache->buf + R * C, rstd = mean + R;
    }
    lens_add_layernorm(io->pool, io->x, mean, rstd, io->x, NULL, &m->p.ln_final, io->N, C, c->ln_eps);
}

void lens_ln_final_backward(const lens_model *m, lens_block_io *io)
{
    const int C = m->cfg.d_model;
    const size_t R = (size_t)io->cache->rows;
    const float *in = io->cache->buf, *mean = in + R * C, *rstd = mean + R;
    lens_block_layernorm_backward(io, io->h, 0, io->x, in, mean, rstd, &m->p.ln_final, io->N, C);
    memcpy(io->x, io->h, sizeof(float) * io->N * C);
}

void lens_ln_final_jvp(const lens_model *m, lens_block_io *io)
{
    const int C = m->cfg.d_model, T = io->cache->rows;
    const float *in = io->cache->buf, *mean = in + (size_t)T * C, *rstd = mean + T;
    lens_layernorm_jvp(io->x, io->x, in, mean, rstd, &m->p.ln_final, io->N / T, T, C, io->row_scratch);
}

const lens_family lens_family_gpt2 = {
    .model_type = "gpt2",
    .base_prefix = "transformer.",
    .default_arch = "GPT2LMHeadModel",
    .task_archs = {[LENS_TASK_ENCODER] = "GPT2Model", [LENS_TASK_CAUSAL_LM] = "GPT2LMHeadModel"},
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_TIED_HEAD | LENS_CAP_BYTE_BPE,
    .tokenizer_class = NULL, /* GPT2Tokenizer is what the files mean; mkmodel writes no tokenizer_config */
    .bpe_last = "<|endoftext|>",
    .parse_config = gpt2_parse_config,
    .new_config = gpt2_new_config,
    .write_config = gpt2_write_config,
    .walk = gpt2_walk,
    .block_forward = gpt2_block_forward,
    .block_backward = gpt2_block_backward,
    .block_jvp = gpt2_block_jvp,
    .block_row_jacobian = gpt2_block_row_jacobian,
    .cache_floats = lens_ln_block_cache_floats,
    .final_cache_floats = lens_ln_final_cache_floats,
    .final_forward = lens_ln_final_forward,
    .final_backward = lens_ln_final_backward,
    .final_jvp = lens_ln_final_jvp,
};
