/* arch.h - what a model family (BERT, GPT-2, ...) is to the rest of lensd.
 *
 * One lens_family per architecture, defined in core/model/<family>.c, owns
 * everything that differs between families: the HF config keys and tensor
 * names as tables (one parser / writer and one walker read them), the block
 * as a program (block.h), and the capability flags the analyses ask for
 * instead of comparing architecture ids (llama.cpp's src/models/ and
 * LLM_TENSOR_NAMES, TEI's candle models); what only checkpoint writing
 * needs is its lens_family_writer. The embedding (embedding.h) and the task
 * heads (head.h) are every family's, read from the tensors the walker binds
 * and the config. Adding a family = one file + one entry in lens_families
 * (arch.c) + its row in tests/family_cases.h.
 *
 * Shapes as in model.h: N packed rows, T tokens of one sequence, C =
 * d_model, NH heads, DK / DV per-head sizes, F = d_ff, L layers. */
#ifndef LENS_ARCH_H
#define LENS_ARCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/model/block.h"
#include "core/model/model.h"

struct json_t;

/* Capabilities: behaviour the callers branch on. */
enum {
    LENS_CAP_CAUSAL = 1 << 0,    /* attention masks keys after the query (decoder) */
    LENS_CAP_SEGMENTS = 1 << 1,  /* token_type embeddings: text pairs get segment ids */
    LENS_CAP_PRE_NORM = 1 << 2,  /* x + f(LN(x)) blocks and a final LayerNorm (else post-norm,
                                    LN(x + f(x)), with an embedding LayerNorm) */
    LENS_CAP_POOLER = 1 << 3,    /* classifier head reads a pooled first token */
    LENS_CAP_TIED_HEAD = 1 << 4, /* LM decoder weight = token embeddings */
    LENS_CAP_CLS_FIRST = 1 << 5, /* the first token is a [CLS]-like summary of the input (tree root,
                                    dataset analyses of classifiers) */
    LENS_CAP_BYTE_BPE = 1 << 7   /* its checkpoints ship a byte-level BPE vocabulary (vocab.json + merges.txt) */
};

/* ------------------------------------------------------------ parameters */

/* One tensor of a checkpoint, as the family's walker names it. */
typedef enum {
    LENS_PARAM_EMBEDDING,   /* random init, weight decay */
    LENS_PARAM_WEIGHT,      /* linear weight: random init, weight decay */
    LENS_PARAM_BIAS,        /* zero init, no decay */
    LENS_PARAM_NORM_WEIGHT, /* LayerNorm gain: one init, no decay */
    LENS_PARAM_NORM_BIAS    /* LayerNorm bias: zero init, no decay */
} lens_param_kind;

typedef struct {
    const char *name;   /* full HF name, "bert.encoder.layer.0.attention.self.query.weight" */
    int ndim;           /* 1, 2, or 3 (stacked experts: [E][in][out], their biases [E][out]) */
    int64_t shape[3];   /* as stored in the file */
    lens_param_kind kind;
    float init_std;     /* random kinds: HF's initialiser N(0, init_std); norm kinds: mkmodel adds
                           N(0, init_std) noise to the 1 / 0 fill so tests see every gain */
    int summed;         /* head_combination != concat: attention.output.dense.weight stored
                           [C][DV] (model.h); the trainer keeps it tiled [C][NH*DV] */
} lens_param_desc;

/* Elements of a tensor as stored. */
static inline size_t lens_param_numel(const lens_param_desc *d)
{
    size_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= (size_t)d->shape[i];
    return n;
}

/* The walker calls tensor() once per tensor in HF order; it returns the
 * tensor's data ([shape] elements of v->dtype; [C][NH*DV] for a summed
 * weight when tiles_summed) or NULL, which the walker stores in lens_params.
 * 1-D tensors (biases, norms) are always float32; the loader returns
 * matrices in the checkpoint's dtype, the trainer and mkmodel float32. After
 * an error the visitor keeps returning NULL and sets failed. */
