/* model.h - BERT and GPT-2 checkpoints and their forward pass.
 *
 * A lens_model is a Hugging Face checkpoint folder loaded once (config.json,
 * model.safetensors, tokenizer files) and then only read: any number of
 * threads may call lens_forward on the same model concurrently.
 *
 * Shapes use one vocabulary: S sequences in a batch, T tokens of one
 * sequence, N = sum of T over the batch (rows are packed, padding is never
 * computed), C = d_model, L layers, NH heads, DK / DV per-head key / value
 * size, V vocabulary, K labels. */
#ifndef LENS_MODEL_H
#define LENS_MODEL_H

#include <math.h>
#include <stddef.h>

#include "core/base/err.h"
#include "core/base/pool.h"
#include "core/io/safetensors.h"
#include "core/io/tokenizer.h"
#include "core/nn/linear.h"
#include "core/nn/moe.h"
#include "core/nn/rope.h"
#include "core/nn/scores.h"

/* A model family: its config keys, tensor names, forward and capabilities
 * (core/model/arch.h). */
typedef struct lens_family lens_family;

typedef enum {
    LENS_TASK_ENCODER,        /* BertModel: hidden states only */
    LENS_TASK_CLASSIFICATION, /* BertForSequenceClassification */
    LENS_TASK_MASKED_LM,      /* BertForMaskedLM */
    LENS_TASK_CAUSAL_LM       /* GPT2LMHeadModel */
} lens_task;

typedef struct {
    const lens_family *family; /* from config "model_type" */
    lens_task task;
    char architecture[64]; /* config "architectures"[0], e.g. "BertForMaskedLM" */
    int n_layers, n_heads, d_model, d_ff;
    int d_head_k, d_head_v;  /* per head; d_model / n_heads unless configured */
    int head_combination;    /* identifiable variant: LENS_HEADS_CONCAT (0), LENS_HEADS_SUM, LENS_HEADS_SUM_ADJACENT */
    int scale_by_dv;         /* config "attention_scale": "DV" (declare-lab's code scales by its value size) */
    float attn_scale;        /* score scale 1/sqrt(DK), or 1/sqrt(DV) with scale_by_dv: lens_config_set_attn_scale */
    int vocab_size, max_positions, type_vocab_size;
    float ln_eps;
    int gelu_tanh;           /* 1: tanh approximation (gelu_new), 0: exact erf */
    int head_relu;           /* classifier's first-token layer: 1 ReLU (DistilBERT pre_classifier), 0 tanh (pooler) */
    int pool_mean;           /* classifier reads the mean of the sequence's rows (ModernBERT classifier_pooling
                                "mean"), else its first row */
    int position_offset;     /* first position id (RoBERTa: padding_idx + 1); the table has
                                max_positions + position_offset rows */
    int pad_token_id;
    int n_labels;            /* classification only, else 0 */
    char **labels;           /* id2label[n_labels], or NULL */
    int random_weights;      /* written by lens_mkmodel ("lensd_random_weights"): not a trained model */
    int text_tower;          /* the text tower of a multimodal wrapper (config "text_config"; tensors
                                under "language_model." or "<base prefix>language_model.") */
    /* Modern decoders (core/model/decoder.c, gpt_neox.c; 0 = off for the others): */
    int n_kv_heads;          /* grouped-query attention: key/value heads, NH a multiple (0 = NH) */
    lens_rope_params rope;   /* rotary embeddings (rope.dim 0: learned / no positions) */
    lens_rope_params rope_local; /* of the sliding-window layers when theta > 0 (Gemma 3's
                                    rope_local_base_freq), else theirs is rope */
    int norm_rms;            /* 1: RMSNorm (no bias, no mean), 0: LayerNorm */
    int norm_unit_offset;    /* RMSNorm gain 1 + w (Gemma) */
    int glu;                 /* gated MLP activation (lens_glu), 0: plain W2 act(W1 x) */
    int qkv_bias, o_bias;    /* q/k/v (Qwen2, attention_bias) and o_proj biases */
    int qk_norm;             /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int post_norms;          /* Gemma 2: RMSNorm after attention and after the MLP, before the residual add */
    int parallel_residual;   /* GPT-NeoX: x + Attn(LN1(x)) + MLP(LN2(x)) */
    int attn_sinks;          /* gpt-oss: a learned per-head logit in each softmax denominator (lens_block.sinks) */
    int sliding_window;      /* keys i - j < W only (0 = full causal) */
    int sliding_pattern;     /* N > 0: every Nth layer (l + offset a multiple of N) has full attention, the
                                others the window (HF's sliding_window_pattern / layer_types: Gemma 2
                                N = 2, Gemma 3 N = 6); 0: the window on every layer */
    int sliding_pattern_offset; /* ... full attention when (l + offset) % N == 0: Gemma 1, ModernBERT 0 */
    int window_bidirectional; /* the window is |i - j| <= W / 2 (ModernBERT's local_attention W), not causal */
    float attn_softcap;      /* scores = cap tanh(scores / cap) before the softmax (0 = off) */
    float final_softcap;     /* the same on the LM logits */
    float query_pre_attn_scalar; /* scores scaled by its -1/2 power instead of DK's (Gemma 2; 0 = DK) */
    float emb_scale;         /* embeddings times this (Gemma: sqrt(C) rounded to the model dtype; 0 = 1) */
    int tie_word_embeddings; /* decoders: LM head = token embeddings (else lm_head / embed_out) */
    float init_range;        /* decoders' initializer_range: mkmodel's weight std (0 = 0.02) */
    /* Mixture of experts (core/nn/moe.h; 0 experts = a dense MLP on every layer): */
    int n_experts, top_k;    /* E experts, K routed per token */
    int norm_topk;           /* gate weights renormalised over the K chosen (Mixtral always; norm_topk_prob) */
    int d_ff_expert;         /* each expert's width (Qwen3-MoE moe_intermediate_size; else d_ff) */
    int moe_step;            /* decoder_sparse_step: layer l is MoE when (l + 1) % step == 0 */
    unsigned char mlp_only[LENS_MOE_MAX_LAYERS / 8]; /* Qwen3-MoE mlp_only_layers: bit l = dense layer l */
} lens_config;

