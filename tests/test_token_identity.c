/* test_token_identity.c - token identifiability (core/analysis/token_identity.c).
 *
 * Without the shared checkpoints: properties of lens_ti_rank on random rows
 * (the identity at layer 0, scaling invariance of cosine, neighbours and
 * ranks against a double-precision brute force, ties, blocks of candidates
 * on a pool, argument checks).
 *
 * With ../shared: the fixtures of tests/reference/token_identity_reference.py
 * (PyTorch, float64):
 *  - ranks per layer and metric: equal, except that a rank may move by at
 *    most the reference's "slack" (candidates within eps = 1e-5 relative of
 *    the own key, which float32 may order either way); neighbours equal,
 *    except a swap between reference keys within eps;
 *  - the same for the vocabulary ranking of bert-tiny-mlm;
 *  - the ridge maps of bert-tiny-sst2 on 200 SST-2 sentences: W (every 8th
 *    row) within 1e-3 relative Frobenius error, b likewise, ‖W‖_F within
 *    1e-3; identified-token counts on train / held-out within 2 tokens per
 *    layer (float32 hidden states move near-ties);
 *  - g_0 identifies >= 99% of the tokens, save -> load is bit-identical,
 *    load rejects other shapes and truncated files, the fit honours cancel. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/base/blas.h"
#include "core/analysis/token_identity.h"
#include "tests/check.h"
#include "tests/fixture.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static double uniform(void)
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

static void random_rows(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = (float)(2 * uniform() - 1); }

/* Brute-force keys in double (larger = nearer): cosine, or −‖q − c‖². */
static double key_double(const float *q, const float *c, int C, lens_ti_metric metric)
{
    double dot = 0, qq = 0, cc = 0, d2 = 0;
    for (int k = 0; k < C; k++) {
        dot += (double)q[k] * c[k], qq += (double)q[k] * q[k], cc += (double)c[k] * c[k];
        d2 += ((double)q[k] - c[k]) * ((double)q[k] - c[k]);
    }
    return metric == LENS_TI_COSINE ? dot / sqrt(qq * cc) : -d2;
}

/* Checks rank and neighbours against the brute force; returns the number of
 * disagreeing tokens. */
static int brute_force_agrees(const float *q, int T, const float *cand, int n, int C, lens_ti_metric metric,
                              const int *own, int top_k, const int *rank, const int *nb)
{
    int bad = 0;
    double *key = malloc(sizeof(double) * n);
    for (int i = 0; i < T; i++) {
        for (int j = 0; j < n; j++) key[j] = key_double(q + (size_t)i * C, cand + (size_t)j * C, C, metric);
        int r = 1;
        for (int j = 0; j < n; j++) r += j != own[i] && key[j] > key[own[i]];
        int ok = r == rank[i];
        /* k-th best by selection: the best not yet taken, own first on ties, then index */
        for (int k = 0, prev = -1; k < top_k && k < n; k++) {
            int best = -1;
            for (int j = 0; j < n; j++) {
                int taken = 0;
                for (int e = 0; e < k; e++) taken |= nb[(size_t)i * top_k + e] == j;
                if (taken) continue;
                if (best < 0 || key[j] > key[best] || (key[j] == key[best] && (j == own[i]) > (best == own[i])))
                    best = j;
            }
            ok &= nb[(size_t)i * top_k + k] == best;
            prev = best;
            (void)prev;
        }
        if (!ok && bad < 3)
            fprintf(stderr, "  token %d: rank %d, brute force %d; neighbour 0 %d\n", i, rank[i], r,
                    top_k ? nb[(size_t)i * top_k] : -1);
        bad += !ok;
    }
    free(key);
    return bad;
}

