/* test_http_identity.c - POST /v1/token-identity, POST /v1/hidden-attribution,
 * POST /v1/context-mixing and the job token-identity-map over HTTP and the CLI.
 *
 * Starts the real build/lensd on tiny random BERT (classifier) and GPT-2
 * checkpoints from `lensd mkmodel` (copied into a temporary folder so maps
 * can be saved next to them) with a --data-dir, and checks what holds for
 * any model as seen through the JSON: contributions rows sum to 1, layer 0
 * contributions are the identity, every layer-0 token is identified by
 * itself, rank 1 iff the first neighbour is the token itself, the fitted
 * map of layer 0 identifies every held-out token, mapping "linear" is
 * refused before a fit and served after it (and after a restart when the
 * maps were saved), the CLI prints what the API returns, a bad-input matrix,
 * and every response against openapi.yaml. Context mixing: every method on
 * both models, rows of both matrices summing to 1 (GlobEnc's paper-code
 * rows are raw norms), texts batches, the CLI, a GPT-NeoX model refusing
 * ALTI by name (parallel residual); DecompX on the classifier with its
 * classifier contributions summing to /v1/forward's logits, refused on GPT-2. Logit attribution: total = logit, a
 * logit difference = the difference of two logits, the CLI; its 422s. Numbers go through JSON at 6
 * decimals; tolerances say so. The agreement with PyTorch is tested in
 * test_token_identity, test_hidden_attribution and test_context_mixing. */
#include <math.h>

#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[256];

static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }
static double num_at(const json_t *a, size_t i) { return json_number_value(json_array_get(a, i)); }

static const char *sentence = "the quick brown fox jumps over the lazy dog, and the dog sleeps.";
static const char *short_sentence = "the quick brown fox, jumping"; /* exact attribution: cost grows as T² */

/* ------------------------------------------------------ context mixing */

/* rows of a [T][T] JSON matrix summing to 1 (at 6 decimals) and non-negative */
static int rows_stochastic(const json_t *m, size_t T)
{
    if (json_array_size(m) != T) return 0;
    for (size_t i = 0; i < T; i++) {
        const json_t *row = json_array_get(m, i);
        double sum = 0;
        for (size_t j = 0; j < json_array_size(row); j++) {
            if (num_at(row, j) < 0) return 0;
            sum += num_at(row, j);
        }
        if (json_array_size(row) != T || fabs(sum - 1) > 1e-5 * (double)T) return 0;
    }
    return 1;
}

/* DecompX on the BERT classifier: both definitions, lensd's rows stochastic, and
 * classifier.contributions [T][K] summing over tokens to the logits of
 * /v1/forward (6 decimals each: T * 1e-6, 1e-4 allowed). */
static void test_decompx(test_server *s)
{
    const char *P = "/v1/context-mixing";
    char body[512];
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\"}", short_sentence);
    http_resp fwd;
    http_post_json(s, &fwd, "/v1/forward", body);
    const json_t *logits = get(fwd.json, "logits");
    for (int paper = 0; paper < 2; paper++) {
        snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"method\": \"decompx\", \"definition\": \"%s\"}",
                 short_sentence, paper ? "paper-code" : "lensd");
        http_resp r;
        http_post_json(s, &r, P, body);
        check_schema(&r, P, "POST");
        const size_t T = json_array_size(get(r.json, "tokens")), K = json_array_size(logits);
        const json_t *layers = get(r.json, "layers"), *cls = get(r.json, "classifier");
        const json_t *contrib = get(cls, "contributions");
        int ok = r.status == 200 && json_array_size(layers) == 2 && K > 1 && json_array_size(get(cls, "labels")) == K &&
                 json_array_size(contrib) == T;
        for (size_t l = 0; ok && !paper && l < 2; l++)
            ok = rows_stochastic(get(json_array_get(layers, l), "contributions"), T) &&
                 rows_stochastic(get(json_array_get(layers, l), "rollout"), T);
        for (size_t c = 0; ok && c < K; c++) {
            double sum = 0;
            for (size_t j = 0; j < T; j++) sum += num_at(json_array_get(contrib, j), c);
            ok = fabs(sum - num_at(logits, c)) <= 1e-4;
        }
        CHECK(ok, "context-mixing decompx %s: classifier contributions sum to the logits (%ld %.300s)",
              paper ? "paper-code" : "lensd", r.status, r.body);
        http_resp_free(&r);
    }
    http_resp_free(&fwd);
}

