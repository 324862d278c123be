/* test_ablation.c - head and MLP ablation (core/analysis/ablation.c)
 * against the float64 reference tests/reference/ablation_reference.py,
 * which replaces the heads' context rows and the MLPs' outputs inside the
 * model's own blocks (families_reference.py), and its identities.
 *
 * Models: the shared bert-tiny-sst2 classifier (post-norm: the MLP's output
 * goes into the block's last norm) and a random GPT-2 micro causal LM
 * (pre-norm). Cases: zero and mean ablation of heads and MLPs together,
 * mean over the request's positions and over reference sequences, and the
 * objectives probability, log_probability and logit_difference at an inner
 * position. The clean and ablated objectives within 1e-5 relative of the
 * reference (1e-6 absolute: float32 forwards against float64, the
 * objectives O(1)), every logit within 1e-4 (+ 1e-4 relative).
 *
 * Identities: ablating nothing gives the clean logits bit for bit; a zero
 * ablation of heads equals lens_forward's head_mask (HF head_mask = 0).
 * Refusals: a target or foil outside the outputs, a position outside the
 * tokens, a masked LM. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/ablation.h"
#include "tests/check.h"
#include "tests/fixture.h"
#include "tests/reference_run.h"

#define REFERENCE "tests/reference/ablation_reference.py"

static const int IDS_BERT[] = {101, 1037, 2307, 3185, 2007, 2019, 6659, 5896, 102};
static const int IDS_MICRO[] = {0, 300, 301, 302, 303, 304, 500, 42, 999, 7, 2};
static const int REF_IDS[] = {5, 17, 300, 8, 9, 101, 42, 7, 30, 31, 32, 33, 102}; /* two sequences: 5 + 8 */
static const int REF_LENGTHS[] = {5, 8};

typedef struct {
    const char *what;
    int heads[4][2]; /* [layer (1..L), head]; layer 0 ends */
    int mlps[3];     /* layers 1..L; 0 ends */
    lens_ablate_mode mode;
    int use_ref;
    lens_objective_kind kind;
    int position, foil; /* causal LM: the objective's row (-1 last); foil: logit_difference */
} ablation_case;

/* the reference's request for case k: ids, the ablated set, mode, reference rows, objective */
static json_t *reference(const char *dir, const int *ids, int T, const ablation_case *k, int target, int position)
{
    char extra[1200];
    int n = snprintf(extra, sizeof extra, ", \"mode\": \"%s\", \"target\": %d, \"kind\": \"%s\", \"position\": %d",
                     k->mode == LENS_ABLATE_MEAN ? "mean" : "zero", target, lens_objective_name(k->kind), position);
    if (k->foil >= 0) n += snprintf(extra + n, sizeof extra - n, ", \"foil\": %d", k->foil);
    n += snprintf(extra + n, sizeof extra - n, ", \"heads\": [");
    for (int i = 0; i < 4 && k->heads[i][0]; i++)
        n += snprintf(extra + n, sizeof extra - n, "%s[%d, %d]", i ? ", " : "", k->heads[i][0], k->heads[i][1]);
    n += snprintf(extra + n, sizeof extra - n, "], \"mlps\": [");
    for (int i = 0; i < 3 && k->mlps[i]; i++) n += snprintf(extra + n, sizeof extra - n, "%s%d", i ? ", " : "", k->mlps[i]);
    n += snprintf(extra + n, sizeof extra - n, "]");
    if (k->use_ref) {
        n += snprintf(extra + n, sizeof extra - n, ", \"reference\": [[");
        for (int s = 0, t = 0; s < 2; s++)
            for (int j = 0; j < REF_LENGTHS[s]; j++, t++)
                n += snprintf(extra + n, sizeof extra - n, "%d%s", REF_IDS[t],
                              j + 1 < REF_LENGTHS[s] ? ", " : s == 0 ? "], [" : "]]");
    }
    char *req = reference_request(dir, ids, T, extra);
    json_t *ref = req ? reference_run(REFERENCE, req) : NULL;
    free(req);
    return ref;
}