static void test_rank_properties(lens_pool *pool)
{
    enum { T = 24, C = 16, K = 4 };
    float h0[T * C], q[T * C], qs[T * C], cs[T * C];
    int own[T], rank[T], nb[T * K], rank2[T], nb2[T * K];
    lens_err err = {0};
    random_rows(h0, T * C);
    for (int i = 0; i < T; i++) own[i] = i;
    for (int metric = 0; metric < 2; metric++) {
        const char *mname = metric ? "l2" : "cosine";
        /* layer 0 with the identity map: every token is its own nearest */
        CHECK(lens_ti_rank(h0, T, h0, T, C, metric, own, K, rank, nb, NULL, &err) == 0, "%s", err.msg);
        int all1 = 1, self_first = 1;
        for (int i = 0; i < T; i++) all1 &= rank[i] == 1, self_first &= nb[i * K] == i;
        CHECK(all1 && self_first, "%s: h^0 against itself must rank every token 1 with itself first", mname);

        /* a perturbed query: ranks and neighbours as a double brute force, neighbour 0 == own iff rank 1 */
        for (int e = 0; e < T * C; e++) q[e] = h0[e] + 2.0f * (float)(2 * uniform() - 1);
        CHECK(lens_ti_rank(q, T, h0, T, C, metric, own, K, rank, nb, NULL, &err) == 0, "%s", err.msg);
        int bad = brute_force_agrees(q, T, h0, T, C, metric, own, K, rank, nb);
        CHECK(bad == 0, "%s: %d tokens differ from the brute force", mname, bad);
        int iff = 1, some_miss = 0;
        for (int i = 0; i < T; i++) iff &= (nb[i * K] == i) == (rank[i] == 1), some_miss |= rank[i] > 1;
        CHECK(iff, "%s: neighbors[i][0] == i must hold exactly when rank 1", mname);
        CHECK(some_miss, "%s: the perturbation should hide some tokens (test data too easy)", mname);

        /* scaling rows of queries and candidates by positive factors */
        for (int i = 0; i < T; i++) {
            const float a = (float)(0.05 + 20 * uniform()), b = (float)(0.05 + 20 * uniform());
            for (int k = 0; k < C; k++) qs[i * C + k] = a * q[i * C + k], cs[i * C + k] = b * h0[i * C + k];
        }
        CHECK(lens_ti_rank(qs, T, cs, T, C, metric, own, K, rank2, nb2, NULL, &err) == 0, "%s", err.msg);
        const int same = !memcmp(rank, rank2, sizeof rank) && !memcmp(nb, nb2, sizeof nb);
        if (metric == LENS_TI_COSINE) CHECK(same, "cosine rankings must not change when rows are scaled");
        else CHECK(!same, "l2 rankings should change when rows are scaled by different factors");
    }

    /* ties count for the token: candidates 1 and 2 equal to candidate 0 */
    float tie[3 * C];
    for (int j = 0; j < 3; j++) memcpy(tie + j * C, h0, sizeof(float) * C);
    for (int metric = 0; metric < 2; metric++) {
        int o = 2, r, n3[4];
        CHECK(lens_ti_rank(h0, 1, tie, 3, C, metric, &o, 4, &r, n3, NULL, &err) == 0, "%s", err.msg);
        CHECK(r == 1 && n3[0] == 2 && n3[1] == 0 && n3[2] == 1 && n3[3] == -1,
              "ties: rank %d (want 1), neighbours %d %d %d %d (want 2 0 1 -1)", r, n3[0], n3[1], n3[2], n3[3]);
    }

    /* many candidates: blocks of 2048 on a pool, against the brute force */
    enum { NC = 5000, TQ = 6, KV = 7 };
    float *cand = malloc(sizeof(float) * NC * C), *qv = malloc(sizeof(float) * TQ * C);
    int ownv[TQ], rv[TQ], nv[TQ * KV];
    random_rows(cand, (size_t)NC * C);
    for (int i = 0; i < TQ; i++) {
        ownv[i] = (int)(uniform() * NC);
        for (int k = 0; k < C; k++) qv[i * C + k] = cand[ownv[i] * C + k] + 0.5f * (float)(2 * uniform() - 1);
    }
    for (int metric = 0; metric < 2; metric++) {
        CHECK(lens_ti_rank(qv, TQ, cand, NC, C, metric, ownv, KV, rv, nv, pool, &err) == 0, "%s", err.msg);
        int bad = brute_force_agrees(qv, TQ, cand, NC, C, metric, ownv, KV, rv, nv);
        CHECK(bad == 0, "%s: %d of %d queries against %d candidates differ from the brute force",
              metric ? "l2" : "cosine", bad, TQ, NC);
    }
    free(cand), free(qv);

    /* argument checks */
    int bad_own = T;
    CHECK(lens_ti_rank(h0, 1, h0, T, C, LENS_TI_COSINE, &bad_own, 0, rank, NULL, NULL, &err) && err.code == LENS_EINVAL,
          "own out of range must be LENS_EINVAL");
    CHECK(lens_ti_rank(h0, 1, h0, T, C, LENS_TI_COSINE, own, -1, rank, NULL, NULL, &err) && err.code == LENS_EINVAL,
          "negative top_k must be LENS_EINVAL");
    CHECK(lens_ti_rank(h0, 1, h0, T, C, (lens_ti_metric)7, own, 0, rank, NULL, NULL, &err) && err.code == LENS_EINVAL,
          "an unknown metric must be LENS_EINVAL");
}

