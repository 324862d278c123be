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
 * final norm is GPT-2's, gpt2.c). Backward and JVP follow the block contract
 * (arch.h); the fused q/k/v gradient is merged back into HF's per-head
 * layout in io->ff (F >= 3C).
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

/* What the block keeps in lens_block_cache.buf per row (neox_slots): both
 * LayerNorms' inputs and statistics and the GELU input; with for_weights
 * the linear maps' inputs. */
typedef struct {
    float *x_in, *mean1, *rstd1;  /* input_layernorm: the block input */
    float *x2, *mean2, *rstd2;    /* post_attention_layernorm: the block input (parallel) or x + attention */
    float *ff_pre;                /* [F] GELU input */
    float *h1, *ctx, *h2, *ff_act; /* for_weights */
} neox_saved;

static size_t neox_cache_floats(const lens_config *c, int for_weights)
{
    const size_t C = c->d_model, F = c->d_ff;
    return 2 * C + F + 4 + (for_weights ? 3 * C + F : 0);
}

static neox_saved neox_slots(const lens_config *c, const lens_block_cache *k)
{
    const size_t R = (size_t)k->rows, C = c->d_model, F = c->d_ff;
    neox_saved s = {0};
    float *p = k->buf;
#define TAKE(slot, width) (s.slot = p, p += R * (width))
    TAKE(x_in, C), TAKE(mean1, 1), TAKE(rstd1, 1), TAKE(x2, C), TAKE(mean2, 1), TAKE(rstd2, 1), TAKE(ff_pre, F);
    if (k->for_weights) TAKE(h1, C), TAKE(ctx, C), TAKE(h2, C), TAKE(ff_act, F);
#undef TAKE
    return s;
}

/* q, k, v [N][C] from the fused output qkv [N][ld] (per head [q_h | k_h | v_h]). */
static void split_qkv(const lens_config *c, const float *qkv, size_t ld, int N, float *q, float *k, float *v)
{
    const int NH = c->n_heads, D = c->d_head_k, C = c->d_model;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++) {
            const float *src = qkv + (size_t)n * ld + (size_t)h * 3 * D;
            memcpy(q + (size_t)n * C + h * D, src, sizeof(float) * D);
            memcpy(k + (size_t)n * C + h * D, src + D, sizeof(float) * D);
            memcpy(v + (size_t)n * C + h * D, src + 2 * D, sizeof(float) * D);
        }
}

/* The inverse of split_qkv: qkv [N][3C] (HF's per-head layout) from q, k, v [N][C]. */
static void merge_qkv(const lens_config *c, float *qkv, int N, const float *q, const float *k, const float *v)
{
    const int NH = c->n_heads, D = c->d_head_k, C = c->d_model;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++) {
            float *dst = qkv + (size_t)n * 3 * C + (size_t)h * 3 * D;
            memcpy(dst, q + (size_t)n * C + h * D, sizeof(float) * D);
            memcpy(dst + D, k + (size_t)n * C + h * D, sizeof(float) * D);
            memcpy(dst + 2 * D, v + (size_t)n * C + h * D, sizeof(float) * D);
        }
}

/* dst[N][W] = src[N] (row stride ld), when dst is not NULL. */
static void save_rows(float *dst, const float *src, size_t ld, int N, int W)
{
    for (int n = 0; dst && n < N; n++) memcpy(dst + (size_t)n * W, src + n * ld, sizeof(float) * W);
}

