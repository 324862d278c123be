/* test_http_datasets.c - the dataset jobs head-importance and
 * adversarial-triggers over HTTP, and --data-dir confinement.
 *
 * Starts the real build/lensd on a tiny random BERT classifier and GPT-2
 * (lensd mkmodel; GPT-2 for POST /v1/attribution with a next-token target) with a temporary --data-dir holding a small TSV, runs both kinds
 * from request rows and from the TSV, checks the results against
 * openapi.yaml (HeadImportanceResult, TriggersResult) and the identities
 * that hold for any model (pruning 0% = baseline accuracy, 100% the same
 * for every order, 11 points, as many heads as the model), cancels a long
 * job, and runs a bad-input matrix (typed 4xx naming params.<field>,
 * paths escaping the data directory by "..", absolute path and symlink).
 * Then, when ../shared exists, both kinds on bert-tiny-sst2 over the first
 * 40 rows of SST-2 dev (accuracy > 0.7: the model's dev accuracy is ~0.83;
 * SKIP otherwise). Numbers go through JSON at 6 decimals. The faithfulness
 * job (docs/faithfulness.md) runs from the TSV (unit tokens and heads) and on 8 SST-2 dev rows: its
 * result is a FaithfulnessResult whose curves start and end where they must
 * (D(0) = I(1) = full, D(1) = I(0) = empty), cancelled, and refused with
 * params.methods / params.fractions / params.unit. */
#include <math.h>

#include "core/analysis/attribution.h"
#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[256];

static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }

static double num_at(const json_t *a, size_t i) { return json_number_value(json_array_get(a, i)); }

/* Identities of a head-importance result on a model with H heads. */
static void check_importance(const json_t *job, int H, int n, const char *what)
{
    const char *st = json_string_value(get(job, "state"));
    CHECK(st && !strcmp(st, "done"), "%s: state %s %.300s", what, st ? st : "-",
          job ? json_dumps(get(job, "error"), 0) : "no job");
    const json_t *res = get(job, "result"), *pr = get(res, "pruning");
    if (!res) return;
    check_result_schema(res, "HeadImportanceResult");
    CHECK(json_integer_value(get(res, "n_examples")) == n && (int)json_array_size(get(res, "heads")) == H,
          "%s: %d examples, %d heads", what, n, H);
    const json_t *fa = get(pr, "attribution"), *fn = get(pr, "attention"), *fr = get(pr, "random"),
                 *np = get(pr, "heads_pruned");
    const double base = json_number_value(get(res, "baseline_accuracy"));
    CHECK(json_array_size(fa) == 11 && json_array_size(fn) == 11 && json_array_size(fr) == 11, "%s: 11 points", what);
    CHECK(num_at(fa, 0) == base && num_at(fn, 0) == base && num_at(fr, 0) == base,
          "%s: 0%% pruned = baseline %.4f", what, base);
    CHECK(num_at(fa, 10) == num_at(fn, 10) && num_at(fa, 10) == num_at(fr, 10) &&
              json_integer_value(json_array_get(np, 10)) == H && json_integer_value(json_array_get(np, 0)) == 0,
          "%s: 100%% pruned: all %d heads, same accuracy for every order", what, H);
    printf("  %s: baseline %.3f; pruned 0..100%%:", what, base);
    for (int i = 0; i <= 10; i++) printf(" %.3f/%.3f/%.3f", num_at(fa, i), num_at(fn, i), num_at(fr, i));
    printf(" (attribution/attention/random)\n");
}

/* The resolved definition fields of a head-importance result and its floor / round counts. */
static void check_definition(const json_t *job, const char *def, const char *target, const char *count,
                             const int *pruned)
{
    const json_t *res = get(job, "result"), *np = get(get(res, "pruning"), "heads_pruned");
    CHECK(res && !strcmp(json_string_value(get(res, "definition")), def) &&
              !strcmp(json_string_value(get(res, "target")), target) &&
              !strcmp(json_string_value(get(res, "prune_count")), count),
          "head-importance echoes definition %s, target %s, prune_count %s", def, target, count);
    for (int i = 0; i < 11; i++)
        CHECK(json_integer_value(json_array_get(np, (size_t)i)) == pruned[i], "%s: heads_pruned[%d] = %lld, want %d",
              count, i, json_integer_value(json_array_get(np, (size_t)i)), pruned[i]);
}

