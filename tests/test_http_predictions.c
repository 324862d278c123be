/* test_http_predictions.c - top-k predictions, the logit lens and
 * POST /v1/detokenize on the demo models in models/ (GPT-2 and masked LM).
 *
 * Checked against what the server already answers independently (the
 * logits output is compared with PyTorch in test_http / test_demo_models):
 *   - top_k ids are the k largest logits of their position, probabilities
 *     are the softmax of that row (|diff| <= 2e-6: 6 decimals in JSON,
 *     softmax in double here), most probable first;
 *   - the logit lens at the last layer equals top_k exactly (the readout of
 *     layer L is the model's own head), it has L+1 layers, and at every
 *     layer matches tests/fixtures/logit_lens_demo.json (PyTorch,
 *     tests/reference/logit_lens_reference.py): top-5 ids, probs within 1e-5;
 *   - a masked LM reads its [MASK] positions by default;
 *   - every prediction's token text is /v1/detokenize of its id, and
 *     detokenize(tokenize(text)) gives the text back (GPT-2: exactly;
 *     WordPiece: lowercased words);
 *   - bad input: k out of range, top_k / logit_lens on a classifier, ids
 *     outside the vocabulary, empty ids -> 422 naming the field.
 * Every response is checked against openapi.yaml. */
#include <math.h>

#include "tests/check.h"
#include "tests/fixture.h"
#include "tests/http_util.h"

static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }

static int posted(test_server *s, http_resp *r, const char *path, const char *body)
{
    http_post_json(s, r, path, body);
    check_schema(r, path, "POST");
    return (int)r->status;
}

/* top_k of one position against the full logits row. */
static void check_row(const json_t *preds, const json_t *row, int k, const char *what)
{
    size_t V = json_array_size(row);
    double mx = -INFINITY, sum = 0;
    for (size_t v = 0; v < V; v++) mx = fmax(mx, json_number_value(json_array_get(row, v)));
    for (size_t v = 0; v < V; v++) sum += exp(json_number_value(json_array_get(row, v)) - mx);
    CHECK((int)json_array_size(preds) == k, "%s: %zu predictions, want %d", what, json_array_size(preds), k);
    double prev = 2, worst = 0;
    int order_ok = 1, rank_ok = 1;
    for (size_t i = 0; i < json_array_size(preds); i++) {
        const json_t *p = json_array_get(preds, i);
        int id = (int)json_integer_value(get(p, "id"));
        double prob = json_number_value(get(p, "prob"));
        double logit = json_number_value(json_array_get(row, (size_t)id));
        worst = fmax(worst, fabs(prob - exp(logit - mx) / sum));
        order_ok &= prob <= prev;
        prev = prob;
        /* no id outside the top k has a larger logit than the k-th */
        if (i + 1 == json_array_size(preds)) {
            int larger = 0;
            for (size_t v = 0; v < V; v++) larger += json_number_value(json_array_get(row, v)) > logit;
            rank_ok = larger <= k - 1;
        }
    }
    CHECK(worst <= 2e-6 && order_ok && rank_ok, "%s: softmax diff %.2g, sorted %d, top-k %d", what, worst, order_ok,
          rank_ok);
}

