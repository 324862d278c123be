/* arch.h - what a model family (BERT, GPT-2, ...) is to the rest of lensd.
 *
 * One lens_family per architecture, defined in core/model/<family>.c, owns
 * everything that differs between families: the HF config keys, the HF
 * tensor names (one walker, used by the loader, the trainer and mkmodel),
 * the embedding, the block as a program (block.h), and the capability flags the
 * analyses ask for instead of comparing architecture ids (llama.cpp's
 * src/models/, TEI's candle models). Adding a family = one file + one entry
 * in lens_families (arch.c).
 *
 * Shapes as in model.h: N packed rows, T tokens of one sequence, C =
 * d_model, NH heads, DK / DV per-head sizes, F = d_ff, L layers. */
#ifndef LENS_ARCH_H
#define LENS_ARCH_H

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
    LENS_CAP_TRAIN = 1 << 6,     /* lens_trainer implements this family (core/train) */
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
    int ndim;           /* 1 or 2 */
    int64_t shape[2];   /* as stored in the file */
    lens_param_kind kind;
    float init_std;     /* random kinds: HF's initialiser N(0, init_std); norm kinds: mkmodel adds
                           N(0, init_std) noise to the 1 / 0 fill so tests see every gain */
    int summed;         /* head_combination != concat: attention.output.dense.weight stored
                           [C][DV] (model.h); the trainer keeps it tiled [C][NH*DV] */
} lens_param_desc;

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

/* Helpers for walkers: an HF nn.Linear (weight [out][in]) or GPT-2 Conv1D
 * (weight [in][out]) named base + ".weight" / ".bias", a LayerNorm. */
void lens_walk_linear(lens_param_visitor *v, lens_linear *lin, const char *base, int in, int out, int conv1d,
                      float init_std);
void lens_walk_layernorm(lens_param_visitor *v, lens_layernorm *ln, const char *base, int C);
const void *lens_walk_tensor(lens_param_visitor *v, const char *name, int64_t d0, int64_t d1,
                             lens_param_kind kind, float init_std);
/* An nn.Linear with an optional bias (Llama's attention_bias / mlp_bias). */
void lens_walk_linear_bias(lens_param_visitor *v, lens_linear *lin, const char *base, int in, int out, int bias,
                           float init_std);
/* An RMSNorm weight base + ".weight" [C] (Gemma's unit_offset gain 1 + w
 * is stored as w, zero-initialised); noise as lens_param_desc.init_std. */
void lens_walk_rmsnorm(lens_param_visitor *v, lens_layernorm *ln, const char *base, int C, int unit_offset,
                       float noise);

struct lens_family {
    const char *model_type;   /* config "model_type": "bert" */
    const char *base_prefix;  /* base-model tensor prefix inside task checkpoints: "bert." */
    const char *default_arch; /* config "architectures"[0] when absent */
    const char *task_archs[4]; /* HF class of each lens_task, NULL = not supported */
    unsigned caps;            /* LENS_CAP_* */
    /* mkmodel's tokenizer files: tokenizer_config.json "tokenizer_class", and
     * for byte-level BPE the special tokens at ids 0.. and at the last id */
    const char *tokenizer_class;
    const char *bpe_first[4], *bpe_last;

    /* Reads the family's HF config keys into cfg (architecture already set). */
    int (*parse_config)(struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
    /* A new checkpoint's config (mkmodel): the family's defaults (vocabulary
     * size, positions, eps, activation, labels) for task, a lens_task_name
     * or NULL for the family's default task; sizes are the caller's. */
    int (*new_config)(lens_config *cfg, const char *task, lens_err *err);
    /* Writes config.json for cfg; random_weights marks mkmodel's output. */
    void (*write_config)(FILE *f, const lens_config *cfg, int random_weights);
    /* Every tensor of a cfg checkpoint, in HF order, bound into p. */
    void (*walk)(const lens_config *cfg, lens_params *p, lens_param_visitor *v);

    /* x[T][C] = embedding output of one sequence (ids, type_ids [T], type_ids
     * NULL = all 0), incl. an embedding LayerNorm whose statistics go to
     * mean, rstd [T] when not NULL. Checked ids only (lens_forward does). */
    void (*embed)(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *mean,
                  float *rstd);
    /* Appends layer l's block to p (core/model/block.h), 0 <= l < L, or
     * with l == L the final norm (nothing: post-norm families). Forward,
     * backward, JVP and the cache layout are derived from it. */
    void (*block)(const lens_model *m, int l, lens_block_prog *p);
    /* Non-NULL: the family has no block backward / JVP yet; the sentence
     * lens_model_supports gives for the gradient analyses. */
    const char *no_backward;
    /* Optional: sets cfg's shape for an mkmodel preset name (after
     * new_config); -1 when the family has no such preset. NULL = the
     * generic presets of mkmodel.c. */
    int (*preset)(lens_config *cfg, const char *name);
    const char *preset_names; /* "micro, tiny, 1b, 8b" for errors */
};

/* The families lensd knows, NULL-terminated, and lookups. */
extern const lens_family *const lens_families[];
const lens_family *lens_family_find(const char *model_type); /* NULL when unknown */
/* "bert, gpt2, ..." for error messages. */
const char *lens_family_names(void);

extern const lens_family lens_family_bert, lens_family_gpt2, lens_family_roberta, lens_family_distilbert;
extern const lens_family lens_family_llama, lens_family_mistral, lens_family_qwen2, lens_family_qwen3,
    lens_family_gemma, lens_family_gemma2, lens_family_gpt_neox;

/* Shared by the family files: JSON config helpers (config.c). */
int lens_json_int(struct json_t *root, const char *path, const char *key, int fallback, int min, int max, int *out,
                  lens_err *err);
int lens_json_eps(struct json_t *root, const char *path, const char *key, double fallback, float *out,
                  lens_err *err);
const char *lens_json_str(struct json_t *root, const char *key);
int lens_parse_activation(const char *path, const char *act, int *gelu_tanh, lens_err *err);
int lens_parse_labels(struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
void lens_write_labels(FILE *f, const lens_config *c);
void lens_write_task_tail(FILE *f, const lens_config *c, int random_weights);


/* cfg->task from cfg->architecture via the family's task_archs (labels
 * read for classifiers). */
int lens_config_task(struct json_t *root, const char *path, lens_config *cfg, lens_err *err);

/* BERT's pieces its descendants (RoBERTa, DistilBERT) share (bert.c):
 * the BERT config keys except the task, the embeddings + encoder tensors
 * under prefix ("bert.", "roberta."), tok + pos (+ seg) + LayerNorm, and
 * the post-norm block. */
int lens_bert_parse_keys(struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
void lens_bert_walk_encoder(const lens_config *c, lens_params *p, lens_param_visitor *v, const char *prefix);
void lens_bert_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *x, float *mean,
                     float *rstd);
void lens_bert_block(const lens_model *m, int l, lens_block_prog *p);
void lens_bert_write_config(FILE *f, const lens_config *c, int random_weights);
/* A new encoder config's task from its name (NULL: classification with
 * labels negative / positive), for new_config. */
int lens_new_encoder_task(lens_config *c, const char *task, lens_err *err);

/* A tokenizer-only folder (lens_model_tokenizer_only) has no family: no capabilities. */
static inline int lens_has_cap(const lens_config *c, unsigned cap) { return c->family && (c->family->caps & cap) != 0; }

#endif