static void check_case(const char *name, const char *dir, const lens_model *m, const int *ids, int T,
                       const ablation_case *k, int with_reference)
{
    const lens_config *c = &m->cfg;
    char what[200];
    snprintf(what, sizeof what, "%s: %s", name, k->what);
    unsigned char *heads = calloc((size_t)c->n_layers * c->n_heads, 1), *mlps = calloc((size_t)c->n_layers, 1);
    for (int i = 0; i < 4 && k->heads[i][0]; i++) {
        CHECK(k->heads[i][0] <= c->n_layers && k->heads[i][1] < c->n_heads, "%s: head (%d, %d) exists", what,
              k->heads[i][0], k->heads[i][1]);
        if (k->heads[i][0] <= c->n_layers && k->heads[i][1] < c->n_heads)
            heads[(k->heads[i][0] - 1) * c->n_heads + k->heads[i][1]] = 1;
    }
    for (int i = 0; i < 3 && k->mlps[i]; i++) mlps[k->mlps[i] - 1] = 1;
    const lens_objective obj = {.kind = k->kind, .position = k->position, .foil = k->foil};
    const lens_ablation_opts o = {.heads = heads, .mlps = mlps, .mode = k->mode, .target = -1, .objective = &obj,
                                  .ref_ids = k->use_ref ? REF_IDS : NULL, .ref_lengths = k->use_ref ? REF_LENGTHS : NULL,
                                  .n_ref = k->use_ref ? 2 : 0};
    lens_ablation_result r;
    lens_err err = {0};
    if (lens_ablation_run(m, ids, NULL, T, &o, &r, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        free(heads), free(mlps);
        return;
    }
    CHECK(fabs(r.ablated - r.clean) > 1e-6, "%s: the ablation moves the objective (%.8g -> %.8g)", what, r.clean,
          r.ablated);
    json_t *ref = with_reference ? reference(dir, ids, T, k, r.target, r.objective.position) : NULL;
    CHECK(!with_reference || ref, "%s: the reference script failed", what);
    if (ref) {
        const double clean = json_number_value(json_object_get(ref, "clean"));
        const double ablated = json_number_value(json_object_get(ref, "ablated"));
        CHECK(fabs(r.clean - clean) <= 1e-6 + 1e-5 * fabs(clean), "%s: clean %.9g, reference %.9g", what, r.clean,
              clean);
        CHECK(fabs(r.ablated - ablated) <= 1e-6 + 1e-5 * fabs(ablated), "%s: ablated %.9g, reference %.9g", what,
              r.ablated, ablated);
        float *zc = json_floats(json_object_get(ref, "logits_clean"), (size_t)r.K, what);
        float *za = json_floats(json_object_get(ref, "logits_ablated"), (size_t)r.K, what);
        if (zc && za) {
            char label[300];
            snprintf(label, sizeof label, "%s: clean logits vs the reference", what);
            check_close(label, r.logits_clean, zc, (size_t)r.K, 1e-4, 1e-4);
            snprintf(label, sizeof label, "%s: ablated logits vs the reference", what);
            const double d = check_close(label, r.logits_ablated, za, (size_t)r.K, 1e-4, 1e-4);
            printf("  %-60s objective %.6f -> %.6f (ref %.6f), logits max |diff| %.1e\n", what, r.clean, r.ablated,
                   ablated, d);
        }
        free(zc), free(za);
        json_decref(ref);
    }
    lens_ablation_result_free(&r);
    free(heads), free(mlps);
}

/* Nothing ablated: the clean logits bit for bit; zero-ablated heads: the forward's head_mask. */
static void check_identities(const char *name, const lens_model *m, const int *ids, int T)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, NH = c->n_heads;
    lens_err err = {0};
    lens_ablation_result r;
    const lens_ablation_opts none = {.mode = LENS_ABLATE_MEAN, .target = -1};
    if (!lens_ablation_run(m, ids, NULL, T, &none, &r, &err)) {
        CHECK(!memcmp(r.logits_clean, r.logits_ablated, sizeof(float) * r.K) && r.clean == r.ablated,
              "%s: ablating nothing changes nothing (%.9g, %.9g)", name, r.clean, r.ablated);
        lens_ablation_result_free(&r);
    } else {
        CHECK(0, "%s: %s", name, err.msg);
    }
    unsigned char *heads = calloc((size_t)L * NH, 1), *keep = malloc((size_t)L * NH);
    heads[0] = heads[(L - 1) * NH + NH - 1] = 1;
    for (int i = 0; i < L * NH; i++) keep[i] = !heads[i];
    const lens_ablation_opts zero = {.heads = heads, .mode = LENS_ABLATE_ZERO, .target = -1};
    lens_activations act;
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .head_mask = keep};
    if (!lens_ablation_run(m, ids, NULL, T, &zero, &r, &err) && !lens_forward(m, &b, &fo, &act, &err)) {
        const float *z = lens_act_logits(m, &act, 0) + (c->task == LENS_TASK_CAUSAL_LM ? (size_t)(T - 1) * r.K : 0);
        CHECK(!memcmp(z, r.logits_ablated, sizeof(float) * r.K), "%s: zero-ablated heads = head_mask", name);
        lens_activations_free(&act);
        lens_ablation_result_free(&r);
    } else {
        CHECK(0, "%s: %s", name, err.msg);
    }
    const int K = c->task == LENS_TASK_CAUSAL_LM ? c->vocab_size : c->n_labels;
    lens_ablation_opts bad = zero;
    bad.target = K;
    CHECK(lens_ablation_run(m, ids, NULL, T, &bad, &r, &err) && err.code == LENS_EINVAL, "%s: target %d refused",
          name, K);
    const lens_objective diff = {.kind = LENS_OBJ_LOGIT_DIFFERENCE, .position = -1, .foil = K};
    bad = zero, bad.target = 0, bad.objective = &diff;
    CHECK(lens_ablation_run(m, ids, NULL, T, &bad, &r, &err) && err.code == LENS_EINVAL, "%s: foil %d refused", name,
          K);
    if (c->task == LENS_TASK_CAUSAL_LM) {
        const lens_objective far = {.kind = LENS_OBJ_LOGIT, .position = T, .foil = -1};
        bad = zero, bad.objective = &far;
        CHECK(lens_ablation_run(m, ids, NULL, T, &bad, &r, &err) && err.code == LENS_EINVAL,
              "%s: position %d refused", name, T);
    }
    free(heads), free(keep);
}

