/* api.h - the boundary between the daemon (server/) and the endpoints (api/).
 *
 * api/ decodes and validates request JSON, calls core, and writes response
 * JSON; it knows nothing of sockets or threads. The server (or the CLI) fills
 * an api_ctx once, then for each request an api_call: the route's prepare()
 * runs where the request arrived (the HTTP thread) and only decodes and
 * validates; run() does the work (on the worker pool for routes marked so)
 * and leaves status + body in call->out. The CLI calls the same two
 * functions, which is why `lensd forward` prints what POST /v1/forward
 * returns. */
#ifndef LENS_API_H
#define LENS_API_H

#include <jansson.h>
#include <stddef.h>

#include "api/json_writer.h"
#include "core/io/partial.h"
#include "core/model/model.h"

#define LENSD_VERSION "0.1.0"

typedef struct api_ti_maps api_ti_maps;

typedef struct {
    char *name;
    lens_model *model;
    api_ti_maps *ti_maps; /* learned token-identity maps or NULL: the one part that changes after load
                           * (api/token_identity.c swaps it under a lock; use api_maps_acquire) */
    int refs;             /* server registry: counted references (its own + one per request or job using it);
                           * guarded by the registry's lock, unused by the CLI */
    _Atomic unsigned long long fingerprint; /* lens_model_fingerprint once, 0 until a partial's header needs it
                                             * (api/shard.c): it hashes the whole embedding table, 94 MB for
                                             * BERT-base, too much to redo per request */
} api_model;

typedef enum { API_LOADING, API_READY, API_DRAINING } api_state;

typedef struct api_ctx api_ctx;
typedef struct api_call api_call;
struct api_job_kind;
struct api_ctx {
    api_model *models; /* set once every model is loaded, then read-only */
    int n_models;
    int max_tokens;    /* per request, after tokenization */
    int max_batch_items, max_batch_tokens; /* texts per batch request, their tokens in total (0 = api/batch.h defaults) */
    const char *data_dir; /* datasets jobs may read by path (params.data); NULL = none */
    double timeout;       /* seconds a synchronous request may take (server --timeout); 0 = no deadline */
    /* Hooks the server fills; the CLI leaves them NULL (= always ready, no
     * server section in /v1/info, empty metrics). */
    api_state (*state)(const api_ctx *ctx);
    void (*write_metrics)(jw *out, const api_ctx *ctx);     /* Prometheus text */
    void (*write_server_info)(jw *out, const api_ctx *ctx); /* keys inside the /v1/info object */
    void *server;
    /* Async jobs (server/jobs.c); NULL in the CLI. submit takes ownership
     * of the call's decoded request (c->req), queues kind's run() and writes
     * the job object (202) or an error (429, 503) into c->out; get / cancel
     * write the job object or 404. */
    void (*job_submit)(api_call *c, const struct api_job_kind *kind);
    void (*job_get)(api_call *c, const char *id);
    void (*job_cancel)(api_call *c, const char *id);
    /* GET /v1/jobs: the stored jobs in state (NULL = any), newest first, at most limit. */
    void (*job_list)(api_call *c, const char *state, int limit);
    /* GET /v1/jobs/{id}/events: sets c's stream to the job's events, or 404. */
    void (*job_events)(api_call *c, const char *id);
    /* Resident models loaded and unloaded at run time (server/registry.c).
     * NULL in the CLI, where models[] is the fixed table. acquire returns a
     * counted reference to the model named name[0..len) (name NULL: the only
     * model when exactly one is resident) or NULL, and sets *n_resident;
     * release drops one (the last frees the model, after DELETE unlinked it).
     * acquire_all returns every resident model, each acquired, in a malloc'd
     * array. load / unload answer POST /v1/models and DELETE /v1/models/{id}
     * into c->out. write_failed writes the "failed" array of GET /v1/models. */
    api_model *(*model_acquire)(const api_ctx *ctx, const char *name, size_t len, int *n_resident);
    void (*model_release)(const api_ctx *ctx, api_model *m);
    api_model **(*models_acquire_all)(const api_ctx *ctx, int *n);
    void (*model_load)(api_call *c, const char *id, const char *path);
    void (*model_unload)(api_call *c, const char *id);
    void (*write_failed_models)(jw *w, const api_ctx *ctx);
    void *registry;           /* the hooks' state */
    const char *openapi_path; /* GET /openapi.yaml serves this file; NULL = not served */
};

