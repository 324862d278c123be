/* test_logit_attribution.c - direct logit attribution
 * (core/analysis/logit_attribution.c) against the float64 reference
 * tests/reference/logit_attribution_reference.py, which computes every
 * piece from the model's own blocks (the MLP terms from each block's real
 * output, the last one included), and its identities.
 *
 * Models: the shared gpt2-tiny-wikitext checkpoint and random micro
 * checkpoints of Llama, Qwen2 (attention biases), Gemma (RMSNorm 1 + w,
 * scaled embeddings) and GPT-NeoX (LayerNorm, parallel residual). Each term
 * (embed, bias, every head, every MLP) and the logit within 1e-4 of the
 * largest of them (float32 sums of C-wide products against float64; the
 * terms are O(1..10), their rounding ~1e-6 relative).
 *
 * Identities: total = logit (1e-5 of the largest term); logit = the
 * forward's LM logit of target (minus foil's) at the position (1e-4
 * relative); the attribution of a logit difference is, term by term, the
 * difference of the two logits' attributions (1e-5 of the largest term).
 * Refusals: the foil equal to the target, a position outside the tokens, a
 * classifier, and decoders whose blocks normalise the attention output
 * before the residual sum (Gemma 2, OLMo-2). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/logit_attribution.h"
#include "core/model/mkmodel.h"
#include "tests/check.h"
#include "tests/fixture.h"
#include "tests/reference_run.h"

#define REFERENCE "tests/reference/logit_attribution_reference.py"

static const int IDS_MICRO[] = {0, 300, 301, 302, 303, 304, 500, 42, 999, 7, 2};
static const int IDS_GPT2[] = {464, 3290, 373, 257, 1310, 286, 262, 995, 13, 383, 318, 257};

static json_t *reference(const char *dir, const int *ids, int T, int p, int target, int foil)
{
    char extra[160];
    int n = snprintf(extra, sizeof extra, ", \"position\": %d, \"target\": %d", p, target);
    if (foil >= 0) snprintf(extra + n, sizeof extra - (size_t)n, ", \"foil\": %d", foil);
    char *req = reference_request(dir, ids, T, extra);
    json_t *ref = req ? reference_run(REFERENCE, req) : NULL;
    free(req);
    return ref;
}

static double largest_term(const lens_dla_result *r)
{
    double mx = fmax(fabs(r->embed), fabs(r->bias));
    for (int k = 0; k < r->n_layers * r->n_heads; k++) mx = fmax(mx, fabs(r->heads[k]));
    for (int l = 0; l < r->n_layers; l++) mx = fmax(mx, fabs(r->mlps[l]));
    return fmax(mx, 1e-3);
}

/* the terms of r as one float array: embed, bias, heads [L][NH], mlps [L], logit */
static float *terms(const lens_dla_result *r, size_t *n)
{
    const size_t LH = (size_t)r->n_layers * r->n_heads;
    *n = 3 + LH + (size_t)r->n_layers;
    float *t = malloc(sizeof(float) * *n);
    if (!t) return NULL;
    t[0] = (float)r->embed, t[1] = (float)r->bias;
    for (size_t k = 0; k < LH; k++) t[2 + k] = (float)r->heads[k];
    for (int l = 0; l < r->n_layers; l++) t[2 + LH + l] = (float)r->mlps[l];
    t[*n - 1] = (float)r->logit;
    return t;
}