static void run_model(const char *name, const char *dir, const int *ids, int T, const ablation_case *cases, int n,
                      int with_reference)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", name, err.msg);
    if (!m) return;
    printf("%s\n", name);
    for (int i = 0; i < n; i++) check_case(name, dir, m, ids, T, &cases[i], with_reference);
    check_identities(name, m, ids, T);
    lens_model_free(m);
}

static const ablation_case BERT_CASES[] = {
    {"zero: heads (1,0) (2,1), MLP 1", {{1, 0}, {2, 1}}, {1}, LENS_ABLATE_ZERO, 0, LENS_OBJ_PROBABILITY, -1, -1},
    {"mean over the request: heads (1,1) (2,0), MLP 2", {{1, 1}, {2, 0}}, {2}, LENS_ABLATE_MEAN, 0,
     LENS_OBJ_LOG_PROBABILITY, -1, -1},
    {"mean over references: head (2,1), MLPs 1 2", {{2, 1}}, {1, 2}, LENS_ABLATE_MEAN, 1, LENS_OBJ_LOGIT_DIFFERENCE,
     -1, 1}, /* foil: the class the model does not predict on IDS_BERT (it predicts 0) */
};

static const ablation_case GPT2_CASES[] = {
    {"zero: heads (1,0) (2,1), MLP 2", {{1, 0}, {2, 1}}, {2}, LENS_ABLATE_ZERO, 0, LENS_OBJ_PROBABILITY, -1, -1},
    {"mean over the request: heads (1,1) (2,0), MLP 1", {{1, 1}, {2, 0}}, {1}, LENS_ABLATE_MEAN, 0,
     LENS_OBJ_LOGIT_DIFFERENCE, 4, 7},
    {"mean over references: MLP 1, head (2,1)", {{2, 1}}, {1}, LENS_ABLATE_MEAN, 1, LENS_OBJ_LOG_PROBABILITY, 6, -1},
};

int main(void)
{
    const int with_reference = reference_available();
    const char *shared = check_shared_dir();
    const int n_bert = (int)(sizeof BERT_CASES / sizeof *BERT_CASES), n_gpt2 = (int)(sizeof GPT2_CASES / sizeof *GPT2_CASES);
    if (shared) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/models/bert-tiny-sst2", shared);
        run_model("bert-tiny-sst2", dir, IDS_BERT, (int)(sizeof IDS_BERT / sizeof *IDS_BERT), BERT_CASES, n_bert,
                  with_reference);
    } else {
        SKIP("no ../shared: the shared BERT classifier is not compared");
    }
    char dir[] = "/tmp/lensd-ablation-model-XXXXXX", name[96];
    if (!micro_checkpoint("gpt2", "causal-lm", dir, name, sizeof name))
        run_model(name, dir, IDS_MICRO, (int)(sizeof IDS_MICRO / sizeof *IDS_MICRO), GPT2_CASES, n_gpt2,
                  with_reference);
    remove_dir(dir);
    char mlm[] = "/tmp/lensd-ablation-mlm-XXXXXX";
    if (!micro_checkpoint("bert", "masked-lm", mlm, name, sizeof name)) {
        lens_err err = {0};
        lens_model *m = lens_model_load(mlm, &err);
        lens_ablation_result r;
        const lens_ablation_opts o = {.target = -1};
        CHECK(m && lens_ablation_run(m, IDS_MICRO, NULL, 5, &o, &r, &err) && err.code == LENS_EINVAL,
              "%s: refused (%s)", name, err.msg);
        lens_model_free(m);
    }
    remove_dir(mlm);
    return check_done("test_ablation");
}
