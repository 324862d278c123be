/* test_context_mixing.c - attention rollout, ALTI, GlobEnc, value zeroing and
 * DecompX (core/analysis/context_mixing.c, decompx.c) against the float64
 * reference written from
 * the authors' released code (tests/reference/context_mixing_reference.py),
 * and the identities the methods promise.
 *
 * Models: the shared bert-tiny-sst2 and gpt2-tiny-wikitext checkpoints and
 * random micro checkpoints (lens_mkmodel) of DistilBERT and RoBERTa
 * classifiers and of two decoder families, Llama and Qwen2 (biased q/k/v,
 * GQA). Every method, both
 * definitions, every layer: contributions and rolled-out matrices within
 * 1e-5 of the reference matrix's largest entry (float32 vs float64: the
 * products, L1 / L2 norms and cosines of C-wide vectors round at ~1e-7
 * relative; the rollout of L layers multiplies that by L). Value zeroing on
 * the random micro checkpoints: 2e-4, as its cosine distances there are
 * ~1e-4 (zeroing one token's values barely moves a random post-norm block's
 * output), and 1 - cos of two float32 vectors that close keeps only
 * ~1e-7 / 1e-4 of relative precision (measured: 2.8e-5 of 0.2 on DistilBERT).
 *
 * DecompX's classifier contributions [T][K] likewise, within 1e-5 of their
 * largest entry.
 *
 * Identities, on every model: rows non-negative and summing to one (rollout,
 * ALTI, value zeroing, GlobEnc and DecompX with "lensd"; the released codes
 * of GlobEnc and DecompX give raw norms); on causal models nothing of a later
 * token reaches an
 * earlier position (value zeroing of a token no query reads gives zero);
 * the rollout of layer 1 is layer 1's matrix. Blocks the decomposition does
 * not define (a norm between attention and the residual sum: OLMo-2, Gemma 2;
 * GPT-NeoX's parallel residual) refuse ALTI and GlobEnc by name, and still
 * run rollout and value zeroing; DecompX is refused on every pre-norm block.
 * DecompX's decomposition is exact: every layer's propagated vectors sum to
 * its hidden states and the classifier contributions to the logits (1e-5 of
 * the largest |value|: float32 sums of T vectors). DecompX asked for some
 * layers runs only their own passes and gives exactly those layers' matrices
 * of the full request. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/context_mixing.h"
#include "core/analysis/decompx.h"
#include "core/model/arch.h"
#include "core/model/mkmodel.h"
#include "tests/check.h"
#include "tests/fixture.h"
#include "tests/reference_run.h"

#define REFERENCE "tests/reference/context_mixing_reference.py"

static const int IDS_MICRO[] = {0, 300, 301, 302, 303, 304, 500, 42, 999, 7, 2};
static const int IDS_BERT[] = {101, 1996, 3185, 2001, 2307, 1998, 1045, 3866, 2009, 1012, 102};
static const int IDS_GPT2[] = {464, 3290, 373, 257, 1310, 286, 262, 995, 13, 383, 318, 257};

/* rows of x [n][T][T] non-negative and (unit) summing to one */
static void check_rows(const char *what, const float *x, int n, int T, int unit)
{
    int bad = 0;
    for (int r = 0; r < n * T; r++) {
        double sum = 0;
        for (int j = 0; j < T; j++) {
            bad += !(x[(size_t)r * T + j] >= 0);
            sum += x[(size_t)r * T + j];
        }
        if (unit) bad += !(fabs(sum - 1) <= 1e-5);
    }
    CHECK(!bad, "%s: %d rows negative%s", what, bad, unit ? " or not summing to one" : "");
}

static void check_causal(const char *what, const float *x, int n, int T)
{
    int bad = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < T; i++)
            for (int j = i + 1; j < T; j++) bad += x[((size_t)k * T + i) * T + j] != 0.0f;
    CHECK(!bad, "%s: %d entries of later tokens at earlier positions", what, bad);
}

