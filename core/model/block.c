/* block.c - the block interpreter: a family's program (block.h) run
 * forward, backward and as a JVP through the ops' own derivative pairs in
 * core/nn.
 *
 * Backward is reverse mode over registers that programs reuse: walking the
 * ops backwards, an op's output gradient is read from its output register,
 * its input gradient set (or added, when that register already carries
 * gradient from a later reader) into its input register, and the output
 * register's gradient is spent (zero[] tracks which registers carry none, so
 * nothing is cleared that is overwritten anyway). Saved values are planned
 * once per program (plan below): the forward writes them, backward and JVP
 * read them at the same offsets.
 *
 * Layouts: X, H, N, Q, K, V, CTX are packed rows. FF in the forward has row
 * stride io->ff_ld (packed when 0), UP beside the gate when the stride holds
 * both, else after N gate rows; backward and JVP keep FF packed at the width
 * of the op that wrote it and UP after N rows of d_ff. */
#include "core/model/block.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/model/arch.h"
#include "core/nn/glu.h"
#include "core/nn/moe.h"
#include "core/nn/norm.h"
#include "core/nn/ops.h"
#include "core/nn/rope.h"

/* ------------------------------------------------------------ builders */

static lens_op *append(lens_block_prog *p, lens_op_kind kind, lens_reg out, lens_reg in)
{
    if (p->n >= LENS_BLOCK_MAX_OPS) abort(); /* a family's program is fixed code: a bug, not input */
    lens_op *o = &p->op[p->n++];
    *o = (lens_op){.kind = kind, .out = out, .in = in, .slot = -1};
    return o;
}

void lens_op_linear(lens_block_prog *p, lens_reg out, lens_reg in, const lens_linear *lin)
{
    append(p, LENS_OP_LINEAR, out, in)->lin = lin;
}

void lens_op_norm(lens_block_prog *p, lens_reg out, lens_reg in, const lens_layernorm *ln, int slot)
{
    lens_op *o = append(p, LENS_OP_NORM, out, in);
    o->ln = ln, o->slot = slot;
}

void lens_op_add(lens_block_prog *p, lens_reg out, lens_reg in) { append(p, LENS_OP_ADD, out, in); }
void lens_op_copy(lens_block_prog *p, lens_reg out, lens_reg in) { append(p, LENS_OP_COPY, out, in); }
void lens_op_gelu(lens_block_prog *p) { append(p, LENS_OP_GELU, LENS_R_FF, LENS_R_FF); }
void lens_op_glu(lens_block_prog *p) { append(p, LENS_OP_GLU, LENS_R_FF, LENS_R_UP); }
void lens_op_split_qkv(lens_block_prog *p) { append(p, LENS_OP_SPLIT_QKV, LENS_R_Q, LENS_R_FF); }
void lens_op_attend(lens_block_prog *p) { append(p, LENS_OP_ATTEND, LENS_R_CTX, LENS_R_Q); }
void lens_op_tail(lens_block_prog *p) { append(p, LENS_OP_TAIL, LENS_R_X, LENS_R_X); }

void lens_op_gated_mlp(lens_block_prog *p, lens_reg in, const lens_block *b)
{
    lens_op_linear(p, LENS_R_FF, in, &b->gate);
    lens_op_linear(p, LENS_R_UP, in, &b->ff_in);
    lens_op_glu(p);
    lens_op_linear(p, LENS_R_H, LENS_R_FF, &b->ff_out);
}

void lens_op_moe(lens_block_prog *p, lens_reg out, lens_reg in, const lens_block *b)
{
    append(p, LENS_OP_MOE, out, in)->blk = b;
}

void lens_op_qk_norm(lens_block_prog *p, lens_reg reg, const lens_layernorm *ln, int heads, int dim)
{
    lens_op *o = append(p, LENS_OP_QK_NORM, reg, reg);
    o->ln = ln, o->heads = heads, o->dim = dim;
}

void lens_op_rope(lens_block_prog *p, lens_reg reg, int heads, const lens_rope_params *rope)
{
    lens_op *o = append(p, LENS_OP_ROPE, reg, reg);
    o->heads = heads, o->rope = rope;
}

void lens_op_repeat_kv(lens_block_prog *p, lens_reg reg, int kv_heads)
{
    append(p, LENS_OP_REPEAT_KV, reg, reg)->heads = kv_heads;
}

void lens_op_final_norm(lens_block_prog *p, const lens_model *m)
{
    lens_op_norm(p, LENS_R_H, LENS_R_X, &m->p.ln_final, 2 * m->cfg.n_layers);
    lens_op_copy(p, LENS_R_X, LENS_R_H);
}

static void build(const lens_model *m, int l, lens_block_prog *p)
{
    p->n = 0;
    m->cfg.family->block(m, l, p);
}

/* The mixture of experts of an MOE op under m's config. */
static lens_moe moe_of(const lens_model *m, const lens_op *o)
{
    const lens_config *c = &m->cfg;
    return (lens_moe){.router = &o->blk->router, .experts = o->blk->experts, .n_experts = c->n_experts,
                      .top_k = c->top_k, .norm_topk = c->norm_topk, .ff = c->d_ff_expert, .act = (lens_glu)c->glu};
}

/* ------------------------------------------------------------ reading a program */

