/* test_demo_models.c - the demo models committed in models/ (trained by
 * scripts/train-demo.sh) load and give known outputs.
 *
 * Reference: tests/fixtures/demo_models.json, written by
 * tests/reference/demo_models_reference.py with an independent PyTorch
 * forward pass and its own WordPiece / GPT-2 BPE tokenizers. Per model:
 *   - the folder loads, its architecture, task and sizes are the fixture's
 *     config, model.safetensors is under 8 MB, MODEL_CARD.md is there;
 *   - lensd's tokenizer gives the fixture's input ids (exact);
 *   - logits agree with PyTorch to 1e-4 absolute: float32 GEMMs of OpenBLAS
 *     vs PyTorch accumulate in different orders, ~1e-6 on these 2-layer models
 *     (the bar tests/test_models.c uses for the shared checkpoints);
 *   - demo-sst2 and demo-identifiable label the obvious sentences right
 *     (the wanted label is written by hand in the reference script, not taken
 *     from the model);
 *   - demo-mlm's 5 best guesses at [MASK] are PyTorch's and include an
 *     evaluative word (a list below);
 *   - demo-gpt2's perplexity on a fixed WikiText-2 valid passage equals the
 *     reference's (1e-4 relative) and stays under GPT2_MAX_PERPLEXITY.
 * Models are loaded from models/ relative to the repository root, where
 * scripts/run-tests.sh runs the tests. A missing model fails: they are in
 * the repository. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/model/model.h"
#include "core/io/tokenizer.h"
#include "tests/check.h"
#include "tests/fixture.h"

#define TOL_LOGITS 1e-4
#define MAX_MODEL_BYTES (8 * 1000 * 1000) /* the "< 8 MB" per demo model */
/* demo-gpt2 on GPT2_PASSAGE of the reference script (69 BPE tokens, no
 * context before it): measured 217.25 (lensd and PyTorch agree); the bound
 * leaves 20 % for retraining with another seed. Uniform guessing over the
 * 4000 pieces would give 4000, the checkpoint after 2 of 8 epochs ~360. */
#define GPT2_MAX_PERPLEXITY 260.0

static const char *const MODELS[] = {"demo-sst2", "demo-mlm", "demo-identifiable", "demo-gpt2"};

/* Evaluative words: a masked LM trained on movie reviews should have one of
 * them among its 5 best guesses for "this movie is [MASK] ." and "one of the
 * [MASK] films of the year ." (not taken from the model's output). */
static const char *const PLAUSIBLE[] = {
    "good", "bad", "great", "funny", "fun", "boring", "best", "worst", "better", "worse", "terrible", "awful",
    "entertaining", "beautiful", "interesting", "enjoyable", "wonderful", "dull", "excellent", "brilliant",
    "perfect", "mediocre", "hilarious", "charming", "moving", "predictable", "compelling", "engaging",
    "touching", "smart", "clever", "stupid", "finest", "funniest", "greatest", "worthwhile", "spectacular",
};

static int *json_ints(const json_t *j, int *n_out)
{
    int n = json_is_array(j) ? (int)json_array_size(j) : 0;
    int *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    for (int i = 0; out && i < n; i++) out[i] = (int)json_integer_value(json_array_get(j, (size_t)i));
    *n_out = n;
    return out;
}

static double close_json(const char *what, const float *got, const json_t *want_json, size_t n)
{
    float *want = json_floats(want_json, n, what);
    double d = got && want ? check_close(what, got, want, n, TOL_LOGITS, 0) : -1;
    free(want);
    return d;
}