static void test_gpt2(test_server *s)
{
    http_resp r;
    int st = posted(s, &r, "/v1/forward",
                    "{\"model\": \"gpt\", \"text\": \"The film was a\", \"outputs\": [\"logits\", \"top_k\"], \"k\": 5, "
                    "\"logit_lens\": true, \"format\": {\"precision\": 9}}");
    CHECK(st == 200, "gpt top_k -> %d %.200s", st, r.body ? r.body : "");
    const json_t *top = get(r.json, "top_k"), *logits = get(r.json, "logits"), *lens = get(r.json, "logit_lens");
    size_t T = json_array_size(get(r.json, "tokens"));
    CHECK(T >= 4 && json_array_size(top) == T && json_array_size(lens) == T, "every position of a causal LM (%zu)", T);
    for (size_t i = 0; i < json_array_size(top); i++) {
        char what[64];
        snprintf(what, sizeof what, "gpt position %zu", i);
        const json_t *t = json_array_get(top, i);
        check_row(get(t, "predictions"), json_array_get(logits, (size_t)json_integer_value(get(t, "position"))), 5,
                  what);
        const json_t *layers = get(json_array_get(lens, i), "layers");
        CHECK(json_array_size(layers) == 3, "%s: logit lens layers 0..2 (%zu)", what, json_array_size(layers));
        CHECK(json_equal(get(json_array_get(layers, 2), "predictions"), get(t, "predictions")),
              "%s: logit lens at the last layer == top_k", what);
        CHECK(!json_equal(get(json_array_get(layers, 0), "predictions"), get(t, "predictions")),
              "%s: the embedding layer reads differently", what);
    }
    /* each token text is /v1/detokenize of its id */
    const json_t *p0 = json_array_get(get(json_array_get(top, 0), "predictions"), 0);
    char body[256];
    snprintf(body, sizeof body, "{\"model\": \"gpt\", \"ids\": [%lld]}", json_integer_value(get(p0, "id")));
    http_resp d;
    posted(s, &d, "/v1/detokenize", body);
    CHECK(d.status == 200 && !strcmp(json_string_value(get(d.json, "text")) ?: "-", json_string_value(get(p0, "token")) ?: "+"),
          "prediction token == detokenize of its id");
    http_resp_free(&d);
    http_resp_free(&r);

    /* round trip: tokenize -> detokenize is exact for byte-level BPE */
    const char *text = "Hello world, the film's 3 caf\\u00e9s \\u2014 fine!";
    snprintf(body, sizeof body, "{\"model\": \"gpt\", \"text\": \"%s\"}", text);
    posted(s, &r, "/v1/tokenize", body);
    json_t *ids = json_incref(get(r.json, "input_ids"));
    http_resp_free(&r);
    json_t *req = json_pack("{s:s, s:O}", "model", "gpt", "ids", ids);
    char *req_s = json_dumps(req, 0);
    posted(s, &r, "/v1/detokenize", req_s);
    CHECK(r.status == 200 && !strcmp(json_string_value(get(r.json, "text")) ?: "", "Hello world, the film's 3 caf\xC3\xA9s \xE2\x80\x94 fine!"),
          "gpt detokenize(tokenize(text)) == text: \"%s\"", json_string_value(get(r.json, "text")) ?: "-");
    const char *piece = NULL, *ptext = NULL; /* the first piece that starts a word: "Ġ..." */
    for (size_t i = 0; i < json_array_size(get(r.json, "tokens")) && !piece; i++) {
        const json_t *t = json_array_get(get(r.json, "tokens"), i);
        if (!strncmp(json_string_value(get(t, "piece")) ?: "", "\xC4\xA0", 2))
            piece = json_string_value(get(t, "piece")), ptext = json_string_value(get(t, "text"));
    }
    CHECK(piece && ptext && !strncmp(piece, "\xC4\xA0", 2) && ptext[0] == ' ' && !strcmp(piece + 2, ptext + 1),
          "piece \"%s\" reads as \"%s\"", piece ? piece : "-", ptext ? ptext : "-");
    http_resp_free(&r);
    free(req_s);
    json_decref(req);
    json_decref(ids);
}

