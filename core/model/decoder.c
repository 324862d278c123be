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
 *   or x = x + MoE(norm_2(x)) on a mixture-of-experts layer (mixtral.c, qwen3_moe.c, olmoe.c)
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
/* A yarn member: its number, def when absent or null. */
static double yarn_number(const json_t *s, const char *key, double def)
{
    const json_t *v = json_object_get(s, key);
    return v && !json_is_null(v) ? json_number_value(v) : def;
}

/* rope_scaling yarn (HF _compute_yarn_parameters, what gpt-oss configs use):
 * factor, beta_fast (32), beta_slow (1), original_max_position_embeddings
 * (max_position_embeddings; when given, factor must equal
 * max_position_embeddings / it, as in gpt-oss's 131072 / 4096 = 32),
 * truncate (true), attention_factor (0.1 ln factor + 1); DeepSeek's mscale /
 * mscale_all_dim are refused by name. */
static int parse_yarn(const json_t *s, const char *path, lens_rope_params *r, int max_positions, lens_err *err)
{
    static const char *const refused[] = {"mscale", "mscale_all_dim"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(s, refused[i]);
        if (v && !json_is_null(v))
            return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling.%s is not supported (yarn with factor, beta_fast, "
                             "beta_slow, original_max_position_embeddings, truncate, attention_factor)", path,
                             refused[i]);
    }
    const json_t *truncate = json_object_get(s, "truncate");
    r->type = LENS_ROPE_YARN;
    r->beta_fast = yarn_number(s, "beta_fast", 32);
    r->beta_slow = yarn_number(s, "beta_slow", 1);
    r->original_max_positions = (int)yarn_number(s, "original_max_position_embeddings", max_positions);
    /* transformers replaces factor by max_position_embeddings / original_max_position_embeddings when the
     * latter is given (older versions did not): a config where the two differ means different models */
    const double ratio = (double)max_positions / r->original_max_positions;
    if (json_object_get(s, "original_max_position_embeddings") && fabs(ratio - r->factor) > 1e-9 * r->factor)
        return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling yarn factor %g differs from max_position_embeddings / "
                         "original_max_position_embeddings = %d / %d, which transformers uses instead (older "
                         "versions use factor); lensd refuses the ambiguity", path, r->factor, max_positions,
                         r->original_max_positions);
    r->truncate = !truncate || json_is_null(truncate) || json_is_true(truncate);
    r->attention_factor = yarn_number(s, "attention_factor", r->factor > 1 ? 0.1 * log(r->factor) + 1.0 : 1.0);
    if (!(r->beta_fast > 0) || !(r->beta_slow > 0) || r->original_max_positions < 1 || !(r->attention_factor > 0))
        return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling yarn needs beta_fast > 0, beta_slow > 0, "
                         "original_max_position_embeddings >= 1 and attention_factor > 0", path);
    return 0;
}

static int parse_rope_scaling(const json_t *root, const char *path, lens_rope_params *r, int max_positions,
                              lens_err *err)
{
    const json_t *s = json_object_get(root, "rope_scaling");
    r->type = LENS_ROPE_DEFAULT;
    if (!s || json_is_null(s)) return 0;
    if (!json_is_object(s)) return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling must be an object or null", path);
    const char *type = json_string_value(json_object_get(s, "rope_type"));
    if (!type) type = json_string_value(json_object_get(s, "type"));
    if (!type || !strcmp(type, "default")) return 0;
    if (strcmp(type, "linear") && strcmp(type, "llama3") && strcmp(type, "yarn"))
        return lens_fail(err, LENS_EFORMAT,
                         "%s: rope_scaling type \"%s\" is not supported (default, linear, llama3, yarn)", path, type);
    const double factor = json_number_value(json_object_get(s, "factor"));
    if (!(factor > 0)) return lens_fail(err, LENS_EFORMAT, "%s: rope_scaling.factor must be > 0", path);
    r->factor = factor;
    if (!strcmp(type, "linear")) {
        r->type = LENS_ROPE_LINEAR;
        return 0;
    }
    if (!strcmp(type, "yarn")) return parse_yarn(s, path, r, max_positions, err);
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
    return parse_rope_scaling(root, path, &cfg->rope, cfg->max_positions, err);
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
    else if (r->type == LENS_ROPE_YARN)
        scaling = json_pack("{s:s, s:f, s:f, s:f, s:i, s:b}", "rope_type", "yarn", "factor", r->factor, "beta_fast",
                            r->beta_fast, "beta_slow", r->beta_slow, "original_max_position_embeddings",
                            r->original_max_positions, "truncate", r->truncate);
    else if (r->type == LENS_ROPE_LINEAR)
        scaling = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", r->factor);
    return json_object_set_new(root, "rope_scaling", scaling) || lens_decoder_config_ids(root, c);
}