static void check_config(const char *name, const lens_model *m, const json_t *cfg)
{
    const lens_config *c = &m->cfg;
    const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
    CHECK(arch && !strcmp(arch, c->architecture), "%s: architecture %s, fixture %s", name, c->architecture,
          arch ? arch : "?");
    lens_task want_task = !strcmp(name, "demo-mlm") ? LENS_TASK_MASKED_LM
                          : !strcmp(name, "demo-gpt2") ? LENS_TASK_CAUSAL_LM
                                                       : LENS_TASK_CLASSIFICATION;
    CHECK(c->task == want_task, "%s: task %s, want %s", name, lens_task_name(c->task), lens_task_name(want_task));
    CHECK(!c->random_weights, "%s: config says random weights", name);
    const json_t *v;
    int want_vocab = (int)json_integer_value(json_object_get(cfg, "vocab_size"));
    CHECK(c->vocab_size == want_vocab && lens_tokenizer_vocab_size(m->tok) <= c->vocab_size,
          "%s: vocab_size %d (tokenizer %d), fixture %d", name, c->vocab_size, lens_tokenizer_vocab_size(m->tok),
          want_vocab);
    if ((v = json_object_get(cfg, "num_hidden_layers")) || (v = json_object_get(cfg, "n_layer")))
        CHECK(c->n_layers == json_integer_value(v), "%s: %d layers", name, c->n_layers);
    if ((v = json_object_get(cfg, "num_attention_heads")) || (v = json_object_get(cfg, "n_head")))
        CHECK(c->n_heads == json_integer_value(v), "%s: %d heads", name, c->n_heads);
    if ((v = json_object_get(cfg, "head_dim_key"))) CHECK(c->d_head_k == json_integer_value(v), "%s: DK %d", name, c->d_head_k);
    if ((v = json_object_get(cfg, "head_dim_value"))) CHECK(c->d_head_v == json_integer_value(v), "%s: DV %d", name, c->d_head_v);
    if (!strcmp(name, "demo-identifiable"))
        CHECK(c->d_head_v >= c->max_positions && c->d_head_k < c->d_head_v,
              "%s: DV %d must cover the %d positions (identifiable) with DK %d smaller", name, c->d_head_v,
              c->max_positions, c->d_head_k);

    char path[256];
    struct stat st;
    snprintf(path, sizeof path, "models/%s/model.safetensors", name);
    CHECK(stat(path, &st) == 0 && st.st_size < MAX_MODEL_BYTES, "%s: %lld bytes, over %d", path,
          (long long)st.st_size, MAX_MODEL_BYTES);
    snprintf(path, sizeof path, "models/%s/MODEL_CARD.md", name);
    CHECK(stat(path, &st) == 0 && st.st_size > 200, "%s missing or empty", path);
    snprintf(path, sizeof path, "models/%s/optimizer.safetensors", name);
    CHECK(stat(path, &st) != 0, "%s: optimizer state should not be committed", path);
}

/* Tokenize ex["text"], compare with ex["input_ids"], run the forward pass. */
static const float *run_example(const char *name, const lens_model *m, const json_t *ex, lens_activations *act,
                                int *T_out)
{
    const char *text = json_string_value(json_object_get(ex, "text"));
    int n_want = 0, n = 0;
    int *want = json_ints(json_object_get(ex, "input_ids"), &n_want);
    lens_token *tok = NULL;
    lens_err err = {0};
    int rc = text ? lens_tokenize(m->tok, text, strlen(text), NULL, 0, &tok, &n, &err) : -1;
    CHECK(rc == 0, "%s: tokenize: %s", name, err.msg);
    int same = rc == 0 && n == n_want;
    for (int i = 0; same && i < n; i++) same = tok[i].id == want[i];
    CHECK(same, "%s \"%s\": lensd gives %d ids, the reference tokenizer %d (first %d vs %d)", name, text ? text : "?",
          n, n_want, n > 0 ? tok[0].id : -1, n_want > 0 ? want[0] : -1);
    free(tok);
    *T_out = n_want;
    memset(act, 0, sizeof *act);
    lens_batch b = {.n_seqs = 1, .lengths = &n_want, .ids = want};
    lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
    rc = n_want > 0 ? lens_forward(m, &b, &opts, act, &err) : -1;
    CHECK(rc == 0, "%s: forward: %s", name, err.msg);
    free(want);
    return rc == 0 ? lens_act_logits(m, act, 0) : NULL;
}