static void check_triggers(const json_t *job, int K, const char *what)
{
    const char *st = json_string_value(get(job, "state"));
    CHECK(st && !strcmp(st, "done"), "%s: state %s", what, st ? st : "-");
    const json_t *res = get(job, "result");
    if (!res) return;
    check_result_schema(res, "TriggersResult");
    const json_t *att = get(res, "attack");
    long long victims = 0;
    for (size_t i = 0; i < json_array_size(att); i++) victims += json_integer_value(get(json_array_get(att, i), "n"));
    CHECK((int)json_array_size(get(res, "triggers")) == K && (int)json_array_size(att) == K &&
              victims == json_integer_value(get(res, "victims")),
          "%s: %d triggers and attack rows, victims add up", what, K);
    printf("  %s: accuracy %.3f -> %.3f\n", what, json_number_value(get(res, "accuracy_before")),
           json_number_value(get(res, "accuracy_after")));
}

/* POST /v1/decomposition with corpus files from --data-dir: each file is a
 * topic; paths leaving the directory are refused naming "corpus". */
static void test_corpus(test_server *s)
{
    const char *topics[][2] = {{"topic_a.txt", "the cat sat on the mat and the dog ran in the park all day long "},
                               {"topic_b.txt", "stocks fell as markets in asia closed lower on weak trade data "}};
    for (int i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/data/%s", tmpdir, topics[i][0]);
        FILE *f = fopen(path, "w");
        if (f) {
            for (int k = 0; k < 8; k++) fputs(topics[i][1], f);
            fclose(f);
        }
    }
    http_resp r;
    http_post_json(s, &r, "/v1/decomposition",
                   "{\"corpus\": [\"topic_a.txt\", \"topic_b.txt\"], \"length\": 8, \"layers\": [1]}");
    const json_t *layer = json_array_get(get(r.json, "layers"), 0), *shares = get(layer, "variance_share");
    double total = json_number_value(get(shares, "mean")) + json_number_value(get(shares, "pos")) +
                   json_number_value(get(shares, "ctx")) + json_number_value(get(shares, "resid"));
    CHECK(r.status == 200 && fabs(total - 1) < 1e-4 && json_array_size(get(r.json, "labels")) == 2 &&
              get(layer, "topics") != NULL,
          "corpus: status %ld, shares sum %g, two topics (%.200s)", r.status, total, r.body);
    check_schema(&r, "/v1/decomposition", "POST");
    http_resp_free(&r);
    const char *bad[] = {"{\"corpus\": [\"../outside.tsv\"], \"length\": 8}",
                         "{\"corpus\": [\"link.tsv\"], \"length\": 8}",
                         "{\"corpus\": [\"/etc/passwd\"], \"length\": 8}",
                         "{\"corpus\": [\"missing.txt\"], \"length\": 8}",
                         "{\"corpus\": \"topic_a.txt\", \"length\": 8}",
                         "{\"corpus\": [\"topic_a.txt\"], \"texts\": [\"x\"], \"length\": 8}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        http_post_json(s, &r, "/v1/decomposition", bad[i]);
        const char *field = json_string_value(get(get(r.json, "error"), "field"));
        CHECK(r.status == 422 && field && !strcmp(field, "corpus"), "%s: got %ld field %s", bad[i], r.status,
              field ? field : "null");
        http_resp_free(&r);
    }
    /* more than 256 files: refused before any is read */
    static char many[257 * 16 + 64];
    int n = snprintf(many, sizeof many, "{\"length\": 8, \"corpus\": [");
    for (int i = 0; i < 257; i++) n += snprintf(many + n, sizeof many - (size_t)n, "%s\"topic_a.txt\"", i ? "," : "");
    snprintf(many + n, sizeof many - (size_t)n, "]}");
    http_post_json(s, &r, "/v1/decomposition", many);
    const char *msg = json_string_value(get(get(r.json, "error"), "message"));
    CHECK(r.status == 422 && msg && strstr(msg, "257 files; at most 256"), "257 corpus files: %ld %s", r.status,
          msg ? msg : "(no message)");
    http_resp_free(&r);
}

