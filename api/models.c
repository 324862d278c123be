/* models.c - finding resident models, and the model endpoints.
 *
 * Owns: the lookups every endpoint makes (a counted reference through the
 * server registry's hooks, or the CLI's fixed table), the ModelInfo object,
 * GET /v1/models (+ "failed"), GET /v1/models/{id}, POST /v1/models and
 * DELETE /v1/models/{id}. Loading and unloading themselves belong to the
 * registry (server/registry.c); this file decodes and answers. */
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/base/gemm.h"
#include "core/model/arch.h"

api_model *api_model_acquire(const api_ctx *ctx, const char *name, size_t len, int *n_resident)
{
    if (ctx->model_acquire) return ctx->model_acquire(ctx, name, len, n_resident);
    if (n_resident) *n_resident = ctx->n_models;
    if (!name) return ctx->n_models == 1 ? &ctx->models[0] : NULL;
    for (int i = 0; i < ctx->n_models; i++)
        if (strlen(ctx->models[i].name) == len && !memcmp(ctx->models[i].name, name, len)) return &ctx->models[i];
    return NULL;
}

void api_model_release(const api_ctx *ctx, api_model *m)
{
    if (m && ctx->model_release) ctx->model_release(ctx, m);
}

api_model **api_models_acquire_all(const api_ctx *ctx, int *n)
{
    if (ctx->models_acquire_all) return ctx->models_acquire_all(ctx, n);
    api_model **all = malloc((size_t)(ctx->n_models ? ctx->n_models : 1) * sizeof *all);
    *n = all ? ctx->n_models : 0;
    for (int i = 0; i < *n; i++) all[i] = &ctx->models[i];
    return all;
}

void api_models_release_all(const api_ctx *ctx, api_model **models, int n)
{
    for (int i = 0; i < n; i++) api_model_release(ctx, models[i]);
    free(models);
}

/* Floats of one packed linear map, as core/model/model.c sizes them (BF16/F16
 * maps are packed in their 16 bits: half as many). */
static size_t packed_floats(const lens_linear *lin)
{
    const size_t elements = lin->packed ? lens_gemm_packed_size(lin->in, lin->out) : 0;
    return ((lin->dtype == LENS_DT_F32 ? elements : (elements + 1) / 2) + 15) & ~(size_t)15;
}

size_t api_model_memory_bytes(const lens_model *m)
{
    const lens_params *p = &m->p;
    size_t floats = packed_floats(&p->pooler) + packed_floats(&p->classifier) + packed_floats(&p->mlm_transform);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const lens_block *b = &p->blocks[l];
        floats += packed_floats(&b->q) + packed_floats(&b->k) + packed_floats(&b->v) + packed_floats(&b->attn_out) +
                  packed_floats(&b->ff_in) + packed_floats(&b->ff_out);
    }
    return lens_weights_bytes(m->weights) + floats * sizeof(float);
}

/* What a client may send and how to read what comes back, from the same
 * predicates the endpoints refuse by: text_pair accepted, attention always
 * causal, the kinds of attribution target ([] when attribution is not
 * served). */
static void write_input_caps(jw *w, const lens_model *m)
{
    jw_key(w, "pairs");
    jw_bool(w, api_model_takes_pairs(m));
    jw_key(w, "causal");
    jw_bool(w, lens_has_cap(&m->cfg, LENS_CAP_CAUSAL));
    jw_key(w, "attribution_targets");
    jw_arr(w);
    if (lens_model_supports(m, LENS_ANALYSIS_ATTRIBUTION, NULL))
        for (const char *const *t = api_attribution_targets(&m->cfg); *t; t++) jw_str(w, *t);
    jw_end(w);
}

