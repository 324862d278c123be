/* test_attribution.c - lens_attribution_run and lens_attr_tree_build against
 * PyTorch autograd (tests/reference/attribution_reference.py, float64) on the
 * shared classifier bert-tiny-sst2; SKIPs when ../shared is absent.
 *
 * Fixture tests/fixtures/attribution_sst2.json: the three golden.json inputs,
 * m = 20, both Riemann conventions, and quadrature "gauss" with
 * gauss_nodes (= LENS_ATTR_GAUSS_NODES) Gauss–Legendre nodes, per layer the attribution [NH][T][T],
 * head importance, F(0 A), and the tree (threshold 0.4).
 *
 * Tolerances:
 *  - attribution and importance: |lensd − torch| ≤ 1e-3 × the largest |score|
 *    of that example and convention (the bar); lensd is float32, the
 *    reference float64; measured worst ratio is printed (~1e-5);
 *  - F(A), F(0 A): 1e-5 (probabilities from a float32 forward);
 *  - trees: identical root, nodes and edges; edge scores within 1e-3;
 *  - completeness, m = 200 (right): |Σ Attr_l − (F(A) − F(0))| per
 *    layer, 3e-3 (the Riemann error falls as 1/m; measured worst 1.6e-3 on golden0
 *    layer 2, where F(αA) bends sharply near α = 0);
 *  - completeness, gauss with 16 nodes: 1e-6 (the rule is exact to degree 31
 *    in α; what is left is float32 summation, measured worst 8.5e-8);
 *  - batching: a 1 MiB scratch budget (many small batches of steps) and a
 *    single-layer request give the all-in-one result to 1e-6 of the max;
 *  - the schedule (no model needed): Gauss–Legendre nodes and weights against
 *    their closed forms for 1..5 points (1e-14), exactness on α^k up to
 *    degree 2m − 1 for m = 1..40 and the known remainder at degree 2m
 *    (m ≤ 8); the Riemann
 *    points k/m as the paper and the released code. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/attribution.h"
#include "core/model/model.h"
#include "core/base/pool.h"
#include "tests/check.h"
#include "tests/fixture.h"

#define TOL_SCORE 1e-3   /* of the largest |score| */
#define TOL_PROB 1e-5
#define TOL_COMPLETE 3e-3
#define STEPS_COMPLETE 200
#define GAUSS_COMPLETE 16
#define TOL_GAUSS_COMPLETE 1e-6

static int *json_int_array(const json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int *out = malloc(sizeof(int) * (*n ? *n : 1));
    for (int i = 0; i < *n; i++) out[i] = (int)json_integer_value(json_array_get(a, i));
    return out;
}

