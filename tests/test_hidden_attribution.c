/* test_hidden_attribution.c - hidden token attribution (core/hidden_attribution.c)
 * against the float64 autograd reference of
 * tests/reference/hidden_attribution_reference.py on the shared checkpoints.
 *
 * Tolerance: contributions within 1e-4 absolute (they are ratios in [0, 1]
 * of float32 Jacobian norms; float32 vs float64 differences are ~1e-6) and
 * squared norms within 1e-3 relative. Rows of contributions sum to 1. */
#include <jansson.h>
#include <string.h>

#include "core/hidden_attribution.h"
#include "tests/check.h"

static void check_example(const lens_model *m, const char *name, json_t *ex, int idx)
{
    json_t *jids = json_object_get(ex, "input_ids");
    int T = (int)json_array_size(jids);
    int ids[512];
    for (int i = 0; i < T && i < 512; i++) ids[i] = (int)json_integer_value(json_array_get(jids, i));
    lens_hta_opts opts = {.method = LENS_HTA_EXACT};
    lens_hta_result res;
    lens_err err = {0};
    if (lens_hidden_attribution(m, ids, NULL, T, &opts, &res, &err)) {
        CHECK(0, "%s/%d: %s", name, idx, err.msg);
        return;
    }
    json_t *layers = json_object_get(ex, "layers");
    for (size_t k = 0; k < json_array_size(layers); k++) {
        json_t *L = json_array_get(layers, k);
        int layer = (int)json_integer_value(json_object_get(L, "layer"));
        const lens_hta_layer *got = NULL;
        for (int i = 0; i < res.n_layers; i++)
            if (res.layers[i].layer == layer) got = &res.layers[i];
        CHECK(got != NULL, "%s/%d: layer %d missing", name, idx, layer);
        if (!got) continue;
        float *want_c = malloc(sizeof(float) * T * T), *want_n = malloc(sizeof(float) * T * T);
        json_t *jc = json_object_get(L, "contributions"), *jn = json_object_get(L, "norm2");
        double worst_row = 0;
        for (int j = 0; j < T; j++) {
            double row = 0;
            for (int i = 0; i < T; i++) {
                want_c[j * T + i] = (float)json_number_value(json_array_get(json_array_get(jc, j), i));
                want_n[j * T + i] = (float)json_number_value(json_array_get(json_array_get(jn, j), i));
                row += got->contrib[j * T + i];
            }
            worst_row = fabs(row - 1) > worst_row ? fabs(row - 1) : worst_row;
        }
        char what[128];
        snprintf(what, sizeof what, "%s/%d layer %d contributions", name, idx, layer);
        double dc = check_close(what, got->contrib, want_c, (size_t)T * T, 1e-4, 0);
        snprintf(what, sizeof what, "%s/%d layer %d squared norms", name, idx, layer);
        double dn = check_close(what, got->norm2, want_n, (size_t)T * T, 1e-6, 1e-3);
        CHECK(worst_row < 1e-5, "%s/%d layer %d: a row sums to 1 %+g", name, idx, layer, worst_row);
        printf("  %s/%d T=%d layer %d: contributions max |diff| %.2g, norm2 max |diff| %.3g\n", name, idx, T, layer,
               dc, dn);
        free(want_c), free(want_n);
    }
    lens_hta_result_free(&res);
}

int main(void)
{
    const char *shared = check_shared_dir();
    json_t *fix = json_load_file("tests/fixtures/hidden_attribution_shared.json", 0, NULL);
    CHECK(fix != NULL, "cannot read tests/fixtures/hidden_attribution_shared.json");
    if (!shared) {
        SKIP("../shared is absent: hidden attribution vs PyTorch not checked");
    } else if (fix) {
        const char *name;
        json_t *examples;
        json_object_foreach(json_object_get(fix, "models"), name, examples) {
            char dir[512];
            snprintf(dir, sizeof dir, "%s/models/%s", shared, name);
            lens_err err = {0};
            lens_model *m = lens_model_load(dir, &err);
            CHECK(m != NULL, "%s: %s", dir, err.msg);
            if (!m) continue;
            for (size_t i = 0; i < json_array_size(examples); i++)
                check_example(m, name, json_array_get(examples, i), (int)i);
            lens_model_free(m);
        }
    }
    json_decref(fix);
    return check_done("test_hidden_attribution");
}
