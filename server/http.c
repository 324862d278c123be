/* http.c - libmicrohttpd glue: the request lifecycle of lensd.
 *
 * Owns: the MHD daemon and its connection limits (--max-connections,
 * --max-connections-per-ip, --idle-timeout; --header-timeout and
 * --body-timeout in conns.c),
 * the per-request state (`request`, kept in MHD's per-connection pointer),
 * and every policy applied before a handler runs: message framing (400
 * invalid_framing and the connection closed: RFC 9112 6.3, against request
 * smuggling), API keys for every /v1 path (401, before any 404), route
 * lookup (404 / 405 + Allow), CORS preflight and headers, readiness (503),
 * content type (415), body size (413, as soon as the Content-Length or the
 * bytes received pass --max-body), queue admission (429 + Retry-After), and
 * the per-request deadline (503 "timeout").
 *
 * Lifecycle (one internal polling thread with epoll, so every callback
 * below except job_run runs on that thread):
 *   1st call      headers only: match route, check policy; an error is
 *                 answered at once when no body follows, else after the
 *                 body is drained (PHASE_DRAINING)
 *   next calls    body bytes appended to request.body
 *   final call    parse JSON (400), route prepare() validates (4xx);
 *                 pool routes reserve a queue slot, suspend the connection,
 *                 submit; other routes run inline and respond
 *   job_run       worker thread: route run(), then resume the connection
 *   after resume  the final call repeats and queues the finished response
 *   completed     log line, metrics, free. */
#include "server/http.h"

#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/batch.h"
#include "api/cost.h"
#include "api/request.h"
#include "server/conns.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/jobs.h"
#include "server/pool.h"
#include "server/stream.h"
#include "server/web.h"

struct server {
    const lensd_config *cfg;
    api_ctx ctx;
    pool *pool;
    jobs *jobs;
    streams *streams; /* SSE responses (server/stream.c) */
    conns *conns;     /* open connections and their header deadline */
    struct MHD_Daemon *daemon;
    int port;
    atomic_int state;     /* api_state */
    atomic_int in_flight; /* requests between first header and completion */
    atomic_ullong next_id;
    unsigned id_prefix;
    char **api_keys;
    int n_api_keys;
    char **cors_origins;
    int n_cors_origins, cors_any;
    char *web_dir; /* dashboard folder (realpath), NULL when off */
};

enum { PHASE_READING, PHASE_DRAINING, PHASE_QUEUED, PHASE_RESPONDED };

/* An error decided from the headers waits until the body is read and
 * dropped: a server that answers and closes while the client still sends
 * makes the kernel reset the connection, and a client that writes the whole
 * body before reading (Python urllib) then sees the reset, never the 413.
 * Bodies announced larger than this are answered at once instead, so a
 * client cannot make the server read gigabytes. */
#define DRAIN_MAX (64LL << 20)

typedef struct request {
    server *srv;
    struct MHD_Connection *conn;
    const api_route *route;
    int route_index;
    api_call call;
    char method[16];
    char path[256];
    char request_id[80];
    const char *cors_origin; /* value for Access-Control-Allow-Origin, or NULL */
    char origin[256];
    char *body;
    size_t body_len, body_cap;
    int phase;
    int over_limit; /* body passed --max-body: bytes are dropped, 413 at the end */
    long long drained; /* PHASE_DRAINING: body bytes dropped so far */
    int status;     /* sent status, 0 before a response */
    int close_after; /* the framing was refused: close the connection after the answer */
    int preflight;  /* OPTIONS: answer with the CORS preflight headers */
    char allow[80]; /* Allow header value for 405 and OPTIONS */
    pool_job job;
} request;

/* ---------------------------------------------------------------- state */

static api_state ctx_state(const api_ctx *ctx)
{
    const server *s = ctx->server;
    return (api_state)atomic_load(&s->state);
}

static void ctx_write_server_info(jw *w, const api_ctx *ctx)
{
    const server *s = ctx->server;
    lensd_config_write_info(w, s->cfg);
}