static void test_context_mixing(test_server *s)
{
    const char *P = "/v1/context-mixing";
    static const char *const methods[] = {"rollout", "alti", "globenc", "value-zeroing"};
    char body[512];
    for (int model = 0; model < 2; model++)
        for (int k = 0; k < 4; k++)
            for (int paper = 0; paper < 2; paper++) {
                snprintf(body, sizeof body,
                         "{\"model\": \"%s\", \"text\": \"%s\", \"method\": \"%s\", \"definition\": \"%s\"}",
                         model ? "gpt" : "bert", short_sentence, methods[k], paper ? "paper-code" : "lensd");
                http_resp r;
                http_post_json(s, &r, P, body);
                check_schema(&r, P, "POST");
                const json_t *layers = get(r.json, "layers");
                const size_t T = json_array_size(get(r.json, "tokens"));
                int ok = r.status == 200 && json_array_size(layers) == 2 && T > 2;
                const int unit = !(k == 2 && paper);
                for (size_t l = 0; ok && l < json_array_size(layers); l++) {
                    const json_t *y = json_array_get(layers, l);
                    ok = json_integer_value(get(y, "layer")) == (json_int_t)l + 1 &&
                         (!unit || (rows_stochastic(get(y, "contributions"), T) && rows_stochastic(get(y, "rollout"), T)));
                }
                CHECK(ok && !strcmp(json_string_value(get(r.json, "method")), methods[k]) &&
                          !strcmp(json_string_value(get(r.json, "definition")), paper ? "paper-code" : "lensd"),
                      "context-mixing %s %s %s: layers 1, 2 with stochastic rows (%ld %.200s)", model ? "gpt" : "bert",
                      methods[k], paper ? "paper-code" : "lensd", r.status, r.body);
                http_resp_free(&r);
            }
    test_decompx(s);
    /* the CLI prints what the API returns; a batch answers each text as if sent alone */
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"method\": \"alti\", \"layers\": [2]}",
             short_sentence);
    http_resp r;
    http_post_json(s, &r, P, body);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s context-mixing --model %s/bert --method alti --layers 2 '%s'", lensd_path(), tmpdir,
             short_sentence);
    json_t *cli = run_json(cmd);
    CHECK(cli && json_equal(get(cli, "layers"), get(r.json, "layers")), "CLI context-mixing == HTTP");
    json_decref(cli);
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"texts\": [\"%s\", \"a b\"], \"method\": \"alti\", \"layers\": [2]}",
             short_sentence);
    http_resp batch;
    http_post_json(s, &batch, P, body);
    check_schema(&batch, P, "POST");
    const json_t *first = json_array_get(get(batch.json, "results"), 0);
    CHECK(batch.status == 200 && json_array_size(get(batch.json, "results")) == 2 &&
              json_equal(get(first, "layers"), get(r.json, "layers")),
          "texts: results[0] = the same request with text (%ld)", batch.status);
    http_resp_free(&batch);
    http_resp_free(&r);
    /* a block whose attention output does not reach the residual stream alone has no ALTI */
    http_post_json(s, &r, P, "{\"model\": \"neox\", \"text\": \"a b c\", \"method\": \"alti\"}");
    CHECK(r.status == 422 && err_code(&r) && !strcmp(err_code(&r), "invalid_request") && strstr(r.body, "\"method\"") &&
              strstr(r.body, "parallel residual"),
          "ALTI on GPT-NeoX: 422 on method saying why (%ld %.300s)", r.status, r.body);
    http_resp_free(&r);
    http_post_json(s, &r, P, "{\"model\": \"neox\", \"text\": \"a b c\", \"method\": \"rollout\"}");
    check_schema(&r, P, "POST");
    CHECK(r.status == 200, "rollout on GPT-NeoX: 200 (%ld)", r.status);
    http_resp_free(&r);
}

/* ------------------------------------------------------ logit attribution */

static double dla_logit(test_server *s, const char *body, json_t **out)
{
    http_resp r;
    http_post_json(s, &r, "/v1/logit-attribution", body);
    check_schema(&r, "/v1/logit-attribution", "POST");
    const double logit = json_number_value(get(r.json, "logit")), total = json_number_value(get(r.json, "total"));
    CHECK(r.status == 200 && fabs(total - logit) <= 1e-5 * fmax(1, fabs(logit)) &&
              json_array_size(get(r.json, "mlps")) == 2,
          "logit-attribution %s: total %.9g = logit %.9g (%ld %.200s)", body, total, logit, r.status, r.body);
    if (out) *out = json_incref(r.json);
    http_resp_free(&r);
    return logit;
}

/* /v1/attribution with each objective: the objective echoed, and completeness
 * (Σ Attr vs F(A) - F(0), Gauss nodes: within 5% of the gap) for every kind */
static void test_objectives(test_server *s)
{
    static const char *const kinds[] = {"probability", "log_probability", "logit", "logit_difference"};
    for (int k = 0; k < 4; k++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\": \"gpt\", \"text\": \"the quick brown fox\", \"quadrature\": \"gauss\", \"steps\": 8, "
                 "\"layers\": [1], \"include_matrices\": false, \"objective\": {\"kind\": \"%s\", \"position\": -2, "
                 "\"target\": 11%s}}",
                 kinds[k], k == 3 ? ", \"foil\": 17" : "");
        http_resp r;
        http_post_json(s, &r, "/v1/attribution", body);
        check_schema(&r, "/v1/attribution", "POST");
        const json_t *o = get(r.json, "objective"), *l = json_array_get(get(r.json, "layers"), 0);
        const double value = json_number_value(get(o, "value")), gap = value - json_number_value(get(l, "f_zero"));
        const double sum = json_number_value(get(l, "attr_sum"));
        const size_t T = json_array_size(get(r.json, "tokens"));
        CHECK(r.status == 200 && !strcmp(json_string_value(get(o, "kind")), kinds[k]) &&
                  json_integer_value(get(o, "position")) == (json_int_t)T - 2 &&
                  fabs(sum - gap) <= 0.05 * fabs(gap) + 1e-6,
              "attribution objective %s: echoed, completeness %.6g vs %.6g (%ld %.200s)", kinds[k], sum, gap, r.status,
              r.body);
        http_resp_free(&r);
    }
}

static void test_logit_attribution(test_server *s)
{
    const double a = dla_logit(s, "{\"model\": \"gpt\", \"text\": \"the quick brown fox\", \"target\": 11}", NULL);
    const double b = dla_logit(s, "{\"model\": \"gpt\", \"text\": \"the quick brown fox\", \"target\": 17}", NULL);
    json_t *d = NULL;
    const double diff =
        dla_logit(s, "{\"model\": \"gpt\", \"text\": \"the quick brown fox\", \"target\": 11, \"foil\": 17}", &d);
    CHECK(fabs(diff - (a - b)) <= 1e-5 * fmax(1, fabs(diff)), "logit difference %.9g = %.9g - %.9g", diff, a, b);
    CHECK(json_integer_value(get(get(d, "foil"), "id")) == 17 &&
              json_integer_value(get(d, "position")) == (json_int_t)json_array_size(get(d, "tokens")) - 1,
          "foil echoed, position the last token");
    json_decref(d);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s logit-attribution --model %s/gpt --target 11 --position 1 'the quick brown fox'",
             lensd_path(), tmpdir);
    json_t *cli = run_json(cmd);
    http_resp r;
    http_post_json(s, &r, "/v1/logit-attribution",
                   "{\"model\": \"gpt\", \"text\": \"the quick brown fox\", \"target\": 11, \"position\": 1}");
    CHECK(cli && json_equal(get(cli, "heads"), get(r.json, "heads")) && json_equal(get(cli, "logit"), get(r.json, "logit")),
          "CLI logit-attribution == HTTP");
    json_decref(cli);
    http_resp_free(&r);
}

