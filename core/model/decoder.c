/* decoder.c - the Llama-style decoder block that llama.c, qwen.c and
 * gemma.c share (HF LlamaDecoderLayer, MistralDecoderLayer,
 * Qwen2/Qwen3DecoderLayer, GemmaDecoderLayer, Gemma2DecoderLayer), driven by
 * the lens_config flags the family files set from their config keys.
 *
 * HF tensor names: one table for all six families (lens_decoder_tensors),
 * its rows conditioned on the flags (q/k/v/o biases, Qwen3's q/k norms,
 * Gemma 2's post-norms, an untied lm_head); config keys: the shared tables
 * lens_hf_size_keys, lens_decoder_keys (after them the family's) and the hook.
 *
 * Block (pre-norm, RMSNorm with gain w or 1 + w):
 *   h = norm_1(x);  q = h W_q (+b), k = h W_k (+b), v = h W_v (+b)
 *   q, k = RMSNorm per head (Qwen3);  q, k = RoPE(q, k, position)
 *   k, v repeated to NH heads (HF repeat_kv: query head h reads kv head h / (NH/NKV))
 *   a = softmax(cap(scale q k^T) + causal / sliding-window mask) v;  o = a W_o (+b)
 *   x = x + post_attn(o)               (post_attn only with Gemma 2's post_norms)
 *   x = x + post_ff(W_down (act(h W_gate) * (h W_up))),  h = norm_2(x)
 * then model.norm after the last block. Embedding: E[id] times emb_scale
 * (Gemma: sqrt(C)). Norm statistics (io->ln_rstd): slot 2l norm_1, 2l + 1
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

#define DECODER_POSITIONS                                                                                          \
    LENS_KEY("max_position_embeddings", LENS_KEY_INT, LENS_C(max_positions), .def = 2048, .min = 1,                 \
             .max = 1 << 24)

const lens_config_key lens_decoder_positions_keys[] = {DECODER_POSITIONS, {0}};

const lens_config_key lens_decoder_keys[] = {
    DECODER_POSITIONS,
    LENS_KEY("num_key_value_heads", LENS_KEY_INT, LENS_C(n_kv_heads), .def = 1, .def_dim = LENS_D_NH, .min = 1,
             .max = 0, .max_dim = LENS_D_NH),
    LENS_KEY("rms_norm_eps", LENS_KEY_FLOAT, LENS_C(ln_eps), .def = 1e-6, .min = 0, .max = 1,
             .flags = LENS_KEY_OPEN_MIN | LENS_KEY_OPEN_MAX),
    LENS_KEY("rope_theta", LENS_KEY_DOUBLE, LENS_C(rope.theta), .def = 10000, .min = 1, .max = INFINITY,
             .flags = LENS_KEY_OPEN_MIN),
    LENS_KEY("mlp_bias", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(norm_rms), .def = 1),
    {0}};

/* rope_scaling: null, {"rope_type" | "type": "default" | "linear" | "llama3", ...}. */
static int parse_rope_scaling(const json_t *root, const char *path, lens_rope_params *r, lens_err *err)
{
    const json_t *s = json_object_get(root, "rope_scaling");
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

int lens_decoder_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (cfg->d_head_k % 2) return lens_fail(err, LENS_EFORMAT, "%s: head_dim %d must be even for RoPE", path, cfg->d_head_k);
    cfg->d_head_v = cfg->rope.dim = cfg->d_head_k;
    return parse_rope_scaling(root, path, &cfg->rope, err);
}

int lens_decoder_config_ids(json_t *root, const lens_config *c)
{
    return json_object_set_new(root, "initializer_range", lens_json_float(c->init_range > 0 ? c->init_range : 0.02f)) ||
           json_object_set_new(root, "bos_token_id", json_integer(0)) ||
           json_object_set_new(root, "eos_token_id", json_integer(c->vocab_size - 1));
}

