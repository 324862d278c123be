/* test_paper_code.c - the released code's definitions ("paper-code") against
 * independent re-implementations of the released formulas.
 *
 *   screenot    lens_screenot on the singular values of 6 spiked matrices vs
 *               tests/fixtures/screenot.json (tests/reference/paper_code_reference.py,
 *               float64 port of the authors' adaptiveHardThresholding): rank
 *               exact, threshold 1e-9 (both bisect to 1e-5 from the same
 *               bracket), and the planted rank recovered. No ../shared needed.
 *   decomposition  tests/fixtures/paper_code_<model>.json (same script):
 *               Table 1 (ScreeNOT rank k = 20, stable rank, explained ratio at
 *               the rank, relative norm) and the topic similarities with
 *               self-pairs, raw and top-20 PCA, with pos / mean from a
 *               reference set of windows and from the windows themselves.
 *   attattr     tests/fixtures/attribution_paper_code.json
 *               (tests/reference/attribution_paper_code_reference.py, float64
 *               autograd): head importance towards the gold label (sum over
 *               examples), floor pruning counts, and the released trigger rule
 *               (head of the largest entry, its top-2 entries).
 * Every fixture list must be non-empty; the cases are counted and printed.
 * SKIP without ../shared (LENS_SHARED) for the parts that load checkpoints.
 *
 * Regenerate: /usr/bin/python3 tests/reference/paper_code_reference.py
 *             /usr/bin/python3 tests/reference/attribution_paper_code_reference.py */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "core/analysis/decomposition.h"
#include "core/analysis/head_importance.h"
#include "core/analysis/triggers.h"

#define TOL_METRIC 1e-5   /* float32 forward vs float64 metrics, as test_decomposition */
#define TOL_ATTR 1e-3     /* relative, float32 vs float64 attribution, as test_attribution */

static json_t *load_fixture(const char *path)
{
    json_error_t jerr;
    json_t *fx = json_load_file(path, 0, &jerr);
    CHECK(fx != NULL, "%s: %s", path, jerr.text);
    return fx;
}

static double num(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    CHECK(json_is_number(v), "fixture: %s missing", key);
    return json_number_value(v);
}

static void close_to(const char *what, double got, double want, double atol, double rtol)
{
    CHECK(fabs(got - want) <= atol + rtol * fabs(want), "%s: got %.9g want %.9g (atol %g rtol %g)", what, got, want,
          atol, rtol);
}

/* ---------------------------------------------------------------- ScreeNOT */

static void test_screenot(void)
{
    json_t *fx = load_fixture("tests/fixtures/screenot.json");
    const json_t *cases = json_object_get(fx, "cases");
    CHECK(json_array_size(cases) > 0, "screenot.json has no cases");
    int n_cases = 0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *k = json_array_get(cases, c), *jsv = json_object_get(k, "sv");
        const int n = (int)json_array_size(jsv), rows = (int)num(k, "rows"), cols = (int)num(k, "cols");
        double sv[n > 0 ? n : 1], thr;
        for (int i = 0; i < n; i++) sv[i] = json_number_value(json_array_get(jsv, (size_t)i));
        const int r = lens_screenot(sv, n, rows, cols, (int)num(k, "k"), &thr);
        CHECK(r == (int)num(k, "rank"), "screenot case %zu: rank %d want %d", c, r, (int)num(k, "rank"));
        CHECK(r == (int)num(k, "planted_rank"), "screenot case %zu: rank %d, planted %d", c, r,
              (int)num(k, "planted_rank"));
        close_to("screenot threshold", thr, num(k, "threshold"), 1e-9, 0);
        /* k too large for the imputation: 2k + 1 >= n */
        CHECK(lens_screenot(sv, n, rows, cols, n / 2, &thr) == -1, "screenot case %zu: k = n/2 must give -1", c);
        n_cases++;
    }
    printf("screenot: %d cases\n", n_cases);
    json_decref(fx);
}

/* ---------------------------------------------------------------- decomposition */

static int *window_ids(const json_t *jw, int T, int *W)
{
    *W = (int)json_array_size(jw);
    int *ids = malloc(sizeof(int) * (size_t)(*W > 0 ? *W : 1) * T);
    for (int w = 0; w < *W; w++)
        for (int t = 0; t < T; t++)
            ids[(size_t)w * T + t] = (int)json_integer_value(json_array_get(json_array_get(jw, (size_t)w), (size_t)t));
    return ids;
}

