/* test_attention.c - effective attention and identifiability (core/analysis/attention.c)
 * against tests/reference/attention_reference.py (PyTorch, float64) and
 * against the identities the method must satisfy.
 *
 *   synthetic   tests/fixtures/attention_synthetic.json: small random heads
 *               (DV, DK < T, one V with a duplicated column) where the
 *               key-aware dimension is not 0; plus heads built here: known
 *               ranks, and causal rows checked one prefix at a time.
 *   mkmodel     random BERT and GPT-2 "tiny" checkpoints written by
 *               lens_mkmodel into a temporary folder (runs without ../shared).
 *   shared      the shared checkpoints at T = 10 and T = 100 (above DV = 64)
 *               against tests/fixtures/attention_<model>.json.
 *
 * Tolerances and why.
 *   Identities, relative 1e-4: ||A_eff V - A V|| <= 1e-4 ||A V|| (the issue's
 *   bar; float32 output of a double projection measures ~1e-7).
 *   Recomputed softmax(Q K^T / sqrt DK) vs kept probabilities: 1e-5 (same
 *   float32 ops as the forward pass, different GEMM shapes).
 *   Effective entries vs the reference: 1e-5 on synthetic heads (same float32
 *   inputs, both in double) and 1e-4 on checkpoints (A and V themselves differ
 *   from PyTorch's by up to ~1e-5; the projection onto col(V) can amplify that
 *   by the condition number of V). Ranks and dimensions: exact. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/model/arch.h"
#include "core/analysis/attention.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "tests/check.h"
#include "tests/fixture.h"

#define TOL_IDENTITY 1e-4  /* relative, ||A_eff V - A V|| / ||A V|| */
#define TOL_SCORES 1e-5    /* recomputed softmax vs kept probabilities */
#define TOL_SYNTH 1e-5     /* effective entries, synthetic fixture (same inputs) */
#define TOL_CKPT 1e-4      /* effective entries and statistics, checkpoints */

/* ---------------------------------------------------------------- helpers */

static int json_int(const json_t *o, const char *key) { return (int)json_integer_value(json_object_get(o, key)); }

static json_t *load_fixture(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/%s", name);
    return fixture_load(path); /* make fixtures regenerates it (tests/reference/attention_reference.py) */
}

static uint32_t rng_state = 12345;
static float uniform(void) /* xorshift32, in [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 17, rng_state ^= rng_state << 5;
    return (float)(rng_state / 2147483648.0 - 1.0);
}

/* Row-wise softmax of scores [T][T] (causal: columns j <= i). */
static void softmax_rows(float *x, int T, int causal)
{
    for (int i = 0; i < T; i++) {
        float *row = x + (size_t)i * T;
        const int n = causal ? i + 1 : T;
        double mx = row[0], sum = 0;
        for (int j = 1; j < n; j++) mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < n; j++) sum += exp(row[j] - mx);
        for (int j = 0; j < T; j++) row[j] = j < n ? (float)(exp(row[j] - mx) / sum) : 0.0f;
    }
}