/* POST /v1/attribution on GPT-2: target = next-token id, causal attributions. */
static void test_gpt2_attribution(test_server *s)
{
    http_resp r;
    http_post_json(s, &r, "/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b c d\", \"steps\": 4, \"target\": 7}");
    CHECK(r.status == 200, "GPT-2 attribution: %ld %.300s", r.status, r.body);
    check_schema(&r, "/v1/attribution", "POST");
    const json_t *layers = get(r.json, "layers"), *tokens = get(r.json, "tokens");
    CHECK(json_integer_value(get(get(r.json, "target"), "index")) == 7 && json_is_string(get(get(r.json, "target"), "label")),
          "GPT-2 target: token 7 with its piece");
    const size_t T = json_array_size(tokens);
    int ok = json_array_size(layers) == 2 && T >= 2, causal = 1;
    for (size_t l = 0; ok && l < 2; l++) {
        const json_t *heads = get(json_array_get(layers, l), "heads");
        for (size_t h = 0; h < json_array_size(heads); h++) {
            const json_t *a = get(json_array_get(heads, h), "attribution");
            ok &= json_array_size(a) == T;
            for (size_t i = 0; ok && i < T; i++)
                for (size_t j = i + 1; j < T; j++) causal &= json_number_value(json_array_get(json_array_get(a, i), j)) == 0;
        }
    }
    CHECK(ok && causal, "GPT-2 attribution: 2 layers of [T][T], zero above the diagonal");
    http_resp_free(&r);
}

/* A faithfulness result: done, n rows, the methods asked for, each curve
 * with n_fractions points from 0 to 1 whose ends are the full and the empty
 * input's objective (the JSON's 9 digits, float32 F). */
static void check_faithfulness(const json_t *job, int n, int n_methods, int n_fractions, const char *what)
{
    const json_t *res = get(job, "result"), *methods = get(res, "methods");
    CHECK(job && !strcmp(json_string_value(get(job, "state")) ?: "", "done") &&
              json_integer_value(get(res, "n_examples")) == n && (int)json_array_size(methods) == n_methods,
          "%s: faithfulness done over %d rows with %d methods", what, n, n_methods);
    check_result_schema(res, "FaithfulnessResult");
    const double full = json_number_value(get(res, "full")), empty = json_number_value(get(res, "empty"));
    for (size_t k = 0; k < json_array_size(methods); k++) {
        const json_t *m = json_array_get(methods, k), *d = get(m, "deletion_curve"), *i = get(m, "insertion_curve");
        const int last = n_fractions - 1;
        CHECK((int)json_array_size(d) == n_fractions && (int)json_array_size(i) == n_fractions &&
                  fabs(num_at(d, 0) - full) < 1e-5 && fabs(num_at(i, last) - full) < 1e-5 &&
                  fabs(num_at(d, last) - empty) < 1e-5 && fabs(num_at(i, 0) - empty) < 1e-5,
              "%s %s: D(0) %g I(1) %g (full %g), D(1) %g I(0) %g (empty %g)", what,
              json_string_value(get(m, "method")), num_at(d, 0), num_at(i, last), full, num_at(d, last), num_at(i, 0),
              empty);
    }
}