/* layer_types: "sliding_attention" or "full_attention" per layer. lensd
 * runs HF's default form of it, full attention on every Nth layer (N the
 * first full layer's l + 1; none full: every layer windowed), which every
 * Gemma 3 and gpt-oss checkpoint has; another list is refused by name. */
int lens_decoder_layer_types(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    const json_t *types = json_object_get(root, "layer_types");
    if (!types || json_is_null(types)) return 0; /* sliding_window_pattern says */
    if (!json_is_array(types) || json_array_size(types) != (size_t)cfg->n_layers)
        return lens_fail(err, LENS_EFORMAT, "%s: \"layer_types\" must be a list of num_hidden_layers = %d entries",
                         path, cfg->n_layers);
    int pattern = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        const int full = t && !strcmp(t, "full_attention");
        if (!full && !(t && !strcmp(t, "sliding_attention")))
            return lens_fail(err, LENS_EFORMAT,
                             "%s: \"layer_types\"[%d] = \"%.40s\" is not supported (sliding_attention, full_attention)",
                             path, l, t ? t : "(not a string)");
        if (full && !pattern) pattern = l + 1;
        if (full != (pattern && (l + 1) % pattern == 0))
            return lens_fail(err, LENS_EFORMAT,
                             "%s: \"layer_types\"[%d] = \"%s\" breaks full attention every %d layers, the only "
                             "pattern lensd runs (HF's sliding_window_pattern)", path, l, t, pattern);
    }
    cfg->sliding_pattern = pattern;
    return 0;
}

/* layer_types as transformers writes it, then the decoders' members. */
int lens_decoder_config_extra_layer_types(json_t *root, const lens_config *c)
{
    json_t *types = json_array();
    for (int l = 0; types && l < c->n_layers; l++)
        if (json_array_append_new(types, json_string(c->sliding_pattern && (l + 1) % c->sliding_pattern == 0
                                                         ? "full_attention"
                                                         : "sliding_attention")))
            return -1;
    return !types || json_object_set_new(root, "layer_types", types) || lens_decoder_config_extra(root, c);
}

/* ------------------------------------------------------------ tensors */

const lens_tensor_row lens_decoder_embedding_rows[] = {
    LENS_ROW("model.embed_tokens.weight", LENS_P(tok_emb), LENS_T_EMBEDDING, LENS_D_V, LENS_D_C),
    {0}};

