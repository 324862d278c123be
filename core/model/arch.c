/* arch.c - the table of model families and the walker helpers they share.
 *
 * A family's walker (bert.c, gpt2.c, ...) lists its tensors with
 * lens_walk_linear / lens_walk_layernorm / lens_walk_tensor; the visitor
 * decides what a tensor is: a view into a loaded checkpoint (model.c), a
 * slot of the trainer's parameter buffer (train.c) or random data to write
 * (mkmodel.c). */
#include "core/model/arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/ops.h"

const lens_family *const lens_families[] = {&lens_family_bert, &lens_family_gpt2, &lens_family_roberta,
                                            &lens_family_distilbert, &lens_family_llama, &lens_family_mistral,
                                            &lens_family_qwen2, &lens_family_qwen3, &lens_family_gemma,
                                            &lens_family_gemma2, &lens_family_gpt_neox, NULL};

const lens_family *lens_family_find(const char *model_type)
{
    for (int i = 0; lens_families[i]; i++)
        if (!strcmp(lens_families[i]->model_type, model_type)) return lens_families[i];
    return NULL;
}

const char *lens_family_names(void)
{
    static char names[256];
    if (!names[0]) {
        size_t n = 0;
        for (int i = 0; lens_families[i] && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", lens_families[i]->model_type);
    }
    return names;
}

const void *lens_walk_tensor(lens_param_visitor *v, const char *name, int64_t d0, int64_t d1,
                             lens_param_kind kind, float init_std)
{
    if (v->failed) return NULL;
    const lens_param_desc d = {.name = name, .ndim = d1 ? 2 : 1, .shape = {d0, d1}, .kind = kind,
                               .init_std = init_std};
    return v->tensor(v, &d);
}

void lens_walk_linear(lens_param_visitor *v, lens_linear *lin, const char *base, int in, int out, int conv1d,
                      float init_std)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", base);
    lin->w = conv1d ? lens_walk_tensor(v, name, in, out, LENS_PARAM_WEIGHT, init_std)
                    : lens_walk_tensor(v, name, out, in, LENS_PARAM_WEIGHT, init_std);
    lin->dtype = v->dtype;
    snprintf(name, sizeof name, "%s.bias", base);
    lin->b = lens_walk_tensor(v, name, out, 0, LENS_PARAM_BIAS, 0);
    lin->in = in, lin->out = out, lin->ld = conv1d ? out : in, lin->w_in_out = conv1d, lin->packed = NULL;
}

void lens_walk_linear_bias(lens_param_visitor *v, lens_linear *lin, const char *base, int in, int out, int bias,
                           float init_std)
{
    if (bias) {
        lens_walk_linear(v, lin, base, in, out, 0, init_std);
        return;
    }
    char name[256];
    snprintf(name, sizeof name, "%s.weight", base);
    *lin = (lens_linear){.w = lens_walk_tensor(v, name, out, in, LENS_PARAM_WEIGHT, init_std), .in = in, .out = out,
                         .ld = in};
    lin->dtype = v->dtype;
}

void lens_walk_rmsnorm(lens_param_visitor *v, lens_layernorm *ln, const char *base, int C, int unit_offset,
                       float noise)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", base);
    /* a unit-offset gain is a zero-initialised, undecayed offset: the bias kind's init */
    ln->w = lens_walk_tensor(v, name, C, 0, unit_offset ? LENS_PARAM_NORM_BIAS : LENS_PARAM_NORM_WEIGHT, noise);
    ln->b = NULL;
}

void lens_walk_layernorm(lens_param_visitor *v, lens_layernorm *ln, const char *base, int C)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", base);
    ln->w = lens_walk_tensor(v, name, C, 0, LENS_PARAM_NORM_WEIGHT, 0);
    snprintf(name, sizeof name, "%s.bias", base);
    ln->b = lens_walk_tensor(v, name, C, 0, LENS_PARAM_NORM_BIAS, 0);
}

/* ------------------------------------------------------------ block caches */

