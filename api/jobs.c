/* jobs.c - POST /v1/jobs, GET and DELETE /v1/jobs/{id}, and the kind table.
 *
 * Owns: decoding {kind, params} and which kinds exist. A kind's params are
 * validated by the same prepare() as its synchronous endpoint, with params
 * as the body and "params." in front of every error field; the job store,
 * its threads, states and expiry are the server's (server/jobs.c), reached
 * through the api_ctx job hooks. */
#include <string.h>

#include "api/request.h"

const api_job_kind api_job_kinds[] = {
    /* kind             prepare (params)                 run (job thread) */
    {"decomposition", api_decomposition_prepare, api_decomposition_run,
     "POST /v1/decomposition over many windows, with progress", "DecompositionRequest",
     "DecompositionResponse", api_decomposition_shard, api_decomposition_merge},
    {"attribution", api_attribution_job_prepare, api_attribution_job_run,
     "POST /v1/attribution (many steps, long inputs; texts: a dataset, sharded by row)", "AttributionRequest",
     "AttributionResponse", api_attribution_shard, api_attribution_merge},
    {"head-importance", api_head_importance_prepare, api_head_importance_run,
     "attribution importance per head over a labelled dataset and the head pruning curve", "DatasetJobParams",
     "HeadImportanceResult", api_head_importance_shard, api_head_importance_merge},
    {"adversarial-triggers", api_triggers_prepare, api_triggers_run,
     "top attributed token pairs inserted into other examples; accuracy before/after per label", "DatasetJobParams",
     "TriggersResult", api_triggers_shard, api_triggers_merge},
    {"token-identity-map", api_token_identity_map_prepare, api_token_identity_map_run,
     "fit the linear maps from every layer to layer 0 (token identifiability) and keep them with the model",
     "TokenIdentityMapParams", "TokenIdentityMapResult", api_token_identity_map_shard, api_token_identity_map_merge},
    {"faithfulness", api_faithfulness_prepare, api_faithfulness_run,
     "deletion / insertion curves, AOPC, comprehensiveness and sufficiency of every explanation method over a dataset",
     "FaithfulnessParams", "FaithfulnessResult", api_faithfulness_shard, api_faithfulness_merge},
    {"context-mixing", api_context_mixing_job_prepare, api_context_mixing_job_run,
     "per-layer context mixing (self and first-token shares, per method) averaged over texts", "ContextMixingJobParams",
     "ContextMixingJobResult", api_context_mixing_job_shard, api_context_mixing_job_merge},
    {"hidden-attribution", api_hidden_attribution_prepare, api_hidden_attribution_run,
     "POST /v1/hidden-attribution (exact Jacobian norms of long inputs)", "HiddenAttributionRequest",
     "HiddenAttributionResponse", NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
const int api_n_job_kinds = (int)(sizeof api_job_kinds / sizeof *api_job_kinds) - 1;

const api_job_kind *api_job_kind_find(const char *name)
{
    for (int i = 0; i < api_n_job_kinds; i++)
        if (!strcmp(api_job_kinds[i].kind, name)) return &api_job_kinds[i];
    return NULL;
}

int api_jobs_prepare(api_call *c)
{
    const char *kind = NULL;
    int has = api_get_string(c, "kind", &kind, NULL);
    if (has < 0) return -1;
    char known[256] = "";
    size_t used = 0;
    for (int i = 0; i < api_n_job_kinds && used < sizeof known; i++) {
        int n = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", api_job_kinds[i].kind);
        if (n > 0) used += (size_t)n;
    }
    if (!has) return api_fail(c, 422, "invalid_request", "kind", "kind is required (known: %s)", known);
    c->job_kind = api_job_kind_find(kind);
    if (!c->job_kind)
        return api_fail(c, 422, "invalid_request", "kind", "unknown job kind \"%.64s\" (known: %s)", kind, known);
    json_t *params = json_object_get(c->body, "params");
    if (params && !json_is_null(params) && !json_is_object(params))
        return api_fail(c, 422, "invalid_request", "params", "params must be an object");
    /* the kind's prepare() sees params as the body; the job keeps the whole
     * request body alive, since decoded requests point into it */
    json_t *body = c->body;
    json_t *inner = json_is_object(params) ? json_incref(params) : json_object();
    c->body = inner;
    c->field_prefix = "params.";
    int rc = api_check_fields(c, c->job_kind->kind);
    if (!rc && c->job_kind->prepare) rc = c->job_kind->prepare(c);
    c->field_prefix = NULL;
    c->body = body;
    if (rc) {
        json_decref(inner);
        return -1;
    }
    json_object_set_new(c->body, "params", inner); /* params may have been absent */
    return 0;
}

/* The job's run() needs params as its body: swap it in for good. */
void api_jobs_submit(api_call *c)
{
    if (!c->ctx->job_submit) {
        api_fail(c, 503, "not_ready", NULL, "jobs need the server (lensd serve)");
        return;
    }
    json_t *params = json_incref(json_object_get(c->body, "params"));
    json_decref(c->body);
    c->body = params;
    c->ctx->job_submit(c, c->job_kind);
}

void api_job_get(api_call *c)
{
    if (!c->ctx->job_get) {
        api_fail(c, 404, "job_not_found", "id", "no job \"%.64s\"", c->param);
        return;
    }
    c->ctx->job_get(c, c->param);
}

void api_job_delete(api_call *c)
{
    if (!c->ctx->job_cancel) {
        api_fail(c, 404, "job_not_found", "id", "no job \"%.64s\"", c->param);
        return;
    }
    c->ctx->job_cancel(c, c->param);
}
