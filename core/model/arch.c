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
