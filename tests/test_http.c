/* test_http.c - integration tests of the real lensd binary over HTTP.
 *
 * Generates tiny random BERT and GPT-2 checkpoints with `lensd mkmodel`,
 * starts `lensd serve` on free ports (several servers with different
 * settings) and checks every route, every error status with its code and
 * field (a matrix of bad inputs), the limits, API keys, CORS, the queue
 * (429), the deadline (503 timeout), graceful SIGTERM, that the CLI prints
 * what the API returns, and that every JSON response validates against its
 * schema in openapi.yaml, whose paths must equal the route table's.
 * With ../shared present, /v1/forward logits of bert-tiny-sst2 are compared
 * with golden.json at |diff| <= 1e-4 (float32 PyTorch vs float32 BLAS with a
 * different summation order; observed differences are ~1e-6). */
#include <ctype.h>
#include <math.h>

#include "api/api.h"
#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[256];

/* ------------------------------------------------------- openapi vs routes */

static void test_openapi_paths(void)
{
    const json_t *paths = json_object_get(openapi, "paths");
    CHECK(json_object_size(paths) > 0, "openapi.yaml has no paths");
    for (int i = 0; i < api_n_routes; i++) {
        const json_t *p = json_object_get(paths, api_routes[i].path);
        CHECK(p != NULL, "route %s is missing from openapi.yaml", api_routes[i].path);
        char m[16];
        snprintf(m, sizeof m, "%s", api_routes[i].method);
        for (char *c = m; *c; c++) *c = (char)(*c + 32 * (*c >= 'A' && *c <= 'Z'));
        CHECK(p && json_object_get(p, m), "openapi.yaml lacks %s %s", m, api_routes[i].path);
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)paths, key, v) {
        int found = 0;
        for (int i = 0; i < api_n_routes; i++) found |= !strcmp(api_routes[i].path, key);
        CHECK(found, "openapi.yaml path %s is not in the route table", key);
    }
}

/* ------------------------------------------------------------ main server */

static void test_service_routes(test_server *s)
{
    http_resp r;
    http_get(s, &r, "/healthz");
    CHECK(r.status == 200 && r.json && !strcmp(json_string_value(json_object_get(r.json, "status")), "ok"),
          "/healthz: %ld %s", r.status, r.body);
    check_schema(&r, "/healthz", "GET");
    char id[128];
    CHECK(http_header(&r, "X-Request-Id", id, sizeof id) == 0 && id[0], "responses carry a generated X-Request-Id");
    http_resp_free(&r);

    const char *hdr[] = {"X-Request-Id: test-req-42", NULL};
    http_do(s, &r, "GET", "/readyz", NULL, NULL, 0, hdr);
    CHECK(r.status == 200, "/readyz: %ld", r.status);
    CHECK(http_header(&r, "X-Request-Id", id, sizeof id) == 0 && !strcmp(id, "test-req-42"),
          "X-Request-Id echoed, got \"%s\"", id);
    check_schema(&r, "/readyz", "GET");
    http_resp_free(&r);

    http_get(s, &r, "/v1/info");
    CHECK(r.status == 200, "/v1/info: %ld", r.status);
    check_schema(&r, "/v1/info", "GET");
    json_t *limits = json_object_get(r.json, "limits");
    CHECK(json_integer_value(json_object_get(limits, "max_tokens")) == 64, "info limits.max_tokens is the flag");
    CHECK(json_integer_value(json_object_get(limits, "max_body")) == 65536, "info limits.max_body is the flag");
    CHECK(json_integer_value(json_object_get(limits, "queue")) == 4, "info limits.queue");
    CHECK(json_integer_value(json_object_get(r.json, "workers")) == 2, "info workers");
    const char *core = json_string_value(json_object_get(json_object_get(r.json, "blas"), "core"));
    CHECK(core && *core, "info reports the BLAS core");
    /* lensd info prints the same object minus the server section */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s info", lensd_path());
    json_t *cli = run_json(cmd);
    /* blas.threads may differ: serve sets OpenBLAS to 1 thread (docs/api-notes.md "Threading") */
    json_t *cli_blas = json_deep_copy(json_object_get(cli, "blas")), *srv_blas = json_deep_copy(json_object_get(r.json, "blas"));
    json_object_del(cli_blas, "threads");
    json_object_del(srv_blas, "threads");
    CHECK(cli && json_equal(cli_blas, srv_blas) && json_equal(json_object_get(cli, "version"), json_object_get(r.json, "version")) &&
              !json_object_get(cli, "limits"),
          "lensd info = /v1/info without limits");
    json_decref(cli_blas);
    json_decref(srv_blas);
    long cores = sysconf(_SC_NPROCESSORS_ONLN), want_threads = cores / 2 > 0 ? cores / 2 : 1;
    CHECK(json_integer_value(json_object_get(json_object_get(r.json, "blas"), "threads")) == 1 &&
              json_integer_value(json_object_get(r.json, "threads_per_worker")) == want_threads,
          "serve: OpenBLAS on 1 thread, threads-per-worker = cores / workers = %ld", want_threads);
    json_decref(cli);
    http_resp_free(&r);

    http_get(s, &r, "/v1/models");
    CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "models")) == 2, "/v1/models lists 2: %.200s",
          r.body);
    check_schema(&r, "/v1/models", "GET");
    http_resp_free(&r);

    http_get(s, &r, "/v1/models/bert");
    CHECK(r.status == 200, "/v1/models/bert: %ld", r.status);
    check_schema(&r, "/v1/models/{id}", "GET");
    CHECK(json_integer_value(json_object_get(r.json, "num_layers")) == 2 &&
              json_integer_value(json_object_get(r.json, "num_heads")) == 2 &&
              json_integer_value(json_object_get(r.json, "hidden_size")) == 128 &&
              !strcmp(json_string_value(json_object_get(r.json, "task")), "classification") &&
              json_array_size(json_object_get(r.json, "labels")) == 2 &&
              json_integer_value(json_object_get(r.json, "parameters")) > 0 &&
              json_integer_value(json_object_get(r.json, "bytes")) > 0,
          "bert ModelInfo: %.300s", r.body);
    http_resp_free(&r);

    http_get(s, &r, "/v1/models/gpt");
    CHECK(r.status == 200 && json_is_null(json_object_get(r.json, "labels")) &&
              !strcmp(json_string_value(json_object_get(r.json, "task")), "causal-lm") &&
              !strcmp(json_string_value(json_object_get(r.json, "model_type")), "gpt2"),
          "gpt ModelInfo: %.300s", r.body);
    check_schema(&r, "/v1/models/{id}", "GET");
    http_resp_free(&r);

    http_do(s, &r, "OPTIONS", "/v1/forward", NULL, NULL, 0, NULL);
    char allow[128];
    http_header(&r, "Allow", allow, sizeof allow);
    CHECK(r.status == 204 && strstr(allow, "POST") && strstr(allow, "OPTIONS"), "OPTIONS: %ld Allow \"%s\"",
          r.status, allow);
    http_resp_free(&r);

    http_do(s, &r, "HEAD", "/healthz", NULL, NULL, 0, NULL);
    CHECK(r.status == 200, "HEAD /healthz: %ld", r.status);
    http_resp_free(&r);
}