/* Starts a long job, cancels it after 100 ms: it must end cancelled. */
static void cancel_long_job(test_server *s, const char *body, const char *what)
{
    http_resp r;
    http_post_json(s, &r, "/v1/jobs", body);
    char jp[128];
    snprintf(jp, sizeof jp, "/v1/jobs/%s", r.json ? json_string_value(get(r.json, "id")) : "none");
    http_resp_free(&r);
    sleep_ms(100);
    http_do(s, &r, "DELETE", jp, NULL, NULL, 0, NULL);
    CHECK(r.status == 200, "DELETE %s job: %ld", what, r.status);
    http_resp_free(&r);
    json_t *job = poll_job(s, jp + strlen("/v1/jobs/"), NULL, 10000);
    const char *st = job ? json_string_value(get(job, "state")) : NULL;
    CHECK(st && !strcmp(st, "cancelled"), "cancelled %s job ends %s", what, st ? st : "(not final within 10 s)");
    json_decref(job);
}

static const char *rows6 =
    "\"rows\": [{\"text\": \"a fine movie\", \"label\": 1}, {\"text\": \"dull and slow\", \"label\": \"negative\"}, "
    "{\"text\": \"the cast is great\", \"label\": \"1\"}, {\"text\": \"it is a mess\", \"label\": 0}, "
    "{\"text\": \"warm and funny\", \"label\": 1}, {\"text\": \"no story at all\", \"label\": 0}]";

