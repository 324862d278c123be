/* test_http_caps.c - what /v1/models advertises a model supports is what
 * the server serves.
 *
 * Starts the real build/lensd on tiny random RoBERTa and DistilBERT
 * classifiers and a GPT-2 causal LM (`lensd mkmodel`), and on a Llama
 * causal LM and a RoBERTa classifier that `lensd train` trained from
 * random weights and saved (the trained checkpoints answer every analysis
 * they advertise; tests/test_train.c checks that their loss falls). For each model and
 * each analysis of GET /v1/capabilities, the request that runs it (one
 * table below) must answer 200 (a job: 202, then done) when ModelInfo's
 * analyses lists it and a typed 422 when it does not; text_pair is
 * accepted exactly when ModelInfo.pairs; causal says whether attention
 * masks the keys after each query; attribution_targets lists the targets
 * /v1/attribution accepts. The classifiers must advertise the attribution
 * tree, head importance and triggers (the dashboard once offered them for
 * BERT only).
 *
 * A Qwen3-MoE micro checkpoint (layer 1 dense, layer 2 a mixture of 4
 * experts, 2 routed, renormalised) runs the same table, and its routes:
 * "outputs": ["router"] lists layer 2 only, per token 2 distinct experts
 * with gate weights summing to 1 (1e-5); "router_probs" adds the router's
 * softmax (rows summing to 1), whose chosen entries are the two largest and,
 * renormalised, the weights (1e-5); layers [1] (dense) lists no layer; a
 * model without experts answers 422 on outputs. */
#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[256] = "/tmp/lensd-caps-XXXXXX";

static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }

static int has_string(const json_t *arr, const char *s)
{
    size_t i;
    const json_t *v;
    json_array_foreach(arr, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), s)) return 1;
    return 0;
}

#define ROWS                                                                                                  \
    "\"rows\": [{\"text\": \"a fine movie\", \"label\": 1}, {\"text\": \"dull and slow\", \"label\": 0}, " \
    "{\"text\": \"warm and funny\", \"label\": 1}]"

/* The request that runs each analysis (%s: the model id); job: a job kind. */
static const struct {
    const char *analysis, *path, *body;
    int job;
} RUNS[] = {
    {"forward", "/v1/forward", "{\"model\": \"%s\", \"text\": \"a fine movie\"}", 0},
    {"attention", "/v1/attention", "{\"model\": \"%s\", \"text\": \"a fine movie\"}", 0},
    {"attribution", "/v1/attribution", "{\"model\": \"%s\", \"text\": \"a fine movie\", \"steps\": 2}", 0},
    {"attribution_tree", "/v1/attribution", "{\"model\": \"%s\", \"text\": \"a fine movie\", \"steps\": 2, \"tree\": true}", 0},
    {"head_importance", "/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"model\": \"%s\", " ROWS ", \"steps\": 2}}", 1},
    {"adversarial_triggers", "/v1/jobs",
     "{\"kind\": \"adversarial-triggers\", \"params\": {\"model\": \"%s\", " ROWS ", \"steps\": 2, \"sources\": 2}}", 1},
    {"token_identity", "/v1/token-identity", "{\"model\": \"%s\", \"text\": \"a fine movie\"}", 0},
    {"hidden_attribution", "/v1/hidden-attribution", "{\"model\": \"%s\", \"text\": \"a fine movie\", \"layers\": [0, 1]}", 0},
    {"context_mixing", "/v1/context-mixing", "{\"model\": \"%s\", \"text\": \"a fine movie\", \"method\": \"rollout\"}", 0},
    {"logit_attribution", "/v1/logit-attribution", "{\"model\": \"%s\", \"text\": \"a fine movie\", \"target\": 5}", 0},
    {"router", "/v1/forward", "{\"model\": \"%s\", \"text\": \"a fine movie\", \"outputs\": [\"router\"]}", 0},
    {"decomposition", "/v1/decomposition", "{\"model\": \"%s\", \"texts\": [\"a fine movie\", \"dull and slow\"], \"length\": 3}", 0},
};
enum { N_RUNS = sizeof RUNS / sizeof *RUNS };

