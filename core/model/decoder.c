/* decoder.c - the Llama-style decoder block that llama.c, qwen.c and
 * gemma.c share (HF LlamaDecoderLayer, MistralDecoderLayer,
 * Qwen2/Qwen3DecoderLayer, GemmaDecoderLayer, Gemma2DecoderLayer), driven by
 * the lens_config flags the family files set from their config keys.
 *
 * HF tensor names (one walker for all six families):
 *   model.embed_tokens.weight [V][C]
 *   model.layers.{l}.self_attn.{q,k,v,o}_proj.{weight,bias}  q: [NH*DK][C], k / v: [NKV*DK][C],
 *                                                             o: [C][NH*DV]; biases per qkv_bias / o_bias
 *   model.layers.{l}.self_attn.{q,k}_norm.weight [DK]          (Qwen3)
 *   model.layers.{l}.mlp.{gate,up,down}_proj.weight           [F][C], [F][C], [C][F]
 *   model.layers.{l}.input_layernorm.weight, post_attention_layernorm.weight [C]
 *   model.layers.{l}.pre_feedforward_layernorm.weight,
 *                     post_feedforward_layernorm.weight [C]   (Gemma 2)
 *   model.norm.weight [C];  lm_head.weight [V][C] unless tie_word_embeddings
 *
 * Block (pre-norm, RMSNorm with gain w or 1 + w):
 *   h = norm_1(x);  q = h W_q (+b), k = h W_k (+b), v = h W_v (+b)
 *   q, k = RMSNorm per head (Qwen3);  q, k = RoPE(q, k, position)
 *   k, v repeated to NH heads (HF repeat_kv: query head h reads kv head h / (NH/NKV))
 *   a = softmax(cap(scale q k^T) + causal / sliding-window mask) v;  o = a W_o (+b)
 *   x = x + post_attn(o)               (post_attn only with Gemma 2's post_norms)
 *   x = x + post_ff(W_down (act(h W_gate) * (h W_up))),  h = norm_2(x)
 * then model.norm after the last block. Embedding (embedding.h): E[id]
 * times emb_scale (Gemma: sqrt(C)). Norm statistics (io->ln_rstd): slot 2l norm_1, 2l + 1
 * norm_2, 2L the final norm; ln_mean gets 0 (RMSNorm does not centre). */
#include "core/model/decoder.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/glu.h"
#include "core/nn/norm.h"
#include "core/nn/ops.h"
#include "core/nn/rope.h"

/* ------------------------------------------------------------ config */

/* rope_scaling: null, {"rope_type" | "type": "default" | "linear" | "llama3", ...}. */
static int parse_rope_scaling(json_t *root, const char *path, lens_rope_params *r, lens_err *err)
{
    json_t *s = json_object_get(root, "rope_scaling");
    r->type = LENS_ROPE_DEFAULT;
    if (!s || json_is_null(s)) return 0;
    if (!json_is_object(s)) return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling must be an object or null", path);
    const char *type = json_string_value(json_object_get(s, "rope_type"));
    if (!type) type = json_string_value(json_object_get(s, "type"));
    if (!type || !strcmp(type, "default")) return 0;
    const double factor = json_number_value(json_object_get(s, "factor"));
    if (!(factor > 0)) return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling.factor must be > 0", path);
    r->factor = factor;
    if (!strcmp(type, "linear")) {
        r->type = LENS_ROPE_LINEAR;
        return 0;
    }
    if (strcmp(type, "llama3"))
        return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling type \"%s\" is not supported (default, linear, llama3)",
                         path, type);
    r->type = LENS_ROPE_LLAMA3;
    r->low_freq_factor = json_number_value(json_object_get(s, "low_freq_factor"));
    r->high_freq_factor = json_number_value(json_object_get(s, "high_freq_factor"));
    r->original_max_positions = (int)json_integer_value(json_object_get(s, "original_max_position_embeddings"));
    if (!(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) || r->original_max_positions < 1)
        return lens_fail(err, LENS_EFORMAT,
                         "%s: rope_scaling llama3 needs low_freq_factor > 0, high_freq_factor > low_freq_factor and "
                         "original_max_position_embeddings >= 1",
                         path);
    return 0;
}