static void ctx_write_metrics(jw *w, const api_ctx *ctx)
{
    server *s = ctx->server;
    metrics_write(w);
    char line[1024];
    int n = snprintf(line, sizeof line,
                     "# HELP lensd_queue_depth Requests waiting for a worker.\n"
                     "# TYPE lensd_queue_depth gauge\n"
                     "lensd_queue_depth %d\n"
                     "# HELP lensd_in_flight Requests received and not yet answered.\n"
                     "# TYPE lensd_in_flight gauge\n"
                     "lensd_in_flight %d\n"
                     "# HELP lensd_workers_busy Workers computing a request.\n"
                     "# TYPE lensd_workers_busy gauge\n"
                     "lensd_workers_busy %d\n"
                     "# HELP lensd_ready 1 when models are loaded and work is accepted.\n"
                     "# TYPE lensd_ready gauge\n"
                     "lensd_ready %d\n",
                     pool_queue_depth(s->pool), atomic_load(&s->in_flight), pool_running(s->pool),
                     atomic_load(&s->state) == API_READY);
    jw_raw(w, line, (size_t)n);
    jobs_write_metrics(s->jobs, w);
    static const char model_bytes_help[] = "# HELP lensd_model_bytes Bytes of float32 weights held per model.\n"
                                           "# TYPE lensd_model_bytes gauge\n";
    jw_raw(w, model_bytes_help, sizeof model_bytes_help - 1);
    int n_models = 0;
    api_model **models = api_models_acquire_all(ctx, &n_models);
    for (int i = 0; i < n_models; i++) {
        n = snprintf(line, sizeof line, "lensd_model_bytes{model=\"%s\"} %zu\n", models[i]->name,
                     lens_weights_bytes(models[i]->model->weights));
        jw_raw(w, line, (size_t)n);
    }
    api_models_release_all(ctx, models, n_models);
}

static void ctx_job_submit(api_call *c, const api_job_kind *kind)
{
    server *s = c->ctx->server;
    if (atomic_load(&s->state) == API_DRAINING) {
        api_fail(c, 503, "shutting_down", NULL, "the server is shutting down");
        return;
    }
    jobs_submit(s->jobs, c, kind);
}

static void ctx_job_get(api_call *c, const char *id)
{
    server *s = c->ctx->server;
    jobs_get(s->jobs, c, id);
}

static void ctx_job_cancel(api_call *c, const char *id)
{
    server *s = c->ctx->server;
    jobs_cancel(s->jobs, c, id);
}

static void ctx_job_events(api_call *c, const char *id)
{
    server *s = c->ctx->server;
    jobs_events(s->jobs, c, id);
}

static void ctx_job_list(api_call *c, const char *state, int limit)
{
    server *s = c->ctx->server;
    jobs_list(s->jobs, c, state, limit);
}

/* ------------------------------------------------------------- helpers */

static const char *header(struct MHD_Connection *conn, const char *name)
{
    return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
}

static const char *query_arg(const api_call *c, const char *name)
{
    return MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* A client's X-Request-Id is echoed when it is short and plain; else a new id. */
static void assign_request_id(request *r)
{
    const char *given = header(r->conn, "X-Request-Id");
    if (given) {
        size_t n = strlen(given);
        int ok = n > 0 && n < 64;
        for (size_t i = 0; ok && i < n; i++) {
            char c = given[i];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                 c == '_' || c == '.' || c == ':';
        }
        if (ok) {
            memcpy(r->request_id, given, n + 1);
            return;
        }
    }
    unsigned long long id = atomic_fetch_add(&r->srv->next_id, 1);
    snprintf(r->request_id, sizeof r->request_id, "%08x%08llx", r->srv->id_prefix, id);
}

static int origin_allowed(const server *s, const char *origin)
{
    if (!origin || !*origin) return 0;
    if (s->cors_any) return 1;
    for (int i = 0; i < s->n_cors_origins; i++)
        if (!strcmp(s->cors_origins[i], origin)) return 1;
    return 0;
}

/* Constant-time comparison, so response timing does not leak key prefixes. */
static int key_equal(const char *a, size_t na, const char *b, size_t nb)
{
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

enum { NO_KEYS = -1, NOT_AUTHORIZED = -2 };

/* The index of the API key in the Authorization header, NO_KEYS when the
 * server has none, NOT_AUTHORIZED when the header names no key. Every key is
 * compared, whichever matches. */
static int key_index(const server *s, struct MHD_Connection *conn)
{
    if (s->n_api_keys == 0) return NO_KEYS;
    const char *auth = header(conn, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7)) return NOT_AUTHORIZED;
    const char *key = auth + 7;
    while (*key == ' ') key++;
    size_t n = strlen(key);
    int found = NOT_AUTHORIZED;
    for (int i = 0; i < s->n_api_keys; i++)
        if (key_equal(key, n, s->api_keys[i], strlen(s->api_keys[i]))) found = i;
    return found;
}

static int authorized(const request *r) { return r->call.principal != NOT_AUTHORIZED; }

static int is_json_content_type(const char *ct)
{
    if (!ct) return 0;
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "application/json", 16)) return 0;
    char next = ct[16];
    return next == 0 || next == ';' || next == ' ';
}