struct api_route;

struct api_call {
    const api_ctx *ctx;
    const struct api_route *route;
    char param[256];            /* the {id} of a path pattern */
    json_t *body;               /* parsed request body (POST), owned */
    void *req;                  /* the route's decoded request, owned */
    void (*free_req)(void *req);
    const volatile int *cancel; /* set when the deadline passes (or a job is cancelled) */
    lens_pool *threads;         /* compute threads of the thread running the call (core/base/pool.h); NULL = it alone */
    double t_start;             /* api_now() when the request arrived */
    /* Set when run() executes as an async job (NULL otherwise): long runs
     * report their fraction done (0..1) through it. */
    void (*progress)(void *user, double fraction);
    void *progress_user;
    const char *field_prefix;   /* prepended to api_fail's field ("params." for job params) */
    int item;                   /* a batch item's index in texts (api/batch.c), else -1: its
                                 * errors on text / text_pair name texts[i] / text_pairs[i] */
    const char *hint;           /* what to do instead when over the deadline (api/cost.h); NULL = none */
    int answered;               /* prepare() already wrote the response: do not run() */
    const struct api_job_kind *job_kind; /* POST /v1/jobs: the kind prepare() found */
    /* response */
    int status;
    const char *content_type;   /* default application/json */
    jw out;
    int retry_after;            /* seconds, 0 = no header */
    const char *allow;          /* Allow header for 405 */
    /* The request's query argument name (GET /v1/jobs?state=...), NULL when absent. */
    const char *(*query_arg)(const api_call *c, const char *name);
    void *conn;                 /* the server's connection, for query_arg */
    /* A streamed response (Server-Sent Events) instead of c->out: read fills
     * buf with up to max bytes and returns how many, 0 when there is nothing
     * yet (the server asks again a moment later), -1 at the end; free_user
     * when the connection is done. Set by run(); the server takes them over. */
    long (*stream_read)(void *user, char *buf, size_t max);
    void (*stream_free)(void *user);
    void *stream_user;
    api_model *model_ref;       /* the counted reference api_decode_model took (released by api_call_free) */
    /* Who asked: the index of the API key that authorised the request, -1
     * when the server has no keys (and in the CLI). A job belongs to its
     * principal: other keys get 404 for it on every job route. */
    int principal;
    /* for the request log */
    int n_tokens;
    const char *model_name;
};

void api_call_init(api_call *c, const api_ctx *ctx, double t_start);
void api_call_free(api_call *c);

/* Monotonic clock in seconds. */
double api_now(void);

/* Writes {"error": {"code", "message", "field"}} with status into c->out
 * (replacing anything written); returns -1. field may be NULL. */