static void test_tiny(void)
{
    char model[512], gpt[512], data[512], path[600], cmd[1200];
    snprintf(model, sizeof model, "bert=%s/bert", tmpdir);
    snprintf(gpt, sizeof gpt, "gpt=%s/gpt", tmpdir);
    snprintf(data, sizeof data, "%s/data", tmpdir);
    snprintf(path, sizeof path, "%s/small.tsv", data);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("sentence\tlabel\na fine movie \t1\ndull and slow \t0\nthe cast is great \t1\nit is a mess \t0\n", f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/noheader.tsv", data);
    if ((f = fopen(path, "w"))) fputs("a fine movie\t1\n", f), fclose(f);
    snprintf(path, sizeof path, "%s/outside.tsv", tmpdir);
    if ((f = fopen(path, "w"))) fputs("sentence\tlabel\nx\t1\n", f), fclose(f);
    snprintf(cmd, sizeof cmd, "ln -s %s/outside.tsv %s/link.tsv", tmpdir, data);
    CHECK(system(cmd) == 0, "symlink");

    const char *args[] = {"--model", model, "--data-dir", data, "--workers", "1", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "lensd serve --data-dir did not start");
        return;
    }
    char body[2048];
    snprintf(body, sizeof body, "{\"kind\": \"head-importance\", \"params\": {%s, \"steps\": 3}}", rows6);
    json_t *job = run_job(&s, body, 30000);
    check_importance(job, 4, 6, "tiny, rows");
    /* paper-code by default: gold target, floor(f * 4) heads; lensd: predicted, round */
    const int floor4[11] = {0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4}, round4[11] = {0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4};
    check_definition(job, "paper-code", "gold", "floor", floor4);
    json_decref(job);
    snprintf(body, sizeof body, "{\"kind\": \"head-importance\", \"params\": {%s, \"steps\": 3, \"definition\": \"lensd\"}}",
             rows6);
    job = run_job(&s, body, 30000);
    check_importance(job, 4, 6, "tiny, rows, lensd");
    check_definition(job, "lensd", "predicted", "round", round4);
    json_decref(job);
    snprintf(body, sizeof body,
             "{\"kind\": \"head-importance\", \"params\": {%s, \"steps\": 3, \"definition\": \"lensd\", "
             "\"prune_count\": \"floor\"}}", rows6);
    job = run_job(&s, body, 30000);
    check_definition(job, "lensd", "predicted", "floor", floor4); /* a named field overrides the definition */
    json_decref(job);
    snprintf(body, sizeof body, "{\"kind\": \"head-importance\", \"params\": {%s, \"quadrature\": \"gauss\"}}", rows6);
    job = run_job(&s, body, 30000);
    check_importance(job, 4, 6, "tiny, rows, gauss");
    const json_t *gres = get(job, "result");
    CHECK(gres && !strcmp(json_string_value(get(gres, "quadrature")), "gauss") &&
              json_integer_value(get(gres, "steps")) == LENS_ATTR_GAUSS_NODES,
          "head-importance echoes quadrature gauss with the default %d nodes", LENS_ATTR_GAUSS_NODES);
    json_decref(job);
    job = run_job(&s, "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"steps\": 2, \"seeds\": 2}}",
                  30000);
    check_importance(job, 4, 4, "tiny, data small.tsv");
    CHECK(job && !strcmp(json_string_value(get(get(job, "result"), "source")), "small.tsv") &&
              json_integer_value(get(get(get(job, "result"), "pruning"), "seeds")) == 2,
          "source and seeds reported");
    json_decref(job);
    job = run_job(&s, "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"max_rows\": 3, \"steps\": 2}}",
                  30000);
    check_importance(job, 4, 3, "tiny, max_rows 3");
    json_decref(job);
    snprintf(body, sizeof body, "{\"kind\": \"adversarial-triggers\", \"params\": {%s, \"steps\": 3, \"sources\": 3}}", rows6);
    job = run_job(&s, body, 30000);
    check_triggers(job, 2, "tiny triggers, rows");
    CHECK(job && json_integer_value(get(get(job, "result"), "victims")) == 3, "3 sources, 3 victims");
    const json_t *res = get(job, "result");
    CHECK(res && !strcmp(json_string_value(get(res, "rule")), "released") &&
              json_integer_value(get(res, "top_k")) == 2,
          "triggers default: the released rule, top 2");
    json_decref(job);
    snprintf(body, sizeof body,
             "{\"kind\": \"adversarial-triggers\", \"params\": {%s, \"steps\": 3, \"sources\": 3, \"definition\": \"lensd\"}}",
             rows6);
    job = run_job(&s, body, 30000);
    check_triggers(job, 2, "tiny triggers, rows, lensd rule");
    res = get(job, "result");
    CHECK(res && !strcmp(json_string_value(get(res, "rule")), "lensd") && json_integer_value(get(res, "top_k")) == 3,
          "triggers lensd: lensd rule, top 3");
    json_decref(job);

    job = run_job(&s, "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"methods\": "
                      "[\"random\", \"attention\", \"rollout\", \"leave-one-out\"], \"fractions\": [0, 0.5, 1]}}",
                  30000);
    check_faithfulness(job, 4, 4, 3, "tiny, small.tsv");
    json_decref(job);
    job = run_job(&s, "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"unit\": \"heads\", "
                      "\"fractions\": [0, 0.5, 1]}}",
                  30000);
    check_faithfulness(job, 4, 2, 3, "tiny, small.tsv, unit heads"); /* random, attention-attribution */
    CHECK(!strcmp(json_string_value(get(get(job, "result"), "unit")) ?: "", "heads") &&
              !strcmp(json_string_value(get(get(job, "result"), "removal")) ?: "", "zero-ablate"),
          "unit heads: the result says unit heads, removal zero-ablate");
    json_decref(job);

    /* cancel a long job */
    snprintf(body, sizeof body, "{\"kind\": \"head-importance\", \"params\": {%s, \"steps\": 1000, \"seeds\": 20}}", rows6);
    cancel_long_job(&s, body, "head-importance");
    snprintf(body, sizeof body, "{\"kind\": \"faithfulness\", \"params\": {\"texts\": [%s], \"random_orderings\": 1000}}",
             "\"a fine movie\", \"dull and slow\", \"the cast is great\", \"it is a mess\", \"warm and funny\"");
    cancel_long_job(&s, body, "faithfulness");

    char abs_out[600];
    snprintf(abs_out, sizeof abs_out, "{\"kind\": \"head-importance\", \"params\": {\"data\": \"%s/outside.tsv\"}}", tmpdir);
    const bad_case cases[] = {
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {}}", 422, "invalid_request", "params.rows"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"rows\": [], \"data\": \"small.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"rows\": []}}", 422, "invalid_request", "params.rows"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"rows\": {\"text\": \"a\"}}}", 422, "invalid_request", "params.rows"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"rows\": [{\"text\": \"a\", \"label\": 2}]}}", 422, "invalid_request", "params.rows[0].label"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"rows\": [{\"text\": \"a\", \"label\": 1}, {\"label\": 0}]}}", 422, "invalid_request", "params.rows[1].text"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"rows\": [{\"text\": \"a\", \"label\": \"good\"}]}}", 422, "invalid_request", "params.rows[0].label"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"../outside.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", abs_out, 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"link.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"missing.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"noheader.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": 3}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"steps\": 0}}", 422, "invalid_request", "params.steps"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"seeds\": 0}}", 422, "invalid_request", "params.seeds"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"max_rows\": 0}}", 422, "invalid_request", "params.max_rows"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"riemann\": \"mid\"}}", 422, "invalid_request", "params.riemann"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"quadrature\": \"mid\"}}", 422, "invalid_request", "params.quadrature"},
        {"/v1/jobs", "{\"kind\": \"adversarial-triggers\", \"params\": {\"data\": \"small.tsv\", \"quadrature\": \"gauss\", \"riemann\": \"left\"}}", 422, "invalid_request", "params.riemann"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"model\": \"nope\", \"data\": \"small.tsv\"}}", 404, "model_not_found", "params.model"},
        {"/v1/jobs", "{\"kind\": \"adversarial-triggers\", \"params\": {\"data\": \"small.tsv\", \"sources\": 4}}", 422, "invalid_request", "params.sources"},
        {"/v1/jobs", "{\"kind\": \"adversarial-triggers\", \"params\": {\"data\": \"small.tsv\", \"top_k\": 0}}", 422, "invalid_request", "params.top_k"},
        {"/v1/jobs", "{\"kind\": \"adversarial-triggers\", \"params\": {\"rows\": [{\"text\": \"a\", \"label\": 1}]}}", 422, "invalid_request", "params.rows"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"definition\": \"paper\"}}", 422, "invalid_request", "params.definition"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"target\": \"label\"}}", 422, "invalid_request", "params.target"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"data\": \"small.tsv\", \"prune_count\": 3}}", 422, "invalid_request", "params.prune_count"},
        {"/v1/jobs", "{\"kind\": \"adversarial-triggers\", \"params\": {\"data\": \"small.tsv\", \"rule\": \"paper\"}}", 422, "invalid_request", "params.rule"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"methods\": [\"saliency\"]}}", 422, "invalid_request", "params.methods"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"methods\": [\"random\", \"random\"]}}", 422, "invalid_request", "params.methods"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"fractions\": [0.5, 0.2]}}", 422, "invalid_request", "params.fractions"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"unit\": \"heads\", \"methods\": [\"alti\"]}}", 422, "invalid_request", "params.methods"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"unit\": \"layers\"}}", 422, "invalid_request", "params.unit"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"texts\": []}}", 422, "invalid_request", "params.texts"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {}}", 422, "invalid_request", "params.texts"},
        {"/v1/jobs", "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"small.tsv\", \"random_orderings\": 0}}", 422, "invalid_request", "params.random_orderings"},
    };
    run_bad_cases(&s, cases, (int)(sizeof cases / sizeof *cases));
    test_corpus(&s);
    http_resp r;
    http_get(&s, &r, "/healthz");
    CHECK(r.status == 200, "/healthz after the bad inputs: %ld", r.status);
    http_resp_free(&r);
    CHECK(server_terminate(&s) == 0, "lensd exits 0");

    /* no --data-dir: data is refused, rows still work */
    const char *args2[] = {"--model", model, "--model", gpt, NULL};
    if (server_launch(&s, args2)) {
        CHECK(0, "lensd serve without --data-dir did not start");
        return;
    }
    const bad_case no_dir[] = {
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"model\": \"bert\", \"data\": \"small.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"model\": \"gpt\", \"data\": \"small.tsv\"}}", 422, "invalid_request", "params.model"},
    };
    run_bad_cases(&s, no_dir, 2);
    /* the hint names what each endpoint takes instead of a path (issue 16 item 7) */
    const struct {
        const char *path, *body, *field, *hint;
    } hints[] = {
        {"/v1/jobs", "{\"kind\": \"head-importance\", \"params\": {\"model\": \"bert\", \"data\": \"small.tsv\"}}",
         "params.data", "send rows instead"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"data\": \"small.tsv\"}}",
         "params.data", "send texts instead"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"corpus\": [\"small.tsv\"], \"length\": 4}", "corpus",
         "send texts or windows instead"},
    };
    int n_hints = (int)(sizeof hints / sizeof *hints);
    for (int i = 0; i < n_hints; i++) {
        http_resp r;
        http_post_json(&s, &r, hints[i].path, hints[i].body);
        const char *msg = json_string_value(get(get(r.json, "error"), "message"));
        const char *field = json_string_value(get(get(r.json, "error"), "field"));
        CHECK(r.status == 422 && field && !strcmp(field, hints[i].field) && msg && strstr(msg, hints[i].hint),
              "no --data-dir hint %d: %ld %.300s (want field %s and \"%s\")", i, r.status, r.body, hints[i].field,
              hints[i].hint);
        http_resp_free(&r);
    }
    CHECK(n_hints == 3, "3 hint cases");
    test_gpt2_attribution(&s);
    CHECK(server_terminate(&s) == 0, "lensd exits 0");
}