/* ------------------------------------------------------------- respond */

static enum MHD_Result respond(request *r)
{
    api_call *c = &r->call;
    size_t len = 0;
    struct MHD_Response *resp;
    if (c->stream_read) {
        resp = streams_response(r->srv->streams, r->conn, c);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* nginx: pass events through at once */
    } else {
        char *body = jw_take(&c->out, &len);
        if (!body) body = strdup(""), len = 0;
        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(body);
            return MHD_NO;
        }
    }
    if (len || c->status != 204) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, c->content_type);
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    if (c->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", c->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (c->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, c->allow);
    if (c->status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r->close_after) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    /* with CORS on, the answer depends on Origin for every client (allowed or not): caches must key on it */
    if (r->srv->cors_any || r->srv->n_cors_origins) MHD_add_response_header(resp, "Vary", "Origin");
    if (r->cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->cors_origin);
        MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
        if (r->preflight) {
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", r->allow);
            MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Content-Type, Authorization, X-Request-Id");
            MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        }
    }
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)c->status, resp);
    MHD_destroy_response(resp);
    if (ret == MHD_YES) {
        r->status = c->status;
        r->phase = PHASE_RESPONDED;
    }
    return ret;
}

/* GET / and /web/...: the dashboard's files (server/web.c), no API key. */
static enum MHD_Result respond_web(request *r)
{
    int status = 404;
    struct MHD_Response *resp =
        web_respond(r->srv->web_dir, r->path, header(r->conn, MHD_HTTP_HEADER_IF_NONE_MATCH), &status);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ret == MHD_YES) r->status = status, r->phase = PHASE_RESPONDED;
    return ret;
}

/* ------------------------------------------------------------ pool jobs */

static void job_run(pool_job *job)
{
    request *r = (request *)((char *)job - offsetof(request, job));
    const lensd_config *cfg = r->srv->cfg;
    for (int waited = 0; waited < cfg->debug_delay_ms && !lens_cancelled(&job->cancel); waited += 10) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (lens_cancelled(&job->cancel)) {
        api_fail(&r->call, 503, "timeout", NULL, "the request waited longer than the server's timeout (%g s)%s%s",
                 cfg->timeout, r->call.hint ? "; " : "", r->call.hint ? r->call.hint : "");
    } else {
        r->call.cancel = &job->cancel;
        r->call.threads = job->threads;
        r->route->run(&r->call);
    }
}

/* After job_run, once the pool has forgotten the job: resuming lets
 * libmicrohttpd complete the request and free it (on_completed). */
static void job_done(pool_job *job)
{
    request *r = (request *)((char *)job - offsetof(request, job));
    MHD_resume_connection(r->conn);
}

/* ------------------------------------------------------------ callbacks */

typedef struct {
    int content_lengths, transfer_encodings;
    const char *transfer_encoding;
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) f->content_lengths++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) f->transfer_encodings++, f->transfer_encoding = value;
    return MHD_YES;
}

/* RFC 9112 6.3: a body whose length two parties could read differently is
 * refused with 400 and the connection closed, so bytes after it can never
 * be run as a second, hidden request (libmicrohttpd 0.9.75 takes the first
 * Content-Length and accepts one with Transfer-Encoding). Refused: more
 * than one Content-Length (even equal ones), Content-Length with
 * Transfer-Encoding, and any Transfer-Encoding but a single "chunked".
 * Returns 1 with the answer in r->call. */