/* max_i ||(E - A)_i V|| / ||A V||_F computed here, independently of the library. */
static double identity_error(const float *A, const float *E, const float *V, int ldv, int T, int DV)
{
    double num = 0, den = 0;
    for (int i = 0; i < T; i++) {
        double row = 0;
        for (int c = 0; c < DV; c++) {
            double av = 0, ev = 0;
            for (int j = 0; j < T; j++) av += (double)A[(size_t)i * T + j] * V[(size_t)j * ldv + c],
                                        ev += (double)E[(size_t)i * T + j] * V[(size_t)j * ldv + c];
            den += av * av, row += (ev - av) * (ev - av);
        }
        num = row > num ? row : num;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The identities every head satisfies. */
/* keys: how many keys the last row sees (T; W in a sliding window of W < T) */
static void check_head_identities(const char *label, const float *A, const float *E, const float *V, int ldv, int T,
                                  int DV, int causal, int keys, const lens_head_attention *r)
{
    CHECK(r->ok, "%s: head failed: %s", label, r->err.msg);
    if (!r->ok) return;
    double id = identity_error(A, E, V, ldv, T, DV);
    CHECK(id <= TOL_IDENTITY, "%s: ||A_eff V - A V|| / ||A V|| = %g > %g", label, id, TOL_IDENTITY);
    CHECK(r->rank >= 0 && r->rank <= (keys < DV ? keys : DV), "%s: rank %d not in 0..min(keys %d, DV %d)", label,
          r->rank, keys, DV);
    CHECK(r->null_dim == keys - r->rank && r->identifiable == (r->rank == keys), "%s: null_dim %d / identifiable %d",
          label, r->null_dim, r->identifiable);
    if (keys > DV) CHECK(r->null_dim >= keys - DV, "%s: null_dim %d < keys - DV = %d", label, r->null_dim, keys - DV);
    CHECK(r->stochastic_null_dim == keys - r->rank_v1, "%s: stochastic_null_dim %d, rank([V,1]) %d of %d keys", label,
          r->stochastic_null_dim, r->rank_v1, keys);
    CHECK(r->rank_v1 >= r->rank && r->rank_v1 <= r->rank + 1, "%s: rank([V,1]) %d vs rank(V) %d", label, r->rank_v1,
          r->rank);
    if (r->rank == T) {
        int same = 1;
        for (size_t k = 0; k < (size_t)T * T; k++) same &= E[k] == A[k];
        CHECK(same, "%s: rank = T but A_eff != A", label);
    }
    if (causal) {
        int future = 0;
        for (int i = 0; i < T; i++)
            for (int j = i + 1; j < T; j++) future += E[(size_t)i * T + j] != 0.0f;
        CHECK(future == 0, "%s: %d effective weights on future tokens", label, future);
    }
    CHECK(r->max_identity_residual <= TOL_IDENTITY, "%s: library self-check residual %g", label,
          r->max_identity_residual);
}

/* ---------------------------------------------------------------- synthetic */

static void test_synthetic_fixture(void)
{
    printf("synthetic heads vs attention_synthetic.json\n");
    json_t *fx = load_fixture("attention_synthetic.json");
    if (!fx) return;
    const json_t *cases = fixture_list(fx, "cases", "attention_synthetic.json");
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        const json_t *cs = json_array_get(cases, ci);
        const char *name = json_string_value(json_object_get(cs, "name"));
        const int T = json_int(cs, "T"), DK = json_int(cs, "DK"), DV = json_int(cs, "DV");
        const int causal = json_is_true(json_object_get(cs, "causal"));
        float *A = json_floats(json_object_get(cs, "A"), (size_t)T * T, name);
        float *V = json_floats(json_object_get(cs, "V"), (size_t)T * DV, name);
        float *Q = json_floats(json_object_get(cs, "Q"), (size_t)T * DK, name);
        float *want = json_floats(json_object_get(cs, "effective"), (size_t)T * T, name);
        float *E = malloc((size_t)T * T * sizeof *E), *N = malloc((size_t)T * T * sizeof *N);
        if (A && V && Q && want && E && N) {
            lens_attention_opts opts = {.key_aware = 1, .null_component = 1};
            lens_head_attention r;
            lens_err err = {0};
            int rc = lens_attention_head(A, V, DV, Q, DK, T, DV, DK, causal, 0, NULL, NULL, &opts, E, N, &r, &err);
            CHECK(rc == 0, "%s: %s", name, err.msg);
            char what[128];
            snprintf(what, sizeof what, "%s effective", name);
            check_close(what, E, want, (size_t)T * T, TOL_SYNTH, 0);
            check_head_identities(name, A, E, V, DV, T, DV, causal, T, &r);
            double worst = 0;
            for (size_t k = 0; k < (size_t)T * T; k++) worst = fmax(worst, fabs((double)N[k] - (A[k] - E[k])));
            CHECK(worst <= 1e-7, "%s: null component != raw - effective (%g)", name, worst);
            const json_t *ka = json_object_get(cs, "key_aware");
            CHECK(r.rank == json_int(cs, "rank") && r.rank_v1 == json_int(cs, "rank_v1"),
                  "%s: rank %d rank_v1 %d, reference %d %d", name, r.rank, r.rank_v1, json_int(cs, "rank"),
                  json_int(cs, "rank_v1"));
            CHECK(r.key_aware_method == LENS_KEY_AWARE_EXPLICIT && r.key_aware_dim == json_int(ka, "explicit") &&
                      r.rank_j == json_int(ka, "rank_j") && r.rank_mj == json_int(ka, "rank_mj"),
                  "%s: key-aware %s dim %d (rank J %d, MJ %d), reference %d (%d, %d)", name,
                  lens_key_aware_method_name(r.key_aware_method), r.key_aware_dim, r.rank_j, r.rank_mj,
                  json_int(ka, "explicit"), json_int(ka, "rank_j"), json_int(ka, "rank_mj"));
            CHECK(r.rank_q == json_int(ka, "rank_q"), "%s: rank(Q) %d, reference %d", name, r.rank_q,
                  json_int(ka, "rank_q"));
            /* The dense SVDs of J and M J (the method before the Gram/inertia one) give the same ranks. */
            lens_attention_opts dense = {.key_aware = 1, .key_aware_dense = 1};
            lens_head_attention rd;
            rc = lens_attention_head(A, V, DV, Q, DK, T, DV, DK, causal, 0, NULL, NULL, &dense, E, NULL, &rd, &err);
            CHECK(rc == 0 && rd.rank_j == r.rank_j && rd.rank_mj == r.rank_mj && rd.key_aware_dim == r.key_aware_dim,
                  "%s: dense SVD ranks J %d MJ %d, Gram %d %d", name, rd.rank_j, rd.rank_mj, r.rank_j, r.rank_mj);
            /* Over the size limit: closed form when rank(Q) = T (must agree with the explicit
             * count), otherwise skipped with a reason. */
            opts.key_aware_max_unknowns = 1;
            rc = lens_attention_head(A, V, DV, Q, DK, T, DV, DK, causal, 0, NULL, NULL, &opts, E, NULL, &r, &err);
            CHECK(rc == 0, "%s (limit 1): %s", name, err.msg);
            if (json_int(ka, "rank_q") == T)
                CHECK(r.key_aware_method == LENS_KEY_AWARE_CLOSED_FORM && r.key_aware_dim == json_int(ka, "explicit") &&
                          r.key_aware_dim == json_int(ka, "closed_form"),
                      "%s: closed form %s %d, explicit %d", name, lens_key_aware_method_name(r.key_aware_method),
                      r.key_aware_dim, json_int(ka, "explicit"));
            else
                CHECK(r.key_aware_method == LENS_KEY_AWARE_SKIPPED && r.key_aware_dim == -1 &&
                          strstr(r.key_aware_note, "exceeds the limit"),
                      "%s: over the limit: %s %d '%s'", name, lens_key_aware_method_name(r.key_aware_method),
                      r.key_aware_dim, r.key_aware_note);
        }
        free(A), free(V), free(Q), free(want), free(E), free(N);
    }
    json_decref(fx);
}

/* Heads with a known rank: V with duplicated columns and T > DV. */
static void test_known_rank(void)
{
    printf("known ranks\n");
    const int T = 40, DV = 8, ld = 10;
    float *V = malloc(sizeof(float) * T * ld), *A = malloc(sizeof(float) * T * T), *E = malloc(sizeof(float) * T * T);
    /* columns 0..4 random, 5 = 0, 6 = 1 + 2, 7 = 2 * 3: rank 5 */
    for (int t = 0; t < T; t++) {
        float *v = V + t * ld;
        for (int c = 0; c < 5; c++) v[c] = uniform();
        v[5] = v[0], v[6] = v[1] + v[2], v[7] = 2 * v[3];
        v[8] = v[9] = 1e30f; /* outside the head: the row stride must be honoured */
    }
    for (int causal = 0; causal <= 1; causal++) {
        for (size_t k = 0; k < (size_t)T * T; k++) A[k] = 3 * uniform();
        softmax_rows(A, T, causal);
        lens_head_attention r;
        lens_err err = {0};
        int rc = lens_attention_head(A, V, ld, NULL, 0, T, DV, 0, causal, 0, NULL, NULL, NULL, E, NULL, &r, &err);
        CHECK(rc == 0, "known rank: %s", err.msg);
        CHECK(r.rank == 5 && r.null_dim == T - 5 && !r.identifiable && r.rank_v1 == 6,
              "duplicated columns (causal %d): rank %d null %d rank_v1 %d, want 5 35 6", causal, r.rank, r.null_dim,
              r.rank_v1);
        check_head_identities(causal ? "known rank causal" : "known rank", A, E, V, ld, T, DV, causal, T, &r);
        int fast_rank = -1;
        float *F = malloc(sizeof(float) * T * T);
        rc = lens_attention_effective(A, V, ld, T, DV, causal, 0, F, &fast_rank, &err);
        CHECK(rc == 0 && fast_rank == 5, "lens_attention_effective: rc %d rank %d", rc, fast_rank);
        check_close("lens_attention_effective == lens_attention_head", F, E, (size_t)T * T, 0, 0);
        free(F);
    }
    /* T <= DV with independent rows: identifiable, A_eff = A exactly. */
    const int Ts = 6;
    for (size_t k = 0; k < (size_t)Ts * Ts; k++) A[k] = uniform();
    softmax_rows(A, Ts, 0);
    for (int t = 0; t < Ts; t++)
        for (int c = 0; c < ld; c++) V[t * ld + c] = uniform();
    lens_head_attention r;
    lens_err err = {0};
    lens_attention_head(A, V, ld, NULL, 0, Ts, DV, 0, 0, 0, NULL, NULL, NULL, E, NULL, &r, &err);
    CHECK(r.ok && r.rank == Ts && r.identifiable && r.null_dim == 0, "T <= DV: rank %d", r.rank);
    check_head_identities("T <= DV", A, E, V, ld, Ts, DV, 0, Ts, &r);
    /* Bad arguments fail for the head, with a message. */
    int rc = lens_attention_head(A, V, 2, NULL, 0, Ts, DV, 0, 0, 0, NULL, NULL, NULL, E, NULL, &r, &err);
    CHECK(rc == -1 && !r.ok && err.code == LENS_EINVAL && r.err.code == LENS_EINVAL, "ldv < DV accepted");
    free(V), free(A), free(E);
}

/* Causal rows against the definition: row i = non-causal projection on the prefix. */
static void test_causal_prefixes(void)
{
    printf("causal prefixes one at a time\n");
    const int T = 70, DV = 12;
    float *V = malloc(sizeof(float) * T * DV), *A = malloc(sizeof(float) * T * T), *E = malloc(sizeof(float) * T * T);
    float *P = malloc(sizeof(float) * T * T), *PE = malloc(sizeof(float) * T * T);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < DV; c++) V[t * DV + c] = uniform();
    /* rows 3 and 9 repeat row 1 and rows 20..29 use 6 directions only: the prefix rank stalls
     * before it reaches DV, which exercises the basis rebuilds. */
    memcpy(V + 3 * DV, V + 1 * DV, sizeof(float) * DV), memcpy(V + 9 * DV, V + 1 * DV, sizeof(float) * DV);
    for (int t = 20; t < 30; t++)
        for (int c = 0; c < DV; c++) V[t * DV + c] = 0.5f * V[(t - 10) * DV + c] - V[(t - 18) * DV + c];
    for (size_t k = 0; k < (size_t)T * T; k++) A[k] = 2 * uniform();
    softmax_rows(A, T, 1);
    int rank = -1;
    lens_err err = {0};
    int rc = lens_attention_effective(A, V, DV, T, DV, 1, 0, E, &rank, &err);
    CHECK(rc == 0 && rank == DV, "causal effective: rc %d rank %d: %s", rc, rank, err.msg);
    double worst = 0;
    for (int i = 0; i < T; i++) {
        const int n = i + 1; /* n x n matrix whose rows are all a_i[0..i]: its effective rows are the projection */
        for (int a = 0; a < n; a++)
            for (int j = 0; j < n; j++) P[a * n + j] = A[(size_t)i * T + j];
        if (lens_attention_effective(P, V, DV, n, DV, 0, 0, PE, NULL, &err)) break;
        for (int j = 0; j < n; j++) worst = fmax(worst, fabs((double)PE[j] - E[(size_t)i * T + j]));
    }
    CHECK(worst <= 1e-5, "causal rows differ from per-prefix projections by %g", worst);
    lens_head_attention r;
    lens_attention_head(A, V, DV, NULL, 0, T, DV, 0, 1, 0, NULL, NULL, NULL, E, NULL, &r, &err);
    check_head_identities("causal prefixes", A, E, V, DV, T, DV, 1, T, &r);
    free(V), free(A), free(E), free(P), free(PE);
}