static void check_method(const char *name, const lens_model *m, json_t *ref, lens_cm_method method, int paper_code,
                         const int *ids, int T, double vz_tol)
{
    const int L = m->cfg.n_layers;
    char what[200];
    snprintf(what, sizeof what, "%s %s %s", name, lens_cm_method_name(method), paper_code ? "paper-code" : "lensd");
    const lens_cm_opts o = {.method = method, .paper_code = paper_code};
    lens_cm_result r;
    lens_err err = {0};
    if (lens_context_mixing(m, ids, NULL, T, &o, &r, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        return;
    }
    const size_t n = (size_t)L * T * T;
    CHECK(r.n_layers == L && r.layers[0] == 1 && r.layers[L - 1] == L, "%s: layers 1..%d", what, L);
    CHECK(!memcmp(r.contrib, r.rollout, sizeof(float) * T * T), "%s: rollout of layer 1 = layer 1", what);
    const int unit = !((method == LENS_CM_GLOBENC || method == LENS_CM_DECOMPX) && paper_code);
    check_rows(what, r.contrib, L, T, unit);
    check_rows(what, r.rollout, L, T, unit);
    if (lens_has_cap(&m->cfg, LENS_CAP_CAUSAL)) check_causal(what, r.contrib, L, T), check_causal(what, r.rollout, L, T);
    json_t *def = ref ? json_object_get(json_object_get(ref, lens_cm_method_name(method)), paper_code ? "paper-code" : "lensd") : NULL;
    for (int part = 0; ref && part < 2; part++) {
        char label[240];
        snprintf(label, sizeof label, "%s %s", what, part ? "rollout" : "contributions");
        float *want = json_floats(json_object_get(def, part ? "rollout" : "contributions"), n, label);
        if (!want) continue;
        double max = 0;
        for (size_t i = 0; i < n; i++) max = fabs(want[i]) > max ? fabs(want[i]) : max;
        const double tol = method == LENS_CM_VALUE_ZEROING ? vz_tol : 1e-5;
        double d = check_close(label, part ? r.rollout : r.contrib, want, n, tol * max, 0);
        printf("  %-60s max |diff| %.2e of max %.3g\n", label, d, max);
        free(want);
    }
    json_t *cls = json_object_get(def, "classifier");
    CHECK(method != LENS_CM_DECOMPX || (r.classifier != NULL) == (m->cfg.task == LENS_TASK_CLASSIFICATION),
          "%s: classifier contributions on a classifier only", what);
    if (cls && r.classifier) {
        const size_t nk = (size_t)T * r.n_classes;
        float *want = json_floats(cls, nk, what);
        double max = 0;
        for (size_t i = 0; want && i < nk; i++) max = fabs(want[i]) > max ? fabs(want[i]) : max;
        if (want) printf("  %-60s max |diff| %.2e of max %.3g\n", "  classifier",
                         check_close(what, r.classifier, want, nk, 1e-5 * max, 0), max);
        free(want);
    }
    lens_cm_result_free(&r);
}

/* method undefined for m: named by lens_cm_undefined, refused with LENS_EINVAL */
static void check_refused(const char *name, const lens_model *m, lens_cm_method method, const int *ids, int T)
{
    const char *why = lens_cm_undefined(m, method);
    CHECK(why != NULL, "%s: %s defined", name, lens_cm_method_name(method));
    lens_cm_result r;
    lens_err err = {0};
    const lens_cm_opts o = {.method = method, .paper_code = 1};
    const int rc = lens_context_mixing(m, ids, NULL, T, &o, &r, &err);
    CHECK(rc != 0 && err.code == LENS_EINVAL, "%s: %s refused: %s", name, lens_cm_method_name(method),
          rc ? err.msg : "ran");
    if (!rc) lens_cm_result_free(&r);
}

/* DecompX's identities: after every layer sum_k vectors[i][k] = h^l_i, and the
 * classifier's contributions sum to the logits (both definitions). */
static void check_decompx_exact(const char *name, const lens_model *m, const int *ids, int T)
{
    const int L = m->cfg.n_layers, C = m->cfg.d_model;
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_LOGITS};
    lens_activations act = {0};
    lens_err err = {0};
    if (lens_forward(m, &b, &fo, &act, &err)) {
        CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    float *M = malloc(sizeof(float) * 2 * T * T), *sum = malloc(sizeof(float) * T * C);
    for (int paper_code = 1; paper_code >= 0; paper_code--) {
        lens_decompx *d = lens_decompx_new(m, T, 0, &err);
        CHECK(d && M && sum, "%s: DecompX state", name);
        for (int l = 0; d && l < L; l++) {
            if (lens_decompx_layer(d, m, &act, l, paper_code, NULL, NULL, M, M + T * T, &err)) {
                CHECK(0, "%s: DecompX layer %d: %s", name, l + 1, err.msg);
                break;
            }
            const float *v = lens_decompx_vectors(d), *h = lens_act_hidden(m, &act, l + 1, 0);
            double max = 0;
            for (int i = 0; i < T; i++)
                for (int e = 0; e < C; e++) {
                    double s = 0;
                    for (int k = 0; k < T; k++) s += v[((size_t)i * T + k) * C + e];
                    sum[(size_t)i * C + e] = (float)s;
                    max = fabs(h[(size_t)i * C + e]) > max ? fabs(h[(size_t)i * C + e]) : max;
                }
            char what[160];
            snprintf(what, sizeof what, "%s DecompX %s layer %d: sum of the vectors = hidden states", name,
                     paper_code ? "paper-code" : "lensd", l + 1);
            check_close(what, sum, h, (size_t)T * C, 1e-5 * max, 0);
        }
        const int K = m->cfg.n_labels;
        if (d && m->cfg.task == LENS_TASK_CLASSIFICATION) {
            float *cls = malloc(sizeof(float) * T * K), logit_sum[64];
            const float *logits = lens_act_logits(m, &act, 0);
            CHECK(cls && K <= 64 && !lens_decompx_classifier(d, m, &act, paper_code, NULL, cls, &err),
                  "%s: DecompX classifier: %s", name, err.msg);
            double max = 0;
            for (int c = 0; cls && c < K && c < 64; c++) {
                double s = 0;
                for (int k = 0; k < T; k++) s += cls[(size_t)k * K + c];
                logit_sum[c] = (float)s;
                max = fabs(logits[c]) > max ? fabs(logits[c]) : max;
            }
            char what[160];
            snprintf(what, sizeof what, "%s DecompX %s: classifier contributions sum to the logits", name,
                     paper_code ? "paper-code" : "lensd");
            if (cls && K <= 64) check_close(what, logit_sum, logits, (size_t)K, 1e-5 * max, 0);
            free(cls);
        }
        lens_decompx_free(d);
    }
    free(M), free(sum);
    lens_activations_free(&act);
}

static void run_model(const char *name, const char *dir, const int *ids, int T, int with_reference, double vz_tol,
                      int decompx)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", name, err.msg);
    if (!m) return;
    printf("%s\n", name);
    json_t *ref = NULL;
    if (with_reference) {
        char *req = reference_request(dir, ids, T, "");
        ref = req ? reference_run(REFERENCE, req) : NULL;
        free(req);
        CHECK(ref != NULL, "%s: the reference script failed", name);
    }
    for (int method = 0; method < LENS_CM_COUNT; method++) {
        if (method == LENS_CM_DECOMPX && !decompx) {
            check_refused(name, m, LENS_CM_DECOMPX, ids, T);
            continue;
        }
        for (int paper_code = 1; paper_code >= 0; paper_code--)
            check_method(name, m, ref, (lens_cm_method)method, paper_code, ids, T, vz_tol);
    }
    if (decompx) check_decompx_exact(name, m, ids, T);
    json_decref(ref);
    lens_model_free(m);
}