const char *lens_block_attn_residual(const lens_model *m, int l, lens_attn_residual *s)
{
    static const char no_sum[] = "the block does not add the attention output to the residual stream directly (a "
                                 "norm between them): its sources do not decompose";
    lens_block_prog p;
    build(m, l, &p);
    int a = 0;
    while (a < p.n && p.op[a].kind != LENS_OP_ATTEND) a++;
    if (a + 2 >= p.n) return no_sum;
    const lens_op *o = &p.op[a + 1], *add = &p.op[a + 2];
    if (o->kind != LENS_OP_LINEAR || o->in != LENS_R_CTX) return no_sum;
    memset(s, 0, sizeof *s);
    s->out = o->lin;
    if (add->kind == LENS_OP_ADD && add->out == o->out && add->in == LENS_R_X) {
        int k = a + 3; /* post-norm: r = Attn(x) + x, then a norm of r */
        while (k < p.n && p.op[k].kind == LENS_OP_TAIL) k++;
        if (k >= p.n || p.op[k].kind != LENS_OP_NORM || p.op[k].in != o->out) return no_sum;
        s->post_norm = 1, s->ln1 = p.op[k].ln, s->slot1 = p.op[k].slot;
        const lens_op *last = &p.op[p.n - 1];
        if (last->kind == LENS_OP_NORM && last->out == LENS_R_X && last->slot >= 0)
            s->ln2 = last->ln, s->slot2 = last->slot;
        return NULL;
    }
    /* pre-norm: x += Attn(norm(x)), right away or after the MLP (parallel residual); nothing may
     * rewrite the attention output before */
    for (int k = a + 2; k < p.n; k++) {
        const lens_op *op = &p.op[k];
        if (op->kind == LENS_OP_ADD && op->out == LENS_R_X && op->in == o->out) {
            s->parallel = k != a + 2;
            return NULL;
        }
        if (op->out == o->out && op->kind != LENS_OP_TAIL) return no_sum;
    }
    return no_sum;
}

/* ------------------------------------------------------------ the plan */

#define NONE SIZE_MAX

/* Where each op's saved values sit: offsets in floats per row of the
 * cache's buf (a value of width w at offset o fills buf[o*rows ..
 * (o+w)*rows), [rows][w]); NONE = not saved. */
typedef struct {
    size_t in[LENS_BLOCK_MAX_OPS];    /* the op's input (GLU: the gate) */
    size_t up[LENS_BLOCK_MAX_OPS];    /* GLU: up; MOE: its saved rows (moe.h) */
    size_t stats[LENS_BLOCK_MAX_OPS]; /* NORM: mean, rstd ([rows] each; RMSNorm rstd only); QK_NORM rstd [rows][heads] */
    size_t floats;                    /* per row */
    int tail;                         /* the TAIL op, or -1 */
} plan;

/* Columns of register r as an op's input (per row). */
static size_t reg_width(const lens_config *c, lens_reg r)
{
    switch (r) {
    case LENS_R_Q: case LENS_R_K: return (size_t)c->n_heads * c->d_head_k;
    case LENS_R_V: case LENS_R_CTX: return (size_t)c->n_heads * c->d_head_v;
    case LENS_R_FF: case LENS_R_UP: return (size_t)c->d_ff;
    default: return (size_t)c->d_model;
    }
}


static void make_plan(const lens_model *m, const lens_block_prog *p, int for_weights, plan *pl)
{
    const lens_config *c = &m->cfg;
    unsigned version[LENS_R_COUNT] = {0}, saved_version[LENS_R_COUNT];
    size_t saved_at[LENS_R_COUNT], floats = 0;
    for (int r = 0; r < LENS_R_COUNT; r++) saved_at[r] = NONE, saved_version[r] = 0;
    pl->tail = -1;
    /* the value in register r now, saved once however many ops read it */
#define SAVE(r, width) \
    (saved_at[r] != NONE && saved_version[r] == version[r] \
         ? saved_at[r] \
         : (saved_version[r] = version[r], saved_at[r] = floats, floats += (width), saved_at[r]))
    for (int i = 0; i < p->n; i++) {
        const lens_op *o = &p->op[i];
        pl->in[i] = pl->up[i] = pl->stats[i] = NONE;
        switch (o->kind) {
        case LENS_OP_LINEAR:
            if (for_weights) pl->in[i] = SAVE(o->in, (size_t)o->lin->in);
            version[o->out]++;
            break;
        case LENS_OP_NORM:
            pl->in[i] = SAVE(o->in, (size_t)c->d_model);
            pl->stats[i] = floats, floats += c->norm_rms ? 1 : 2;
            version[o->out]++;
            break;
        case LENS_OP_QK_NORM:
            pl->in[i] = SAVE(o->out, (size_t)o->heads * c->d_head_k);
            pl->stats[i] = floats, floats += (size_t)o->heads * c->d_head_k / o->dim;
            version[o->out]++;
            break;
        case LENS_OP_GELU:
            pl->in[i] = SAVE(LENS_R_FF, (size_t)c->d_ff);
            version[LENS_R_FF]++;
            break;
        case LENS_OP_GLU:
            pl->in[i] = SAVE(LENS_R_FF, (size_t)c->d_ff);
            pl->up[i] = SAVE(LENS_R_UP, (size_t)c->d_ff);
            version[LENS_R_FF]++;
            break;
        case LENS_OP_SPLIT_QKV:
            version[LENS_R_Q]++, version[LENS_R_K]++, version[LENS_R_V]++;
            break;
        case LENS_OP_MOE: {
            const lens_moe moe = moe_of(m, o);
            if (for_weights) pl->in[i] = SAVE(o->in, (size_t)c->d_model);
            pl->up[i] = floats, floats += lens_moe_saved_floats(&moe, c->d_model);
            version[o->out]++;
            break;
        }
        case LENS_OP_ATTEND: /* the hook may compact x */
            version[LENS_R_CTX]++, version[LENS_R_X]++;
            break;
        case LENS_OP_TAIL:
            pl->tail = i;
            break;
        default:
            version[o->out]++;
        }
    }
#undef SAVE
    pl->floats = floats;
}