static int decompose(const lens_model *m, int T, const int *ids, const int *labels, int W, const lens_decomp_opts *o,
                     lens_decomp_result *res)
{
    lens_err err = {0};
    lens_decomp *acc = lens_decomp_begin(m, T, NULL, 0, o, &err);
    int rc = acc ? lens_decomp_add(acc, ids, labels, W, &err) : -1;
    if (rc == 0) rc = lens_decomp_finish(acc, res, &err);
    CHECK(rc == 0, "decomposition: %s", err.msg);
    lens_decomp_free(acc);
    return rc;
}

static void test_decomposition(const char *shared, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/paper_code_%s.json", name);
    json_t *fx = load_fixture(path);
    if (!fx) return;
    snprintf(path, sizeof path, "%s/models/%s", shared, name);
    lens_err err = {0};
    lens_model *m = lens_model_load(path, &err);
    CHECK(m != NULL, "%s: %s", path, err.msg);
    const int T = (int)num(fx, "T"), k = (int)num(fx, "screenot_k");
    int W, W_ref;
    int *ids = window_ids(json_object_get(fx, "windows"), T, &W);
    int *ref_ids = window_ids(json_object_get(fx, "reference_windows"), T, &W_ref);
    int labels[W > 0 ? W : 1];
    for (int w = 0; w < W; w++) labels[w] = (int)json_integer_value(json_array_get(json_object_get(fx, "labels"), w));
    const json_t *variants = json_object_get(fx, "variants");
    CHECK(json_array_size(variants) == 2, "%s: want 2 variants", name);
    lens_decomp_result ref = {0};
    const lens_decomp_opts ref_opts = {.screenot_k = k};
    int n_checked = 0;
    double worst[8] = {0}; /* largest |lensd - reference| per quantity, printed for the docs */
    if (m && W >= 2 && W_ref >= 2 && decompose(m, T, ref_ids, NULL, W_ref, &ref_opts, &ref) == 0) {
        for (size_t v = 0; v < json_array_size(variants); v++) {
            const json_t *var = json_array_get(variants, v);
            const char *which = json_string_value(json_object_get(var, "variant"));
            const int use_ref = which && !strcmp(which, "reference");
            lens_decomp_opts o = {.screenot_k = k, .topics_self_pairs = 1, .reference = use_ref ? &ref : NULL};
            lens_decomp_result raw = {0}, pca = {0};
            if (decompose(m, T, ids, labels, W, &o, &raw)) continue;
            o.topics_pca = 20;
            if (decompose(m, T, ids, labels, W, &o, &pca)) {
                lens_decomp_result_free(&raw);
                continue;
            }
            const json_t *layers = json_object_get(var, "layers");
            CHECK(json_array_size(layers) > 0 && (size_t)raw.n_layers == json_array_size(layers),
                  "%s %s: %d layers vs %zu", name, which, raw.n_layers, json_array_size(layers));
            for (int l = 0; l < raw.n_layers && (size_t)l < json_array_size(layers); l++) {
                const json_t *want = json_array_get(layers, (size_t)l);
                const lens_decomp_layer *r = &raw.layers[l], *p = &pca.layers[l];
                char what[160];
                CHECK(r->pos_screenot_rank == (int)num(want, "screenot_rank"), "%s %s layer %d: ScreeNOT rank %d want %d",
                      name, which, l, r->pos_screenot_rank, (int)num(want, "screenot_rank"));
                struct { const char *key; double got, atol, rtol; } f[] = {
                    {"screenot_threshold", r->pos_screenot_threshold, 2e-5, 0},
                    {"stable_rank", r->pos_stable_rank, 0, TOL_METRIC},
                    {"explained_screenot", r->pos_explained_screenot, TOL_METRIC, 0},
                    {"relative_norm_pos", r->norm_pos, TOL_METRIC, 0},
                    {"within_nopca", r->topics_within, TOL_METRIC, 0},
                    {"between_nopca", r->topics_between, TOL_METRIC, 0},
                    {"within_pca20", p->topics_within, TOL_METRIC, 0},
                    {"between_pca20", p->topics_between, TOL_METRIC, 0},
                };
                for (size_t q = 0; q < sizeof f / sizeof f[0]; q++) {
                    snprintf(what, sizeof what, "%s %s layer %d %s", name, which, l, f[q].key);
                    const double w = num(want, f[q].key);
                    close_to(what, f[q].got, w, f[q].atol, f[q].rtol);
                    worst[q] = fmax(worst[q], fabs(f[q].got - w) / (f[q].rtol ? fabs(w) : 1));
                }
                /* the within mean counts every ordered pair of a label, self-pairs included */
                CHECK(r->topics_within_pairs == (long)W * W / 4, "%s: %ld within pairs", name, r->topics_within_pairs);
                n_checked++;
            }
            lens_decomp_result_free(&raw), lens_decomp_result_free(&pca);
        }
        /* a reference of another window length is refused */
        lens_decomp_opts o = {.reference = &ref};
        CHECK(lens_decomp_begin(m, T - 1, NULL, 0, &o, &err) == NULL && err.code == LENS_EINVAL,
              "%s: a reference of another T must be refused", name);
    }
    CHECK(n_checked > 0, "%s: no layer was checked", name);
    printf("%s: %d layer x variant cases (ScreeNOT k = %d, reference W = %d, W = %d, T = %d); max diff: threshold "
           "%.1e, stable rank %.1e (rel), explained %.1e, relative norm %.1e, topics %.1e %.1e %.1e %.1e\n",
           name, n_checked, k, W_ref, W, T, worst[0], worst[1], worst[2], worst[3], worst[4], worst[5], worst[6],
           worst[7]);
    lens_decomp_result_free(&ref);
    free(ids), free(ref_ids);
    lens_model_free(m);
    json_decref(fx);
}