/* A micro checkpoint of arch in a temporary folder: run_model, or (undefined)
 * ALTI and GlobEnc refused and the others still run. */
static void run_micro(const char *arch, const char *task, int with_reference, int undefined)
{
    char dir[] = "/tmp/lensd-cm-model-XXXXXX", name[96];
    lens_err err = {0};
    if (micro_checkpoint(arch, task, dir, name, sizeof name)) {
        remove_dir(dir);
        return;
    }
    const int T = (int)(sizeof IDS_MICRO / sizeof *IDS_MICRO);
    if (!undefined) {
        run_model(name, dir, IDS_MICRO, T, with_reference, 2e-4, strcmp(task, "causal-lm") != 0);
    } else {
        lens_model *m = lens_model_load(dir, &err);
        CHECK(m != NULL, "%s: %s", name, err.msg);
        for (int method = 0; m && method < LENS_CM_COUNT; method++) {
            const char *why = lens_cm_undefined(m, (lens_cm_method)method);
            const int decomposes = method == LENS_CM_ALTI || method == LENS_CM_GLOBENC || method == LENS_CM_DECOMPX;
            CHECK(decomposes ? why != NULL : why == NULL, "%s: %s %s", name, lens_cm_method_name(method),
                  why ? why : "defined");
            lens_cm_result r;
            const lens_cm_opts o = {.method = (lens_cm_method)method, .paper_code = 1};
            const int rc = lens_context_mixing(m, IDS_MICRO, NULL, T, &o, &r, &err);
            CHECK(decomposes ? rc != 0 && err.code == LENS_EINVAL : rc == 0, "%s: %s runs: %s", name,
                  lens_cm_method_name(method), rc ? err.msg : "ok");
            if (!rc) {
                check_rows(name, r.contrib, r.n_layers, T, 1);
                lens_cm_result_free(&r);
            }
        }
        lens_model_free(m);
    }
    remove_dir(dir);
}