static int json_bool(json_t *root, const char *key, int fallback)
{
    json_t *v = json_object_get(root, key);
    return json_is_boolean(v) ? json_is_true(v) : fallback;
}

int lens_decoder_parse_shape(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    return lens_json_int(root, path, "hidden_size", -1, 1, 1 << 16, &cfg->d_model, err) ||
                   lens_json_int(root, path, "num_hidden_layers", -1, 1, 1024, &cfg->n_layers, err) ||
                   lens_json_int(root, path, "num_attention_heads", -1, 1, 1024, &cfg->n_heads, err) ||
                   lens_json_int(root, path, "intermediate_size", -1, 1, 1 << 20, &cfg->d_ff, err) ||
                   lens_json_int(root, path, "vocab_size", -1, 1, 1 << 24, &cfg->vocab_size, err) ||
                   lens_json_int(root, path, "max_position_embeddings", 2048, 1, 1 << 24, &cfg->max_positions, err)
               ? -1
               : 0;
}

int lens_decoder_parse_keys(json_t *root, const char *path, lens_config *cfg, int tie_default, lens_err *err)
{
    if (lens_decoder_parse_shape(root, path, cfg, err) ||
        lens_json_int(root, path, "num_key_value_heads", cfg->n_heads, 1, cfg->n_heads, &cfg->n_kv_heads, err) ||
        lens_json_eps(root, path, "rms_norm_eps", 1e-6, &cfg->ln_eps, err))
        return -1;
    if (cfg->n_heads % cfg->n_kv_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                         path, cfg->n_heads, cfg->n_kv_heads);
    /* head_dim: explicit (Gemma, Qwen3) or hidden_size / num_attention_heads; null counts as absent */
    json_t *hd = json_object_get(root, "head_dim");
    const int fallback = cfg->d_model / cfg->n_heads;
    if (json_is_null(hd)) json_object_del(root, "head_dim");
    if (lens_json_int(root, path, "head_dim", fallback, 2, LENS_DECODER_MAX_HEAD_DIM, &cfg->d_head_k, err)) return -1;
    if (!json_object_get(root, "head_dim") && cfg->d_model % cfg->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", path,
                         cfg->d_model, cfg->n_heads);
    if (cfg->d_head_k % 2) return lens_fail(err, LENS_EFORMAT, "%s: head_dim %d must be even for RoPE", path, cfg->d_head_k);
    cfg->d_head_v = cfg->d_head_k;
    json_t *theta = json_object_get(root, "rope_theta");
    cfg->rope.theta = json_is_number(theta) ? json_number_value(theta) : 10000.0;
    if (!(cfg->rope.theta > 1)) return lens_fail(err, LENS_EFORMAT, "%s: rope_theta must be > 1", path);
    cfg->rope.dim = cfg->d_head_k;
    if (parse_rope_scaling(root, path, &cfg->rope, err)) return -1;
    cfg->norm_rms = 1;
    cfg->tie_word_embeddings = json_bool(root, "tie_word_embeddings", tie_default);
    cfg->type_vocab_size = 0;
    cfg->glu = LENS_GLU_SILU;
    if (json_bool(root, "mlp_bias", 0))
        return lens_fail(err, LENS_EFORMAT, "%s: mlp_bias true is not supported", path);
    return 0;
}

int lens_decoder_new_config(lens_config *c, const char *task, const char *arch, lens_err *err)
{
    if (task && strcmp(task, lens_task_name(LENS_TASK_CAUSAL_LM)))
        return lens_fail(err, LENS_EINVAL, "task \"%s\" is not available for %s (causal-lm)", task, arch);
    c->task = LENS_TASK_CAUSAL_LM;
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    c->norm_rms = 1, c->glu = LENS_GLU_SILU, c->ln_eps = 1e-6f;
    c->rope.theta = 10000.0;
    return 0;
}