typedef struct lens_param_visitor {
    const void *(*tensor)(struct lens_param_visitor *v, const lens_param_desc *d);
    int tiles_summed; /* 1: summed output weights arrive tiled (row stride NH*DV) */
    int failed;
    lens_dtype dtype; /* of the tensor tensor() returned last (F32 = 0 unless the visitor sets it) */
} lens_param_visitor;

/* ------------------------------------------------------------ tensor tables */

/* A family's HF tensor names are data (llama.cpp's LLM_TENSOR_NAMES): an
 * ordered list of sections, each a name prefix and rows, walked by one
 * generic walker (lens_walk_params) for the loader, the trainer and mkmodel.
 * A row names a tensor, where it binds, how it is stored, its shape in
 * config sizes, when it exists and how mkmodel initialises it. */
typedef enum {
    LENS_T_EMBEDDING, /* [d0][d1] table (const void *, in the checkpoint's dtype) */
    LENS_T_VECTOR,    /* [d0] float32 (const float *), zero-initialised: an output bias */
    LENS_T_LINEAR,    /* nn.Linear: name.weight [d0 = out][d1 = in], name.bias [out] */
    LENS_T_LINEAR_NB, /* nn.Linear without bias (with one when bias_if holds) */
    LENS_T_CONV1D,    /* GPT-2 Conv1D: name.weight [d1 = in][d0 = out], name.bias [out] */
    LENS_T_LAYERNORM, /* name.weight, name.bias [d0] */
    LENS_T_LAYERNORM_NB, /* LayerNorm without bias: name.weight [d0] (ModernBERT's norm_bias false) */
    LENS_T_RMSNORM,   /* name.weight [d0]; a unit-offset gain 1 + w (Gemma) is stored as w */
    LENS_T_EXPERTS    /* every expert's map in one tensor (gpt-oss): name [E][d0 = in][d1 = out] and
                         name_bias [E][d1], bound as a lens_linear y = x W + b into each lens_moe_expert
                         of the layer (field: LENS_B(experts) + offsetof(lens_moe_expert, map)) */
} lens_tensor_kind;

/* Tensor sizes in config symbols (lens_dim_size). */
typedef enum {
    LENS_D_NONE,
    LENS_D_C,      /* d_model */
    LENS_D_F,      /* d_ff */
    LENS_D_2F,     /* fused gate | up */
    LENS_D_V,      /* vocab_size */
    LENS_D_POS,    /* max_positions + position_offset */
    LENS_D_TYPES,  /* type_vocab_size */
    LENS_D_LABELS, /* n_labels */
    LENS_D_DK,     /* d_head_k */
    LENS_D_QK,     /* NH * DK */
    LENS_D_VO,     /* NH * DV */
    LENS_D_KV,     /* NKV * DK */
    LENS_D_KVV,    /* NKV * DV */
    LENS_D_QKV,    /* NH * DK + NKV * DK + NKV * DV: fused q | k | v */
    LENS_D_NH,     /* n_heads */
    LENS_D_DH,     /* d_model / n_heads (a config default; the keys must divide) */
    LENS_D_E,      /* n_experts */
    LENS_D_FE,     /* d_ff_expert */
    LENS_D_2FE     /* fused gate | up of an expert */
} lens_dim;
int lens_dim_size(const lens_config *c, lens_dim d);