static void neox_block_forward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff, NH = c->n_heads;
    const neox_saved s = io->cache ? neox_slots(c, io->cache) : (neox_saved){0};
    int N = io->N;
    float *mean1 = io->cache ? s.mean1 : lens_ln_slot(io, io->ln_mean, 2 * l);
    float *rstd1 = io->cache ? s.rstd1 : lens_ln_slot(io, io->ln_rstd, 2 * l);
    save_rows(s.x_in, io->x, (size_t)C, N, C);
    lens_add_layernorm(io->pool, io->h, mean1, rstd1, io->x, NULL, &blk->ln_attn, N, C, c->ln_eps);
    save_rows(s.h1, io->h, (size_t)C, N, C);
    lens_gemm_linear_ld(io->ff, io->ff_ld, io->h, (size_t)C, &blk->q, N, io->pool);
    split_qkv(c, io->ff, io->ff_ld, N, io->q, io->k, io->v);
    lens_decoder_rope(c, io->q, io->pos, N, N, NH, 0);
    lens_decoder_rope(c, io->k, io->pos, N, N, NH, 0);
    io->attend(io, l);
    N = io->N; /* the hook may have kept fewer rows */
    save_rows(s.ctx, io->ctx, (size_t)C, N, C);
    float *mean2 = io->cache ? s.mean2 : lens_ln_slot(io, io->ln_mean, 2 * l + 1);
    float *rstd2 = io->cache ? s.rstd2 : lens_ln_slot(io, io->ln_rstd, 2 * l + 1);
    if (!c->parallel_residual) {
        lens_gemm_linear(io->h, io->ctx, &blk->attn_out, N, io->pool);
        lens_residual_layernorm(io->pool, io->x, io->h, NULL, NULL, NULL, NULL, N, C, c->ln_eps);
    }
    /* parallel: LN2 reads the block input x, still unchanged here */
    save_rows(s.x2, io->x, (size_t)C, N, C);
    lens_add_layernorm(io->pool, io->h, mean2, rstd2, io->x, NULL, &blk->ln_ff, N, C, c->ln_eps);
    save_rows(s.h2, io->h, (size_t)C, N, C);
    lens_gemm_linear_ld(io->ff, io->ff_ld, io->h, (size_t)C, &blk->ff_in, N, io->pool);
    save_rows(s.ff_pre, io->ff, io->ff_ld, N, F);
    lens_gelu_rows(io->pool, io->ff, io->ff_ld, N, F, c->gelu_tanh);
    save_rows(s.ff_act, io->ff, io->ff_ld, N, F);
    lens_gemm_linear_ld(io->h, (size_t)C, io->ff, io->ff_ld, &blk->ff_out, N, io->pool);
    lens_residual_layernorm(io->pool, io->x, io->h, NULL, NULL, NULL, NULL, N, C, c->ln_eps);
    if (c->parallel_residual) {
        lens_gemm_linear(io->h, io->ctx, &blk->attn_out, N, io->pool);
        lens_residual_layernorm(io->pool, io->x, io->h, NULL, NULL, NULL, NULL, N, C, c->ln_eps);
    }
}

/* Backward of neox_block_forward: io->x = dL/dx' in, dL/dx out; io->ff
 * contiguous [N][F] (and [N][3C] for the fused q/k/v gradient, F >= 3C). */
static void neox_block_backward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff, NH = c->n_heads;
    const neox_saved s = neox_slots(c, io->cache);
    int N = io->N;
    /* forward: x' = x2 + W2 gelu(W1 LN2(x2)) (+ ctx W_o, parallel); x2 = x (parallel) or x + ctx W_o */
    if (c->parallel_residual) lens_block_linear_backward(io, io->ctx, 0, io->x, s.ctx, &blk->attn_out, N);
    lens_block_linear_backward(io, io->ff, 0, io->x, s.ff_act, &blk->ff_out, N);
    lens_gelu_backward_rows(io->pool, io->ff, s.ff_pre, (size_t)F, N, F, c->gelu_tanh);
    lens_block_linear_backward(io, io->n, 0, io->ff, s.h2, &blk->ff_in, N);
    lens_block_layernorm_backward(io, io->x, 1, io->n, s.x2, s.mean2, s.rstd2, &blk->ln_ff, N, C);
    if (!c->parallel_residual) lens_block_linear_backward(io, io->ctx, 0, io->x, s.ctx, &blk->attn_out, N);
    if (io->attend_backward(io, l)) return;
    N = io->N; /* the hook may have expanded compacted rows */
    /* forward: q, k = RoPE(split(LN1(x) W_qkv + b)), v = split(..) */
    lens_decoder_rope(c, io->q, io->pos, N, N, NH, 1);
    lens_decoder_rope(c, io->k, io->pos, N, N, NH, 1);
    merge_qkv(c, io->ff, N, io->q, io->k, io->v);
    lens_block_linear_backward(io, io->n, 0, io->ff, s.h1, &blk->q, N);
    lens_block_layernorm_backward(io, io->x, 1, io->n, s.x_in, s.mean1, s.rstd1, &blk->ln_attn, N, C);
}