/* hidden_act / hidden_activation: the gate's activation. */
int lens_decoder_parse_act(json_t *root, const char *path, const char *key, const char *fallback, lens_config *cfg,
                           lens_err *err)
{
    const char *act = lens_json_str(root, key);
    if (!act) act = fallback;
    if (!strcmp(act, "silu") || !strcmp(act, "swish")) cfg->glu = LENS_GLU_SILU;
    else if (!strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_new")) cfg->glu = LENS_GLU_GELU_TANH;
    else return lens_fail(err, LENS_EFORMAT, "%s: %s \"%s\" is not supported (silu, gelu_pytorch_tanh)", path, key, act);
    return 0;
}

int lens_decoder_parse_window(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    json_t *w = json_object_get(root, "sliding_window");
    if (!w || json_is_null(w)) return 0;
    return lens_json_int(root, path, "sliding_window", 0, 1, 1 << 24, &cfg->sliding_window, err);
}

void lens_decoder_write_common(FILE *f, const lens_config *c)
{
    fprintf(f,
            "  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %g,\n"
            "  \"rope_theta\": %.17g,\n  \"tie_word_embeddings\": %s,\n  \"initializer_range\": %g,\n"
            "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 0,\n  \"eos_token_id\": %d,\n",
            c->d_model, c->n_layers, c->n_heads, lens_kv_heads(c), c->d_head_k, c->d_ff, c->vocab_size,
            c->max_positions, (double)c->ln_eps, c->rope.theta, c->tie_word_embeddings ? "true" : "false",
            c->init_range > 0 ? (double)c->init_range : 0.02, c->vocab_size - 1);
    if (c->rope.type == LENS_ROPE_LLAMA3)
        fprintf(f,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %g, \"low_freq_factor\": %g, "
                "\"high_freq_factor\": %g, \"original_max_position_embeddings\": %d},\n",
                c->rope.factor, c->rope.low_freq_factor, c->rope.high_freq_factor, c->rope.original_max_positions);
    else if (c->rope.type == LENS_ROPE_LINEAR)
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %g},\n", c->rope.factor);
    else fprintf(f, "  \"rope_scaling\": null,\n");
}

/* ------------------------------------------------------------ tensors */

void lens_decoder_walk(const lens_config *c, lens_params *p, lens_param_visitor *v)
{
    const int C = c->d_model, NH = c->n_heads, NKV = lens_kv_heads(c), DK = c->d_head_k, DV = c->d_head_v;
    const int F = c->d_ff, off = c->norm_unit_offset;
    const float sd = c->init_range > 0 ? c->init_range : 0.02f, noise = 0.1f;
    p->tok_emb = lens_walk_tensor(v, "model.embed_tokens.weight", c->vocab_size, C, LENS_PARAM_EMBEDDING, sd);
    p->pos_emb = p->type_emb = NULL;
    for (int l = 0; l < c->n_layers; l++) {
        lens_block *blk = &p->blocks[l];
        char n[128];
#define AT(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
        lens_walk_linear_bias(v, &blk->q, AT("self_attn.q_proj"), C, NH * DK, c->qkv_bias, sd);
        lens_walk_linear_bias(v, &blk->k, AT("self_attn.k_proj"), C, NKV * DK, c->qkv_bias, sd);
        lens_walk_linear_bias(v, &blk->v, AT("self_attn.v_proj"), C, NKV * DV, c->qkv_bias, sd);
        lens_walk_linear_bias(v, &blk->attn_out, AT("self_attn.o_proj"), NH * DV, C, c->o_bias, sd);
        if (c->qk_norm) {
            lens_walk_rmsnorm(v, &blk->q_norm, AT("self_attn.q_norm"), DK, off, noise);
            lens_walk_rmsnorm(v, &blk->k_norm, AT("self_attn.k_norm"), DK, off, noise);
        }
        lens_walk_linear_bias(v, &blk->gate, AT("mlp.gate_proj"), C, F, 0, sd);
        lens_walk_linear_bias(v, &blk->ff_in, AT("mlp.up_proj"), C, F, 0, sd);
        lens_walk_linear_bias(v, &blk->ff_out, AT("mlp.down_proj"), F, C, 0, sd);
        lens_walk_rmsnorm(v, &blk->ln_attn, AT("input_layernorm"), C, off, noise);
        if (c->post_norms) {
            lens_walk_rmsnorm(v, &blk->post_attn, AT("post_attention_layernorm"), C, off, noise);
            lens_walk_rmsnorm(v, &blk->ln_ff, AT("pre_feedforward_layernorm"), C, off, noise);
            lens_walk_rmsnorm(v, &blk->post_ff, AT("post_feedforward_layernorm"), C, off, noise);
        } else {
            lens_walk_rmsnorm(v, &blk->ln_ff, AT("post_attention_layernorm"), C, off, noise);
        }
#undef AT
    }
    lens_walk_rmsnorm(v, &p->ln_final, "model.norm", C, off, noise);
    p->lm_head = (lens_linear){0};
    if (!c->tie_word_embeddings && c->task == LENS_TASK_CAUSAL_LM)
        lens_walk_linear_bias(v, &p->lm_head, "lm_head", C, c->vocab_size, 0, sd);
}

