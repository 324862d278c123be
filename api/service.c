/* service.c - the service endpoints: health, readiness, metrics, info, models.
 *
 * Owns: GET /healthz, /readyz, /metrics, /v1/info, /v1/models,
 * /v1/models/{id}. These are cheap and run on the HTTP thread. The parts
 * that belong to the daemon (readiness state, metric values, worker and limit
 * settings) come through the api_ctx hooks, so `lensd info` can print the
 * same /v1/info object without a server. */
#include <string.h>

#include "api/request.h"
#include "core/base/blas.h"
#include "core/model/arch.h"

static api_state state_of(const api_ctx *ctx)
{
    return ctx->state ? ctx->state(ctx) : API_READY;
}

void api_healthz(api_call *c)
{
    jw_obj(&c->out);
    jw_key(&c->out, "status");
    jw_str(&c->out, "ok");
    jw_end(&c->out);
}

void api_readyz(api_call *c)
{
    api_state s = state_of(c->ctx);
    if (s == API_LOADING) {
        api_fail(c, 503, "not_ready", NULL, "models are still loading");
        return;
    }
    if (s == API_DRAINING) {
        api_fail(c, 503, "shutting_down", NULL, "the server is shutting down");
        return;
    }
    jw_obj(&c->out);
    jw_key(&c->out, "status");
    jw_str(&c->out, "ready");
    jw_end(&c->out);
}

void api_metrics(api_call *c)
{
    c->content_type = "text/plain; version=0.0.4; charset=utf-8";
    if (c->ctx->write_metrics) c->ctx->write_metrics(&c->out, c->ctx);
}

void api_write_info(jw *w, const api_ctx *ctx)
{
    jw_obj(w);
    jw_key(w, "version");
    jw_str(w, LENSD_VERSION);
    jw_key(w, "build");
    jw_obj(w);
    jw_key(w, "compiler");
    jw_str(w, "cc " __VERSION__);
    jw_key(w, "date");
    jw_str(w, __DATE__ " " __TIME__);
    jw_end(w);
    jw_key(w, "blas");
    jw_obj(w);
    jw_key(w, "library");
    jw_str(w, "OpenBLAS");
    jw_key(w, "config");
    jw_str(w, lens_blas_config());
    jw_key(w, "core");
    jw_str(w, lens_blas_core());
    jw_key(w, "core_source");
    jw_str(w, lens_blas_core_source());
    jw_key(w, "threads");
    jw_int(w, lens_blas_threads());
    jw_end(w);
    if (ctx && ctx->write_server_info) ctx->write_server_info(w, ctx);
    jw_end(w);
}

void api_info(api_call *c)
{
    api_write_info(&c->out, c->ctx);
}

static void write_model_info(jw *w, const api_model *am)
{
    const lens_model *m = am->model;
    const lens_config *cfg = &m->cfg;
    jw_obj(w);
    jw_key(w, "id");
    jw_str(w, am->name);
    jw_key(w, "architecture");
    jw_str(w, cfg->architecture);
    jw_key(w, "model_type");
    jw_str(w, cfg->family->model_type);
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
    jw_str(w, lens_task_name(cfg->task));
    jw_key(w, "parameters");
    jw_int(w, (long long)m->n_params);
    jw_key(w, "bytes");
    jw_int(w, (long long)lens_weights_bytes(m->weights));
    jw_key(w, "random_weights");
    jw_bool(w, cfg->random_weights);
    jw_end(w);
}

void api_models(api_call *c)
{
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "models");
    jw_arr(w);
    for (int i = 0; i < c->ctx->n_models; i++) write_model_info(w, &c->ctx->models[i]);
    jw_end(w);
    jw_end(w);
}

void api_model_get(api_call *c)
{
    for (int i = 0; i < c->ctx->n_models; i++) {
        if (!strcmp(c->ctx->models[i].name, c->param)) {
            c->model_name = c->ctx->models[i].name;
            write_model_info(&c->out, &c->ctx->models[i]);
            return;
        }
    }
    api_fail(c, 404, "model_not_found", "id", "no model named \"%.100s\" is loaded (see GET /v1/models)", c->param);
}