/* ------------------------------------------------------------ fixtures */

static int *json_ints(const json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int *v = malloc(sizeof(int) * (*n ? *n : 1));
    for (int i = 0; i < *n; i++) v[i] = (int)json_integer_value(json_array_get(a, i));
    return v;
}

/* got ranks / neighbours vs the reference's, with its slack and near-tie keys (see the top comment).
 * Returns the number of tokens that needed the slack. */
static int compare_rankings(const char *what, const int *rank, const int *nb, int top_k, int T, const json_t *ref)
{
    const json_t *jr = json_object_get(ref, "ranks"), *js = json_object_get(ref, "slack");
    const json_t *je = json_object_get(ref, "eps");
    const json_t *jn = json_object_get(ref, "neighbors"), *jk = json_object_get(ref, "neighbor_keys");
    CHECK((int)json_array_size(jr) == T, "%s: fixture has %zu ranks, T = %d", what, json_array_size(jr), T);
    if ((int)json_array_size(jr) != T) return 0;
    int slacked = 0, bad = 0;
    for (int i = 0; i < T; i++) {
        const int want = (int)json_integer_value(json_array_get(jr, i));
        const int slack = (int)json_integer_value(json_array_get(js, i));
        int ok = abs(rank[i] - want) <= slack;
        const json_t *wn = json_array_get(jn, i), *wk = json_array_get(jk, i);
        const int kk = (int)json_array_size(wn) < top_k ? (int)json_array_size(wn) : top_k;
        int used = rank[i] != want;
        for (int k = 0; k < kk; k++) {
            const int w = (int)json_integer_value(json_array_get(wn, k));
            if (nb[i * top_k + k] == w) continue;
            /* allowed only where the reference's k-th key ties with a neighbour's within eps */
            const double key = json_number_value(json_array_get(wk, k));
            const double prev = k > 0 ? json_number_value(json_array_get(wk, k - 1)) : INFINITY;
            const double next = json_number_value(json_array_get(wk, k + 1));
            const double eps = 1.01 * json_number_value(json_array_get(je, i)); /* 1.01: keys are rounded to 7 digits */
            const int near = fabs(prev - key) <= eps || fabs(next - key) <= eps;
            ok &= near;
            used = 1;
        }
        if (!ok && bad < 3)
            fprintf(stderr, "  %s token %d: rank %d (want %d, slack %d), neighbours %d %d .. (want %d %d ..)\n", what,
                    i, rank[i], want, slack, nb[i * top_k], top_k > 1 ? nb[i * top_k + 1] : -1,
                    (int)json_integer_value(json_array_get(wn, 0)), (int)json_integer_value(json_array_get(wn, 1)));
        bad += !ok;
        slacked += ok && used;
    }
    CHECK(bad == 0, "%s: %d of %d tokens differ from the reference beyond its near-ties", what, bad, T);
    return slacked;
}

static float rate_of(const int *rank, const unsigned char *special, int T, int skip_special)
{
    int n = 0, hit = 0;
    for (int i = 0; i < T; i++)
        if (!skip_special || !special[i]) n++, hit += rank[i] == 1;
    return n ? (float)hit / n : NAN;
}

