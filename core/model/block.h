/* block.h - a Transformer block as data: a short program of ops over named
 * buffers, written once per family; forward, backward and JVP are derived
 * from it here.
 *
 * A family states its block (and, for pre-norm families, its final norm) by
 * appending ops to a lens_block_prog (arch.h lens_family.block, llama.cpp's
 * graph builders are the model):
 *
 *     lens_op_norm(p, LENS_R_H, LENS_R_X, &b->ln_attn, 2 * l);   h = norm(x)
 *     lens_op_linear(p, LENS_R_Q, LENS_R_H, &b->q);               q = h W_q + b_q
 *     ...
 *     lens_op_attend(p);                                           ctx = attention(q, k, v)
 *     lens_op_linear(p, LENS_R_H, LENS_R_CTX, &b->attn_out);
 *     lens_op_add(p, LENS_R_X, LENS_R_H);                          x += h
 *
 * Each op is a core/nn function with its derivative pair (linear, LayerNorm
 * / RMSNorm, GELU, gated activations, per-head norm, RoPE, repeat_kv, the
 * fused q/k/v split, the caller's attention). The interpreter runs the
 * program forward (saving into a lens_block_cache what the derivatives
 * read: a norm's input and statistics, an activation's input, with weight
 * gradients the inputs of linear maps; each value once), backward in
 * reverse (activation gradients, and weight gradients through io->grads),
 * and as a JVP for B tangents of the cached sequence. The cache layout, the
 * MLP buffer's width and the row-wise tail used by exact hidden token
 * attribution are read off the same program, so nothing is kept in step by
 * hand.
 *
 * Buffers (registers), all [N] rows: X the residual stream io->x (the block's
 * input and output; its gradient / tangent in backward and JVP), H and N
 * [C] scratch, Q, K [NH*DK], V, CTX [NH*DV], FF the MLP buffer (io->ff) and
 * UP the second half of a gated MLP inside it. Rules a program keeps:
 *  - ops write a register other than their input, except ADD (out += in)
 *    and the in-place ops (GELU, GLU, QK_NORM, ROPE, REPEAT_KV);
 *  - MOE is row-wise (the top-k choice held fixed in backward and JVP:
 *    core/nn/moe.h) and uses FF as scratch;
 *  - the attention is one ATTEND op; after it the caller's hook may have
 *    compacted the rows (io->N), and when ATTEND is differentiated only X
 *    and CTX may carry gradient (the hook expands those two);
 *  - TAIL marks where the row-wise tail starts (after the residual sum that
 *    follows attention): the ops after it read only that sum (its register
 *    is the previous op's output) and mix no rows. A block without TAIL
 *    (GPT-NeoX's parallel residual) has no row Jacobian. */
#ifndef LENS_BLOCK_H
#define LENS_BLOCK_H

#include <stddef.h>

#include "core/model/model.h"

typedef enum {
    LENS_R_X, LENS_R_H, LENS_R_N, LENS_R_Q, LENS_R_K, LENS_R_V, LENS_R_CTX, LENS_R_FF, LENS_R_UP, LENS_R_COUNT
} lens_reg;

typedef enum {
    LENS_OP_LINEAR,    /* out = in W + b */
    LENS_OP_NORM,      /* out = LayerNorm(in), or RMSNorm when cfg.norm_rms; statistics to slot */
    LENS_OP_ADD,       /* out += in */
    LENS_OP_COPY,      /* out = in */
    LENS_OP_GELU,      /* FF = gelu(FF) (cfg.gelu_tanh) */
    LENS_OP_GLU,       /* FF = act(FF) * UP (cfg.glu) */
    LENS_OP_QK_NORM,   /* RMSNorm of out (Q or K, `heads` heads) in place, over groups of `dim` channels */
    LENS_OP_ROPE,      /* RoPE (`rope`, NULL: cfg.rope) on out (Q or K, `heads` heads) at the rows' positions */
    LENS_OP_REPEAT_KV, /* out (K or V): `heads` kv heads -> NH (HF repeat_kv) */
    LENS_OP_SPLIT_QKV, /* Q, K, V from FF in GPT-NeoX's per-head [q_h | k_h | v_h] layout */
    LENS_OP_ATTEND,    /* CTX = attention(Q, K, V): io->attend / attend_backward / attend_jvp */
    LENS_OP_MOE,       /* out = the mixture of experts (core/nn/moe.h) of in; FF its scratch */
    LENS_OP_TAIL       /* marker: the row-wise tail starts here */
} lens_op_kind;