/* Each windowed row of E (the effective attention of A over a sliding window
 * W, causal or bidirectional) against its band's problem solved on its own:
 * the row a_i[band] and V_band, non-causal (the per-row SVD path); causal
 * rows below W, the prefixes, are not windowed: want_rows rows must match
 * within 1e-5, and nothing outside a band; *worst the largest difference. */
static void check_band_rows(const char *what, const float *A, const float *V, int T, int DV, int causal, int W,
                            const float *E, int want_rows, double *worst)
{
    double outside = 0;
    float *P = malloc(sizeof(float) * T * T), *PE = malloc(sizeof(float) * T * T);
    lens_err err = {0};
    int rows = 0;
    *worst = 0;
    for (int i = 0; P && PE && i < T; i++) {
        int lo, hi;
        lens_key_band(i, T, causal, W, &lo, &hi);
        const int n = hi - lo;
        for (int j = 0; j < T; j++)
            if (j < lo || j >= hi) outside = fmax(outside, fabs(E[(size_t)i * T + j]));
        if (causal && i < W) continue;
        for (int a = 0; a < n; a++)
            for (int j = 0; j < n; j++) P[a * n + j] = A[(size_t)i * T + lo + j];
        if (lens_attention_effective(P, V + (size_t)lo * DV, DV, n, DV, 0, 0, PE, NULL, &err)) break;
        for (int j = 0; j < n; j++) *worst = fmax(*worst, fabs((double)PE[j] - E[(size_t)i * T + lo + j]));
        rows++;
    }
    free(P), free(PE);
    CHECK(rows == want_rows, "%s: %d rows checked, want %d", what, rows, want_rows);
    CHECK(*worst <= 1e-5, "%s: rows differ from their bands' projections by %g", what, *worst);
    CHECK(outside == 0, "%s: rows have %g outside their band", what, outside);
}

/* Bidirectional windows (ModernBERT's local layers, W = local_attention):
 * row i attends keys |i - j| <= W / 2 only, so its effective row is the
 * projection onto the values of its band, checked against the band's
 * problem solved on its own (as test_window_rows). W = 8: bands of up to 9
 * keys over DV = 6, rank-deficient in the middle, cut at both ends. */
