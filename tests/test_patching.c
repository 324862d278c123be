/* test_patching.c - activation patching of the residual stream
 * (core/analysis/patching.c) against the float64 reference
 * tests/reference/patching_reference.py, which patches the row inside the
 * model's own blocks (families_reference.py), and its identities.
 *
 * Models: the shared bert-tiny-sst2 classifier and a random GPT-2 micro
 * causal LM; clean and corrupt differ in one or two tokens. Every F_lt and
 * the clean and corrupt objectives within 1e-5 relative (+ 1e-6 absolute:
 * float32 forwards against float64, objectives O(1)); every effect =
 * (F_lt − F_corrupt) / (F_clean − F_corrupt) as returned.
 *
 * Identities: patching every row of the clean residual at layer 0 gives the
 * clean logits bit for bit; at layer 0 a position whose clean and corrupt
 * tokens agree changes nothing (effect 0 within 1e-5: the batched copies
 * against the single corrupt run); on a causal LM a patch at a position
 * after the objective's row changes nothing either. Refusals: a masked LM, a
 * target outside the outputs. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/patching.h"
#include "tests/check.h"
#include "tests/fixture.h"
#include "tests/reference_run.h"

#define REFERENCE "tests/reference/patching_reference.py"

static const int CLEAN_BERT[] = {101, 1037, 2307, 3185, 2007, 2019, 6659, 5896, 102};
static const int CORRUPT_BERT[] = {101, 1037, 6659, 3185, 2007, 2019, 2307, 5896, 102};
static const int CLEAN_MICRO[] = {0, 300, 301, 302, 303, 304, 500, 42, 999, 7, 2};
static const int CORRUPT_MICRO[] = {0, 300, 17, 302, 303, 304, 500, 42, 998, 7, 2};

static json_t *reference(const char *dir, const int *clean, const int *corrupt, int T, const lens_patching_result *r)
{
    char extra[600];
    int n = snprintf(extra, sizeof extra, ", \"target\": %d, \"kind\": \"%s\", \"position\": %d", r->target,
                     lens_objective_name(r->objective.kind), r->objective.position);
    if (r->objective.foil >= 0) n += snprintf(extra + n, sizeof extra - n, ", \"foil\": %d", r->objective.foil);
    n += snprintf(extra + n, sizeof extra - n, ", \"corrupt\": [");
    for (int t = 0; t < T; t++) n += snprintf(extra + n, sizeof extra - n, "%d%s", corrupt[t], t + 1 < T ? ", " : "]");
    char *req = reference_request(dir, clean, T, extra);
    json_t *ref = req ? reference_run(REFERENCE, req) : NULL;
    free(req);
    return ref;
}

static int close_to(double got, double want) { return fabs(got - want) <= 1e-6 + 1e-5 * fabs(want); }

static void check_model(const char *name, const char *dir, const int *clean, const int *corrupt, int T,
                        const lens_objective *obj, int with_reference)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", name, err.msg);
    if (!m) return;
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, C = c->d_model, lm = c->task == LENS_TASK_CAUSAL_LM;
    const lens_patching_opts o = {.target = -1, .objective = obj};
    lens_patching_result r;
    if (lens_patching_resid(m, clean, corrupt, T, &o, &r, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        lens_model_free(m);
        return;
    }
    CHECK(fabs(r.clean - r.corrupt) > 1e-4, "%s: clean %.6g and corrupt %.6g differ", name, r.clean, r.corrupt);
    int effects_ok = 1, same_ok = 1, after_ok = 1;
    for (int l = 0; l < L; l++)
        for (int t = 0; t < T; t++) {
            const double v = r.value[l * T + t], e = r.effect[l * T + t];
            effects_ok &= fabs(e - (v - r.corrupt) / (r.clean - r.corrupt)) <= 1e-12 * fmax(1, fabs(e));
            if (l == 0 && clean[t] == corrupt[t]) same_ok &= fabs(e) <= 1e-5;
            if (lm && t > r.objective.position) after_ok &= fabs(e) <= 1e-5;
        }
    CHECK(effects_ok, "%s: effect = (patched - corrupt) / (clean - corrupt)", name);
    CHECK(same_ok, "%s: layer 0, equal tokens: effect 0", name);
    CHECK(after_ok, "%s: a causal LM's rows after the objective's position: effect 0", name);
    /* the whole clean residual at layer 0: the clean run */
    float *x0 = malloc(sizeof(float) * T * C);
    unsigned char *all = malloc((size_t)T);
    memset(all, 1, (size_t)T);
    lens_activations a, b;
    const lens_batch bc = {.n_seqs = 1, .lengths = &T, .ids = clean}, bx = {.n_seqs = 1, .lengths = &T, .ids = corrupt};
    const lens_forward_opts keep = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_LOGITS};
    if (x0 && !lens_forward(m, &bc, &keep, &a, &err)) {
        memcpy(x0, lens_act_hidden(m, &a, 0, 0), sizeof(float) * T * C);
        const lens_forward_opts po = {.keep = LENS_KEEP_LOGITS, .patch_layer = 0, .patch_src = x0, .patch_rows = all};
        if (!lens_forward(m, &bx, &po, &b, &err)) {
            const size_t K = lm ? (size_t)T * c->vocab_size : (size_t)c->n_labels;
            CHECK(!memcmp(lens_act_logits(m, &a, 0), lens_act_logits(m, &b, 0), sizeof(float) * K),
                  "%s: the whole clean residual at layer 0 gives the clean logits", name);
            lens_activations_free(&b);
        }
        lens_activations_free(&a);
    }
    free(x0), free(all);
    json_t *ref = with_reference ? reference(dir, clean, corrupt, T, &r) : NULL;
    CHECK(!with_reference || ref, "%s: the reference script failed", name);
    if (ref) {
        const double rc = json_number_value(json_object_get(ref, "clean"));
        const double rx = json_number_value(json_object_get(ref, "corrupt"));
        CHECK(close_to(r.clean, rc) && close_to(r.corrupt, rx), "%s: clean %.9g corrupt %.9g, reference %.9g %.9g",
              name, r.clean, r.corrupt, rc, rx);
        double worst = 0;
        int bad = 0;
        const json_t *value = json_object_get(ref, "value");
        for (int l = 0; l < L; l++)
            for (int t = 0; t < T; t++) {
                const double want = json_number_value(json_array_get(json_array_get(value, l), t));
                bad += !close_to(r.value[l * T + t], want);
                worst = fmax(worst, fabs(r.value[l * T + t] - want));
            }
        CHECK(json_array_size(value) == (size_t)L && !bad, "%s: %d of %d patched objectives differ from the reference",
              name, bad, L * T);
        printf("  %-50s clean %.6f corrupt %.6f, %d x %d patched runs, max |diff| %.1e\n", name, r.clean, r.corrupt,
               L, T, worst);
        json_decref(ref);
    }
    lens_patching_result_free(&r);
    lens_patching_opts bad = o;
    bad.target = lm ? c->vocab_size : c->n_labels;
    CHECK(lens_patching_resid(m, clean, corrupt, T, &bad, &r, &err) && err.code == LENS_EINVAL, "%s: target refused",
          name);
    lens_model_free(m);
}