static void test_mlm(test_server *s)
{
    http_resp r;
    int st = posted(s, &r, "/v1/forward",
                    "{\"model\": \"mlm\", \"text\": \"a charming [MASK] , full of [MASK] .\", \"outputs\": [\"logits\", "
                    "\"top_k\"], \"logit_lens\": true, \"format\": {\"precision\": 9}}");
    CHECK(st == 200, "mlm top_k -> %d", st);
    const json_t *top = get(r.json, "top_k"), *toks = get(r.json, "tokens"), *lens = get(r.json, "logit_lens");
    CHECK(json_array_size(top) == 2 && json_array_size(lens) == 2, "two [MASK] positions read (%zu)",
          json_array_size(top));
    for (size_t i = 0; i < json_array_size(top); i++) {
        const json_t *t = json_array_get(top, i);
        int pos = (int)json_integer_value(get(t, "position"));
        const char *tok = json_string_value(get(json_array_get(toks, (size_t)pos), "text"));
        CHECK(tok && !strcmp(tok, "[MASK]"), "position %d is a [MASK] (%s)", pos, tok ? tok : "-");
        check_row(get(t, "predictions"), json_array_get(get(r.json, "logits"), (size_t)pos), 10, "mlm mask, k 10");
        const json_t *layers = get(json_array_get(lens, i), "layers");
        CHECK(json_equal(get(json_array_get(layers, json_array_size(layers) - 1), "predictions"), get(t, "predictions")),
              "mlm: logit lens last layer == top_k");
    }
    http_resp_free(&r);
    posted(s, &r, "/v1/tokenize", "{\"model\": \"mlm\", \"text\": \"A Charming Film, really.\"}");
    json_t *ids = json_incref(get(r.json, "input_ids"));
    http_resp_free(&r);
    json_t *req = json_pack("{s:s, s:O, s:b}", "model", "mlm", "ids", ids, "skip_special_tokens", 1);
    char *req_s = json_dumps(req, 0);
    posted(s, &r, "/v1/detokenize", req_s);
    CHECK(r.status == 200 && !strcmp(json_string_value(get(r.json, "text")) ?: "", "a charming film, really."),
          "mlm detokenize: \"%s\"", json_string_value(get(r.json, "text")) ?: "-");
    http_resp_free(&r);
    free(req_s);
    json_decref(req);
    json_decref(ids);
}

/* The logit lens against tests/fixtures/logit_lens_demo.json
 * (tests/reference/logit_lens_reference.py, an independent PyTorch forward):
 * per model, position and layer the top-5 ids equal (a swap of two ids whose
 * probabilities are within 1e-6 is a tie, not an error) and the
 * probabilities within 1e-5 (float32 forward passes on both sides). */
static void test_reference(test_server *s)
{
    json_t *fx = fixture_load("tests/fixtures/logit_lens_demo.json");
    const json_t *models = fixture_list(fx, "models", "logit_lens_demo.json");
    CHECK(json_array_size(models) >= 2, "logit_lens_demo.json: %zu models (want 2)", json_array_size(models));
    int compared = 0;
    for (size_t mi = 0; mi < json_array_size(models); mi++) {
        const json_t *m = json_array_get(models, mi);
        const char *name = json_string_value(get(m, "model")) ?: "-";
        /* the fixture names the demo folders; this server serves them as gpt and mlm */
        const char *served = !strcmp(name, "demo-gpt2") ? "gpt" : "mlm";
        json_t *req = json_pack("{s:s, s:O, s:[s], s:i, s:b, s:O, s:{s:i}}", "model", served, "input_ids",
                                get(m, "input_ids"), "outputs", "top_k", "k", 5, "logit_lens", 1, "positions",
                                get(m, "positions"), "format", "precision", 9);
        char *body = json_dumps(req, 0);
        json_decref(req);
        const char *what = name;
        http_resp r;
        posted(s, &r, "/v1/forward", body);
        free(body);
        CHECK(r.status == 200, "%s logit lens -> %ld %.200s", what, r.status, r.body ? r.body : "");
        const json_t *lens = get(r.json, "logit_lens"), *layers = get(m, "layers");
        double worst = 0;
        int ids_ok = 1;
        for (size_t l = 0; l < json_array_size(layers); l++) {
            const json_t *rows = json_array_get(layers, l);
            for (size_t i = 0; i < json_array_size(rows); i++) {
                const json_t *want = json_array_get(rows, i);
                const json_t *got = get(json_array_get(get(json_array_get(lens, i), "layers"), l), "predictions");
                CHECK(json_array_size(got) == 5, "%s layer %zu row %zu: 5 predictions", what, l, i);
                for (size_t k = 0; k < 5 && k < json_array_size(got); k++) {
                    double wp = json_number_value(json_array_get(get(want, "probs"), k));
                    double gp = json_number_value(get(json_array_get(got, k), "prob"));
                    long long wid = json_integer_value(json_array_get(get(want, "ids"), k));
                    long long gid = json_integer_value(get(json_array_get(got, k), "id"));
                    worst = fmax(worst, fabs(wp - gp));
                    if (wid != gid) {
                        /* a tie: the other id sits next to it with the same probability */
                        int tie = 0;
                        for (size_t j = (k ? k - 1 : 0); j <= k + 1 && j < 5; j++)
                            tie |= json_integer_value(json_array_get(get(want, "ids"), j)) == gid &&
                                   fabs(json_number_value(json_array_get(get(want, "probs"), j)) - wp) < 1e-6;
                        ids_ok &= tie;
                    }
                    compared++;
                }
            }
        }
        CHECK(ids_ok && worst <= 1e-5, "%s: top-5 ids as PyTorch's, probabilities within %.2g (want <= 1e-5)", what,
              worst);
        printf("  %s logit lens vs PyTorch: max |dp| %.2g over %zu layers\n", what, worst, json_array_size(layers));
        http_resp_free(&r);
    }
    CHECK(compared >= 100, "%d (layer, position, rank) entries compared", compared);
    json_decref(fx);
}