static void test_rankings(const char *shared, const json_t *models, int top_k, lens_pool *pool, int vocabulary)
{
    const char *name;
    json_t *examples;
    json_object_foreach((json_t *)models, name, examples) {
        if (!fixture_cases(examples, name)) continue;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/models/%s", shared, name);
        lens_err err = {0};
        lens_model *m = lens_model_load(dir, &err);
        CHECK(m != NULL, "%s: %s", dir, err.msg);
        if (!m) continue;
        const int bert = m->cfg.arch == LENS_ARCH_BERT;
        for (size_t e = 0; e < json_array_size(examples); e++) {
            json_t *ex = json_array_get(examples, e);
            int T;
            int *ids = json_ints(json_object_get(ex, "input_ids"), &T);
            unsigned char *special = calloc((size_t)T, 1);
            if (bert) special[0] = special[T - 1] = 1; /* [CLS], [SEP] */
            json_t *layers = json_object_get(ex, "layers");
            int slacked = 0, n_layers = (int)json_array_size(layers);
            for (int metric = 0; metric < 2; metric++) {
                const char *mname = metric ? "l2" : "cosine";
                lens_ti_opts opts = {.metric = metric, .top_k = top_k, .vocabulary = vocabulary, .pool = pool};
                lens_ti_result res;
                if (lens_token_identity(m, ids, NULL, bert ? special : NULL, T, &opts, &res, &err)) {
                    CHECK(0, "%s/%zu: %s", name, e, err.msg);
                    continue;
                }
                CHECK(res.n_layers == n_layers && res.T == T && res.top_k == top_k, "%s: result shape", name);
                for (int k = 0; k < res.n_layers && k < n_layers; k++) {
                    const lens_ti_layer *y = &res.layers[k];
                    json_t *ref = json_object_get(json_array_get(layers, k), mname);
                    char what[160];
                    snprintf(what, sizeof what, "%s/%zu %s layer %d%s", name, e, mname, y->layer,
                             vocabulary ? " vocabulary" : "");
                    CHECK(y->layer == k, "%s: layer %d in slot %d", what, y->layer, k);
                    if (vocabulary) {
                        slacked += compare_rankings(what, y->vocab_rank, y->vocab_neighbors, top_k, T, ref);
                        int iff = 1;
                        for (int i = 0; i < T; i++)
                            iff &= (y->vocab_neighbors[i * top_k] == ids[i]) == (y->vocab_rank[i] == 1);
                        CHECK(iff, "%s: vocab_neighbors[i][0] == ids[i] must hold exactly when rank 1", what);
                        CHECK(fabsf(y->vocab_rate - rate_of(y->vocab_rank, special, T, 0)) < 1e-6f,
                              "%s: vocab_rate", what);
                    } else {
                        slacked += compare_rankings(what, y->rank, y->neighbors, top_k, T, ref);
                        CHECK(y->vocab_rank == NULL && isnan(y->vocab_rate), "%s: no vocabulary asked", what);
                    }
                    int iff = 1;
                    for (int i = 0; i < T; i++) iff &= (y->neighbors[i * top_k] == i) == (y->rank[i] == 1);
                    CHECK(iff, "%s: neighbors[i][0] == i must hold exactly when rank 1", what);
                    CHECK(y->rate == rate_of(y->rank, special, T, 0), "%s: rate %g is not the rank-1 fraction",
                          what, y->rate);
                    if (bert)
                        CHECK(y->rate_excluding_special == rate_of(y->rank, special, T, 1),
                              "%s: rate_excluding_special %g", what, y->rate_excluding_special);
                    else
                        CHECK(y->rate_excluding_special == y->rate, "%s: no special tokens given", what);
                    if (y->layer == 0) CHECK(y->rate == 1.0f, "%s: layer 0 must identify every token", what);
                }
                if (e + 1 == json_array_size(examples))
                    printf("  %s T=%d %s%s rates:", name, T, mname, vocabulary ? " vocabulary" : "");
                for (int k = 0; e + 1 == json_array_size(examples) && k < res.n_layers; k++)
                    printf(" %.3f", vocabulary ? res.layers[k].vocab_rate : res.layers[k].rate);
                if (e + 1 == json_array_size(examples)) printf("\n");
                lens_ti_result_free(&res);
            }
            if (slacked) printf("  %s/%zu: %d token rankings agreed only up to reference near-ties\n", name, e, slacked);
            free(ids), free(special);
        }

        /* argument checks */
        int ids[3] = {1, 2, 3}, bad_layer = m->cfg.n_layers + 1, dup[2] = {1, 1};
        lens_ti_result res;
        lens_ti_opts o = {.layers = &bad_layer, .n_layers = 1};
        CHECK(lens_token_identity(m, ids, NULL, NULL, 3, &o, &res, &err) && err.code == LENS_EINVAL,
              "layer L+1 must be LENS_EINVAL");
        o = (lens_ti_opts){.layers = dup, .n_layers = 2};
        CHECK(lens_token_identity(m, ids, NULL, NULL, 3, &o, &res, &err) && err.code == LENS_EINVAL,
              "a repeated layer must be LENS_EINVAL");
        o = (lens_ti_opts){.top_k = -1};
        CHECK(lens_token_identity(m, ids, NULL, NULL, 3, &o, &res, &err) && err.code == LENS_EINVAL,
              "top_k -1 must be LENS_EINVAL");
        lens_ti_maps wrong = {.n_layers = m->cfg.n_layers, .C = m->cfg.d_model, .w = (float *)ids, .b = (float *)ids};
        o = (lens_ti_opts){.maps = &wrong};
        CHECK(lens_token_identity(m, ids, NULL, NULL, 3, &o, &res, &err) && err.code == LENS_EINVAL,
              "maps of another model must be LENS_EINVAL");
        volatile int cancel = 1;
        o = (lens_ti_opts){.cancel = &cancel, .vocabulary = 1};
        CHECK(lens_token_identity(m, ids, NULL, NULL, 3, &o, &res, &err) && err.code == LENS_ECANCEL,
              "a set cancel flag must give LENS_ECANCEL");
        int layer_two[1] = {2};
        o = (lens_ti_opts){.layers = layer_two, .n_layers = 1, .top_k = 50};
        if (lens_token_identity(m, ids, NULL, NULL, 3, &o, &res, &err) == 0) {
            CHECK(res.n_layers == 1 && res.layers[0].layer == 2 && res.layers[0].neighbors[3] == -1,
                  "one layer, top_k > T: slots past T are -1");
            lens_ti_result_free(&res);
        } else CHECK(0, "%s", err.msg);
        lens_model_free(m);
    }
}