static int check_framing(request *r)
{
    framing f = {0, 0, NULL};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, count_framing, &f);
    const char *why = NULL;
    if (f.content_lengths > 1) why = "more than one Content-Length header";
    else if (f.content_lengths && f.transfer_encodings) why = "both Content-Length and Transfer-Encoding";
    else if (f.transfer_encodings > 1 || (f.transfer_encodings && strcasecmp(f.transfer_encoding, "chunked")))
        why = "a Transfer-Encoding other than one \"chunked\"";
    if (!why) return 0;
    r->close_after = 1;
    api_fail(&r->call, 400, "invalid_framing", NULL, "the request has %s; its length is ambiguous (RFC 9112 6.3)",
             why);
    return 1;
}

/* Headers are in: decide whatever can be decided without the body.
 * Returns 1 when an answer is ready in r->call. */
static int check_headers(request *r)
{
    server *s = r->srv;
    api_call *c = &r->call;
    char allow[64];
    const char *method = strcmp(r->method, "HEAD") ? r->method : "GET";

    if (!strcmp(method, "OPTIONS")) {
        /* CORS preflight (or a plain OPTIONS): 204 with what the path allows */
        api_route_match("", r->path, NULL, 0, allow, sizeof allow);
        if (!allow[0]) return api_fail(c, 404, "not_found", NULL, "no route %s", r->path), 1;
        snprintf(r->allow, sizeof r->allow, "%s, OPTIONS", allow);
        c->status = 204;
        c->allow = r->allow;
        r->preflight = 1;
        return 1;
    }
    r->route = api_route_match(method, r->path, c->param, sizeof c->param, allow, sizeof allow);
    /* every /v1 path needs the key, so a client without one cannot tell routes from 404s */
    int under_v1 = !strncmp(r->path, "/v1/", 4) || !strcmp(r->path, "/v1");
    if ((r->route ? !r->route->open : under_v1) && !authorized(r))
        return api_fail(c, 401, "unauthorized", NULL, "this route needs Authorization: Bearer <api key>"), 1;
    if (!r->route) {
        if (!allow[0]) return api_fail(c, 404, "not_found", NULL, "no route %s %s", r->method, r->path), 1;
        /* OPTIONS is answered on every known path (CORS preflight) */
        snprintf(r->allow, sizeof r->allow, "%s, OPTIONS", allow);
        c->allow = r->allow;
        return api_fail(c, 405, "method_not_allowed", NULL, "%s does not accept %s (allowed: %s)", r->path, r->method,
                        allow),
               1;
    }
    r->route_index = (int)(r->route - api_routes);
    c->route = r->route;
    api_state st = (api_state)atomic_load(&s->state);
    if (r->route->needs_models && st == API_LOADING)
        return api_fail(c, 503, "not_ready", NULL, "models are still loading; see /readyz"), 1;
    if (r->route->on_pool && st == API_DRAINING)
        return api_fail(c, 503, "shutting_down", NULL, "the server is shutting down"), 1;
    if (r->route->json_body) {
        if (!is_json_content_type(header(r->conn, MHD_HTTP_HEADER_CONTENT_TYPE)))
            return api_fail(c, 415, "unsupported_media_type", NULL, "send the body as Content-Type: application/json"),
                   1;
        const char *cl = header(r->conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)s->cfg->max_body)
            return api_fail(c, 413, "payload_too_large", NULL, "the body is %s bytes; the limit is %lld", cl,
                            s->cfg->max_body),
                   1;
    }
    return 0;
}

/* Will the client send a body after these headers (Content-Length > 0 or
 * chunked)? 1: yes, small enough to drain; 0: no body; -1: over DRAIN_MAX. */
static int body_follows(request *r)
{
    const char *cl = header(r->conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        unsigned long long n = strtoull(cl, NULL, 10);
        return n == 0 ? 0 : n > (unsigned long long)DRAIN_MAX ? -1 : 1;
    }
    return header(r->conn, MHD_HTTP_HEADER_TRANSFER_ENCODING) ? 1 : 0;
}