static void test_tokenize(test_server *s)
{
    http_resp r;
    http_post_json(s, &r, "/v1/tokenize", "{\"model\": \"bert\", \"text\": \"hello world\", \"text_pair\": \"again\"}");
    CHECK(r.status == 200, "tokenize: %ld %.200s", r.status, r.body);
    check_schema(&r, "/v1/tokenize", "POST");
    json_t *toks = json_object_get(r.json, "tokens"), *ids = json_object_get(r.json, "input_ids");
    size_t n = json_array_size(toks);
    CHECK(n >= 5 && n == json_array_size(ids), "tokens and input_ids agree: %zu", n);
    json_t *first = json_array_get(toks, 0), *last = json_array_get(toks, n - 1);
    CHECK(json_is_true(json_object_get(first, "special")) && json_is_null(json_object_get(first, "start")) &&
              !strcmp(json_string_value(json_object_get(first, "text")), "[CLS]"),
          "first token is [CLS] with null offsets");
    CHECK(json_integer_value(json_object_get(last, "segment")) == 1, "pair tokens are segment 1");
    json_t *t1 = json_array_get(toks, 1);
    CHECK(json_integer_value(json_object_get(t1, "start")) == 0 && json_integer_value(json_object_get(t1, "end")) > 0,
          "offsets of the first word");
    http_resp_free(&r);

    /* the single GPT-2 path */
    http_post_json(s, &r, "/v1/tokenize", "{\"model\": \"gpt\", \"text\": \"hello world\"}");
    CHECK(r.status == 200, "gpt tokenize: %ld %.200s", r.status, r.body);
    check_schema(&r, "/v1/tokenize", "POST");
    http_resp_free(&r);
    /* an unknown field is refused, naming it (issue 16 item 7) */
    http_post_json(s, &r, "/v1/tokenize", "{\"model\": \"gpt\", \"text\": \"hello world\", \"whatever\": {\"x\": [1]}}");
    CHECK(r.status == 422 && err_field(&r) && !strcmp(err_field(&r), "whatever"),
          "tokenize with an unknown field: %ld %.200s", r.status, r.body);
    http_resp_free(&r);
    /* a long unknown name is cut in the error's field, never inside a UTF-8 sequence (fuzz_req_jobs found
     * params.<name> cut so, which made the 422 body invalid JSON); at the top level and in a job's params */
    char name[2 * 200 + 1] = "", body[600];
    for (int i = 0; i < 200; i++) strcat(name, "\xc3\xa9");
    /* the field is cut after 159 bytes: "params.x" shifts the cut into a sequence as no prefix does */
    const char *fmt[] = {"{\"model\": \"gpt\", \"text\": \"a\", \"%s\": 1}",
                         "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"x%s\": 1}}"};
    const char *path[] = {"/v1/tokenize", "/v1/jobs"}, *prefix[] = {"\xc3\xa9\xc3\xa9", "params.x\xc3\xa9"};
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, fmt[k], name);
        http_post_json(s, &r, path[k], body);
        const char *f = err_field(&r);
        CHECK(r.status == 422 && r.json && f && !strncmp(f, prefix[k], strlen(prefix[k])),
              "%s: a 200-character unknown name answers a JSON 422 naming it: %ld %.120s", path[k], r.status, r.body);
        http_resp_free(&r);
    }

    /* the CLI prints the same JSON (timing aside) */
    http_post_json(s, &r, "/v1/tokenize", "{\"model\": \"bert\", \"text\": \"Hello, wörld!\"}");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s tokenize --model %s/bert 'Hello, wörld!'", lensd_path(), tmpdir);
    json_t *cli = run_json(cmd);
    CHECK(cli && r.json, "CLI tokenize output parses");
    if (cli && r.json) {
        json_object_del(cli, "timing_ms");
        json_object_del(r.json, "timing_ms");
        CHECK(json_equal(cli, r.json), "lensd tokenize differs from POST /v1/tokenize");
    }
    json_decref(cli);
    http_resp_free(&r);
}

static double num(const json_t *v) { return json_number_value(v); }