/* 1 when layer l (0-based) of c has a mixture-of-experts MLP. */
static inline int lens_layer_moe(const lens_config *c, int l)
{
    return c->n_experts > 0 && l >= 0 && c->moe_step > 0 && (l + 1) % c->moe_step == 0 &&
           !(l < LENS_MOE_MAX_LAYERS && (c->mlp_only[l / 8] >> (l % 8) & 1));
}

/* The sliding window of layer l (0-based) of c, 0 = full attention. */
static inline int lens_layer_window(const lens_config *c, int l)
{
    return c->sliding_window && (!c->sliding_pattern || (l + c->sliding_pattern_offset) % c->sliding_pattern)
               ? c->sliding_window
               : 0;
}
/* The RoPE of layer l: rope_local on sliding-window layers when set, else rope. */
static inline const lens_rope_params *lens_layer_rope(const lens_config *c, int l)
{
    return c->rope_local.theta > 0 && lens_layer_window(c, l) ? &c->rope_local : &c->rope;
}
/* How layer l (0-based) of c scores (core/nn/scores.h); causal: the caller's
 * mask (a bidirectional window W run causally keeps its W / 2 + 1 keys up to i). */
static inline lens_score_fn lens_layer_scores(const lens_config *c, int l, int causal)
{
    const int window = lens_layer_window(c, l), bidirectional = window && c->window_bidirectional;
    return (lens_score_fn){.scale = c->attn_scale, .softcap = c->attn_softcap,
                           .causal = causal || (window > 0 && !bidirectional),
                           .window = bidirectional && causal ? window / 2 + 1 : window};
}

/* Key/value heads and the key/value head that query head h reads (GQA). */
static inline int lens_kv_heads(const lens_config *c) { return c->n_kv_heads ? c->n_kv_heads : c->n_heads; }
static inline int lens_kv_head_of(const lens_config *c, int h) { return h / (c->n_heads / lens_kv_heads(c)); }

/* config "head_combination" (docs/identifiable-encoder.md). A summed model's
 * attention.output.dense.weight is [C][DV]; the loader expands it to the
 * concat layout [C][NH*DV] whose column m repeats column
 * lens_head_summed_column(m), so lens_params always describes a concat model:
 *   SUM:          o = sum_h o_h                    (the paper): column m % DV
 *   SUM_ADJACENT: o[i] = sum_j concat(o_h)[i*NH+j] (declare-lab's code): m / NH */
enum { LENS_HEADS_CONCAT = 0, LENS_HEADS_SUM = 1, LENS_HEADS_SUM_ADJACENT = 2 };
int lens_head_combination_parse(const char *name, int *combine); /* -1: unknown name */
const char *lens_head_combination_name(int combine);
static inline int lens_head_summed_column(const lens_config *c, int m)
{
    return c->head_combination == LENS_HEADS_SUM_ADJACENT ? m / c->n_heads : m % c->d_head_v;
}