/* ------------------------------------------------------ ablation */

/* POST /v1/ablation: the schema, change = ablated - clean, the clean
 * objective = the forward's (classifier: probs sum to 1), mean over
 * reference texts differs from mean over the request, a causal LM's
 * logit_difference at an inner position. */
static json_t *ablate(test_server *s, const char *body)
{
    http_resp r;
    http_post_json(s, &r, "/v1/ablation", body);
    check_schema(&r, "/v1/ablation", "POST");
    const json_t *o = get(r.json, "objective");
    const double clean = json_number_value(get(o, "clean")), ablated = json_number_value(get(o, "ablated"));
    const double change = json_number_value(get(o, "change"));
    /* each written as a float32 (jw_float): three roundings of 2^-24 relative */
    CHECK(r.status == 200 && fabs(change - (ablated - clean)) <= 2.5e-7 * fmax(fabs(clean), fabs(ablated)),
          "ablation %s: change %.9g = ablated %.9g - clean %.9g (%ld %.200s)", body, change, ablated, clean, r.status,
          r.body);
    json_t *out = r.status == 200 ? json_incref(r.json) : NULL;
    http_resp_free(&r);
    return out;
}

static void test_ablation(test_server *s)
{
    json_t *zero = ablate(s, "{\"model\": \"bert\", \"text\": \"a fine movie\", \"heads\": [[1, 0], [2, 1]], \"mlps\": [1]}");
    const json_t *probs = get(get(zero, "probs"), "ablated");
    double sum = 0;
    for (size_t k = 0; k < json_array_size(probs); k++) sum += num_at(probs, k);
    CHECK(zero && json_array_size(probs) == 2 && fabs(sum - 1) < 1e-6 &&
              !strcmp(json_string_value(get(zero, "mode")), "zero") &&
              fabs(num_at(get(get(zero, "probs"), "clean"), json_integer_value(get(get(zero, "target"), "index"))) -
                   json_number_value(get(get(zero, "objective"), "clean"))) < 1e-6,
          "ablation on a classifier: probabilities (sum %.9g), clean objective = the target's probability", sum);
    json_t *own = ablate(s, "{\"model\": \"bert\", \"text\": \"a fine movie\", \"heads\": [[1, 1]], \"mode\": \"mean\"}");
    json_t *ref = ablate(s, "{\"model\": \"bert\", \"text\": \"a fine movie\", \"heads\": [[1, 1]], \"mode\": \"mean\", "
                            "\"reference_texts\": [\"the cat sat\", \"we left early\"]}");
    const double a = json_number_value(get(get(own, "objective"), "ablated"));
    const double b = json_number_value(get(get(ref, "objective"), "ablated"));
    CHECK(own && ref && a != b, "mean over reference texts (%.9g) is not the mean over the request (%.9g)", b, a);
    json_t *lm = ablate(s, "{\"model\": \"gpt\", \"text\": \"the quick brown fox\", \"mlps\": [2], \"objective\": "
                           "{\"kind\": \"logit_difference\", \"position\": -2, \"target\": 11, \"foil\": 17}}");
    const json_t *o = get(lm, "objective");
    CHECK(lm && json_integer_value(get(o, "position")) == (json_int_t)json_array_size(get(lm, "tokens")) - 2 &&
              json_integer_value(get(get(lm, "target"), "id")) == 11 && json_integer_value(get(get(o, "foil"), "id")) == 17 &&
              !get(lm, "logits"),
          "ablation on a causal LM: position, target and foil echoed, no logits by default");
    json_decref(zero), json_decref(own), json_decref(ref), json_decref(lm);
}

/* ------------------------------------------------------ patching */

/* POST /v1/patching: the schema, an L x T grid, effect 0 at layer 0 where
 * the tokens agree, and on a causal LM after the objective's position;
 * every grid's shape by both methods. */
static void test_patching(test_server *s)
{
    static const char *const bodies[] = {
        "{\"model\": \"bert\", \"clean\": [101, 200, 201, 202, 102], \"corrupt\": [101, 200, 305, 202, 102]}",
        "{\"model\": \"gpt\", \"clean\": [116, 468, 27, 30, 31], \"corrupt\": [116, 468, 40, 30, 31], \"objective\": "
        "{\"kind\": \"logit_difference\", \"position\": 3, \"target\": 11, \"foil\": 17}}",
    };
    for (int b = 0; b < 2; b++) {
        http_resp r;
        http_post_json(s, &r, "/v1/patching", bodies[b]);
        check_schema(&r, "/v1/patching", "POST");
        const json_t *grid = get(r.json, "resid");
        int zeros_ok = json_array_size(grid) == 2;
        for (size_t l = 0; l < json_array_size(grid); l++) {
            const json_t *row = json_array_get(grid, l);
            zeros_ok &= json_array_size(row) == 5;
            for (size_t t = 0; t < json_array_size(row); t++)
                if ((l == 0 && t != 2) || (b == 1 && t == 4)) zeros_ok &= fabs(num_at(row, t)) <= 1e-5;
        }
        CHECK(r.status == 200 && zeros_ok, "patching %s: a 2 x 5 grid, 0 where nothing differs (%ld %.300s)", bodies[b],
              r.status, r.body);
        http_resp_free(&r);
    }
    /* every grid by both methods: the shapes, under attribution the same keys */
    http_resp r;
    http_post_json(s, &r, "/v1/patching",
                   "{\"model\": \"gpt\", \"clean\": [116, 468, 27, 30, 31], \"corrupt\": [116, 468, 40, 30, 31], "
                   "\"targets\": [\"resid\", \"heads\", \"mlps\"], \"per_position\": true, \"method\": \"both\"}");
    check_schema(&r, "/v1/patching", "POST");
    int shapes_ok = r.status == 200;
    const json_t *sides[] = {r.json, get(r.json, "attribution")};
    for (int k = 0; k < 2 && shapes_ok; k++) {
        const json_t *hp = get(sides[k], "heads_pos");
        shapes_ok &= json_array_size(get(sides[k], "resid")) == 2 && json_array_size(get(sides[k], "heads")) == 2 &&
                     json_array_size(json_array_get(get(sides[k], "heads"), 0)) == 2 &&
                     json_array_size(json_array_get(json_array_get(hp, 1), 1)) == 5 &&
                     json_array_size(get(sides[k], "mlps")) == 2 &&
                     json_array_size(json_array_get(get(sides[k], "mlps_pos"), 1)) == 5;
    }
    CHECK(shapes_ok && !strcmp(json_string_value(get(r.json, "method")), "both"),
          "patching: every grid by both methods (%ld %.300s)", r.status, r.body);
    http_resp_free(&r);
}