static void test_forward(test_server *s)
{
    http_resp r;
    http_post_json(s, &r, "/v1/forward",
                   "{\"model\": \"bert\", \"text\": \"the movie was great\", "
                   "\"outputs\": [\"logits\", \"hidden_states\", \"attentions\"], \"layers\": [2, 0, 2], \"heads\": [1]}");
    CHECK(r.status == 200, "forward bert: %ld %.300s", r.status, r.body);
    check_schema(&r, "/v1/forward", "POST");
    size_t T = json_array_size(json_object_get(r.json, "tokens"));
    json_t *probs = json_object_get(r.json, "probs");
    CHECK(json_array_size(json_object_get(r.json, "logits")) == 2 && json_array_size(probs) == 2,
          "classifier logits and probs have 2 labels");
    double psum = num(json_array_get(probs, 0)) + num(json_array_get(probs, 1));
    CHECK(fabs(psum - 1) <= 2e-6, "probs sum to 1 within 2 x 0.5e-6 rounding: %.9f", psum);
    CHECK(json_is_string(json_object_get(r.json, "label")), "label present");
    const int argmax = num(json_array_get(probs, 1)) > num(json_array_get(probs, 0));
    CHECK(json_integer_value(json_object_get(r.json, "label_id")) == argmax, "label_id is the argmax of probs (%d)",
          argmax);
    json_t *hl = json_object_get(r.json, "hidden_layers");
    CHECK(json_array_size(hl) == 2 && json_integer_value(json_array_get(hl, 0)) == 0 &&
              json_integer_value(json_array_get(hl, 1)) == 2,
          "layers [2, 0, 2]: hidden_layers sorted and deduplicated [0, 2]");
    json_t *hs = json_object_get(r.json, "hidden_states");
    CHECK(json_array_size(hs) == 2 && json_array_size(json_array_get(hs, 0)) == T &&
              json_array_size(json_array_get(json_array_get(hs, 1), 0)) == 128,
          "hidden_states [2 layers][T][128]");
    json_t *att = json_object_get(r.json, "attentions");
    json_t *a0 = json_array_get(att, 0);
    CHECK(json_array_size(att) == 1 && json_integer_value(json_object_get(a0, "layer")) == 2,
          "attentions skip layer 0 and keep layer 2");
    json_t *h = json_array_get(json_object_get(a0, "heads"), 0);
    json_t *w = json_object_get(h, "weights");
    CHECK(json_integer_value(json_object_get(h, "head")) == 1 && json_array_size(w) == T, "head 1 weights [T][T]");
    int rows_ok = 1;
    for (size_t i = 0; i < json_array_size(w); i++) {
        double sum = 0;
        for (size_t j = 0; j < json_array_size(json_array_get(w, i)); j++) sum += num(json_array_get(json_array_get(w, i), j));
        rows_ok &= fabs(sum - 1) <= (double)T * 0.5e-6 + 1e-6; /* each value rounded to 6 decimals */
    }
    CHECK(rows_ok, "attention rows sum to 1 within T x 0.5e-6");

    /* base64: the same tensors, bit-exact float32 vs 6-decimal JSON */
    http_resp b;
    http_post_json(s, &b, "/v1/forward",
                   "{\"model\": \"bert\", \"text\": \"the movie was great\", \"outputs\": [\"hidden_states\"], "
                   "\"layers\": [2], \"format\": {\"encoding\": \"base64\"}}");
    CHECK(b.status == 200, "forward base64: %ld", b.status);
    check_schema(&b, "/v1/forward", "POST");
    json_t *t = json_array_get(json_object_get(b.json, "hidden_states"), 0);
    const char *data = json_string_value(json_object_get(t, "data"));
    CHECK(data && json_integer_value(json_array_get(json_object_get(t, "shape"), 0)) == (json_int_t)T,
          "base64 tensor shape [T, 128]");
    if (data) {
        size_t n = strlen(data);
        unsigned char *bytes = malloc(n);
        size_t k = 0;
        unsigned acc = 0;
        int bits = 0;
        for (size_t i = 0; i < n && data[i] != '='; i++) {
            const char *abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            acc = acc << 6 | (unsigned)(strchr(abc, data[i]) - abc);
            bits += 6;
            if (bits >= 8) bits -= 8, bytes[k++] = (unsigned char)(acc >> bits);
        }
        CHECK(k == T * 128 * 4, "base64 decodes to T*128 floats (%zu bytes)", k);
        json_t *js = json_array_get(hs, 1); /* layer 2 of the JSON response */
        int bad = 0;
        for (size_t i = 0; i < T && k == T * 128 * 4; i++)
            for (size_t j = 0; j < 128; j++) {
                float x;
                memcpy(&x, bytes + 4 * (i * 128 + j), 4);
                double y = num(json_array_get(json_array_get(js, i), j));
                bad += !(fabs(x - y) <= 0.5e-5 * fabs(x) * (1 + 1e-9)); /* 6 significant digits */
            }
        CHECK(bad == 0, "base64 and JSON hidden states agree to the JSON precision (%d differ)", bad);
        free(bytes);
    }
    http_resp_free(&b);
    http_resp_free(&r);

    /* precision 2 */
    http_post_json(s, &r, "/v1/forward",
                   "{\"model\": \"bert\", \"text\": \"ok\", \"outputs\": [\"attentions\"], \"format\": {\"precision\": 2}}");
    w = json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(r.json, "attentions"), 0), "heads"), 0),
                        "weights");
    int prec_ok = json_array_size(w) > 0, small = 0;
    for (size_t i = 0; i < json_array_size(w); i++)
        for (size_t j = 0; j < json_array_size(json_array_get(w, i)); j++) {
            double x = fabs(num(json_array_get(json_array_get(w, i), j)));
            if (x == 0) continue;
            double scaled = x / pow(10.0, floor(log10(x)) - 1); /* 2 significant digits: an integer in [10, 100] */
            prec_ok &= fabs(scaled - round(scaled)) < 1e-6;
            small += x < 0.1;
        }
    CHECK(r.status == 200 && prec_ok, "precision 2 writes 2 significant digits (%d weights below 0.1)", small);
    /* timing_ms is not data: it keeps its 3 decimals whatever the precision */
    const char *tm = r.body ? strstr(r.body, "\"timing_ms\":") : NULL;
    int most = 0, decimals_ok = tm != NULL;
    double largest = 0;
    for (const char *p = tm ? strchr(tm, '{') : NULL; p && (p = strchr(p, ':'));) {
        int sig = 0, dec = -1;
        const double v = strtod(p + 1, NULL);
        largest = v > largest ? v : largest;
        for (p++; isdigit((unsigned char)*p) || *p == '.'; p++) {
            if (*p == '.') dec = 0;
            else {
                sig += sig > 0 || *p != '0';
                dec += dec >= 0;
            }
        }
        most = sig > most ? sig : most;
        decimals_ok &= dec <= 3;
        if (*p == '}') break;
    }
    /* below 1 ms, 3 decimals often show no third significant digit (0.066, or 0.12 for 0.120), so only a run
     * with a step of 1 ms or more can tell the formats apart (x.yz0 and x.y00 aside, 1 in 100 per value) */
    CHECK(decimals_ok && (most > 2 || largest < 1.0), "timing_ms keeps 3 decimals under precision 2 (%.120s)",
          tm ? tm : "(none)");
    http_resp_free(&r);

    /* GPT-2: token logits, positions */
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"gpt\", \"text\": \"hello there world\", \"positions\": [2, 0, 2]}");
    CHECK(r.status == 200, "forward gpt positions: %ld %.200s", r.status, r.body);
    check_schema(&r, "/v1/forward", "POST");
    json_t *lg = json_object_get(r.json, "logits");
    CHECK(json_array_size(lg) == 2 && json_array_size(json_array_get(lg, 0)) == 50257 &&
              json_integer_value(json_array_get(json_object_get(r.json, "positions"), 0)) == 0,
          "positions sorted, deduplicated, logits [2][V]");
    double first_pos0 = num(json_array_get(json_array_get(lg, 0), 0));
    http_resp_free(&r);
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"gpt\", \"text\": \"hello there world\"}");
    size_t TT = json_array_size(json_object_get(r.json, "tokens"));
    lg = json_object_get(r.json, "logits");
    CHECK(r.status == 200 && json_array_size(lg) == TT && json_array_size(json_array_get(lg, 0)) == 50257,
          "gpt logits [T][V] by default");
    CHECK(num(json_array_get(json_array_get(lg, 0), 0)) == first_pos0, "positions select the same rows");
    http_resp_free(&r);

    /* input_ids instead of text */
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"bert\", \"input_ids\": [101, 2000, 2001, 102]}");
    CHECK(r.status == 200, "forward input_ids: %ld %.200s", r.status, r.body);
    check_schema(&r, "/v1/forward", "POST");
    json_t *tk = json_object_get(r.json, "tokens");
    CHECK(json_array_size(tk) == 4 && json_is_true(json_object_get(json_array_get(tk, 0), "special")) &&
              json_is_null(json_object_get(json_array_get(tk, 1), "start")),
          "input_ids tokens: specials marked, offsets null");
    http_resp_free(&r);

    /* CLI forward == HTTP forward */
    http_post_json(s, &r, "/v1/forward",
                   "{\"model\": \"bert\", \"text\": \"a b c\", \"outputs\": [\"logits\", \"attentions\"], "
                   "\"layers\": [1], \"heads\": [0], \"format\": {\"precision\": 4}}");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s forward --model %s/bert 'a b c' --outputs logits,attentions --layers 1 --heads 0 --precision 4",
             lensd_path(), tmpdir);
    json_t *cli = run_json(cmd);
    CHECK(cli && r.json, "CLI forward output parses");
    if (cli && r.json) {
        json_object_del(cli, "timing_ms");
        json_object_del(r.json, "timing_ms");
        CHECK(json_equal(cli, r.json), "lensd forward differs from POST /v1/forward");
    }
    json_decref(cli);
    http_resp_free(&r);
}

/* --------------------------------------------------------- bad inputs
 * (any method, content type and body: the transport-level cases; the
 * per-endpoint JSON cases use run_bad_cases of http_util.h) */

typedef struct {
    const char *method, *path, *ctype, *body;
    long status;
    const char *code, *field; /* field NULL: must be null */
    const char *route;        /* openapi path pattern for schema checks, NULL: unmatched */
} raw_bad_case;