/* Runs analysis a on model id; advertised: must succeed, else a 422 on field "model". */
static void check_run(test_server *s, const char *id, int a, int advertised)
{
    char body[1024];
    snprintf(body, sizeof body, RUNS[a].body, id);
    http_resp r;
    http_post_json(s, &r, RUNS[a].path, body);
    check_schema(&r, RUNS[a].path, "POST");
    if (!advertised) {
        const char *code = err_code(&r);
        CHECK(r.status == 422 && code && !strcmp(code, "invalid_request"), "%s: %s not advertised -> 422: %ld %.200s",
              id, RUNS[a].analysis, r.status, r.body ? r.body : "");
    } else if (!RUNS[a].job) {
        CHECK(r.status == 200, "%s: advertised %s -> 200: %ld %.200s", id, RUNS[a].analysis, r.status,
              r.body ? r.body : "");
    } else {
        const char *jid = json_string_value(get(r.json, "id"));
        CHECK(r.status == 202 && jid, "%s: advertised %s -> 202: %ld %.200s", id, RUNS[a].analysis, r.status,
              r.body ? r.body : "");
        json_t *job = jid ? poll_job(s, jid, NULL, 60000) : NULL;
        const char *state = json_string_value(get(job, "state"));
        CHECK(state && !strcmp(state, "done"), "%s: %s job done (%s)", id, RUNS[a].analysis, state ? state : "-");
        json_decref(job);
    }
    http_resp_free(&r);
}

/* Every analysis the server names, run on model m as m advertises. */
static void check_model(test_server *s, const json_t *m, const json_t *all)
{
    const char *id = json_string_value(get(m, "id"));
    const json_t *analyses = get(m, "analyses");
    size_t i;
    const json_t *v;
    json_array_foreach(all, i, v) {
        const char *name = json_string_value(get(v, "name"));
        int a = 0;
        while (a < N_RUNS && strcmp(RUNS[a].analysis, name)) a++;
        CHECK(a < N_RUNS, "analysis %s has a request in this test's table", name);
        if (a < N_RUNS) check_run(s, id, a, has_string(analyses, name));
    }
    /* text_pair: accepted exactly when advertised */
    char body[512];
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"text\": \"a fine movie\", \"text_pair\": \"it is\"}", id);
    http_resp r;
    http_post_json(s, &r, "/v1/forward", body);
    const int pairs = json_is_true(get(m, "pairs"));
    CHECK(pairs ? r.status == 200 : r.status == 422 && !strcmp(err_field(&r), "text_pair"),
          "%s: pairs %d, text_pair -> %ld %.200s", id, pairs, r.status, r.body ? r.body : "");
    http_resp_free(&r);
}

/* causal: attention row 0 of a causal model sees only key 0. */
static void check_causal(test_server *s, const json_t *m)
{
    const char *id = json_string_value(get(m, "id"));
    char body[512];
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"text\": \"a fine movie\", \"layers\": [1]}", id);
    http_resp r;
    http_post_json(s, &r, "/v1/attention", body);
    const json_t *raw = get(json_array_get(get(json_array_get(get(r.json, "layers"), 0), "heads"), 0), "raw");
    double above = json_number_value(json_array_get(json_array_get(raw, 0), 1));
    CHECK(raw && json_is_true(get(m, "causal")) == (above == 0),
          "%s: causal %d, raw[0][1] = %g", id, json_is_true(get(m, "causal")), above);
    http_resp_free(&r);
}

static double number_at(const json_t *a, size_t i, size_t j) { return json_number_value(json_array_get(json_array_get(a, i), j)); }