static void check_classifier(const char *name, const lens_model *m, const json_t *examples)
{
    const int K = m->cfg.n_labels;
    for (size_t e = 0; e < json_array_size(examples); e++) {
        const json_t *ex = json_array_get(examples, e);
        lens_activations act;
        int T;
        const float *logits = run_example(name, m, ex, &act, &T);
        char what[200];
        snprintf(what, sizeof what, "%s example %zu logits", name, e);
        double d = close_json(what, logits, json_object_get(ex, "logits"), (size_t)K);
        if (logits) {
            int best = 0;
            for (int k = 1; k < K; k++)
                if (logits[k] > logits[best]) best = k;
            const char *got = m->cfg.labels ? m->cfg.labels[best] : "?";
            const char *want = json_string_value(json_object_get(ex, "want_label"));
            CHECK(want && !strcmp(got, want), "%s: \"%s\" labelled %s, want %s", name,
                  json_string_value(json_object_get(ex, "text")), got, want ? want : "?");
            printf("  %-18s %-8s (%+.3f %+.3f)  vs PyTorch %.2g  %s\n", name, got, logits[0], logits[K - 1], d,
                   json_string_value(json_object_get(ex, "text")));
        }
        lens_activations_free(&act);
    }
}

/* logits[t][0:8] of every position against the fixture's logits_first_8;
 * returns the largest difference. */
static double check_first_8(const char *name, size_t e, const json_t *ex, const float *logits, int T, size_t V)
{
    double worst = 0;
    float *want8 = json_floats(json_object_get(ex, "logits_first_8"), (size_t)T * 8, name);
    for (int t = 0; logits && want8 && t < T; t++) {
        char what[200];
        snprintf(what, sizeof what, "%s example %zu logits[%d][0:8]", name, e, t);
        double d = check_close(what, logits + t * V, want8 + t * 8, 8, TOL_LOGITS, 0);
        if (d > worst) worst = d;
    }
    free(want8);
    return worst;
}

static void check_mlm(const char *name, const lens_model *m, const json_t *examples)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    for (size_t e = 0; e < json_array_size(examples); e++) {
        const json_t *ex = json_array_get(examples, e);
        lens_activations act;
        int T;
        const float *logits = run_example(name, m, ex, &act, &T);
        char what[200];
        double worst = check_first_8(name, e, ex, logits, T, V);
        const json_t *masks = json_object_get(ex, "mask_positions");
        CHECK(json_array_size(masks) > 0, "%s example %zu: no [MASK]", name, e);
        for (size_t k = 0; logits && k < json_array_size(masks); k++) {
            int t = (int)json_integer_value(json_array_get(masks, k));
            snprintf(what, sizeof what, "%s example %zu logits at [MASK] (position %d, all %zu)", name, e, t, V);
            double d = close_json(what, logits + t * V, json_array_get(json_object_get(ex, "mask_logits"), k), V);
            if (d > worst) worst = d;
            /* the 5 best ids, best first */
            int top[5] = {-1, -1, -1, -1, -1};
            const float *row = logits + t * V;
            for (size_t i = 0; i < V; i++)
                for (int r = 0; r < 5; r++)
                    if (top[r] < 0 || row[i] > row[top[r]]) {
                        memmove(top + r + 1, top + r, (size_t)(4 - r) * sizeof *top);
                        top[r] = (int)i;
                        break;
                    }
            int plausible = 0;
            for (int r = 0; r < 5; r++) {
                const char *word = lens_tokenizer_piece(m->tok, top[r]);
                for (size_t p = 0; word && p < sizeof PLAUSIBLE / sizeof *PLAUSIBLE; p++)
                    plausible |= !strcmp(word, PLAUSIBLE[p]);
            }
            int n5 = 0;
            int *want5 = json_ints(json_array_get(json_object_get(ex, "mask_top5_ids"), k), &n5);
            CHECK(n5 == 5 && want5 && !memcmp(top, want5, sizeof top), "%s: top 5 ids at [MASK] differ from PyTorch's",
                  name);
            free(want5);
            CHECK(plausible, "%s: \"%s\": no evaluative word among the 5 best guesses at [MASK] (best \"%s\")", name,
                  json_string_value(json_object_get(ex, "text")), lens_tokenizer_piece(m->tok, top[0]));
            printf("  %-18s [MASK] -> %s, %s, %s, %s, %s  vs PyTorch %.2g  %s\n", name,
                   lens_tokenizer_piece(m->tok, top[0]), lens_tokenizer_piece(m->tok, top[1]),
                   lens_tokenizer_piece(m->tok, top[2]), lens_tokenizer_piece(m->tok, top[3]),
                   lens_tokenizer_piece(m->tok, top[4]), worst, json_string_value(json_object_get(ex, "text")));
        }
        lens_activations_free(&act);
    }
}

