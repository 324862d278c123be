/* test_patching.c - activation patching (core/analysis/patching.c): every
 * exact grid against the float64 reference tests/reference/patching_reference.py
 * (which patches inside the model's own blocks and hooks,
 * families_reference.py), the identities, and attribution patching against
 * the exact effect of a tiny patched difference.
 *
 * Reference models: the shared bert-tiny-sst2 classifier and a random GPT-2
 * micro causal LM; clean and corrupt differ in one or two tokens. Every
 * patched F (resid, heads, heads_pos, mlps, mlps_pos) and the clean and
 * corrupt objectives within 1e-5 relative (+ 1e-6 absolute: float32
 * forwards against float64, objectives O(1)); every effect =
 * (F − F_corrupt) / (F_clean − F_corrupt) as returned. Attribution
 * patching's every entry, (a_clean − a_corrupt) · ∂F/∂a, against the
 * reference's autograd at the corrupt run in float64: within 1e-4 of the
 * grid's largest entry (float32 gradients through every layer; measured
 * at most 5.3e-6).
 *
 * Identities: patching the whole clean residual at layer 0 gives the clean
 * logits bit for bit; at layer 0 a position whose clean and corrupt tokens
 * agree changes nothing (effect 0 within 1e-5: the batched copies against
 * the single corrupt run), and with one token changed, patching that row is
 * the clean run (effect 1 within 1e-5); a patched head or MLP changes
 * nothing at a position where clean and corrupt agree below the first
 * change (per position grids, layer 0, causal LM); on a causal LM a patch
 * after the objective's row changes nothing.
 *
 * Attribution patching, on every classifier and causal-LM family of
 * tests/family_cases.h: for the entry of the resid, heads and mlps grids
 * with the largest |approximation| a, the exact change of F when the
 * activation moves by ε (clean − corrupt) (the forward's patch hooks), over
 * ε a, is 1 to first order: within 1e-1 at ε = 1e-2 (the second-order term)
 * and 1e-2 at ε = 1e-3, where |a| >= 0.1 (below, float32 noise of F is a
 * sizeable part of a change of 1e-3 a: the random classifiers' flat
 * logits); the same on the two reference models.
 * Refusals: a masked LM, a target outside the outputs. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/patching.h"
#include "tests/check.h"
#include "tests/family_cases.h"
#include "tests/fixture.h"
#include "tests/reference_run.h"

#define REFERENCE "tests/reference/patching_reference.py"
#define ALL_GRIDS ((1u << LENS_PATCH_GRIDS) - 1)

static const int CLEAN_BERT[] = {101, 1037, 2307, 3185, 2007, 2019, 6659, 5896, 102};
static const int CORRUPT_BERT[] = {101, 1037, 6659, 3185, 2007, 2019, 2307, 5896, 102};
static const int CLEAN_MICRO[] = {0, 300, 301, 302, 303, 304, 500, 42, 999, 7, 2};
static const int CORRUPT_MICRO[] = {0, 300, 17, 302, 303, 304, 500, 42, 998, 7, 2};
static const int ONE_CHANGE_MICRO[] = {0, 300, 301, 302, 303, 304, 500, 42, 998, 7, 2};

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

/* the nested numbers of a reference array, flattened in order into flat [n]; returns how many */
static size_t flatten(const json_t *v, double *flat, size_t n)
{
    if (json_is_number(v)) {
        if (n) flat[0] = json_number_value(v);
        return 1;
    }
    size_t got = 0, i;
    const json_t *e;
    json_array_foreach(v, i, e) got += flatten(e, flat + got, n > got ? n - got : 0);
    return got;
}

