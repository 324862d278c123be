/* arch.c - the table of model families and the one walker of their tensor
 * tables.
 *
 * lens_walk_params lists a family's tensors from its table (arch.h,
 * lens_tensor_section); the visitor decides what a tensor is: a view into a
 * loaded checkpoint (model.c), a slot of the trainer's parameter buffer
 * (train.c) or random data to write (mkmodel.c). */
#include "core/model/arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/gemm.h"
#include "core/nn/ops.h"

/* The registry: a family is its file and its line here. */
extern const lens_family lens_family_bert, lens_family_gpt2, lens_family_roberta, lens_family_distilbert,
    lens_family_llama, lens_family_mistral, lens_family_qwen2, lens_family_qwen3, lens_family_gemma,
    lens_family_gemma2, lens_family_gpt_neox, lens_family_phi3, lens_family_olmo2, lens_family_xlm_roberta,
    lens_family_gemma3_text, lens_family_modernbert, lens_family_mixtral, lens_family_qwen3_moe, lens_family_olmoe,
    lens_family_gpt_oss;
const lens_family *const lens_families[] = {&lens_family_bert, &lens_family_gpt2, &lens_family_roberta,
                                            &lens_family_distilbert, &lens_family_llama, &lens_family_mistral,
                                            &lens_family_qwen2, &lens_family_qwen3, &lens_family_gemma,
                                            &lens_family_gemma2, &lens_family_gpt_neox, &lens_family_phi3, &lens_family_olmo2,
                                            &lens_family_xlm_roberta, &lens_family_gemma3_text,
                                            &lens_family_modernbert, &lens_family_mixtral, &lens_family_qwen3_moe,
                                            &lens_family_olmoe, &lens_family_gpt_oss, NULL};

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

int lens_dim_size(const lens_config *c, lens_dim d)
{
    const int NH = c->n_heads, NKV = lens_kv_heads(c), DK = c->d_head_k, DV = c->d_head_v;
    switch (d) {
    case LENS_D_NONE: return 0;
    case LENS_D_C: return c->d_model;
    case LENS_D_F: return c->d_ff;
    case LENS_D_2F: return 2 * c->d_ff;
    case LENS_D_V: return c->vocab_size;
    case LENS_D_POS: return c->max_positions + c->position_offset;
    case LENS_D_TYPES: return c->type_vocab_size;
    case LENS_D_LABELS: return c->n_labels;
    case LENS_D_DK: return DK;
    case LENS_D_QK: return NH * DK;
    case LENS_D_VO: return NH * DV;
    case LENS_D_KV: return NKV * DK;
    case LENS_D_KVV: return NKV * DV;
    case LENS_D_QKV: return NH * DK + NKV * DK + NKV * DV;
    case LENS_D_NH: return NH;
    case LENS_D_DH: return NH > 0 ? c->d_model / NH : 0;
    case LENS_D_E: return c->n_experts;
    case LENS_D_FE: return c->d_ff_expert;
    case LENS_D_2FE: return 2 * c->d_ff_expert;
    }
    return 0;
}

/* Does every LENS_IF_* condition in `when` hold for c at layer l (-1: no layer)? */
static int holds(const lens_config *c, unsigned when, int l)
{
    const unsigned now = (c->task == LENS_TASK_CLASSIFICATION ? LENS_IF_CLASSIFIER : 0) |
                         (c->task == LENS_TASK_MASKED_LM ? LENS_IF_MLM : 0) |
                         (c->task == LENS_TASK_CAUSAL_LM && !c->tie_word_embeddings ? LENS_IF_UNTIED_LM : 0) |
                         (c->qkv_bias ? LENS_IF_QKV_BIAS : 0) | (c->o_bias ? LENS_IF_O_BIAS : 0) |
                         (c->qk_norm ? LENS_IF_QK_NORM : 0) |
                         (c->post_norms ? LENS_IF_POST_NORMS : LENS_IF_NO_POST_NORMS) |
                         (l > 0 ? LENS_IF_NOT_FIRST_LAYER : 0) |
                         (lens_layer_moe(c, l) ? LENS_IF_MOE : LENS_IF_DENSE) | (c->attn_sinks ? LENS_IF_SINKS : 0);
    return (when & ~now) == 0;
}

