/* test_models.c - lens_forward on the three shared Hugging Face checkpoints
 * against PyTorch.
 *
 * Two references, both written by PyTorch float32 in eval mode:
 *   ../shared/models/NAME/golden.json  the training code's outputs (logits,
 *       last hidden state, pooled output, per-position logit statistics);
 *   tests/fixtures/forward_NAME.json   tests/reference/reference_forward.py,
 *       an independent torch implementation that first checks itself against
 *       golden.json: every hidden state, attention probability and value
 *       matrix, plus a BERT sentence pair with token_type_ids 1.
 * Every example runs alone and then all of a model's examples run together as
 * one packed lens_batch of different lengths.
 *
 * Tolerances. Hidden states, values, pooled output and logits: atol 1e-4 (the
 * bar the issue sets). Attention probabilities: atol 1e-5 (they lie in [0,1]
 * and come out of a softmax that damps score errors). Both cover float32
 * accumulation-order differences between OpenBLAS and PyTorch GEMMs, which
 * grow with depth and width and measure ~1e-6..1e-5 on these models (the
 * reference itself differs from golden.json by up to 3.3e-6).
 * Exact identities, 1e-5: softmax rows sum to 1; GPT-2 entries above the
 * diagonal are exactly 0; a sequence inside a packed batch gives what it gives
 * alone (same arithmetic; only GEMM blocking over the rows can differ). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/model/model.h"
#include "tests/check.h"
#include "tests/fixture.h"

#define TOL_VALUE 1e-4 /* hidden states, values, pooled, logits vs PyTorch */
#define TOL_PROB 1e-5  /* attention probabilities vs PyTorch */
#define TOL_EXACT 1e-5 /* identities: row sums, batch == single */

static const char *const MODELS[] = {"bert-tiny-sst2", "bert-tiny-mlm", "gpt2-tiny-wikitext"};

static const unsigned KEEP_ALL = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_LOGITS;

/* ---------------------------------------------------------------- JSON */

static int *json_ints(const json_t *j, int *n_out)
{
    int n = json_is_array(j) ? (int)json_array_size(j) : 0;
    int *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    for (int i = 0; out && i < n; i++) out[i] = (int)json_integer_value(json_array_get(j, (size_t)i));
    *n_out = n;
    return out;
}

/* check_close against a JSON array; a missing / mis-shaped one fails. */
static double close_json(const char *what, const float *got, const json_t *want_json, size_t n, double atol)
{
    CHECK(got != NULL, "%s: activation not kept", what);
    float *want = json_floats(want_json, n, what);
    double d = got && want ? check_close(what, got, want, n, atol, 0) : -1;
    free(want);
    return d;
}

/* ---------------------------------------------------------------- examples */

typedef struct {
    char name[96]; /* "model/example" */
    int T;
    int *ids, *type_ids;
    const json_t *fixture; /* forward_NAME.json example */
    const json_t *golden;  /* golden.json example, or NULL (sentence pair) */
} example;

static int forward(const lens_model *m, int n_seqs, const int *lengths, const int *ids, const int *type_ids,
                   lens_activations *act)
{
    lens_batch batch = {.n_seqs = n_seqs, .lengths = lengths, .ids = ids, .type_ids = type_ids};
    lens_forward_opts opts = {.keep = KEEP_ALL};
    lens_err err = {0};
    memset(act, 0, sizeof *act);
    int rc = lens_forward(m, &batch, &opts, act, &err);
    CHECK(rc == 0, "lens_forward (%d sequences): %s", n_seqs, err.msg);
    if (rc == 0) {
        int N = 0;
        for (int s = 0; s < n_seqs; s++) N += lengths[s];
        CHECK(act->n_seqs == n_seqs && act->n_tokens == N && act->n_layers == m->cfg.n_layers,
              "activations say S=%d N=%d L=%d, want %d %d %d", act->n_seqs, act->n_tokens, act->n_layers,
              n_seqs, N, m->cfg.n_layers);
    }
    return rc;
}