/* ---------------------------------------------------------------- attattr rules */

static void test_attattr(const char *shared)
{
    json_t *fx = load_fixture("tests/fixtures/attribution_paper_code.json");
    if (!fx) return;
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert-tiny-sst2", shared);
    lens_err err = {0};
    lens_model *m = lens_model_load(path, &err);
    CHECK(m != NULL, "%s: %s", path, err.msg);
    const json_t *jex = json_object_get(fx, "examples");
    const int n = (int)json_array_size(jex) < 1000 ? (int)json_array_size(jex) : 0, steps = (int)num(fx, "steps");
    CHECK(n > 0, "attribution_paper_code.json has no examples");
    if (!m || n == 0) {
        lens_model_free(m);
        json_decref(fx);
        return;
    }
    const int L = m->cfg.n_layers, NH = m->cfg.n_heads;
    lens_example ex[n];
    int *ids = malloc(sizeof(int) * 512 * (size_t)(n > 0 && n < 1000 ? n : 1));
    for (int e = 0; e < n; e++) {
        const json_t *je = json_array_get(jex, (size_t)e), *ji = json_object_get(je, "input_ids");
        ex[e] = (lens_example){.ids = ids + 512 * e, .T = (int)json_array_size(ji), .label = (int)num(je, "gold")};
        for (int t = 0; t < ex[e].T; t++) ids[512 * e + t] = (int)json_integer_value(json_array_get(ji, (size_t)t));
    }

    /* head importance: gold target, released sum = n x lensd's mean; floor counts */
    lens_head_opts ho = {.steps = steps, .riemann = LENS_RIEMANN_LEFT, .target_gold = 1, .prune_floor = 1};
    lens_head_importance hi;
    if (lens_head_importance_run(m, ex, n, &ho, &hi, &err) == 0) {
        const json_t *sum = json_object_get(fx, "head_importance_sum");
        CHECK(json_array_size(sum) == (size_t)(L * NH), "head_importance_sum has %zu entries", json_array_size(sum));
        for (int h = 0; h < L * NH && (size_t)h < json_array_size(sum); h++)
            close_to("head importance (gold, sum)", hi.attr_importance[h] * n,
                     json_number_value(json_array_get(sum, (size_t)h)), 1e-6, TOL_ATTR);
        const json_t *pr = json_object_get(fx, "heads_pruned_floor");
        for (int p = 0; p < LENS_PRUNE_POINTS; p++)
            CHECK(hi.n_pruned[p] == (int)json_integer_value(json_array_get(pr, (size_t)p)),
                  "pruned at %d/10: %d want %lld", p, hi.n_pruned[p], json_integer_value(json_array_get(pr, (size_t)p)));
        lens_head_importance_free(&hi);
        /* the predicted target gives other numbers on these examples (gold != predicted for some) */
        ho.target_gold = 0;
        if (lens_head_importance_run(m, ex, n, &ho, &hi, &err) == 0) {
            double diff = 0;
            for (int h = 0; h < L * NH; h++)
                diff += fabs(hi.attr_importance[h] * n - json_number_value(json_array_get(sum, (size_t)h)));
            CHECK(diff > 1e-3, "predicted-target importance equals the gold one (diff %g)", diff);
            lens_head_importance_free(&hi);
        }
    } else CHECK(0, "head importance: %s", err.msg);
    const json_t *base = json_object_get(fx, "heads_pruned_floor_12x12");
    CHECK(json_array_size(base) == LENS_PRUNE_POINTS, "heads_pruned_floor_12x12 missing");
    for (int p = 0; p < LENS_PRUNE_POINTS && json_array_size(base); p++) {
        CHECK(lens_heads_pruned(p / 10.0, 12, 12, 1) == (int)json_integer_value(json_array_get(base, (size_t)p)),
              "12x12 floor at %d/10: %d", p, lens_heads_pruned(p / 10.0, 12, 12, 1));
        CHECK(lens_heads_pruned(p / 10.0, 12, 12, 0) == (int)(p / 10.0 * 144 + 0.5), "12x12 round at %d/10", p);
    }

    /* released trigger rule: one source example at a time, so the class's
     * trigger is its top-1 entry (count 1; the top-2 entry has a lower score) */
    int n_trig = 0;
    for (int e = 0; e < n; e++) {
        const json_t *je = json_array_get(jex, (size_t)e), *t1 = json_object_get(je, "top1position");
        const int i = (int)json_integer_value(json_array_get(t1, 0)), j = (int)json_integer_value(json_array_get(t1, 1));
        const int pred = (int)num(je, "predicted");
        lens_trigger_opts to = {.steps = steps, .riemann = LENS_RIEMANN_LEFT, .rule = LENS_TRIGGER_RULE_RELEASED};
        lens_trigger_result tr;
        if (lens_triggers_run(m, &ex[e], 1, &ex[e], 1, &to, &tr, &err)) {
            CHECK(0, "triggers example %d: %s", e, err.msg);
            continue;
        }
        const lens_trigger *t = &tr.triggers[pred];
        const int a = ex[e].ids[i < j ? i : j], b = ex[e].ids[i < j ? j : i];
        CHECK(t->found && t->token_a == a && t->token_b == b, "example %d: trigger (%d, %d) want (%d, %d) from (%d, %d)",
              e, t->token_a, t->token_b, a, b, i, j);
        const json_t *mc = json_object_get(je, "max_combined_attr");
        close_to("released trigger score", t->score, json_number_value(json_array_get(mc, 0)), 1e-6, TOL_ATTR);
        close_to("released trigger position", t->pos_a, ((i < j ? i : j) - 1) / (double)(ex[e].T - 2), 1e-12, 0);
        lens_trigger_result_free(&tr);
        n_trig++;
    }
    CHECK(n_trig == n, "triggers checked on %d of %d examples", n_trig, n);
    /* a 3-token source ([CLS] x [SEP]): the released rule may pick [CLS] / [SEP]; positions stay finite
     * and the attacked victim is 2 tokens longer */
    const int short_ids[3] = {ex[0].ids[0], ex[0].ids[1], ex[0].ids[ex[0].T - 1]};
    lens_example short_ex = {.ids = short_ids, .T = 3, .label = 0};
    lens_trigger_opts to = {.steps = steps, .riemann = LENS_RIEMANN_LEFT, .rule = LENS_TRIGGER_RULE_RELEASED};
    lens_trigger_result tr;
    if (lens_triggers_run(m, &short_ex, 1, &ex[1], 1, &to, &tr, &err) == 0) {
        int found = 0;
        for (int k = 0; k < tr.n_labels; k++) {
            if (!tr.triggers[k].found) continue;
            found++;
            CHECK(isfinite(tr.triggers[k].pos_a) && isfinite(tr.triggers[k].pos_b), "3-token source: positions %g %g",
                  tr.triggers[k].pos_a, tr.triggers[k].pos_b);
        }
        CHECK(found == 1, "3-token source gives one trigger (found %d)", found);
        lens_trigger_result_free(&tr);
    } else CHECK(0, "3-token source: %s", err.msg);
    printf("attattr: %d examples (head importance towards gold, %d heads; released trigger rule)\n", n, L * NH);
    free(ids);
    lens_model_free(m);
    json_decref(fx);
}

int main(void)
{
    test_screenot();
    const char *shared = check_shared_dir();
    const char *models[] = {"gpt2-tiny-wikitext", "bert-tiny-mlm"};
    for (int i = 0; i < 2; i++) {
        if (!shared) SKIP("%s: ../shared not found (set LENS_SHARED)", models[i]);
        else test_decomposition(shared, models[i]);
    }
    if (!shared) SKIP("bert-tiny-sst2: ../shared not found (set LENS_SHARED)");
    else test_attattr(shared);
    return check_done("test_paper_code");
}