/* JVP of neox_block_forward for the B = io->N / rows tangents in io->x. */
static void neox_block_jvp(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const lens_block_cache *k = io->cache;
    const int C = c->d_model, NH = c->n_heads, T = k->rows, N = io->N, B = N / T;
    const neox_saved s = neox_slots(c, k);
    lens_layernorm_jvp(io->n, io->x, s.x_in, s.mean1, s.rstd1, &blk->ln_attn, B, T, C, io->row_scratch);
    lens_linear_jvp(io->ff, io->n, &blk->q, N, io->pool);
    split_qkv(c, io->ff, (size_t)3 * C, N, io->q, io->k, io->v);
    lens_decoder_rope(c, io->q, NULL, N, T, NH, 0);
    lens_decoder_rope(c, io->k, NULL, N, T, NH, 0);
    io->attend_jvp(io, l);
    lens_linear_jvp(io->h, io->ctx, &blk->attn_out, N, io->pool);
    if (!c->parallel_residual) lens_residual_forward(io->x, io->h, (size_t)N * C);
    lens_layernorm_jvp(io->n, io->x, s.x2, s.mean2, s.rstd2, &blk->ln_ff, B, T, C, io->row_scratch);
    lens_block_gelu_mlp_jvp(m, blk, io, io->n, io->n, s.ff_pre);
    lens_residual_forward(io->x, io->n, (size_t)N * C);
    if (c->parallel_residual) lens_residual_forward(io->x, io->h, (size_t)N * C);
}

/* q, k of one sequence: the fused map per head (views of W_qkv rows), so no
 * [T][3C] scratch is needed. */
static void neox_attn_qk(const lens_model *m, int l, const float *h, int T, float *x, float *q, float *k)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int NH = c->n_heads, D = c->d_head_k, C = c->d_model;
    lens_layernorm_forward(x, NULL, NULL, h, &blk->ln_attn, T, C, c->ln_eps);
    for (int hh = 0; hh < NH; hh++)
        for (int part = 0; part < 2; part++) {
            const size_t row = (size_t)hh * 3 * D + (size_t)part * D;
            const lens_linear view = {.w = lens_dtype_at(blk->q.w, blk->q.dtype, row * C), .dtype = blk->q.dtype,
                                      .b = blk->q.b + row, .in = C, .out = D, .ld = C};
            lens_gemm_linear_ld((part ? k : q) + (size_t)hh * D, (size_t)C, x, (size_t)C, &view, T, NULL);
        }
    lens_decoder_rope(c, q, NULL, T, T, NH, 0);
    lens_decoder_rope(c, k, NULL, T, T, NH, 0);
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
    .block_forward = neox_block_forward,
    .block_backward = neox_block_backward,
    .block_jvp = neox_block_jvp,
    .cache_floats = neox_cache_floats,
    .final_cache_floats = lens_ln_final_cache_floats,
    .final_forward = lens_ln_final_forward,
    .final_backward = lens_ln_final_backward,
    .final_jvp = lens_ln_final_jvp,
    .attn_qk = neox_attn_qk,
    .preset = neox_preset,
    .preset_names = "micro, tiny, 1b, 8b",
};