void api_write_model_info(jw *w, const api_model *am)
{
    const lens_model *m = am->model;
    const lens_config *cfg = &m->cfg;
    jw_obj(w);
    jw_key(w, "id");
    jw_str(w, am->name);
    /* a tokenizer-only folder (lens_model_tokenizer_only) has no family,
     * architecture or task: null, not a family it is not */
    jw_key(w, "architecture");
    if (cfg->family) jw_str(w, cfg->architecture);
    else jw_null(w);
    jw_key(w, "model_type");
    if (cfg->family) jw_str(w, cfg->family->model_type);
    else jw_null(w);
    jw_key(w, "num_layers");
    jw_int(w, cfg->n_layers);
    jw_key(w, "num_heads");
    jw_int(w, cfg->n_heads);
    jw_key(w, "hidden_size");
    jw_int(w, cfg->d_model);
    jw_key(w, "head_dim_key");
    jw_int(w, cfg->d_head_k);
    jw_key(w, "head_dim_value");
    jw_int(w, cfg->d_head_v);
    jw_key(w, "vocab_size");
    jw_int(w, cfg->vocab_size);
    jw_key(w, "max_positions");
    jw_int(w, cfg->max_positions);
    jw_key(w, "labels");
    if (cfg->task == LENS_TASK_CLASSIFICATION && cfg->labels) {
        jw_arr(w);
        for (int i = 0; i < cfg->n_labels; i++) jw_str(w, cfg->labels[i]);
        jw_end(w);
    } else {
        jw_null(w);
    }
    jw_key(w, "task");
    if (cfg->family) jw_str(w, lens_task_name(cfg->task));
    else jw_null(w);
    jw_key(w, "parameters");
    jw_int(w, (long long)m->n_params);
    jw_key(w, "bytes");
    jw_int(w, (long long)lens_weights_bytes(m->weights));
    jw_key(w, "memory_bytes");
    jw_int(w, (long long)api_model_memory_bytes(m));
    jw_key(w, "random_weights");
    jw_bool(w, cfg->random_weights);
    jw_key(w, "tokenizer");
    jw_bool(w, m->tok != NULL);
    jw_key(w, "analyses");
    jw_arr(w);
    for (int a = 0; a < LENS_ANALYSIS_COUNT; a++)
        if (lens_model_supports(m, (lens_analysis)a, NULL)) jw_str(w, lens_analysis_name((lens_analysis)a));
    jw_end(w);
    write_input_caps(w, m);
    jw_end(w);
}

void api_models(api_call *c)
{
    jw *w = &c->out;
    int n = 0;
    api_model **all = api_models_acquire_all(c->ctx, &n);
    jw_obj(w);
    jw_key(w, "models");
    jw_arr(w);
    for (int i = 0; i < n; i++) api_write_model_info(w, all[i]);
    jw_end(w);
    jw_key(w, "failed");
    if (c->ctx->write_failed_models) {
        c->ctx->write_failed_models(w, c->ctx);
    } else {
        jw_arr(w);
        jw_end(w);
    }
    jw_end(w);
    api_models_release_all(c->ctx, all, n);
}

void api_model_get(api_call *c)
{
    api_model *m = api_model_acquire(c->ctx, c->param, strlen(c->param), NULL);
    if (!m) {
        api_fail(c, 404, "model_not_found", "id", "no model named \"%.100s\" is loaded (see GET /v1/models)", c->param);
        return;
    }
    c->model_ref = m;
    c->model_name = m->name;
    api_write_model_info(&c->out, m);
}

/* POST /v1/models {"id", "path"}: runs on a worker (loading takes seconds). */
void api_model_load(api_call *c)
{
    if (!c->ctx->model_load) {
        api_fail(c, 422, "invalid_request", NULL, "this lensd cannot load models at run time");
        return;
    }
    const char *id = NULL, *path = NULL;
    int has_id = api_get_string(c, "id", &id, NULL);
    if (has_id < 0) return;
    int has_path = api_get_string(c, "path", &path, NULL);
    if (has_path < 0) return;
    if (!has_id) {
        api_fail(c, 422, "invalid_request", "id", "id (the name to serve the model under) is required");
        return;
    }
    if (!has_path || !*path) {
        api_fail(c, 422, "invalid_request", "path", "path (a checkpoint folder under --models-dir) is required");
        return;
    }
    c->ctx->model_load(c, id, path);
}

void api_model_unload(api_call *c)
{
    if (!c->ctx->model_unload) {
        api_fail(c, 422, "invalid_request", NULL, "this lensd cannot unload models at run time");
        return;
    }
    c->ctx->model_unload(c, c->param);
}