/* When a row exists: every set bit must hold (0 = always). */
enum {
    LENS_IF_CLASSIFIER = 1 << 0,    /* task classification */
    LENS_IF_MLM = 1 << 1,           /* task masked-lm */
    LENS_IF_UNTIED_LM = 1 << 2,     /* causal LM whose head is not tied to the embeddings */
    LENS_IF_QKV_BIAS = 1 << 3,      /* cfg qkv_bias */
    LENS_IF_O_BIAS = 1 << 4,        /* cfg o_bias */
    LENS_IF_QK_NORM = 1 << 5,       /* cfg qk_norm */
    LENS_IF_POST_NORMS = 1 << 6,    /* cfg post_norms */
    LENS_IF_NO_POST_NORMS = 1 << 7, /* not post_norms */
    LENS_IF_NOT_FIRST_LAYER = 1 << 8, /* per-layer rows: layers 1.. only (ModernBERT's attn_norm) */
    LENS_IF_MOE = 1 << 9,             /* the layer has a mixture of experts (lens_layer_moe) */
    LENS_IF_DENSE = 1 << 10,          /* the layer has a dense MLP (every layer of a family without experts) */
    LENS_IF_SINKS = 1 << 11           /* cfg attn_sinks */
};

/* A fused tensor bound as views of its parts (row blocks of an nn.Linear,
 * column blocks of a Conv1D): q | k | v (LENS_D_QKV) into lens_block q, k,
 * v; gate | up (LENS_D_2F, HF's chunk(2) order) into gate, ff_in. */
typedef enum { LENS_SPLIT_NONE, LENS_SPLIT_QKV, LENS_SPLIT_GATE_UP } lens_split;

/* mkmodel's initialisation (lens_param_desc.init_std): weights and tables
 * N(0, std), std = initializer_range (0.02 when unset); RESID: std /
 * sqrt(2 L) (GPT-2's residual projections); NOISE: norms get N(0, 0.1)
 * added so tests see every gain. */
typedef enum { LENS_INIT_STD, LENS_INIT_RESID, LENS_INIT_NOISE } lens_init;

typedef struct {
    const char *name;      /* after the section prefix; linear and norm kinds add ".weight" / ".bias" */
    size_t field;          /* offsetof in lens_block (layer sections) or lens_params; split rows: unused */
    lens_tensor_kind kind;
    lens_dim d0, d1;
    unsigned when;         /* LENS_IF_* */
    unsigned bias_if;      /* LENS_T_LINEAR_NB: the bias exists when these LENS_IF_* hold (0: never) */
    lens_split split;
    lens_init init;
    int summed;            /* head_combination != concat: the weight is stored [C][DV] (model.h) */
} lens_tensor_row;

typedef struct {
    const char *prefix;         /* "bert.encoder.layer.%d.": "%d" is the layer index (then the expert's) */
    int per_layer;              /* 1: the rows repeat for each layer and bind into its lens_block;
                                   LENS_PER_EXPERT: for each expert of each layer, bound into its
                                   lens_moe_expert ("model.layers.%d.mlp.experts.%d.") */
    const lens_tensor_row *rows; /* ended by a row with name NULL; NULL ends the section list */
} lens_tensor_section;
#define LENS_PER_EXPERT 2

/* A row; the optional designated fields (.when, .bias_if, .split, .init,
 * .summed) follow d1. LENS_P / LENS_B: where a row binds. */
#define LENS_ROW(name_, field_, kind_, d0_, d1_, ...) \
    {.name = (name_), .field = (field_), .kind = (kind_), .d0 = (d0_), .d1 = (d1_), __VA_ARGS__}
#define LENS_P(member) offsetof(lens_params, member)
#define LENS_B(member) offsetof(lens_block, member)

/* Every tensor of a cfg checkpoint, in HF order (cfg->family->tensors),
 * bound into p through v. */
void lens_walk_params(const lens_config *cfg, lens_params *p, lens_param_visitor *v);

/* ------------------------------------------------------------ config keys */

/* A family's HF config keys are data as well (Redis's config table): rows
 * read by one parser (lens_config_load) and written by one writer
 * (lens_config_to_json), in table order, so a default may use the sizes of
 * rows before it. A short family hook does what is not one key (a
 * rope_scaling object, sizes derived from several keys). The parsed JSON is
 * never changed. */
typedef enum {
    LENS_KEY_INT,    /* JSON integer -> int */
    LENS_KEY_FLOAT,  /* JSON number -> float */
    LENS_KEY_DOUBLE, /* JSON number -> double */
    LENS_KEY_BOOL,   /* true / false -> int 1 / 0 */
    LENS_KEY_CHOICE  /* one of .choices' names -> int (its value) */
} lens_key_type;