static void compare_reference(const char *name, const json_t *ref, const lens_patching_result *r)
{
    static const char *const keys[LENS_PATCH_GRIDS] = {"value", "heads", "heads_pos", "mlps", "mlps_pos"};
    const double rc = json_number_value(json_object_get(ref, "clean"));
    const double rx = json_number_value(json_object_get(ref, "corrupt"));
    CHECK(close_to(r->clean, rc) && close_to(r->corrupt, rx), "%s: clean %.9g corrupt %.9g, reference %.9g %.9g", name,
          r->clean, r->corrupt, rc, rx);
    for (int g = 0; g < LENS_PATCH_GRIDS; g++) {
        const lens_patching_grid *grid = &r->grid[g];
        double *want = malloc(sizeof(double) * grid->n), worst = 0;
        const size_t n = want ? flatten(json_object_get(ref, keys[g]), want, (size_t)grid->n) : 0;
        int bad = 0;
        for (int i = 0; i < grid->n && n == (size_t)grid->n; i++) {
            bad += !close_to(grid->value[i], want[i]);
            worst = fmax(worst, fabs(grid->value[i] - want[i]));
        }
        CHECK(grid->n > 0 && n == (size_t)grid->n && !bad, "%s %s: %zu reference entries for %d, %d differ", name,
              lens_patch_grid_name(g), n, grid->n, bad);
        printf("  %-40s %-9s %4d patched runs, max |diff| from the reference %.1e\n", name, lens_patch_grid_name(g),
               grid->n, worst);
        /* attribution patching: a = effect (F_clean − F_corrupt) against autograd's in float64 */
        const size_t na = want ? flatten(json_object_get(json_object_get(ref, "attribution"), keys[g]), want,
                                         (size_t)grid->n) : 0;
        double scale = 0, worst_a = 0;
        for (int i = 0; i < grid->n && na == (size_t)grid->n; i++) scale = fmax(scale, fabs(want[i]));
        bad = 0;
        for (int i = 0; i < grid->n && na == (size_t)grid->n; i++) {
            const double a = grid->attribution[i] * (r->clean - r->corrupt), d = fabs(a - want[i]);
            bad += d > 1e-7 + 1e-4 * scale;
            worst_a = fmax(worst_a, d / fmax(scale, 1e-300));
        }
        CHECK(na == (size_t)grid->n && !bad, "%s %s: %d attribution-patching entries differ from autograd's", name,
              lens_patch_grid_name(g), bad);
        printf("  %-40s %-9s attribution patching: max |diff| from autograd %.1e of the largest %.2g\n", name,
               lens_patch_grid_name(g), worst_a, scale);
        free(want);
    }
}

/* The identities of the exact grids (the header comment). */
static void check_identities(const char *name, const lens_model *m, const int *clean, const int *corrupt, int T,
                             const lens_patching_result *r)
{
    const int L = m->cfg.n_layers, NH = m->cfg.n_heads, lm = m->cfg.task == LENS_TASK_CAUSAL_LM;
    int first = 0;
    while (first < T && clean[first] == corrupt[first]) first++;
    int effects_ok = 1, same_ok = 1, after_ok = 1, before_ok = 1;
    for (int g = 0; g < LENS_PATCH_GRIDS; g++)
        for (int i = 0; i < r->grid[g].n; i++) {
            const double v = r->grid[g].value[i], e = r->grid[g].effect[i];
            effects_ok &= fabs(e - (v - r->corrupt) / (r->clean - r->corrupt)) <= 1e-12 * fmax(1, fabs(e));
        }
    for (int l = 0; l < L; l++)
        for (int t = 0; t < T; t++) {
            const double e = r->grid[LENS_PATCH_RESID].effect[l * T + t];
            if (l == 0 && clean[t] == corrupt[t]) same_ok &= fabs(e) <= 1e-5;
            if (lm && t > r->objective.position) after_ok &= fabs(e) <= 1e-5;
            /* below the first change a causal LM's rows are the same in both runs */
            for (int h = 0; lm && t < first && h < NH; h++)
                before_ok &= fabs(r->grid[LENS_PATCH_HEADS_POS].effect[(l * NH + h) * T + t]) <= 1e-5;
            if (lm && t < first) before_ok &= fabs(r->grid[LENS_PATCH_MLPS_POS].effect[l * T + t]) <= 1e-5;
        }
    CHECK(effects_ok, "%s: effect = (patched - corrupt) / (clean - corrupt)", name);
    CHECK(same_ok, "%s: layer 0, equal tokens: effect 0", name);
    CHECK(after_ok, "%s: a causal LM's rows after the objective's position: effect 0", name);
    CHECK(before_ok, "%s: a causal LM's heads and MLPs below the first changed token: effect 0", name);
}