/* Softmax rows sum to 1; GPT-2 rows put exactly 0 on future tokens. */
static void check_attn_identities(const lens_model *m, const lens_activations *a, int s, int T, const char *label)
{
    const lens_config *c = &m->cfg;
    for (int l = 1; l <= c->n_layers; l++)
        for (int h = 0; h < c->n_heads; h++) {
            const float *P = lens_act_attn(m, a, l, h, s);
            if (!P) continue; /* reported by the fixture comparison */
            double worst_sum = 0;
            int future = 0;
            for (int i = 0; i < T; i++) {
                double sum = 0;
                for (int j = 0; j < T; j++) {
                    sum += P[(size_t)i * T + j];
                    if (c->arch == LENS_ARCH_GPT2 && j > i && P[(size_t)i * T + j] != 0.0f) future++;
                }
                if (!(fabs(sum - 1) <= worst_sum)) worst_sum = fabs(sum - 1);
            }
            CHECK(worst_sum <= TOL_EXACT, "%s layer %d head %d: an attention row sums to 1%+g", label, l, h, worst_sum);
            CHECK(future == 0, "%s layer %d head %d: %d attention weights on future tokens", label, l, h, future);
        }
}

/* Every kept activation of sequence s against the reference fixture. */
static void check_fixture(const lens_model *m, const lens_activations *a, int s, const example *ex)
{
    const lens_config *c = &m->cfg;
    const int T = ex->T, C = c->d_model, L = c->n_layers, NH = c->n_heads, VO = NH * c->d_head_v;
    const json_t *fx = ex->fixture;
    char what[160];
    double worst_hidden = 0, worst_attn = 0, worst_values = 0;
    for (int l = 0; l <= L; l++) {
        snprintf(what, sizeof what, "%s hidden_states[%d]", ex->name, l);
        double d = close_json(what, lens_act_hidden(m, a, l, s),
                              json_array_get(json_object_get(fx, "hidden_states"), (size_t)l), (size_t)T * C, TOL_VALUE);
        if (d > worst_hidden) worst_hidden = d;
    }
    for (int l = 1; l <= L; l++) {
        const json_t *layer = json_array_get(json_object_get(fx, "attentions"), (size_t)(l - 1));
        for (int h = 0; h < NH; h++) {
            snprintf(what, sizeof what, "%s attentions layer %d head %d", ex->name, l, h);
            double d = close_json(what, lens_act_attn(m, a, l, h, s), json_array_get(layer, (size_t)h),
                                  (size_t)T * T, TOL_PROB);
            if (d > worst_attn) worst_attn = d;
        }
        snprintf(what, sizeof what, "%s values layer %d", ex->name, l);
        double d = close_json(what, lens_act_values(m, a, l, s),
                              json_array_get(json_object_get(fx, "values"), (size_t)(l - 1)), (size_t)T * VO, TOL_VALUE);
        if (d > worst_values) worst_values = d;
    }
    const float *logits = lens_act_logits(m, a, s);
    double worst_logits = 0;
    if (c->task == LENS_TASK_CLASSIFICATION) {
        snprintf(what, sizeof what, "%s pooled", ex->name);
        CHECK(a->pooled != NULL, "%s: pooled output not kept", ex->name);
        if (a->pooled) close_json(what, a->pooled + (size_t)s * C, json_object_get(fx, "pooled"), (size_t)C, TOL_VALUE);
        snprintf(what, sizeof what, "%s logits", ex->name);
        worst_logits = close_json(what, logits, json_object_get(fx, "logits"), (size_t)c->n_labels, TOL_VALUE);
    } else if (c->task == LENS_TASK_MASKED_LM || c->task == LENS_TASK_CAUSAL_LM) {
        const size_t V = (size_t)c->vocab_size;
        float *want8 = json_floats(json_object_get(fx, "logits_first_8"), (size_t)T * 8, ex->name);
        if (logits && want8) {
            float got8[8];
            for (int t = 0; t < T; t++) {
                memcpy(got8, logits + t * V, sizeof got8);
                snprintf(what, sizeof what, "%s logits[%d][0:8]", ex->name, t);
                double d = check_close(what, got8, want8 + t * 8, 8, TOL_VALUE, 0);
                if (d > worst_logits) worst_logits = d;
            }
        }
        free(want8);
        snprintf(what, sizeof what, "%s logits[%d] (last position, all %zu)", ex->name, T - 1, V);
        double d = close_json(what, logits ? logits + (T - 1) * V : NULL, json_object_get(fx, "last_logits"), V, TOL_VALUE);
        if (d > worst_logits) worst_logits = d;
    }
    printf("  %-27s T=%2d  vs reference: hidden %.2g  attn %.2g  values %.2g  logits %.2g\n", ex->name, T,
           worst_hidden, worst_attn, worst_values, worst_logits);
}