/* attn_scale from d_head_k / d_head_v, scale_by_dv and YaRN's attention factor; every code that fills
 * a lens_config by hand calls it after setting the head sizes. */
static inline void lens_config_set_attn_scale(lens_config *c)
{
    c->attn_scale = c->query_pre_attn_scalar > 0 ? 1.0f / sqrtf(c->query_pre_attn_scalar)
                                                 : 1.0f / sqrtf((float)(c->scale_by_dv ? c->d_head_v : c->d_head_k));
    /* YaRN scales cos and sin, so q and k, by attention_factor: scores by its square */
    if (c->rope.type == LENS_ROPE_YARN) c->attn_scale *= (float)(c->rope.attention_factor * c->rope.attention_factor);
}

int lens_config_load(const char *path, lens_config *cfg, lens_err *err);
void lens_config_free(lens_config *cfg);
const char *lens_task_name(lens_task task); /* "classification", ... as in API.md */
int lens_task_parse(const char *name, lens_task *task); /* -1: unknown name */

typedef struct {
    lens_linear q, k, v, attn_out; /* q,k: C -> NH*DK, v: C -> NH*DV, attn_out: NH*DV -> C */
    lens_layernorm ln_attn;        /* BERT: after attention (post-LN); GPT-2: ln_1 (pre-LN) */
    lens_linear ff_in, ff_out;     /* C -> d_ff -> C */
    lens_layernorm ln_ff;          /* BERT: after FFN; GPT-2: ln_2 */
    /* Modern decoders: with GQA k, v map C -> NKV*DK / NKV*DV (the block
     * repeats each kv head for its NH/NKV query heads, as HF's repeat_kv,
     * so io->k, io->v and the kept values are per query head). */
    lens_linear gate;              /* gated MLP: C -> d_ff, act(gate) * ff_in (ff_in = up_proj) */
    lens_layernorm q_norm, k_norm; /* QK-norm weights [DK] (w only) */
    lens_layernorm post_attn, post_ff; /* Gemma 2 post-norms (w only) */
    /* A mixture-of-experts layer (lens_layer_moe): the router C -> E and the
     * E experts' gate, up, down maps (a dense layer leaves them unbound). */
    lens_linear router;
    lens_moe_expert experts[LENS_MOE_MAX_EXPERTS];
    const float *sinks;            /* [NH] attention sink logits (cfg attn_sinks), or NULL */
} lens_block;

typedef struct {
    /* embedding tables in the checkpoint's dtype emb_dtype (one for all
     * three: the loader refuses mixed ones); read rows with lens_widen */
    const void *tok_emb;  /* [V][C] */
    const void *pos_emb;  /* [max_positions][C] */
    const void *type_emb; /* BERT: [type_vocab_size][C], GPT-2: NULL */
    lens_dtype emb_dtype;
    lens_layernorm ln_emb; /* BERT embeddings LayerNorm; GPT-2: unused */
    lens_block *blocks;    /* [L] */
    lens_layernorm ln_final; /* GPT-2 ln_f */
    lens_linear pooler;      /* classification: first token C -> C, tanh (or ReLU: head_relu) */
    lens_layernorm pooler_ln; /* when set: pooled = LN(GELU(pooler)) instead (ModernBERT's head) */
    lens_linear classifier;  /* C -> K */
    lens_linear mlm_transform;  /* BERT MLM: C -> C, GELU, LayerNorm */
    lens_layernorm mlm_ln;
    const float *mlm_bias;      /* [V]; decoder weight tied to tok_emb */
    lens_linear lm_head;        /* untied decoder LM head (lm_head, embed_out): C -> V; w NULL = tied to tok_emb */
} lens_params;

typedef struct lens_model {
    char *dir;
    lens_config cfg;
    lens_params p;
    lens_weights *weights;
    lens_tokenizer *tok; /* NULL when the folder has no tokenizer files */
    int tokenizer_only;  /* lens_model_tokenizer_only: no config, no weights */
    size_t n_params;
    float *packed;   /* one allocation holding every lens_linear.packed (F32 checkpoints only) */
} lens_model;

/* lens_layer_scores of layer l with the layer's attention sinks (core/nn/scores.h). */
static inline lens_score_fn lens_model_scores(const lens_model *m, int l, int causal)
{
    lens_score_fn f = lens_layer_scores(&m->cfg, l, causal);
    f.sinks = m->p.blocks[l].sinks;
    return f;
}