static void test_router(test_server *s)
{
    http_resp r;
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"moe\", \"text\": \"a fine movie\", \"outputs\": [\"router\"]}");
    check_schema(&r, "/v1/forward", "POST");
    const json_t *router = get(r.json, "router"), *l2 = json_array_get(router, 0);
    const json_t *experts = get(l2, "experts"), *weights = get(l2, "weights");
    const size_t T = json_array_size(get(r.json, "tokens"));
    CHECK(r.status == 200 && json_array_size(router) == 1 && json_integer_value(get(l2, "layer")) == 2 && T > 0 &&
              json_array_size(experts) == T && json_array_size(weights) == T && !get(l2, "probs"),
          "router: layer 2 only, %zu tokens, no probabilities: %ld %s", T, r.status, r.body);
    int bad = 0;
    for (size_t t = 0; t < json_array_size(experts); t++) {
        const json_int_t a = json_integer_value(json_array_get(json_array_get(experts, t), 0));
        const json_int_t b = json_integer_value(json_array_get(json_array_get(experts, t), 1));
        bad += a == b || a < 0 || a > 3 || b < 0 || b > 3 || json_array_size(json_array_get(experts, t)) != 2;
        bad += fabs(number_at(weights, t, 0) + number_at(weights, t, 1) - 1) > 1e-5;
    }
    CHECK(bad == 0, "router: %d tokens without 2 distinct experts of 4 or weights summing to 1", bad);
    http_resp_free(&r);

    http_post_json(s, &r, "/v1/forward",
                   "{\"model\": \"moe\", \"text\": \"a fine movie\", \"outputs\": [\"router_probs\", \"logits\"]}");
    check_schema(&r, "/v1/forward", "POST");
    l2 = json_array_get(get(r.json, "router"), 0);
    const json_t *probs = get(l2, "probs");
    experts = get(l2, "experts"), weights = get(l2, "weights");
    bad = 0;
    for (size_t t = 0; t < json_array_size(probs); t++) {
        double sum = 0, chosen = 0, least = 1;
        for (size_t e = 0; e < 4; e++) sum += number_at(probs, t, e);
        for (size_t j = 0; j < 2; j++) {
            const double p = number_at(probs, t, (size_t)json_integer_value(json_array_get(json_array_get(experts, t), j)));
            chosen += p, least = fmin(least, p);
        }
        for (size_t j = 0; j < 2; j++) {
            const size_t e = (size_t)json_integer_value(json_array_get(json_array_get(experts, t), j));
            bad += fabs(number_at(probs, t, e) / chosen - number_at(weights, t, j)) > 1e-5;
        }
        int above = 0; /* experts more probable than the least chosen: the other chosen one only */
        for (size_t e = 0; e < 4; e++) above += number_at(probs, t, e) > least;
        bad += fabs(sum - 1) > 1e-5 || above != 1;
    }
    CHECK(r.status == 200 && get(r.json, "logits") && json_array_size(probs) == T && bad == 0,
          "router_probs: %d tokens whose probabilities do not sum to 1, choose the top 2 or renormalise to the "
          "weights: %ld",
          bad, r.status);
    http_resp_free(&r);

    http_post_json(s, &r, "/v1/forward",
                   "{\"model\": \"moe\", \"text\": \"a fine movie\", \"outputs\": [\"router\"], \"layers\": [1]}");
    CHECK(r.status == 200 && json_array_size(get(r.json, "router")) == 0, "router of the dense layer 1: none: %s",
          r.body);
    http_resp_free(&r);
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"gpt\", \"text\": \"a fine movie\", \"outputs\": [\"router\"]}");
    CHECK(r.status == 422 && !strcmp(json_string_value(get(get(r.json, "error"), "field")), "outputs"),
          "router of a model without experts: 422 on outputs: %ld %s", r.status, r.body);
    http_resp_free(&r);
}