/* ------------------------------------------------------------ forward */

/* out[N][C] = RMSNorm(inp) with ln's gain; statistics to slot (or none). */
static void norm_rows(const lens_model *m, const lens_block_io *io, float *out, const float *inp,
                      const lens_layernorm *ln, int slot)
{
    const lens_config *c = &m->cfg;
    float *mean = slot >= 0 ? lens_ln_slot(io, io->ln_mean, slot) : NULL;
    float *rstd = slot >= 0 ? lens_ln_slot(io, io->ln_rstd, slot) : NULL;
    lens_rmsnorm_forward(out, rstd, inp, ln->w, c->norm_unit_offset, io->N, c->d_model, c->ln_eps);
    if (mean) memset(mean, 0, sizeof(float) * io->N);
}

void lens_repeat_kv(float *x, int N, int NKV, int NH, int D)
{
    if (NKV == NH) return;
    const int group = NH / NKV;
    /* last row and head first: every destination lies at or after its
     * source and after every source still to be read */
    for (int n = N - 1; n >= 0; n--)
        for (int h = NH - 1; h >= 0; h--)
            memmove(x + ((size_t)n * NH + h) * D, x + ((size_t)n * NKV + h / group) * D, sizeof(float) * D);
}

/* What the block keeps in lens_block_cache.buf per row (decoder_slots):
 * the norms' inputs and 1/rms, the pre-norm q / k of QK-norm, the
 * pre-activation gate and up; with for_weights the linear maps' inputs. */
typedef struct {
    float *x_in, *rstd1;          /* input_layernorm */
    float *q_pre, *k_pre, *q_rstd, *k_rstd; /* QK-norm: [NH*DK], [NKV*DK], [NH], [NKV] */
    float *o_pre, *o_rstd;        /* post_norms: the attention output before its norm */
    float *mid, *rstd2;           /* the MLP's norm input (x after attention) */
    float *gate, *up;             /* [F] each */
    float *f_pre, *f_rstd;        /* post_norms: the MLP output before its norm */
    float *h1, *ctx, *h2, *act;   /* for_weights */
} decoder_saved;

size_t lens_decoder_cache_floats(const lens_config *c, int for_weights)
{
    const size_t C = c->d_model, F = c->d_ff, NQ = (size_t)c->n_heads * c->d_head_k;
    const size_t NK = (size_t)lens_kv_heads(c) * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    return 2 * C + 2 + 2 * F + (c->qk_norm ? NQ + NK + c->n_heads + lens_kv_heads(c) : 0) +
           (c->post_norms ? 2 * C + 2 : 0) + (for_weights ? 2 * C + VO + F : 0);
}

static decoder_saved decoder_slots(const lens_config *c, const lens_block_cache *k)
{
    const size_t R = (size_t)k->rows, C = c->d_model, F = c->d_ff, NH = c->n_heads, NKV = lens_kv_heads(c);
    const size_t DK = c->d_head_k, VO = NH * c->d_head_v;
    decoder_saved s = {0};
    float *p = k->buf;
#define TAKE(slot, width) (s.slot = p, p += R * (width))
    TAKE(x_in, C), TAKE(rstd1, 1), TAKE(mid, C), TAKE(rstd2, 1), TAKE(gate, F), TAKE(up, F);
    if (c->qk_norm) TAKE(q_pre, NH * DK), TAKE(k_pre, NKV * DK), TAKE(q_rstd, NH), TAKE(k_rstd, NKV);
    if (c->post_norms) TAKE(o_pre, C), TAKE(o_rstd, 1), TAKE(f_pre, C), TAKE(f_rstd, 1);
    if (k->for_weights) TAKE(h1, C), TAKE(ctx, VO), TAKE(h2, C), TAKE(act, F);
#undef TAKE
    return s;
}

static float *grad_for(const lens_block_io *io, const float *param)
{
    return io->grads && param ? io->grads->of(io->grads, param) : NULL;
}