static void check_gpt2(const char *name, const lens_model *m, const json_t *examples)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    for (size_t e = 0; e < json_array_size(examples); e++) {
        const json_t *ex = json_array_get(examples, e);
        lens_activations act;
        int T;
        const float *logits = run_example(name, m, ex, &act, &T);
        char what[200];
        double worst = check_first_8(name, e, ex, logits, T, V);
        snprintf(what, sizeof what, "%s logits[%d] (last position, all %zu)", name, T - 1, V);
        double d = close_json(what, logits ? logits + (size_t)(T - 1) * V : NULL, json_object_get(ex, "last_logits"), V);
        if (d > worst) worst = d;
        int n_ids = 0;
        int *ids = json_ints(json_object_get(ex, "input_ids"), &n_ids);
        if (logits && ids && n_ids == T && T > 1) {
            /* mean next-token negative log-likelihood over positions 0..T-2 */
            double nll = 0;
            for (int t = 0; t + 1 < T; t++) {
                const float *row = logits + (size_t)t * V;
                double mx = row[0], sum = 0;
                for (size_t i = 1; i < V; i++) if (row[i] > mx) mx = row[i];
                for (size_t i = 0; i < V; i++) sum += exp((double)row[i] - mx);
                nll += mx + log(sum) - row[ids[t + 1]];
            }
            nll /= T - 1;
            double want_nll = json_number_value(json_object_get(ex, "nll"));
            CHECK(fabs(nll - want_nll) <= 1e-4 * want_nll, "%s: nll %.6f, reference %.6f", name, nll, want_nll);
            CHECK(exp(nll) < GPT2_MAX_PERPLEXITY, "%s: perplexity %.2f on the passage, over the bound %.1f", name,
                  exp(nll), GPT2_MAX_PERPLEXITY);
            printf("  %-18s perplexity %.2f on a %d-token WikiText-2 valid passage (bound %.1f), vs PyTorch %.2g\n",
                   name, exp(nll), T, GPT2_MAX_PERPLEXITY, worst);
        }
        free(ids);
        lens_activations_free(&act);
    }
}

int main(void)
{
    json_t *fixture = fixture_load("tests/fixtures/demo_models.json");
    const json_t *models = fixture_list(fixture, "models", "demo_models.json");
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) {
        const char *name = MODELS[i];
        char dir[128];
        snprintf(dir, sizeof dir, "models/%s", name);
        lens_err err = {0};
        lens_model *m = lens_model_load(dir, &err);
        CHECK(m != NULL, "%s: %s", dir, err.msg);
        const json_t *fx = json_object_get(models, name);
        CHECK(fx != NULL, "%s: not in tests/fixtures/demo_models.json", name);
        if (!m || !fx) {
            lens_model_free(m);
            continue;
        }
        check_config(name, m, json_object_get(fx, "config"));
        const json_t *examples = fixture_list(fx, "examples", name);
        if (m->cfg.task == LENS_TASK_CLASSIFICATION) check_classifier(name, m, examples);
        else if (m->cfg.task == LENS_TASK_MASKED_LM) check_mlm(name, m, examples);
        else if (m->cfg.task == LENS_TASK_CAUSAL_LM) check_gpt2(name, m, examples);
        lens_model_free(m);
    }
    json_decref(fixture);
    return check_done("test_demo_models");
}