static void append_body(request *r, const char *data, size_t n)
{
    long long max = r->srv->cfg->max_body;
    if (r->over_limit) return;
    if (r->body_len + n > (size_t)max) {
        r->over_limit = 1;
        free(r->body);
        r->body = NULL;
        r->body_len = r->body_cap = 0;
        return;
    }
    if (r->body_len + n > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + n) cap *= 2;
        char *grown = realloc(r->body, cap);
        if (!grown) {
            r->over_limit = 1;
            return;
        }
        r->body = grown, r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
}

/* Routes whose requests cost milliseconds (one tokenization or forward
 * pass, bounded by --max-tokens): they may take the fast lane (pool.h). */
static int route_is_cheap(const api_route *route)
{
    static const char *const cheap[] = {"/v1/tokenize", "/v1/forward"};
    for (size_t i = 0; i < sizeof cheap / sizeof *cheap; i++)
        if (!strcmp(route->path, cheap[i])) return 1;
    return 0;
}

/* The whole body is in: validate, then run inline or hand to the pool. */
static enum MHD_Result complete(request *r)
{
    server *s = r->srv;
    api_call *c = &r->call;
    if (r->over_limit) {
        api_fail(c, 413, "payload_too_large", NULL, "the body is over the limit of %lld bytes", s->cfg->max_body);
        return respond(r);
    }
    if (r->route->json_body &&
        (api_parse_body(c, r->body ? r->body : "", r->body_len) || api_check_fields(c, r->route->path)))
        return respond(r);
    free(r->body);
    r->body = NULL;
    if (r->route->prepare && r->route->prepare(c)) return respond(r);
    /* answered: prepare() turned the request into an async job (202) */
    if (c->answered || !r->route->on_pool) {
        if (!c->answered) r->route->run(c);
        return respond(r);
    }
    if (atomic_load(&s->state) == API_DRAINING) {
        api_fail(c, 503, "shutting_down", NULL, "the server is shutting down");
        return respond(r);
    }
    if (!pool_reserve(s->pool)) {
        c->retry_after = 1;
        api_fail(c, 429, "queue_full", NULL, "all %d workers are busy and %d requests are queued; retry later",
                 s->cfg->workers, s->cfg->queue);
        return respond(r);
    }
    r->job.fn = job_run;
    r->job.done = job_done;
    r->job.cheap = route_is_cheap(r->route) && !api_is_batch(c); /* a batch is bounded by --max-batch-tokens */
    r->job.deadline = c->t_start + s->cfg->timeout;
    r->phase = PHASE_QUEUED;
    MHD_suspend_connection(r->conn);
    pool_submit(s->pool, &r->job);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    server *s = cls;
    request *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        atomic_fetch_add(&s->in_flight, 1);
        r->srv = s;
        r->conn = conn;
        r->route_index = -1;
        api_call_init(&r->call, &s->ctx, api_now());
        r->call.query_arg = query_arg;
        r->call.conn = conn;
        r->call.principal = key_index(s, conn);
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        assign_request_id(r);
        const char *origin = header(conn, "Origin");
        if (origin && origin_allowed(s, origin)) {
            snprintf(r->origin, sizeof r->origin, "%s", origin);
            r->cors_origin = s->cors_any ? "*" : r->origin;
        }
        conns_header_done(s->conns, conn);
        if (check_framing(r)) return respond(r);
        if (web_wants(r->method, r->path)) return respond_web(r);
        if (s->web_dir && web_path(r->path)) {
            r->call.allow = "GET, HEAD";
            api_fail(&r->call, 405, "method_not_allowed", NULL, "the dashboard answers GET and HEAD only");
            return respond(r);
        }
        if (!check_headers(r)) {
            conns_body_expected(s->conns, conn); /* or, with no body, the call that completes it comes next */
            return MHD_YES;
        }
        if (body_follows(r) != 1) return respond(r);
        r->phase = PHASE_DRAINING;
        conns_body_expected(s->conns, conn);
        return MHD_YES;
    }
    if (r->phase == PHASE_DRAINING) {
        r->drained += (long long)*upload_data_size;
        int more = *upload_data_size && r->drained <= DRAIN_MAX;
        *upload_data_size = 0;
        if (more) return MHD_YES;
        conns_body_done(s->conns, conn);
        return respond(r);
    }
    if (r->phase == PHASE_RESPONDED) {
        *upload_data_size = 0; /* an early answer was sent; drop the rest */
        return MHD_YES;
    }
    if (*upload_data_size) {
        append_body(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->phase == PHASE_QUEUED) return respond(r); /* resumed after the worker finished */
    conns_body_done(s->conns, conn);
    return complete(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    server *s = cls;
    int body_expired = conns_body_expired(s->conns, conn);
    conns_request_done(s->conns, conn);
    request *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    double seconds = api_now() - r->call.t_start;
    /* 499: the client went away before an answer was sent */
    int status = r->status ? r->status : 499;
    metrics_record(r->route_index, status, seconds);
    jw w;
    log_begin(&w, status >= 500 ? "error" : status >= 400 ? "warn" : "info");
    jw_key(&w, "request_id");
    jw_str(&w, r->request_id);
    jw_key(&w, "method");
    jw_str(&w, r->method);
    jw_key(&w, "path");
    jw_str(&w, r->path);
    jw_key(&w, "route");
    jw_str(&w, r->route ? r->route->path : "unmatched");
    jw_key(&w, "status");
    jw_int(&w, status);
    jw_key(&w, "ms");
    jw_float(&w, seconds * 1e3, 3);
    jw_key(&w, "tokens");
    jw_int(&w, r->call.n_tokens);
    jw_key(&w, "model");
    jw_str(&w, r->call.model_name);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        jw_key(&w, "terminated");
        jw_int(&w, (int)toe);
    }
    if (body_expired) {
        jw_key(&w, "closed");
        jw_str(&w, "body_timeout");
    }
    log_emit(&w);
    api_call_free(&r->call);
    free(r->body);
    free(r);
    atomic_fetch_sub(&s->in_flight, 1);
}

