/* routes.c - the route table: every HTTP endpoint of lensd, as data.
 *
 * Owns: which (method, path) pairs exist, which handler serves each, and the
 * per-route policy the server applies before calling it: whether run() goes
 * to the worker pool, whether a JSON body is expected, whether an API key is
 * needed, whether the route waits for models. openapi.yaml lists exactly
 * these paths (tests/test_http.c checks it). */
#include <stdio.h>
#include <string.h>

#include "api/api.h"

const api_route api_routes[] = {
    /* method  path                 prepare               run              pool json open models */
    {"GET",  "/healthz",         NULL,                 api_healthz,     0, 0, 1, 0, "liveness"},
    {"GET",  "/readyz",          NULL,                 api_readyz,      0, 0, 1, 0, "readiness"},
    {"GET",  "/metrics",         NULL,                 api_metrics,     0, 0, 1, 0, "Prometheus metrics"},
    {"GET",  "/v1/info",         NULL,                 api_info,        0, 0, 0, 0, "version, BLAS, limits"},
    {"GET",  "/v1/models",       NULL,                 api_models,      0, 0, 0, 1, "resident models"},
    {"GET",  "/v1/models/{id}",  NULL,                 api_model_get,   0, 0, 0, 1, "one model"},
    {"POST", "/v1/models",       NULL,                 api_model_load,  1, 1, 0, 1, "load a checkpoint folder"},
    {"DELETE", "/v1/models/{id}", NULL,                api_model_unload, 0, 0, 0, 1, "unload a model"},
    {"GET",  "/v1/capabilities", NULL,                 api_capabilities, 0, 0, 0, 0, "analyses, job kinds, data files"},
    {"GET",  "/openapi.yaml",    NULL,                 api_openapi,     0, 0, 1, 0, "the OpenAPI spec"},
    {"GET",  "/v1/jobs",         NULL,                 api_jobs_list,   0, 0, 0, 0, "stored jobs, newest first"},
    {"GET",  "/v1/jobs/{id}/events", NULL,             api_job_events,  0, 0, 0, 0, "a job's progress as Server-Sent Events"},
    {"POST", "/v1/tokenize",     api_tokenize_prepare, api_tokenize_run, 1, 1, 0, 1, "tokenize text"},
    {"POST", "/v1/detokenize",   api_detokenize_prepare, api_detokenize_run, 1, 1, 0, 1, "token ids to text"},
    {"POST", "/v1/forward",      api_forward_batched_prepare,  api_forward_batched_run,  1, 1, 0, 1, "forward pass outputs"},
    {"POST", "/v1/decomposition", api_decomposition_prepare, api_decomposition_run, 1, 1, 0, 1, "position / context decomposition"},
    {"POST", "/v1/attribution",  api_attribution_batched_prepare, api_attribution_batched_run, 1, 1, 0, 1, "self-attention attribution"},
    {"POST", "/v1/jobs",         api_jobs_prepare,     api_jobs_submit,  0, 1, 0, 1, "start an async job"},
    {"GET",  "/v1/jobs/{id}",    NULL,                 api_job_get,      0, 0, 0, 0, "a job's state and result"},
    {"DELETE", "/v1/jobs/{id}",  NULL,                 api_job_delete,   0, 0, 0, 0, "cancel a job"},
    {"POST", "/v1/attention",    api_attention_batched_prepare, api_attention_batched_run, 1, 1, 0, 1, "effective attention, identifiability"},
    {"POST", "/v1/token-identity", api_token_identity_batched_prepare, api_token_identity_batched_run, 1, 1, 0, 1, "token identifiability rankings"},
    {"POST", "/v1/hidden-attribution", api_hidden_attribution_batched_prepare, api_hidden_attribution_batched_run, 1, 1, 0, 1,
     "hidden token attribution (Jacobian norms)"},
    {"POST", "/v1/context-mixing", api_context_mixing_batched_prepare, api_context_mixing_batched_run, 1, 1, 0, 1,
     "context mixing per layer (rollout, ALTI, GlobEnc, value zeroing)"},
    {"POST", "/v1/logit-attribution", api_logit_attribution_prepare, api_logit_attribution_run, 1, 1, 0, 1,
     "direct logit attribution of a decoder (heads, MLPs, embedding)"},
    {"POST", "/v1/ablation", api_ablation_prepare, api_ablation_run, 1, 1, 0, 1,
     "the objective with heads and MLPs zero- or mean-ablated"},
    {"POST", "/v1/patching", api_patching_prepare, api_patching_run, 1, 1, 0, 1,
     "activation patching of the residual stream (exact grid)"},
};
const int api_n_routes = (int)(sizeof api_routes / sizeof *api_routes);

/* Does path match pattern? "{x}" matches one non-empty segment, copied to param. */
static int path_matches(const char *pattern, const char *path, char *param, size_t param_size)
{
    while (*pattern && *path) {
        if (*pattern == '{') {
            const char *close = strchr(pattern, '}');
            if (!close) return 0;
            size_t n = strcspn(path, "/");
            if (n == 0 || n >= param_size) return 0;
            memcpy(param, path, n);
            param[n] = 0;
            pattern = close + 1;
            path += n;
            continue;
        }
        if (*pattern++ != *path++) return 0;
    }
    return *pattern == 0 && *path == 0;
}

const api_route *api_route_match(const char *method, const char *path, char *param, size_t param_size,
                                 char *allow, size_t allow_size)
{
    char scratch[256];
    if (allow_size) allow[0] = 0;
    size_t used = 0;
    for (int i = 0; i < api_n_routes; i++) {
        const api_route *r = &api_routes[i];
        if (!path_matches(r->path, path, scratch, sizeof scratch)) continue;
        if (!strcmp(r->method, method)) {
            if (param_size) snprintf(param, param_size, "%s", scratch);
            return r;
        }
        if (allow_size > used) {
            int n = snprintf(allow + used, allow_size - used, "%s%s", used ? ", " : "", r->method);
            if (n > 0) used += (size_t)n;
        }
    }
    return NULL;
}