/* ------------------------------------------------------------ registers */

/* Register r of io for an op over N rows; fwd: the forward's MLP layout. */
static float *reg(const lens_block_io *io, lens_reg r, int N, int fwd, int F)
{
    switch (r) {
    case LENS_R_X: return io->x;
    case LENS_R_H: return io->h;
    case LENS_R_N: return io->n;
    case LENS_R_Q: return io->q;
    case LENS_R_K: return io->k;
    case LENS_R_V: return io->v;
    case LENS_R_CTX: return io->ctx;
    case LENS_R_FF: return io->ff;
    case LENS_R_UP:
        if (fwd && io->ff_ld >= (size_t)2 * F) return io->ff + F;
        return io->ff + (size_t)N * (fwd && io->ff_ld ? io->ff_ld : (size_t)F);
    default: return NULL;
    }
}

/* Row stride of register r holding `width` columns (forward: the MLP
 * buffer's stride). */
static size_t ld_of(const lens_block_io *io, lens_reg r, size_t width, int fwd)
{
    return fwd && (r == LENS_R_FF || r == LENS_R_UP) && io->ff_ld ? io->ff_ld : width;
}

static float *saved(const lens_block_io *io, size_t off)
{
    return off == NONE ? NULL : io->cache->buf + off * (size_t)io->cache->rows;
}

static float *grad_of(const lens_block_io *io, const float *param)
{
    return io->grads && param ? io->grads->of(io->grads, param) : NULL;
}

/* dinp (+= with acc, else =) dout W^T of a linear map, plus its weight
 * gradients (input inp) when io->grads; the same for a LayerNorm. */
static void linear_backward(const lens_block_io *io, float *dinp, int acc, const float *dout, const float *inp,
                            const lens_linear *lin, int N)
{
    if (!io->grads) { /* the packed GEMM on the pool */
        lens_gemm_linear_backward(dinp, dout, lin, N, acc, io->pool);
        return;
    }
    if (!acc) memset(dinp, 0, sizeof(float) * (size_t)N * lin->in);
    lens_linear_backward(dinp, grad_of(io, lin->w), grad_of(io, lin->b), dout, inp, lin, N);
}

static float *moe_grad(void *io, const void *weight) { return grad_of(io, weight); }

static void layernorm_backward(const lens_block_io *io, float *dinp, int acc, const float *dout, const float *inp,
                               const float *mean, const float *rstd, const lens_layernorm *ln, int N, int C)
{
    if (!acc) memset(dinp, 0, sizeof(float) * (size_t)N * C);
    if (!io->grads) lens_layernorm_backward_rows(io->pool, dinp, dout, inp, mean, rstd, ln, N, C);
    else lens_layernorm_backward(dinp, grad_of(io, ln->w), grad_of(io, ln->b), dout, inp, mean, rstd, ln, N, C);
}

/* dst[N][W] = src[N] rows of row stride ld. */
static void copy_rows(float *dst, const float *src, size_t ld, int N, size_t W)
{
    if (ld == W) memcpy(dst, src, sizeof(float) * N * W);
    else
        for (int n = 0; n < N; n++) memcpy(dst + (size_t)n * W, src + n * ld, sizeof(float) * W);
}

void lens_block_rope(const lens_config *c, const lens_rope_params *r, float *x, const int *pos, int N, int rows, int H,
                     int back)
{
    if (!r) r = &c->rope;
    const int DK = c->d_head_k, R = r->dim;
    if (!R) return;
    double inv_freq[LENS_BLOCK_MAX_HEAD_DIM / 2];
    lens_rope_inv_freq(r, inv_freq);
    if (pos) {
        (back ? lens_rope_backward : lens_rope_forward)(x, pos, N, H, DK, R, inv_freq);
        return;
    }
    for (int b = 0; b * rows < N; b++) {
        const int n = N - b * rows < rows ? N - b * rows : rows;
        (back ? lens_rope_backward : lens_rope_forward)(x + (size_t)b * rows * H * DK, NULL, n, H, DK, R, inv_freq);
    }
}

void lens_repeat_kv(float *x, int N, int NKV, int NH, int D)
{
    if (NKV == NH) return;
    const int group = NH / NKV;
    /* back to front: row n's expanded heads overwrite nothing not yet read */
    for (int n = N - 1; n >= 0; n--)
        for (int h = NH - 1; h >= 0; h--)
            memmove(x + ((size_t)n * NH + h) * D, x + ((size_t)n * NKV + h / group) * D, sizeof(float) * D);
}

/* repeat_kv's backward: d (N rows of NH heads) summed over each kv group
 * into N rows of NKV heads at the start of d. */
static void sum_kv(float *d, int N, int NKV, int NH, int D)
{
    if (NKV == NH) return;
    const int group = NH / NKV;
    float acc[LENS_BLOCK_MAX_HEAD_DIM];
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

/* q, k, v [N][NH*D] from (merge: into) the fused output qkv [N][ld], HF
 * GPT-NeoX's per-head layout [q_h | k_h | v_h]. */
static void split_qkv(const lens_config *c, float *qkv, size_t ld, int N, float *q, float *k, float *v, int merge)
{
    const int NH = c->n_heads, D = c->d_head_k;
    const size_t W = (size_t)NH * D, size = sizeof(float) * D;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++) {
            float *f = qkv + (size_t)n * ld + (size_t)h * 3 * D;
            float *part[3] = {q + n * W + (size_t)h * D, k + n * W + (size_t)h * D, v + n * W + (size_t)h * D};
            for (int j = 0; j < 3; j++) memcpy(merge ? f + j * D : part[j], merge ? part[j] : f + j * D, size);
        }
}