static void save(float *dst, const float *src, size_t n)
{
    if (dst) memcpy(dst, src, sizeof(float) * n);
}

void lens_decoder_rope(const lens_config *c, float *x, const int *pos, int N, int rows, int H, int back)
{
    const int DK = c->d_head_k, R = c->rope.dim;
    if (!R) return;
    double inv_freq[LENS_DECODER_MAX_HEAD_DIM / 2];
    lens_rope_inv_freq(&c->rope, inv_freq);
    if (pos) {
        (back ? lens_rope_backward : lens_rope_forward)(x, pos, N, H, DK, R, inv_freq);
        return;
    }
    for (int b = 0; b * rows < N; b++) {
        const int n = N - b * rows < rows ? N - b * rows : rows;
        (back ? lens_rope_backward : lens_rope_forward)(x + (size_t)b * rows * H * DK, NULL, n, H, DK, R, inv_freq);
    }
}

/* q [N][NH*DK], k [N][NKV*DK] (compact) from the normed input h: projections,
 * QK-norm (inputs and statistics to s when caching), RoPE, then k repeated
 * to NH heads. */
static void project_qk(const lens_model *m, const lens_block *blk, const float *h, int N, const int *pos, float *q,
                       float *k, const decoder_saved *s, lens_pool *pool)
{
    const lens_config *c = &m->cfg;
    const int NH = c->n_heads, NKV = lens_kv_heads(c), DK = c->d_head_k;
    lens_gemm_linear(q, h, &blk->q, N, pool);
    lens_gemm_linear(k, h, &blk->k, N, pool);
    if (c->qk_norm) {
        save(s ? s->q_pre : NULL, q, (size_t)N * NH * DK);
        save(s ? s->k_pre : NULL, k, (size_t)N * NKV * DK);
        lens_qk_norm_forward(q, s ? s->q_rstd : NULL, blk->q_norm.w, N, NH, DK, c->ln_eps);
        lens_qk_norm_forward(k, s ? s->k_rstd : NULL, blk->k_norm.w, N, NKV, DK, c->ln_eps);
    }
    lens_decoder_rope(c, q, pos, N, N, NH, 0);
    lens_decoder_rope(c, k, pos, N, N, NKV, 0);
    lens_repeat_kv(k, N, NKV, NH, DK);
}

/* out = RMSNorm(inp) of N rows, 1/rms to rstd (may be NULL). */
static void rms(const lens_model *m, float *out, float *rstd, const float *inp, const lens_layernorm *ln, int N)
{
    const lens_config *c = &m->cfg;
    lens_rmsnorm_forward(out, rstd, inp, ln->w, c->norm_unit_offset, N, c->d_model, c->ln_eps);
}