int main(void)
{
    const int with_reference = reference_available();
    const char *shared = check_shared_dir();
    if (shared) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/models/bert-tiny-sst2", shared);
        check_model("bert-tiny-sst2", dir, CLEAN_BERT, CORRUPT_BERT, (int)(sizeof CLEAN_BERT / sizeof *CLEAN_BERT),
                    NULL, with_reference);
    } else {
        SKIP("no ../shared: the shared BERT classifier is not compared");
    }
    char dir[] = "/tmp/lensd-patching-model-XXXXXX", name[96];
    const lens_objective diff = {.kind = LENS_OBJ_LOGIT_DIFFERENCE, .position = 6, .foil = 7};
    if (!micro_checkpoint("gpt2", "causal-lm", dir, name, sizeof name))
        check_model(name, dir, CLEAN_MICRO, CORRUPT_MICRO, (int)(sizeof CLEAN_MICRO / sizeof *CLEAN_MICRO), &diff,
                    with_reference);
    remove_dir(dir);
    char mlm[] = "/tmp/lensd-patching-mlm-XXXXXX";
    if (!micro_checkpoint("bert", "masked-lm", mlm, name, sizeof name)) {
        lens_err err = {0};
        lens_model *m = lens_model_load(mlm, &err);
        lens_patching_result r;
        const lens_patching_opts o = {.target = -1};
        CHECK(m && lens_patching_resid(m, CLEAN_MICRO, CORRUPT_MICRO, 5, &o, &r, &err) && err.code == LENS_EINVAL,
              "%s: refused (%s)", name, err.msg);
        lens_model_free(m);
    }
    remove_dir(mlm);
    return check_done("test_patching");
}