static void check_case(const char *name, const char *dir, const lens_model *m, const int *ids, int T, int p,
                       int target, int foil, int with_reference)
{
    char what[200];
    snprintf(what, sizeof what, "%s p=%d target=%d foil=%d", name, p, target, foil);
    const lens_dla_opts o = {.position = p, .target = target, .foil = foil};
    lens_dla_result r;
    lens_err err = {0};
    if (lens_logit_attribution(m, ids, T, &o, &r, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    const double big = largest_term(&r);
    CHECK(fabs(r.total - r.logit) <= 1e-5 * big, "%s: total %.8g = logit %.8g", what, r.total, r.logit);
    /* the forward's own logits (no soft-cap on these families) */
    lens_activations act;
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS};
    if (!lens_forward(m, &b, &fo, &act, &err)) {
        const float *lg = lens_act_logits(m, &act, 0) + (size_t)p * m->cfg.vocab_size;
        const double want = lg[target] - (foil >= 0 ? lg[foil] : 0);
        CHECK(fabs(r.logit - want) <= 1e-4 * fmax(1, fabs(want)), "%s: logit %.8g = the forward's %.8g", what,
              r.logit, want);
        lens_activations_free(&act);
    }
    if (foil >= 0) { /* the difference's attribution = the difference of the two attributions */
        lens_dla_result a, f;
        const lens_dla_opts oa = {.position = p, .target = target, .foil = -1};
        const lens_dla_opts of = {.position = p, .target = foil, .foil = -1};
        if (!lens_logit_attribution(m, ids, T, &oa, &a, &err) && !lens_logit_attribution(m, ids, T, &of, &f, &err)) {
            size_t n = 0;
            float *ta = terms(&a, &n), *tf = terms(&f, &n), *td = terms(&r, &n);
            for (size_t k = 0; ta && tf && k < n; k++) ta[k] -= tf[k];
            if (ta && tf && td) {
                char label[320];
                snprintf(label, sizeof label, "%s: logit difference = difference of the logits, term by term", what);
                check_close(label, td, ta, n, 1e-5 * big, 0);
            }
            free(ta), free(tf), free(td);
            lens_dla_result_free(&a), lens_dla_result_free(&f);
        }
    }
    json_t *ref = with_reference ? reference(dir, ids, T, p, target, foil) : NULL;
    CHECK(!with_reference || ref, "%s: the reference script failed", what);
    if (ref) {
        const size_t LH = (size_t)r.n_layers * r.n_heads;
        size_t n = 0;
        float *got = terms(&r, &n), *want = malloc(sizeof(float) * n);
        float *heads = json_floats(json_object_get(ref, "heads"), LH, what);
        float *mlps = json_floats(json_object_get(ref, "mlps"), (size_t)r.n_layers, what);
        if (got && want && heads && mlps) {
            want[0] = (float)json_number_value(json_object_get(ref, "embed"));
            want[1] = (float)json_number_value(json_object_get(ref, "bias"));
            memcpy(want + 2, heads, sizeof(float) * LH);
            memcpy(want + 2 + LH, mlps, sizeof(float) * r.n_layers);
            want[n - 1] = (float)json_number_value(json_object_get(ref, "logit"));
            char label[320];
            snprintf(label, sizeof label, "%s: embed, bias, heads, mlps, logit vs the reference", what);
            double d = check_close(label, got, want, n, 1e-4 * big, 0);
            printf("  %-70s max |diff| %.2e of max term %.3g\n", what, d, big);
        }
        free(got), free(want), free(heads), free(mlps);
        json_decref(ref);
    }
    lens_dla_result_free(&r);
}

static void run_model(const char *name, const char *dir, const int *ids, int T, int with_reference)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", name, err.msg);
    if (!m) return;
    printf("%s\n", name);
    check_case(name, dir, m, ids, T, T - 1, ids[1], ids[2], with_reference);
    check_case(name, dir, m, ids, T, 2, ids[4], -1, with_reference);
    lens_dla_result r;
    lens_dla_opts o = {.position = T - 1, .target = ids[1], .foil = ids[1]};
    CHECK(lens_logit_attribution(m, ids, T, &o, &r, &err) && err.code == LENS_EINVAL, "%s: foil = target refused",
          name);
    o.foil = -1, o.position = T;
    CHECK(lens_logit_attribution(m, ids, T, &o, &r, &err) && err.code == LENS_EINVAL, "%s: position T refused", name);
    lens_model_free(m);
}

static void run_micro(const char *arch, const char *task, int with_reference, int supported)
{
    char dir[] = "/tmp/lensd-dla-model-XXXXXX", name[96];
    lens_err err = {0};
    if (micro_checkpoint(arch, task, dir, name, sizeof name)) {
        remove_dir(dir);
        return;
    }
    const int T = (int)(sizeof IDS_MICRO / sizeof *IDS_MICRO);
    if (supported) {
        run_model(name, dir, IDS_MICRO, T, with_reference);
    } else {
        lens_model *m = lens_model_load(dir, &err);
        const char *why = NULL;
        CHECK(m && !lens_model_supports(m, LENS_ANALYSIS_LOGIT_ATTRIBUTION, &why) && why, "%s: not supported (%s)",
              name, why ? why : "-");
        lens_dla_result r;
        const lens_dla_opts o = {.position = 0, .target = 5, .foil = -1};
        CHECK(m && lens_logit_attribution(m, IDS_MICRO, T, &o, &r, &err) && err.code == LENS_EINVAL, "%s: refused",
              name);
        lens_model_free(m);
    }
    remove_dir(dir);
}

int main(void)
{
    const int with_reference = reference_available();
    const char *shared = check_shared_dir();
    if (shared) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/models/gpt2-tiny-wikitext", shared);
        run_model("gpt2-tiny-wikitext", dir, IDS_GPT2, (int)(sizeof IDS_GPT2 / sizeof *IDS_GPT2), with_reference);
    } else {
        SKIP("no ../shared: the shared GPT-2 checkpoint is not compared");
    }
    run_micro("llama", "causal-lm", with_reference, 1);
    run_micro("qwen2", "causal-lm", with_reference, 1);
    run_micro("gemma", "causal-lm", with_reference, 1);
    run_micro("gpt_neox", "causal-lm", with_reference, 1);
    run_micro("gemma2", "causal-lm", 0, 0);
    run_micro("olmo2", "causal-lm", 0, 0);
    run_micro("bert", "classification", 0, 0);
    return check_done("test_logit_attribution");
}