/* ------------------------------------------------------------ forward */

static void save(const lens_block_io *io, size_t off, const float *src, size_t ld, int N, size_t width)
{
    if (io->cache && off != NONE) copy_rows(saved(io, off), src, ld, N, width);
}

static void norm_forward(const lens_model *m, const lens_block_io *io, const lens_op *o, size_t stats, float *out,
                         float *in, const float *residual, int N)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model;
    float *mean = o->slot >= 0 && io->ln_mean ? io->ln_mean + (size_t)o->slot * N : NULL;
    float *rstd = o->slot >= 0 && io->ln_rstd ? io->ln_rstd + (size_t)o->slot * N : NULL;
    if (io->cache) {
        mean = saved(io, stats);
        rstd = c->norm_rms ? mean : mean + io->cache->rows;
    }
    if (c->norm_rms) {
        if (residual) lens_residual_forward(in, residual, (size_t)N * C);
        lens_rmsnorm_forward(out, rstd, in, o->ln->w, c->norm_unit_offset, N, C, c->ln_eps);
        if (mean && !io->cache) memset(mean, 0, sizeof(float) * N); /* RMSNorm does not centre */
    } else {
        lens_add_layernorm(io->pool, out, mean, rstd, in, residual, o->ln, N, C, c->ln_eps);
    }
}

/* The ADD that puts the MLP's output into the residual stream: the first ADD
 * after the last op reading the MLP buffer (its down projection) or the last
 * MOE; its operand other than X is that output (a post-norm block adds the
 * residual X into it, a pre-norm one adds it into X). -1: no MLP. */
static int mlp_add(const lens_block_prog *p)
{
    int k = -1;
    for (int i = 0; i < p->n; i++)
        if ((p->op[i].kind == LENS_OP_LINEAR && p->op[i].in == LENS_R_FF) || p->op[i].kind == LENS_OP_MOE) k = i;
    for (int i = k + 1; k >= 0 && i < p->n; i++)
        if (p->op[i].kind == LENS_OP_ADD) return i;
    return -1;
}

/* Ops [from, to) of p forward. */
static void forward_ops(const lens_model *m, lens_block_io *io, int l, const lens_block_prog *p, const plan *pl,
                        int from, int to)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model, F = c->d_ff;
    const int mlp = io->mlp ? mlp_add(p) : -1;
    for (int i = from; i < to; i++) {
        const lens_op *o = &p->op[i];
        const int N = io->N;
        int j = i + 1; /* the next op that computes (a TAIL marker between two ops does not part them) */
        if (j < to && p->op[j].kind == LENS_OP_TAIL) j++;
        const lens_op *next = j < to ? &p->op[j] : NULL;
        float *out = reg(io, o->out, N, 1, F), *in = reg(io, o->in, N, 1, F);
        switch (o->kind) {
        case LENS_OP_LINEAR: {
            const size_t ldo = ld_of(io, o->out, (size_t)o->lin->out, 1), ldi = ld_of(io, o->in, (size_t)o->lin->in, 1);
            save(io, pl->in[i], in, ldi, N, (size_t)o->lin->in);
            if (next && next->kind == LENS_OP_GELU && o->out == LENS_R_FF && !io->cache) {
                /* GELU fused into the product's tiles while they are in L1 (nothing to save) */
                lens_gemm_linear_post(out, ldo, in, ldi, o->lin, N,
                                      c->gelu_tanh ? lens_gelu_tanh_forward : lens_gelu_forward, io->pool);
                i = j;
            } else {
                lens_gemm_linear_ld(out, ldo, in, ldi, o->lin, N, io->pool);
            }
            break;
        }
        case LENS_OP_NORM:
            norm_forward(m, io, o, pl->stats[i], out, in, NULL, N);
            save(io, pl->in[i], in, (size_t)C, N, (size_t)C);
            break;
        case LENS_OP_ADD:
            if (i == mlp) io->mlp(io, l, o->out == LENS_R_X ? in : out);
            if (next && next->kind == LENS_OP_NORM && next->in == o->out) {
                /* the sum and the norm reading it in one pass over the rows */
                norm_forward(m, io, next, pl->stats[j], reg(io, next->out, N, 1, F), out, in, N);
                save(io, pl->in[j], out, (size_t)C, N, (size_t)C);
                i = j;
            } else {
                lens_residual_layernorm(io->pool, out, in, NULL, NULL, NULL, NULL, N, C, c->ln_eps);
            }
            break;
        case LENS_OP_COPY:
            memcpy(out, in, sizeof(float) * N * reg_width(c, o->in));
            break;
        case LENS_OP_GELU: {
            const size_t ld = ld_of(io, LENS_R_FF, (size_t)F, 1);
            save(io, pl->in[i], out, ld, N, (size_t)F);
            lens_gelu_rows(io->pool, out, ld, N, F, c->gelu_tanh);
            break;
        }
        case LENS_OP_GLU: {
            const size_t ld = ld_of(io, LENS_R_FF, (size_t)F, 1);
            save(io, pl->in[i], out, ld, N, (size_t)F);
            save(io, pl->up[i], in, ld, N, (size_t)F);
            lens_glu_rows(io->pool, out, in, ld, N, F, (lens_glu)c->glu);
            break;
        }
        case LENS_OP_QK_NORM: {
            const size_t w = (size_t)o->heads * c->d_head_k;
            save(io, pl->in[i], out, w, N, w);
            lens_rmsnorm_forward(out, io->cache ? saved(io, pl->stats[i]) : NULL, out, o->ln->w, c->norm_unit_offset,
                                 (int)(N * w / o->dim), o->dim, c->ln_eps);
            break;
        }
        case LENS_OP_ROPE:
            lens_block_rope(c, o->rope, out, io->pos, N, N, o->heads, 0);
            break;
        case LENS_OP_REPEAT_KV:
            lens_repeat_kv(out, N, o->heads, c->n_heads, o->out == LENS_R_V ? c->d_head_v : c->d_head_k);
            break;
        case LENS_OP_SPLIT_QKV:
            split_qkv(c, io->ff, ld_of(io, LENS_R_FF, 3 * reg_width(c, LENS_R_Q), 1), N, io->q, io->k, io->v, 0);
            break;
        case LENS_OP_ATTEND:
            io->attend(io, l);
            break;
        case LENS_OP_MOE: {
            const lens_moe moe = moe_of(m, o);
            save(io, pl->in[i], in, (size_t)C, N, (size_t)C);
            lens_moe_forward(out, in, N, C, &moe, io->cache ? saved(io, pl->up[i]) : NULL, io->route, io->ff,
                             io->pool);
            break;
        }
        case LENS_OP_TAIL:
            break;
        }
    }
}