/* The whole clean residual at layer 0 as the start of the corrupt run: the clean logits, bit for bit. */
static void check_whole_residual(const char *name, const lens_model *m, const int *clean, const int *corrupt, int T)
{
    lens_err err = {0};
    lens_activations a, b;
    const lens_batch bc = {.n_seqs = 1, .lengths = &T, .ids = clean}, bx = {.n_seqs = 1, .lengths = &T, .ids = corrupt};
    const lens_forward_opts keep = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_LOGITS};
    if (lens_forward(m, &bc, &keep, &a, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    const lens_forward_opts po = {.keep = LENS_KEEP_LOGITS, .patch_layer = 0, .start_x = lens_act_hidden(m, &a, 0, 0)};
    if (!lens_forward(m, &bx, &po, &b, &err)) {
        const size_t K = m->cfg.task == LENS_TASK_CAUSAL_LM ? (size_t)T * m->cfg.vocab_size : (size_t)m->cfg.n_labels;
        CHECK(!memcmp(lens_act_logits(m, &a, 0), lens_act_logits(m, &b, 0), sizeof(float) * K),
              "%s: the whole clean residual at layer 0 gives the clean logits", name);
        lens_activations_free(&b);
    }
    lens_activations_free(&a);
}

/* F of the corrupt run with grid g's entry i moved by eps (clean − corrupt). */
static double nudged(const lens_model *m, const lens_activations *ac, const lens_activations *ax, int T,
                     const lens_patching_result *r, int g, int i, double eps)
{
    const lens_config *c = &m->cfg;
    const int C = c->d_model, NH = c->n_heads, DV = c->d_head_v, VO = NH * DV, lm = c->task == LENS_TASK_CAUSAL_LM;
    const int l = g == LENS_PATCH_RESID ? i / T : g == LENS_PATCH_HEADS ? i / NH : i;
    float *x = malloc(sizeof(float) * T * C), *ctx = malloc(sizeof(float) * T * VO), *y = malloc(sizeof(float) * T * C);
    unsigned char *heads = calloc((size_t)T * NH, 1), *rows = calloc((size_t)T, 1);
    memcpy(x, lens_act_hidden(m, ax, l, 0), sizeof(float) * T * C);
    memcpy(ctx, lens_act_ctx(m, ax, l + 1, 0), sizeof(float) * T * VO);
    memcpy(y, lens_act_mlp(m, ax, l + 1, 0), sizeof(float) * T * C);
    const float *x1 = lens_act_hidden(m, ac, l, 0), *c1 = lens_act_ctx(m, ac, l + 1, 0), *y1 = lens_act_mlp(m, ac, l + 1, 0);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < C; k++) {
            if (g == LENS_PATCH_RESID && t == i % T) x[t * C + k] += (float)(eps * (x1[t * C + k] - x[t * C + k]));
            if (g == LENS_PATCH_MLPS) y[t * C + k] += (float)(eps * (y1[t * C + k] - y[t * C + k]));
        }
    for (int t = 0; g == LENS_PATCH_HEADS && t < T; t++) {
        const int h = i % NH;
        heads[t * NH + h] = 1;
        for (int k = h * DV; k < (h + 1) * DV; k++) ctx[t * VO + k] += (float)(eps * (c1[t * VO + k] - ctx[t * VO + k]));
    }
    memset(rows, g == LENS_PATCH_MLPS, (size_t)T);
    const int row = r->objective.position;
    lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .patch_layer = l, .start_x = x, .patch_ctx = ctx,
                            .patch_heads = heads, .patch_mlp = y, .patch_mlp_rows = rows,
                            .logit_rows = lm ? &row : NULL};
    int *ids = calloc((size_t)T, sizeof(int)); /* ids only size the pass: it starts at block l */
    const lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids};
    lens_activations act;
    lens_err err = {0};
    double F = NAN;
    if (!lens_forward(m, &batch, &fo, &act, &err)) {
        const int K = lm ? c->vocab_size : c->n_labels;
        F = lens_objective_at(&r->objective, lens_act_logits(m, &act, 0), K, r->target, NULL);
        lens_activations_free(&act);
    }
    free(x), free(ctx), free(y), free(heads), free(rows), free(ids);
    return F;
}