int lens_decoder_config_extra(json_t *root, const lens_config *c)
{
    const lens_rope_params *r = &c->rope;
    json_t *scaling = json_null();
    if (r->type == LENS_ROPE_LLAMA3)
        scaling = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", r->factor, "low_freq_factor",
                            r->low_freq_factor, "high_freq_factor", r->high_freq_factor,
                            "original_max_position_embeddings", r->original_max_positions);
    else if (r->type == LENS_ROPE_LINEAR)
        scaling = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", r->factor);
    return json_object_set_new(root, "rope_scaling", scaling) || lens_decoder_config_ids(root, c);
}

/* ------------------------------------------------------------ tensors */

static const lens_tensor_row decoder_embedding_rows[] = {
    LENS_ROW("model.embed_tokens.weight", LENS_P(tok_emb), LENS_T_EMBEDDING, LENS_D_V, LENS_D_C),
    {0}};

static const lens_tensor_row decoder_layer_rows[] = {
    LENS_ROW("self_attn.q_proj", LENS_B(q), LENS_T_LINEAR_NB, LENS_D_QK, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.k_proj", LENS_B(k), LENS_T_LINEAR_NB, LENS_D_KV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.v_proj", LENS_B(v), LENS_T_LINEAR_NB, LENS_D_KVV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.o_proj", LENS_B(attn_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_VO, .bias_if = LENS_IF_O_BIAS),
    LENS_ROW("self_attn.q_norm", LENS_B(q_norm), LENS_T_RMSNORM, LENS_D_DK, LENS_D_NONE,
             .when = LENS_IF_QK_NORM, .init = LENS_INIT_NOISE),
    LENS_ROW("self_attn.k_norm", LENS_B(k_norm), LENS_T_RMSNORM, LENS_D_DK, LENS_D_NONE,
             .when = LENS_IF_QK_NORM, .init = LENS_INIT_NOISE),
    LENS_ROW("mlp.gate_proj", LENS_B(gate), LENS_T_LINEAR_NB, LENS_D_F, LENS_D_C),
    LENS_ROW("mlp.up_proj", LENS_B(ff_in), LENS_T_LINEAR_NB, LENS_D_F, LENS_D_C),
    LENS_ROW("mlp.down_proj", LENS_B(ff_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_F),
    LENS_ROW("input_layernorm", LENS_B(ln_attn), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("post_attention_layernorm", LENS_B(post_attn), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .when = LENS_IF_POST_NORMS, .init = LENS_INIT_NOISE),
    LENS_ROW("pre_feedforward_layernorm", LENS_B(ln_ff), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .when = LENS_IF_POST_NORMS, .init = LENS_INIT_NOISE),
    LENS_ROW("post_feedforward_layernorm", LENS_B(post_ff), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .when = LENS_IF_POST_NORMS, .init = LENS_INIT_NOISE),
    LENS_ROW("post_attention_layernorm", LENS_B(ln_ff), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE,
             .when = LENS_IF_NO_POST_NORMS, .init = LENS_INIT_NOISE),
    {0}};

static const lens_tensor_row decoder_final_rows[] = {
    LENS_ROW("model.norm", LENS_P(ln_final), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("lm_head", LENS_P(lm_head), LENS_T_LINEAR_NB, LENS_D_V, LENS_D_C, .when = LENS_IF_UNTIED_LM),
    {0}};

const lens_tensor_section lens_decoder_tensors[] = {
    {"", 0, decoder_embedding_rows},
    {"model.layers.%d.", 1, decoder_layer_rows},
    {"", 0, decoder_final_rows},
    {0}};

/* ------------------------------------------------------------ forward */

void lens_decoder_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *mean,
                        float *rstd)
{
    (void)type_ids, (void)mean, (void)rstd; /* no segments, no embedding norm */
    const int C = m->cfg.d_model;
    const float scale = m->cfg.emb_scale > 0 ? m->cfg.emb_scale : 1.0f;
    const lens_dtype dt = m->p.emb_dtype;
    for (int t = 0; t < T; t++) {
        float *row = x + (size_t)t * C;
        lens_widen(row, lens_dtype_at(m->p.tok_emb, dt, (size_t)ids[t] * C), dt, (size_t)C);
        for (int i = 0; i < C; i++) row[i] *= scale;
    }
}

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