static void test_bidirectional_window_rows(void)
{
    printf("bidirectional window rows one at a time\n");
    enum { T = 24, DV = 6, W = 8, H = W / 2 };
    float *V = malloc(sizeof(float) * T * DV), *A = malloc(sizeof(float) * T * T), *E = malloc(sizeof(float) * T * T);
    float *F = malloc(sizeof(float) * T * T);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < DV; c++) V[t * DV + c] = uniform();
    for (size_t k = 0; k < (size_t)T * T; k++) A[k] = 2 * uniform();
    for (int i = 0; i < T; i++) { /* the band's softmax */
        double sum = 0;
        for (int j = 0; j < T; j++) A[(size_t)i * T + j] = abs(i - j) <= H ? expf(A[(size_t)i * T + j]) : 0, sum += A[(size_t)i * T + j];
        for (int j = 0; j < T; j++) A[(size_t)i * T + j] /= (float)sum;
    }
    lens_err err = {0};
    CHECK(lens_attention_effective(A, V, DV, T, DV, 0, W, E, NULL, &err) == 0, "bidirectional window: %s", err.msg);
    CHECK(lens_attention_effective(A, V, DV, T, DV, 0, 0, F, NULL, &err) == 0, "full effective: %s", err.msg);
    double worst, moved = 0;
    for (size_t k = 0; k < (size_t)T * T; k++) moved = fmax(moved, fabs((double)E[k] - F[k]));
    check_band_rows("bidirectional window", A, V, T, DV, 0, W, E, T, &worst);
    CHECK(moved > 1e-2, "the band changes no row (max |band - full| %g): the case tests nothing", moved);
    lens_head_attention r;
    CHECK(lens_attention_head(A, V, DV, NULL, 0, T, DV, 0, 0, W, NULL, NULL, NULL, F, NULL, &r, &err) == 0,
          "bidirectional head: %s", err.msg);
    check_close("bidirectional lens_attention_head == lens_attention_effective", F, E, (size_t)T * T, 0, 0);
    /* the last row's band, rows T-1-H .. T-1: H + 1 = 5 keys < DV, so rank 5 (the full V's would be 6) */
    CHECK(r.rank == H + 1 && r.null_dim == 0,
          "the last row's band (rows %d..%d) decides rank %d, null_dim %d", T - 1 - H, T - 1, r.rank, r.null_dim);
    printf("  %d bidirectional rows: max |diff| %.2e vs per-band projections, max |band - full| %.2e\n", (int)T, worst,
           moved);
    free(V), free(A), free(E), free(F);
}

/* Sliding-window rows (Mistral, Gemma 2's local layers): row i >= W attends keys i-W+1..i only, so
 * its effective row is the projection onto the values of those W keys, checked against the same
 * W x W problem solved on its own (every row a_i[lo..i], non-causal: the per-row SVD path). W = 10
 * rows of DV = 6: every window beyond row 5 is rank-deficient, and rows 20..29 span 3 directions
 * only (the window of row 29 has rank 3). Rows below W are causal prefixes (test_causal_prefixes). */
static void test_window_rows(void)
{
    printf("sliding-window rows one at a time\n");
    enum { T = 48, DV = 6, W = 10 };
    float *V = malloc(sizeof(float) * T * DV), *A = malloc(sizeof(float) * T * T), *E = malloc(sizeof(float) * T * T);
    float *C = malloc(sizeof(float) * T * T);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < DV; c++) V[t * DV + c] = uniform();
    for (int t = 23; t < 30; t++) { /* combinations of rows 20, 21, 22 */
        const float u = uniform();
        for (int c = 0; c < DV; c++) V[t * DV + c] = V[20 * DV + c] * u + V[(21 + t % 2) * DV + c];
    }
    for (size_t k = 0; k < (size_t)T * T; k++) A[k] = 2 * uniform();
    /* the windowed softmax's support: row i's keys i-W+1..i */
    softmax_rows(A, T, 1);
    for (int i = W; i < T; i++) {
        double sum = 0;
        for (int j = 0; j < T; j++) A[(size_t)i * T + j] = j > i - W && j <= i ? A[(size_t)i * T + j] : 0, sum += A[(size_t)i * T + j];
        for (int j = 0; j < T; j++) A[(size_t)i * T + j] /= (float)sum;
    }
    lens_err err = {0};
    int rank = -1;
    CHECK(lens_attention_effective(A, V, DV, T, DV, 1, W, E, &rank, &err) == 0 && rank == DV,
          "windowed effective: rank %d: %s", rank, err.msg);
    CHECK(lens_attention_effective(A, V, DV, T, DV, 1, 0, C, NULL, &err) == 0, "causal effective: %s", err.msg);
    double worst, prefix = 0, moved = 0;
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            const double d = fabs((double)E[(size_t)i * T + j] - C[(size_t)i * T + j]);
            if (i < W) prefix = fmax(prefix, d);
            else moved = fmax(moved, d);
        }
    check_band_rows("sliding window", A, V, T, DV, 1, W, E, T - W, &worst);
    CHECK(prefix == 0, "rows below the window differ from the causal prefixes by %g", prefix);
    CHECK(moved > 1e-2, "the window changes no row (max |window - prefix| %g): the case tests nothing", moved);
    lens_head_attention r;
    CHECK(lens_attention_head(A, V, DV, NULL, 0, T, DV, 0, 1, W, NULL, NULL, NULL, C, NULL, &r, &err) == 0,
          "windowed head: %s", err.msg);
    check_close("windowed lens_attention_head == lens_attention_effective", C, E, (size_t)T * T, 0, 0);
    check_head_identities("sliding window", A, C, V, DV, T, DV, 1, W, &r);
    /* The last row's window decides rank and null_dim: at T = 48 it is rows 38..47 (rank DV); cut at
     * T = 30 it is rows 20..29, which span 3 directions. Pearson runs over the band only. */
    CHECK(r.rank == DV && r.null_dim == W - DV && !r.identifiable, "T = %d window: rank %d null_dim %d", T, r.rank,
          r.null_dim);
    enum { T2 = 30 };
    float *A2 = malloc(sizeof(float) * T2 * T2), *C2 = malloc(sizeof(float) * T2 * T2);
    for (int i = 0; i < T2; i++) memcpy(A2 + i * T2, A + (size_t)i * T, sizeof(float) * T2);
    lens_head_attention r2;
    CHECK(lens_attention_head(A2, V, DV, NULL, 0, T2, DV, 0, 1, W, NULL, NULL, NULL, C2, NULL, &r2, &err) == 0,
          "windowed head at T = %d: %s", T2, err.msg);
    check_head_identities("sliding window, rank-deficient last window", A2, C2, V, DV, T2, DV, 1, W, &r2);
    CHECK(r2.rank == 3 && r2.null_dim == W - 3 && (r2.rank_v1 == 3 || r2.rank_v1 == 4),
          "T = %d: the last window (rows 20..29) has rank 3, got rank %d null_dim %d rank([V,1]) %d", T2, r2.rank,
          r2.null_dim, r2.rank_v1);
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, n = 0; /* Pearson over the band, written out */
    for (int i = 0; i < T2; i++)
        for (int j = i >= W ? i - W + 1 : 0; j <= i; j++) {
            const double x = A2[i * T2 + j], y = C2[i * T2 + j];
            sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y, n++;
        }
    const double band = (sxy - sx * sy / n) / sqrt((sxx - sx * sx / n) * (syy - sy * sy / n));
    CHECK(fabs(r2.pearson - band) <= 1e-9, "windowed Pearson %.12f, over the band %.12f", r2.pearson, band);
    free(A2), free(C2);
    printf("  %d windowed rows: max |diff| %.2e vs per-window projections, max |window - prefix| %.2e\n", (int)(T - W), worst,
           moved);
    free(V), free(A), free(E), free(C);
}