typedef struct {
    lens_op_kind kind;
    lens_reg out, in;
    const lens_linear *lin;   /* LINEAR */
    const lens_layernorm *ln; /* NORM, QK_NORM */
    const lens_block *blk;    /* MOE: its router and experts */
    int slot;                 /* NORM: statistics slot of io->ln_mean / ln_rstd, -1 none */
    int heads;                /* QK_NORM, ROPE, REPEAT_KV */
    int dim;                  /* QK_NORM: channels per norm (DK per head, heads * DK the whole projection) */
    const lens_rope_params *rope; /* ROPE: the layer's parameters (lens_layer_rope), NULL = cfg.rope */
} lens_op;

#define LENS_BLOCK_MAX_OPS 48
#define LENS_BLOCK_MAX_HEAD_DIM 4096 /* per-head scratch on the stack (RoPE, repeat_kv) */

typedef struct {
    int n;
    lens_op op[LENS_BLOCK_MAX_OPS];
} lens_block_prog;

/* The builders a family's block function calls. */
void lens_op_linear(lens_block_prog *p, lens_reg out, lens_reg in, const lens_linear *lin);
void lens_op_norm(lens_block_prog *p, lens_reg out, lens_reg in, const lens_layernorm *ln, int slot);
void lens_op_add(lens_block_prog *p, lens_reg out, lens_reg in);
void lens_op_copy(lens_block_prog *p, lens_reg out, lens_reg in);
void lens_op_gelu(lens_block_prog *p);
void lens_op_glu(lens_block_prog *p);
void lens_op_qk_norm(lens_block_prog *p, lens_reg reg, const lens_layernorm *ln, int heads, int dim);
void lens_op_rope(lens_block_prog *p, lens_reg reg, int heads, const lens_rope_params *rope);
void lens_op_repeat_kv(lens_block_prog *p, lens_reg reg, int kv_heads);
void lens_op_split_qkv(lens_block_prog *p);
void lens_op_attend(lens_block_prog *p);
void lens_op_moe(lens_block_prog *p, lens_reg out, lens_reg in, const lens_block *b);
void lens_op_tail(lens_block_prog *p);
/* The gated MLP of b on register in: FF = in W_gate, UP = in W_up, FF = act(FF) * UP, H = FF W_down. */
void lens_op_gated_mlp(lens_block_prog *p, lens_reg in, const lens_block *b);

/* The pre-norm final norm (l == L of a pre-norm family's block function):
 * x = norm(x) with the model's ln_final, statistics in slot 2L. */
void lens_op_final_norm(lens_block_prog *p, const lens_model *m);

/* Saved activations of one block over `rows` rows. */
typedef struct lens_block_cache {
    int rows;           /* capacity in rows */
    int for_weights;    /* 1: also the linear maps' inputs (trainer) */
    float *q, *k, *v;   /* [rows][NH*DK], [rows][NH*DK], [rows][NH*DV] as attention read them */
    float *buf;         /* [rows * lens_block_cache_floats(...)], laid out by the program */
} lens_block_cache;

/* Weight gradients: the gradient buffer of a parameter tensor (same layout
 * and row stride), accumulated into; NULL = no gradient for it. */
typedef struct lens_grad_map {
    float *(*of)(const struct lens_grad_map *g, const float *param);
    void *ctx;
} lens_grad_map;

