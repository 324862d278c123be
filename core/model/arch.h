/* arch.h - what a model family (BERT, GPT-2, ...) is to the rest of lensd.
 *
 * One lens_family per architecture, defined in core/model/<family>.c, owns
 * everything that differs between families: the HF config keys, the HF
 * tensor names (one walker, used by the loader, the trainer and mkmodel),
 * the block forward, and the capability flags the
 * analyses ask for instead of comparing architecture ids (llama.cpp's
 * src/models/, TEI's candle models). Adding a family = one file + one entry
 * in lens_families (arch.c). The embedding (embedding.h) and the task
 * heads (head.h) are every family's, read from the tensors the walker binds
 * and the config.
 *
 * Shapes as in model.h: N packed rows, T tokens of one sequence, C =
 * d_model, NH heads, DK / DV per-head sizes, F = d_ff, L layers. */
#ifndef LENS_ARCH_H
#define LENS_ARCH_H

#include <stdint.h>
#include <stdio.h>

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

/* ------------------------------------------------------------ blocks */

/* THE BLOCK CONTRACT. A family implements its block once: forward,
 * backward and JVP (block_forward / block_backward / block_jvp below);
 * every caller (lens_forward, the attribution engine, hidden token
 * attribution, the trainer) runs those and contains no block math. What
 * differs between callers is plugged in through lens_block_io:
 *
 *  - attention over the caller's sequences: attend (forward),
 *    attend_backward and attend_jvp. The family computes q, k, v (with its
 *    own RoPE / QK-norm / grouping), calls the hook, and continues from
 *    io->ctx. The caller owns the probabilities (their layout: packed
 *    sequences, m copies, the attribution's α-scaled A) and the per-sequence
 *    loop; ops.h's lens_attention_{forward,backward,jvp} do one sequence.
 *    A hook may COMPACT rows after attention (the attribution's last layer
 *    only needs one row per copy): the family must re-read io->N after
 *    attend and use only io->x / io->ctx (row-aligned) past that point;
 *    attend_backward receives the compacted rows and may expand io->x and
 *    io->ctx back (setting io->N) before the family differentiates q, k, v.
 *    attend_backward returns non-zero to stop there (the attribution's
 *    target layer needs only dF/dctx): the family then returns at once.
 *  - what backward / JVP need: io->cache (a lens_block_cache of `rows`
 *    rows, lens_block_cache_init) is filled by block_forward when non-NULL:
 *    q, k, v as attention read them (the caller points io->q/k/v at
 *    cache->q/k/v) and the family's private values in cache->buf (its
 *    layout: LayerNorm / RMSNorm inputs and statistics, FFN pre-activations,
 *    and with cache->for_weights also the inputs of every linear map).
 *  - weight gradients: io->grads (lens_grad_map) maps each parameter tensor
 *    of the block to its gradient buffer (accumulated into); NULL = the
 *    activation gradients only (attribution).
 *
 * Buffer roles. Forward: x [N][C] the residual stream in place, h, n [N][C]
 * scratch, q, k, v, ctx, ff (row stride ff_ld) as named; with a cache the
 * norm statistics go to the cache, else to io->ln_mean / ln_rstd when set.
 * Backward: x holds dL/d(block output) on entry and dL/d(block input) on
 * exit; q, k, v, ctx are dq, dk, dv, dctx; h, n, ff ([N][d_ff], ff_ld =
 * d_ff) scratch; the saved values come from io->cache. JVP: the same with
 * tangents: io->N = B * cache->rows rows (B tangents of one sequence,
 * tangent row r reads primal row r % rows), row_scratch [C]; io->jvp_row >=
 * 0 says the input tangents are zero except that row of each copy (the
 * first layer; lens_block_linear_jvp uses it). N never exceeds the
 * buffers' capacity; the family may not allocate. tests/test_blocks.c
 * checks a family's three functions against each other and against finite
 * differences.
 *
 * What stays inside a family file: RoPE (rotate q, k before attend; the
 * inverse rotation of dq, dk after attend_backward; the tangents' before
 * attend_jvp), grouped-query attention (expand k, v to NH heads before
 * attend, HF's repeat_kv, and sum dk, dv over each group after
 * attend_backward), QK-norm, gated MLPs (io->ff holds lens_ff_cols
 * columns), parallel residuals and extra norms (their inputs and
 * statistics in cache->buf). Changes to the attention op itself (logit
 * soft-capping, sliding windows) belong to the ops every caller's hook
 * calls (ops.h lens_attention_*, core/nn/scores.h, forward.c's attend_task).
 *
 * Final norm (pre-norm families): final_forward / final_backward /
 * final_jvp with the same conventions, their cache a lens_block_cache of
 * family->final_cache_floats per row (q, k, v unused). */