static void flatten(const json_t *j, float *out, size_t *pos, size_t cap)
{
    if (!json_is_array(j)) {
        if (*pos < cap) out[*pos] = (float)json_number_value(j);
        (*pos)++;
        return;
    }
    for (size_t i = 0; i < json_array_size(j); i++) flatten(json_array_get(j, i), out, pos, cap);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void compare_tree(const char *what, const lens_attr_tree *t, const json_t *want)
{
    const json_t *nodes = json_object_get(want, "nodes"), *edges = json_object_get(want, "edges");
    int ok = t->root == (int)json_integer_value(json_object_get(want, "root")) &&
             t->n_nodes == (int)json_array_size(nodes) && t->n_edges == (int)json_array_size(edges);
    for (int i = 0; ok && i < t->n_nodes; i++) {
        const json_t *n = json_array_get(nodes, i);
        ok = t->nodes[i].token == json_integer_value(json_object_get(n, "token")) &&
             t->nodes[i].layer == json_integer_value(json_object_get(n, "layer"));
    }
    for (int i = 0; ok && i < t->n_edges; i++) {
        const json_t *e = json_array_get(edges, i);
        ok = t->edges[i].layer == json_integer_value(json_object_get(e, "layer")) &&
             t->edges[i].from == json_integer_value(json_object_get(e, "from")) &&
             t->edges[i].to == json_integer_value(json_object_get(e, "to")) &&
             fabs(t->edges[i].score - json_number_value(json_object_get(e, "score"))) < 1e-3;
    }
    CHECK(ok, "%s: tree differs: lensd root %d, %d nodes, %d edges; torch root %d, %zu nodes, %zu edges", what,
          t->root, t->n_nodes, t->n_edges, (int)json_integer_value(json_object_get(want, "root")),
          json_array_size(nodes), json_array_size(edges));
    printf("  %s: tree root %d, %d edges:", what, t->root, t->n_edges);
    for (int i = 0; i < t->n_edges; i++)
        printf(" L%d %d->%d (%.3f)", t->edges[i].layer, t->edges[i].from, t->edges[i].to, t->edges[i].score);
    printf("\n");
}

static void test_completeness(const lens_model *m, const char *name, const int *ids, const int *type_ids, int T,
                              lens_quadrature q, int steps, double tol)
{
    const char *rule = q == LENS_QUAD_GAUSS ? "gauss" : "riemann";
    lens_attr_opts o = {.steps = steps, .quadrature = q, .target = -1};
    lens_attribution at;
    lens_err err = {0};
    if (lens_attribution_run(m, ids, type_ids, T, &o, &at, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    CHECK(at.steps == steps && at.quadrature == q, "%s: echoed %d steps, quadrature %d", name, at.steps, at.quadrature);
    for (int l = 0; l < at.n_layers; l++) {
        const double gap = at.layers[l].attr_sum - (at.f_full - at.layers[l].f_zero);
        CHECK(fabs(gap) <= tol, "%s layer %d: completeness gap %.3g at %s-%d", name, l + 1, gap, rule, steps);
        printf("  %s layer %d %s-%d: sum Attr %.6f, F(A) - F(0) = %.6f - %.6f, gap %.2e\n", name, l + 1, rule,
               steps, at.layers[l].attr_sum, at.f_full, at.layers[l].f_zero, gap);
    }
    lens_attribution_free(&at);
}

static void test_example(const lens_model *m, const json_t *ex, int steps, int gauss_nodes)
{
    const char *name = json_string_value(json_object_get(ex, "name"));
    int T, T2;
    int *ids = json_int_array(json_object_get(ex, "input_ids"), &T);
    int *type_ids = json_int_array(json_object_get(ex, "token_type_ids"), &T2);
    const int NH = m->cfg.n_heads, L = m->cfg.n_layers;
    const size_t TT = (size_t)T * T;
    const char *conventions[3] = {"right", "left", "gauss"};
    for (int ci = 0; ci < 3; ci++) {
        const json_t *want = ci < 2 ? json_object_get(json_object_get(ex, "riemann"), conventions[ci])
                                    : json_object_get(ex, "gauss");
        const json_t *layers = json_object_get(want, "layers");
        CHECK(json_array_size(layers) == (size_t)L, "%s %s: fixture has %zu layers", name, conventions[ci],
              json_array_size(layers));
        lens_attr_opts o = {.steps = ci < 2 ? steps : gauss_nodes,
                            .riemann = ci == 1 ? LENS_RIEMANN_LEFT : LENS_RIEMANN_RIGHT,
                            .quadrature = ci < 2 ? LENS_QUAD_RIEMANN : LENS_QUAD_GAUSS,
                            .target = -1};
        lens_attribution at;
        lens_err err = {0};
        if (lens_attribution_run(m, ids, type_ids, T, &o, &at, &err)) {
            CHECK(0, "%s: %s", name, err.msg);
            continue;
        }
        CHECK(at.target == json_integer_value(json_object_get(ex, "target")), "%s: target %d", name, at.target);
        CHECK(fabs(at.f_full - json_number_value(json_object_get(ex, "f_full"))) < TOL_PROB, "%s: F(A) %.7f vs %.7f",
              name, at.f_full, json_number_value(json_object_get(ex, "f_full")));
        /* the largest |score| over the layers of the reference sets the scale */
        float *ref = malloc(sizeof(float) * L * NH * TT), *ref_imp = malloc(sizeof(float) * L * NH);
        double scale = 0;
        for (int l = 0; l < L; l++) {
            const json_t *ly = json_array_get(layers, l);
            size_t pos = 0;
            flatten(json_object_get(ly, "attribution"), ref + l * NH * TT, &pos, NH * TT);
            CHECK(pos == NH * TT, "%s layer %d: fixture has %zu scores, expected %zu", name, l + 1, pos, NH * TT);
            pos = 0;
            flatten(json_object_get(ly, "importance"), ref_imp + l * NH, &pos, NH);
            for (size_t i = 0; i < NH * TT; i++) scale = fmax(scale, fabs(ref[l * NH * TT + i]));
        }
        double worst = 0, worst_imp = 0;
        char what[128];
        for (int l = 0; l < L; l++) {
            const json_t *ly = json_array_get(layers, l);
            snprintf(what, sizeof what, "%s %s layer %d attribution", name, conventions[ci], l + 1);
            check_close(what, at.layers[l].attr, ref + l * NH * TT, NH * TT, TOL_SCORE * scale, 0);
            snprintf(what, sizeof what, "%s %s layer %d importance", name, conventions[ci], l + 1);
            check_close(what, at.layers[l].importance, ref_imp + l * NH, NH, TOL_SCORE * scale, 0);
            worst = fmax(worst, max_abs_diff(at.layers[l].attr, ref + l * NH * TT, NH * TT));
            worst_imp = fmax(worst_imp, max_abs_diff(at.layers[l].importance, ref_imp + l * NH, NH));
            const double fz = json_number_value(json_object_get(ly, "f_zero"));
            CHECK(fabs(at.layers[l].f_zero - fz) < TOL_PROB, "%s layer %d: F(0) %.7f vs %.7f", name, l + 1,
                  at.layers[l].f_zero, fz);
        }
        printf("  %s %s m=%d: max |lensd - torch| / max|score| = %.2e (scores), %.2e (importance)\n", name,
               conventions[ci], o.steps, worst / scale, worst_imp / scale);
        const float *attr_layers[64];
        for (int l = 0; l < L && l < 64; l++) attr_layers[l] = at.layers[l].attr;
        lens_attr_tree tree;
        if (lens_attr_tree_build(attr_layers, L, NH, T, 0.4f, &tree, &err) == 0) {
            snprintf(what, sizeof what, "%s %s", name, conventions[ci]);
            compare_tree(what, &tree, json_object_get(want, "tree"));
            lens_attr_tree_free(&tree);
        } else {
            CHECK(0, "%s: tree: %s", name, err.msg);
        }

        if (ci == 0) {
            /* batching must not change anything: tiny scratch budget, one layer at a time */
            lens_attr_opts small = o;
            small.max_scratch_bytes = 1 << 20;
            lens_attribution at2;
            if (lens_attribution_run(m, ids, type_ids, T, &small, &at2, &err) == 0) {
                for (int l = 0; l < L; l++) {
                    snprintf(what, sizeof what, "%s layer %d: 1 MiB scratch == default", name, l + 1);
                    check_close(what, at2.layers[l].attr, at.layers[l].attr, NH * TT, 1e-6 * scale, 0);
                }
                lens_attribution_free(&at2);
            }
            const int top = L;
            lens_attr_opts one = o;
            one.layers = &top, one.n_layers = 1;
            if (lens_attribution_run(m, ids, type_ids, T, &one, &at2, &err) == 0) {
                snprintf(what, sizeof what, "%s layers=[%d] == all layers", name, L);
                check_close(what, at2.layers[0].attr, at.layers[L - 1].attr, NH * TT, 1e-6 * scale, 0);
                CHECK(at2.layers[0].layer == L, "layer number %d", at2.layers[0].layer);
                lens_attribution_free(&at2);
            }
        }
        free(ref), free(ref_imp);
        lens_attribution_free(&at);
    }

    /* completeness: Σ Attr → F(A) − F(0) as m grows; Gauss–Legendre gets there with few nodes */
    test_completeness(m, name, ids, type_ids, T, LENS_QUAD_RIEMANN, STEPS_COMPLETE, TOL_COMPLETE);
    test_completeness(m, name, ids, type_ids, T, LENS_QUAD_GAUSS, GAUSS_COMPLETE, TOL_GAUSS_COMPLETE);
    free(ids), free(type_ids);
}

/* Threads and batching change nothing: the same attributions on a 3-thread
 * pool (bit for bit: every output element is summed in the same order) and
 * in batches of 2 copies (summed over batches: within 1e-6 of the scale). */
static void test_threads(const lens_model *m, const json_t *ex, int steps)
{
    const char *name = json_string_value(json_object_get(ex, "name"));
    int T, T2;
    int *ids = json_int_array(json_object_get(ex, "input_ids"), &T);
    int *type_ids = json_int_array(json_object_get(ex, "token_type_ids"), &T2);
    lens_pool *pool = lens_pool_create(3);
    lens_attr_opts serial = {.steps = steps, .target = -1};
    lens_attr_opts threaded = {.steps = steps, .target = -1, .pool = pool};
    lens_attr_opts batched = {.steps = steps, .target = -1, .pool = pool, .max_scratch_bytes = 1};
    lens_attribution a = {0}, b = {0}, c = {0};
    lens_err err = {0};
    CHECK(pool && !lens_attribution_run(m, ids, type_ids, T, &serial, &a, &err) &&
              !lens_attribution_run(m, ids, type_ids, T, &threaded, &b, &err) &&
              !lens_attribution_run(m, ids, type_ids, T, &batched, &c, &err),
          "%s threads: %s", name, err.msg);
    const size_t n = (size_t)m->cfg.n_heads * T * T;
    double same = 0, batch = 0, scale = 0;
    for (int l = 0; a.layers && b.layers && c.layers && l < a.n_layers; l++) {
        same = fmax(same, max_abs_diff(a.layers[l].attr, b.layers[l].attr, n));
        batch = fmax(batch, max_abs_diff(a.layers[l].attr, c.layers[l].attr, n));
        for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(a.layers[l].attr[i]));
    }
    CHECK(a.layers && same == 0, "%s: 3 threads differ from 1 by %.3g", name, same);
    CHECK(a.layers && batch <= 1e-6 * scale, "%s: batches of 2 copies differ by %.3g (scale %.3g)", name, batch, scale);
    printf("  %s: 3 threads vs 1: max |diff| %.3g; batches of 2 copies: %.3g of scale %.3g\n", name, same, batch,
           scale);
    lens_attribution_free(&a), lens_attribution_free(&b), lens_attribution_free(&c);
    lens_pool_free(pool);
    free(ids), free(type_ids);
}

/* Σ_k w_k α_k^d against ∫₀¹ α^d dα = 1 / (d + 1) */
static double moment_error(const double *a, const double *w, int m, int d)
{
    double s = 0;
    for (int k = 0; k < m; k++) s += w[k] * pow(a[k], d);
    return fabs(s - 1.0 / (d + 1));
}

static void test_schedule(void)
{
    /* closed forms on [-1, 1], ascending: 1..5 points */
    const double r70 = sqrt(70), r30 = sqrt(30), q4 = 2 * sqrt(6.0 / 5) / 7, q5 = 2 * sqrt(10.0 / 7);
    const double want_x[5][5] = {{0},
                                 {-1 / sqrt(3), 1 / sqrt(3)},
                                 {-sqrt(0.6), 0, sqrt(0.6)},
                                 {-sqrt(3.0 / 7 + q4), -sqrt(3.0 / 7 - q4), sqrt(3.0 / 7 - q4), sqrt(3.0 / 7 + q4)},
                                 {-sqrt(5 + q5) / 3, -sqrt(5 - q5) / 3, 0, sqrt(5 - q5) / 3, sqrt(5 + q5) / 3}};
    const double want_w[5][5] = {{2},
                                 {1, 1},
                                 {5.0 / 9, 8.0 / 9, 5.0 / 9},
                                 {(18 - r30) / 36, (18 + r30) / 36, (18 + r30) / 36, (18 - r30) / 36},
                                 {(322 - 13 * r70) / 900, (322 + 13 * r70) / 900, 128.0 / 225,
                                  (322 + 13 * r70) / 900, (322 - 13 * r70) / 900}};
    int cases = 0;
    for (int m = 1; m <= 5; m++) {
        double x[5], w[5];
        lens_gauss_legendre(m, x, w);
        for (int k = 0; k < m; k++, cases++)
            CHECK(fabs(x[k] - want_x[m - 1][k]) < 1e-14 && fabs(w[k] - want_w[m - 1][k]) < 1e-14,
                  "gauss-%d node %d: x %.17g w %.17g, expected %.17g %.17g", m, k, x[k], w[k], want_x[m - 1][k],
                  want_w[m - 1][k]);
    }
    /* on [0, 1]: exact to degree 2m − 1, not at 2m; weights positive, nodes inside and ascending */
    double a[40], w[40];
    for (int m = 1; m <= 40; m++, cases++) {
        CHECK(lens_attr_nodes(LENS_QUAD_GAUSS, LENS_RIEMANN_RIGHT, m, a, w) == 1, "gauss-%d divisor", m);
        double worst = 0;
        for (int d = 0; d < 2 * m; d++) worst = fmax(worst, moment_error(a, w, m, d));
        CHECK(worst < 1e-13, "gauss-%d: worst moment error %.3g up to degree %d", m, worst, 2 * m - 1);
        /* the remainder at degree 2m is 1 / ((2m + 1) C(2m, m)²); above m = 8 it sinks under rounding */
        double binom = 1;
        for (int i = 1; i <= m; i++) binom = binom * (m + i) / i;
        const double rem = 1 / ((2 * m + 1) * binom * binom);
        CHECK(m > 8 || fabs(moment_error(a, w, m, 2 * m) - rem) < 1e-6 * rem,
              "gauss-%d: degree %d error %.6g, expected %.6g", m, 2 * m, moment_error(a, w, m, 2 * m), rem);
        int ok = 1;
        for (int k = 0; k < m; k++) ok &= w[k] > 0 && a[k] > 0 && a[k] < 1 && (k == 0 || a[k] > a[k - 1]);
        CHECK(ok, "gauss-%d: nodes in (0, 1) ascending, weights positive", m);
    }
    /* Riemann: the paper's right points k/m (k = 1..m), the released code's left ones (k = 0..m-1) */
    CHECK(lens_attr_nodes(LENS_QUAD_RIEMANN, LENS_RIEMANN_RIGHT, 4, a, w) == 4 && a[0] == 0.25 && a[3] == 1 &&
              w[0] == 1 && w[3] == 1,
          "riemann right 4: %g .. %g", a[0], a[3]);
    CHECK(lens_attr_nodes(LENS_QUAD_RIEMANN, LENS_RIEMANN_LEFT, 4, a, w) == 4 && a[0] == 0 && a[3] == 0.75,
          "riemann left 4: %g .. %g", a[0], a[3]);
    CHECK(lens_attr_nodes(LENS_QUAD_RIEMANN, LENS_RIEMANN_RIGHT, 0, a, w) == 0 &&
              lens_attr_nodes((lens_quadrature)7, LENS_RIEMANN_RIGHT, 4, a, w) == 0,
          "no schedule for m = 0 or an unknown rule");
    printf("  schedule: %d Gauss-Legendre cases (closed forms 1..5 points, moments 1..40 points)\n", cases);
    CHECK(cases == 15 + 40, "%d schedule cases", cases);
}

static void test_tree_rules(void)
{
    /* 3 layers, 1 head, 4 tokens, hand-made: layer 3 makes token 2 the root
     * (largest positive off-diagonal row sum, row 0 excluded); layer 2
     * (second-to-last) gives the root's children; layer 1 extends them. */
    enum { T = 4 };
    float l1[T * T] = {0}, l2[T * T] = {0}, l3[T * T] = {0};
    l3[2 * T + 1] = 5, l3[2 * T + 3] = 4, l3[1 * T + 2] = 1, l3[0 * T + 1] = 100; /* row 0 ignored */
    l2[2 * T + 1] = 1.0f, l2[2 * T + 2] = 0.9f, l2[3 * T + 0] = 0.3f;           /* 2->1 (1.0); 3->0 below threshold */
    l1[1 * T + 3] = 2.0f, l1[1 * T + 0] = 1.0f, l1[3 * T + 0] = 2.0f;           /* 1->3 (1.0), 1->0 (0.5) */
    const float *layers[3] = {l1, l2, l3};
    lens_attr_tree t;
    lens_err err = {0};
    CHECK(lens_attr_tree_build(layers, 3, 1, T, 0.4f, &t, &err) == 0, "tree: %s", err.msg);
    CHECK(t.root == 2, "root %d, expected 2", t.root);
    CHECK(t.n_edges == 3, "%d edges, expected 3 (2->1 at L2, 1->0 and 1->3 at L1)", t.n_edges);
    if (t.n_edges == 3) {
        CHECK(t.edges[0].layer == 2 && t.edges[0].from == 2 && t.edges[0].to == 1, "edge 0");
        CHECK(t.edges[1].layer == 1 && t.edges[1].from == 1 && t.edges[1].to == 0 && fabsf(t.edges[1].score - 0.5f) < 1e-6,
              "edge 1: %d->%d %.3f", t.edges[1].from, t.edges[1].to, t.edges[1].score);
        CHECK(t.edges[2].layer == 1 && t.edges[2].from == 1 && t.edges[2].to == 3, "edge 2");
        CHECK(t.n_nodes == 4 && t.nodes[0].token == 2 && t.nodes[0].layer == 3 && t.nodes[1].layer == 2,
              "nodes");
    }
    lens_attr_tree_free(&t);
}

int main(void)
{
    test_tree_rules();
    test_schedule();
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared/models not found: attribution vs PyTorch on bert-tiny-sst2");
        return check_done("test_attribution");
    }
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert-tiny-sst2", shared);
    lens_err err = {0};
    lens_model *m = lens_model_load(path, &err);
    CHECK(m != NULL, "load %s: %s", path, err.msg);
    json_t *fx = fixture_load("tests/fixtures/attribution_sst2.json");
    const json_t *examples = fixture_list(fx, "examples", "attribution_sst2.json");
    if (m && fx && examples) {
        const int steps = (int)json_integer_value(json_object_get(fx, "steps"));
        const int gauss_nodes = (int)json_integer_value(json_object_get(fx, "gauss_nodes"));
        CHECK(gauss_nodes == LENS_ATTR_GAUSS_NODES, "fixture gauss_nodes %d, LENS_ATTR_GAUSS_NODES %d", gauss_nodes,
              LENS_ATTR_GAUSS_NODES);
        for (size_t i = 0; i < json_array_size(examples); i++)
            test_example(m, json_array_get(examples, i), steps, gauss_nodes);
        test_threads(m, json_array_get(examples, 0), steps);
    }
    json_decref(fx);
    lens_model_free(m);
    return check_done("test_attribution");
}
