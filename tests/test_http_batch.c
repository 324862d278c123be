/* test_http_batch.c - texts: [...] on the five single-text endpoints.
 *
 * On the demo models in models/ (BERT classifier, masked LM, GPT-2):
 *   - each batch answers {"results": [...]} in order, and every result
 *     equals the same text sent alone (tokens exactly, numbers within 1e-5:
 *     /v1/forward packs the texts through one forward pass, whose GEMM row
 *     blocking may differ from a single text's in the last bits);
 *   - one bad item answers 200 with its error in its slot, the others fine;
 *   - an error every item shares (unknown model, bad option) is the answer;
 *   - too many texts / tokens answer 413, texts with text 422, text_pairs of
 *     another length 422.
 * Every response is checked against openapi.yaml (oneOf single | BatchResults). */
#include <math.h>

#include "tests/check.h"
#include "tests/http_util.h"

static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }

/* a and b equal up to tol on numbers; "timing_ms" ignored. */
static int json_close(const json_t *a, const json_t *b, double tol, char *where, size_t n)
{
    if (json_is_number(a) && json_is_number(b)) {
        double x = json_number_value(a), y = json_number_value(b);
        if (fabs(x - y) <= tol * (1 + fabs(y))) return 1;
        snprintf(where + strlen(where), n - strlen(where), " %g != %g", x, y);
        return 0;
    }
    if (json_typeof(a) != json_typeof(b)) return 0;
    if (json_is_object(a)) {
        const char *k;
        json_t *v;
        if (json_object_size(a) != json_object_size(b)) return 0;
        json_object_foreach((json_t *)a, k, v) {
            if (!strcmp(k, "timing_ms")) continue;
            size_t len = strlen(where);
            snprintf(where + len, n - len, ".%s", k);
            if (!json_close(v, get(b, k), tol, where, n)) return 0;
            where[len] = 0;
        }
        return 1;
    }
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!json_close(json_array_get(a, i), json_array_get(b, i), tol, where, n)) return 0;
        return 1;
    }
    return json_equal(a, b);
}

/* The batch of texts on path (extra: the other fields, JSON members) equals each text sent alone. */
static void check_batch(test_server *s, const char *path, const char *extra, const char *const *texts, int n)
{
    json_t *body = json_loads(extra, 0, NULL), *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_string(texts[i]));
    json_object_set_new(body, "texts", arr);
    char *b = json_dumps(body, 0);
    http_resp r;
    http_post_json(s, &r, path, b);
    check_schema(&r, path, "POST");
    const json_t *results = get(r.json, "results");
    CHECK(r.status == 200 && (int)json_array_size(results) == n, "%s batch of %d -> %ld, %zu results", path, n,
          r.status, json_array_size(results));
    for (int i = 0; i < n && i < (int)json_array_size(results); i++) {
        json_t *one = json_loads(extra, 0, NULL);
        json_object_set_new(one, "text", json_string(texts[i]));
        char *ob = json_dumps(one, 0);
        http_resp a;
        http_post_json(s, &a, path, ob);
        char where[512] = "";
        CHECK(a.status == 200 && json_close(json_array_get(results, (size_t)i), a.json, 1e-5, where, sizeof where),
              "%s item %d equals the text sent alone (at %s)", path, i, where);
        http_resp_free(&a);
        free(ob);
        json_decref(one);
    }
    http_resp_free(&r);
    free(b);
    json_decref(body);
}

static void test_equal_to_single(test_server *s)
{
    const char *texts[] = {"a charming film", "awful , just awful", "ok", "the plot never quite comes together but the cast is fine"};
    check_batch(s, "/v1/forward", "{\"model\": \"sst2\", \"outputs\": [\"logits\", \"hidden_states\", \"attentions\"]}", texts, 4);
    check_batch(s, "/v1/forward", "{\"model\": \"gpt\", \"outputs\": [\"top_k\"], \"k\": 3, \"logit_lens\": true}", texts, 4);
    check_batch(s, "/v1/forward", "{\"model\": \"mlm\", \"outputs\": [\"logits\"]}", texts, 3);
    check_batch(s, "/v1/attention", "{\"model\": \"sst2\", \"layers\": [1]}", texts, 3);
    check_batch(s, "/v1/attribution", "{\"model\": \"sst2\", \"steps\": 4}", texts, 2);
    check_batch(s, "/v1/token-identity", "{\"model\": \"sst2\"}", texts, 2);
    check_batch(s, "/v1/hidden-attribution", "{\"model\": \"sst2\"}", texts, 2);
}

