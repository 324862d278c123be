/* test_http_api.c - the API clients need (issue 17): run-time models,
 * model listings, job listing, capabilities, the served spec.
 *
 * Starts the real build/lensd with --models-dir holding two random tiny
 * checkpoints (lensd mkmodel) and one corrupt folder, and checks:
 *   - start-up serves the good folders and lists the bad one as failed,
 *     as does a bad --model folder next to a good one (issue 16 item 6);
 *   - every ModelInfo has analyses (lens_model_supports) and memory_bytes;
 *   - POST /v1/models: outside --models-dir, duplicate id, corrupt folder
 *     each answer a typed 4xx and leave the resident models as they were;
 *     a good folder loads and serves requests;
 *   - DELETE /v1/models/{id} while a request on it waits in the pool
 *     (--debug-delay-ms): the request still answers 200 from the model,
 *     later ones get 404, and the server log shows the model freed after
 *     the request, not before (under `make test-asan` a read of freed
 *     weights would abort the server and fail the request);
 *   - GET /v1/jobs (state filter, limit, newest first), job events (SSE),
 *     /v1/capabilities,
 *     /openapi.yaml equal to the repository file.
 * Every JSON response is checked against openapi.yaml. */
#include <pthread.h>

#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[] = "/tmp/lensd-api-XXXXXX";

static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }

static const json_t *find_model(const json_t *models, const char *id)
{
    for (size_t i = 0; i < json_array_size(models); i++)
        if (!strcmp(json_string_value(get(json_array_get(models, i), "id")) ?: "", id))
            return json_array_get(models, i);
    return NULL;
}

static int has_string(const json_t *arr, const char *s)
{
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!strcmp(json_string_value(json_array_get(arr, i)) ?: "", s)) return 1;
    return 0;
}

/* GET /v1/models: the ids resident, in a comma list, for comparisons. */
static void resident_ids(test_server *s, char *out, size_t n)
{
    http_resp r;
    http_get(s, &r, "/v1/models");
    check_schema(&r, "/v1/models", "GET");
    out[0] = 0;
    const json_t *m = get(r.json, "models");
    for (size_t i = 0; i < json_array_size(m); i++) {
        strncat(out, json_string_value(get(json_array_get(m, i), "id")) ?: "?", n - strlen(out) - 1);
        strncat(out, ",", n - strlen(out) - 1);
    }
    http_resp_free(&r);
}

static void test_listing(test_server *s)
{
    http_resp r;
    http_get(s, &r, "/v1/models");
    CHECK(r.status == 200, "GET /v1/models -> %ld", r.status);
    check_schema(&r, "/v1/models", "GET");
    const json_t *models = get(r.json, "models"), *failed = get(r.json, "failed");
    const json_t *bert = find_model(models, "bert"), *gpt = find_model(models, "gpt");
    CHECK(bert && gpt && json_array_size(models) == 2, "bert and gpt resident (%zu models)", json_array_size(models));
    CHECK(json_array_size(failed) == 1, "one failed folder listed (%zu)", json_array_size(failed));
    const json_t *f = json_array_get(failed, 0);
    const char *fid = json_string_value(get(f, "id")), *ferr = json_string_value(get(f, "error"));
    CHECK(fid && !strcmp(fid, "broken") && ferr && *ferr, "failed: {id broken, error \"%s\"}", ferr ? ferr : "-");
    /* BERT classifier runs every analysis; GPT-2 (causal LM) not the classifier-only ones */
    const json_t *ba = get(bert, "analyses"), *ga = get(gpt, "analyses");
    CHECK(has_string(ba, "forward") && has_string(ba, "attribution") && has_string(ba, "head_importance"),
          "bert analyses include forward, attribution, head_importance");
    CHECK(has_string(ga, "forward") && has_string(ga, "attribution") && !has_string(ga, "head_importance"),
          "gpt analyses: forward and attribution, no head_importance");
    long long bytes = json_integer_value(get(bert, "bytes")), mem = json_integer_value(get(bert, "memory_bytes"));
    long long params = json_integer_value(get(bert, "parameters"));
    /* packed GEMM panels are an extra copy of the linear maps: more than the raw weights, less than 3x */
    CHECK(mem > bytes && mem < 3 * bytes + 4 * params, "memory_bytes %lld > bytes %lld", mem, bytes);
    http_resp_free(&r);
}