void lens_decoder_block_forward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff, VO = c->n_heads * c->d_head_v;
    const decoder_saved s = io->cache ? decoder_slots(c, io->cache) : (decoder_saved){0};
    const decoder_saved *sp = io->cache ? &s : NULL;
    int N = io->N;
    save(s.x_in, io->x, (size_t)N * C);
    if (io->cache) rms(m, io->h, s.rstd1, io->x, &blk->ln_attn, N);
    else norm_rows(m, io, io->h, io->x, &blk->ln_attn, 2 * l);
    save(s.h1, io->h, (size_t)N * C);
    project_qk(m, blk, io->h, N, io->pos, io->q, io->k, sp, io->pool);
    lens_gemm_linear(io->v, io->h, &blk->v, N, io->pool);
    lens_repeat_kv(io->v, N, lens_kv_heads(c), c->n_heads, c->d_head_v);
    io->attend(io, l);
    N = io->N; /* the hook may have kept fewer rows */
    save(s.ctx, io->ctx, (size_t)N * VO);
    lens_gemm_linear(io->h, io->ctx, &blk->attn_out, N, io->pool);
    if (c->post_norms) {
        save(s.o_pre, io->h, (size_t)N * C);
        rms(m, io->h, s.o_rstd, io->h, &blk->post_attn, N);
    }
    lens_residual_layernorm(io->pool, io->x, io->h, NULL, NULL, NULL, NULL, N, C, c->ln_eps);
    save(s.mid, io->x, (size_t)N * C);
    if (io->cache) rms(m, io->h, s.rstd2, io->x, &blk->ln_ff, N);
    else norm_rows(m, io, io->h, io->x, &blk->ln_ff, 2 * l + 1);
    save(s.h2, io->h, (size_t)N * C);
    /* gate and up: side by side when the rows are 2F wide (forward.c), else
     * two [N][F] blocks (io->ff holds N x lens_ff_cols floats either way) */
    float *gate = io->ff, *up = io->ff_ld >= (size_t)2 * F ? io->ff + F : io->ff + (size_t)N * io->ff_ld;
    lens_gemm_linear_ld(gate, io->ff_ld, io->h, (size_t)C, &blk->gate, N, io->pool);
    lens_gemm_linear_ld(up, io->ff_ld, io->h, (size_t)C, &blk->ff_in, N, io->pool);
    for (int n = 0; io->cache && n < N; n++) {
        memcpy(s.gate + (size_t)n * F, gate + n * io->ff_ld, sizeof(float) * F);
        memcpy(s.up + (size_t)n * F, up + n * io->ff_ld, sizeof(float) * F);
    }
    lens_glu_forward(gate, gate, up, N, F, io->ff_ld, (lens_glu)c->glu);
    for (int n = 0; s.act && n < N; n++) memcpy(s.act + (size_t)n * F, gate + n * io->ff_ld, sizeof(float) * F);
    lens_gemm_linear_ld(io->h, (size_t)C, gate, io->ff_ld, &blk->ff_out, N, io->pool);
    if (c->post_norms) {
        save(s.f_pre, io->h, (size_t)N * C);
        rms(m, io->h, s.f_rstd, io->h, &blk->post_ff, N);
    }
    lens_residual_layernorm(io->pool, io->x, io->h, NULL, NULL, NULL, NULL, N, C, c->ln_eps);
}

/* d (N rows of NH heads, repeat_kv's output gradient) summed over each kv
 * group into N rows of NKV heads at the start of d (repeat_kv's backward). */
static void sum_kv(float *d, int N, int NKV, int NH, int D)
{
    if (NKV == NH) return;
    const int group = NH / NKV;
    float acc[LENS_DECODER_MAX_HEAD_DIM];
    /* destination (n, g) lies at or before its sources and before every later source */
    for (int n = 0; n < N; n++)
        for (int g = 0; g < NKV; g++) {
            const float *src = d + ((size_t)n * NH + (size_t)g * group) * D;
            for (int i = 0; i < D; i++) acc[i] = src[i];
            for (int j = 1; j < group; j++)
                for (int i = 0; i < D; i++) acc[i] += src[(size_t)j * D + i];
            memcpy(d + ((size_t)n * NKV + g) * D, acc, sizeof(float) * D);
        }
}

/* Backward of lens_decoder_block_forward: io->x = dL/dx' in, dL/dx out;
 * io->ff: two [N][F] blocks. Positions: row n of the cache at n (pos NULL)
 * or io->pos. */