/* ------------------------------------------------------ hidden attribution */

static void check_contributions(const json_t *layer, size_t T, const char *what)
{
    const json_t *c = get(layer, "contributions");
    double worst = 0;
    int ranks_ok = 1;
    CHECK(json_array_size(c) == T && json_array_size(get(layer, "self")) == T &&
              json_array_size(get(layer, "self_rank")) == T && json_array_size(get(layer, "by_distance")) == T,
          "%s: every per-token array has T = %zu entries", what, T);
    for (size_t j = 0; j < json_array_size(c); j++) {
        const json_t *row = json_array_get(c, j);
        double sum = 0;
        for (size_t i = 0; i < json_array_size(row); i++) sum += num_at(row, i);
        worst = fmax(worst, fabs(sum - 1));
        /* self is row j's diagonal; its rank counts the larger entries */
        double self = num_at(row, j);
        int larger = 0;
        for (size_t i = 0; i < json_array_size(row); i++) larger += num_at(row, i) > self + 2e-6;
        long long rank = json_integer_value(json_array_get(get(layer, "self_rank"), j));
        if (rank < 1 + larger || fabs(num_at(get(layer, "self"), j) - self) > 1e-6) ranks_ok = 0;
    }
    CHECK(worst < 1e-5 * (double)T, "%s: rows sum to 1 (worst %.2e at 6 decimals)", what, worst);
    CHECK(ranks_ok, "%s: self = the diagonal, self_rank >= 1 + entries larger than it", what);
}

static void test_hidden_attribution(test_server *s)
{
    const char *P = "/v1/hidden-attribution";
    char body[512];
    http_resp r;
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"layers\": [0, 1, 2]}", short_sentence);
    http_post_json(s, &r, P, body);
    CHECK(r.status == 200, "exact: %ld %.300s", r.status, r.body);
    check_schema(&r, P, "POST");
    const json_t *layers = get(r.json, "layers");
    size_t T = json_array_size(get(r.json, "tokens"));
    CHECK(json_array_size(layers) == 3 && !strcmp(json_string_value(get(r.json, "method")), "exact"),
          "exact: 3 layers");
    for (size_t k = 0; k < json_array_size(layers); k++) {
        char what[64];
        snprintf(what, sizeof what, "bert exact layer %zu", k);
        check_contributions(json_array_get(layers, k), T, what);
    }
    /* layer 0: h^0_j depends on h^0_j only */
    const json_t *l0 = get(json_array_get(layers, 0), "contributions");
    double off = 0;
    for (size_t j = 0; j < T; j++)
        for (size_t i = 0; i < T; i++) off = fmax(off, fabs(num_at(json_array_get(l0, j), i) - (i == j)));
    CHECK(off == 0, "layer 0 contributions are the identity (max |c - I| %.2e)", off);
    const json_t *bd = get(json_array_get(layers, 0), "by_distance");
    CHECK(num_at(bd, 0) == 1 && num_at(bd, 1) == 0, "layer 0 by_distance = [1, 0, ...]");

    /* CLI prints the same numbers */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s hidden-attribution --model %s/bert --layers 0,1,2 '%s'", lensd_path(), tmpdir,
             short_sentence);
    json_t *cli = run_json(cmd);
    CHECK(cli && json_equal(get(cli, "layers"), get(r.json, "layers")), "CLI hidden-attribution == HTTP");
    json_decref(cli);
    /* the job kind returns the same result */
    char job_body[600];
    snprintf(job_body, sizeof job_body, "{\"kind\": \"hidden-attribution\", \"params\": %s}", body);
    json_t *job = run_job(s, job_body, 60000);
    CHECK(job && json_equal(get(get(job, "result"), "layers"), get(r.json, "layers")),
          "job hidden-attribution == POST /v1/hidden-attribution");
    check_result_schema(get(job, "result"), "HiddenAttributionResponse");
    json_decref(job);
    http_resp_free(&r);

    /* GPT-2, estimate: causal rows (nothing from later tokens), stderr per entry */
    snprintf(body, sizeof body,
             "{\"model\": \"gpt\", \"text\": \"%s\", \"method\": \"estimate\", \"probes\": 8, \"seed\": 3}", sentence);
    http_post_json(s, &r, P, body);
    CHECK(r.status == 200, "estimate: %ld %.300s", r.status, r.body);
    check_schema(&r, P, "POST");
    layers = get(r.json, "layers");
    T = json_array_size(get(r.json, "tokens"));
    CHECK(json_integer_value(get(r.json, "probes")) == 8 && json_array_size(layers) == 2,
          "estimate: probes echoed, default layers 1..L");
    double above = 0;
    for (size_t k = 0; k < json_array_size(layers); k++) {
        const json_t *y = json_array_get(layers, k);
        check_contributions(y, T, "gpt estimate");
        CHECK(json_array_size(get(y, "squared_norms")) == T && json_array_size(get(y, "squared_norms_stderr")) == T,
              "estimate: squared norms and their standard errors");
        for (size_t j = 0; j < T; j++)
            for (size_t i = j + 1; i < T; i++) above = fmax(above, num_at(json_array_get(get(y, "contributions"), j), i));
    }
    CHECK(above == 0, "causal: no contribution from later tokens (max %.2e)", above);
    http_resp_free(&r);
}