static const void *walk_tensor(lens_param_visitor *v, const char *name, int64_t d0, int64_t d1, lens_param_kind kind,
                               float init_std, int summed)
{
    if (v->failed) return NULL;
    const lens_param_desc d = {.name = name, .ndim = d1 ? 2 : 1, .shape = {d0, d1}, .kind = kind,
                               .init_std = init_std, .summed = summed};
    return v->tensor(v, &d);
}

/* A LENS_T_EXPERTS row: W [E][in][out] and b [E][out] as the E experts' maps y = x W_e + b_e, expert e's
 * at dst + e * sizeof(lens_moe_expert). */
static void walk_experts(const lens_config *c, lens_param_visitor *v, const char *name, const char *bias, int in,
                         int out, float init, float noise, char *dst)
{
    const int E = c->n_experts;
    const lens_param_desc dw = {.name = name, .ndim = 3, .shape = {E, in, out}, .kind = LENS_PARAM_WEIGHT,
                                .init_std = init};
    const lens_param_desc db = {.name = bias, .ndim = 2, .shape = {E, out}, .kind = LENS_PARAM_BIAS,
                                .init_std = noise};
    const void *w = v->failed ? NULL : v->tensor(v, &dw);
    const lens_dtype dtype = v->dtype;
    const float *b = v->failed ? NULL : v->tensor(v, &db);
    for (int e = 0; e < E; e++) {
        const size_t at = (size_t)e * in * out;
        *(lens_linear *)(dst + (size_t)e * sizeof(lens_moe_expert)) =
            (lens_linear){.w = w ? lens_dtype_at(w, dtype, at) : NULL, .b = b ? b + (size_t)e * out : NULL, .in = in,
                          .out = out, .ld = out, .w_in_out = 1, .dtype = dtype};
    }
}

/* name = prefix (its "%d"s the layer and expert indices) + row + suffix. */
static void tensor_name(char *name, size_t size, const char *prefix, int layer, int expert, const char *row,
                        const char *suffix)
{
    const int index[2] = {layer, expert};
    size_t n = 0;
    for (int k = 0; *prefix && n < size; k++) {
        const char *at = k < 2 ? strstr(prefix, "%d") : NULL;
        const int len = at ? (int)(at - prefix) : (int)strlen(prefix);
        n += (size_t)snprintf(name + n, size - n, "%.*s", len, prefix);
        if (at && n < size) n += (size_t)snprintf(name + n, size - n, "%d", index[k]);
        prefix += len + (at ? 2 : 0);
    }
    if (n < size) snprintf(name + n, size - n, "%s%s", row, suffix);
}

/* The views of a fused map lin: its parts' outputs in order, into the
 * lens_block maps the split names. */
static void split_views(const lens_config *c, const lens_tensor_row *r, lens_block *blk, const lens_linear *lin)
{
    lens_linear *parts[3] = {&blk->q, &blk->k, &blk->v};
    int sizes[3] = {lens_dim_size(c, LENS_D_QK), lens_dim_size(c, LENS_D_KV), lens_dim_size(c, LENS_D_KVV)};
    if (r->split == LENS_SPLIT_GATE_UP) {
        parts[0] = &blk->gate, parts[1] = &blk->ff_in, parts[2] = NULL;
        sizes[0] = sizes[1] = c->d_ff;
    }
    for (int i = 0, first = 0; i < 3 && parts[i]; first += sizes[i++]) {
        /* part i: output rows first .. of W [out][in], or columns of a Conv1D's [in][out] */
        *parts[i] = *lin;
        parts[i]->w = lin->w ? lens_dtype_at(lin->w, lin->dtype, lin->w_in_out ? (size_t)first
                                                                               : (size_t)first * lin->ld)
                             : NULL;
        parts[i]->b = lin->b ? lin->b + first : NULL;
        parts[i]->out = sizes[i];
    }
}