static void test_models(test_server *s)
{
    http_resp r, c;
    http_get(s, &r, "/v1/models");
    http_get(s, &c, "/v1/capabilities");
    check_schema(&r, "/v1/models", "GET");
    const json_t *models = get(r.json, "models"), *all = get(c.json, "analyses");
    CHECK(json_array_size(models) == 6 && json_array_size(all) > 0, "6 models, %zu analyses", json_array_size(all));
    size_t i;
    const json_t *m;
    json_array_foreach(models, i, m) {
        const char *id = json_string_value(get(m, "id"));
        const json_t *an = get(m, "analyses"), *targets = get(m, "attribution_targets");
        if (!json_is_true(get(m, "causal"))) {
            CHECK(has_string(an, "attribution_tree") && has_string(an, "head_importance") &&
                      has_string(an, "adversarial_triggers"),
                  "%s classifier advertises tree, head importance and triggers", id);
            CHECK(has_string(targets, "label") && has_string(targets, "class") && !has_string(targets, "token"),
                  "%s: classifier targets", id);
        } else {
            CHECK(!has_string(an, "attribution_tree") && has_string(targets, "token") &&
                      has_string(an, "attribution") && has_string(an, "hidden_attribution"),
                  "%s: causal LM: attribution to a token, no tree", id);
        }
        CHECK(strncmp(id, "roberta", 7) ? 1 : json_is_true(get(m, "pairs")), "%s takes pairs", id);
        check_model(s, m, all);
        check_causal(s, m);
    }
    http_resp_free(&r);
    http_resp_free(&c);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi || !mkdtemp(tmpdir)) return check_done("test_http_caps");
    char cmd[4096], path[512];
    snprintf(path, sizeof path, "%s/text.txt", tmpdir);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 20; i++) fprintf(f, "a fine and funny film .\t1\nthe plot is dull and slow .\t0\n");
    if (f) fclose(f);
    /* the trained models: a few steps of `lensd train` from mkmodel's random weights, on the same lines
     * (the causal LM reads each whole line as text) */
    snprintf(cmd, sizeof cmd,
             "%2$s mkmodel --arch roberta --preset tiny --task classification --seed 1 --out %1$s/roberta >/dev/null && "
             "%2$s mkmodel --arch distilbert --preset tiny --task classification --seed 1 --out %1$s/distilbert >/dev/null && "
             "%2$s mkmodel --arch gpt2 --preset tiny --seed 1 --out %1$s/gpt >/dev/null && "
             "%2$s mkmodel --arch llama --preset micro --seed 1 --out %1$s/llama-random >/dev/null && "
             "%2$s mkmodel --arch qwen3_moe --preset micro --seed 1 --out %1$s/moe >/dev/null && "
             "%2$s train causal --init %1$s/llama-random --train %1$s/text.txt --out %1$s/llama-trained --max-len 16 "
             "--batch 4 --max-steps 3 >/dev/null 2>&1 && "
             "%2$s train classify --init %1$s/roberta --train %1$s/text.txt --out %1$s/roberta-trained --max-len 16 "
             "--batch 8 --max-steps 3 >/dev/null 2>&1",
             tmpdir, lensd_path());
    int rc = system(cmd);
    CHECK(rc == 0, "mkmodel / train: %s", cmd);
    if (rc == 0) {
        char a1[600], a2[600], a3[600], a4[600], a5[600], a6[600];
        snprintf(a1, sizeof a1, "roberta=%s/roberta", tmpdir);
        snprintf(a2, sizeof a2, "distilbert=%s/distilbert", tmpdir);
        snprintf(a3, sizeof a3, "gpt=%s/gpt", tmpdir);
        snprintf(a4, sizeof a4, "llama-trained=%s/llama-trained", tmpdir);
        snprintf(a5, sizeof a5, "roberta-trained=%s/roberta-trained", tmpdir);
        snprintf(a6, sizeof a6, "moe=%s/moe", tmpdir);
        const char *args[] = {"--model", a1, "--model", a2, "--model", a3, "--model", a4, "--model", a5, "--model", a6,
                              "--max-tokens", "64", "--workers", "1", NULL};
        test_server s;
        if (server_launch(&s, args)) {
            CHECK(0, "lensd serve did not become ready");
        } else {
            test_models(&s);
            test_router(&s);
            CHECK(server_terminate(&s) == 0, "lensd exits 0 on SIGTERM");
        }
    }
    remove_test_files(tmpdir);
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_caps");
}