/* --------------------------------------------------------- token identity */

/* rank 1 <=> first neighbour is the token itself; rate = share of rank 1 */
static void check_ranking(const json_t *layer, size_t T, int top_k, const char *what)
{
    const json_t *ranks = get(layer, "ranks"), *nb = get(layer, "neighbors");
    int consistent = 1, ones = 0;
    CHECK(json_array_size(ranks) == T && json_array_size(nb) == T, "%s: T entries", what);
    for (size_t i = 0; i < json_array_size(ranks) && i < json_array_size(nb); i++) {
        long long rank = json_integer_value(json_array_get(ranks, i));
        const json_t *row = json_array_get(nb, i);
        if ((int)json_array_size(row) != top_k || rank < 1 || rank > (long long)T) consistent = 0;
        if (top_k > 0 && (rank == 1) != (json_integer_value(json_array_get(row, 0)) == (long long)i)) consistent = 0;
        ones += rank == 1;
    }
    CHECK(consistent, "%s: ranks in 1..T, top_k neighbours, rank 1 iff the nearest is the token itself", what);
    CHECK(fabs(json_number_value(get(layer, "rate")) - (double)ones / (double)T) < 1e-6, "%s: rate = share of rank 1",
          what);
}

static void test_token_identity(test_server *s)
{
    const char *P = "/v1/token-identity";
    char body[512];
    http_resp r;
    const char *metrics[] = {"cosine", "l2"};
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"metric\": \"%s\", \"top_k\": 3}",
                 sentence, metrics[k]);
        http_post_json(s, &r, P, body);
        CHECK(r.status == 200, "%s: %ld %.300s", metrics[k], r.status, r.body);
        check_schema(&r, P, "POST");
        const json_t *layers = get(r.json, "layers");
        size_t T = json_array_size(get(r.json, "tokens"));
        CHECK(json_array_size(layers) == 3 && !strcmp(json_string_value(get(r.json, "mapping")), "identity"),
              "%s: layers 0..L by default, mapping identity", metrics[k]);
        for (size_t l = 0; l < json_array_size(layers); l++) check_ranking(json_array_get(layers, l), T, 3, metrics[k]);
        const json_t *l0 = json_array_get(layers, 0);
        CHECK(json_number_value(get(l0, "rate")) == 1 && json_number_value(get(l0, "rate_excluding_special")) == 1,
              "%s: every layer-0 vector is nearest to itself", metrics[k]);
        http_resp_free(&r);
    }

    /* format.precision: the rates' significant digits (1 digit = the 9-digit rate rounded) */
    http_resp r9, r1;
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"format\": {\"precision\": 9}}", sentence);
    http_post_json(s, &r9, P, body);
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"format\": {\"precision\": 1, \"encoding\": \"base64\"}}",
             sentence);
    http_post_json(s, &r1, P, body);
    CHECK(r9.status == 200 && r1.status == 200, "token-identity with format: %ld %ld %.200s", r9.status, r1.status,
          r1.body);
    if (r9.status == 200 && r1.status == 200) {
        check_schema(&r9, P, "POST");
        int ok = json_array_size(get(r9.json, "layers")) > 0;
        const double T9 = (double)json_array_size(get(r9.json, "tokens"));
        for (size_t l = 0; ok && l < json_array_size(get(r9.json, "layers")); l++) {
            double v9 = json_number_value(get(json_array_get(get(r9.json, "layers"), l), "rate"));
            double v1 = json_number_value(get(json_array_get(get(r1.json, "layers"), l), "rate"));
            char one[32];
            snprintf(one, sizeof one, "%.1g", v9);
            /* a rate is hits / T: at 9 digits it is that fraction within 1e-8 */
            ok = v1 == strtod(one, NULL) && fabs(v9 * T9 - round(v9 * T9)) < 1e-8 * T9;
        }
        CHECK(ok, "rates at precision 9 are exact fractions hits / T, at precision 1 their 1-digit rounding");
    }
    http_resp_free(&r9), http_resp_free(&r1);

    /* vocabulary ranking (GPT-2: own id among the whole embedding table) */
    snprintf(body, sizeof body, "{\"model\": \"gpt\", \"text\": \"%s\", \"layers\": [1], \"vocabulary\": true}", sentence);
    http_post_json(s, &r, P, body);
    CHECK(r.status == 200, "vocabulary: %ld %.300s", r.status, r.body);
    check_schema(&r, P, "POST");
    const json_t *voc = get(json_array_get(get(r.json, "layers"), 0), "vocabulary");
    size_t T = json_array_size(get(r.json, "tokens"));
    CHECK(voc && json_array_size(get(voc, "ranks")) == T && json_array_size(get(voc, "neighbors")) == T,
          "vocabulary ranks and neighbours per token");
    http_resp_free(&r);

    char cmd[1024];
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"metric\": \"l2\", \"layers\": [2]}", sentence);
    http_post_json(s, &r, P, body);
    snprintf(cmd, sizeof cmd, "%s token-identity --model %s/bert --metric l2 --layers 2 '%s'", lensd_path(), tmpdir,
             sentence);
    json_t *cli = run_json(cmd);
    CHECK(cli && json_equal(get(cli, "layers"), get(r.json, "layers")), "CLI token-identity == HTTP");
    json_decref(cli);
    http_resp_free(&r);
}

