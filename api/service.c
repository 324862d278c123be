/* service.c - the service endpoints: health, readiness, metrics, info, models.
 *
 * Owns: GET /healthz, /readyz, /metrics, /v1/info (the model endpoints
 * are api/models.c). These are cheap and run on the HTTP thread. The parts
 * that belong to the daemon (readiness state, metric values, worker and limit
 * settings) come through the api_ctx hooks, so `lensd info` can print the
 * same /v1/info object without a server. */
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/base/blas.h"
#include "core/base/gemm.h"

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
    jw_key(w, "gemm");
    jw_obj(w);
    jw_key(w, "kernel");
    jw_str(w, lens_gemm_kernel_name(lens_gemm_kernel_in_use()));
    jw_key(w, "available");
    jw_arr(w);
    for (int k = LENS_GEMM_AVX512; k >= LENS_GEMM_PORTABLE; k--)
        if (lens_gemm_kernel_available((lens_gemm_kernel)k)) jw_str(w, lens_gemm_kernel_name((lens_gemm_kernel)k));
    jw_end(w);
    jw_end(w);
    api_cost_write_info(w);
    if (ctx && ctx->write_server_info) ctx->write_server_info(w, ctx);
    jw_end(w);
}

void api_info(api_call *c)
{
    api_write_info(&c->out, c->ctx);
}