/* Layer l's ops from start(p) to the end: from the first op when start is
 * NULL or answers -1. Returns start's answer (-1 without start). */
static int forward_from(const lens_model *m, lens_block_io *io, int l, int (*start)(const lens_block_prog *p))
{
    lens_block_prog p;
    plan pl;
    build(m, l, &p);
    make_plan(m, &p, io->cache && io->cache->for_weights, &pl);
    const int at = start ? start(&p) : -1;
    forward_ops(m, io, l, &p, &pl, at < 0 ? 0 : at, p.n);
    return at;
}

void lens_block_forward(const lens_model *m, lens_block_io *io, int l)
{
    forward_from(m, io, l, NULL);
}

/* The index of p's ATTEND when the ops after it read no register the ops
 * before it wrote, X aside (the residual they leave alone), else -1. An
 * in-place op (ADD, GELU, GLU, QK_NORM, ROPE, REPEAT_KV, MOE) also reads
 * its output. */
static int attend_start(const lens_block_prog *p)
{
    int at = -1;
    for (int i = 0; i < p->n && at < 0; i++)
        if (p->op[i].kind == LENS_OP_ATTEND) at = i;
    if (at < 0) return -1;
    unsigned before = 0, after = 0;
    for (int i = 0; i < at; i++) before |= 1u << p->op[i].out;
    if (before & (1u << LENS_R_X)) return -1;
    for (int i = at + 1; i < p->n; i++) {
        const lens_op *o = &p->op[i];
        if (o->kind == LENS_OP_TAIL) continue;
        const int reads_out = o->kind != LENS_OP_LINEAR && o->kind != LENS_OP_NORM && o->kind != LENS_OP_COPY &&
                              o->kind != LENS_OP_SPLIT_QKV;
        unsigned reads = 1u << o->in;
        if (reads_out) reads |= 1u << o->out;
        if (reads & before & ~after & ~(1u << LENS_R_CTX)) return -1;
        after |= 1u << o->out;
    }
    return at;
}

int lens_block_forward_from_attend(const lens_model *m, lens_block_io *io, int l)
{
    return forward_from(m, io, l, attend_start) >= 0;
}

/* The index of p's attention output map, the LINEAR right after ATTEND that
 * reads its CTX, when a run may start after it: attend_start holds and no
 * later op reads CTX; else -1. */
static int attn_out_start(const lens_block_prog *p)
{
    const int at = attend_start(p);
    if (at < 0 || at + 1 >= p->n || p->op[at + 1].kind != LENS_OP_LINEAR || p->op[at + 1].in != LENS_R_CTX) return -1;
    for (int i = at + 2; i < p->n; i++) {
        const lens_op *o = &p->op[i];
        if (o->kind != LENS_OP_TAIL && (o->in == LENS_R_CTX || o->out == LENS_R_CTX)) return -1;
    }
    return at + 1;
}

int lens_block_attn_out(const lens_model *m, int l, const lens_linear **map)
{
    lens_block_prog p;
    build(m, l, &p);
    const int at = attn_out_start(&p);
    if (at < 0) return -1;
    *map = p.op[at].lin;
    return p.op[at].out;
}

/* The op after the attention output map, or -1. */
static int after_attn_out(const lens_block_prog *p)
{
    const int at = attn_out_start(p);
    return at < 0 ? -1 : at + 1;
}

void lens_block_forward_after_attn_out(const lens_model *m, lens_block_io *io, int l)
{
    forward_from(m, io, l, after_attn_out);
}

float *lens_block_register(const lens_block_io *io, int r)
{
    return r == LENS_R_UP ? NULL : reg(io, (lens_reg)r, io->N, 1, 0);
}

/* ------------------------------------------------------------ backward */