static void test_bad_inputs(test_server *s)
{
    static char big_body[70000], long_text[4096], many_ids[4096];
    /* over --max-body 65536 */
    snprintf(big_body, sizeof big_body, "{\"model\": \"bert\", \"text\": \"");
    size_t k = strlen(big_body);
    memset(big_body + k, 'a', sizeof big_body - k - 3);
    memcpy(big_body + sizeof big_body - 3, "\"}", 3);
    /* over --max-tokens 64 */
    k = (size_t)snprintf(long_text, sizeof long_text, "{\"model\": \"bert\", \"text\": \"");
    for (int i = 0; i < 200; i++) k += (size_t)snprintf(long_text + k, sizeof long_text - k, "word ");
    snprintf(long_text + k, sizeof long_text - k, "\"}");
    k = (size_t)snprintf(many_ids, sizeof many_ids, "{\"model\": \"bert\", \"input_ids\": [101");
    for (int i = 0; i < 100; i++) k += (size_t)snprintf(many_ids + k, sizeof many_ids - k, ", 2000");
    snprintf(many_ids + k, sizeof many_ids - k, "]}");

    const char *J = "application/json", *F = "/v1/forward", *TK = "/v1/tokenize";
    raw_bad_case cases[] = {
        {"POST", F, J, "{", 400, "invalid_json", NULL, F},
        {"POST", F, J, "{\"text\": \"a\",}", 400, "invalid_json", NULL, F},
        {"POST", F, J, "", 400, "invalid_json", NULL, F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"\xff\xfe\"}", 400, "invalid_json", NULL, F},
        {"POST", TK, J, "{\"model\": \"bert\", \"text\": \"ab\xc3\"}", 400, "invalid_json", NULL, TK},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\\u0000b\"}", 400, "invalid_json", NULL, F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"model\": \"gpt\"}", 400, "invalid_json", NULL, F},
        {"POST", F, J, "{\"model\": \"bert\", \"layers\": [99999999999999999999999]}", 400, "invalid_json", NULL, F},
        {"POST", F, J, "[1, 2]", 422, "invalid_request", NULL, F},
        {"POST", F, J, "\"text\"", 422, "invalid_request", NULL, F},
        {"POST", F, J, "{\"model\": \"nope\", \"text\": \"a\"}", 404, "model_not_found", "model", F},
        {"POST", F, J, "{\"model\": 5, \"text\": \"a\"}", 422, "invalid_request", "model", F},
        {"POST", F, J, "{\"text\": \"a\"}", 422, "invalid_request", "model", F},
        {"POST", F, J, "{\"model\": null, \"text\": \"a\"}", 422, "invalid_request", "model", F},
        {"POST", F, J, "{\"model\": \"bert\"}", 422, "invalid_request", "text", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"\"}", 422, "invalid_request", "text", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": 5}", 422, "invalid_request", "text", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": [\"a\"]}", 422, "invalid_request", "text", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"input_ids\": [101]}", 422, "invalid_request", "input_ids", F},
        {"POST", F, J, "{\"model\": \"gpt\", \"text\": \"a\", \"text_pair\": \"b\"}", 422, "invalid_request", "text_pair", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"text_pair\": 7}", 422, "invalid_request", "text_pair", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"text_pair\": \"\"}", 422, "invalid_request", "text_pair", F},
        {"POST", F, J, "{\"model\": \"bert\", \"input_ids\": [101], \"text_pair\": \"b\"}", 422, "invalid_request", "text_pair", F},
        {"POST", F, J, "{\"model\": \"bert\", \"input_ids\": []}", 422, "invalid_request", "input_ids", F},
        {"POST", F, J, "{\"model\": \"bert\", \"input_ids\": [-1]}", 422, "invalid_request", "input_ids", F},
        {"POST", F, J, "{\"model\": \"bert\", \"input_ids\": [999999]}", 422, "invalid_request", "input_ids", F},
        {"POST", F, J, "{\"model\": \"bert\", \"input_ids\": \"1 2\"}", 422, "invalid_request", "input_ids", F},
        {"POST", F, J, "{\"model\": \"bert\", \"input_ids\": [1.5]}", 422, "invalid_request", "input_ids", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"outputs\": [\"bogus\"]}", 422, "invalid_request", "outputs", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"outputs\": \"logits\"}", 422, "invalid_request", "outputs", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"outputs\": []}", 422, "invalid_request", "outputs", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"outputs\": [1]}", 422, "invalid_request", "outputs", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"layers\": [-1]}", 422, "invalid_request", "layers", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"layers\": [3]}", 422, "invalid_request", "layers", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"layers\": [1e30]}", 422, "invalid_request", "layers", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"layers\": [9223372036854775807]}", 422, "invalid_request", "layers", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"layers\": {}}", 422, "invalid_request", "layers", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"heads\": [2]}", 422, "invalid_request", "heads", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"heads\": \"0\"}", 422, "invalid_request", "heads", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"heads\": []}", 422, "invalid_request", "heads", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"format\": \"x\"}", 422, "invalid_request", "format", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"format\": {\"precision\": -1}}", 422, "invalid_request", "format.precision", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"format\": {\"precision\": 10}}", 422, "invalid_request", "format.precision", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"format\": {\"precision\": \"6\"}}", 422, "invalid_request", "format.precision", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"format\": {\"encoding\": \"xml\"}}", 422, "invalid_request", "format.encoding", F},
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"positions\": [0]}", 422, "invalid_request", "positions", F},
        {"POST", F, J, "{\"model\": \"gpt\", \"text\": \"hi\", \"positions\": [200]}", 422, "invalid_request", "positions", F},
        {"POST", F, J, "{\"model\": \"gpt\", \"text\": \"hi\", \"positions\": [-1]}", 422, "invalid_request", "positions", F},
        {"POST", F, J, "{\"model\": \"gpt\", \"text\": \"hi\", \"positions\": [9999]}", 422, "invalid_request", "positions", F},
        {"POST", TK, J, "{\"model\": \"bert\"}", 422, "invalid_request", "text", TK},
        {"POST", TK, J, "{\"model\": \"nope\", \"text\": \"a\"}", 404, "model_not_found", "model", TK},
        {"POST", TK, J, "{\"model\": \"bert\", \"text\": true}", 422, "invalid_request", "text", TK},
        {"POST", TK, J, long_text, 413, "too_many_tokens", "text", TK},
        {"POST", F, J, long_text, 413, "too_many_tokens", "text", F},
        {"POST", F, J, many_ids, 413, "too_many_tokens", "input_ids", F},
        {"POST", F, J, big_body, 413, "payload_too_large", NULL, F},
        {"POST", F, "text/plain", "{\"model\": \"bert\", \"text\": \"a\"}", 415, "unsupported_media_type", NULL, F},
        {"POST", F, NULL, "{\"model\": \"bert\", \"text\": \"a\"}", 415, "unsupported_media_type", NULL, F},
        {"POST", F, "application/jsonx", "{\"model\": \"bert\", \"text\": \"a\"}", 415, "unsupported_media_type", NULL, F},
        {"GET", "/v1/nope", NULL, NULL, 404, "not_found", NULL, NULL},
        {"GET", "/index.html", NULL, NULL, 404, "not_found", NULL, NULL}, /* the dashboard is at / */
        {"GET", "/v1/models/", NULL, NULL, 404, "not_found", NULL, NULL},
        {"GET", "/v1/models/nope", NULL, NULL, 404, "model_not_found", "id", "/v1/models/{id}"},
        {"DELETE", "/v1/models", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
        {"GET", F, NULL, NULL, 405, "method_not_allowed", NULL, NULL},
        {"PUT", TK, J, "{}", 405, "method_not_allowed", NULL, NULL},
        {"POST", "/healthz", J, "{}", 405, "method_not_allowed", NULL, NULL},
        /* unknown top-level fields (a typo must not answer 200 with defaults) */
        {"POST", F, J, "{\"model\": \"bert\", \"text\": \"a\", \"output\": [\"logits\"]}", 422, "invalid_request",
         "output", F},
        {"POST", TK, J, "{\"model\": \"bert\", \"text\": \"a\", \"txt\": 1}", 422, "invalid_request", "txt", TK},
        {"POST", "/v1/jobs", J, "{\"kind\": \"attribution\", \"params\": {}, \"priority\": 1}", 422, "invalid_request",
         "priority", "/v1/jobs"},
    };
    int n = (int)(sizeof cases / sizeof *cases);
    CHECK(n >= 40, "the bad-input matrix has %d cases", n);
    for (int i = 0; i < n; i++) {
        const raw_bad_case *c = &cases[i];
        http_resp r;
        int rc = http_do(s, &r, c->method, c->path, c->ctype, c->body, c->body ? strlen(c->body) : 0, NULL);
        const char *code = err_code(&r), *field = err_field(&r);
        int field_ok = c->field ? (field && !strcmp(field, c->field))
                                : (r.json && json_is_null(json_object_get(json_object_get(r.json, "error"), "field")));
        CHECK(rc == 0 && r.status == c->status && code && !strcmp(code, c->code) && field_ok,
              "case %d %s %s %.60s: got %ld %s (field %s), want %ld %s (field %s)", i, c->method, c->path,
              c->body ? c->body : "", r.status, code ? code : "-", field ? field : "null", c->status, c->code,
              c->field ? c->field : "null");
        if (c->route) check_schema(&r, c->route, c->method);
        else {
            char err[256];
            const json_t *schema = json_object_get(json_object_get(json_object_get(openapi, "components"), "schemas"), "Error");
            CHECK(r.json && schema_validate(openapi, schema, r.json, err, sizeof err) == 0,
                  "case %d: error body does not match the Error schema", i);
        }
        /* messages name the bound a client can act on, in the API's words */
        if (c->body == long_text || c->body == many_ids)
            CHECK(r.body && strstr(r.body, "the limit is 64 (the server's --max-tokens)"), "case %d names the bound: %s",
                  i, r.body ? r.body : "");
        if (c->body && strstr(c->body, "\\u0000"))
            CHECK(r.body && strstr(r.body, "NUL") && !strstr(r.body, "JSON_ALLOW"), "case %d: %s", i, r.body ? r.body : "");
        if (c->status == 405) {
            char allow[64];
            CHECK(http_header(&r, "Allow", allow, sizeof allow) == 0 && allow[0], "case %d: 405 without Allow", i);
        }
        http_resp_free(&r);
    }
    http_resp r;
    http_get(s, &r, "/healthz");
    CHECK(r.status == 200, "/healthz still answers after the bad-input matrix");
    http_resp_free(&r);
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"bert\", \"text\": \"still fine\"}");
    CHECK(r.status == 200, "models still answer after the bad-input matrix");
    http_resp_free(&r);
}