/* One row of a section: its tensors through v, bound at dst. */
static void walk_row(const lens_config *c, lens_param_visitor *v, const lens_tensor_row *r, const char *prefix,
                     int layer, int expert, char *dst)
{
    const float std = c->init_range > 0 ? c->init_range : 0.02f;
    const float init = r->init == LENS_INIT_RESID ? std / sqrtf(2.0f * c->n_layers) : std;
    const float noise = r->init == LENS_INIT_NOISE ? 0.1f : 0.0f;
    const int d0 = lens_dim_size(c, r->d0), d1 = lens_dim_size(c, r->d1);
    char name[256], bias[256];
    const int whole = r->kind == LENS_T_EMBEDDING || r->kind == LENS_T_VECTOR; /* the name is the tensor's */
    tensor_name(name, sizeof name, prefix, layer, expert, r->name, whole ? "" : ".weight");
    tensor_name(bias, sizeof bias, prefix, layer, expert, r->name, ".bias");
    switch (r->kind) {
    case LENS_T_EMBEDDING:
        *(const void **)dst = walk_tensor(v, name, d0, d1, LENS_PARAM_EMBEDDING, init, 0);
        return;
    case LENS_T_VECTOR:
        *(const float **)dst = walk_tensor(v, name, d0, 0, LENS_PARAM_BIAS, noise, 0);
        return;
    case LENS_T_LAYERNORM:
    case LENS_T_LAYERNORM_NB:
    case LENS_T_RMSNORM: {
        lens_layernorm *ln = (lens_layernorm *)dst;
        /* a unit-offset gain is a zero-initialised, undecayed offset: the bias kind's init */
        const int offset = r->kind == LENS_T_RMSNORM && c->norm_unit_offset;
        ln->w = walk_tensor(v, name, d0, 0, offset ? LENS_PARAM_NORM_BIAS : LENS_PARAM_NORM_WEIGHT, noise, 0);
        ln->b = r->kind == LENS_T_LAYERNORM ? walk_tensor(v, bias, d0, 0, LENS_PARAM_NORM_BIAS, 0, 0) : NULL;
        return;
    }
    case LENS_T_EXPERTS:
        tensor_name(name, sizeof name, prefix, layer, expert, r->name, "");
        tensor_name(bias, sizeof bias, prefix, layer, expert, r->name, "_bias");
        walk_experts(c, v, name, bias, d0, d1, init, noise, dst);
        return;
    case LENS_T_LINEAR:
    case LENS_T_LINEAR_NB:
    case LENS_T_CONV1D: {
        /* out = d0, in = d1; summed heads: [C][DV] in the file, the concat map NH*DV -> C here, row
         * stride DV until the loader tiles it (or NH*DV when the visitor tiles) */
        const int conv1d = r->kind == LENS_T_CONV1D, summed = r->summed && c->head_combination;
        const int has_bias = r->kind != LENS_T_LINEAR_NB || (r->bias_if && holds(c, r->bias_if, layer));
        lens_linear lin = {.in = d1, .out = d0, .ld = conv1d ? d0 : d1, .w_in_out = conv1d};
        if (summed) {
            lin.w = walk_tensor(v, name, d0, c->d_head_v, LENS_PARAM_WEIGHT, init, 1);
            lin.ld = v->tiles_summed ? d1 : c->d_head_v;
        } else {
            lin.w = conv1d ? walk_tensor(v, name, d1, d0, LENS_PARAM_WEIGHT, init, 0)
                           : walk_tensor(v, name, d0, d1, LENS_PARAM_WEIGHT, init, 0);
        }
        lin.dtype = v->dtype;
        lin.b = has_bias ? walk_tensor(v, bias, d0, 0, LENS_PARAM_BIAS, 0, 0) : NULL;
        if (r->split == LENS_SPLIT_NONE) *(lens_linear *)dst = lin;
        else split_views(c, r, (lens_block *)dst, &lin);
        return;
    }
    }
}

void lens_walk_params(const lens_config *c, lens_params *p, lens_param_visitor *v)
{
    for (const lens_tensor_section *s = c->family->tensors; s->rows; s++)
        for (int l = 0; l < (s->per_layer ? c->n_layers : 1); l++) {
            const int layer = s->per_layer ? l : -1, per_expert = s->per_layer == LENS_PER_EXPERT;
            for (int e = 0; e < (per_expert ? c->n_experts : 1); e++) {
                /* a split row binds several fields of the block: dst is the block itself */
                char *base = per_expert ? (char *)&p->blocks[l].experts[e]
                                           : s->per_layer ? (char *)&p->blocks[l] : (char *)p;
                for (const lens_tensor_row *r = s->rows; r->name; r++)
                    if (holds(c, r->when, layer)) walk_row(c, v, r, s->prefix, l, e, r->split ? base : base + r->field);
            }
        }
}