/* A random BERT classifier of preset written to dir (a mkdtemp template)
 * and loaded; NULL, and a failed check, when that fails. */
static lens_model *temp_bert(const char *preset, char *dir)
{
    lens_err err = {0};
    lens_model *m = NULL;
    if (!mkdtemp(dir)) snprintf(err.msg, sizeof err.msg, "mkdtemp %s failed", dir);
    else if (lens_mkmodel("bert", preset, "classification", 3, dir, &err) == 0) m = lens_model_load(dir, &err);
    CHECK(m != NULL, "bert %s: %s", preset, err.msg);
    return m;
}

/* layers picks, value zeroing in chunks equals one pass, bad layers refused,
 * DecompX's classifier only with layer L, its memory bound and cancellation */
static void check_options(void)
{
    char dir[] = "/tmp/lensd-cm-opt-XXXXXX";
    lens_err err = {0};
    lens_model *m = temp_bert("micro", dir);
    const int T = (int)(sizeof IDS_MICRO / sizeof *IDS_MICRO), L = m ? m->cfg.n_layers : 0;
    if (m) {
        lens_cm_result all, one, chunked;
        const int last[] = {L};
        lens_cm_opts o = {.method = LENS_CM_VALUE_ZEROING, .paper_code = 1};
        CHECK(!lens_context_mixing(m, IDS_MICRO, NULL, T, &o, &all, &err), "value zeroing: %s", err.msg);
        o.layers = last, o.n_layers = 1;
        o.max_scratch_bytes = 1; /* one copy per pass */
        CHECK(!lens_context_mixing(m, IDS_MICRO, NULL, T, &o, &chunked, &err), "value zeroing chunked: %s", err.msg);
        o.max_scratch_bytes = 0;
        CHECK(!lens_context_mixing(m, IDS_MICRO, NULL, T, &o, &one, &err), "value zeroing layer %d: %s", L, err.msg);
        const size_t TT = (size_t)T * T;
        check_close("layers = [L] picks layer L (rollout from layer 1)", one.rollout, all.rollout + (L - 1) * TT, TT,
                    0, 0);
        check_close("value zeroing one copy per pass = all copies in one", chunked.contrib, one.contrib, TT, 1e-6, 0);
        lens_cm_result_free(&all), lens_cm_result_free(&one), lens_cm_result_free(&chunked);
        const int bad[] = {2, 1};
        o.layers = bad, o.n_layers = 2;
        CHECK(lens_context_mixing(m, IDS_MICRO, NULL, T, &o, &one, &err) && err.code == LENS_EINVAL,
              "layers out of order refused");
        /* DecompX: its classifier needs layer L; its T x T vectors have a memory bound; cancel stops it */
        const int first[] = {1};
        lens_cm_opts dx = {.method = LENS_CM_DECOMPX, .paper_code = 1, .layers = first, .n_layers = 1};
        CHECK(!lens_context_mixing(m, IDS_MICRO, NULL, T, &dx, &one, &err) && !one.classifier,
              "decompx layers [1]: no classifier (%s)", err.msg);
        lens_cm_result_free(&one);
        dx.layers = last;
        CHECK(!lens_context_mixing(m, IDS_MICRO, NULL, T, &dx, &one, &err) && one.classifier && one.n_classes == m->cfg.n_labels && one.n_classes > 1,
              "decompx layers [L]: the classifier's %d classes (got %d)", m->cfg.n_labels, one.n_classes);
        lens_cm_result_free(&one);
        dx.max_scratch_bytes = lens_decompx_bytes(m, T) - 1;
        CHECK(lens_context_mixing(m, IDS_MICRO, NULL, T, &dx, &one, &err) && err.code == LENS_ELIMIT,
              "decompx over its memory bound: LENS_ELIMIT (%s)", err.msg);
        const volatile int cancel = 1;
        dx.max_scratch_bytes = 0, dx.cancel = &cancel;
        CHECK(lens_context_mixing(m, IDS_MICRO, NULL, T, &dx, &one, &err) && err.code == LENS_ECANCEL,
              "decompx cancelled: LENS_ECANCEL (%s)", err.msg);
        lens_model_free(m);
    }
    remove_dir(dir);
}

/* DecompX skips what is not asked: a layer's own pass runs only for the layers
 * asked, so a request for some layers must give exactly (0 tolerance: the same
 * arithmetic in the same order) the matrices of those layers in the full
 * request, and the classifier when the layers reach L. On BERT small (4
 * layers): [2, 4] skips layers 1 and 3's own passes, [3] also stops before
 * layer 4. The cost model counts the passes: one own pass per asked layer
 * after the first, none for layer 1 (its own pass is its propagated one). */