/* Causal rows whose prefix V[0..DV-1] is near-singular (σ_min < tol although every
 * Gram-Schmidt distance is above it) against the per-row SVD of
 * attention_causal_rows.json, on the reference's own float32 A and V: every row
 * within 1e-5 (before the prefix rank was certified, row DV - 1 of the gpt2 layer 2
 * head 0 case was 1.4e-3 off, row 17 of the constructed case 0.19). */
#define TOL_CAUSAL_ROW 1e-5
static void test_causal_rows_fixture(void)
{
    printf("causal rows vs per-row SVD (attention_causal_rows.json)\n");
    json_t *fx = load_fixture("attention_causal_rows.json");
    if (!fx) return;
    const json_t *cases = fixture_list(fx, "cases", "attention_causal_rows.json");
    CHECK(json_array_size(cases) >= 5, "attention_causal_rows.json: %zu cases, want the constructed one and 4 gpt2 heads",
          json_array_size(cases));
    int rows = 0;
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        const json_t *cs = json_array_get(cases, ci);
        const char *name = json_string_value(json_object_get(cs, "name"));
        const int T = json_int(cs, "T"), DV = json_int(cs, "DV");
        float *A = json_floats(json_object_get(cs, "A"), (size_t)T * T, name);
        float *V = json_floats(json_object_get(cs, "V"), (size_t)T * DV, name);
        float *want = json_floats(json_object_get(cs, "effective"), (size_t)T * T, name);
        float *E = malloc(sizeof(float) * T * T);
        if (A && V && want && E && T > DV) {
            for (int pass = 0; pass < 2; pass++) { /* lens_attention_effective, then lens_attention_head */
                lens_err err = {0};
                lens_head_attention r = {0};
                int rank = -1;
                int rc = pass ? lens_attention_head(A, V, DV, NULL, 0, T, DV, 0, 1, 0, NULL, NULL, NULL, E, NULL, &r, &err)
                              : lens_attention_effective(A, V, DV, T, DV, 1, 0, E, &rank, &err);
                if (pass) rank = r.rank;
                CHECK(rc == 0 && rank == json_int(cs, "rank"), "%s: rc %d rank %d (reference %d): %s", name, rc, rank,
                      json_int(cs, "rank"), err.msg);
                double worst = 0;
                int worst_row = -1;
                for (int i = 0; i < T; i++, rows += pass == 0)
                    for (int j = 0; j < T; j++) {
                        const double d = fabs((double)E[(size_t)i * T + j] - want[(size_t)i * T + j]);
                        if (d > worst) worst = d, worst_row = i;
                    }
                CHECK(worst <= TOL_CAUSAL_ROW, "%s (%s): row %d differs from the per-row SVD by %.3g > %g", name,
                      pass ? "lens_attention_head" : "lens_attention_effective", worst_row, worst, TOL_CAUSAL_ROW);
            }
        } else {
            CHECK(T > DV, "%s: T %d must exceed DV %d (the prefix reaches DV rows)", name, T, DV);
        }
        free(A), free(V), free(want), free(E);
    }
    printf("  %zu cases, %d rows\n", json_array_size(cases), rows);
    json_decref(fx);
}

/* ---------------------------------------------------------------- models */

static int forward(const lens_model *m, const int *ids, int T, lens_activations *act)
{
    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids};
    lens_forward_opts opts = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_VALUES};
    lens_err err = {0};
    int rc = lens_forward(m, &batch, &opts, act, &err);
    CHECK(rc == 0, "lens_forward: %s", err.msg);
    return rc;
}