static const char *map_texts =
    "\"texts\": [\"the cat sat on the mat\", \"a dog ran in the park\", \"stocks fell on monday\", "
    "\"the bank raised rates\", \"rain is expected tomorrow\", \"she read the book twice\", "
    "\"the team won the final\", \"prices rose again\", \"he missed the early train\", "
    "\"the movie was long but good\", \"birds sing in the morning\", \"the road was closed\"]";

/* Fit maps by job; mapping linear before (refused) and after (served). */
static void test_maps(test_server *s)
{
    const char *P = "/v1/token-identity";
    char body[2048];
    http_resp r;
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"mapping\": \"linear\"}", sentence);
    http_post_json(s, &r, P, body);
    CHECK(r.status == 422 && err_field(&r) && !strcmp(err_field(&r), "mapping"),
          "mapping linear before any fit: 422 mapping (%ld)", r.status);
    http_resp_free(&r);

    snprintf(body, sizeof body,
             "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", %s, \"heldout_fraction\": 0.25, "
             "\"save\": true}}",
             map_texts);
    json_t *job = run_job(s, body, 60000);
    const json_t *res = get(job, "result");
    CHECK(job && !strcmp(json_string_value(get(job, "state")), "done"), "token-identity-map job done");
    check_result_schema(res, "TokenIdentityMapResult");
    const json_t *layers = get(res, "layers");
    CHECK(json_array_size(layers) == 3 && json_integer_value(get(res, "train_texts")) == 9 &&
              json_integer_value(get(res, "heldout_texts")) == 3,
          "maps for layers 0..2; 9 training and 3 held-out texts");
    CHECK(json_number_value(get(json_array_get(layers, 0), "heldout_rate")) == 1 &&
              json_number_value(get(json_array_get(layers, 0), "train_rate")) == 1,
          "the fitted layer-0 map identifies every token");
    CHECK(json_is_true(get(res, "installed")) && json_is_string(get(res, "saved")), "maps installed and saved (%s)",
          json_dumps(get(res, "save_error"), JSON_ENCODE_ANY));
    json_decref(job);

    snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"mapping\": \"linear\", \"top_k\": 2}",
             sentence);
    http_post_json(s, &r, P, body);
    CHECK(r.status == 200, "mapping linear after the fit: %ld %.300s", r.status, r.body);
    check_schema(&r, P, "POST");
    size_t T = json_array_size(get(r.json, "tokens"));
    for (size_t l = 0; l < json_array_size(get(r.json, "layers")); l++)
        check_ranking(json_array_get(get(r.json, "layers"), l), T, 2, "linear");
    CHECK(json_integer_value(get(get(r.json, "maps"), "train_tokens")) > 0, "the response says how the maps were fit");

    /* the saved maps serve the CLI (and a restarted server) */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s token-identity --model %s/bert --mapping linear --top-k 2 '%s'", lensd_path(),
             tmpdir, sentence);
    json_t *cli = run_json(cmd);
    CHECK(cli && json_equal(get(cli, "layers"), get(r.json, "layers")), "CLI with the saved maps == HTTP");
    json_decref(cli);
    http_resp_free(&r);

    /* the same fit from a TSV in --data-dir */
    json_t *j2 = run_job(s, "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"data\": \"texts.tsv\"}}",
                         60000);
    CHECK(j2 && !strcmp(json_string_value(get(j2, "state")), "done") &&
              json_integer_value(get(get(j2, "result"), "train_texts")) +
                      json_integer_value(get(get(j2, "result"), "heldout_texts")) == 5,
          "token-identity-map from data: 5 texts (%s)", j2 ? json_dumps(get(j2, "error"), 0) : "no job");
    json_decref(j2);
    /* plain lines (no header), blank lines skipped */
    j2 = run_job(s, "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"data\": \"lines.txt\"}}", 60000);
    CHECK(j2 && !strcmp(json_string_value(get(j2, "state")), "done") &&
              json_integer_value(get(get(j2, "result"), "train_texts")) +
                      json_integer_value(get(get(j2, "result"), "heldout_texts")) == 4,
          "token-identity-map from plain lines: 4 texts (%s)", j2 ? json_dumps(get(j2, "error"), 0) : "no job");
    json_decref(j2);
}