void lens_block_backward(const lens_model *m, lens_block_io *io, int l)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model, F = c->d_ff, off = c->norm_unit_offset;
    lens_block_prog p;
    plan pl;
    build(m, l, &p);
    make_plan(m, &p, io->cache->for_weights, &pl);
    int zero[LENS_R_COUNT];
    for (int r = 0; r < LENS_R_COUNT; r++) zero[r] = r != LENS_R_X;
    const int mlp = io->mlp_backward ? mlp_add(&p) : -1;
    for (int i = p.n - 1; i >= 0; i--) {
        const lens_op *o = &p.op[i];
        const int N = io->N;
        float *dout = reg(io, o->out, N, 0, F), *din = reg(io, o->in, N, 0, F);
        const float *inp = saved(io, pl.in[i]);
        switch (o->kind) {
        case LENS_OP_LINEAR:
            if (!zero[o->out]) {
                linear_backward(io, din, !zero[o->in], dout, inp, o->lin, N);
                zero[o->in] = 0;
            }
            zero[o->out] = 1;
            break;
        case LENS_OP_NORM:
            if (!zero[o->out]) {
                const float *stats = saved(io, pl.stats[i]);
                if (c->norm_rms) {
                    if (zero[o->in]) memset(din, 0, sizeof(float) * N * C);
                    lens_rmsnorm_backward(din, grad_of(io, o->ln->w), dout, inp, stats, o->ln->w, off, N, C);
                } else {
                    layernorm_backward(io, din, !zero[o->in], dout, inp, stats, stats + io->cache->rows,
                                                  o->ln, N, C);
                }
                zero[o->in] = 0;
            }
            zero[o->out] = 1;
            break;
        case LENS_OP_ADD:
        case LENS_OP_COPY:
            /* forward: out += y (or y += x): dy = d out */
            if (i == mlp) io->mlp_backward(io, l, dout);
            if (!zero[o->out]) {
                if (zero[o->in]) memcpy(din, dout, sizeof(float) * N * reg_width(c, o->in));
                else lens_residual_forward(din, dout, (size_t)N * reg_width(c, o->in));
                zero[o->in] = 0;
            }
            if (o->kind == LENS_OP_COPY) zero[o->out] = 1;
            break;
        case LENS_OP_GELU:
            lens_gelu_backward_rows(io->pool, dout, inp, (size_t)F, N, F, c->gelu_tanh);
            break;
        case LENS_OP_GLU: /* d up set, d gate in place of d out */
            if (zero[LENS_R_FF]) break;
            lens_glu_backward_inplace(dout, din, inp, saved(io, pl.up[i]), N, F, (size_t)F, (lens_glu)c->glu);
            zero[LENS_R_UP] = 0;
            break;
        case LENS_OP_QK_NORM:
            lens_rmsnorm_backward_inplace(dout, grad_of(io, o->ln->w), inp, saved(io, pl.stats[i]), o->ln->w, off,
                                          (int)(N * (size_t)o->heads * c->d_head_k / o->dim), o->dim);
            break;
        case LENS_OP_ROPE:
            lens_block_rope(c, o->rope, dout, io->pos, N, N, o->heads, 1);
            break;
        case LENS_OP_REPEAT_KV:
            sum_kv(dout, N, o->heads, c->n_heads, o->out == LENS_R_V ? c->d_head_v : c->d_head_k);
            break;
        case LENS_OP_SPLIT_QKV:
            split_qkv(c, io->ff, 3 * reg_width(c, LENS_R_Q), N, io->q, io->k, io->v, 1);
            zero[LENS_R_FF] = 0;
            zero[LENS_R_Q] = zero[LENS_R_K] = zero[LENS_R_V] = 1;
            break;
        case LENS_OP_MOE:
            if (!zero[o->out]) {
                const lens_moe moe = moe_of(m, o);
                lens_moe_backward(din, !zero[o->in], dout, inp, N, C, &moe, saved(io, pl.up[i]),
                                  io->grads ? moe_grad : NULL, io, io->ff, io->pool);
                zero[o->in] = 0;
            }
            zero[o->out] = 1;
            break;
        case LENS_OP_ATTEND:
            if (io->attend_backward(io, l)) return;
            zero[LENS_R_Q] = zero[LENS_R_K] = zero[LENS_R_V] = 0;
            zero[LENS_R_CTX] = 1;
            break;
        case LENS_OP_TAIL:
            break;
        }
    }
}

/* ------------------------------------------------------------ JVP */

/* Capacity in floats of register r of a JVP io (N rows). */
static size_t capacity(const lens_model *m, lens_reg r, int N)
{
    if (r == LENS_R_FF) return (size_t)N * lens_ff_cols(m);
    return (size_t)N * reg_width(&m->cfg, r);
}

/* Two registers no op before ATTEND touches, holding at least `a` and `b`
 * floats (the one-row JVP's gather and product), or -1. */
static int free_pair(const lens_model *m, const lens_block_prog *p, int N, size_t a, size_t b, lens_reg *ra,
                     lens_reg *rb)
{
    static const lens_reg order[] = {LENS_R_H, LENS_R_N, LENS_R_CTX, LENS_R_V, LENS_R_K, LENS_R_FF};
    int used[LENS_R_COUNT] = {0};
    for (int i = 0; i < p->n && p->op[i].kind != LENS_OP_ATTEND; i++) {
        used[p->op[i].out] = used[p->op[i].in] = 1;
        if (p->op[i].kind == LENS_OP_SPLIT_QKV) used[LENS_R_Q] = used[LENS_R_K] = used[LENS_R_V] = 1;
    }
    int found = 0;
    for (size_t k = 0; k < sizeof order / sizeof *order && found < 2; k++) {
        const lens_reg r = order[k];
        if (used[r] || capacity(m, r, N) < (found ? b : a)) continue;
        if (found++) *rb = r;
        else *ra = r, used[r] = 1;
    }
    return found == 2 ? 0 : -1;
}