/* The LM decoder, logits = t W_lm^T with the untied lm_head when the
 * checkpoint has one, else tied, t E^T: the token embeddings viewed as a
 * Linear C -> V in their dtype (no bias; MLM heads add mlm_bias). */
static inline lens_linear lens_lm_decoder(const lens_model *m)
{
    const int C = m->cfg.d_model;
    if (m->p.lm_head.w) return m->p.lm_head;
    return (lens_linear){.w = m->p.tok_emb, .dtype = m->p.emb_dtype, .in = C, .out = m->cfg.vocab_size, .ld = C};
}

lens_model *lens_model_load(const char *dir, lens_err *err);
/* A folder holding only tokenizer files (tokenizer.json and/or
 * tokenizer_config.json, or vocab files), as AutoTokenizer reads it: serves
 * tokenize and nothing else (lens_model_supports says so). */
lens_model *lens_model_tokenizer_only(const char *dir, lens_err *err);
void lens_model_free(lens_model *m);

/* The analyses lensd serves, as named in the API (endpoints and job kinds).
 * lens_model_supports answers whether a model can run one; when it cannot,
 * *why (if not NULL) gets a static sentence a user can act on. */
typedef enum {
    LENS_ANALYSIS_FORWARD,
    LENS_ANALYSIS_ATTENTION,          /* effective attention, identifiability */
    LENS_ANALYSIS_ATTRIBUTION,        /* attention attribution (class or next-token objective) */
    LENS_ANALYSIS_ATTRIBUTION_TREE,
    LENS_ANALYSIS_HEAD_IMPORTANCE,
    LENS_ANALYSIS_TRIGGERS,           /* adversarial triggers */
    LENS_ANALYSIS_TOKEN_IDENTITY,
    LENS_ANALYSIS_HIDDEN_ATTRIBUTION,
    LENS_ANALYSIS_DECOMPOSITION,
    LENS_ANALYSIS_CONTEXT_MIXING,     /* rollout for every model; ALTI / GlobEnc where the block decomposes */
    LENS_ANALYSIS_LOGIT_ATTRIBUTION,  /* direct logit attribution: causal LMs whose blocks add attention as it is */
    LENS_ANALYSIS_ROUTER,             /* /v1/forward's "router" output: models with mixture-of-experts layers */
    LENS_ANALYSIS_COUNT
} lens_analysis;

/* A 64-bit fingerprint of the model's identity: architecture, shapes, the
 * token embeddings and the task head (FNV-1a). Shard partials carry it, so
 * partials of another model are refused at merge. */
unsigned long long lens_model_fingerprint(const lens_model *m);

const char *lens_analysis_name(lens_analysis a); /* "forward", "attention", "attribution", ... */
int lens_model_supports(const lens_model *m, lens_analysis a, const char **why);

/* What lens_forward keeps: only what the caller asks for is stored. */
enum {
    LENS_KEEP_HIDDEN = 1 << 0, /* hidden states of every layer */
    LENS_KEEP_ATTN = 1 << 1,   /* attention probabilities of every layer and head */
    LENS_KEEP_VALUES = 1 << 2, /* per-head value matrices V_h = E W_V,h + b_V,h */
    LENS_KEEP_LN = 1 << 3,     /* LayerNorm mean and 1/std of every LayerNorm */
    LENS_KEEP_LOGITS = 1 << 4, /* task head output (and pooled output for BERT classification) */
    LENS_KEEP_ROUTER = 1 << 5, /* the mixture-of-experts routes of every MoE layer (lens_act_route) */
    LENS_KEEP_CTX = 1 << 6,    /* every layer's concatenated head outputs ctx before W_O (lens_act_ctx) */
    LENS_KEEP_MLP = 1 << 7     /* what every layer's MLP adds to the residual stream (lens_act_mlp) */
};

typedef struct {
    int n_seqs;          /* S */
    const int *lengths;  /* [S], each >= 1 and <= max_positions */
    const int *ids;      /* [N] packed token ids */
    const int *type_ids; /* [N] segment ids, or NULL for all zero */
} lens_batch;