static void test_sst2(const char *shared)
{
    char model[512], data[512];
    snprintf(model, sizeof model, "sst=%s/models/bert-tiny-sst2", shared);
    snprintf(data, sizeof data, "%s/data", shared);
    const char *args[] = {"--model", model, "--data-dir", data, NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "lensd serve with bert-tiny-sst2 did not start");
        return;
    }
    json_t *job = run_job(&s, "{\"kind\": \"head-importance\", \"params\": {\"data\": \"sst2/dev.tsv\", \"max_rows\": 40}}",
                          60000);
    check_importance(job, 4, 40, "bert-tiny-sst2, SST-2 dev[0:40]");
    double base = json_number_value(get(get(job, "result"), "baseline_accuracy"));
    CHECK(base > 0.7, "bert-tiny-sst2 accuracy on 40 dev rows %.3f, want > 0.7", base);
    json_decref(job);
    job = run_job(&s, "{\"kind\": \"adversarial-triggers\", \"params\": {\"data\": \"sst2/dev.tsv\", \"max_rows\": 40}}",
                  60000);
    check_triggers(job, 2, "bert-tiny-sst2 triggers, SST-2 dev[0:40]");
    json_decref(job);
    job = run_job(&s, "{\"kind\": \"faithfulness\", \"params\": {\"data\": \"sst2/dev.tsv\", \"max_rows\": 8, \"steps\": 4}}",
                  60000);
    check_faithfulness(job, 8, 9, 11, "bert-tiny-sst2, SST-2 dev[0:8] (every method but hidden-attribution)");
    json_decref(job);
    CHECK(server_terminate(&s) == 0, "lensd exits 0");
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi) return check_done("test_http_datasets");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lensd-datasets-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        CHECK(0, "mkdtemp failed");
        return check_done("test_http_datasets");
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --arch bert --preset tiny --seed 1 --out %s/bert >/dev/null && "
             "%s mkmodel --arch gpt2 --preset tiny --seed 1 --out %s/gpt >/dev/null && mkdir %s/data",
             lensd_path(), tmpdir, lensd_path(), tmpdir, tmpdir);
    int rc = system(cmd);
    CHECK(rc == 0, "lensd mkmodel failed (%d)", rc);
    if (rc == 0) test_tiny();
    const char *shared = check_shared_dir();
    if (shared) test_sst2(shared);
    else SKIP("../shared not found: dataset jobs on bert-tiny-sst2");
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
    if (!check_failed) {
        snprintf(cmd, sizeof cmd, "rm -f /tmp/lensd-test-%d-*.log", (int)getpid());
        if (system(cmd)) fprintf(stderr, "could not remove the server logs\n");
    }
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_datasets");
}