/* Analyse every head of one sequence; checks the identities. Caller frees res. */
static int analyze_all(const lens_model *m, const lens_activations *act, const int *ids, const char *label,
                       lens_attention_result *res)
{
    lens_attention_request req = {.ids = ids, .want_effective = 1, .verify_scores = 1,
                                  .head = {.key_aware = 1, .null_component = 1}};
    lens_err err = {0};
    int rc = lens_attention_analyze(m, act, 0, &req, res, &err);
    CHECK(rc == 0, "%s: lens_attention_analyze: %s", label, err.msg);
    if (rc) return rc;
    const lens_config *c = &m->cfg;
    const int T = res->T, causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    CHECK(res->n_layers == c->n_layers && res->n_heads == c->n_heads && res->n_failed == 0,
          "%s: %d layers %d heads %d failed", label, res->n_layers, res->n_heads, res->n_failed);
    CHECK(res->scores_max_diff <= TOL_SCORES, "%s: softmax(QK^T/sqrt DK) differs from kept A by %g", label,
          res->scores_max_diff);
    for (int li = 0; li < res->n_layers; li++)
        for (int h = 0; h < res->n_heads; h++) {
            char what[160];
            snprintf(what, sizeof what, "%s layer %d head %d", label, res->layers[li], h);
            const size_t k = (size_t)li * res->n_heads + h;
            const float *A = lens_act_attn(m, act, res->layers[li], h, 0);
            const float *V = lens_act_values(m, act, res->layers[li], 0) + (size_t)h * c->d_head_v;
            const int W = lens_layer_window(c, res->layers[li] - 1);
            check_head_identities(what, A, res->effective + k * T * T, V, c->n_heads * c->d_head_v, T, c->d_head_v,
                                  causal, W && W < T ? W : T, &res->head[k]);
        }
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void test_mkmodel(const char *arch)
{
    printf("random %s tiny checkpoint (lens_mkmodel)\n", arch);
    char tmpl[] = "/tmp/lens-test-attention-XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL, "mkdtemp failed");
    if (!dir) return;
    lens_err err = {0};
    lens_model *m = NULL;
    if (lens_mkmodel(arch, "tiny", NULL, 7, dir, &err) == 0) m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s tiny: %s", arch, err.msg);
    for (int T = 9; m && T <= 90; T += 81) { /* below and above DV = 64 */
        int *ids = malloc(sizeof(int) * T);
        for (int t = 0; t < T; t++) ids[t] = 1000 + (t * 7919) % 5000;
        lens_activations act;
        char label[64];
        snprintf(label, sizeof label, "mkmodel %s T=%d", arch, T);
        if (forward(m, ids, T, &act) == 0) {
            lens_attention_result res;
            if (analyze_all(m, &act, ids, label, &res) == 0) {
                /* a selection returns exactly the selected heads, equal to the full run's */
                const int layer = m->cfg.n_layers, head = m->cfg.n_heads - 1;
                lens_attention_request req = {.layers = &layer, .n_layers = 1, .heads = &head, .n_heads = 1,
                                              .want_effective = 1};
                lens_attention_result one;
                int rc = lens_attention_analyze(m, &act, 0, &req, &one, &err);
                CHECK(rc == 0 && one.n_layers == 1 && one.n_heads == 1 && one.layers[0] == layer,
                      "%s: selection: %s", label, err.msg);
                if (rc == 0) {
                    const size_t k = (size_t)(layer - 1) * res.n_heads + head;
                    check_close("selected head == same head of a full run", one.effective,
                                res.effective + k * T * T, (size_t)T * T, 0, 0);
                    CHECK(one.head[0].rank == res.head[k].rank && one.head[0].key_aware_method == LENS_KEY_AWARE_OFF,
                          "%s: selected head rank %d vs %d", label, one.head[0].rank, res.head[k].rank);
                    lens_attention_result_free(&one);
                }
                const int bad = layer + 1;
                req.layers = &bad;
                CHECK(lens_attention_analyze(m, &act, 0, &req, &one, &err) == -1 && err.code == LENS_EINVAL,
                      "%s: layer %d accepted", label, bad);
                lens_attention_result_free(&res);
            }
            lens_activations_free(&act);
        }
        free(ids);
    }
    lens_model_free(m);
    nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---------------------------------------------------------------- key-aware: Gram == dense */

static int *seq_ids(const lens_model *m, int T)
{
    int *ids = malloc(sizeof(int) * T);
    uint32_t s = 12345;
    for (int t = 0; t < T; t++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        ids[t] = 1000 + (int)(s % (uint32_t)(m->cfg.vocab_size - 1000));
    }
    return ids;
}

/* rank(J), rank(M J) of every head by the Gram/inertia method and by dgesdd on the
 * explicit matrices, over a table of lengths (up to the explicit limit T·DK <= 1024):
 * exactly equal. Returns the heads compared. */
static int key_aware_agreement(const char *dir, const int *Ts, int n_T)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", dir, err.msg);
    if (!m) return 0;
    int compared = 0, nonzero = 0;
    for (int k = 0; k < n_T; k++) {
        const int T = Ts[k];
        if (T * m->cfg.d_head_k > LENS_ATTN_KEY_AWARE_MAX_UNKNOWNS || T > m->cfg.max_positions) continue;
        int *ids = seq_ids(m, T);
        lens_activations act;
        if (forward(m, ids, T, &act) == 0) {
            lens_attention_result fast, dense;
            lens_attention_request req = {.ids = ids, .head = {.key_aware = 1}};
            int rc = lens_attention_analyze(m, &act, 0, &req, &fast, &err);
            req.head.key_aware_dense = 1;
            rc |= lens_attention_analyze(m, &act, 0, &req, &dense, &err);
            CHECK(rc == 0, "%s T=%d: %s", dir, T, err.msg);
            for (int h = 0; rc == 0 && h < fast.n_layers * fast.n_heads; h++, compared++) {
                const lens_head_attention *a = &fast.head[h], *b = &dense.head[h];
                nonzero += a->key_aware_dim > 0;
                CHECK(a->key_aware_method == LENS_KEY_AWARE_EXPLICIT && a->rank_j == b->rank_j &&
                          a->rank_mj == b->rank_mj && a->key_aware_dim == b->key_aware_dim,
                      "%s T=%d head %d: Gram ranks J %d MJ %d (dim %d), dense SVD %d %d (%d)", dir, T, h, a->rank_j,
                      a->rank_mj, a->key_aware_dim, b->rank_j, b->rank_mj, b->key_aware_dim);
                CHECK(a->key_aware_dim >= 0 && a->key_aware_dim <= T * (T - a->rank),
                      "%s T=%d head %d: key-aware dim %d outside [0, T (T - rank V)] = [0, %d]", dir, T, h,
                      a->key_aware_dim, T * (T - a->rank));
            }
            if (rc == 0) lens_attention_result_free(&fast), lens_attention_result_free(&dense);
            lens_activations_free(&act);
        }
        free(ids);
    }
    printf("  %s: %d heads equal (%d with key-aware dim > 0)\n", dir, compared, nonzero);
    lens_model_free(m);
    return compared;
}

static void test_key_aware_gram(const char *shared)
{
    printf("key-aware dimension: Gram/inertia == dense SVDs\n");
    const int Ts[] = {3, 8, 16, 32, 48};
    const char *demo[] = {"models/demo-identifiable", "models/demo-gpt2", "models/demo-mlm", "models/demo-sst2"};
    int compared = 0;
    for (size_t k = 0; k < sizeof demo / sizeof *demo; k++)
        compared += key_aware_agreement(demo[k], Ts, (int)(sizeof Ts / sizeof *Ts));
    CHECK(compared >= 5 * 8 + 4 * 8 + 2 * 3 * 4, "only %d demo heads compared", compared);
    if (!shared) {
        SKIP("shared checkpoints not found: key-aware Gram vs dense on them not run");
        return;
    }
    const char *names[] = {"bert-tiny-sst2", "bert-tiny-mlm", "gpt2-tiny-wikitext"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/models/%s", shared, names[k]);
        CHECK(key_aware_agreement(dir, Ts, (int)(sizeof Ts / sizeof *Ts)) > 0, "%s: no heads compared", dir);
    }
}

/* ker M = {δA : δA V = 0} has dimension T (T - rank V), so a head whose V has
 * rank T (identifiable) has key-aware dimension 0. demo-identifiable layer 1
 * head 0 on "an unflinchingly bleak and desperate film" (T = 9, κ(V) = 23)
 * read rank(J) 64, rank(M J) 56 while M was applied as V: M J's wider
 * tolerance (T·DV rows) cut 8 directions that float64 SVDs put 1e12 above zero. */
static void test_key_aware_identifiable(void)
{
    printf("identifiable heads have key-aware dimension 0\n");
    lens_err err = {0};
    lens_model *m = lens_model_load("models/demo-identifiable", &err);
    CHECK(m != NULL, "demo-identifiable: %s", err.msg);
    if (!m) return;
    int ids[] = {2, 151, 4956, 125, 6479, 119, 4115, 172, 3}; /* [CLS] an unflinching ##ly bleak and desperate film [SEP] */
    const int T = (int)(sizeof ids / sizeof *ids);
    lens_activations act;
    if (forward(m, ids, T, &act) == 0) {
        for (int dense = 0; dense < 2; dense++) {
            lens_attention_result res;
            lens_attention_request req = {.ids = ids, .head = {.key_aware = 1, .key_aware_dense = dense}};
            int rc = lens_attention_analyze(m, &act, 0, &req, &res, &err);
            CHECK(rc == 0, "analyze: %s", err.msg);
            for (int h = 0; rc == 0 && h < res.n_layers * res.n_heads; h++) {
                const lens_head_attention *a = &res.head[h];
                CHECK(a->rank < T || (a->key_aware_dim == 0 && a->rank_mj == a->rank_j),
                      "%s head %d: rank V %d = T but key-aware dim %d (rank J %d, rank MJ %d)",
                      dense ? "dense" : "Gram", h, a->rank, a->key_aware_dim, a->rank_j, a->rank_mj);
            }
            CHECK(rc != 0 || res.head[0].rank == T, "layer 1 head 0: rank V %d, want %d", res.head[0].rank, T);
            if (rc == 0) lens_attention_result_free(&res);
        }
        lens_activations_free(&act);
    }
    lens_model_free(m);
}

/* rank(J), rank(M J) at 125 tokens on demo-identifiable (1000 unknowns) against
 * PyTorch's float64 svdvals of the explicit 15625 x 1000 and 16000 x 1000 matrices
 * (attention_key_aware.json, the reference's own float32 A, V, Q): exact. */
static void test_key_aware_fixture(void)
{
    printf("key-aware ranks at T = 125 vs attention_key_aware.json\n");
    json_t *fx = load_fixture("attention_key_aware.json");
    if (!fx) return;
    const json_t *cases = fixture_list(fx, "cases", "attention_key_aware.json");
    CHECK(json_array_size(cases) >= 2, "attention_key_aware.json: %zu cases", json_array_size(cases));
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        const json_t *cs = json_array_get(cases, ci), *ka = json_object_get(cs, "key_aware");
        const char *name = json_string_value(json_object_get(cs, "name"));
        const int T = json_int(cs, "T"), DK = json_int(cs, "DK"), DV = json_int(cs, "DV");
        float *A = json_floats(json_object_get(cs, "A"), (size_t)T * T, name);
        float *V = json_floats(json_object_get(cs, "V"), (size_t)T * DV, name);
        float *Q = json_floats(json_object_get(cs, "Q"), (size_t)T * DK, name);
        if (A && V && Q) {
            lens_attention_opts opts = {.key_aware = 1};
            lens_head_attention r;
            lens_err err = {0};
            int rc = lens_attention_head(A, V, DV, Q, DK, T, DV, DK, 0, 0, NULL, NULL, &opts, NULL, NULL, &r, &err);
            CHECK(rc == 0 && r.key_aware_method == LENS_KEY_AWARE_EXPLICIT && r.rank_q == json_int(ka, "rank_q") &&
                      r.rank_j == json_int(ka, "rank_j") && r.rank_mj == json_int(ka, "rank_mj") &&
                      r.key_aware_dim == json_int(ka, "explicit"),
                  "%s: %s rank(Q) %d rank(J) %d rank(MJ) %d dim %d, reference %d %d %d %d (%s)", name,
                  lens_key_aware_method_name(r.key_aware_method), r.rank_q, r.rank_j, r.rank_mj, r.key_aware_dim,
                  json_int(ka, "rank_q"), json_int(ka, "rank_j"), json_int(ka, "rank_mj"), json_int(ka, "explicit"),
                  err.msg);
            printf("  %s: dim %d = %d - %d\n", name, r.key_aware_dim, r.rank_j, r.rank_mj);
        }
        free(A), free(V), free(Q);
    }
    json_decref(fx);
}