/* Attribution patching against the exact change of a tiny patched difference (the header comment). */
static void check_first_order(const char *name, const lens_model *m, const int *clean, const int *corrupt, int T,
                              const lens_patching_result *r, int *compared)
{
    lens_activations ac, ax;
    lens_err err = {0};
    const lens_batch bc = {.n_seqs = 1, .lengths = &T, .ids = clean}, bx = {.n_seqs = 1, .lengths = &T, .ids = corrupt};
    const lens_forward_opts keep = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_CTX | LENS_KEEP_MLP};
    if (lens_forward(m, &bc, &keep, &ac, &err) || lens_forward(m, &bx, &keep, &ax, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    const double gap = r->clean - r->corrupt;
    static const int grids[] = {LENS_PATCH_RESID, LENS_PATCH_HEADS, LENS_PATCH_MLPS};
    for (int k = 0; k < 3; k++) {
        const lens_patching_grid *g = &r->grid[grids[k]];
        int best = 0;
        for (int i = 1; i < g->n; i++) best = fabs(g->attribution[i]) > fabs(g->attribution[best]) ? i : best;
        const double a = g->attribution[best] * gap;
        if (fabs(a) < 0.1) { /* ε a under float32's noise of F (random classifiers' flat logits) */
            printf("  %-40s %-9s first order: approximation %.2g too small to compare in float32\n", name,
                   lens_patch_grid_name(grids[k]), a);
            continue;
        }
        (*compared)++;
        const double r2 = (nudged(m, &ac, &ax, T, r, grids[k], best, 1e-2) - r->corrupt) / (1e-2 * a);
        const double r3 = (nudged(m, &ac, &ax, T, r, grids[k], best, 1e-3) - r->corrupt) / (1e-3 * a);
        CHECK(fabs(r2 - 1) <= 1e-1 && fabs(r3 - 1) <= 1e-2,
              "%s %s[%d]: exact / first-order change %.6f at eps 1e-2, %.6f at 1e-3 (approximation %.3g)", name,
              lens_patch_grid_name(grids[k]), best, r2, r3, a);
        printf("  %-40s %-9s first order: exact / approximated %.5f (eps 1e-2) %.5f (eps 1e-3), a = %.3g\n", name,
               lens_patch_grid_name(grids[k]), r2, r3, a);
    }
    lens_activations_free(&ac);
    lens_activations_free(&ax);
}

static lens_patching_result run_all(const char *name, const lens_model *m, const int *clean, const int *corrupt, int T,
                                    const lens_objective *obj, int *ok)
{
    lens_err err = {0};
    const lens_patching_opts o = {.grids = ALL_GRIDS, .methods = LENS_PATCH_EXACT | LENS_PATCH_ATTRIBUTION,
                                  .target = -1, .objective = obj};
    lens_patching_result r;
    *ok = !lens_patching_run(m, clean, corrupt, T, &o, &r, &err);
    CHECK(*ok, "%s: %s", name, err.msg);
    return r;
}

static void check_model(const char *name, const char *dir, const int *clean, const int *corrupt, int T,
                        const lens_objective *obj, int with_reference)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", name, err.msg);
    if (!m) return;
    const int lm = m->cfg.task == LENS_TASK_CAUSAL_LM;
    int ok;
    lens_patching_result r = run_all(name, m, clean, corrupt, T, obj, &ok);
    if (!ok) {
        lens_model_free(m);
        return;
    }
    CHECK(fabs(r.clean - r.corrupt) > 1e-4, "%s: clean %.6g and corrupt %.6g differ", name, r.clean, r.corrupt);
    check_identities(name, m, clean, corrupt, T, &r);
    check_whole_residual(name, m, clean, corrupt, T);
    int compared = 0;
    check_first_order(name, m, clean, corrupt, T, &r, &compared);
    json_t *ref = with_reference ? reference(dir, clean, corrupt, T, &r) : NULL;
    CHECK(!with_reference || ref, "%s: the reference script failed", name);
    if (ref) {
        compare_reference(name, ref, &r);
        json_decref(ref);
    }
    lens_patching_result_free(&r);
    lens_patching_opts bad = {.target = lm ? m->cfg.vocab_size : m->cfg.n_labels, .objective = obj};
    CHECK(lens_patching_run(m, clean, corrupt, T, &bad, &r, &err) && err.code == LENS_EINVAL, "%s: target refused",
          name);
    bad = (lens_patching_opts){.target = -1, .grids = 1u << LENS_PATCH_GRIDS};
    CHECK(lens_patching_run(m, clean, corrupt, T, &bad, &r, &err) && err.code == LENS_EINVAL, "%s: grid refused",
          name);
    lens_model_free(m);
}