/* The buffers of one block pass over N packed rows (the caller owns them).
 *
 * Attention over the caller's sequences is the caller's: attend (forward),
 * attend_backward and attend_jvp compute io->ctx from io->q, k, v (and
 * back). The caller owns the probabilities (their layout: packed sequences,
 * m copies, the attribution's α-scaled A) and the per-sequence loop;
 * ops.h's lens_attention_{forward,backward,jvp} do one sequence. A hook may
 * COMPACT rows after attention (the attribution's last layer only needs
 * one row per copy) by rewriting io->x, io->ctx and io->N; attend_backward
 * receives the compacted rows and may expand io->x and io->ctx back
 * (setting io->N); it returns non-zero to stop there (the attribution's
 * target layer needs only dF/dctx).
 *
 * Forward: io->cache NULL, or the cache to fill (the caller points io->q,
 * k, v at cache->q, k, v); statistics of the norms go to io->ln_mean /
 * ln_rstd slots when those are set. Backward: io->x holds dL/d(block output)
 * on entry and dL/d(block input) on exit; q, k, v, ctx, h, n, ff are the
 * gradients' buffers; weight gradients accumulate through io->grads (NULL:
 * activation gradients only). JVP: io->N = B * cache->rows rows (B tangents
 * of one sequence, tangent row r reads primal row r % rows); io->jvp_row >=
 * 0 says the input tangents are zero except that row of each copy (the first
 * layer); io->row_jac set: the tail is applied as those Jacobians
 * (lens_block_row_jacobian). N never exceeds the buffers' capacity. */
typedef struct lens_block_io {
    int N;
    float *x;             /* [N][C] residual stream (forward) / its gradient or tangent */
    float *h, *n;         /* [N][C] scratch */
    float *q, *k;         /* [N][NH*DK] */
    float *v;             /* [N][NH*DV] (the kept values when asked for) */
    float *ctx;           /* [N][NH*DV] concatenated head outputs */
    float *ff;            /* [N][lens_ff_cols] */
    size_t ff_ld;         /* forward: the MLP buffer's row stride (>= lens_ff_cols), 0 = packed rows */
    float *ln_mean, *ln_rstd; /* [2L+1][N] norm statistics, or NULL (slots: the family's) */
    const int *pos;       /* [N] position of each row inside its sequence (RoPE) */
    float *route;         /* forward: NULL, or [N][lens_moe_route_floats] the route records of the MOE op */
    lens_pool *pool;
    lens_block_cache *cache;      /* forward: save into it when non-NULL; backward / JVP: read */
    const struct lens_grad_map *grads; /* backward: weight gradients, or NULL */
    int jvp_row;                  /* JVP: -1, or the only non-zero input row of each tangent */
    float *row_scratch;           /* JVP: [C] */
    const float *row_jac;         /* JVP: NULL, or the tail's Jacobians (lens_block_row_jac_pack) */
    void (*attend)(struct lens_block_io *io, int l);
    int (*attend_backward)(struct lens_block_io *io, int l);
    void (*attend_jvp)(struct lens_block_io *io, int l);
    void *attend_ctx;
    /* forward: NULL, or called with y [N][C], what the MLP (or the mixture of
     * experts) adds to the residual stream, right before the add; it may
     * rewrite y (ablation) or read it */
    void (*mlp)(struct lens_block_io *io, int l, float *y);
    /* backward: NULL, or called with dy [N][C], the gradient of that y (the
     * sum's gradient, read where the backward passes the add) */
    void (*mlp_backward)(struct lens_block_io *io, int l, const float *dy);
} lens_block_io;

/* Layer l of m, 0 <= l < L; l == L is the final norm (nothing for post-norm
 * families, whose io->x passes unchanged). */
void lens_block_forward(const lens_model *m, lens_block_io *io, int l);
/* The same from layer l's ATTEND op on, when nothing after it reads what the
 * ops before it computed but the residual X (1; an attend hook that makes
 * CTX without Q, K and V then skips their projections: value zeroing), else
 * the whole block (0). */
int lens_block_forward_from_attend(const lens_model *m, lens_block_io *io, int l);
/* Starting later, after layer l's attention output map (the linear map of
 * ATTEND's CTX): the register (LENS_R_*) that map writes, whose io->N rows
 * of width C the caller fills (lens_block_register) before
 * lens_block_forward_after_attn_out runs the rest, and the map itself
 * (*map: W_O and its bias); -1 when a later op reads what the skipped ops
 * wrote but X (lens_block_forward_from_attend's rule, and CTX too). Value
 * zeroing's copies differ there by a few rows of rank NH: no W_O each. */