static void linear_jvp(const lens_model *m, const lens_block_io *io, const lens_block_prog *p, float *out,
                       const float *in, const lens_linear *lin, int mixed)
{
    const int row = io->jvp_row, N = io->N;
    const int T = io->cache->rows, B = N / T, IN = lin->in, OUT = lin->out;
    lens_reg ga, pr;
    if (mixed || row < 0 || free_pair(m, p, N, (size_t)B * IN, (size_t)B * OUT, &ga, &pr)) {
        lens_linear_jvp(out, in, lin, N, io->pool);
        return;
    }
    /* only row `row` of each copy is non-zero: map those B rows, the rest of out is zero */
    float *gather = reg(io, ga, N, 0, m->cfg.d_ff), *prod = reg(io, pr, N, 0, m->cfg.d_ff);
    for (int b = 0; b < B; b++) memcpy(gather + (size_t)b * IN, in + ((size_t)b * T + row) * IN, sizeof(float) * IN);
    lens_linear_jvp(prod, gather, lin, B, io->pool);
    memset(out, 0, sizeof(float) * (size_t)N * OUT);
    for (int b = 0; b < B; b++) memcpy(out + ((size_t)b * T + row) * OUT, prod + (size_t)b * OUT, sizeof(float) * OUT);
}

static void row_jac_apply(const lens_block_io *io, float *out, const float *in, const float *packed, int C)
{
    const int T = io->cache->rows;
    const size_t ld = (size_t)T * C, size = lens_gemm_packed_size(C, C); /* row j of every tangent: stride T·C */
    for (int j = 0; j < T; j++) {
        const lens_gemm_args g = {.M = io->N / T, .N = C, .K = C, .x = in + (size_t)j * C, .ldx = ld,
                                  .packed = packed + j * size, .y = out + (size_t)j * C, .ldy = ld};
        lens_gemm(&g, io->pool);
    }
}

/* Ops [from, to) of p as a JVP (io->row_jac: the tail by its Jacobians). */
static void jvp_ops(const lens_model *m, lens_block_io *io, int l, const lens_block_prog *p, const plan *pl, int from,
                    int to)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model, F = c->d_ff, T = io->cache->rows, N = io->N, B = N / T, off = c->norm_unit_offset;
    int mixed = 0;
    for (int i = 0; i < from; i++) mixed |= p->op[i].kind == LENS_OP_ATTEND;
    for (int i = from; i < to; i++) {
        const lens_op *o = &p->op[i];
        float *out = reg(io, o->out, N, 0, F), *in = reg(io, o->in, N, 0, F);
        const float *inp = saved(io, pl->in[i]);
        switch (o->kind) {
        case LENS_OP_LINEAR:
            linear_jvp(m, io, p, out, in, o->lin, mixed);
            break;
        case LENS_OP_NORM: {
            const float *stats = saved(io, pl->stats[i]);
            if (c->norm_rms)
                for (int b = 0; b < B; b++)
                    lens_rmsnorm_jvp(out + (size_t)b * T * C, in + (size_t)b * T * C, inp, stats, o->ln->w, off, T, C);
            else lens_layernorm_jvp(out, in, inp, stats, stats + T, o->ln, B, T, C, io->row_scratch);
            break;
        }
        case LENS_OP_ADD:
            lens_residual_forward(out, in, (size_t)N * reg_width(c, o->in));
            break;
        case LENS_OP_COPY:
            memcpy(out, in, sizeof(float) * N * reg_width(c, o->in));
            break;
        case LENS_OP_GELU:
            lens_gelu_jvp(out, inp, B, (size_t)T * F, c->gelu_tanh);
            break;
        case LENS_OP_GLU:
            for (int b = 0; b < B; b++) {
                const size_t at = (size_t)b * T * F;
                lens_glu_jvp(out + at, out + at, in + at, inp, saved(io, pl->up[i]), T, F, (size_t)F, (lens_glu)c->glu);
            }
            break;
        case LENS_OP_QK_NORM: {
            const size_t w = (size_t)o->heads * c->d_head_k;
            for (int b = 0; b < B; b++)
                lens_rmsnorm_jvp(out + b * T * w, out + b * T * w, inp, saved(io, pl->stats[i]), o->ln->w, off,
                                 (int)(T * w / o->dim), o->dim);
            break;
        }
        case LENS_OP_ROPE:
            lens_block_rope(c, o->rope, out, NULL, N, T, o->heads, 0);
            break;
        case LENS_OP_REPEAT_KV:
            lens_repeat_kv(out, N, o->heads, c->n_heads, o->out == LENS_R_V ? c->d_head_v : c->d_head_k);
            break;
        case LENS_OP_SPLIT_QKV:
            split_qkv(c, io->ff, 3 * reg_width(c, LENS_R_Q), N, io->q, io->k, io->v, 0);
            break;
        case LENS_OP_ATTEND:
            io->attend_jvp(io, l);
            mixed = 1;
            break;
        case LENS_OP_MOE: {
            const lens_moe moe = moe_of(m, o);
            lens_moe_jvp(out, in, N, T, C, &moe, saved(io, pl->up[i]), io->ff, io->pool);
            break;
        }
        case LENS_OP_TAIL:
            if (io->row_jac) {
                /* the tail's input is the sum the previous op wrote */
                const lens_reg r = p->op[i - 1].out;
                if (r == LENS_R_X) memcpy(io->h, io->x, sizeof(float) * N * C);
                row_jac_apply(io, io->x, r == LENS_R_X ? io->h : reg(io, r, N, 0, F), io->row_jac, C);
                return;
            }
            break;
        }
    }
}