static void test_bad_inputs(test_server *s)
{
    const bad_case cases[] = {
        {"/v1/context-mixing", "{\"model\": \"bert\", \"text\": \"a b\"}", 422, "invalid_request", "method"},
        {"/v1/context-mixing", "{\"model\": \"gpt\", \"text\": \"a b\", \"method\": \"decompx\"}", 422, "invalid_request", "method"},
        {"/v1/context-mixing", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": \"flow\"}", 422, "invalid_request", "method"},
        {"/v1/context-mixing", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": 1}", 422, "invalid_request", "method"},
        {"/v1/context-mixing", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": \"alti\", \"definition\": \"paper\"}", 422, "invalid_request", "definition"},
        {"/v1/context-mixing", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": \"alti\", \"layers\": [0]}", 422, "invalid_request", "layers"},
        {"/v1/context-mixing", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": \"alti\", \"layers\": [3]}", 422, "invalid_request", "layers"},
        {"/v1/context-mixing", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": \"alti\", \"position\": 1}", 422, "invalid_request", "position"},
        {"/v1/context-mixing", "{\"model\": \"bert\", \"method\": \"alti\"}", 422, "invalid_request", "text"},
        {"/v1/logit-attribution", "{\"model\": \"bert\", \"text\": \"a b\", \"target\": 1}", 422, "invalid_request", "model"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": {\"kind\": \"odds\"}}", 422, "invalid_request", "objective.kind"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": {\"kind\": \"logit_difference\", \"target\": 5}}", 422, "invalid_request", "objective.foil"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": {\"kind\": \"logit_difference\", \"target\": 5, \"foil\": 5}}", 422, "invalid_request", "objective.foil"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": {\"kind\": \"logit\", \"foil\": 5}}", 422, "invalid_request", "objective.foil"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": {\"position\": 9}}", 422, "invalid_request", "objective.position"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": {\"target\": \"the quick brown fox\"}}", 422, "invalid_request", "objective.target"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": 5, \"objective\": {\"target\": 6}}", 422, "invalid_request", "objective.target"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": {\"size\": 1}}", 422, "invalid_request", "objective.size"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"objective\": 3}", 422, "invalid_request", "objective"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a b\", \"objective\": {\"position\": 0}}", 422, "invalid_request", "objective.position"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\"}", 422, "invalid_request", "target"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": 5, \"foil\": 5}", 422, "invalid_request", "foil"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": 5, \"position\": 9}", 422, "invalid_request", "position"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": 5, \"position\": -9}", 422, "invalid_request", "position"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": \"the quick brown fox\"}", 422, "invalid_request", "target"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": 5, \"foil\": \"\"}", 422, "invalid_request", "foil"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": 99999999}", 422, "invalid_request", "target"},
        {"/v1/logit-attribution", "{\"model\": \"gpt\", \"text\": \"a b\", \"target\": [1]}", 422, "invalid_request", "target"},
        {"/v1/logit-attribution", "{\"model\": \"neox\", \"text\": \"a b\", \"target\": 1, \"layers\": [1]}", 422, "invalid_request", "layers"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\"}", 422, "invalid_request", "heads"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"heads\": []}", 422, "invalid_request", "heads"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"heads\": [[3, 0]]}", 422, "invalid_request", "heads"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"heads\": [[0, 0]]}", 422, "invalid_request", "heads"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"heads\": [[1, 2]]}", 422, "invalid_request", "heads"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"heads\": [[1]]}", 422, "invalid_request", "heads"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"heads\": [1, 0]}", 422, "invalid_request", "heads"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"mlps\": [3]}", 422, "invalid_request", "mlps"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"mlps\": [1], \"mode\": \"resample\"}", 422, "invalid_request", "mode"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"mlps\": [1], \"reference_texts\": [\"a\"]}", 422, "invalid_request", "reference_texts"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"mlps\": [1], \"mode\": \"mean\", \"reference_texts\": []}", 422, "invalid_request", "reference_texts"},
        {"/v1/ablation", "{\"model\": \"bert\", \"text\": \"a b\", \"mlps\": [1], \"objective\": {\"kind\": \"logit_difference\"}}", 422, "invalid_request", "objective.foil"},
        {"/v1/ablation", "{\"model\": \"gpt\", \"text\": \"a b\", \"mlps\": [1], \"objective\": {\"position\": 9}}", 422, "invalid_request", "objective.position"},
        {"/v1/ablation", "{\"model\": \"gpt\", \"text\": \"a b\", \"mlps\": [1], \"layers\": [1]}", 422, "invalid_request", "layers"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": [101, 200, 102], \"corrupt\": [101, 102]}", 422, "invalid_request", "corrupt"},
        {"/v1/patching", "{\"model\": \"bert\", \"corrupt\": [101, 102]}", 422, "invalid_request", "clean"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": \"\", \"corrupt\": [101, 102]}", 422, "invalid_request", "clean"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": [101, 99999999], \"corrupt\": [101, 102]}", 422, "invalid_request", "clean"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": [101, 102], \"corrupt\": [101, 102], \"targets\": [\"neurons\"]}", 422, "invalid_request", "targets"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": [101, 102], \"corrupt\": [101, 102], \"targets\": [\"heads\", \"heads\"]}", 422, "invalid_request", "targets"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": [101, 102], \"corrupt\": [101, 102], \"targets\": []}", 422, "invalid_request", "targets"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": [101, 102], \"corrupt\": [101, 102], \"method\": \"gradient\"}", 422, "invalid_request", "method"},
        {"/v1/patching", "{\"model\": \"bert\", \"clean\": [101, 102], \"corrupt\": [101, 102], \"per_position\": 1}", 422, "invalid_request", "per_position"},
        {"/v1/patching", "{\"model\": \"gpt\", \"clean\": [101, 102], \"corrupt\": [101, 102], \"objective\": {\"position\": 5}}", 422, "invalid_request", "objective.position"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": \"fast\"}", 422, "invalid_request", "method"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\", \"text\": \"a b\", \"method\": \"estimate\", \"probes\": 1}", 422, "invalid_request", "probes"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\", \"text\": \"a b\", \"probes\": \"8\"}", 422, "invalid_request", "probes"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\", \"text\": \"a b\", \"layers\": [3]}", 422, "invalid_request", "layers"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\", \"text\": \"a b\", \"include_norms\": 1}", 422, "invalid_request", "include_norms"},
        {"/v1/hidden-attribution", "{\"model\": \"nope\", \"text\": \"a b\"}", 404, "model_not_found", "model"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\"}", 422, "invalid_request", "text"},
        {"/v1/hidden-attribution", "{\"model\": \"bert\", \"text\": \"\\u00e9\", \"layers\": []}", 422, "invalid_request", "layers"},
        {"/v1/token-identity", "{\"model\": \"bert\", \"text\": \"a b\", \"metric\": \"dot\"}", 422, "invalid_request", "metric"},
        {"/v1/token-identity", "{\"model\": \"bert\", \"text\": \"a b\", \"top_k\": 101}", 422, "invalid_request", "top_k"},
        {"/v1/token-identity", "{\"model\": \"bert\", \"text\": \"a b\", \"mapping\": \"affine\"}", 422, "invalid_request", "mapping"},
        {"/v1/token-identity", "{\"model\": \"bert\", \"text\": \"a b\", \"layers\": [-1]}", 422, "invalid_request", "layers"},
        {"/v1/token-identity", "{\"model\": \"bert\", \"text\": \"a b\", \"vocabulary\": \"yes\"}", 422, "invalid_request", "vocabulary"},
        {"/v1/token-identity", "{\"model\": \"gpt\", \"input_ids\": [99999999]}", 422, "invalid_request", "input_ids"},
        {"/v1/token-identity", "[1, 2]", 422, "invalid_request", NULL},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\"}}", 422, "invalid_request", "params.texts"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"texts\": []}}", 422, "invalid_request", "params.texts"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"texts\": [\"a\", 3]}}", 422, "invalid_request", "params.texts"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"texts\": [\"a b\"]}}", 422, "invalid_request", "params.texts"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"texts\": [\"a\", \"b\"], \"ridge\": -1}}", 422, "invalid_request", "params.ridge"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"texts\": [\"a\", \"b\"], \"heldout_fraction\": 1}}", 422, "invalid_request", "params.heldout_fraction"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"data\": \"../x.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"data\": \"missing.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"data\": \"bad.tsv\"}}", 422, "invalid_request", "params.data"},
        {"/v1/jobs", "{\"kind\": \"token-identity-map\", \"params\": {\"model\": \"bert\", \"data\": \"texts.tsv\", \"texts\": [\"a\"]}}", 422, "invalid_request", "params.texts"},
    };
    run_bad_cases(s, cases, (int)(sizeof cases / sizeof *cases));

    /* exact attribution of a long input is refused with a hint to estimate */
    json_t *ids = json_array();
    for (int i = 0; i < 500; i++) json_array_append_new(ids, json_integer(5 + i % 50));
    json_t *req = json_pack("{s:s, s:o}", "model", "bert", "input_ids", ids);
    char *body = json_dumps(req, 0);
    http_resp r;
    http_post_json(s, &r, "/v1/hidden-attribution", body);
    CHECK(r.status == 413 && err_code(&r) && !strcmp(err_code(&r), "too_many_tokens") && strstr(r.body, "estimate"),
          "exact on 500 tokens: 413 suggesting the estimate (%ld %.200s)", r.status, r.body);
    http_resp_free(&r);
    free(body);
    json_decref(req);
}

