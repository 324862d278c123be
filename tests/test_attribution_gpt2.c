/* test_attribution_gpt2.c - attribution on GPT-2 with target = a next-token
 * id at the last position (core/analysis/attribution.c, the engine classifiers use).
 *
 * Models: a random tiny GPT-2 from lens_mkmodel (always) and
 * gpt2-tiny-wikitext (SKIP without ../shared). Checks, per layer:
 *  - F(0·A) from the attribution engine equals F from lens_forward with every
 *    head of that layer masked (an independent forward path): 1e-5;
 *  - f_full equals the lens_forward next-token probability: 1e-6;
 *  - completeness with m = 200 (right): |Σ Attr − (F(A) − F(0))| ≤ 2e-3 ×
 *    max(|F(A) − F(0)|, 1e-3) + 1e-6: the Riemann error falls as 1/m, and a
 *    wrong gradient anywhere in the backward would break it (printed);
 *  - Attr is zero above the diagonal (causal attention);
 *  - the left sum at m = 40 is within 10 % of F(A) − F(0) when that gap is
 *    > 1e-4 (its error is O(1/m) with the opposite sign). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/attribution.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "tests/check.h"

static double next_prob(const lens_model *m, const int *ids, int T, const unsigned char *mask, int target)
{
    lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .head_mask = mask};
    lens_activations a;
    lens_err err = {0};
    if (lens_forward(m, &b, &fo, &a, &err)) return NAN;
    const int V = m->cfg.vocab_size;
    const float *z = lens_act_logits(m, &a, 0) + (size_t)(T - 1) * V;
    double mx = z[0], s = 0;
    for (int k = 1; k < V; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < V; k++) s += exp(z[k] - mx);
    double p = exp(z[target] - mx) / s;
    lens_activations_free(&a);
    return p;
}

static void check_model_attr(const lens_model *m, const int *ids, int T, const char *what)
{
    const int L = m->cfg.n_layers, NH = m->cfg.n_heads;
    lens_err err = {0};
    lens_attr_opts o = {.steps = 200, .target = -1};
    lens_attribution a, left;
    int rc = lens_attribution_run(m, ids, NULL, T, &o, &a, &err);
    CHECK(rc == 0, "%s: gpt2 attribution: %s", what, err.msg);
    if (rc) return;
    o.riemann = LENS_RIEMANN_LEFT, o.steps = 40;
    CHECK(!lens_attribution_run(m, ids, NULL, T, &o, &left, &err), "%s: left: %s", what, err.msg);
    const double f_full = next_prob(m, ids, T, NULL, a.target);
    CHECK(fabs(f_full - a.f_full) < 1e-6, "%s: f_full %.7f, lens_forward %.7f", what, a.f_full, f_full);
    printf("  %s: T %d, target token %d (predicted %d), F(A) %.6f\n", what, T, a.target, a.predicted, a.f_full);
    for (int l = 0; l < L; l++) {
        const lens_attr_layer *ly = &a.layers[l];
        unsigned char mask[256];
        memset(mask, 1, sizeof mask);
        memset(mask + l * NH, 0, NH);
        const double f0 = next_prob(m, ids, T, mask, a.target);
        CHECK(fabs(f0 - ly->f_zero) < 1e-5, "%s layer %d: F(0) %.7f, masked forward %.7f", what, l + 1, ly->f_zero, f0);
        const double gap = a.f_full - ly->f_zero, miss = ly->attr_sum - gap;
        CHECK(fabs(miss) <= 2e-3 * fmax(fabs(gap), 1e-3) + 1e-6,
              "%s layer %d: completeness Σ Attr %.7f vs F(A) - F(0) %.7f", what, l + 1, ly->attr_sum, gap);
        if (fabs(gap) > 1e-4)
            CHECK(fabs(left.layers[l].attr_sum - gap) < 0.1 * fabs(gap), "%s layer %d: left sum %.7f vs %.7f", what,
                  l + 1, left.layers[l].attr_sum, gap);
        double upper = 0;
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++)
                for (int j = i + 1; j < T; j++) upper = fmax(upper, fabs(ly->attr[((size_t)h * T + i) * T + j]));
        CHECK(upper == 0, "%s layer %d: attribution above the diagonal %g", what, l + 1, upper);
        printf("    layer %d: F(0) %.6f, Σ Attr %.6f (gap %.2e), left %.6f, importance", l + 1, ly->f_zero,
               ly->attr_sum, miss, left.layers[l].attr_sum);
        for (int h = 0; h < NH; h++) printf(" %.3e", ly->importance[h]);
        printf("\n");
    }
    lens_attribution_free(&a);
    lens_attribution_free(&left);
}

int main(void)
{
    char dir[] = "/tmp/lensd-attrgpt2-XXXXXX", path[512];
    lens_err err = {0};
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return check_done("test_attribution_gpt2");
    }
    snprintf(path, sizeof path, "%s/gpt", dir);
    CHECK(!lens_mkmodel("gpt2", "tiny", NULL, 3, path, &err), "mkmodel: %s", err.msg);
    lens_model *m = lens_model_load(path, &err);
    CHECK(m != NULL, "load: %s", err.msg);
    if (m) {
        int ids[9] = {5, 17, 99, 3, 250, 41, 7, 63, 12};
        check_model_attr(m, ids, 9, "random tiny GPT-2");
        lens_attr_opts bad = {.target = m->cfg.vocab_size};
        lens_attribution a;
        CHECK(lens_attribution_run(m, ids, NULL, 9, &bad, &a, &err) == -1 && err.code == LENS_EINVAL,
              "target outside the vocabulary is refused");
        lens_model_free(m);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared not found: attribution on gpt2-tiny-wikitext");
        return check_done("test_attribution_gpt2");
    }
    snprintf(path, sizeof path, "%s/models/gpt2-tiny-wikitext", shared);
    m = lens_model_load(path, &err);
    CHECK(m != NULL, "load gpt2-tiny-wikitext: %s", err.msg);
    if (m) {
        const char *text = "The quick brown fox jumps over the lazy";
        lens_token *toks;
        int T;
        CHECK(!lens_tokenize(m->tok, text, strlen(text), NULL, 0, &toks, &T, &err), "tokenize: %s", err.msg);
        int *ids = malloc(sizeof(int) * T);
        for (int t = 0; t < T; t++) ids[t] = toks[t].id;
        free(toks);
        check_model_attr(m, ids, T, "gpt2-tiny-wikitext");
        free(ids);
        lens_model_free(m);
    }
    return check_done("test_attribution_gpt2");
}