static void test_bad_items(test_server *s)
{
    http_resp r;
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"sst2\", \"texts\": [\"good\", 7, \"\", \"also good\"]}");
    check_schema(&r, "/v1/forward", "POST");
    const json_t *res = get(r.json, "results");
    CHECK(r.status == 200 && json_array_size(res) == 4, "bad items: 200 with 4 slots (%ld)", r.status);
    CHECK(get(json_array_get(res, 0), "logits") && get(json_array_get(res, 3), "logits"), "good items answered");
    const char *c1 = json_string_value(get(get(json_array_get(res, 1), "error"), "code"));
    const char *c2 = json_string_value(get(get(json_array_get(res, 2), "error"), "code"));
    CHECK(c1 && c2 && !strcmp(c1, "invalid_request") && !strcmp(c2, "invalid_request"), "bad items' errors in their slots");
    const char *f1 = json_string_value(get(get(json_array_get(res, 1), "error"), "field"));
    const char *f2 = json_string_value(get(get(json_array_get(res, 2), "error"), "field"));
    CHECK(f1 && f2 && !strcmp(f1, "texts[1]") && !strcmp(f2, "texts[2]"), "bad items name texts[i] (%s, %s)", f1 ?: "-",
          f2 ?: "-");
    http_resp_free(&r);

    http_post_json(s, &r, "/v1/forward", "{\"model\": \"sst2\", \"texts\": [\"a\", \"b\"], \"text_pairs\": [\"c\", 7]}");
    check_schema(&r, "/v1/forward", "POST");
    res = get(r.json, "results");
    const char *fp = json_string_value(get(get(json_array_get(res, 1), "error"), "field"));
    CHECK(r.status == 200 && get(json_array_get(res, 0), "logits") && fp && !strcmp(fp, "text_pairs[1]"),
          "a bad pair names text_pairs[1] (%s)", fp ?: "-");
    http_resp_free(&r);

    const bad_case cases[] = {
        {"/v1/forward", "{\"model\": \"nope\", \"texts\": [\"a\", \"b\"]}", 404, "model_not_found", "model"},
        {"/v1/forward", "{\"model\": \"sst2\", \"texts\": [\"a\", \"b\"], \"outputs\": [\"x\"]}", 422, "invalid_request", "outputs"},
        {"/v1/forward", "{\"model\": \"sst2\", \"texts\": []}", 422, "invalid_request", "texts"},
        {"/v1/forward", "{\"model\": \"sst2\", \"texts\": \"a\"}", 422, "invalid_request", "texts"},
        {"/v1/forward", "{\"model\": \"sst2\", \"texts\": [\"a\"], \"text\": \"b\"}", 422, "invalid_request", "text"},
        {"/v1/forward", "{\"model\": \"sst2\", \"texts\": [\"a\", \"b\"], \"text_pairs\": [\"c\"]}", 422, "invalid_request", "text_pairs"},
        {"/v1/forward", "{\"model\": \"sst2\", \"texts\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}", 413, "payload_too_large", "texts"},
        {"/v1/attention", "{\"model\": \"sst2\", \"texts\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}", 413, "payload_too_large", "texts"},
        {"/v1/forward", "{\"model\": \"sst2\", \"texts\": [\"one two three four five six seven eight nine ten\", "
                        "\"one two three four five six seven eight nine ten\", \"one two three four five six seven eight nine ten\"]}",
         413, "too_many_tokens", "texts"},
        {"/v1/hidden-attribution", "{\"model\": \"sst2\", \"texts\": [\"one two three four five six seven eight nine ten\", "
                        "\"one two three four five six seven eight nine ten\", \"one two three four five six seven eight nine ten\"]}",
         413, "too_many_tokens", "texts"},
    };
    int n = (int)(sizeof cases / sizeof *cases);
    CHECK(n == 10, "10 bad batch cases");
    run_bad_cases(s, cases, n);

    http_post_json(s, &r, "/v1/forward",
                   "{\"model\": \"sst2\", \"texts\": [\"a film\", \"a play\"], \"text_pairs\": [\"good\", \"bad\"]}");
    check_schema(&r, "/v1/forward", "POST");
    const json_t *t0 = get(json_array_get(get(r.json, "results"), 0), "tokens");
    const json_t *last = json_array_get(t0, json_array_size(t0) - 2);
    CHECK(r.status == 200 && json_integer_value(get(last, "segment")) == 1 &&
              !strcmp(json_string_value(get(last, "text")) ?: "", "good"),
          "text_pairs: item 0's pair is its segment 1");
    http_resp_free(&r);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi) return check_done("test_http_batch");
    const char *args[] = {"--model", "gpt=models/demo-gpt2", "--model", "mlm=models/demo-mlm", "--model",
                          "sst2=models/demo-sst2", "--max-batch-items", "4", "--max-batch-tokens", "30", NULL};
    test_server s;
    CHECK(server_launch(&s, args) == 0, "lensd starts on the demo models");
    if (s.pid) {
        test_equal_to_single(&s);
        test_bad_items(&s);
        CHECK(server_terminate(&s) == 0, "clean exit");
    }
    remove_test_files("/nonexistent-lensd-dir");
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_batch");
}