/* Saved activations of one block over `rows` rows. */
typedef struct lens_block_cache {
    int rows;           /* capacity in rows */
    int for_weights;    /* 1: also the linear maps' inputs (trainer) */
    float *q, *k, *v;   /* [rows][NH*DK], [rows][NH*DK], [rows][NH*DV] as attention read them */
    float *buf;         /* [rows * cache_floats(cfg, for_weights)], the family's layout */
} lens_block_cache;

/* Weight gradients: the gradient buffer of a parameter tensor (same layout
 * and row stride), accumulated into; NULL = no gradient for it. */
typedef struct lens_grad_map {
    float *(*of)(const struct lens_grad_map *g, const float *param);
    void *ctx;
} lens_grad_map;

/* The buffers of one block pass over N packed rows (the caller owns them). */
typedef struct lens_block_io {
    int N;
    float *x;             /* [N][C] residual stream (forward) / its gradient or tangent */
    float *h, *n;         /* [N][C] scratch */
    float *q, *k;         /* [N][NH*DK] */
    float *v;             /* [N][NH*DV] (the kept values when asked for) */
    float *ctx;           /* [N][NH*DV] concatenated head outputs */
    float *ff;            /* [N][ff_ld] */
    size_t ff_ld;
    float *ln_mean, *ln_rstd; /* [2L+1][N] LayerNorm statistics, or NULL (model.h: slot order is the family's) */
    const int *pos;       /* [N] position of each row inside its sequence (RoPE) */
    lens_pool *pool;
    lens_block_cache *cache;      /* forward: save into it when non-NULL; backward / JVP: read */
    const lens_grad_map *grads;   /* backward: weight gradients, or NULL */
    int jvp_row;                  /* JVP: -1, or the only non-zero input row of each tangent */
    float *row_scratch;           /* JVP: [C] */
    /* JVP: NULL, or the block's row-wise tail as explicit Jacobians
     * (family->block_row_jacobian packed by lens_block_row_jac_pack),
     * applied by one GEMM per row instead of the tail's own JVP */
    const float *row_jac;
    /* ctx = attention(q, k, v) of every sequence and head of layer l */
    void (*attend)(struct lens_block_io *io, int l);
    /* dq, dk, dv (set, not accumulated) from dctx = io->ctx; non-zero: stop */
    int (*attend_backward)(struct lens_block_io *io, int l);
    /* tangent ctx from tangents q, k, v (io->cache: the primal) */
    void (*attend_jvp)(struct lens_block_io *io, int l);
    void *attend_ctx;
} lens_block_io;

/* Statistics slot `slot` ([N]) of io->ln_mean / ln_rstd, or NULL. */
static inline float *lens_ln_slot(const lens_block_io *io, float *stats, int slot)
{
    return stats ? stats + (size_t)slot * io->N : NULL;
}

/* Allocates a cache of `rows` rows for a block (final = 0) or the final
 * norm (final = 1) of cfg's family; 0, or -1 out of memory (cache freeable). */
int lens_block_cache_init(lens_block_cache *cache, const lens_config *cfg, int rows, int for_weights, int final);
void lens_block_cache_free(lens_block_cache *cache);

/* Shared by the block implementations: dinp (+= with acc, else =) dout W^T
 * of a linear map, plus its weight gradients (input inp) when io->grads;
 * and the same for a LayerNorm (dinp += or =). */
void lens_block_linear_backward(const lens_block_io *io, float *dinp, int acc, const float *dout, const float *inp,
                                const lens_linear *lin, int N);
void lens_block_layernorm_backward(const lens_block_io *io, float *dinp, int acc, const float *dout,
                                   const float *inp, const float *mean, const float *rstd, const lens_layernorm *ln,
                                   int N, int C);
/* JVP of a linear map for the B tangents of io (io->N rows): out = in W;
 * with io->jvp_row >= 0 only that row of each tangent is mapped, through
 * gather [B][lin->in] and prod [B][lin->out] (scratch). */
void lens_block_linear_jvp(const lens_block_io *io, float *out, const float *in, const lens_linear *lin,
                           float *gather, float *prod);
/* packed [T][lens_gemm_packed_size(C, C)] (64-byte aligned) = the T
 * matrices jac[.][j][.] of block_row_jacobian's [C][T][C], in the GEMM's
 * weight layout. */
void lens_block_row_jac_pack(float *packed, const float *jac, int T, int C);
/* out[B][T][C] = row-wise products: out[b][j] = in[b][j] jac[.][j][.] for
 * the B = N / T tangents of io (packed as lens_block_row_jac_pack), one
 * GEMM of B rows per row j. */
void lens_block_row_jac_apply(const lens_block_io *io, float *out, const float *in, const float *packed, int C);
/* The tail Jacobian loop of block_row_jacobian: for the one-hot tangents
 * e_b at every row, in chunks of io->N / rows, tail(io) maps io->h (the
 * tail's input tangents) to io->x, which points into jac. */
void lens_block_row_jacobian(lens_block_io *io, int C, float *jac,
                             void (*tail)(const lens_model *m, lens_block_io *io, int l), const lens_model *m, int l);