/* ------------------------------------------------------------ start, stop */

static int load_api_keys(server *s, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        log_msg("error", "cannot read --api-key-file %s", path);
        return -1;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\r\n");
        line[n] = 0;
        char *key = line;
        while (*key == ' ' || *key == '\t') key++;
        n = strlen(key);
        while (n && (key[n - 1] == ' ' || key[n - 1] == '\t')) key[--n] = 0;
        if (!n || key[0] == '#') continue;
        char **grown = realloc(s->api_keys, (size_t)(s->n_api_keys + 1) * sizeof *grown);
        if (!grown) break;
        s->api_keys = grown;
        s->api_keys[s->n_api_keys++] = strdup(key);
    }
    fclose(f);
    if (s->n_api_keys == 0) {
        log_msg("error", "--api-key-file %s has no keys", path);
        return -1;
    }
    return 0;
}

static void parse_cors(server *s, const char *list)
{
    char *copy = strdup(list), *save = NULL;
    for (char *tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (!strcmp(tok, "*")) {
            s->cors_any = 1;
            continue;
        }
        char **grown = realloc(s->cors_origins, (size_t)(s->n_cors_origins + 1) * sizeof *grown);
        if (!grown) break;
        s->cors_origins = grown;
        s->cors_origins[s->n_cors_origins++] = strdup(tok);
    }
    free(copy);
}

static void server_free(server *s)
{
    for (int i = 0; i < s->n_api_keys; i++) free(s->api_keys[i]);
    free(s->api_keys);
    for (int i = 0; i < s->n_cors_origins; i++) free(s->cors_origins[i]);
    free(s->cors_origins);
    free(s->web_dir);
    free(s);
}

/* A request's buffers are allocated on a worker thread and freed on the
 * HTTP thread; with glibc's default of 8 arenas per core every thread's
 * arena keeps its own free fragments and RSS creeps (make soak: 27 -> 30 MiB
 * over 100k requests, +11.6%). One arena per core keeps it flat (28 MiB
 * after the first minute). MALLOC_ARENA_MAX in the environment wins. */
static void limit_malloc_arenas(void)
{
    if (getenv("MALLOC_ARENA_MAX")) return;
    int cores = lensd_cores();
    mallopt(M_ARENA_MAX, cores < 2 ? 2 : cores);
}