static void test_bad(test_server *s)
{
    const bad_case cases[] = {
        {"/v1/forward", "{\"model\": \"gpt\", \"text\": \"a\", \"outputs\": [\"top_k\"], \"k\": 0}", 422, "invalid_request", "k"},
        {"/v1/forward", "{\"model\": \"gpt\", \"text\": \"a\", \"outputs\": [\"top_k\"], \"k\": \"5\"}", 422, "invalid_request", "k"},
        {"/v1/forward", "{\"model\": \"sst2\", \"text\": \"a\", \"outputs\": [\"top_k\"]}", 422, "invalid_request", "outputs"},
        {"/v1/forward", "{\"model\": \"sst2\", \"text\": \"a\", \"logit_lens\": true}", 422, "invalid_request", "logit_lens"},
        {"/v1/forward", "{\"model\": \"gpt\", \"text\": \"a\", \"logit_lens\": 1}", 422, "invalid_request", "logit_lens"},
        {"/v1/detokenize", "{\"model\": \"gpt\", \"ids\": [99999999]}", 422, "invalid_request", "ids"},
        {"/v1/detokenize", "{\"model\": \"gpt\", \"ids\": [-1]}", 422, "invalid_request", "ids"},
        {"/v1/detokenize", "{\"model\": \"gpt\", \"ids\": []}", 422, "invalid_request", "ids"},
        {"/v1/detokenize", "{\"model\": \"gpt\", \"ids\": [\"a\"]}", 422, "invalid_request", "ids"},
        {"/v1/detokenize", "{\"model\": \"nope\", \"ids\": [1]}", 404, "model_not_found", "model"},
        /* attribution takes BERT classifiers and causal LMs only (docs/api-notes.md) */
        {"/v1/attribution", "{\"model\": \"mlm\", \"text\": \"a\"}", 422, "invalid_request", "model"},
    };
    int n = (int)(sizeof cases / sizeof *cases);
    CHECK(n == 11, "11 bad cases");
    run_bad_cases(s, cases, n);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi) return check_done("test_http_predictions");
    const char *args[] = {"--model", "gpt=models/demo-gpt2", "--model", "mlm=models/demo-mlm", "--model",
                          "sst2=models/demo-sst2", NULL};
    test_server s;
    CHECK(server_launch(&s, args) == 0, "lensd starts on the demo models");
    if (s.pid) {
        test_gpt2(&s);
        test_mlm(&s);
        test_reference(&s);
        test_bad(&s);
        CHECK(server_terminate(&s) == 0, "clean exit");
    }
    remove_test_files("/nonexistent-lensd-dir");
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_predictions");
}