int lens_block_attn_out(const lens_model *m, int l, const lens_linear **map);
void lens_block_forward_after_attn_out(const lens_model *m, lens_block_io *io, int l);
/* io's buffer of register r (LENS_R_*; not LENS_R_UP). */
float *lens_block_register(const lens_block_io *io, int r);
void lens_block_backward(const lens_model *m, lens_block_io *io, int l);
void lens_block_jvp(const lens_model *m, lens_block_io *io, int l);

/* 1 when layer l's block has a row-wise tail (lens_block_row_jacobian). */
int lens_block_has_tail(const lens_model *m, int l);
/* jac [C][rows][C], the Jacobian of layer l's row-wise tail at each cached
 * row j: jac[b][j][:] = d out_j / d u_j[b], pushing the C one-hot tangents of
 * every row through the tail's JVP, io->N / rows of them at a time (io's JVP
 * buffers as scratch). With io->row_jac set, lens_block_jvp then applies it
 * per row: C^2 per tangent row instead of the tail's cost, which pays when
 * many tangents share the cache (exact hidden token attribution). */
void lens_block_row_jacobian(const lens_model *m, lens_block_io *io, int l, float *jac);
/* packed [T][lens_gemm_packed_size(C, C)] = the T matrices jac[.][j][.] of
 * lens_block_row_jacobian's [C][T][C], in the GEMM's weight layout. */
void lens_block_row_jac_pack(float *packed, const float *jac, int T, int C);

/* q, k [T][NH*DK] of layer l as the attention scores see them (norms, RoPE,
 * QK-norm, repeated kv heads) from the block input h [T][C] of one sequence
 * at positions 0..T-1: the program up to ATTEND. 0, or -1 out of memory. */
int lens_block_attn_qk(const lens_model *m, int l, const float *h, int T, float *q, float *k);

/* How layer l's (0-based block) attention output reaches the residual
 * stream, read off its block program. */
typedef struct {
    const lens_linear *out;    /* W_O: the linear map right after ATTEND */
    int post_norm;             /* 1: r = Attn(x) + x, then the norm ln1 of r (BERT); 0: x += Attn(norm(x)) */
    int parallel;              /* pre-norm: the sum comes after other ops (GPT-NeoX's parallel residual) */
    const lens_layernorm *ln1; /* post-norm: the norm of r */
    int slot1;                 /* its statistics slot (LENS_KEEP_LN), -1 when it keeps none */
    const lens_layernorm *ln2; /* post-norm: the block's last norm, or NULL */
    int slot2;                 /* its statistics slot */
} lens_attn_residual;

/* NULL and *s filled, or why the attention output is not added to the
 * residual stream as it is (a norm of the summed heads in between). */
const char *lens_block_attn_residual(const lens_model *m, int l, lens_attn_residual *s);

/* Floats per row layer l's cache keeps (l == L: the final norm's), and a
 * cache of `rows` rows for it; 0, or -1 out of memory (cache freeable). */
size_t lens_block_cache_floats(const lens_model *m, int l, int for_weights);
int lens_block_cache_init(lens_block_cache *cache, const lens_model *m, int l, int rows, int for_weights);
void lens_block_cache_free(lens_block_cache *cache);

/* Columns of the MLP buffer (io->ff) every layer's program needs: the MLP
 * width, gate and up of a gated MLP, a fused q/k/v output. */
int lens_ff_cols(const lens_model *m);

/* RoPE r (NULL: c->rope) of x [N][H*DK] (forward, or its transpose when
 * back) on its rotary channels: positions pos, or with pos NULL row n of
 * each block of `rows` rows at n % rows (the copies of one sequence). */
void lens_block_rope(const lens_config *c, const lens_rope_params *r, float *x, const int *pos, int N, int rows, int H,
                     int back);
/* GQA: x holds [N][NKV*D] compact at its start; on return [N][NH*D], kv
 * head g repeated for query heads g*NH/NKV .. (g+1)*NH/NKV - 1 (HF repeat_kv). */
void lens_repeat_kv(float *x, int N, int NKV, int NH, int D);

#endif