/* Every connection is a descriptor: the soft limit (often 1024) is raised
 * to the hard one. Returns the soft limit now in force. */
static long raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl)) getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1000000 ? 1000000 : (long)rl.rlim_cur;
}

/* Each connection's buffer for its request line, headers and body bytes
 * (libmicrohttpd's default is 32 KiB, which it takes from malloc: after a
 * flood of thousands of connections those blocks stay in the heap). Above
 * 32 KiB the library maps the buffer instead, and unmaps it when the
 * connection closes. It also bounds a request's URI and headers (414, 431). */
#define CONNECTION_MEMORY (36u << 10)

/* Descriptors kept for everything but client connections: the listening
 * socket, epoll, model and data files, job and worker threads' files, logs. */
#define FD_RESERVE 256

/* --max-connections, lowered so that connections cannot use up the
 * descriptors the rest of the server needs. */
static int connection_limit(const lensd_config *cfg)
{
    long fds = raise_fd_limit();
    long room = fds - FD_RESERVE;
    if (room < 16) room = 16;
    if (cfg->max_connections > room) {
        log_msg("warn", "--max-connections %d lowered to %ld: the descriptor limit is %ld (ulimit -n)",
                cfg->max_connections, room, fds);
        return (int)room;
    }
    return cfg->max_connections;
}