int api_fail(api_call *c, int status, const char *code, const char *field,
             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Parse body bytes into c->body: 400 "invalid_json" for malformed JSON or
 * invalid UTF-8, 422 when it is not an object, 500 when memory ran out. */
int api_parse_body(api_call *c, const char *data, size_t len);

/* Points jansson's allocator at malloc/free through a wrapper that notes
 * failures (for api_parse_body); once per process, before the first
 * request, or earlier to route model loading's JSON through it too. */
void api_json_init(void);

/* ---- routes (api/routes.c) ---- */

typedef int (*api_prepare_fn)(api_call *c); /* decode + validate; 0 or -1 (error written) */
typedef void (*api_run_fn)(api_call *c);    /* compute + write the response */

typedef struct api_route {
    const char *method;
    const char *path;       /* pattern, "{id}" matches one path segment */
    api_prepare_fn prepare; /* NULL: nothing to decode */
    api_run_fn run;
    int on_pool;            /* 1: run() goes to the worker pool */
    int json_body;          /* 1: POST with a JSON body */
    int open;               /* 1: no API key needed (probes, metrics) */
    int needs_models;       /* 1: 503 until models are loaded */
    const char *summary;
} api_route;

extern const api_route api_routes[];
extern const int api_n_routes;

/* The route for method + path. When the path exists under other methods,
 * returns NULL and writes them ("GET, POST") into allow (else allow = ""). */
const api_route *api_route_match(const char *method, const char *path,
                                 char *param, size_t param_size,
                                 char *allow, size_t allow_size);

/* ---- handlers ---- */

void api_healthz(api_call *c);
void api_readyz(api_call *c);
void api_metrics(api_call *c);
void api_info(api_call *c);
void api_models(api_call *c);
void api_model_get(api_call *c);
int api_tokenize_prepare(api_call *c);
void api_tokenize_run(api_call *c);
int api_detokenize_prepare(api_call *c);
void api_detokenize_run(api_call *c);
int api_forward_prepare(api_call *c);
void api_forward_run(api_call *c);
int api_attention_prepare(api_call *c);
void api_attention_run(api_call *c);
int api_decomposition_prepare(api_call *c);
void api_decomposition_run(api_call *c);
int api_decomposition_shard(api_call *c, int index, int count, lens_partial *part);
void api_decomposition_merge(api_call *c, lens_partial *const *parts, int n);
int api_attribution_prepare(api_call *c);
void api_attribution_run(api_call *c);
int api_attribution_job_prepare(api_call *c);
void api_attribution_job_run(api_call *c);
int api_attribution_shard(api_call *c, int index, int count, lens_partial *part);
void api_attribution_merge(api_call *c, lens_partial *const *parts, int n);
int api_head_importance_prepare(api_call *c);
void api_head_importance_run(api_call *c);
int api_head_importance_shard(api_call *c, int index, int count, lens_partial *part);
void api_head_importance_merge(api_call *c, lens_partial *const *parts, int n);
int api_triggers_prepare(api_call *c);
void api_triggers_run(api_call *c);
int api_triggers_shard(api_call *c, int index, int count, lens_partial *part);
void api_triggers_merge(api_call *c, lens_partial *const *parts, int n);
int api_faithfulness_prepare(api_call *c);
void api_faithfulness_run(api_call *c);
int api_faithfulness_shard(api_call *c, int index, int count, lens_partial *part);
void api_faithfulness_merge(api_call *c, lens_partial *const *parts, int n);

int api_hidden_attribution_prepare(api_call *c);
void api_hidden_attribution_run(api_call *c);
int api_context_mixing_prepare(api_call *c);
void api_context_mixing_run(api_call *c);
/* job kind "context-mixing" (api/context_mixing_job.c) */
int api_context_mixing_job_prepare(api_call *c);
void api_context_mixing_job_run(api_call *c);
int api_context_mixing_job_shard(api_call *c, int index, int count, lens_partial *part);
void api_context_mixing_job_merge(api_call *c, lens_partial *const *parts, int n);
int api_logit_attribution_prepare(api_call *c);
void api_logit_attribution_run(api_call *c);
int api_ablation_prepare(api_call *c);
void api_ablation_run(api_call *c);
int api_patching_prepare(api_call *c);
void api_patching_run(api_call *c);
/* The same endpoints taking texts: [...] too (api/batch.c); the route table uses these. */
int api_forward_batched_prepare(api_call *c);
void api_forward_batched_run(api_call *c);
int api_attention_batched_prepare(api_call *c);
void api_attention_batched_run(api_call *c);
int api_attribution_batched_prepare(api_call *c);
void api_attribution_batched_run(api_call *c);
int api_token_identity_batched_prepare(api_call *c);
void api_token_identity_batched_run(api_call *c);
int api_hidden_attribution_batched_prepare(api_call *c);
void api_hidden_attribution_batched_run(api_call *c);
int api_context_mixing_batched_prepare(api_call *c);
void api_context_mixing_batched_run(api_call *c);
int api_token_identity_prepare(api_call *c);
void api_token_identity_run(api_call *c);
int api_token_identity_map_prepare(api_call *c);
void api_token_identity_map_run(api_call *c);
int api_token_identity_map_shard(api_call *c, int index, int count, lens_partial *part);
void api_token_identity_map_merge(api_call *c, lens_partial *const *parts, int n);

/* A resident model's learned token-identity maps (api/token_identity.c):
 * load_maps installs the checkpoint folder's maps file when there is one
 * (1 loaded, 0 none, -1 err); acquire returns a counted reference or NULL,
 * release drops it; drop_maps when the model is freed. */
int api_model_load_maps(api_model *m, lens_err *err);
api_ti_maps *api_maps_acquire(const api_model *m);
void api_maps_release(api_ti_maps *maps);
void api_model_drop_maps(api_model *m);

int api_jobs_prepare(api_call *c);
void api_jobs_submit(api_call *c);
void api_job_get(api_call *c);
void api_job_delete(api_call *c);
void api_jobs_list(api_call *c);
void api_job_events(api_call *c);
void api_capabilities(api_call *c);
void api_openapi(api_call *c);

/* ---- job kinds (api/jobs.c) ----
 * A kind is an analysis that may run for minutes: POST /v1/jobs {kind,
 * params} validates params with prepare() on the HTTP thread (params is
 * then the call's body, errors name "params.<field>"), and a job thread
 * later calls run() with c->cancel (DELETE /v1/jobs/{id}) and c->progress
 * set. run() leaves the result (status 200) or an error in c->out, as a
 * route's run() does. Adding a kind is adding a row. */
/* Sharded dataset kinds (lensd job run / merge, api/shard.c): shard()
 * computes the partial state of shard index of count into part (rows
 * r % count == index); merge() reduces every shard's partial, in shard order,
 * into the kind's result, exactly as run() writes it. NULL for kinds that are
 * not datasets. */
typedef int (*api_shard_fn)(api_call *c, int index, int count, lens_partial *part);
typedef void (*api_merge_fn)(api_call *c, lens_partial *const *parts, int n);

typedef struct api_job_kind {
    const char *kind;
    api_prepare_fn prepare;
    api_run_fn run;
    const char *summary;
    const char *params_schema, *result_schema; /* openapi.yaml components/schemas names */
    api_shard_fn shard;                        /* NULL: not a dataset kind, no shards */
    api_merge_fn merge;
} api_job_kind;

/* api/shard.c: shard `index` of `count` of kind with c->req decoded by its
 * prepare(): the partial with its self-describing header (kind, params and
 * their hash, model fingerprint, shard). */
int api_shard_run(api_call *c, const api_job_kind *kind, int index, int count, lens_partial *part);
/* Checks that parts[0..n) are the count shards of one job (same kind,
 * params, model; no duplicate; none missing, else the missing numbers), sorts
 * them by shard and calls kind->merge. Errors are 422 "partial_mismatch". */
void api_shard_merge(api_call *c, const api_job_kind *kind, lens_partial **parts, int n);
/* run() of a sharded kind: shard 0 of 1, then merge, so a server job and a
 * merged set of shards run the same code. */
void api_shard_run_whole(api_call *c, const api_job_kind *kind);
/* For a kind's shard(): record the dataset's row count and the rows this shard holds. */
int api_shard_rows(lens_partial *part, long total, long in_shard); /* -1: out of memory */
/* For a kind's merge(): the per-row f64 tensors names[f] (widths[f] doubles
 * a row, beside the partial's "rows" i64) of every part into outs[f]
 * [total][widths[f]] in row order, each row from exactly one part. 0, or -1
 * with the error written (422 partial_mismatch for a row out of range, in
 * two parts or in none; what names the job in other errors). */
int api_shard_gather_rows(api_call *c, lens_partial *const *parts, int n_parts, long total, int n_fields,
                          const char *const *names, const long *widths, double *const *outs, const char *what);

extern const api_job_kind api_job_kinds[];
extern const int api_n_job_kinds;
const api_job_kind *api_job_kind_find(const char *name);

/* ---- resident models (api/models.c) ----
 * The model lookups every endpoint uses: through the registry hooks when the
 * server set them (counted references), else ctx->models (the CLI).
 * acquire: name NULL picks the only model; NULL when there is none such.
 * release(NULL) is a no-op. acquire_all: malloc'd array, each acquired;
 * release_all drops them and frees the array. */
api_model *api_model_acquire(const api_ctx *ctx, const char *name, size_t len, int *n_resident);
void api_model_release(const api_ctx *ctx, api_model *m);
api_model **api_models_acquire_all(const api_ctx *ctx, int *n);
void api_models_release_all(const api_ctx *ctx, api_model **models, int n);
/* Bytes a resident model holds: weights (mapped or converted) plus the
 * packed GEMM panels made at load. */
size_t api_model_memory_bytes(const lens_model *m);
/* The ModelInfo object of GET /v1/models. */
void api_write_model_info(jw *w, const api_model *am);
void api_model_load(api_call *c);
void api_model_unload(api_call *c);

/* Writes the /v1/info object; shared with `lensd info`. */
void api_write_info(jw *out, const api_ctx *ctx);

#endif
