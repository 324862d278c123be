/* decoder.h - the Llama-style decoder block shared by the llama, mistral,
 * qwen2, qwen3, gemma and gemma2 families (decoder.c has the block and the
 * HF tensor names; llama.c, qwen.c, gemma.c the config keys of each).
 * Shapes as in model.h; NKV key/value heads. */
#ifndef LENS_DECODER_H
#define LENS_DECODER_H

#include "core/model/arch.h"
#include "core/nn/glu.h"

#define LENS_DECODER_MAX_HEAD_DIM LENS_BLOCK_MAX_HEAD_DIM

/* The config keys of the Llama-style families (decoder.c) after
 * lens_hf_size_keys: max_position_embeddings (default 2048; alone, also
 * GPT-NeoX's), num_key_value_heads, rms_norm_eps, rope_theta, mlp_bias
 * (false only), RMSNorm. A family adds its head_dim, activation,
 * tie_word_embeddings, attention_bias, ... rows (the macros below) and runs
 * the hook. */
extern const lens_config_key lens_decoder_positions_keys[], lens_decoder_keys[];
#define LENS_DECODER_HEAD_DIM(...)                                                                                 \
    LENS_KEY("head_dim", LENS_KEY_INT, LENS_C(d_head_k), .min = 2, .max = LENS_DECODER_MAX_HEAD_DIM, __VA_ARGS__)
#define LENS_DECODER_SILU                                                                                          \
    LENS_KEY("hidden_act", LENS_KEY_CHOICE, LENS_C(glu), .def = LENS_GLU_SILU, .choices = lens_glu_choices)
#define LENS_DECODER_TIE(tied)                                                                                     \
    LENS_KEY("tie_word_embeddings", LENS_KEY_BOOL, LENS_C(tie_word_embeddings), .def = (tied))
/* attention_bias: biases on q, k, v and o */
#define LENS_DECODER_ATTENTION_BIAS                                                                                \
    LENS_KEY("attention_bias", LENS_KEY_BOOL, LENS_C(qkv_bias)),                                              \
        LENS_KEY("attention_bias", LENS_KEY_BOOL, LENS_C(o_bias))
/* sliding_window: null = full attention */
#define LENS_DECODER_WINDOW                                                                                        \
    LENS_KEY("sliding_window", LENS_KEY_INT, LENS_C(sliding_window), .min = 1, .max = 1 << 24,                 \
             .flags = LENS_KEY_NULL_OFF)
/* Mixture-of-experts keys (mixtral.c, qwen3_moe.c, olmoe.c): the expert
 * count under `key`, num_experts_per_tok (1..E), norm_topk_prob; Mixtral's
 * and OLMoE's constants (every layer MoE, experts intermediate_size wide). */
#define LENS_DECODER_EXPERTS(key, def_)                                                                            \
    LENS_KEY(key, LENS_KEY_INT, LENS_C(n_experts), .def = (def_), .min = 1, .max = LENS_MOE_MAX_EXPERTS),          \
        LENS_KEY("num_experts_per_tok", LENS_KEY_INT, LENS_C(top_k), .def = 2, .min = 1, .max = 0,              \
                 .max_dim = LENS_D_E)
#define LENS_DECODER_NORM_TOPK LENS_KEY("norm_topk_prob", LENS_KEY_BOOL, LENS_C(norm_topk))
#define LENS_DECODER_MOE_EVERY_LAYER                                                                               \
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(moe_step), .def = 1),                                                     \
        LENS_KEY(NULL, LENS_KEY_INT, LENS_C(d_ff_expert), .def = 1, .def_dim = LENS_D_F)
/* After the keys: v heads as wide as k, RoPE over the whole head (even), rope_scaling. */
int lens_decoder_config_hook(const struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
/* config.json beyond the keys: initializer_range, bos 0 / eos the last id
 * (ids), and rope_scaling (extra). */
int lens_decoder_config_ids(struct json_t *root, const lens_config *c);
int lens_decoder_config_extra(struct json_t *root, const lens_config *c);
/* layer_types ("sliding_attention" / "full_attention" per layer) into
 * sliding_pattern: full attention on every Nth layer ((l + 1) % N == 0, the
 * family's sliding_pattern_offset 1), anything else refused by name; and
 * the writer's extra with layer_types written (Gemma 3, gpt-oss). */
int lens_decoder_layer_types(const struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
int lens_decoder_config_extra_layer_types(struct json_t *root, const lens_config *c);
/* The writer's members the decoder families share. */
#define LENS_DECODER_CONSTANTS "{\"attention_dropout\": 0.0}"
#define LENS_DECODER_WRITER                                                                                        \
    .default_task = LENS_TASK_CAUSAL_LM, .config_constants = LENS_DECODER_CONSTANTS,                              \
    .config_extra = lens_decoder_config_extra

extern const lens_tensor_section lens_decoder_tensors[];
/* Its sections' rows, for decoder families with rows of their own:
 * model.embed_tokens; a layer's (the MLP rows on dense layers only);
 * model.norm and an untied lm_head. */
extern const lens_tensor_row lens_decoder_embedding_rows[], lens_decoder_layer_rows[], lens_decoder_final_rows[];
/* cfg qk_norm: 1 per head (Qwen3), LENS_QK_NORM_WHOLE over the whole q / k projection (OLMoE) */
#define LENS_QK_NORM_WHOLE 2
/* The block (and with l == L the final norm) of every decoder family here. */
void lens_decoder_block(const lens_model *m, int l, lens_block_prog *p);

/* A decoder family's mkmodel shape: micro / tiny for tests, 1b / 8b the real
 * models named in the family file. */
typedef struct {
    const char *name;
    int layers, hidden, heads, kv_heads, head_dim, ff, vocab, positions, window, tie;
} lens_decoder_preset;
int lens_decoder_apply_preset(const lens_decoder_preset *presets, const char *name, lens_config *c);
/* A mixture-of-experts family's preset: its decoder preset of the same name
 * plus E experts, K routed, each expert's width (0: d_ff). */
typedef struct {
    const char *name;
    int experts, top_k, ff_expert;
} lens_moe_preset;
int lens_moe_apply_preset(const lens_decoder_preset *presets, const lens_moe_preset *moe, const char *name,
                          lens_config *c);

/* The shared block's entries of a lens_family (llama.c, qwen.c, gemma.c). */
#define LENS_DECODER_FAMILY_FNS                                                                                    \
    .base_prefix = "model.", .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,                      \
    .tensors = lens_decoder_tensors, .block = lens_decoder_block

#endif