void lens_decoder_block_backward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const int C = c->d_model, F = c->d_ff, NH = c->n_heads, NKV = lens_kv_heads(c), DK = c->d_head_k;
    const int off = c->norm_unit_offset;
    const decoder_saved s = decoder_slots(c, io->cache);
    int N = io->N;
    float *A = io->ff, *B = io->ff + (size_t)N * F;
    /* forward: x' = mid + post_ff(W_down act(gate, up)), gate / up = h2 W_gate / W_up, h2 = norm2(mid) */
    const float *df = io->x;
    if (c->post_norms) {
        memcpy(io->h, io->x, sizeof(float) * N * C);
        lens_rmsnorm_backward_inplace(io->h, grad_for(io, blk->post_ff.w), s.f_pre, s.f_rstd, blk->post_ff.w, off, N, C);
        df = io->h;
    }
    lens_block_linear_backward(io, A, 0, df, s.act, &blk->ff_out, N);
    memset(B, 0, sizeof(float) * N * F);
    lens_glu_backward(NULL, B, A, s.gate, s.up, N, F, (size_t)F, (lens_glu)c->glu); /* d up */
    lens_block_linear_backward(io, io->n, 0, B, s.h2, &blk->ff_in, N);
    memset(B, 0, sizeof(float) * N * F);
    lens_glu_backward(B, NULL, A, s.gate, s.up, N, F, (size_t)F, (lens_glu)c->glu); /* d gate */
    lens_block_linear_backward(io, io->n, 1, B, s.h2, &blk->gate, N);
    lens_rmsnorm_backward(io->x, grad_for(io, blk->ln_ff.w), io->n, s.mid, s.rstd2, blk->ln_ff.w, off, N, C);
    /* forward: mid = x + post_attn(ctx W_o) */
    const float *dout = io->x;
    if (c->post_norms) {
        memcpy(io->h, io->x, sizeof(float) * N * C);
        lens_rmsnorm_backward_inplace(io->h, grad_for(io, blk->post_attn.w), s.o_pre, s.o_rstd, blk->post_attn.w, off,
                                      N, C);
        dout = io->h;
    }
    lens_block_linear_backward(io, io->ctx, 0, dout, s.ctx, &blk->attn_out, N);
    if (io->attend_backward(io, l)) return;
    N = io->N; /* the hook may have expanded compacted rows */
    /* forward: q = rope(qk_norm(h1 W_q)), k = repeat(rope(qk_norm(h1 W_k))), v = repeat(h1 W_v) */
    sum_kv(io->k, N, NKV, NH, DK);
    sum_kv(io->v, N, NKV, NH, c->d_head_v);
    lens_decoder_rope(c, io->q, io->pos, N, N, NH, 1);
    lens_decoder_rope(c, io->k, io->pos, N, N, NKV, 1);
    if (c->qk_norm) {
        lens_rmsnorm_backward_inplace(io->q, grad_for(io, blk->q_norm.w), s.q_pre, s.q_rstd, blk->q_norm.w, 0, N * NH,
                                      DK);
        lens_rmsnorm_backward_inplace(io->k, grad_for(io, blk->k_norm.w), s.k_pre, s.k_rstd, blk->k_norm.w, 0,
                                      N * NKV, DK);
    }
    lens_block_linear_backward(io, io->n, 0, io->q, s.h1, &blk->q, N);
    lens_block_linear_backward(io, io->n, 1, io->k, s.h1, &blk->k, N);
    lens_block_linear_backward(io, io->n, 1, io->v, s.h1, &blk->v, N);
    lens_rmsnorm_backward(io->x, grad_for(io, blk->ln_attn.w), io->n, s.x_in, s.rstd1, blk->ln_attn.w, off, N, C);
}

/* t = J_rms t for the B copies of io (primal rows T, row r reads primal r % T); in place allowed. */
static void rms_jvp_copies(const lens_model *m, float *out, const float *t, const float *in, const float *rstd,
                           const float *w, int unit_offset, int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        lens_rmsnorm_jvp(out + (size_t)b * T * C, t + (size_t)b * T * C, in, rstd, w, unit_offset, T, C);
    (void)m;
}

