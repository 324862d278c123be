/* fuzz_request.h - the request fuzzers' shared body: one route of api/
 * driven as server/http.c drives it (api_parse_body, the route's prepare(),
 * then run() unless prepare answered), against resident micro models.
 *
 * A target file defines FUZZ_ROUTE (a POST path of api/routes.c) and
 * includes this. Resident models, made once per process with lens_mkmodel's
 * "micro" preset (L2, C16, vocabulary 1000) and loaded like the server's:
 * "bert" (classification), "mlm" (masked-lm), "gpt2" (causal-lm). max_tokens
 * is 12 so run() stays cheap enough for millions of executions; jobs run at
 * once on the calling thread (the hook below stands for server/jobs.c).
 *
 * Invariants checked on every answer: the status is one the API documents
 * for client-caused outcomes (200, 202, 400, 404, 413, 422, 429, 503; a 500
 * means lensd failed on an input it accepted, and is a finding), and the
 * body is JSON (json_valid.h for 2xx answers, jansson for errors); an error
 * body is {"error": {"code", "message", ...}}. */
#ifndef LENS_FUZZ_REQUEST_H
#define LENS_FUZZ_REQUEST_H

#include <limits.h>

#include "api/api.h"
#include "core/base/blas.h"
#include "core/model/mkmodel.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/json_valid.h"
#include "tests/job_inline.h"

static api_model fuzz_models[3];
static api_ctx fuzz_ctx;

static void fuzz_check_answer(const api_call *c, const char *what)
{
    int s = c->status;
    FUZZ_REQUIRE(s == 200 || s == 202 || s == 400 || s == 404 || s == 413 || s == 422 || s == 429 || s == 503,
                 "%s answered %d: %.*s", what, s, (int)(c->out.len < 2000 ? c->out.len : 2000), c->out.buf);
    if (s < 400) { /* recognised, not parsed: a forward's answer holds thousands of numbers */
        FUZZ_REQUIRE(json_valid(c->out.buf, c->out.len), "%s: the %d body is not JSON: %.*s", what, s,
                     (int)(c->out.len < 2000 ? c->out.len : 2000), c->out.buf);
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb(c->out.buf, c->out.len, 0, &jerr);
    FUZZ_REQUIRE(body != NULL, "%s: the %d body is not JSON (%s): %.*s", what, s, jerr.text,
                 (int)(c->out.len < 2000 ? c->out.len : 2000), c->out.buf);
    json_t *e = json_object_get(body, "error");
    FUZZ_REQUIRE(json_is_string(json_object_get(e, "code")) && json_is_string(json_object_get(e, "message")),
                 "%s: the %d body is not a typed error: %.*s", what, s, (int)c->out.len, c->out.buf);
    json_decref(body);
}

/* server/jobs.c's job thread, inline; the submit answers 202. */
static void fuzz_job_submit(api_call *c, const api_job_kind *kind)
{
    api_call job;
    job_run_inline(c, kind, &job);
    fuzz_check_answer(&job, kind->kind);
    api_call_free(&job);
    c->status = 202;
    jw_obj(&c->out);
    jw_key(&c->out, "id");
    jw_str(&c->out, "fuzz");
    jw_end(&c->out);
}

static void fuzz_load_model(int i, const char *name, const char *arch, const char *task)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", fuzz_path(name));
    lens_err err = {0};
    FUZZ_REQUIRE(lens_mkmodel(arch, "micro", task, 1, dir, &err) == 0, "%s", err.msg);
    lens_model *m = lens_model_load(dir, &err);
    FUZZ_REQUIRE(m != NULL, "%s: %s", dir, err.msg);
    fuzz_models[i] = (api_model){.name = (char *)name, .model = m};
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    lens_blas_set_threads(1);
    fuzz_load_model(0, "bert", "bert", "classification");
    fuzz_load_model(1, "mlm", "bert", "masked-lm");
    fuzz_load_model(2, "gpt2", "gpt2", NULL);
    fuzz_ctx = (api_ctx){.models = fuzz_models, .n_models = 3, .max_tokens = 12, .job_submit = fuzz_job_submit};
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const api_route *route;
    if (!route) {
        char allow[64];
        route = api_route_match("POST", FUZZ_ROUTE, NULL, 0, allow, sizeof allow);
        FUZZ_REQUIRE(route && route->json_body, "no POST route %s with a JSON body", FUZZ_ROUTE);
    }
    api_call c;
    api_call_init(&c, &fuzz_ctx, api_now());
    c.route = route;
    if (api_parse_body(&c, (const char *)data, size) == 0 && (!route->prepare || route->prepare(&c) == 0) &&
        !c.answered)
        route->run(&c);
    fuzz_check_answer(&c, FUZZ_ROUTE);
    if (getenv("FUZZ_PRINT")) /* replaying an input: what it was answered */
        printf("%d %.*s\n", c.status, (int)(c.out.len < 300 ? c.out.len : 300), c.out.buf);
    api_call_free(&c);
    return 0;
}

#endif