typedef struct {
    const char *name;
    int value;
} lens_key_choice;

enum {
    LENS_KEY_REQUIRED = 1 << 0,     /* absent or null: an error naming the key */
    LENS_KEY_ONLY_DEFAULT = 1 << 1, /* another value changes the math in a way lensd does not: refused by name */
    LENS_KEY_NULL_OFF = 1 << 2,     /* null sets 0 (the feature off; written as null), absent the default */
    LENS_KEY_OPEN_MIN = 1 << 3,     /* min < value (else min <= value) */
    LENS_KEY_OPEN_MAX = 1 << 4,     /* value < max */
    LENS_KEY_IF_CHANGED = 1 << 5    /* written only when not the default */
};

#define LENS_KEY_TABLES 4 /* key tables a family may list */
#define LENS_KEY_CHECK_ONLY ((size_t)-1) /* .field of a key that sets nothing: only its default is accepted */

typedef struct {
    const char *key;         /* NULL: no key, the field is a family constant (its default) */
    const char *alias;       /* read when key is absent or null: "rope_theta" for "rotary_emb_base" */
    lens_key_type type;
    size_t field;            /* LENS_C(member), or LENS_KEY_CHECK_ONLY */
    double def;              /* the default; times lens_dim_size(def_dim) when def_dim is set */
    lens_dim def_dim;
    double min, max;         /* the accepted range when min < max or max_dim is set */
    lens_dim max_dim;        /* max += lens_dim_size(max_dim): [0, V - 1] is max -1, max_dim V */
    unsigned flags;          /* LENS_KEY_* */
    const lens_key_choice *choices; /* CHOICE: ended by {NULL}; a value is written as its first name */
} lens_config_key;

#define LENS_KEY(key_, type_, field_, ...) {.key = (key_), .type = (type_), .field = (field_), __VA_ARGS__}
#define LENS_C(member) offsetof(lens_config, member)
/* The keys' choices lensd shares: hidden_act of a plain MLP (cfg gelu_tanh),
 * of a gated one (cfg glu), head_combination. */
extern const lens_key_choice lens_gelu_choices[], lens_glu_choices[], lens_head_combination_choices[];
/* The sizes under transformers' common names (hidden_size,
 * num_hidden_layers, num_attention_heads, intermediate_size, vocab_size),
 * all required: BERT's, RoBERTa's and the decoders' first table. */
extern const lens_config_key lens_hf_size_keys[];

/* One key row's value (or default) as a double, for a hook that reads a key
 * into no field of its own (GPT-NeoX's rotary_pct). */
int lens_config_key_read(const struct json_t *root, const char *path, const lens_config *cfg,
                         const lens_config_key *k, double *out, lens_err *err);

/* Every plain default and constant of cfg->family's key rows into cfg (a
 * new checkpoint's start; defaults scaled by a size are the preset's). */
void lens_config_defaults(lens_config *cfg);

/* json_real of the shortest decimal that reads back as f (1e-5f: 1e-05). */
struct json_t *lens_json_float(float f);

/* config.json of cfg: architectures, model_type, the family's keys, its
 * writer's constants and hook, then the random-weights mark and the task
 * (id2label / label2id of a classifier, else lensd_task). NULL: out of
 * memory. */
struct json_t *lens_config_to_json(const lens_config *cfg, int random_weights);
/* Writes it to path, keys sorted and indented as transformers does, with
 * "torch_dtype" when not NULL. */
int lens_config_save(const char *path, const lens_config *cfg, int random_weights, const char *torch_dtype,
                     lens_err *err);

/* What checkpoint writing needs of a family (mkmodel, and the trainer's
 * config.json); loading and compute never read it. */