static double logsumexp(const float *x, size_t n)
{
    double mx = x[0], sum = 0;
    for (size_t i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    for (size_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return mx + log(sum);
}

/* Outputs recorded in golden.json (written by the training code's PyTorch). */
static void check_golden(const lens_model *m, const lens_activations *a, int s, const example *ex)
{
    const lens_config *c = &m->cfg;
    const json_t *g = ex->golden;
    const int T = ex->T, C = c->d_model;
    const float *logits = lens_act_logits(m, a, s);
    char what[160];
    snprintf(what, sizeof what, "%s golden last_hidden_state", ex->name);
    double worst = close_json(what, lens_act_hidden(m, a, c->n_layers, s), json_object_get(g, "last_hidden_state"),
                              (size_t)T * C, TOL_VALUE);
    if (!logits) {
        CHECK(0, "%s: logits not kept", ex->name);
        return;
    }
    if (c->task == LENS_TASK_CLASSIFICATION) {
        const int K = c->n_labels;
        snprintf(what, sizeof what, "%s golden logits", ex->name);
        double d = close_json(what, logits, json_object_get(g, "logits"), (size_t)K, TOL_VALUE);
        if (d > worst) worst = d;
        snprintf(what, sizeof what, "%s golden pooled_output", ex->name);
        d = close_json(what, a->pooled ? a->pooled + (size_t)s * C : NULL, json_object_get(g, "pooled_output"),
                       (size_t)C, TOL_VALUE);
        if (d > worst) worst = d;
        int best = 0;
        for (int k = 1; k < K; k++) if (logits[k] > logits[best]) best = k;
        const char *want = json_string_value(json_object_get(g, "predicted_label"));
        CHECK(c->labels && want && strcmp(c->labels[best], want) == 0, "%s: predicted label %s, golden %s",
              ex->name, c->labels ? c->labels[best] : "(no labels)", want ? want : "?");
    } else {
        const size_t V = (size_t)c->vocab_size;
        const json_t *pp = json_object_get(g, "per_position");
        snprintf(what, sizeof what, "%s golden per_position", ex->name);
        float *want8 = json_floats(json_object_get(pp, "logits_first_8_ids"), (size_t)T * 8, what);
        float *want_max = json_floats(json_object_get(pp, "max_logit"), (size_t)T, what);
        float *want_lse = json_floats(json_object_get(pp, "logsumexp"), (size_t)T, what);
        float *got8 = malloc((size_t)T * 8 * sizeof *got8), *got_max = malloc((size_t)T * sizeof *got_max),
              *got_lse = malloc((size_t)T * sizeof *got_lse);
        int argmax_ok = 1;
        const json_t *argmax = json_object_get(pp, "argmax_id");
        if (want8 && want_max && want_lse && got8 && got_max && got_lse) {
            for (int t = 0; t < T; t++) {
                const float *row = logits + t * V;
                memcpy(got8 + t * 8, row, 8 * sizeof *row);
                float mx = row[0];
                for (size_t v = 1; v < V; v++) if (row[v] > mx) mx = row[v];
                got_max[t] = mx;
                got_lse[t] = (float)logsumexp(row, V);
                /* the golden argmax must be a maximum up to the tolerance (robust to near-ties) */
                json_int_t id = json_integer_value(json_array_get(argmax, (size_t)t));
                if (id < 0 || (size_t)id >= V || !(row[id] >= mx - TOL_VALUE)) argmax_ok = 0;
            }
            double d;
            snprintf(what, sizeof what, "%s golden logits_first_8_ids", ex->name);
            if ((d = check_close(what, got8, want8, (size_t)T * 8, TOL_VALUE, 0)) > worst) worst = d;
            snprintf(what, sizeof what, "%s golden max_logit", ex->name);
            if ((d = check_close(what, got_max, want_max, (size_t)T, TOL_VALUE, 0)) > worst) worst = d;
            snprintf(what, sizeof what, "%s golden logsumexp", ex->name);
            if ((d = check_close(what, got_lse, want_lse, (size_t)T, TOL_VALUE, 0)) > worst) worst = d;
            CHECK(argmax_ok, "%s: golden argmax_id is not the argmax of our logits", ex->name);
        }
        free(want8), free(want_max), free(want_lse), free(got8), free(got_max), free(got_lse);
        if (c->task == LENS_TASK_CAUSAL_LM) {
            snprintf(what, sizeof what, "%s golden last_position_logits_full", ex->name);
            double d = close_json(what, logits + (T - 1) * V, json_object_get(g, "last_position_logits_full"), V, TOL_VALUE);
            if (d > worst) worst = d;
        } else {
            const json_t *pos = json_object_get(g, "mask_positions"), *rows = json_object_get(g, "mask_logits_full");
            CHECK(json_array_size(pos) > 0 && json_array_size(pos) == json_array_size(rows),
                  "%s: golden mask_positions / mask_logits_full", ex->name);
            for (size_t i = 0; i < json_array_size(pos) && i < json_array_size(rows); i++) {
                json_int_t t = json_integer_value(json_array_get(pos, i));
                CHECK(t >= 0 && t < T, "%s: mask position %lld", ex->name, (long long)t);
                if (t < 0 || t >= T) continue;
                snprintf(what, sizeof what, "%s golden mask_logits_full[%lld]", ex->name, (long long)t);
                double d = close_json(what, logits + t * V, json_array_get(rows, i), V, TOL_VALUE);
                if (d > worst) worst = d;
            }
        }
    }
    printf("  %-27s T=%2d  vs golden.json: max |diff| %.2g\n", ex->name, T, worst);
}

/* Sequence sb of a packed batch against the same sequence run alone. */
static void check_batch_vs_single(const lens_model *m, const lens_activations *batch, int sb,
                                  const lens_activations *single, const example *ex)
{
    const lens_config *c = &m->cfg;
    const int T = ex->T, C = c->d_model, L = c->n_layers, VO = c->n_heads * c->d_head_v;
    char what[160];
    double worst = 0, d;
#define SAME(got, want, n, ...)                                                   \
    do {                                                                          \
        const float *got_ = (got), *want_ = (want);                               \
        snprintf(what, sizeof what, __VA_ARGS__);                                 \
        CHECK(got_ && want_, "%s: not kept", what);                               \
        if (got_ && want_ && (d = check_close(what, got_, want_, (n), TOL_EXACT, 0)) > worst) worst = d; \
    } while (0)
    for (int l = 0; l <= L; l++)
        SAME(lens_act_hidden(m, batch, l, sb), lens_act_hidden(m, single, l, 0), (size_t)T * C,
             "%s batch vs single hidden_states[%d]", ex->name, l);
    for (int l = 1; l <= L; l++) {
        for (int h = 0; h < c->n_heads; h++)
            SAME(lens_act_attn(m, batch, l, h, sb), lens_act_attn(m, single, l, h, 0), (size_t)T * T,
                 "%s batch vs single attentions layer %d head %d", ex->name, l, h);
        SAME(lens_act_values(m, batch, l, sb), lens_act_values(m, single, l, 0), (size_t)T * VO,
             "%s batch vs single values layer %d", ex->name, l);
    }
    if (c->task == LENS_TASK_CLASSIFICATION) {
        SAME(lens_act_logits(m, batch, sb), lens_act_logits(m, single, 0), (size_t)c->n_labels,
             "%s batch vs single logits", ex->name);
        SAME(batch->pooled ? batch->pooled + (size_t)sb * C : NULL, single->pooled, (size_t)C,
             "%s batch vs single pooled", ex->name);
    } else if (c->task != LENS_TASK_ENCODER) {
        SAME(lens_act_logits(m, batch, sb), lens_act_logits(m, single, 0), (size_t)T * c->vocab_size,
             "%s batch vs single logits", ex->name);
    }
#undef SAME
    printf("  %-27s T=%2d  packed batch vs alone: max |diff| %.2g\n", ex->name, T, worst);
}

/* ---------------------------------------------------------------- one model */

static json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    CHECK(j != NULL, "%s: %s (line %d)", path, jerr.text, jerr.line);
    return j;
}

static void test_model(const char *shared, const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/models/%s", shared, name);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) != 0) {
        SKIP("%s not found", dir);
        return;
    }
    printf("%s\n", name);
    snprintf(path, sizeof path, "tests/fixtures/forward_%s.json", name);
    json_t *fixture = fixture_load(path);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_t *golden = load_json(path);
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "lens_model_load(%s): %s", dir, err.msg);
    if (!m || !fixture || !golden) goto out;
    const lens_config *c = &m->cfg;
    CHECK(c->n_layers == (int)json_integer_value(json_object_get(fixture, "n_layers")) &&
              c->n_heads == (int)json_integer_value(json_object_get(fixture, "n_heads")),
          "%s: config says L=%d NH=%d, fixture differs", name, c->n_layers, c->n_heads);
    CHECK(strcmp(c->architecture, json_string_value(json_object_get(fixture, "architecture"))) == 0,
          "%s: architecture %s", name, c->architecture);

    const json_t *fx_examples = fixture_list(fixture, "examples", name), *g_examples = json_object_get(golden, "examples");
    const int n = (int)json_array_size(fx_examples);
    CHECK(n >= (int)json_array_size(g_examples) && n > 0, "%s: fixture has %d examples", name, n);
    example *ex = calloc((size_t)n, sizeof *ex);
    lens_activations *single = calloc((size_t)n, sizeof *single);
    int *lengths = calloc((size_t)n, sizeof *lengths), N = 0;
    if (!ex || !single || !lengths) goto out_free;
    for (int i = 0; i < n; i++) {
        const json_t *e = json_array_get(fx_examples, (size_t)i);
        int n_types = 0;
        snprintf(ex[i].name, sizeof ex[i].name, "%s/%s", name, json_string_value(json_object_get(e, "name")));
        ex[i].ids = json_ints(json_object_get(e, "input_ids"), &ex[i].T);
        ex[i].type_ids = json_ints(json_object_get(e, "token_type_ids"), &n_types);
        ex[i].fixture = e;
        ex[i].golden = i < (int)json_array_size(g_examples) ? json_array_get(g_examples, (size_t)i) : NULL;
        CHECK(ex[i].ids && ex[i].type_ids && ex[i].T > 0 && n_types == ex[i].T, "%s: fixture example %d", name, i);
        if (!ex[i].ids || !ex[i].type_ids || ex[i].T <= 0 || n_types != ex[i].T) goto out_free;
        lengths[i] = ex[i].T;
        N += ex[i].T;
    }

    /* each example alone */
    for (int i = 0; i < n; i++) {
        if (forward(m, 1, &ex[i].T, ex[i].ids, ex[i].type_ids, &single[i])) continue;
        check_fixture(m, &single[i], 0, &ex[i]);
        if (ex[i].golden) check_golden(m, &single[i], 0, &ex[i]);
        check_attn_identities(m, &single[i], 0, ex[i].T, ex[i].name);
    }

    /* all examples in one packed batch */
    int *ids = malloc((size_t)N * sizeof *ids), *type_ids = malloc((size_t)N * sizeof *type_ids);
    lens_activations batch;
    if (ids && type_ids) {
        for (int i = 0, row = 0; i < n; row += ex[i].T, i++) {
            memcpy(ids + row, ex[i].ids, (size_t)ex[i].T * sizeof *ids);
            memcpy(type_ids + row, ex[i].type_ids, (size_t)ex[i].T * sizeof *ids);
        }
        if (forward(m, n, lengths, ids, type_ids, &batch) == 0) {
            for (int i = 0; i < n; i++) {
                check_batch_vs_single(m, &batch, i, &single[i], &ex[i]);
                check_attn_identities(m, &batch, i, ex[i].T, ex[i].name);
            }
            lens_activations_free(&batch);
        }
    }
    free(ids), free(type_ids);

