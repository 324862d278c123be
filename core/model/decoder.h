/* decoder.h - the Llama-style decoder block shared by the llama, mistral,
 * qwen2, qwen3, gemma and gemma2 families (decoder.c has the block and the
 * HF tensor names; llama.c, qwen.c, gemma.c the config keys of each).
 * Shapes as in model.h; NKV key/value heads. */
#ifndef LENS_DECODER_H
#define LENS_DECODER_H

#include <stdio.h>

#include "core/model/arch.h"
#include "core/nn/glu.h"

#define LENS_DECODER_MAX_HEAD_DIM 4096

/* hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
 * vocab_size, max_position_embeddings (also GPT-NeoX's). */
int lens_decoder_parse_shape(struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
/* A new causal LM config named arch (mkmodel): RMSNorm eps 1e-6, SwiGLU,
 * rope_theta 10000; task must be NULL or causal-lm. */
int lens_decoder_new_config(lens_config *c, const char *task, const char *arch, lens_err *err);
/* The keys every Llama-style config has: hidden_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
 * vocab_size, max_position_embeddings, rms_norm_eps, rope_theta,
 * rope_scaling, tie_word_embeddings (default tie_default), mlp_bias (false only). */
int lens_decoder_parse_keys(struct json_t *root, const char *path, lens_config *cfg, int tie_default, lens_err *err);
/* The gate activation from key (hidden_act, hidden_activation), fallback when absent. */
int lens_decoder_parse_act(struct json_t *root, const char *path, const char *key, const char *fallback,
                           lens_config *cfg, lens_err *err);
/* sliding_window (null / absent = full attention). */
int lens_decoder_parse_window(struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
/* Writes the common keys above (one per line, each ending ",\n"). */
void lens_decoder_write_common(FILE *f, const lens_config *c);

void lens_decoder_walk(const lens_config *c, lens_params *p, lens_param_visitor *v);
void lens_decoder_block_forward(const lens_model *m, lens_block_io *io, int l);
void lens_decoder_final_forward(const lens_model *m, lens_block_io *io);
/* The block contract (arch.h): backward, JVP, cache sizes, final norm. */
void lens_decoder_block_backward(const lens_model *m, lens_block_io *io, int l);
void lens_decoder_block_jvp(const lens_model *m, lens_block_io *io, int l);
size_t lens_decoder_cache_floats(const lens_config *c, int for_weights);
size_t lens_decoder_final_cache_floats(const lens_config *c, int for_weights);
void lens_decoder_final_backward(const lens_model *m, lens_block_io *io);
void lens_decoder_final_jvp(const lens_model *m, lens_block_io *io);
void lens_decoder_attn_qk(const lens_model *m, int l, const float *h, int T, float *x, float *q, float *k);

/* RoPE of x [N][H*DK] (forward, or its transpose when back) on c's rotary
 * channels: positions pos, or with pos NULL row n of each block of `rows`
 * rows at n % rows (the copies of one sequence). */
void lens_decoder_rope(const lens_config *c, float *x, const int *pos, int N, int rows, int H, int back);

/* GQA: x holds [N][NKV*D] compact at its start; on return [N][NH*D], kv
 * head g repeated for query heads g*NH/NKV .. (g+1)*NH/NKV - 1 (HF repeat_kv). */
void lens_repeat_kv(float *x, int N, int NKV, int NH, int D);

/* A decoder family's mkmodel shape: micro / tiny for tests, 1b / 8b the real
 * models named in the family file. */
typedef struct {
    const char *name;
    int layers, hidden, heads, kv_heads, head_dim, ff, vocab, positions, window, tie;
} lens_decoder_preset;
int lens_decoder_apply_preset(const lens_decoder_preset *presets, const char *name, lens_config *c);

/* The shared block's entries of a lens_family (llama.c, qwen.c, gemma.c). */
#define LENS_DECODER_FAMILY_FNS                                                                                    \
    .base_prefix = "model.", .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,                      \
    .walk = lens_decoder_walk, .block_forward = lens_decoder_block_forward,           \
    .final_forward = lens_decoder_final_forward, .block_backward = lens_decoder_block_backward,                    \
    .block_jvp = lens_decoder_block_jvp, .cache_floats = lens_decoder_cache_floats,                                \
    .final_cache_floats = lens_decoder_final_cache_floats, .final_backward = lens_decoder_final_backward,          \
    .final_jvp = lens_decoder_final_jvp, .attn_qk = lens_decoder_attn_qk /* mistral, gemma2: the gradient analyses' attention has no window / cap */

#endif