/* A raw-socket client that, like Python's urllib, writes the whole body
 * before it reads, in small slow pieces: it must read the typed error
 * (status want, error.code code) rather than a connection reset. */
/* a connected TCP socket to the server, or -1 (a failed check) */
static int raw_connect(const test_server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((unsigned short)s->port)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        CHECK(0, "raw client: cannot connect");
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

static void raw_post_must_read(test_server *s, const char *ctype, size_t body_len, int want, const char *code)
{
    int fd = raw_connect(s);
    if (fd < 0) return;
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     ctype, body_len);
    int write_failed = send(fd, head, (size_t)n, MSG_NOSIGNAL) != n;
    static char chunk[32768];
    memset(chunk, ' ', sizeof chunk);
    for (size_t sent = 0, k = 0; !write_failed && sent < body_len; sent += k) {
        k = body_len - sent < sizeof chunk ? body_len - sent : sizeof chunk;
        ssize_t w = send(fd, chunk, k, MSG_NOSIGNAL);
        if (w <= 0) write_failed = 1;
        else k = (size_t)w;
        sleep_ms(1);
    }
    CHECK(!write_failed, "raw client (%s, %zu bytes): the server stopped reading the body (%s)", ctype, body_len,
          strerror(errno));
    char resp[8192];
    size_t got = 0;
    ssize_t r;
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (got < sizeof resp - 1 && (r = recv(fd, resp + got, sizeof resp - 1 - got, 0)) > 0) {
        got += (size_t)r;
        resp[got] = 0;
        const char *body = strstr(resp, "\r\n\r\n");
        const char *cl = strcasestr(resp, "\r\nContent-Length:");
        if (body && cl && got - (size_t)(body + 4 - resp) >= strtoul(cl + 17, NULL, 10)) break;
    }
    resp[got] = 0;
    close(fd);
    int status = 0;
    sscanf(resp, "HTTP/1.%*d %d", &status);
    const char *body = strstr(resp, "\r\n\r\n");
    json_t *j = body ? json_loads(body + 4, 0, NULL) : NULL;
    const char *c = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    CHECK(status == want && c && !strcmp(c, code), "raw client (%s, %zu bytes) read status %d code %s, want %d %s",
          ctype, body_len, status, c ? c : "-", want, code);
    json_decref(j);
}

/* issue 16 item 2: errors decided from the headers reach clients that keep sending */
static void test_drained_errors(test_server *s)
{
    raw_post_must_read(s, "application/json", 3u << 20, 413, "payload_too_large");
    raw_post_must_read(s, "text/plain", 1u << 20, 415, "unsupported_media_type");
    /* no Content-Length (chunked): 413 once the received bytes pass --max-body (64 KiB) */
    static char big[70000];
    memset(big, ' ', sizeof big);
    big[0] = '{', big[sizeof big - 1] = '}';
    const char *chunked[] = {"Transfer-Encoding: chunked", NULL};
    http_resp r;
    http_do(s, &r, "POST", "/v1/forward", "application/json", big, sizeof big, chunked);
    CHECK(r.status == 413 && err_code(&r) && !strcmp(err_code(&r), "payload_too_large"),
          "chunked body over --max-body: 413 payload_too_large (%ld %.200s)", r.status, r.body);
    http_resp_free(&r);
    /* null for an optional field means absent */
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"bert\", \"text\": \"a b\", \"layers\": null, \"format\": null}");
    CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "logits")) == 2,
          "optional fields sent as null answer as if absent: %ld %.200s", r.status, r.body);
    check_schema(&r, "/v1/forward", "POST");
    http_resp_free(&r);
    http_get(s, &r, "/healthz");
    CHECK(r.status == 200, "/healthz answers after the drained bodies");
    http_resp_free(&r);
}

/* Every series of the exposition (the text before the value) at most once. */
static int metrics_duplicates(const char *body, char *first, size_t size)
{
    int dups = 0, n = 0;
    char **seen = NULL;
    for (const char *p = body; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *space = memrchr(p, ' ', len);
        if (*p != '#' && space) {
            char *series = strndup(p, (size_t)(space - p));
            for (int i = 0; i < n; i++)
                if (!strcmp(seen[i], series)) {
                    if (!dups++) snprintf(first, size, "%s", series);
                    break;
                }
            seen = realloc(seen, (size_t)(n + 1) * sizeof *seen);
            seen[n++] = series;
        }
        p = eol ? eol + 1 : NULL;
    }
    for (int i = 0; i < n; i++) free(seen[i]);
    free(seen);
    return dups;
}