out_free:
    for (int i = 0; ex && single && i < n; i++) {
        free(ex[i].ids), free(ex[i].type_ids);
        lens_activations_free(&single[i]);
    }
    free(ex), free(single), free(lengths);
out:
    lens_model_free(m);
    json_decref(fixture);
    json_decref(golden);
}

/* ---------------------------------------------------------------- bad folders */

static void expect_load_failure(const char *dir, const char *why)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m == NULL, "lens_model_load on %s succeeded", why);
    CHECK(err.code != LENS_OK && err.msg[0] != '\0', "lens_model_load on %s: no error message", why);
    printf("  %s -> %s: %s\n", why, lens_status_name(err.code), err.msg);
    lens_model_free(m);
}

static void test_bad_folders(void)
{
    printf("bad model folders\n");
    expect_load_failure("/nonexistent/lensd-test-model", "a nonexistent folder");

    static const char *const bad_configs[][2] = {
        {"{\"model_type\": \"bert\", \"hidden_size\": 12", "truncated config.json"},
        {"[1, 2, 3]", "config.json that is not an object"},
        {"{\"model_type\": \"bert\", \"architectures\": [\"BertModel\"], \"hidden_size\": \"big\"}",
         "config.json with a string hidden_size"},
    };
    char tmpl[] = "/tmp/lens-test-models-XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL, "mkdtemp failed");
    if (!dir) return;
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    for (size_t i = 0; i < sizeof bad_configs / sizeof bad_configs[0]; i++) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL, "cannot write %s", path);
        if (!f) break;
        fputs(bad_configs[i][0], f);
        fclose(f);
        expect_load_failure(dir, bad_configs[i][1]);
    }
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    test_bad_folders();
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("shared checkpoints not found (../shared/models or $LENS_SHARED): model accuracy not tested");
    } else {
        for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) test_model(shared, MODELS[i]);
    }
    return check_done("test_models");
}
