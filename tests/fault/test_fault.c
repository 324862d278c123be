/* test_fault.c - every allocation failure on model loading and on the
 * request path ends in a clean error, never a crash or a leak.
 *
 * SQLite's method (fault_alloc.h): run an operation with its N-th allocation
 * failing, for N = 1, 2, ... until a run completes without reaching N. Each
 * failed run must give
 *   - loading: NULL with a message (lens_model_load), or a loaded model if
 *     the failure was absorbed, and no block left allocated after freeing;
 *   - a request (api/ as server/http.c drives it, on micro models): a typed
 *     JSON error with status 500 or 503, or (absorbed) the status of the
 *     run without failures; and no block left allocated after
 *     api_call_free.
 * A table row that never reaches its end by FAULT_MAX_N fails; rows are
 * counted so an empty table fails too. */
#include <limits.h>

#include "api/api.h"
#include "core/base/blas.h"
#include "core/model/mkmodel.h"
#include "tests/check.h"
#include "tests/fault/fault_alloc.h"
#include "tests/job_inline.h"

#define FAULT_MAX_N 200000

static api_model models[2];
static api_ctx ctx;

static int is_typed_error(const api_call *c)
{
    json_t *body = json_loadb(c->out.buf, c->out.len, 0, NULL);
    json_t *e = json_object_get(body, "error");
    int ok = json_is_string(json_object_get(e, "code")) && json_is_string(json_object_get(e, "message"));
    json_decref(body);
    return ok;
}

/* The job's answer becomes the submit's, so the sweep sees it. */
static void job_submit_inline(api_call *c, const api_job_kind *kind)
{
    api_call job;
    job_run_inline(c, kind, &job);
    c->status = job.status;
    jw_raw(&c->out, job.out.buf, job.out.len);
    if (c->out.oom) api_fail(c, 500, "internal", NULL, "out of memory storing the job result");
    api_call_free(&job);
}

static void run_request(const char *path, const char *body, api_call *c)
{
    char allow[64];
    const api_route *r = api_route_match("POST", path, NULL, 0, allow, sizeof allow);
    api_call_init(c, &ctx, api_now());
    c->route = r;
    if (api_parse_body(c, body, strlen(body)) == 0 && (!r->prepare || r->prepare(c) == 0) && !c->answered)
        r->run(c);
}

typedef struct {
    long runs, failed_clean, absorbed;
} sweep;

static void report(const char *what, const sweep *s)
{
    printf("fault %-24s %6ld allocations, each failed once: %ld clean errors, %ld absorbed\n", what, s->runs,
           s->failed_clean, s->absorbed);
}

static void sweep_request(const char *path, const char *body)
{
    api_call c;
    run_request(path, body, &c); /* warm caches (token-identity vocabulary, BLAS buffers) before counting */
    int want = c.status;
    api_call_free(&c);
    CHECK(want == 200 || want == 202, "%s %s: %d without failures", path, body, want);
    sweep s = {0};
    for (long n = 1; n <= FAULT_MAX_N; n++) {
        long live = fault_live();
        fault_arm(n);
        run_request(path, body, &c);
        int fired = fault_fired();
        int status = c.status, typed = is_typed_error(&c);
        long got = c.out.len;
        char body_text[320];
        snprintf(body_text, sizeof body_text, "%.*s", (int)(c.out.len < 300 ? c.out.len : 300), c.out.buf ? c.out.buf : "");
        api_call_free(&c);
        long leaked = fault_live() - live;
        CHECK(leaked == 0, "%s failing allocation %ld: %ld blocks leaked", path, n, leaked);
        if (!fired) {
            CHECK(status == want, "%s: %d once no allocation failed, %d before", path, status, want);
            s.runs = n - 1;
            report(path, &s);
            return;
        }
        if ((status == 500 || status == 503) && typed) s.failed_clean++;
        else if (status == want && got > 0) {
            s.absorbed++;
            if (getenv("FAULT_VERBOSE")) printf("absorbed: %s allocation %ld\n", path, n), fault_print_where();
        }
        else
            CHECK(0, "%s failing allocation %ld: status %d (typed error: %d), expected 500/503 or %d: %.300s", path,
                  n, status, typed, want, body_text);
    }
    CHECK(0, "%s: still failing after %d allocations", path, FAULT_MAX_N);
}