static void post_model(test_server *s, http_resp *r, const char *id, const char *path)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"id\": \"%s\", \"path\": \"%s\"}", id, path);
    http_post_json(s, r, "/v1/models", body);
    check_schema(r, "/v1/models", "POST");
}

static void test_load_errors(test_server *s)
{
    char before[512], after[512], outside[600];
    resident_ids(s, before, sizeof before);
    snprintf(outside, sizeof outside, "%s/outside", tmpdir);
    struct {
        const char *id, *path;
        long status;
        const char *code, *field;
    } cases[] = {
        {"x1", outside, 422, "invalid_request", "path"},          /* absolute, outside */
        {"x2", "../outside", 422, "invalid_request", "path"},     /* relative escape */
        {"x3", "link", 422, "invalid_request", "path"},           /* symlink leaving the folder */
        {"x4", "nope", 422, "invalid_request", "path"},           /* missing */
        {"bert", "gpt", 409, "model_exists", "id"},               /* duplicate id */
        {"x5", "broken", 422, "load_failed", "path"},             /* corrupt checkpoint */
        {"bad id!", "gpt", 422, "invalid_request", "id"},
        {"..", "gpt", 422, "invalid_request", "id"}, /* the message names the rule, "." and ".." too */
    };
    int n = (int)(sizeof cases / sizeof *cases);
    CHECK(n == 8, "8 bad load cases");
    for (int i = 0; i < n; i++) {
        http_resp r;
        post_model(s, &r, cases[i].id, cases[i].path);
        const char *code = err_code(&r), *field = err_field(&r);
        CHECK(r.status == cases[i].status && code && !strcmp(code, cases[i].code) && field &&
                  !strcmp(field, cases[i].field),
              "POST /v1/models {%s, %s} -> %ld %s field %s: %s", cases[i].id, cases[i].path, r.status,
              code ? code : "-", field ? field : "-", r.body ? r.body : "");
        if (!strcmp(cases[i].field, "id") && cases[i].status == 422)
            CHECK(r.body && strstr(r.body, "other than \\\".\\\" and \\\"..\\\""),
                  "the id rule says . and .. are refused: %s", r.body ? r.body : "");
        http_resp_free(&r);
    }
    http_resp r;
    http_post_json(s, &r, "/v1/models", "{\"path\": \"gpt\"}");
    CHECK(r.status == 422 && !strcmp(err_field(&r) ?: "", "id"), "missing id -> 422 field id (%ld)", r.status);
    http_resp_free(&r);
    resident_ids(s, after, sizeof after);
    CHECK(!strcmp(before, after), "resident models untouched by failed loads: %s vs %s", before, after);
}

typedef struct {
    test_server *s;
    http_resp r;
} bg_request;

static void *forward_in_background(void *arg)
{
    bg_request *b = arg;
    http_post_json(b->s, &b->r, "/v1/forward", "{\"model\": \"bert2\", \"text\": \"hello world\", \"outputs\": [\"logits\"]}");
    return NULL;
}

/* Index of needle in the server log, or -1. */
static long log_offset(const test_server *s, const char *needle)
{
    FILE *f = fopen(s->log_path, "r");
    if (!f) return -1;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *p = strstr(text, needle);
    return p ? (long)(p - text) : -1;
}