static void test_metrics(test_server *s)
{
    http_resp r;
    /* two routes share the path /v1/jobs/{id}: their series differ by method */
    http_get(s, &r, "/v1/jobs/abc");
    CHECK(r.status == 404, "GET /v1/jobs/abc: %ld", r.status);
    http_resp_free(&r);
    http_do(s, &r, "DELETE", "/v1/jobs/abc", NULL, NULL, 0, NULL);
    CHECK(r.status == 404, "DELETE /v1/jobs/abc: %ld", r.status);
    http_resp_free(&r);
    http_get(s, &r, "/metrics");
    char ct[128];
    http_header(&r, "Content-Type", ct, sizeof ct);
    CHECK(r.status == 200 && !strncmp(ct, "text/plain", 10), "/metrics: %ld %s", r.status, ct);
    const char *want[] = {"lensd_requests_total{method=\"POST\",route=\"/v1/forward\",status=\"200\"}",
                          "lensd_requests_total{method=\"POST\",route=\"/v1/forward\",status=\"422\"}",
                          "lensd_requests_total{method=\"\",route=\"unmatched\",status=\"404\"}",
                          "lensd_requests_total{method=\"GET\",route=\"/v1/jobs/{id}\",status=\"404\"} 1",
                          "lensd_requests_total{method=\"DELETE\",route=\"/v1/jobs/{id}\",status=\"404\"} 1",
                          "lensd_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/forward\",le=\"+Inf\"}",
                          "lensd_request_duration_seconds_count{method=\"POST\",route=\"/v1/tokenize\"}",
                          "lensd_request_duration_seconds_count{method=\"DELETE\",route=\"/v1/jobs/{id}\"} 1",
                          "lensd_queue_depth 0",
                          "lensd_in_flight ",
                          "lensd_model_bytes{model=\"bert\"}",
                          "lensd_model_bytes{model=\"gpt\"}"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK(r.body && strstr(r.body, want[i]), "/metrics lacks %s", want[i]);
    char dup[512] = "";
    int dups = r.body ? metrics_duplicates(r.body, dup, sizeof dup) : -1;
    CHECK(dups == 0, "/metrics prints %d series more than once, e.g. %s", dups, dup);
    http_resp_free(&r);
}

/* ---------------------------------------------- auth, CORS (server B) */

static void test_auth_cors(void)
{
    char keyfile[512], model[512];
    snprintf(keyfile, sizeof keyfile, "%s/keys", tmpdir);
    FILE *f = fopen(keyfile, "w");
    fprintf(f, "# keys\nkey-one\n  key-two  \n\n");
    fclose(f);
    snprintf(model, sizeof model, "bert=%s/bert", tmpdir);
    const char *args[] = {"--model", model, "--api-key-file", keyfile, "--cors-origin", "https://a.example,https://b.example",
                          NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "server with API keys did not start");
        return;
    }
    http_resp r;
    const char *open_paths[] = {"/healthz", "/readyz", "/metrics", "/openapi.yaml"};
    for (int i = 0; i < 4; i++) {
        http_get(&s, &r, open_paths[i]);
        CHECK(r.status == 200, "%s is open without a key: %ld", open_paths[i], r.status);
        http_resp_free(&r);
    }
    /* loading and unloading models need the key like every /v1/ route */
    const char *load = "{\"id\": \"x\", \"path\": \"bert\"}";
    http_do(&s, &r, "POST", "/v1/models", "application/json", load, strlen(load), NULL);
    CHECK(r.status == 401, "POST /v1/models without a key -> %ld", r.status);
    http_resp_free(&r);
    http_do(&s, &r, "DELETE", "/v1/models/bert", NULL, NULL, 0, NULL);
    CHECK(r.status == 401, "DELETE /v1/models/bert without a key -> %ld", r.status);
    http_resp_free(&r);
    http_get(&s, &r, "/v1/models");
    char v[256];
    CHECK(r.status == 401 && err_code(&r) && !strcmp(err_code(&r), "unauthorized"), "no key -> 401: %ld", r.status);
    CHECK(http_header(&r, "WWW-Authenticate", v, sizeof v) == 0, "401 has WWW-Authenticate");
    check_schema(&r, "/v1/models", "GET");
    http_resp_free(&r);
    const char *wrong[] = {"Authorization: Bearer key-three", NULL};
    http_do(&s, &r, "GET", "/v1/models", NULL, NULL, 0, wrong);
    CHECK(r.status == 401, "wrong key -> 401: %ld", r.status);
    http_resp_free(&r);
    const char *prefix[] = {"Authorization: Bearer key-on", NULL};
    http_do(&s, &r, "GET", "/v1/info", NULL, NULL, 0, prefix);
    CHECK(r.status == 401, "a key prefix is not a key: %ld", r.status);
    http_resp_free(&r);
    const char *k1[] = {"Authorization: Bearer key-one", NULL}, *k2[] = {"Authorization: Bearer key-two", NULL};
    http_do(&s, &r, "GET", "/v1/models", NULL, NULL, 0, k1);
    CHECK(r.status == 200, "key-one -> 200: %ld", r.status);
    http_resp_free(&r);
    const char *body = "{\"text\": \"single model, no model field\"}";
    http_do(&s, &r, "POST", "/v1/forward", "application/json", body, strlen(body), k2);
    CHECK(r.status == 200 && !strcmp(json_string_value(json_object_get(r.json, "model")), "bert"),
          "key-two, model omitted with one model loaded -> 200: %ld %.200s", r.status, r.body);
    http_resp_free(&r);
    http_do(&s, &r, "POST", "/v1/forward", "application/json", body, strlen(body), NULL);
    CHECK(r.status == 401, "POST without key -> 401: %ld", r.status);
    http_resp_free(&r);

    const char *pre[] = {"Origin: https://a.example", "Access-Control-Request-Method: POST",
                         "Access-Control-Request-Headers: content-type, authorization", NULL};
    http_do(&s, &r, "OPTIONS", "/v1/forward", NULL, NULL, 0, pre);
    char methods[128], headers[256];
    http_header(&r, "Access-Control-Allow-Origin", v, sizeof v);
    http_header(&r, "Access-Control-Allow-Methods", methods, sizeof methods);
    http_header(&r, "Access-Control-Allow-Headers", headers, sizeof headers);
    CHECK(r.status == 204 && !strcmp(v, "https://a.example") && strstr(methods, "POST") &&
              strstr(headers, "Authorization"),
          "preflight: %ld origin \"%s\" methods \"%s\" headers \"%s\"", r.status, v, methods, headers);
    http_resp_free(&r);
    const char *ok_origin[] = {"Origin: https://b.example", "Authorization: Bearer key-one", NULL};
    http_do(&s, &r, "GET", "/v1/info", NULL, NULL, 0, ok_origin);
    CHECK(r.status == 200 && http_header(&r, "Access-Control-Allow-Origin", v, sizeof v) == 0 &&
              !strcmp(v, "https://b.example"),
          "allowed origin gets Access-Control-Allow-Origin");
    http_resp_free(&r);
    const char *bad_origin[] = {"Origin: https://evil.example", "Authorization: Bearer key-one", NULL};
    http_do(&s, &r, "GET", "/v1/info", NULL, NULL, 0, bad_origin);
    CHECK(r.status == 200 && http_header(&r, "Access-Control-Allow-Origin", v, sizeof v) != 0,
          "other origins get no Access-Control-Allow-Origin");
    http_resp_free(&r);
    CHECK(server_terminate(&s) == 0, "server B exits 0 on SIGTERM");
}

/* ------------------------------------------- cost lanes (server F) */

static int metric_value(const test_server *s, const char *name)
{
    http_resp r;
    http_get(s, &r, "/metrics");
    const char *p = r.body ? strstr(r.body, name) : NULL;
    int v = p ? atoi(p + strlen(name)) : -1;
    http_resp_free(&r);
    return v;
}

/* issue 16 item 3: with one general worker busy on an exact hidden
 * attribution, a forward pass is answered by the fast lane while the
 * attribution still runs (no timing threshold: the order of events). */
static void test_lanes(void)
{
    if (access("models/demo-sst2/config.json", R_OK)) {
        SKIP("models/demo-sst2 is absent: the fast lane is not checked");
        return;
    }
    const char *args[] = {"--model", "demo=models/demo-sst2", "--workers", "1", "--timeout", "600", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "server F did not start");
        return;
    }
    char heavy_body[2048];
    size_t k = (size_t)snprintf(heavy_body, sizeof heavy_body, "{\"text\": \"");
    for (int i = 0; i < 20; i++) k += (size_t)snprintf(heavy_body + k, sizeof heavy_body - k, "a charming film ");
    snprintf(heavy_body + k, sizeof heavy_body - k, "\", \"method\": \"exact\", \"layers\": [2]}");
    CURLM *multi = curl_multi_init();
    http_resp heavy;
    struct curl_slist *hl;
    CURL *e = http_easy(s.port, &heavy, "POST", "/v1/hidden-attribution", "application/json", heavy_body,
                        strlen(heavy_body), NULL, &hl);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 600L); /* seconds under -O3, minutes under ASan */
    curl_multi_add_handle(multi, e);
    int running = 1;
    /* until the general worker has the attribution (or it is already over) */
    while (running) {
        curl_multi_perform(multi, &running);
        if (metric_value(&s, "\nlensd_workers_busy ") >= 1) break;
        curl_multi_poll(multi, NULL, 0, 20, NULL);
    }
    CHECK(running, "the hidden attribution was still running when the forward pass was sent");
    http_resp r;
    http_post_json(&s, &r, "/v1/forward", "{\"text\": \"a charming film\"}");
    curl_multi_perform(multi, &running);
    CHECK(r.status == 200 && running, "forward answered (%ld) while the hidden attribution still runs (%d)", r.status,
          running);
    http_resp_free(&r);
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    curl_multi_remove_handle(multi, e);
    http_finish(e, &heavy, hl);
    curl_multi_cleanup(multi);
    CHECK(heavy.status == 200, "the hidden attribution finished: %ld %.200s", heavy.status, heavy.body);
    http_resp_free(&heavy);
    CHECK(server_terminate(&s) == 0, "server F exits 0");
}

/* ----------------------------------------- cost model (servers G, H) */

static void text_of(char *out, size_t size, int repeats, const char *tail)
{
    size_t k = (size_t)snprintf(out, size, "{\"text\": \"");
    for (int i = 0; i < repeats; i++) k += (size_t)snprintf(out + k, size - k, "a charming film ");
    snprintf(out + k, size - k, "\"%s}", tail);
}

/* issue 16 item 1: the measured rate is reported; an analysis that cannot
 * finish within the deadline is refused up front with a hint; a request that
 * misses its deadline anyway names the same hint in its 503. */