static int write_file(const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/data/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lensd-identity-XXXXXX");
    if (!openapi || make_tiny_models(tmpdir)) return check_done("test_http_identity");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir %s/data", tmpdir);
    CHECK(run_cmd(cmd) == 0 &&
              write_file("texts.tsv", "id\tsentence\n1\tthe cat sat\n2\ta dog ran far\n3\tit rained\n4\twe left early\n"
                                      "5\tthe end came\n") == 0 &&
              write_file("bad.tsv", "id\tlabel\n1\t0\n") == 0 &&
              write_file("lines.txt", "the cat sat\n\na dog ran far\r\nit rained\nwe left early\n") == 0,
          "data files written");
    char bert[300], gpt[300], neox[300], data[300];
    snprintf(cmd, sizeof cmd, "%s mkmodel --arch gpt_neox --preset micro --seed 1 --out %s/neox", lensd_path(), tmpdir);
    CHECK(run_cmd(cmd) == 0, "mkmodel gpt_neox");
    snprintf(neox, sizeof neox, "neox=%s/neox", tmpdir);
    snprintf(bert, sizeof bert, "bert=%s/bert", tmpdir);
    snprintf(gpt, sizeof gpt, "gpt=%s/gpt", tmpdir);
    snprintf(data, sizeof data, "%s/data", tmpdir);
    /* the cost model's rate pinned at 10 GFLOP/s: which requests get the up-front 413 does not
     * depend on this machine (idle, its calibration GEMM measured 165-458 GFLOP/s) */
    const char *args[] = {"--model", bert, "--model", gpt, "--data-dir", data, "--max-tokens", "512", "--timeout", "300",
                          "--debug-gflops", "10", "--model", neox, NULL};
    test_server s;
    if (server_launch(&s, args) == 0) {
        test_hidden_attribution(&s);
        test_context_mixing(&s);
        test_logit_attribution(&s);
        test_ablation(&s);
        test_patching(&s);
        test_objectives(&s);
        test_token_identity(&s);
        test_maps(&s);
        test_bad_inputs(&s);
        http_resp r;
        http_get(&s, &r, "/healthz");
        CHECK(r.status == 200, "/healthz at the end: %ld", r.status);
        http_resp_free(&r);
        CHECK(server_terminate(&s) == 0, "lensd exits 0");
    } else {
        CHECK(0, "lensd serve did not start");
    }
    /* a restarted server loads the saved maps; with a 5 s deadline it
     * refuses exact work it could not finish in time (80 tokens: ~780 GFLOP;
     * at the pinned 10 GFLOP/s x 0.5 the deadline allows 25; the 300 s server
     * above would accept it) */
    args[9] = "5";
    if (server_launch(&s, args) == 0) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"%s\", \"mapping\": \"linear\"}", sentence);
        http_resp r;
        http_post_json(&s, &r, "/v1/token-identity", body);
        CHECK(r.status == 200, "after a restart the saved maps serve mapping linear: %ld", r.status);
        http_resp_free(&r);
        int n = snprintf(body, sizeof body, "{\"model\": \"bert\", \"input_ids\": [1");
        for (int i = 1; i < 80; i++) n += snprintf(body + n, sizeof body - (size_t)n, ", %d", 5 + i % 50);
        snprintf(body + n, sizeof body - (size_t)n, "]}");
        http_post_json(&s, &r, "/v1/hidden-attribution", body);
        CHECK(r.status == 413 && strstr(r.body, "5 s deadline"), "exact on 80 tokens, 5 s deadline: 413 (%ld %.300s)",
              r.status, r.body);
        http_resp_free(&r);
        CHECK(server_terminate(&s) == 0, "lensd exits 0");
    }
    remove_test_files(tmpdir);
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_identity");
}