static void check_decompx_layers(void)
{
    char dir[] = "/tmp/lensd-cm-dx-XXXXXX";
    lens_err err = {0};
    lens_model *m = temp_bert("small", dir);
    CHECK(!m || m->cfg.n_layers == 4, "bert small: 4 layers (%d)", m ? m->cfg.n_layers : 0);
    const int T = (int)(sizeof IDS_BERT / sizeof *IDS_BERT);
    const size_t TT = (size_t)T * T;
    for (int paper_code = 1; m && paper_code >= 0; paper_code--) {
        lens_cm_opts o = {.method = LENS_CM_DECOMPX, .paper_code = paper_code};
        lens_cm_result all, some;
        if (lens_context_mixing(m, IDS_BERT, NULL, T, &o, &all, &err)) {
            CHECK(0, "decompx all layers: %s", err.msg);
            break;
        }
        static const int pick[][2] = {{2, 4}, {3, 0}};
        for (int p = 0; p < 2; p++) {
            o.layers = pick[p], o.n_layers = pick[p][1] ? 2 : 1;
            if (lens_context_mixing(m, IDS_BERT, NULL, T, &o, &some, &err)) {
                CHECK(0, "decompx layers %d: %s", pick[p][0], err.msg);
                continue;
            }
            for (int k = 0; k < o.n_layers; k++) {
                const int l = o.layers[k];
                char what[160];
                snprintf(what, sizeof what, "decompx %s, %d of the layers asked: layer %d's contributions as asked "
                         "with all", paper_code ? "paper-code" : "lensd", o.n_layers, l);
                CHECK(some.layers[k] == l, "%s (layer %d reported)", what, some.layers[k]);
                check_close(what, some.contrib + k * TT, all.contrib + (l - 1) * TT, TT, 0, 0);
                snprintf(what, sizeof what, "decompx %s, %d of the layers asked: layer %d's rollout as asked with "
                         "all", paper_code ? "paper-code" : "lensd", o.n_layers, l);
                check_close(what, some.rollout + k * TT, all.rollout + (l - 1) * TT, TT, 0, 0);
            }
            const int reaches_L = o.layers[o.n_layers - 1] == 4;
            CHECK((some.classifier != NULL) == reaches_L && all.classifier, "decompx: a classifier with layer L only");
            if (reaches_L && some.classifier && all.classifier)
                check_close("decompx: the classifier of layers [2, 4] as that of all", some.classifier, all.classifier,
                            (size_t)T * all.n_classes, 0, 0);
            lens_cm_result_free(&some);
        }
        lens_cm_result_free(&all);
    }
    if (m) {
        const int last[] = {4}, two[] = {2, 4}, one[] = {1, 4};
        const double f_all = lens_decompx_flops(m, T, NULL, 0), f_last = lens_decompx_flops(m, T, last, 1);
        const double own = lens_decompx_flops(m, T, two, 2) - f_last;
        CHECK(own > 0 && fabs(f_all - f_last - 2 * own) <= 1e-12 * f_all,
              "decompx flops: all layers = [L] + 2 own passes (layers 2, 3; %g, %g, %g)", f_all, f_last, own);
        CHECK(lens_decompx_flops(m, T, one, 2) == f_last, "decompx flops: layer 1's own pass is its propagated one");
    }
    lens_model_free(m);
    remove_dir(dir);
}

int main(void)
{
    const int with_reference = reference_available();
    const char *shared = check_shared_dir();
    if (shared) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/models/bert-tiny-sst2", shared);
        run_model("bert-tiny-sst2", dir, IDS_BERT, (int)(sizeof IDS_BERT / sizeof *IDS_BERT), with_reference, 1e-5, 1);
        snprintf(dir, sizeof dir, "%s/models/gpt2-tiny-wikitext", shared);
        run_model("gpt2-tiny-wikitext", dir, IDS_GPT2, (int)(sizeof IDS_GPT2 / sizeof *IDS_GPT2), with_reference, 1e-5,
                  0);
    } else {
        SKIP("no ../shared: the shared checkpoints are not compared");
    }
    run_micro("distilbert", "classification", with_reference, 0);
    run_micro("roberta", "classification", with_reference, 0);
    run_micro("llama", "causal-lm", with_reference, 0);
    run_micro("qwen2", "causal-lm", with_reference, 0);
    run_micro("olmo2", "causal-lm", 0, 1);
    run_micro("gemma2", "causal-lm", 0, 1);
    run_micro("gpt_neox", "causal-lm", 0, 1);
    check_options();
    check_decompx_layers();
    return check_done("test_context_mixing");
}