const lens_tensor_row lens_decoder_layer_rows[] = {
    LENS_ROW("self_attn.q_proj", LENS_B(q), LENS_T_LINEAR_NB, LENS_D_QK, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.k_proj", LENS_B(k), LENS_T_LINEAR_NB, LENS_D_KV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.v_proj", LENS_B(v), LENS_T_LINEAR_NB, LENS_D_KVV, LENS_D_C, .bias_if = LENS_IF_QKV_BIAS),
    LENS_ROW("self_attn.o_proj", LENS_B(attn_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_VO, .bias_if = LENS_IF_O_BIAS),
    LENS_ROW("self_attn.q_norm", LENS_B(q_norm), LENS_T_RMSNORM, LENS_D_DK, LENS_D_NONE,
             .when = LENS_IF_QK_NORM, .init = LENS_INIT_NOISE),
    LENS_ROW("self_attn.k_norm", LENS_B(k_norm), LENS_T_RMSNORM, LENS_D_DK, LENS_D_NONE,
             .when = LENS_IF_QK_NORM, .init = LENS_INIT_NOISE),
    LENS_ROW("mlp.gate_proj", LENS_B(gate), LENS_T_LINEAR_NB, LENS_D_F, LENS_D_C, .when = LENS_IF_DENSE),
    LENS_ROW("mlp.up_proj", LENS_B(ff_in), LENS_T_LINEAR_NB, LENS_D_F, LENS_D_C, .when = LENS_IF_DENSE),
    LENS_ROW("mlp.down_proj", LENS_B(ff_out), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_F, .when = LENS_IF_DENSE),
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

const lens_tensor_row lens_decoder_final_rows[] = {
    LENS_ROW("model.norm", LENS_P(ln_final), LENS_T_RMSNORM, LENS_D_C, LENS_D_NONE, .init = LENS_INIT_NOISE),
    LENS_ROW("lm_head", LENS_P(lm_head), LENS_T_LINEAR_NB, LENS_D_V, LENS_D_C, .when = LENS_IF_UNTIED_LM),
    {0}};

const lens_tensor_section lens_decoder_tensors[] = {
    {"", 0, lens_decoder_embedding_rows},
    {"model.layers.%d.", 1, lens_decoder_layer_rows},
    {"", 0, lens_decoder_final_rows},
    {0}};

/* ------------------------------------------------------------ the block */

/* The block, pre-norm with RMSNorm (statistics: slot 2l norm_1, 2l + 1
 * norm_2, 2L the final norm; ln_mean gets 0):
 *   h = norm_1(x); q, k, v = h W (+b); q, k = qk_norm (Qwen3), RoPE; k, v repeated
 *   x = x + post_attn(Attn W_o)               (post_attn: Gemma 2's post_norms)
 *   x = x + post_ff(W_down (act(h W_gate) * (h W_up))),  h = norm_2(x)
 * or on a mixture-of-experts layer x = x + MoE(norm_2(x)) (core/nn/moe.h). */
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
    if (c->qk_norm) { /* per head, or over the whole projection (OLMoE) */
        const int whole = c->qk_norm == LENS_QK_NORM_WHOLE;
        lens_op_qk_norm(p, LENS_R_Q, &b->q_norm, NH, whole ? NH * c->d_head_k : c->d_head_k);
        lens_op_qk_norm(p, LENS_R_K, &b->k_norm, NKV, whole ? NKV * c->d_head_k : c->d_head_k);
    }
    lens_op_rope(p, LENS_R_Q, NH, lens_layer_rope(c, l));
    lens_op_rope(p, LENS_R_K, NKV, lens_layer_rope(c, l));
    lens_op_repeat_kv(p, LENS_R_K, NKV);
    lens_op_repeat_kv(p, LENS_R_V, NKV);
    lens_op_attend(p);
    lens_op_linear(p, LENS_R_H, LENS_R_CTX, &b->attn_out);
    if (c->post_norms) lens_op_norm(p, LENS_R_N, LENS_R_H, &b->post_attn, -1);
    lens_op_add(p, LENS_R_X, c->post_norms ? LENS_R_N : LENS_R_H);
    lens_op_tail(p);
    lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_ff, 2 * l + 1);
    if (lens_layer_moe(c, l)) {
        lens_op_moe(p, LENS_R_N, LENS_R_H, b);
        lens_op_add(p, LENS_R_X, LENS_R_N);
        return;
    }
    lens_op_gated_mlp(p, LENS_R_H, b);
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

int lens_moe_apply_preset(const lens_decoder_preset *presets, const lens_moe_preset *moe, const char *name,
                          lens_config *c)
{
    if (lens_decoder_apply_preset(presets, name, c)) return -1;
    for (; moe->name; moe++)
        if (!strcmp(moe->name, name)) {
            c->n_experts = moe->experts, c->top_k = moe->top_k;
            c->d_ff_expert = moe->ff_expert ? moe->ff_expert : c->d_ff;
            return 0;
        }
    return -1;
}
