/* test_cancel.c - cooperative cancellation of the long analyses whose own
 * tests do not cover it: attribution (core/analysis/attribution.c, checked
 * per step batch) and hidden token attribution (hidden_attribution.c,
 * checked per tangent batch and per layer of the row Jacobians), on the
 * committed demo models (no ../shared needed).
 *
 * Each case runs the analysis with a cancel flag that is either set before
 * the call or set by the progress callback at its first report (fraction
 * < 1, so work is left). The call must answer -1 with LENS_ECANCEL, and no
 * progress report may reach 1 (the rest was not computed). Attention,
 * decomposition, token identity and head importance are cancelled in their
 * own tests. */
#include <stdio.h>
#include <string.h>

#include "core/analysis/attribution.h"
#include "core/analysis/hidden_attribution.h"
#include "tests/check.h"

typedef enum { BEFORE_START, AT_FIRST_PROGRESS } when;

typedef struct {
    volatile int cancel;
    int reports;
    double last;
} watch;

static void on_progress(void *user, double fraction)
{
    watch *w = user;
    w->reports++;
    w->last = fraction;
    if (fraction < 1) lens_cancel_set(&w->cancel, 1);
}

typedef struct {
    const char *model; /* folder under models/ */
    const char *analysis;
    int hta_method;    /* -1: attribution; else a lens_hta_method */
    when when;
} cancel_case;

static int run_case(const lens_model *m, const cancel_case *k, watch *w, lens_err *err)
{
    static const int ids_bert[] = {2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 3};
    const int T = (int)(sizeof ids_bert / sizeof *ids_bert);
    if (k->hta_method < 0) {
        lens_attr_opts o = {.steps = 8, .cancel = &w->cancel, .progress = on_progress, .progress_user = w};
        lens_attribution out;
        int rc = lens_attribution_run(m, ids_bert, NULL, T, &o, &out, err);
        if (!rc) lens_attribution_free(&out);
        return rc;
    }
    lens_hta_opts o = {.method = (lens_hta_method)k->hta_method, .probes = 64, .cancel = &w->cancel,
                       .progress = on_progress, .progress_user = w};
    lens_hta_result out;
    int rc = lens_hidden_attribution(m, ids_bert, NULL, T, &o, &out, err);
    if (!rc) lens_hta_result_free(&out);
    return rc;
}

int main(void)
{
    const cancel_case cases[] = {
        {"demo-sst2", "attribution", -1, BEFORE_START},
        {"demo-sst2", "attribution", -1, AT_FIRST_PROGRESS},
        {"demo-gpt2", "attribution (causal LM)", -1, AT_FIRST_PROGRESS},
        {"demo-sst2", "hidden attribution, exact", LENS_HTA_EXACT, BEFORE_START},
        {"demo-sst2", "hidden attribution, exact", LENS_HTA_EXACT, AT_FIRST_PROGRESS},
        {"demo-gpt2", "hidden attribution, exact", LENS_HTA_EXACT, AT_FIRST_PROGRESS},
        {"demo-gpt2", "hidden attribution, estimate", LENS_HTA_ESTIMATE, AT_FIRST_PROGRESS},
    };
    const int n = (int)(sizeof cases / sizeof *cases);
    CHECK(n == 7, "7 cancellation cases");
    int ran = 0;
    for (int i = 0; i < n; i++) {
        const cancel_case *k = &cases[i];
        char dir[128];
        snprintf(dir, sizeof dir, "models/%s", k->model);
        lens_err err = {0};
        lens_model *m = lens_model_load(dir, &err);
        CHECK(m != NULL, "%s: %s", dir, err.msg);
        if (!m) continue;
        watch w = {.cancel = k->when == BEFORE_START};
        int rc = run_case(m, k, &w, &err);
        const char *at = k->when == BEFORE_START ? "before the start" : "at the first progress report";
        CHECK(rc == -1 && err.code == LENS_ECANCEL, "%s, %s, cancelled %s: rc %d, %s", k->model, k->analysis, at, rc,
              lens_status_name(err.code));
        if (k->when == AT_FIRST_PROGRESS)
            CHECK(w.reports >= 1 && w.last < 1, "%s, %s: %d progress reports, the last %.3f (not 1: work was left)",
                  k->model, k->analysis, w.reports, w.last);
        else
            CHECK(w.reports == 0, "%s, %s: no progress when cancelled before the start (%d)", k->model, k->analysis,
                  w.reports);
        printf("  %-10s %-30s cancelled %-30s -> %s after %d progress reports\n", k->model, k->analysis, at,
               lens_status_name(err.code), w.reports);
        lens_model_free(m);
        ran++;
    }
    CHECK(ran == n, "%d of %d cases ran", ran, n);
    return check_done("test_cancel");
}
