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

/* The block, pre-norm with RMSNorm (statistics: slot 2l norm_1, 2l + 1
 * norm_2, 2L the final norm; ln_mean gets 0):
 *   h = norm_1(x); q, k, v = h W (+b); q, k = qk_norm (Qwen3), RoPE; k, v repeated
 *   x = x + post_attn(Attn W_o)               (post_attn: Gemma 2's post_norms)
 *   x = x + post_ff(W_down (act(h W_gate) * (h W_up))),  h = norm_2(x) */
void lens_decoder_block(const lens_model *m, int l, lens_block_prog *p)
{
    const lens_config *c = &m->cfg;
    const int NH = c->n_heads, NKV = lens_kv_heads(c);
    if (l == c->n_layers) {
        lens_op_final_norm(p, m);
        return;
    }
    const lens_block *b = &m->p.blocks[l];
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_attn, 2 * l);
    lens_op_linear(p, LENS_R_Q, LENS_R_H, &b->q);
    lens_op_linear(p, LENS_R_K, LENS_R_H, &b->k);
    lens_op_linear(p, LENS_R_V, LENS_R_H, &b->v);
    if (c->qk_norm) {
        lens_op_qk_norm(p, LENS_R_Q, &b->q_norm, NH, c->d_head_k);
        lens_op_qk_norm(p, LENS_R_K, &b->k_norm, NKV, c->d_head_k);
    }
    lens_op_rope(p, LENS_R_Q, NH);
    lens_op_rope(p, LENS_R_K, NKV);
    lens_op_repeat_kv(p, LENS_R_K, NKV);
    lens_op_repeat_kv(p, LENS_R_V, NKV);
    lens_op_attend(p);
    lens_op_linear(p, LENS_R_H, LENS_R_CTX, &b->attn_out);
    if (c->post_norms) lens_op_norm(p, LENS_R_N, LENS_R_H, &b->post_attn, -1);
    lens_op_add(p, LENS_R_X, c->post_norms ? LENS_R_N : LENS_R_H);
    lens_op_tail(p);
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_ff, 2 * l + 1);
    lens_op_linear(p, LENS_R_FF, LENS_R_H, &b->gate);
    lens_op_linear(p, LENS_R_UP, LENS_R_H, &b->ff_in);
    lens_op_glu(p);
    lens_op_linear(p, LENS_R_H, LENS_R_FF, &b->ff_out);
    if (c->post_norms) lens_op_norm(p, LENS_R_N, LENS_R_H, &b->post_ff, -1);
    lens_op_add(p, LENS_R_X, c->post_norms ? LENS_R_N : LENS_R_H);
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