static void test_load_unload(test_server *s)
{
    http_resp r;
    post_model(s, &r, "bert2", "bert");
    CHECK(r.status == 201 && !strcmp(json_string_value(get(r.json, "id")) ?: "", "bert2"),
          "POST /v1/models bert2 -> %ld %s", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"bert2\", \"text\": \"hello world\", \"outputs\": [\"logits\"]}");
    CHECK(r.status == 200, "forward on the loaded model -> %ld", r.status);
    json_t *want = json_deep_copy(get(r.json, "logits"));
    http_resp_free(&r);

    /* a request waiting in the pool holds the model; DELETE unlinks it at once */
    bg_request b = {.s = s};
    pthread_t t;
    pthread_create(&t, NULL, forward_in_background, &b);
    sleep_ms(400);
    http_do(s, &r, "DELETE", "/v1/models/bert2", NULL, NULL, 0, NULL);
    check_schema(&r, "/v1/models/{id}", "DELETE");
    long in_use = (long)json_integer_value(get(r.json, "in_use"));
    CHECK(r.status == 200 && in_use == 1, "DELETE mid-request -> %ld, in_use %ld", r.status, in_use);
    http_resp_free(&r);
    CHECK(log_offset(s, "model bert2 freed") < 0, "model not freed while its request waits");
    http_get(s, &r, "/v1/models/bert2");
    CHECK(r.status == 404, "GET unloaded model -> %ld", r.status);
    http_resp_free(&r);
    pthread_join(t, NULL);
    CHECK(b.r.status == 200 && json_equal(get(b.r.json, "logits"), want),
          "the in-flight request finished on the unloaded model with the same logits (%ld)", b.r.status);
    http_resp_free(&b.r);
    json_decref(want);
    sleep_ms(100);
    CHECK(log_offset(s, "model bert2 freed") >= 0, "model freed after its last request");
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"bert2\", \"text\": \"hello\"}");
    CHECK(r.status == 404 && !strcmp(err_code(&r) ?: "", "model_not_found"), "forward after unload -> %ld",
          r.status);
    http_resp_free(&r);
    http_do(s, &r, "DELETE", "/v1/models/bert2", NULL, NULL, 0, NULL);
    CHECK(r.status == 404, "DELETE twice -> %ld", r.status);
    check_schema(&r, "/v1/models/{id}", "DELETE");
    http_resp_free(&r);
}

static void test_jobs_list(test_server *s)
{
    char ids[3][32];
    for (int i = 0; i < 3; i++) {
        http_resp r;
        http_post_json(s, &r, "/v1/jobs",
                       "{\"kind\": \"hidden-attribution\", \"params\": {\"model\": \"bert\", \"text\": \"a b c\"}}");
        CHECK(r.status == 202, "job %d -> %ld %s", i, r.status, r.body ? r.body : "");
        snprintf(ids[i], sizeof ids[i], "%s", json_string_value(get(r.json, "id")) ?: "");
        http_resp_free(&r);
    }
    http_resp r;
    http_get(s, &r, "/v1/jobs");
    check_schema(&r, "/v1/jobs", "GET");
    const json_t *jobs = get(r.json, "jobs");
    CHECK(r.status == 200 && json_array_size(jobs) >= 3, "GET /v1/jobs lists %zu", json_array_size(jobs));
    CHECK(!strcmp(json_string_value(get(json_array_get(jobs, 0), "id")) ?: "", ids[2]) &&
              !strcmp(json_string_value(get(json_array_get(jobs, 2), "id")) ?: "", ids[0]),
          "newest first");
    http_resp_free(&r);
    http_get(s, &r, "/v1/jobs?limit=1");
    check_schema(&r, "/v1/jobs", "GET");
    CHECK(json_array_size(get(r.json, "jobs")) == 1 && json_integer_value(get(r.json, "total")) >= 3,
          "limit=1: one job, total >= 3");
    http_resp_free(&r);
    for (int i = 0; i < 3; i++) json_decref(poll_job(s, ids[i], "done", 60000));
    http_get(s, &r, "/v1/jobs?state=queued");
    check_schema(&r, "/v1/jobs", "GET");
    CHECK(r.status == 200 && json_array_size(get(r.json, "jobs")) == 0, "no queued job once all are done");
    http_resp_free(&r);
    http_get(s, &r, "/v1/jobs?state=done");
    CHECK(json_integer_value(get(r.json, "total")) >= 3 && !get(json_array_get(get(r.json, "jobs"), 0), "result"),
          "state=done lists them, without results");
    http_resp_free(&r);
    http_get(s, &r, "/v1/jobs?state=finished");
    check_schema(&r, "/v1/jobs", "GET");
    CHECK(r.status == 422 && !strcmp(err_field(&r) ?: "", "state"), "unknown state -> %ld", r.status);
    http_resp_free(&r);
    http_get(s, &r, "/v1/jobs?limit=0");
    CHECK(r.status == 422 && !strcmp(err_field(&r) ?: "", "limit"), "limit=0 -> %ld", r.status);
    http_resp_free(&r);
}