static void test_cost_model(void)
{
    if (access("models/demo-identifiable/config.json", R_OK)) {
        SKIP("models/demo-identifiable is absent: the cost model is not checked");
        return;
    }
    /* the rate pinned at 10 GFLOP/s: the prediction, and so the 413, does not depend on this machine */
    const char *args[] = {"--model", "demo=models/demo-identifiable", "--timeout", "2", "--debug-gflops", "10", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "server G did not start");
        return;
    }
    http_resp r;
    http_get(&s, &r, "/v1/info");
    json_t *cm = json_object_get(r.json, "cost_model");
    CHECK(r.status == 200 && json_number_value(json_object_get(cm, "gemm_gflops")) > 0 &&
              json_object_size(json_object_get(cm, "efficiency")) == 7,
          "/v1/info reports the measured rate and 7 analyses' efficiencies: %.300s", r.body);
    http_resp_free(&r);
    static char body[8192];
    /* identifiability of 125 tokens: since the Gram-matrix method (issue 20 item 2)
     * it costs ~0.3 s, so whether it fits a 2 s deadline depends on the measured
     * rate; the over-deadline case below is exact hidden attribution (~1000x over) */
    const char *msg;
    text_of(body, sizeof body, 20, ", \"method\": \"exact\"");
    http_post_json(&s, &r, "/v1/hidden-attribution", body);
    msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
    CHECK(r.status == 413 && msg && strstr(msg, "\"method\": \"estimate\"") && strstr(msg, "\"async\": true"),
          "exact hidden attribution over the deadline: 413 naming the estimate and a job (%ld %.300s)", r.status,
          r.body);
    http_resp_free(&r);
    /* context mixing of 122 tokens: value zeroing reruns each layer 123 times (~12 GFLOP, over the 2 s at 10
     * GFLOP/s), ALTI is ~0.2 GFLOP and runs */
    text_of(body, sizeof body, 40, ", \"method\": \"value-zeroing\"");
    http_post_json(&s, &r, "/v1/context-mixing", body);
    msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
    CHECK(r.status == 413 && msg && strstr(msg, "job \"context-mixing\"") && strstr(msg, "T + 1"),
          "value zeroing over the deadline: 413 naming the job (%ld %.300s)", r.status, r.body);
    http_resp_free(&r);
    text_of(body, sizeof body, 40, ", \"method\": \"alti\"");
    http_post_json(&s, &r, "/v1/context-mixing", body);
    CHECK(r.status == 200, "ALTI of the same text fits the deadline (%ld %.300s)", r.status, r.body);
    http_resp_free(&r);
    /* patching every head at every position of 122 tokens: 2 x 4 x 122 runs of half a forward each (~25
     * GFLOP); the residual grid of a short text runs */
    size_t k = (size_t)snprintf(body, sizeof body, "{\"targets\": [\"heads\"], \"per_position\": true");
    for (int side = 0; side < 2; side++) {
        k += (size_t)snprintf(body + k, sizeof body - k, ", \"%s\": \"", side ? "corrupt" : "clean");
        for (int i = 0; i < 40; i++) k += (size_t)snprintf(body + k, sizeof body - k, "a charming film ");
        k += (size_t)snprintf(body + k, sizeof body - k, "\"");
    }
    snprintf(body + k, sizeof body - k, "}");
    http_post_json(&s, &r, "/v1/patching", body);
    msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
    CHECK(r.status == 413 && msg && strstr(msg, "per_position") && strstr(msg, "\"attribution\""),
          "patching every head at every position over the deadline: 413 naming the cheaper requests (%ld %.300s)",
          r.status, r.body);
    http_resp_free(&r);
    http_post_json(&s, &r, "/v1/patching", "{\"clean\": \"a charming film\", \"corrupt\": \"a dreadful film\"}");
    CHECK(r.status == 200, "the residual grid of a short text fits the deadline (%ld %.300s)", r.status, r.body);
    http_resp_free(&r);
    CHECK(server_terminate(&s) == 0, "server G exits 0");

    /* the deadline passes while queued: the 503 names the alternatives too */
    const char *args2[] = {"--model", "demo=models/demo-identifiable", "--timeout", "1", "--debug-delay-ms", "1500", NULL};
    if (server_launch(&s, args2)) {
        CHECK(0, "server H did not start");
        return;
    }
    http_post_json(&s, &r, "/v1/hidden-attribution", "{\"text\": \"a charming film\"}");
    msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
    CHECK(r.status == 503 && err_code(&r) && !strcmp(err_code(&r), "timeout") && msg &&
              strstr(msg, "\"method\": \"estimate\""),
          "hidden attribution past its deadline: 503 timeout naming the estimate (%ld %.300s)", r.status, r.body);
    http_resp_free(&r);
    CHECK(server_terminate(&s) == 0, "server H exits 0");
}

/* ------------------------------- queue, timeout, shutdown (servers C, D) */