typedef struct {
    unsigned keep;               /* LENS_KEEP_* bits */
    const volatile int *cancel;  /* optional: checked between layers; non-zero stops with LENS_ECANCEL */
    lens_pool *pool;             /* threads for the pass (core/base/pool.h); NULL = the calling thread only */
    int causal;                  /* BERT: mask keys after each query, as Song & Zhong run BERT (GPT-2 always is) */
    const unsigned char *head_mask; /* optional [L][NH]: 0 prunes the head (its probabilities and output are zero,
                                       as HF head_mask = 0); NULL = every head */
    const float *head_fill;      /* optional [L][NH*DV]: a pruned head's ctx rows are its slice of this (mean
                                    ablation) instead of zero */
    const unsigned char *mlp_mask; /* optional [L]: 0 replaces what layer l's MLP adds to the residual stream
                                      (block.h lens_block_io.mlp) by mlp_fill's row, or zero; NULL = every MLP */
    const float *mlp_fill;       /* optional [L][C]: the replacement, NULL = zero */
    double *ctx_sum;             /* optional [L][NH*DV]: each layer's ctx summed over every row (added to) */
    double *mlp_sum;             /* optional [L][C]: each MLP's output summed over every row (added to) */
    /* activation patching at block patch_layer (0..L-1):
     *  - start_x [N][C]: the pass starts at that block from this residual stream (its input), the
     *    embedding and the blocks below skipped (the caller has them cached); NULL = from the embedding;
     *  - patch_heads [N][NH]: head h's ctx slice of row n becomes patch_ctx's ([N][NH*DV]) where set;
     *  - patch_mlp_rows [N]: row n of what the MLP adds becomes patch_mlp's ([N][C]) where set. */
    int patch_layer;
    const float *start_x;
    const float *patch_ctx;
    const unsigned char *patch_heads;
    const float *patch_mlp;
    const unsigned char *patch_mlp_rows;
    /* causal LM / masked LM with LENS_KEEP_LOGITS: only row logit_rows[s] of each sequence s gets
     * logits ([S][V], lens_act_logits gives [V]); NULL = every row */
    const int *logit_rows;
} lens_forward_opts;

typedef struct {
    int n_seqs, n_tokens;  /* S, N */
    int n_layers;          /* L */
    int *lengths;          /* [S] */
    int *row_start;        /* [S] first packed row of each sequence */
    size_t *attn_start;    /* [S] offset of each sequence's [T][T] block inside one (layer, head) */
    size_t attn_layer_size;/* floats per (layer, head) slice = sum of T*T */
    float *hidden;         /* [L+1][N][C]; layer 0 = embedding output; for GPT-2 layer L has ln_f applied (as HF);
                              with start_x the layers below patch_layer (and the embedding's
                              LENS_KEEP_LN statistics) are unset */
    float *attn;           /* [L][NH][sum T*T] */
    float *values;         /* [L][N][NH*DV] */
    float *ln_mean, *ln_rstd; /* [2L+1][N]: BERT: emb, then per layer attn, ff; GPT-2: per layer ln_1, ln_2, then ln_f */
    float *pooled;         /* classification: [S][C] */
    float *logits;         /* classification: [S][K]; MLM / causal LM: [N][V] */
    float *route;          /* [L][N][2K + E] per MoE layer and token: K experts (as floats), their K weights,
                              the E router probabilities (core/nn/moe.h); a dense layer's rows unset */
    float *ctx;            /* [L][N][NH*DV] the heads' outputs before W_O */
    float *mlp;            /* [L][N][C] what each MLP adds to the residual stream */
    int logit_rows;        /* 1: logits [S][V] at one row per sequence (lens_forward_opts logit_rows) */
} lens_activations;

int lens_forward(const lens_model *m, const lens_batch *batch,
                 const lens_forward_opts *opts, lens_activations *act,
                 lens_err *err);
void lens_activations_free(lens_activations *act);
/* Views into kept activations for sequence s (NULL if not kept). */
const float *lens_act_hidden(const lens_model *m, const lens_activations *a, int layer, int s); /* [T][C] */
const float *lens_act_attn(const lens_model *m, const lens_activations *a, int layer, int head, int s); /* [T][T], layer 1..L */
const float *lens_act_values(const lens_model *m, const lens_activations *a, int layer, int s); /* [T][NH*DV], layer 1..L */
const float *lens_act_logits(const lens_model *m, const lens_activations *a, int s); /* [K], [T][V] or [V] */
const float *lens_act_ctx(const lens_model *m, const lens_activations *a, int layer, int s); /* [T][NH*DV], layer 1..L */
const float *lens_act_mlp(const lens_model *m, const lens_activations *a, int layer, int s); /* [T][C], layer 1..L */
/* [T][2K + E] the routes of sequence s at MoE layer `layer` (1..L), NULL for a dense layer. */
const float *lens_act_route(const lens_model *m, const lens_activations *a, int layer, int s);

#endif