/* GET /v1/jobs/{id}/events: progress events, keep-alive comments while the
 * job waits (--debug-delay-ms 1000, --sse-keepalive 0.2), a final "done"
 * event carrying the result, then the stream closes. */
static void test_events(test_server *s)
{
    http_resp r;
    http_post_json(s, &r, "/v1/jobs", "{\"kind\": \"hidden-attribution\", \"params\": {\"model\": \"bert\", \"text\": \"a b c\"}}");
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/events", json_string_value(get(r.json, "id")) ?: "-");
    http_resp_free(&r);
    http_get(s, &r, path);
    char ct[128];
    http_header(&r, "Content-Type", ct, sizeof ct);
    CHECK(r.status == 200 && !strcmp(ct, "text/event-stream"), "events -> %ld %s", r.status, ct);
    int progress = 0, keepalive = 0, done = 0, after_done = 0;
    json_t *last = NULL;
    for (char *line = r.body ? strtok(r.body, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        if (done && line[0]) after_done++;
        if (!strcmp(line, ": keep-alive")) keepalive++;
        else if (!strcmp(line, "event: progress")) progress++;
        else if (!strcmp(line, "event: done")) done = 1;
        else if (!strncmp(line, "data: ", 6)) {
            json_decref(last);
            last = json_loads(line + 6, 0, NULL);
            if (done) after_done--;
        }
    }
    CHECK(progress >= 1 && keepalive >= 1 && done && after_done == 0, "%d progress events, %d keep-alives, done last (%d)",
          progress, keepalive, after_done);
    CHECK(last && !strcmp(json_string_value(get(last, "state")) ?: "", "done") && get(last, "result"),
          "the done event carries the finished job with its result");
    char err[512];
    const json_t *job_schema = get(get(get(openapi, "components"), "schemas"), "Job");
    CHECK(last && schema_validate(openapi, job_schema, last, err, sizeof err) == 0, "done event data is a Job: %s", err);
    json_decref(last);
    http_resp_free(&r);
    http_get(s, &r, "/v1/jobs/0123456789abcdef/events");
    check_schema(&r, "/v1/jobs/{id}/events", "GET");
    CHECK(r.status == 404 && !strcmp(err_code(&r) ?: "", "job_not_found"), "events of an unknown job -> %ld", r.status);
    http_resp_free(&r);
}

static void test_discovery(test_server *s)
{
    http_resp r;
    http_get(s, &r, "/v1/capabilities");
    CHECK(r.status == 200, "capabilities -> %ld", r.status);
    check_schema(&r, "/v1/capabilities", "GET");
    const json_t *kinds = get(r.json, "job_kinds"), *an = get(r.json, "analyses");
    CHECK(json_array_size(kinds) == 8 && json_array_size(an) >= 9,
          "%zu job kinds, %zu analyses", json_array_size(kinds), json_array_size(an));
    for (size_t i = 0; i < json_array_size(kinds); i++) {
        const char *ref = json_string_value(get(json_array_get(kinds, i), "params_schema"));
        const char *res = json_string_value(get(json_array_get(kinds, i), "result_schema"));
        const char *prefix = "/openapi.yaml#/components/schemas/";
        int ok = ref && res && !strncmp(ref, prefix, strlen(prefix)) && !strncmp(res, prefix, strlen(prefix)) &&
                 get(get(get(openapi, "components"), "schemas"), ref + strlen(prefix)) &&
                 get(get(get(openapi, "components"), "schemas"), res + strlen(prefix));
        CHECK(ok, "job kind %zu: schemas %s, %s exist in openapi.yaml", i, ref ? ref : "-", res ? res : "-");
        const json_t *fields = get(json_array_get(kinds, i), "params_fields");
        int has_model = 0;
        for (size_t f = 0; f < json_array_size(fields); f++)
            has_model |= !strcmp(json_string_value(json_array_get(fields, f)) ?: "", "model");
        CHECK(has_model, "job kind %zu: params_fields lists model (%zu fields)", i, json_array_size(fields));
    }
    const json_t *files = get(r.json, "data_files");
    CHECK(json_is_true(get(r.json, "data_dir")) && json_array_size(files) == 1 &&
              !strcmp(json_string_value(get(json_array_get(files, 0), "path")) ?: "", "rows.tsv"),
          "data_files lists rows.tsv");
    http_resp_free(&r);
    http_get(s, &r, "/openapi.yaml");
    FILE *f = fopen("openapi.yaml", "rb");
    static char want[1 << 20];
    size_t n = f ? fread(want, 1, sizeof want, f) : 0;
    if (f) fclose(f);
    char ct[128];
    http_header(&r, "Content-Type", ct, sizeof ct);
    CHECK(r.status == 200 && r.len == n && n > 0 && !memcmp(r.body, want, n) && !strcmp(ct, "application/yaml"),
          "GET /openapi.yaml serves the file (%zu of %zu bytes, %s)", r.len, n, ct);
    http_resp_free(&r);
}

/* A bad --model folder next to a good one: served, listed as failed. */
static void test_bad_model_flag(void)
{
    char good[600], bad[600];
    snprintf(good, sizeof good, "good=%s/models/gpt", tmpdir);
    snprintf(bad, sizeof bad, "bad=%s/models/broken", tmpdir);
    const char *args[] = {"--model", good, "--model", bad, NULL};
    test_server s;
    CHECK(server_launch(&s, args) == 0, "starts with one bad --model folder");
    if (!s.pid) return;
    http_resp r;
    http_get(&s, &r, "/v1/models");
    check_schema(&r, "/v1/models", "GET");
    const json_t *failed = get(r.json, "failed");
    CHECK(json_array_size(get(r.json, "models")) == 1 && json_array_size(failed) == 1 &&
              !strcmp(json_string_value(get(json_array_get(failed, 0), "id")) ?: "", "bad"),
          "good served, bad failed: %s", r.body ? r.body : "");
    http_resp_free(&r);
    post_model(&s, &r, "x", "gpt");
    CHECK(r.status == 422 && !strcmp(err_field(&r) ?: "", "path"), "no --models-dir: POST /v1/models -> %ld",
          r.status);
    http_resp_free(&r);
    CHECK(server_terminate(&s) == 0, "clean exit");
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi || !mkdtemp(tmpdir)) return check_done("test_http_api");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %1$s/models/broken %1$s/outside %1$s/data && "
             "%2$s mkmodel --arch bert --preset tiny --seed 1 --out %1$s/models/bert >/dev/null && "
             "%2$s mkmodel --arch gpt2 --preset tiny --seed 1 --out %1$s/models/gpt >/dev/null && "
             "cp %1$s/models/bert/config.json %1$s/models/broken/ && echo garbage > %1$s/models/broken/model.safetensors && "
             "ln -s %1$s/outside %1$s/models/link && printf 'a b\\t1\\n' > %1$s/data/rows.tsv",
             tmpdir, lensd_path());
    int rc = system(cmd);
    CHECK(rc == 0, "test folders: %s", cmd);
    if (rc == 0) {
        char models_dir[600], data_dir[600];
        snprintf(models_dir, sizeof models_dir, "%s/models", tmpdir);
        snprintf(data_dir, sizeof data_dir, "%s/data", tmpdir);
        const char *args[] = {"--models-dir", models_dir, "--data-dir", data_dir, "--debug-delay-ms", "1000",
                              "--workers", "2", "--max-jobs", "2", "--sse-keepalive", "0.2", NULL};
        test_server s;
        CHECK(server_launch(&s, args) == 0, "lensd starts with a corrupt folder in --models-dir");
        if (s.pid) {
            test_listing(&s);
            test_load_errors(&s);
            test_load_unload(&s);
            test_jobs_list(&s);
            test_events(&s);
            test_discovery(&s);
            CHECK(server_terminate(&s) == 0, "clean exit");
        }
        test_bad_model_flag();
    }
    remove_test_files(tmpdir);
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_api");
}