int lens_block_cache_init(lens_block_cache *cache, const lens_config *cfg, int rows, int for_weights, int final)
{
    const lens_family *f = cfg->family;
    const size_t R = (size_t)(rows > 0 ? rows : 1);
    const size_t QK = (size_t)cfg->n_heads * cfg->d_head_k, VO = (size_t)cfg->n_heads * cfg->d_head_v;
    const size_t own = final ? (f->final_cache_floats ? f->final_cache_floats(cfg, for_weights) : 0)
                             : f->cache_floats(cfg, for_weights);
    memset(cache, 0, sizeof *cache);
    cache->rows = rows, cache->for_weights = for_weights;
    if (!final) {
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

static float *grad_of(const lens_block_io *io, const float *param)
{
    return io->grads && param ? io->grads->of(io->grads, param) : NULL;
}

void lens_block_linear_backward(const lens_block_io *io, float *dinp, int acc, const float *dout, const float *inp,
                                const lens_linear *lin, int N)
{
    if (!io->grads) { /* the packed GEMM on the pool */
        lens_gemm_linear_backward(dinp, dout, lin, N, acc, io->pool);
        return;
    }
    if (dinp && !acc) memset(dinp, 0, sizeof(float) * (size_t)N * lin->in);
    lens_linear_backward(dinp, grad_of(io, lin->w), grad_of(io, lin->b), dout, inp, lin, N);
}

void lens_block_layernorm_backward(const lens_block_io *io, float *dinp, int acc, const float *dout,
                                   const float *inp, const float *mean, const float *rstd, const lens_layernorm *ln,
                                   int N, int C)
{
    if (!acc) memset(dinp, 0, sizeof(float) * (size_t)N * C);
    if (!io->grads) lens_layernorm_backward_rows(io->pool, dinp, dout, inp, mean, rstd, ln, N, C);
    else lens_layernorm_backward(dinp, grad_of(io, ln->w), grad_of(io, ln->b), dout, inp, mean, rstd, ln, N, C);
}

void lens_block_linear_jvp(const lens_block_io *io, float *out, const float *in, const lens_linear *lin,
                           float *gather, float *prod)
{
    const int row = io->jvp_row;
    if (row < 0) {
        lens_linear_jvp(out, in, lin, io->N, io->pool);
        return;
    }
    /* only row `row` of each copy is non-zero: map those B rows, the rest of out is zero */
    const int T = io->cache->rows, B = io->N / T, IN = lin->in, OUT = lin->out;
    for (int b = 0; b < B; b++) memcpy(gather + (size_t)b * IN, in + ((size_t)b * T + row) * IN, sizeof(float) * IN);
    lens_linear_jvp(prod, gather, lin, B, io->pool);
    memset(out, 0, sizeof(float) * (size_t)io->N * OUT);
    for (int b = 0; b < B; b++) memcpy(out + ((size_t)b * T + row) * OUT, prod + (size_t)b * OUT, sizeof(float) * OUT);
}

void lens_block_row_jac_pack(float *packed, const float *jac, int T, int C)
{
    const size_t size = lens_gemm_packed_size(C, C);
    for (int j = 0; j < T; j++) lens_gemm_pack(packed + j * size, jac + (size_t)j * C, C, C, (size_t)T * C, 1);
}

void lens_block_row_jac_apply(const lens_block_io *io, float *out, const float *in, const float *packed, int C)
{
    const int T = io->cache->rows;
    const size_t ld = (size_t)T * C, size = lens_gemm_packed_size(C, C); /* row j of every tangent: stride T·C */
    for (int j = 0; j < T; j++) {
        const lens_gemm_args g = {.M = io->N / T, .N = C, .K = C, .x = in + (size_t)j * C, .ldx = ld,
                                  .packed = packed + j * size, .y = out + (size_t)j * C, .ldy = ld};
        lens_gemm(&g, io->pool);
    }
}

void lens_block_row_jacobian(lens_block_io *io, int C, float *jac,
                             void (*tail)(const lens_model *m, lens_block_io *io, int l), const lens_model *m, int l)
{
    const int T = io->cache->rows, chunk = io->N / T;
    lens_block_io t = *io;
    for (int b0 = 0; b0 < C; b0 += chunk) {
        const int nb = C - b0 < chunk ? C - b0 : chunk;
        t.N = nb * T;
        memset(t.h, 0, sizeof(float) * (size_t)t.N * C);
        for (int k = 0; k < nb; k++)
            for (int j = 0; j < T; j++) t.h[((size_t)k * T + j) * C + b0 + k] = 1.0f;
        t.x = jac + (size_t)b0 * T * C; /* tangent k's rows are jac[b0 + k] */
        tail(m, &t, l);
    }
}

void lens_block_copy_rows(float *dst, const float *src, size_t ld, int N, int W)
{
    if (ld == (size_t)W) memcpy(dst, src, sizeof(float) * N * W);
    else
        for (int n = 0; n < N; n++) memcpy(dst + (size_t)n * W, src + n * ld, sizeof(float) * W);
}

size_t lens_ln_block_cache_floats(const lens_config *c, int for_weights)
{
    const size_t C = c->d_model, F = c->d_ff, VO = (size_t)c->n_heads * c->d_head_v;
    return 2 * C + F + 4 + (for_weights ? 2 * C + VO + F : 0);
}

void lens_block_gelu_mlp_jvp(const lens_model *m, const lens_block *blk, lens_block_io *io, float *out,
                             const float *in, const float *ff_pre)
{
    const int T = io->cache->rows;
    lens_linear_jvp(io->ff, in, &blk->ff_in, io->N, io->pool);
    lens_gelu_jvp(io->ff, ff_pre, io->N / T, (size_t)T * m->cfg.d_ff, m->cfg.gelu_tanh);
    lens_linear_jvp(out, io->ff, &blk->ff_out, io->N, io->pool);
}