/* ---------------------------------------------------------------- cancellation */

typedef struct {
    atomic_int done;       /* heads finished (lens_attention_request.heads_done) */
    volatile int cancel;
} cancel_watch;

/* Sets the cancel flag as soon as the first head has finished. */
static void *cancel_after_first_head(void *p)
{
    cancel_watch *w = p;
    while (atomic_load(&w->done) < 1) sched_yield();
    lens_cancel_set(&w->cancel, 1);
    return NULL;
}

static void test_cancel(void)
{
    printf("cancellation of the key-aware step\n");
    lens_err err = {0};
    lens_model *m = lens_model_load("models/demo-identifiable", &err);
    CHECK(m != NULL, "demo-identifiable: %s", err.msg);
    if (!m) return;
    const int T = 64, n_heads = m->cfg.n_layers * m->cfg.n_heads;
    int *ids = seq_ids(m, T);
    lens_activations act;
    if (forward(m, ids, T, &act) == 0) {
        /* set before the start: no head runs */
        cancel_watch w = {.cancel = 1};
        atomic_init(&w.done, 0);
        lens_attention_request req = {.ids = ids, .heads_done = &w.done,
                                      .head = {.key_aware = 1, .key_aware_dense = 1, .cancel = &w.cancel}};
        lens_attention_result res;
        int rc = lens_attention_analyze(m, &act, 0, &req, &res, &err);
        CHECK(rc == -1 && err.code == LENS_ECANCEL && atomic_load(&w.done) == 0,
              "cancel before start: rc %d code %s, %d heads ran", rc, lens_status_name(err.code), atomic_load(&w.done));
        /* set by another thread once the first head is done: the running head stops at its next
         * check, the others do not start (dense SVDs: 0.1-0.5 s per head here) */
        lens_cancel_set(&w.cancel, 0);
        atomic_store(&w.done, 0);
        pthread_t th;
        pthread_create(&th, NULL, cancel_after_first_head, &w);
        err = (lens_err){0};
        rc = lens_attention_analyze(m, &act, 0, &req, &res, &err);
        pthread_join(th, NULL);
        const int done = atomic_load(&w.done);
        CHECK(rc == -1 && err.code == LENS_ECANCEL && done >= 1 && done < n_heads,
              "cancel mid-computation: rc %d code %s, %d of %d heads ran", rc, lens_status_name(err.code), done,
              n_heads);
        printf("  cancelled after %d of %d heads: %s\n", done, n_heads, err.msg);
        if (rc == 0) lens_attention_result_free(&res);
        /* one head alone */
        lens_head_attention r;
        const float *A = lens_act_attn(m, &act, 1, 0, 0);
        rc = lens_attention_head(A, lens_act_values(m, &act, 1, 0), m->cfg.n_heads * m->cfg.d_head_v, A, T, T,
                                 m->cfg.d_head_v, 1, 0, 0, NULL, NULL, &req.head, NULL, NULL, &r, &err);
        CHECK(rc == -1 && !r.ok && r.err.code == LENS_ECANCEL, "lens_attention_head ignores cancel: rc %d", rc);
        lens_activations_free(&act);
    }
    free(ids);
    lens_model_free(m);
}

/* ---------------------------------------------------------------- shared checkpoints */

static void close_stat(const char *what, double got, const json_t *want)
{
    if (json_is_null(want)) {
        CHECK(isnan(got), "%s: %g, reference null", what, got);
        return;
    }
    const double w = json_number_value(want);
    CHECK(fabs(got - w) <= TOL_CKPT, "%s: %.8g, reference %.8g", what, got, w);
}