/* dst[N][W] = src[N] rows of row stride ld (a cache keeps io->ff packed). */
void lens_block_copy_rows(float *dst, const float *src, size_t ld, int N, int W);
/* cache_floats of the LayerNorm blocks, post-norm (BERT) and pre-norm (GPT-2)
 * alike: two LayerNorms' inputs and statistics and the GELU input per row,
 * for weight gradients also the inputs of the linear maps they do not keep. */
size_t lens_ln_block_cache_floats(const lens_config *c, int for_weights);
/* JVP of the GELU MLP out = ff_out(gelu(ff_in(in))) for the io->N / rows
 * tangents of io (ff_pre: the forward's GELU input [rows][d_ff]); io->ff is
 * the scratch, so out may be in. */
void lens_block_gelu_mlp_jvp(const lens_model *m, const lens_block *blk, lens_block_io *io, float *out,
                             const float *in, const float *ff_pre);

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

    /* x = block l (x); what analyses need goes to io (values, statistics,
     * io->cache). */
    void (*block_forward)(const lens_model *m, lens_block_io *io, int l);
    /* io->x = dL/d(block input) from dL/d(block output), weight gradients
     * through io->grads (the block contract above). */
    void (*block_backward)(const lens_model *m, lens_block_io *io, int l);
    /* io->x = J_block(x) io->x for B tangents of the cached sequence. */
    void (*block_jvp)(const lens_model *m, lens_block_io *io, int l);
    /* Optional (NULL: not offered): jac [C][rows][C], the Jacobian of the
     * block's row-wise tail (everything after attention's output projection
     * and residual sum, up to the block output) at each cached row j:
     * jac[b][j][:] = d out_j / d u_j[b]. Formed by pushing the C one-hot
     * tangents of every row through the tail's JVP, io->N / rows of them at
     * a time (io's JVP buffers as scratch); with io->row_jac set, block_jvp
     * then applies it per row (lens_block_row_jac_apply): C^2 per tangent row
     * instead of the tail's cost (the MLP's 2·C·F and the norms), which pays
     * when many tangents share the cache (exact hidden token attribution). */
    void (*block_row_jacobian)(const lens_model *m, lens_block_io *io, int l, float *jac);
    /* Floats per row the block / final norm keep in lens_block_cache.buf. */
    size_t (*cache_floats)(const lens_config *c, int for_weights);
    size_t (*final_cache_floats)(const lens_config *c, int for_weights);
    /* After the last block: final LayerNorm (pre-norm families), or NULL;
     * its backward and JVP (io->cache: the final cache). */
    void (*final_forward)(const lens_model *m, lens_block_io *io);
    void (*final_backward)(const lens_model *m, lens_block_io *io);
    void (*final_jvp)(const lens_model *m, lens_block_io *io);
    /* Optional: q, k [T][NH*DK] of layer l (0-based) as the attention scores
     * see them (normed, rotated, kv heads repeated) from the block input
     * h [T][C] of one sequence, x [T][C] scratch; NULL = LN(h) (pre-norm) or
     * h, times W_q / W_k. */
    void (*attn_qk)(const lens_model *m, int l, const float *h, int T, float *x, float *q, float *k);
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
 * under prefix ("bert.", "roberta."): tok + pos (+ seg) + LayerNorm, and
 * the post-norm block. */
int lens_bert_parse_keys(struct json_t *root, const char *path, lens_config *cfg, lens_err *err);
void lens_bert_walk_encoder(const lens_config *c, lens_params *p, lens_param_visitor *v, const char *prefix);
void lens_bert_block_forward(const lens_model *m, lens_block_io *io, int l);
void lens_bert_block_backward(const lens_model *m, lens_block_io *io, int l);
void lens_bert_block_jvp(const lens_model *m, lens_block_io *io, int l);
void lens_bert_block_row_jacobian(const lens_model *m, lens_block_io *io, int l, float *jac);
void lens_bert_write_config(FILE *f, const lens_config *c, int random_weights);
/* A new encoder config's task from its name (NULL: classification with
 * labels negative / positive), for new_config. */
int lens_new_encoder_task(lens_config *c, const char *task, lens_err *err);

/* The final LayerNorm of pre-LN families (gpt2.c; GPT-NeoX shares it):
 * ln_f (model.p.ln_final) in slot 2L, its cache, backward and JVP. */
size_t lens_ln_final_cache_floats(const lens_config *c, int for_weights);
void lens_ln_final_forward(const lens_model *m, lens_block_io *io);
void lens_ln_final_backward(const lens_model *m, lens_block_io *io);
void lens_ln_final_jvp(const lens_model *m, lens_block_io *io);

/* A tokenizer-only folder (lens_model_tokenizer_only) has no family: no capabilities. */
static inline int lens_has_cap(const lens_config *c, unsigned cap) { return c->family && (c->family->caps & cap) != 0; }

#endif