/* ------------------------------------------------------------ the fit */

typedef struct {
    volatile int *cancel;
    int calls;
    double last;
    int monotone;
} progress_state;

static void on_progress(void *user, double f)
{
    progress_state *p = user;
    p->monotone &= f >= p->last && f <= 1.0 + 1e-12;
    p->last = f;
    if (++p->calls == 2 && p->cancel) *p->cancel = 1;
}

static int file_bytes(const char *path, unsigned char **out, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc(*n + 1);
    size_t got = fread(*out, 1, *n, f);
    fclose(f);
    return got == *n ? 0 : -1;
}

static void write_bytes(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) fwrite(b, 1, n, f), fclose(f);
}

static int same_bits(const float *a, const float *b, size_t n) { return !memcmp(a, b, sizeof(float) * n); }

static void test_save_load(const char *shared, const lens_model *m, const lens_ti_maps *maps)
{
    char path[64], bad[64];
    snprintf(path, sizeof path, "/tmp/test_token_identity.%d.safetensors", (int)getpid());
    snprintf(bad, sizeof bad, "/tmp/test_token_identity.%d.bad.safetensors", (int)getpid());
    lens_err err = {0};
    CHECK(lens_ti_maps_save(maps, path, &err) == 0, "save: %s", err.msg);
    lens_ti_maps back;
    if (lens_ti_maps_load(path, m, &back, &err) == 0) {
        const int NL = maps->n_layers, C = maps->C;
        CHECK(back.n_layers == NL && back.C == C && same_bits(back.w, maps->w, (size_t)NL * C * C) &&
                  same_bits(back.b, maps->b, (size_t)NL * C) && same_bits(back.train_rate, maps->train_rate, NL) &&
                  same_bits(back.heldout_rate, maps->heldout_rate, NL) &&
                  same_bits(back.identity_heldout_rate, maps->identity_heldout_rate, NL),
              "save -> load must give the same bits");
        CHECK(back.ridge == maps->ridge && back.metric == maps->metric && back.train_tokens == maps->train_tokens &&
                  back.heldout_tokens == maps->heldout_tokens,
              "save -> load: ridge %.17g (want %.17g), metric %d, tokens %ld / %ld (want %ld / %ld)", back.ridge,
              maps->ridge, back.metric, back.train_tokens, back.heldout_tokens, maps->train_tokens,
              maps->heldout_tokens);
        lens_ti_maps_free(&back);
    } else CHECK(0, "load: %s", err.msg);

    /* truncated, and garbage */
    unsigned char *bytes = NULL;
    size_t n = 0;
    if (file_bytes(path, &bytes, &n) == 0) {
        const size_t cuts[] = {n / 2, n - 4, 12, 3};
        for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
            write_bytes(bad, bytes, cuts[c]);
            int rc = lens_ti_maps_load(bad, m, &back, &err);
            CHECK(rc && err.code == LENS_EFORMAT, "a file truncated to %zu of %zu bytes: rc %d, %s (%s)", cuts[c], n,
                  rc, lens_status_name(err.code), err.msg);
        }
        memset(bytes + 8, 'x', 16);
        write_bytes(bad, bytes, n);
        CHECK(lens_ti_maps_load(bad, m, &back, &err) && err.code == LENS_EFORMAT, "a corrupt header: %s", err.msg);
    }
    free(bytes);

    /* maps for fewer layers, for another width */
    lens_ti_maps fewer = *maps;
    fewer.n_layers = maps->n_layers - 1;
    CHECK(lens_ti_maps_save(&fewer, bad, &err) == 0, "save: %s", err.msg);
    CHECK(lens_ti_maps_load(bad, m, &back, &err) && err.code == LENS_EFORMAT, "maps for L-1 layers: %s", err.msg);
    printf("  load of maps with one layer less: %s\n", err.msg);
    lens_ti_maps narrow = *maps;
    narrow.C = maps->C / 2;
    CHECK(lens_ti_maps_save(&narrow, bad, &err) == 0, "save: %s", err.msg);
    CHECK(lens_ti_maps_load(bad, m, &back, &err) && err.code == LENS_EFORMAT, "maps of width C/2: %s", err.msg);
    CHECK(lens_ti_maps_load("/tmp/no/such/maps.safetensors", m, &back, &err) && err.code == LENS_ENOENT,
          "a missing file is LENS_ENOENT");
    /* bert-tiny-mlm has the same shape (L 2, C 128) but other weights */
    char other_dir[512];
    snprintf(other_dir, sizeof other_dir, "%s/models/bert-tiny-mlm", shared);
    lens_model *other = lens_model_load(other_dir, &err);
    CHECK(other && other->cfg.n_layers == m->cfg.n_layers && other->cfg.d_model == m->cfg.d_model,
          "bert-tiny-mlm has the same shape: %s", err.msg);
    if (other) {
        CHECK(lens_ti_maps_load(path, other, &back, &err) && err.code == LENS_EFORMAT && strstr(err.msg, "another model"),
              "maps of bert-tiny-sst2 refused for bert-tiny-mlm: %s", err.msg);
        lens_model_free(other);
    }
    remove(path), remove(bad);
}