static void test_shared(const char *shared, const char *name)
{
    printf("%s vs attention_%s.json\n", name, name);
    char path[512];
    snprintf(path, sizeof path, "attention_%s.json", name);
    json_t *fx = load_fixture(path);
    if (!fx) return;
    snprintf(path, sizeof path, "%s/models/%s", shared, name);
    lens_err err = {0};
    lens_model *m = lens_model_load(path, &err);
    CHECK(m != NULL, "%s: %s", path, err.msg);
    const json_t *examples = fixture_list(fx, "examples", path);
    for (size_t e = 0; m && e < json_array_size(examples); e++) {
        const json_t *ex = json_array_get(examples, e);
        const char *label = json_string_value(json_object_get(ex, "name"));
        const json_t *jids = json_object_get(ex, "input_ids");
        const int T = (int)json_array_size(jids);
        int *ids = malloc(sizeof(int) * T);
        for (int t = 0; t < T; t++) ids[t] = (int)json_integer_value(json_array_get(jids, t));
        unsigned char *special = malloc(T), *punct = malloc(T);
        lens_attention_token_masks(m, ids, T, special, punct);
        int mask_diff = 0;
        for (int t = 0; t < T; t++)
            mask_diff += special[t] != json_integer_value(json_array_get(json_object_get(ex, "special"), t)) ||
                         punct[t] != json_integer_value(json_array_get(json_object_get(ex, "punct"), t));
        CHECK(mask_diff == 0, "%s: %d tokens with different special / punctuation masks", label, mask_diff);
        lens_activations act;
        lens_attention_result res;
        if (forward(m, ids, T, &act) == 0 && analyze_all(m, &act, ids, label, &res) == 0) {
            const json_t *heads = json_object_get(ex, "heads");
            CHECK(json_array_size(heads) == (size_t)res.n_layers * res.n_heads, "%s: %zu reference heads", label,
                  json_array_size(heads));
            for (size_t k = 0; k < json_array_size(heads) && k < (size_t)res.n_layers * res.n_heads; k++) {
                const json_t *want = json_array_get(heads, k);
                const lens_head_attention *r = &res.head[k];
                char what[160];
                snprintf(what, sizeof what, "%s layer %d head %d", label, json_int(want, "layer"),
                         json_int(want, "head"));
                const json_t *ka = json_object_get(want, "key_aware");
                const json_t *ka_explicit = json_object_get(ka, "explicit");
                CHECK(r->rank == json_int(want, "rank") && r->null_dim == json_int(want, "null_dim") &&
                          r->rank_v1 == json_int(want, "rank_v1") &&
                          r->stochastic_null_dim == json_int(want, "stochastic_null_dim"),
                      "%s: rank %d null %d rank_v1 %d, reference %d %d %d", what, r->rank, r->null_dim, r->rank_v1,
                      json_int(want, "rank"), json_int(want, "null_dim"), json_int(want, "rank_v1"));
                if (json_is_null(ka_explicit))
                    CHECK(r->key_aware_method == LENS_KEY_AWARE_SKIPPED ||
                              (r->key_aware_method == LENS_KEY_AWARE_CLOSED_FORM &&
                               r->key_aware_dim == json_int(ka, "closed_form")),
                          "%s: key-aware %s %d, reference skipped (closed form %d)", what,
                          lens_key_aware_method_name(r->key_aware_method), r->key_aware_dim,
                          json_int(ka, "closed_form"));
                else
                    CHECK(r->key_aware_method == LENS_KEY_AWARE_EXPLICIT &&
                              r->key_aware_dim == json_integer_value(ka_explicit) &&
                              r->rank_j == json_int(ka, "rank_j") && r->rank_mj == json_int(ka, "rank_mj"),
                          "%s: key-aware %s %d (J %d MJ %d), reference %d (%d %d)", what,
                          lens_key_aware_method_name(r->key_aware_method), r->key_aware_dim, r->rank_j, r->rank_mj,
                          (int)json_integer_value(ka_explicit), json_int(ka, "rank_j"), json_int(ka, "rank_mj"));
                snprintf(what + strlen(what), sizeof what - strlen(what), " pearson");
                close_stat(what, r->pearson, json_object_get(want, "pearson"));
                close_stat("special_mass_raw", r->special_mass_raw, json_object_get(want, "special_mass_raw"));
                close_stat("special_mass_effective", r->special_mass_effective,
                           json_object_get(want, "special_mass_effective"));
                close_stat("punct_mass_raw", r->punct_mass_raw, json_object_get(want, "punct_mass_raw"));
                close_stat("punct_mass_effective", r->punct_mass_effective,
                           json_object_get(want, "punct_mass_effective"));
                float *sums = malloc(sizeof(float) * T);
                const float *E = res.effective + k * T * T;
                for (int i = 0; i < T; i++) {
                    double s = 0;
                    for (int j = 0; j < T; j++) s += E[(size_t)i * T + j];
                    sums[i] = (float)s;
                }
                float *want_sums = json_floats(json_object_get(want, "effective_row_sums"), T, "row sums");
                snprintf(what, sizeof what, "%s layer %d head %d effective row sums", label, json_int(want, "layer"),
                         json_int(want, "head"));
                if (want_sums) check_close(what, sums, want_sums, T, TOL_CKPT, 0);
                free(sums), free(want_sums);
            }
            const char *key;
            json_t *mat;
            json_object_foreach(json_object_get(ex, "effective"), key, mat)
            {
                int l = 0, h = 0;
                sscanf(key, "%d.%d", &l, &h);
                char what[160];
                snprintf(what, sizeof what, "%s layer %d head %d effective", label, l, h);
                float *want = json_floats(mat, (size_t)T * T, what);
                if (want && l >= 1 && l <= res.n_layers && h >= 0 && h < res.n_heads)
                    check_close(what, res.effective + ((size_t)(l - 1) * res.n_heads + h) * T * T, want,
                                (size_t)T * T, TOL_CKPT, 0);
                free(want);
            }
            lens_attention_result_free(&res);
            lens_activations_free(&act);
        }
        free(ids), free(special), free(punct);
    }
    lens_model_free(m);
    json_decref(fx);
}

int main(void)
{
    test_synthetic_fixture();
    test_known_rank();
    test_causal_prefixes();
    test_window_rows();
    test_bidirectional_window_rows();
    test_causal_rows_fixture();
    test_mkmodel("bert");
    test_mkmodel("gpt2");
    const char *shared = check_shared_dir();
    test_key_aware_gram(shared);
    test_key_aware_identifiable();
    test_key_aware_fixture();
    test_cancel();
    if (!shared) {
        SKIP("shared checkpoints not found (../shared/models or $LENS_SHARED): reference comparison not run");
    } else {
        test_shared(shared, "bert-tiny-sst2");
        test_shared(shared, "gpt2-tiny-wikitext");
    }
    return check_done("test_attention");
}