static void test_queue_and_shutdown(void)
{
    char model[512];
    snprintf(model, sizeof model, "bert=%s/bert", tmpdir);
    /* one lane (no fast-lane worker), so the queue arithmetic is workers + queue */
    const char *args[] = {"--model", model, "--workers", "1", "--fast-workers", "0", "--queue", "1", "--debug-delay-ms",
                          "800", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "server C did not start");
        return;
    }
    /* 3 at once: one computes, one waits, one is refused */
    CURLM *multi = curl_multi_init();
    http_resp r[3];
    CURL *e[3];
    struct curl_slist *hl[3];
    const char *body = "{\"text\": \"queue me\"}";
    for (int i = 0; i < 3; i++) {
        e[i] = http_easy(s.port, &r[i], "POST", "/v1/forward", "application/json", body, strlen(body), NULL, &hl[i]);
        curl_multi_add_handle(multi, e[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    int ok = 0, full = 0;
    for (int i = 0; i < 3; i++) {
        curl_multi_remove_handle(multi, e[i]);
        http_finish(e[i], &r[i], hl[i]);
        if (r[i].status == 200) ok++;
        if (r[i].status == 429) {
            char ra[16];
            full++;
            CHECK(http_header(&r[i], "Retry-After", ra, sizeof ra) == 0 && atoi(ra) >= 1, "429 has Retry-After");
            CHECK(err_code(&r[i]) && !strcmp(err_code(&r[i]), "queue_full"), "429 code queue_full");
            check_schema(&r[i], "/v1/forward", "POST");
        }
        http_resp_free(&r[i]);
    }
    CHECK(ok == 2 && full == 1, "workers 1 + queue 1: 2 answered, 1 refused with 429 (got %d, %d)", ok, full);

    /* SIGTERM while a request computes: it completes, new work is refused, exit 0 */
    http_resp inflight;
    struct curl_slist *ihl;
    CURL *ie = http_easy(s.port, &inflight, "POST", "/v1/forward", "application/json", body, strlen(body), NULL, &ihl);
    curl_multi_add_handle(multi, ie);
    for (int i = 0; i < 4; i++) {
        curl_multi_perform(multi, &running);
        curl_multi_poll(multi, NULL, 0, 50, NULL);
    }
    sleep_ms(100);
    kill(s.pid, SIGTERM);
    sleep_ms(100);
    http_resp q;
    http_get(&s, &q, "/readyz");
    CHECK(q.status == 503 && err_code(&q) && !strcmp(err_code(&q), "shutting_down"), "/readyz 503 while draining: %ld",
          q.status);
    check_schema(&q, "/readyz", "GET");
    http_resp_free(&q);
    http_post_json(&s, &q, "/v1/forward", body);
    CHECK(q.status == 503 && err_code(&q) && !strcmp(err_code(&q), "shutting_down"),
          "new work while draining -> 503 shutting_down: %ld", q.status);
    http_resp_free(&q);
    http_get(&s, &q, "/healthz");
    CHECK(q.status == 200, "/healthz still 200 while draining");
    http_resp_free(&q);
    running = 1;
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    curl_multi_remove_handle(multi, ie);
    http_finish(ie, &inflight, ihl);
    CHECK(inflight.status == 200, "the in-flight request completes after SIGTERM: %ld", inflight.status);
    http_resp_free(&inflight);
    curl_multi_cleanup(multi);
    int st = server_wait_exit(&s, 30);
    CHECK(st == 0, "lensd exits 0 after SIGTERM (got %d)", st);

    /* deadline: timeout 0.2 s, each job first waits 1 s */
    const char *dargs[] = {"--model", model, "--timeout", "0.2", "--debug-delay-ms", "1000", NULL};
    if (server_launch(&s, dargs)) {
        CHECK(0, "server D did not start");
        return;
    }
    http_post_json(&s, &q, "/v1/forward", body);
    CHECK(q.status == 503 && err_code(&q) && !strcmp(err_code(&q), "timeout"), "past the deadline -> 503 timeout: %ld",
          q.status);
    check_schema(&q, "/v1/forward", "POST");
    http_resp_free(&q);
    http_get(&s, &q, "/healthz");
    CHECK(q.status == 200, "/healthz after a timeout");
    http_resp_free(&q);
    /* a client that leaves before its request is complete is logged with status 499 */
    int fd = raw_connect(&s);
    const char part[] = "POST /v1/forward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Content-Length: 1000\r\n\r\n{\"text\": ";
    if (fd >= 0) {
        CHECK(send(fd, part, sizeof part - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof part - 1), "partial request sent");
        sleep_ms(100);
        close(fd);
    }
    int logged = 0;
    for (int i = 0; i < 60 && !logged; i++, sleep_ms(50)) logged = log_contains(&s, "\"status\":499");
    CHECK(logged, "the request log says status 499 for a client that left first (%s)", s.log_path);
    CHECK(log_contains(&s, "\"method\":\"POST\",\"path\":\"/v1/forward\",\"route\":\"/v1/forward\",\"status\":503,"),
          "a request's log line names method, path, route and status");
    CHECK(server_terminate(&s) == 0, "server D exits 0");
}

/* While models load, /readyz and model routes answer 503 not_ready and /healthz
 * 200: a model folder whose weights are a FIFO keeps the load blocked in open(). */
static void test_not_ready(void)
{
    printf("not ready while models load\n");
    char dir[512], cmd[2048], model[600];
    snprintf(dir, sizeof dir, "%s/slow", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p %1$s && cp %2$s/bert/config.json %1$s/ && mkfifo %1$s/model.safetensors", dir,
             tmpdir);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(model, sizeof model, "slow=%s", dir);
    /* an explicit --threads-per-worker is lowered to cores / workers */
    const char *args[] = {"--model", model, "--workers", "1", "--threads-per-worker", "1024", NULL};
    test_server s;
    if (server_spawn(&s, args)) {
        CHECK(0, "lensd did not start");
        return;
    }
    http_resp r = {0};
    int waited = 0;
    for (; waited < 200; waited++, sleep_ms(50)) { /* the listener comes up before the load */
        http_resp_free(&r);
        if (http_get(&s, &r, "/readyz") == 0 && r.status == 503) break;
    }
    CHECK(r.status == 503 && err_code(&r) && !strcmp(err_code(&r), "not_ready"), "/readyz while loading: %ld %.200s",
          r.status, r.body);
    check_schema(&r, "/readyz", "GET");
    http_resp_free(&r);
    http_post_json(&s, &r, "/v1/forward", "{\"model\": \"slow\", \"text\": \"a\"}");
    CHECK(r.status == 503 && err_code(&r) && !strcmp(err_code(&r), "not_ready"), "/v1/forward while loading: %ld",
          r.status);
    check_schema(&r, "/v1/forward", "POST");
    http_resp_free(&r);
    http_get(&s, &r, "/healthz");
    CHECK(r.status == 200, "/healthz while loading: %ld", r.status);
    http_resp_free(&r);
    char lowered[64];
    snprintf(lowered, sizeof lowered, "\"threads_per_worker\":%ld,", sysconf(_SC_NPROCESSORS_ONLN));
    CHECK(log_contains(&s, lowered), "--workers 1 --threads-per-worker 1024 runs %s (log %s)", lowered, s.log_path);
    kill(s.pid, SIGKILL); /* blocked in open(): SIGTERM would wait for the load */
    waitpid(s.pid, NULL, 0);
}

/* ----------------------------------------------- golden (server E, shared) */

static void test_golden(void)
{
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared not found: golden logits of bert-tiny-sst2 not checked");
        return;
    }
    char model[512], golden_path[512];
    snprintf(model, sizeof model, "sst2=%s/models/bert-tiny-sst2", shared);
    snprintf(golden_path, sizeof golden_path, "%s/models/bert-tiny-sst2/golden.json", shared);
    json_t *golden = json_load_file(golden_path, 0, NULL);
    CHECK(golden != NULL, "cannot read %s", golden_path);
    if (!golden) return;
    const char *args[] = {"--model", model, NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "server with bert-tiny-sst2 did not start");
        json_decref(golden);
        return;
    }
    size_t i;
    json_t *ex;
    json_array_foreach(json_object_get(golden, "examples"), i, ex) {
        json_t *req = json_pack("{s:s, s:s}", "model", "sst2", "text", json_string_value(json_object_get(ex, "text")));
        char *body = json_dumps(req, 0);
        http_resp r;
        http_post_json(&s, &r, "/v1/forward", body);
        CHECK(r.status == 200, "golden example %zu: %ld %.200s", i, r.status, r.body);
        json_t *ids = json_object_get(ex, "input_ids"), *toks = json_object_get(r.json, "tokens");
        int ids_ok = json_array_size(ids) == json_array_size(toks);
        for (size_t k = 0; ids_ok && k < json_array_size(ids); k++)
            ids_ok = json_integer_value(json_array_get(ids, k)) ==
                     json_integer_value(json_object_get(json_array_get(toks, k), "id"));
        CHECK(ids_ok, "golden example %zu: token ids differ from Hugging Face's", i);
        float got[8] = {0}, want[8] = {0};
        json_t *gl = json_object_get(r.json, "logits"), *wl = json_object_get(ex, "logits");
        size_t n = json_array_size(wl) < 8 ? json_array_size(wl) : 8;
        for (size_t k = 0; k < n; k++) {
            got[k] = (float)json_number_value(json_array_get(gl, k));
            want[k] = (float)json_number_value(json_array_get(wl, k));
        }
        char what[64];
        snprintf(what, sizeof what, "golden example %zu logits", i);
        check_close(what, got, want, n, 1e-4, 0);
        const char *label = json_string_value(json_object_get(r.json, "label"));
        const char *want_label = json_string_value(json_object_get(ex, "predicted_label"));
        CHECK(label && want_label && !strcmp(label, want_label), "golden example %zu label %s, want %s", i,
              label ? label : "-", want_label ? want_label : "-");
        http_resp_free(&r);
        free(body);
        json_decref(req);
    }
    json_decref(golden);
    CHECK(server_terminate(&s) == 0, "server E exits 0");
}

/* ------------------------------------------------------------------ main */

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi) return check_done("test_http");
    test_openapi_paths();

    snprintf(tmpdir, sizeof tmpdir, "/tmp/lensd-http-XXXXXX");
    if (make_tiny_models(tmpdir)) return check_done("test_http");

    char bert[512], gpt[512];
    snprintf(bert, sizeof bert, "bert=%s/bert", tmpdir);
    snprintf(gpt, sizeof gpt, "gpt=%s/gpt", tmpdir);
    const char *args[] = {"--model", bert, "--model", gpt, "--max-tokens", "64", "--max-body", "64KiB",
                          "--workers", "2", "--queue", "4", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "lensd serve did not become ready");
    } else {
        test_service_routes(&s);
        test_tokenize(&s);
        test_forward(&s);
        test_bad_inputs(&s);
        test_drained_errors(&s);
        test_metrics(&s);
        CHECK(server_terminate(&s) == 0, "lensd exits 0 on SIGTERM");
    }
    test_auth_cors();
    test_queue_and_shutdown();
    test_not_ready();
    test_lanes();
    test_cost_model();
    test_golden();

    remove_test_files(tmpdir);
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http");
}