/* One token changed: patching that row of the residual at layer 0 is the clean run. */
static void check_one_change(const char *name, const char *dir)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    const int T = (int)(sizeof CLEAN_MICRO / sizeof *CLEAN_MICRO);
    int t = 0, ok = 0;
    while (CLEAN_MICRO[t] == ONE_CHANGE_MICRO[t]) t++;
    const lens_objective logit = {.kind = LENS_OBJ_LOGIT, .position = -1, .foil = -1};
    const lens_patching_opts o = {.target = -1, .objective = &logit};
    lens_patching_result r;
    if (m) ok = !lens_patching_run(m, CLEAN_MICRO, ONE_CHANGE_MICRO, T, &o, &r, &err);
    CHECK(ok, "%s: %s", name, err.msg);
    if (ok) {
        const double e = r.grid[LENS_PATCH_RESID].effect[t];
        CHECK(fabs(e - 1) <= 1e-5, "%s: the only changed row at layer 0: effect %.9f, not 1", name, e);
        lens_patching_result_free(&r);
    }
    lens_model_free(m);
}

/* Attribution patching's first order on every classifier and causal-LM family. */
static void check_families(void)
{
    family_cases_check();
    int compared = 0;
    for (int i = 0; i < N_FAMILY_CASES; i++) {
        const family_case *fc = &family_cases[i];
        if (strcmp(fc->task, "classification") && strcmp(fc->task, "causal-lm")) continue;
        char dir[] = "/tmp/lensd-patching-family-XXXXXX", name[96];
        if (micro_checkpoint(fc->arch, fc->task, dir, name, sizeof name)) continue;
        lens_err err = {0};
        lens_model *m = lens_model_load(dir, &err);
        CHECK(m != NULL, "%s: %s", name, err.msg);
        if (m) {
            const int T = 7;
            int clean[7], corrupt[7], ok;
            for (int t = 0; t < T; t++) clean[t] = corrupt[t] = (7 + 13 * t) % m->cfg.vocab_size;
            corrupt[2] = (clean[2] + 5) % m->cfg.vocab_size;
            corrupt[4] = (clean[4] + 9) % m->cfg.vocab_size;
            const lens_objective logit = {.kind = LENS_OBJ_LOGIT, .position = -1, .foil = -1};
            lens_patching_result r = run_all(name, m, clean, corrupt, T, &logit, &ok);
            if (ok) {
                check_first_order(name, m, clean, corrupt, T, &r, &compared);
                lens_patching_result_free(&r);
            }
            lens_model_free(m);
        }
        remove_dir(dir);
    }
    CHECK(compared >= 3 * 10, "attribution patching compared on %d grid entries of the families", compared);
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
    if (!micro_checkpoint("gpt2", "causal-lm", dir, name, sizeof name)) {
        check_model(name, dir, CLEAN_MICRO, CORRUPT_MICRO, (int)(sizeof CLEAN_MICRO / sizeof *CLEAN_MICRO), &diff,
                    with_reference);
        check_one_change(name, dir);
    }
    remove_dir(dir);
    check_families();
    char mlm[] = "/tmp/lensd-patching-mlm-XXXXXX";
    if (!micro_checkpoint("bert", "masked-lm", mlm, name, sizeof name)) {
        lens_err err = {0};
        lens_model *m = lens_model_load(mlm, &err);
        lens_patching_result r;
        const lens_patching_opts o = {.target = -1};
        CHECK(m && lens_patching_run(m, CLEAN_MICRO, CORRUPT_MICRO, 5, &o, &r, &err) && err.code == LENS_EINVAL,
              "%s: refused (%s)", name, err.msg);
        lens_model_free(m);
    }
    remove_dir(mlm);
    return check_done("test_patching");
}