static void test_fit(const char *shared, const json_t *fit, lens_pool *pool)
{
    char dir[512];
    const char *name = json_string_value(json_object_get(fit, "model"));
    snprintf(dir, sizeof dir, "%s/models/%s", shared, name ? name : "?");
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", dir, err.msg);
    if (!m) return;
    const json_t *jids = json_object_get(fit, "input_ids");
    const int S = (int)json_array_size(jids), n_train = (int)json_integer_value(json_object_get(fit, "n_train"));
    int *lengths = malloc(sizeof(int) * S);
    size_t N = 0;
    for (int s = 0; s < S; s++) N += json_array_size(json_array_get(jids, s));
    int *ids = malloc(sizeof(int) * N), *p = ids;
    size_t train_tokens = 0;
    for (int s = 0; s < S; s++) {
        const json_t *a = json_array_get(jids, s);
        lengths[s] = (int)json_array_size(a);
        for (int i = 0; i < lengths[s]; i++) *p++ = (int)json_integer_value(json_array_get(a, i));
        if (s < n_train) train_tokens += (size_t)lengths[s];
    }
    const lens_batch train = {.n_seqs = n_train, .lengths = lengths, .ids = ids};
    const lens_batch heldout = {.n_seqs = S - n_train, .lengths = lengths + n_train, .ids = ids + train_tokens};
    const json_t *layers = json_object_get(fit, "layers");
    const double ridge = json_number_value(json_object_get(fit, "ridge"));
    const int C = m->cfg.d_model, NL = m->cfg.n_layers + 1;
    lens_ti_maps maps[2];
    int have[2] = {0, 0};
    for (int metric = 0; metric < 2; metric++) {
        const char *mname = metric ? "l2" : "cosine";
        progress_state ps = {.monotone = 1};
        lens_ti_fit_opts o = {.ridge = ridge, .metric = metric, .pool = pool, .batch_tokens = metric ? 300 : 0,
                              .progress = on_progress, .progress_user = &ps};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (lens_ti_fit(m, &train, &heldout, &o, &maps[metric], &err)) {
            CHECK(0, "fit (%s): %s", mname, err.msg);
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        have[metric] = 1;
        const lens_ti_maps *g = &maps[metric];
        printf("  fit %s on %ld tokens (batch_tokens %d): %.0f ms\n", mname, g->train_tokens, o.batch_tokens,
               1e3 * (t1.tv_sec - t0.tv_sec) + 1e-6 * (t1.tv_nsec - t0.tv_nsec));
        CHECK(ps.monotone && ps.calls >= 2 && fabs(ps.last - 1) < 1e-9, "progress: %d calls, monotone %d, last %g",
              ps.calls, ps.monotone, ps.last);
        CHECK(g->n_layers == NL && g->C == C && g->ridge == ridge && g->metric == (lens_ti_metric)metric,
              "maps header");
        CHECK(g->train_tokens == json_integer_value(json_object_get(fit, "train_tokens")) &&
                  g->heldout_tokens == json_integer_value(json_object_get(fit, "heldout_tokens")),
              "token counts %ld / %ld", g->train_tokens, g->heldout_tokens);
        for (int l = 0; l < NL && l < (int)json_array_size(layers); l++) {
            const json_t *ref = json_array_get(layers, l);
            char what[96];
            /* W: every 8th row, relative Frobenius error */
            const json_t *rows = json_object_get(ref, "w_rows"), *sample = json_object_get(ref, "w_sample");
            double d2 = 0, r2 = 0, f2 = 0;
            for (size_t r = 0; r < json_array_size(rows); r++) {
                const int row = (int)json_integer_value(json_array_get(rows, r));
                for (int k = 0; k < C; k++) {
                    const double want = json_number_value(json_array_get(json_array_get(sample, r), k));
                    const double got = g->w[((size_t)l * C + row) * C + k];
                    d2 += (got - want) * (got - want), r2 += want * want;
                }
            }
            for (size_t e = 0; e < (size_t)C * C; e++) f2 += (double)g->w[(size_t)l * C * C + e] * g->w[(size_t)l * C * C + e];
            const double w_err = sqrt(d2 / r2), want_f = json_number_value(json_object_get(ref, "w_frobenius"));
            const double f_err = fabs(sqrt(f2) - want_f) / want_f;
            double bd2 = 0, br2 = 0;
            const json_t *jb = json_object_get(ref, "b");
            for (int k = 0; k < C; k++) {
                const double want = json_number_value(json_array_get(jb, k)), got = g->b[(size_t)l * C + k];
                bd2 += (got - want) * (got - want), br2 += want * want;
            }
            const double b_err = sqrt(bd2 / (br2 > 0 ? br2 : 1));
            snprintf(what, sizeof what, "fit %s layer %d", mname, l);
            CHECK(w_err <= 1e-3 && f_err <= 1e-3 && b_err <= 1e-3,
                  "%s: W relative error %.3g, ‖W‖_F %.3g, b %.3g (tolerance 1e-3)", what, w_err, f_err, b_err);
            /* identified tokens, within 2 per layer */
            const json_t *hits = json_object_get(ref, mname);
            const long want_train = json_integer_value(json_object_get(hits, "train_hits"));
            const long want_held = json_integer_value(json_object_get(hits, "heldout_hits"));
            const long want_id = json_integer_value(json_object_get(hits, "identity_heldout_hits"));
            const long got_train = lround(g->train_rate[l] * (double)g->train_tokens);
            const long got_held = lround(g->heldout_rate[l] * (double)g->heldout_tokens);
            const long got_id = lround(g->identity_heldout_rate[l] * (double)g->heldout_tokens);
            CHECK(labs(got_train - want_train) <= 2 && labs(got_held - want_held) <= 2 && labs(got_id - want_id) <= 2,
                  "%s: identified tokens train %ld (want %ld), held-out %ld (want %ld), without map %ld (want %ld)",
                  what, got_train, want_train, got_held, want_held, got_id, want_id);
            printf("  %s: W rel. error %.2g, b %.2g; rates train %.4f held-out %.4f identity %.4f "
                   "(reference %ld/%ld/%ld of %ld/%ld)\n",
                   what, w_err, b_err, g->train_rate[l], g->heldout_rate[l], g->identity_heldout_rate[l], want_train,
                   want_held, want_id, g->train_tokens, g->heldout_tokens);
        }
        CHECK(g->train_rate[0] >= 0.99f && g->heldout_rate[0] >= 0.99f, "g_0 should identify ~every token: %g / %g",
              g->train_rate[0], g->heldout_rate[0]);
    }
    /* the two fits differ in chunking (2048 vs 300 tokens) only: same maps up to summation order */
    if (have[0] && have[1]) {
        char what[64];
        snprintf(what, sizeof what, "W with batch_tokens 2048 vs 300");
        check_close(what, maps[1].w, maps[0].w, (size_t)NL * C * C, 1e-6, 1e-5);
    }

    if (have[0]) {
        /* lens_token_identity with the maps = lens_ti_apply + lens_ti_rank on lens_forward's hidden states */
        const int T = lengths[S - 1];
        const int *sid = ids + (N - (size_t)T);
        lens_ti_opts o = {.maps = &maps[0], .top_k = 3, .pool = pool};
        lens_ti_result res;
        lens_activations act;
        lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN};
        lens_batch one = {.n_seqs = 1, .lengths = &T, .ids = sid};
        if (lens_token_identity(m, sid, NULL, NULL, T, &o, &res, &err) == 0 && lens_forward(m, &one, &fo, &act, &err) == 0) {
            float *q = malloc(sizeof(float) * T * C);
            int *own = malloc(sizeof(int) * T), *rank = malloc(sizeof(int) * T), *nb = malloc(sizeof(int) * T * 3);
            for (int i = 0; i < T; i++) own[i] = i;
            int same = 1;
            for (int l = 0; l < NL; l++) {
                lens_ti_apply(&maps[0], l, lens_act_hidden(m, &act, l, 0), T, q);
                lens_ti_rank(q, T, lens_act_hidden(m, &act, 0, 0), T, C, LENS_TI_COSINE, own, 3, rank, nb, NULL, &err);
                same &= !memcmp(rank, res.layers[l].rank, sizeof(int) * T) &&
                        !memcmp(nb, res.layers[l].neighbors, sizeof(int) * T * 3);
            }
            CHECK(same, "mapping linear: lens_token_identity must equal lens_ti_apply + lens_ti_rank");
            free(q), free(own), free(rank), free(nb);
            lens_activations_free(&act);
            lens_ti_result_free(&res);
        } else CHECK(0, "%s", err.msg);

        test_save_load(shared, m, &maps[0]);
    }

    /* cancel: before the start, and from the progress callback between chunks */
    volatile int cancel = 1;
    lens_ti_maps cm;
    lens_ti_fit_opts co = {.cancel = &cancel, .batch_tokens = 200};
    CHECK(lens_ti_fit(m, &train, &heldout, &co, &cm, &err) && err.code == LENS_ECANCEL, "a set cancel flag: %s",
          err.msg);
    cancel = 0;
    progress_state ps = {.cancel = &cancel, .monotone = 1};
    co.progress = on_progress, co.progress_user = &ps;
    CHECK(lens_ti_fit(m, &train, &heldout, &co, &cm, &err) && err.code == LENS_ECANCEL && ps.calls == 2,
          "cancel after the second chunk: %s after %d progress calls", err.msg, ps.calls);
    CHECK(cm.w == NULL, "a cancelled fit leaves no maps");
    lens_ti_fit_opts neg = {.ridge = -1};
    CHECK(lens_ti_fit(m, &train, NULL, &neg, &cm, &err) && err.code == LENS_EINVAL, "negative ridge: LENS_EINVAL");

    for (int k = 0; k < 2; k++)
        if (have[k]) lens_ti_maps_free(&maps[k]);
    free(lengths), free(ids);
    lens_model_free(m);
}

int main(void)
{
    lens_blas_set_threads(1); /* the pool's threads compute; OpenBLAS single-threaded (core/base/pool.h) */
    lens_pool *pool = lens_pool_create(2);
    test_rank_properties(pool);

    const char *shared = check_shared_dir();
    json_t *fix = fixture_load("tests/fixtures/token_identity_shared.json");
    const json_t *rankings = fixture_list(fix, "rankings", "token_identity_shared.json");
    const json_t *vocabulary = fixture_list(fix, "vocabulary", "token_identity_shared.json");
    const json_t *fit = fix ? fixture_cases(json_object_get(fix, "fit"), "token_identity_shared.json: \"fit\"") : NULL;
    if (!shared) {
        SKIP("../shared is absent: token identity vs PyTorch, the vocabulary ranking and the fit not checked");
    } else if (fix) {
        const int top_k = (int)json_integer_value(json_object_get(fix, "top_k"));
        if (rankings) test_rankings(shared, rankings, top_k, pool, 0);
        if (vocabulary) test_rankings(shared, vocabulary, top_k, pool, 1);
        if (fit) test_fit(shared, fit, pool);
    }
    json_decref(fix);
    lens_pool_free(pool);
    return check_done("test_token_identity");
}