server *server_start(const lensd_config *cfg)
{
    limit_malloc_arenas();
    api_json_init(); /* before any thread uses jansson (model loading, requests) */
    server *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = cfg;
    atomic_init(&s->state, API_LOADING);
    atomic_init(&s->in_flight, 0);
    atomic_init(&s->next_id, 1);
    s->id_prefix = (unsigned)(time(NULL) ^ ((unsigned)getpid() << 16));
    s->ctx.max_tokens = cfg->max_tokens;
    s->ctx.max_batch_items = cfg->max_batch_items;
    s->ctx.max_batch_tokens = cfg->max_batch_tokens;
    s->ctx.data_dir = cfg->data_dir;
    s->ctx.timeout = cfg->timeout;
    s->ctx.state = ctx_state;
    s->ctx.write_metrics = ctx_write_metrics;
    s->ctx.write_server_info = ctx_write_server_info;
    s->ctx.server = s;
    s->ctx.job_submit = ctx_job_submit;
    s->ctx.job_get = ctx_job_get;
    s->ctx.job_cancel = ctx_job_cancel;
    s->ctx.job_list = ctx_job_list;
    s->ctx.job_events = ctx_job_events;
    s->ctx.openapi_path = cfg->openapi;
    if (cfg->api_key_file && load_api_keys(s, cfg->api_key_file)) goto fail;
    if (cfg->cors_origin) parse_cors(s, cfg->cors_origin);
    s->web_dir = web_resolve_dir(cfg->web_dir, cfg->no_web);
    if (cfg->web_dir && !s->web_dir && !cfg->no_web) {
        log_msg("error", "--web-dir %s: no such folder", cfg->web_dir);
        goto fail;
    }
    if (s->web_dir) log_msg("info", "dashboard at / from %s", s->web_dir);
    else log_msg("info", "dashboard off (--no-web, or no web/ folder found)");

    /* HOST:PORT, HOST may be [v6] */
    char host[256], port[16];
    const char *colon = strrchr(cfg->listen, ':');
    if (!colon || (size_t)(colon - cfg->listen) >= sizeof host || strlen(colon + 1) >= sizeof port) {
        log_msg("error", "--listen wants HOST:PORT, got \"%s\"", cfg->listen);
        goto fail;
    }
    const char *h = cfg->listen;
    size_t hn = (size_t)(colon - cfg->listen);
    if (hn >= 2 && h[0] == '[' && h[hn - 1] == ']') h++, hn -= 2;
    memcpy(host, h, hn);
    host[hn] = 0;
    snprintf(port, sizeof port, "%s", colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(hn ? host : NULL, port, &hints, &ai);
    if (gai || !ai) {
        log_msg("error", "--listen %s: %s", cfg->listen, gai_strerror(gai));
        goto fail;
    }

    s->pool = pool_create(cfg->workers, cfg->fast_workers, cfg->queue, cfg->threads_per_worker, cfg->fast_threads);
    s->jobs = jobs_create(cfg->max_jobs, cfg->max_stored_jobs, s->n_api_keys ? s->n_api_keys : 1, cfg->job_ttl,
                          cfg->threads_per_worker, cfg->debug_delay_ms);
    s->streams = streams_create(100);
    if (!s->pool || !s->jobs || !s->streams) {
        freeaddrinfo(ai);
        pool_destroy(s->pool);
        jobs_destroy(s->jobs);
        streams_destroy(s->streams);
        goto fail;
    }
    jobs_set_keepalive(s->jobs, cfg->sse_keepalive);
    s->conns = conns_create(cfg->header_timeout, cfg->body_timeout);
    /* epoll: thousands of connections cost one wakeup per ready socket, not a scan of all */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    int max_connections = connection_limit(cfg);
    unsigned idle = cfg->idle_timeout < 1 ? 1u : (unsigned)cfg->idle_timeout;
    s->daemon = !s->conns ? NULL
                          : MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                                             /* first, so that every message of the library goes through it */
                                             MHD_OPTION_EXTERNAL_LOGGER, log_library, "libmicrohttpd",
                                             MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                             MHD_OPTION_NOTIFY_CONNECTION, conns_notify, s->conns,
                                             MHD_OPTION_URI_LOG_CALLBACK, conns_request_line, s->conns,
                                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_connections,
                                             MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
                                             MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)4096,
                                             MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY,
                                             MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        log_msg("error", "cannot listen on %s (address in use or not permitted?)", cfg->listen);
        pool_destroy(s->pool);
        jobs_destroy(s->jobs);
        streams_destroy(s->streams);
        conns_destroy(s->conns);
        goto fail;
    }
    /* the cost model's rate, measured before any request competes for the cores
     * (or pinned by --debug-gflops, so tests of the 413 do not depend on the machine) */
    if (cfg->debug_gflops > 0) api_cost_set_rate(cfg->debug_gflops, cfg->threads_per_worker);
    const api_cost_rate *rate = api_cost_calibrate(cfg->threads_per_worker);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : atoi(port);
    jw w;
    log_begin(&w, "info");
    jw_key(&w, "msg");
    jw_str(&w, "listening");
    jw_key(&w, "listen");
    jw_str(&w, cfg->listen);
    jw_key(&w, "port");
    jw_int(&w, s->port);
    jw_key(&w, "workers");
    jw_int(&w, cfg->workers);
    jw_key(&w, "threads_per_worker");
    jw_int(&w, cfg->threads_per_worker);
    jw_key(&w, "fast_workers");
    jw_int(&w, cfg->fast_workers);
    jw_key(&w, "max_connections");
    jw_int(&w, max_connections);
    jw_key(&w, "gemm_gflops");
    jw_float(&w, rate->gflops, 1);
    log_emit(&w);
    return s;
fail:
    server_free(s);
    return NULL;
}

int server_port(const server *s) { return s->port; }

void server_set_registry(server *s, registry *models)
{
    registry_install(models, &s->ctx);
    atomic_store(&s->state, API_READY); /* seq_cst: publishes models before ready */
    log_msg("info", "ready");
}

int server_drain(server *s, double max_wait)
{
    atomic_store(&s->state, API_DRAINING);
    log_msg("info", "shutting down: refusing new work, finishing in-flight requests");
    streams_close_all(s->streams); /* event streams end now rather than hold the drain */
    double until = api_now() + max_wait;
    while (atomic_load(&s->in_flight) > 0 && api_now() < until) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&s->in_flight);
}

void server_stop(server *s)
{
    if (!s) return;
    /* queued jobs finish and resume their connections before the daemon stops */
    pool_destroy(s->pool);
    streams_close_all(s->streams); /* no connection may stay suspended past MHD_stop_daemon */
    MHD_stop_daemon(s->daemon);
    conns_destroy(s->conns);
    streams_destroy(s->streams);
    /* running jobs see their cancel flag at the next check; models outlive this */
    jobs_destroy(s->jobs);
    server_free(s);
}