typedef struct lens_family_writer {
    /* mkmodel's tokenizer files: tokenizer_config.json "tokenizer_class", and
     * for byte-level BPE the special tokens at ids 0.. and at the last id */
    const char *tokenizer_class;
    const char *bpe_first[4], *bpe_last;
    /* A new checkpoint (mkmodel) starts from its keys' defaults and
     * constants (lens_config_defaults) with default_task or the task asked
     * for (any of task_archs); new_config, optional, then sets what the
     * keys do not default (vocabulary size, rope scaling, ...); sizes are
     * the preset's. */
    lens_task default_task;
    void (*new_config)(lens_config *cfg);
    /* Optional: sets cfg's shape for an mkmodel preset name (after
     * new_config); -1 when the family has no such preset. NULL = the
     * generic presets of mkmodel.c. */
    int (*preset)(lens_config *cfg, const char *name);
    const char *preset_names; /* "micro, tiny, 1b, 8b" for --help and errors */
    /* config.json beyond the keys: constant members (a JSON object text:
     * dropouts, ...), and optionally a hook adding derived ones (bos / eos,
     * rope_scaling); non-zero = out of memory. */
    const char *config_constants;
    int (*config_extra)(struct json_t *root, const lens_config *cfg);
} lens_family_writer;

struct lens_family {
    const char *model_type;   /* config "model_type": "bert" */
    const char *base_prefix;  /* base-model tensor prefix inside task checkpoints: "bert." */
    const char *default_arch; /* config "architectures"[0] when absent */
    const char *task_archs[4]; /* HF class of each lens_task, NULL = not supported */
    /* The HF config class's defaults of keys a nested "text_config" may omit
     * (JSON text; NULL: none), e.g. Gemma3TextConfig's sizes. */
    const char *class_defaults;
    unsigned caps;            /* LENS_CAP_* */

    /* The HF config keys, tables read in order (arch.h config keys), then
     * the optional hook for what is not one key (architecture already set;
     * the task is read after it). */
    const lens_config_key *keys[LENS_KEY_TABLES];
    int (*config_hook)(const struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
    /* Every tensor of a checkpoint, in HF order (lens_walk_params). */
    const lens_tensor_section *tensors;

    /* Appends layer l's block to p (core/model/block.h), 0 <= l < L, or
     * with l == L the final norm (nothing: post-norm families). Forward,
     * backward, JVP and the cache layout are derived from it. */
    void (*block)(const lens_model *m, int l, lens_block_prog *p);
    const lens_family_writer *writer;
};

/* The families lensd knows, NULL-terminated, and lookups. */
extern const lens_family *const lens_families[];
const lens_family *lens_family_find(const char *model_type); /* NULL when unknown */
/* "bert, gpt2, ..." for error messages. */
const char *lens_family_names(void);


/* BERT's pieces its descendants (RoBERTa, DistilBERT) share (bert.c):
 * the BERT config keys but pad_token_id, the embeddings + encoder tensor
 * rows (tok + pos + seg + LayerNorm), the writer's constants, and the
 * post-norm block. */
extern const lens_config_key lens_bert_keys[];
extern const lens_tensor_row lens_bert_embedding_rows[], lens_bert_layer_rows[];
extern const char lens_bert_config_constants[];
void lens_bert_block(const lens_model *m, int l, lens_block_prog *p);

/* RoBERTa's pieces XLM-RoBERTa shares (roberta.c): pad_token_id (1), the
 * positions after padding_idx (hook), bos / eos (extra), and every tensor
 * name under "roberta." with its heads. */
extern const lens_config_key lens_roberta_pad_keys[];
extern const lens_tensor_section lens_roberta_tensors[];
int lens_roberta_config_hook(const struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
int lens_roberta_config_extra(struct json_t *root, const lens_config *cfg);

/* A tokenizer-only folder (lens_model_tokenizer_only) has no family: no capabilities. */
static inline int lens_has_cap(const lens_config *c, unsigned cap) { return c->family && (c->family->caps & cap) != 0; }

#endif
