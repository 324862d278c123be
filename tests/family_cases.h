/* family_cases.h - the table of model families the analysis tests run over
 * (test_families.c, test_blocks.c): one row per (family, task), each built
 * as a random "micro" checkpoint with lens_mkmodel. A new family adds its
 * rows here and inherits every check; family_cases_check() fails when the
 * table is empty or a family in lens_families has no row, and prints the
 * case count. */
#ifndef LENS_FAMILY_CASES_H
#define LENS_FAMILY_CASES_H

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "core/model/arch.h"
#include "core/model/mkmodel.h"

typedef struct {
    const char *arch, *task;
} family_case;

static const family_case family_cases[] = {
    {"bert", "classification"},    {"bert", "masked-lm"},       {"gpt2", "causal-lm"},
    {"roberta", "classification"}, {"roberta", "masked-lm"},    {"roberta", "encoder"},
    {"distilbert", "classification"}, {"distilbert", "masked-lm"}, {"distilbert", "encoder"},
    {"llama", "causal-lm"},        {"mistral", "causal-lm"},    {"qwen2", "causal-lm"},
    {"qwen3", "causal-lm"},        {"gemma", "causal-lm"},      {"gemma2", "causal-lm"},
    {"gpt_neox", "causal-lm"},     {"phi3", "causal-lm"},
    {"olmo2", "causal-lm"},
    {"xlm-roberta", "classification"}, {"xlm-roberta", "masked-lm"}, {"xlm-roberta", "encoder"},
    {"gemma3_text", "causal-lm"},
    {"modernbert", "classification"}, {"modernbert", "masked-lm"}, {"modernbert", "encoder"},
    {"mixtral", "causal-lm"},      {"qwen3_moe", "causal-lm"},  {"olmoe", "causal-lm"},
    {"gpt_oss", "causal-lm"},
};
#define N_FAMILY_CASES ((int)(sizeof family_cases / sizeof family_cases[0]))

static inline void family_cases_check(void)
{
    int n_families = 0;
    for (int i = 0; lens_families[i]; i++, n_families++) {
        int covered = 0;
        for (int k = 0; k < N_FAMILY_CASES; k++) covered |= !strcmp(family_cases[k].arch, lens_families[i]->model_type);
        CHECK(covered, "family %s has no case in the table", lens_families[i]->model_type);
    }
    CHECK(N_FAMILY_CASES > 0 && n_families > 0, "empty table");
    printf("%d cases over %d families\n", N_FAMILY_CASES, n_families);
}

/* A micro checkpoint of arch / task written to dir with config.json's
 * member key set to value (a variant no case has, ModernBERT's
 * classifier_pooling "mean"), loaded; NULL with err. */
static inline lens_model *family_variant_load(const char *arch, const char *task, unsigned long long seed,
                                              const char *dir, const char *key, const char *value, lens_err *err)
{
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (lens_mkmodel(arch, "micro", task, seed, dir, err)) return NULL;
    json_t *cfg = json_load_file(path, 0, NULL);
    const int ok =
        cfg && !json_object_set_new(cfg, key, json_string(value)) && !json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
    CHECK(ok, "rewrite %s", path);
    return ok ? lens_model_load(dir, err) : NULL;
}

#endif