/* JVP of lens_decoder_block_forward for the B = io->N / rows tangents in io->x. */
void lens_decoder_block_jvp(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const lens_block *blk = &m->p.blocks[l];
    const lens_block_cache *k = io->cache;
    const int C = c->d_model, F = c->d_ff, NH = c->n_heads, NKV = lens_kv_heads(c), DK = c->d_head_k;
    const int T = k->rows, N = io->N, B = N / T, off = c->norm_unit_offset;
    const decoder_saved s = decoder_slots(c, k);
    rms_jvp_copies(m, io->n, io->x, s.x_in, s.rstd1, blk->ln_attn.w, off, B, T, C);
    lens_block_linear_jvp(io, io->q, io->n, &blk->q, io->h, io->ff);
    lens_block_linear_jvp(io, io->k, io->n, &blk->k, io->h, io->ff);
    lens_block_linear_jvp(io, io->v, io->n, &blk->v, io->h, io->ff);
    if (c->qk_norm) {
        rms_jvp_copies(m, io->q, io->q, s.q_pre, s.q_rstd, blk->q_norm.w, 0, B, T * NH, DK);
        rms_jvp_copies(m, io->k, io->k, s.k_pre, s.k_rstd, blk->k_norm.w, 0, B, T * NKV, DK);
    }
    lens_decoder_rope(c, io->q, NULL, N, T, NH, 0);
    lens_decoder_rope(c, io->k, NULL, N, T, NKV, 0);
    lens_repeat_kv(io->k, N, NKV, NH, DK);
    lens_repeat_kv(io->v, N, NKV, NH, c->d_head_v);
    io->attend_jvp(io, l);
    lens_linear_jvp(io->h, io->ctx, &blk->attn_out, N, io->pool);
    if (c->post_norms) rms_jvp_copies(m, io->h, io->h, s.o_pre, s.o_rstd, blk->post_attn.w, off, B, T, C);
    lens_residual_forward(io->x, io->h, (size_t)N * C);
    rms_jvp_copies(m, io->n, io->x, s.mid, s.rstd2, blk->ln_ff.w, off, B, T, C);
    float *A = io->ff, *Bu = io->ff + (size_t)N * F;
    lens_linear_jvp(A, io->n, &blk->gate, N, io->pool);
    lens_linear_jvp(Bu, io->n, &blk->ff_in, N, io->pool);
    for (int b = 0; b < B; b++)
        lens_glu_jvp(A + (size_t)b * T * F, A + (size_t)b * T * F, Bu + (size_t)b * T * F, s.gate, s.up, T, F,
                     (size_t)F, (lens_glu)c->glu);
    lens_linear_jvp(io->h, A, &blk->ff_out, N, io->pool);
    if (c->post_norms) rms_jvp_copies(m, io->h, io->h, s.f_pre, s.f_rstd, blk->post_ff.w, off, B, T, C);
    lens_residual_forward(io->x, io->h, (size_t)N * C);
}

/* Final cache: model.norm's input [rows][C] and 1/rms [rows]. */
size_t lens_decoder_final_cache_floats(const lens_config *c, int for_weights)
{
    (void)for_weights;
    return (size_t)c->d_model + 1;
}

void lens_decoder_final_forward(const lens_model *m, lens_block_io *io)
{
    if (io->cache) {
        const size_t C = (size_t)m->cfg.d_model;
        memcpy(io->cache->buf, io->x, sizeof(float) * io->N * C);
        rms(m, io->x, io->cache->buf + (size_t)io->cache->rows * C, io->x, &m->p.ln_final, io->N);
        return;
    }
    norm_rows(m, io, io->x, io->x, &m->p.ln_final, 2 * m->cfg.n_layers);
}

void lens_decoder_final_backward(const lens_model *m, lens_block_io *io)
{
    const int C = m->cfg.d_model;
    const float *in = io->cache->buf, *rstd = in + (size_t)io->cache->rows * C;
    lens_rmsnorm_backward_inplace(io->x, grad_for(io, m->p.ln_final.w), in, rstd, m->p.ln_final.w,
                                  m->cfg.norm_unit_offset, io->N, C);
}

void lens_decoder_final_jvp(const lens_model *m, lens_block_io *io)
{
    const int C = m->cfg.d_model, T = io->cache->rows;
    const float *in = io->cache->buf, *rstd = in + (size_t)T * C;
    rms_jvp_copies(m, io->x, io->x, in, rstd, m->p.ln_final.w, m->cfg.norm_unit_offset, io->N / T, T, C);
}



void lens_decoder_attn_qk(const lens_model *m, int l, const float *h, int T, float *x, float *q, float *k)
{
    const lens_block *blk = &m->p.blocks[l];
    rms(m, x, NULL, h, &blk->ln_attn, T);
    project_qk(m, blk, x, T, NULL, q, k, NULL, NULL);
}

int lens_decoder_apply_preset(const lens_decoder_preset *ps, const char *name, lens_config *c)
{
    for (; ps->name; ps++) {
        if (strcmp(ps->name, name)) continue;
        c->n_layers = ps->layers, c->d_model = ps->hidden, c->n_heads = ps->heads, c->n_kv_heads = ps->kv_heads;
        c->d_head_k = c->d_head_v = c->rope.dim = ps->head_dim;
        c->d_ff = ps->ff, c->vocab_size = ps->vocab, c->max_positions = ps->positions;
        c->sliding_window = ps->window, c->tie_word_embeddings = ps->tie;
        /* micro: weights large enough that attention is far from uniform and
         * RoPE, windows and soft-caps change the outputs the tests compare */
        c->init_range = !strcmp(name, "micro") ? 0.25f : 0.02f;
        return 0;
    }
    return -1;
}