static void sweep_load(const char *dir, const char *what)
{
    sweep s = {0};
    for (long n = 1; n <= FAULT_MAX_N; n++) {
        long live = fault_live();
        lens_err err = {0};
        fault_arm(n);
        lens_model *m = lens_model_load(dir, &err);
        int fired = fault_fired();
        if (m) lens_model_free(m);
        long leaked = fault_live() - live;
        CHECK(leaked == 0, "load %s failing allocation %ld: %ld blocks leaked", what, n, leaked);
        if (!fired) {
            CHECK(m != NULL, "load %s without failures: %s", what, err.msg);
            s.runs = n - 1;
            report(what, &s);
            return;
        }
        if (!m) {
            CHECK(err.msg[0] != 0, "load %s failing allocation %ld: no message", what, n);
            s.failed_clean++;
        } else {
            s.absorbed++;
        }
    }
    CHECK(0, "load %s: still failing after %d allocations", what, FAULT_MAX_N);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* the sweep lines survive a crash */
    fault_init();
    api_json_init();
    lens_blas_set_threads(1);
    char dir[] = "/tmp/lensd-fault-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char bert[64], gpt2[64];
    snprintf(bert, sizeof bert, "%s/bert", dir);
    snprintf(gpt2, sizeof gpt2, "%s/gpt2", dir);
    lens_err err = {0};
    CHECK(lens_mkmodel("bert", "micro", NULL, 1, bert, &err) == 0, "%s", err.msg);
    CHECK(lens_mkmodel("gpt2", "micro", NULL, 1, gpt2, &err) == 0, "%s", err.msg);

    sweep_load(bert, "load micro bert");
    sweep_load(gpt2, "load micro gpt2");

    models[0] = (api_model){.name = "bert", .model = lens_model_load(bert, &err)};
    models[1] = (api_model){.name = "gpt2", .model = lens_model_load(gpt2, &err)};
    CHECK(models[0].model && models[1].model, "models: %s", err.msg);
    ctx = (api_ctx){.models = models, .n_models = 2, .max_tokens = INT_MAX, .job_submit = job_submit_inline};

    static const struct {
        const char *path, *body;
    } requests[] = {
        {"/v1/tokenize", "{\"model\": \"bert\", \"text\": \"the movie\", \"text_pair\": \"was great\"}"},
        {"/v1/forward", "{\"model\": \"bert\", \"text\": \"a film\", \"outputs\": [\"logits\", \"hidden_states\", \"attentions\"]}"},
        {"/v1/forward", "{\"model\": \"gpt2\", \"text\": \"hello world\", \"outputs\": [\"logits\"], \"format\": {\"encoding\": \"base64\"}}"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"the movie was\", \"identifiability\": true}"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a film\", \"steps\": 2, \"tree\": true}"},
        {"/v1/attribution", "{\"model\": \"gpt2\", \"text\": \"hello world\", \"steps\": 2}"},
        {"/v1/token-identity", "{\"model\": \"bert\", \"text\": \"the movie was\"}"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\", \"text\": \"the movie\", \"method\": \"exact\"}"},
        {"/v1/hidden-attribution", "{\"model\": \"gpt2\", \"text\": \"hello world\", \"method\": \"estimate\", \"probes\": 2}"},
        {"/v1/decomposition", "{\"model\": \"gpt2\", \"texts\": [\"hello world again and again\"], \"length\": 3}"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"model\": \"bert\", \"rows\": [{\"text\": \"good\", \"label\": 1}, {\"text\": \"bad\", \"label\": 0}], \"steps\": 2}}"},
        {"/v1/jobs", "{\"kind\": \"adversarial-triggers\", \"params\": {\"model\": \"bert\", \"rows\": [{\"text\": \"good film\", \"label\": 1}, {\"text\": \"bad film\", \"label\": 0}], \"top_k\": 2, \"steps\": 2}}"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"texts\": [\"the movie\", \"was great\", \"a film\"], \"save\": false}}"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"model\": \"bert\", \"texts\": [\"good film\", \"bad\"], \"methods\": [\"random\", \"effective-attention\", \"attention-attribution\", \"alti\", \"leave-one-out\"], \"fractions\": [0, 0.5, 1], \"steps\": 2, \"random_orderings\": 2}}"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"model\": \"gpt2\", \"texts\": [\"hello world again\"], \"methods\": [\"attention\", \"hidden-attribution\"], \"fractions\": [0.5]}}"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"model\": \"gpt2\", \"texts\": [\"hello world again\"], \"unit\": \"heads\", \"fractions\": [0.5], \"steps\": 2, \"random_orderings\": 2}}"},
    };
    int n_requests = (int)(sizeof requests / sizeof *requests);
    CHECK(n_requests > 0, "no requests in the table");
    for (int i = 0; i < n_requests && models[0].model && models[1].model; i++)
        sweep_request(requests[i].path, requests[i].body);
    printf("fault: %d request kinds swept\n", n_requests);

    lens_model_free(models[0].model);
    lens_model_free(models[1].model);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    return check_done("test_fault");
}