void lens_block_jvp(const lens_model *m, lens_block_io *io, int l)
{
    lens_block_prog p;
    plan pl;
    build(m, l, &p);
    make_plan(m, &p, io->cache->for_weights, &pl);
    jvp_ops(m, io, l, &p, &pl, 0, p.n);
}

int lens_block_has_tail(const lens_model *m, int l)
{
    lens_block_prog p;
    build(m, l, &p);
    for (int i = 0; i < p.n; i++)
        if (p.op[i].kind == LENS_OP_TAIL) return 1;
    return 0;
}

void lens_block_row_jacobian(const lens_model *m, lens_block_io *io, int l, float *jac)
{
    const int C = m->cfg.d_model, T = io->cache->rows, chunk = io->N / T;
    lens_block_prog p;
    plan pl;
    build(m, l, &p);
    make_plan(m, &p, io->cache->for_weights, &pl);
    if (pl.tail < 1) return;
    const lens_reg in = p.op[pl.tail - 1].out;
    lens_block_io t = *io;
    t.row_jac = NULL, t.jvp_row = -1;
    for (int b0 = 0; b0 < C; b0 += chunk) {
        const int nb = C - b0 < chunk ? C - b0 : chunk;
        t.N = nb * T;
        t.x = jac + (size_t)b0 * T * C; /* tangent k's rows are jac[b0 + k] */
        float *u = reg(&t, in, t.N, 0, m->cfg.d_ff);
        memset(u, 0, sizeof(float) * (size_t)t.N * C);
        for (int k = 0; k < nb; k++)
            for (int j = 0; j < T; j++) u[((size_t)k * T + j) * C + b0 + k] = 1.0f;
        jvp_ops(m, &t, l, &p, &pl, pl.tail + 1, p.n);
    }
}

void lens_block_row_jac_pack(float *packed, const float *jac, int T, int C)
{
    const size_t size = lens_gemm_packed_size(C, C);
    for (int j = 0; j < T; j++) lens_gemm_pack(packed + j * size, jac + (size_t)j * C, C, C, (size_t)T * C, 1);
}

/* ------------------------------------------------------------ sizes */

int lens_block_attn_qk(const lens_model *m, int l, const float *h, int T, float *q, float *k)
{
    const lens_config *c = &m->cfg;
    const size_t C = c->d_model, VO = (size_t)c->n_heads * c->d_head_v;
    lens_block_prog p;
    plan pl;
    build(m, l, &p);
    make_plan(m, &p, 0, &pl);
    int attend = 0;
    while (attend < p.n && p.op[attend].kind != LENS_OP_ATTEND) attend++;
    float *x = malloc(sizeof(float) * T * C * 3), *v = malloc(sizeof(float) * T * VO);
    float *ff = malloc(sizeof(float) * T * (size_t)lens_ff_cols(m));
    if (!x || !v || !ff) {
        free(x), free(v), free(ff);
        return -1;
    }
    memcpy(x, h, sizeof(float) * T * C);
    lens_block_io io = {.N = T, .x = x, .h = x + T * C, .n = x + 2 * T * C, .q = q, .k = k, .v = v, .ff = ff};
    forward_ops(m, &io, l, &p, &pl, 0, attend);
    free(x), free(v), free(ff);
    return 0;
}

size_t lens_block_cache_floats(const lens_model *m, int l, int for_weights)
{
    lens_block_prog p;
    plan pl;
    build(m, l, &p);
    make_plan(m, &p, for_weights, &pl);
    return pl.floats;
}

int lens_block_cache_init(lens_block_cache *cache, const lens_model *m, int l, int rows, int for_weights)
{
    const lens_config *cfg = &m->cfg;
    const size_t R = (size_t)(rows > 0 ? rows : 1);
    const size_t QK = (size_t)cfg->n_heads * cfg->d_head_k, VO = (size_t)cfg->n_heads * cfg->d_head_v;
    const size_t own = lens_block_cache_floats(m, l, for_weights);
    memset(cache, 0, sizeof *cache);
    cache->rows = rows, cache->for_weights = for_weights;
    if (l < cfg->n_layers) {
        cache->q = malloc(R * QK * sizeof(float));
        cache->k = malloc(R * QK * sizeof(float));
        cache->v = malloc(R * VO * sizeof(float));
        if (!cache->q || !cache->k || !cache->v) return -1;
    }
    cache->buf = malloc((own ? R * own : 1) * sizeof(float));
    return cache->buf ? 0 : -1;
}

void lens_block_cache_free(lens_block_cache *cache)
{
    free(cache->q), free(cache->k), free(cache->v), free(cache->buf);
    memset(cache, 0, sizeof *cache);
}

int lens_ff_cols(const lens_model *m)
{
    const lens_config *c = &m->cfg;
    size_t cols = (size_t)c->d_ff;
    for (int l = 0; l < c->n_layers; l++) {
        lens_block_prog p;
        build(m, l, &p);
        for (int i = 0; i < p.n; i++) {
            const lens_op *o = &p.op[i];
            size_t w = 0;
            if (o->kind == LENS_OP_LINEAR && o->out == LENS_R_FF) w = (size_t)o->lin->out;
            if (o->kind == LENS_OP_GLU || (o->kind == LENS_OP_LINEAR && o->out == LENS_R_UP)) w = 2 * (size_t)c->d_ff;
            if (o->kind == LENS_OP_MOE) {
                const lens_moe moe = moe_of(m, o);
                w = lens_moe_scratch_floats(&moe, c->d_model);
            }
            if (w > cols) cols = w;
        }
    }
    return (int)cols;
}
