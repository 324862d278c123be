/* test_shard.c - sharded dataset jobs (lensd job run / merge, api/shard.c,
 * core/io/partial.c).
 *
 *  - the partial file: round trip, and every malformed file (truncated, bad
 *    magic, header past the end, tensor outside the data) refused;
 *  - decomposition accumulators merged from 3 and 7 shards against one run,
 *    in process: every number of the result within 1e-9 relative (the merge
 *    only reorders double sums), counts equal;
 *  - the token identity maps' normal equations summed over 3 and 7 shards
 *    of rows against one accumulation: within 1e-9 relative, and the maps
 *    solved from them against lens_ti_fit's;
 *  - the Indexed Job's own command line (deploy/k8s/jobs/shard-job.yaml,
 *    args with its $(VAR)s filled) run as separate processes with
 *    JOB_COMPLETION_INDEX set as Kubernetes sets it, N = 1, 3, 7, for
 *    head-importance, adversarial-triggers, decomposition, token-identity-map,
 *    attribution over texts, faithfulness (every method, and unit heads; on the first 7
 *    SST-2 dev rows when ../shared is there) and context-mixing (every
 *    method): the merged result equals the 1-shard result (timing aside);
 *    more shards than texts is a 422 naming texts;
 *  - merging refuses a missing shard (named), a duplicated one, partials of
 *    other params and of another model with the same name. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/analysis/decomposition.h"
#include "core/analysis/token_identity.h"
#include "core/io/partial.h"
#include "tests/check.h"

#define DEMO "models/demo-sst2"

static const char *lensd(void)
{
    static char path[512];
    const char *build = getenv("BUILD");
    snprintf(path, sizeof path, "%s/lensd", build && *build ? build : "build");
    return path;
}

/* ------------------------------------------------------------ partial file */

static void test_partial_file(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/t.lpart", dir);
    lens_partial p, q;
    lens_err err = {0};
    const double x[3] = {1.5, -2, 1e-300};
    const int64_t n[2] = {7, -1};
    CHECK(lens_partial_init(&p, &err) == 0, "init");
    json_object_set_new(p.header, "kind", json_string("demo"));
    CHECK(lens_partial_add(&p, "x", LENS_PT_F64, 3, x, &err) == 0, "add x");
    CHECK(lens_partial_add(&p, "n", LENS_PT_I64, 2, n, &err) == 0, "add n");
    CHECK(lens_partial_add(&p, "s", LENS_PT_U8, 5, "{\"a\"}", &err) == 0, "add s");
    CHECK(lens_partial_add(&p, "x", LENS_PT_F64, 1, x, &err) != 0, "a duplicate name is refused");
    CHECK(lens_partial_write(&p, path, &err) == 0, "write: %s", err.msg);
    CHECK(lens_partial_read(path, &q, &err) == 0, "read: %s", err.msg);
    const double *qx = lens_partial_get(&q, "x", LENS_PT_F64, 3, &err);
    const int64_t *qn = lens_partial_get(&q, "n", LENS_PT_I64, 2, &err);
    const char *qs = lens_partial_get(&q, "s", LENS_PT_U8, 5, &err);
    CHECK(qx && !memcmp(qx, x, sizeof x) && qn && !memcmp(qn, n, sizeof n) && qs && !memcmp(qs, "{\"a\"}", 5),
          "round trip is bit for bit");
    CHECK(!lens_partial_get(&q, "s", LENS_PT_I64, 5, &err), "a wrong dtype is refused");
    CHECK(!lens_partial_get(&q, "x", LENS_PT_F64, 4, &err), "a wrong length is refused");
    const char *kind = json_string_value(json_object_get(q.header, "kind"));
    CHECK(kind && !strcmp(kind, "demo"), "header keys survive");
    lens_partial_free(&q);

    /* the file's bytes, then damaged copies */
    FILE *f = fopen(path, "rb");
    unsigned char buf[4096];
    size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(len > 40, "partial file has %zu bytes", len);
    int refused = 0, cases = 0;
    for (size_t cut = 0; cut < len; cut += 7, cases++) /* every truncation */
        if (lens_partial_parse(buf, cut, &q, &err) != 0) refused++;
        else lens_partial_free(&q);
    CHECK(refused == cases && cases > 5, "%d of %d truncated files refused", refused, cases);
    unsigned char bad[4096];
    memcpy(bad, buf, len);
    bad[0] = 'X';
    CHECK(lens_partial_parse(bad, len, &q, &err) != 0 && err.code == LENS_EFORMAT, "bad magic refused");
    memcpy(bad, buf, len);
    bad[15] = 0x7f; /* header length far past the end */
    CHECK(lens_partial_parse(bad, len, &q, &err) != 0, "header past the end refused");
    memcpy(bad, buf, len);
    char *off = memmem(bad, len, "\"length\":3", 10);
    if (off) off[9] = '9'; /* x claims 9 doubles: past the data */
    CHECK(off && lens_partial_parse(bad, len, &q, &err) != 0 && strstr(err.msg, "outside"),
          "tensor outside the data refused (%s)", err.msg);
    lens_partial_free(&p);
}

/* ---------------------------------------------- decomposition, in process */

static double rel(double a, double b) { return a == b ? 0 : fabs(a - b) / fmax(fabs(a), fabs(b)); }

/* Largest relative difference between two results' numbers; counts must match. */
static double result_diff(const lens_decomp_result *a, const lens_decomp_result *b, int *counts_equal)
{
    double worst = 0;
    *counts_equal = a->n_layers == b->n_layers && a->n_windows == b->n_windows && a->P == b->P;
    for (int l = 0; *counts_equal && l < a->n_layers; l++) {
        const lens_decomp_layer *x = &a->layers[l], *y = &b->layers[l];
        const double xs[] = {x->share_mean, x->share_pos, x->share_ctx, x->share_resid, x->norm_pos, x->norm_ctx,
                             x->norm_resid, x->pos_stable_rank, x->pos_explained_k2, x->pos_explained_k10,
                             x->pos_smoothness, x->max_abs_cos, x->mean_abs_cos, x->topics_within,
                             x->topics_between};
        const double ys[] = {y->share_mean, y->share_pos, y->share_ctx, y->share_resid, y->norm_pos, y->norm_ctx,
                             y->norm_resid, y->pos_stable_rank, y->pos_explained_k2, y->pos_explained_k10,
                             y->pos_smoothness, y->max_abs_cos, y->mean_abs_cos, y->topics_within,
                             y->topics_between};
        for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) worst = fmax(worst, rel(xs[i], ys[i]));
        *counts_equal &= x->n_angles == y->n_angles && x->topics_within_pairs == y->topics_within_pairs &&
                         x->topics_between_pairs == y->topics_between_pairs;
        for (int i = 0; *counts_equal && i < x->n_angles; i++)
            worst = fmax(worst, fabs(x->principal_angles_deg[i] - y->principal_angles_deg[i]) / 90);
        for (int i = 0; i < a->d_model; i++) worst = fmax(worst, rel(x->mean[i], y->mean[i]));
        for (int i = 0; i < a->P * a->d_model; i++) worst = fmax(worst, rel(x->pos[i], y->pos[i]));
    }
    return worst;
}

static void test_decomposition_merge(const lens_model *m)
{
    enum { T = 12, W = 41, BATCH_TOKENS = 48 }; /* 4 windows a batch: 11 batches, the last short */
    int ids[W * T], labels[W];
    unsigned x = 12345;
    for (int i = 0; i < W * T; i++) ids[i] = (int)((x = x * 1103515245u + 12345u) >> 8) % m->cfg.vocab_size;
    for (int w = 0; w < W; w++) labels[w] = w % 3 == 0;
    lens_decomp_opts o = {.batch_tokens = BATCH_TOKENS};
    lens_err err = {0};
    lens_decomp_result one;
    lens_decomp *acc = lens_decomp_begin(m, T, NULL, 0, &o, &err);
    int rc = acc ? lens_decomp_add(acc, ids, labels, W, &err) : -1;
    if (!rc) rc = lens_decomp_finish(acc, &one, &err);
    lens_decomp_free(acc);
    CHECK(rc == 0, "single decomposition: %s", err.msg);
    if (rc) return;
    const int shard_counts[] = {1, 3, 7};
    for (size_t k = 0; k < sizeof shard_counts / sizeof *shard_counts; k++) {
        const int N = shard_counts[k];
        lens_partial parts[7];
        int ok = 1;
        for (int i = 0; i < N; i++) {
            lens_decomp_opts so = o;
            so.shard_index = i, so.shard_count = N;
            lens_decomp *s = lens_decomp_begin(m, T, NULL, 0, &so, &err);
            ok &= s && lens_partial_init(&parts[i], &err) == 0 && lens_decomp_add(s, ids, labels, W, &err) == 0 &&
                  lens_decomp_export(s, &parts[i], "", &err) == 0;
            lens_decomp_free(s);
        }
        lens_decomp *merged = lens_decomp_begin(m, T, NULL, 0, &o, &err);
        for (int i = N - 1; ok && i >= 0; i--) ok = lens_decomp_import(merged, &parts[i], "", W, &err) == 0;
        lens_decomp_result res;
        ok = ok && lens_decomp_complete(merged, &err) == 0 && lens_decomp_finish(merged, &res, &err) == 0;
        CHECK(ok, "%d shards merged: %s", N, err.msg);
        if (ok) {
            int counts_equal;
            double d = result_diff(&one, &res, &counts_equal);
            printf("decomposition, %d shards merged (in reverse) vs one run: counts %s, max relative difference %.2e\n",
                   N, counts_equal ? "equal" : "DIFFER", d);
            CHECK(counts_equal, "%d shards: counts differ", N);
            CHECK(d <= 1e-9, "%d shards: relative difference %g over 1e-9", N, d);
            lens_decomp_result_free(&res);
        }
        if (N == 3) { /* a shard given twice, or missing */
            lens_decomp *again = lens_decomp_begin(m, T, NULL, 0, &o, &err);
            CHECK(lens_decomp_import(again, &parts[0], "", W, &err) == 0 &&
                      lens_decomp_import(again, &parts[0], "", W, &err) != 0,
                  "a shard imported twice is refused");
            lens_decomp_free(again);
            again = lens_decomp_begin(m, T, NULL, 0, &o, &err);
            CHECK(lens_decomp_import(again, &parts[0], "", W, &err) == 0 &&
                      lens_decomp_import(again, &parts[2], "", W, &err) == 0 &&
                      lens_decomp_complete(again, &err) != 0 && strstr(err.msg, "window 4 is in no partial"),
                  "a missing shard is found (%s)", err.msg);
            lens_decomp_free(again);
        }
        lens_decomp_free(merged);
        for (int i = 0; i < N; i++) lens_partial_free(&parts[i]);
    }
    lens_decomp_result_free(&one);
}

/* ------------------------------------- token identity maps, in process */

/* Rows r % count == index of the packed batch all into sub (ids, lengths: caller's buffers). */
static void ti_pick(const lens_batch *all, int index, int count, lens_batch *sub, int *ids, int *lengths)
{
    size_t tok = 0, n = 0;
    *sub = (lens_batch){.ids = ids, .lengths = lengths};
    for (int r = 0; r < all->n_seqs; tok += (size_t)all->lengths[r++]) {
        if (r % count != index) continue;
        memcpy(ids + n, all->ids + tok, sizeof *ids * (size_t)all->lengths[r]);
        n += (size_t)all->lengths[r];
        lengths[sub->n_seqs++] = all->lengths[r];
    }
}

static double maps_diff(const lens_ti_maps *a, const lens_ti_maps *b)
{
    double worst = 0;
    for (size_t e = 0; e < (size_t)a->n_layers * a->C * a->C; e++) worst = fmax(worst, rel(a->w[e], b->w[e]));
    for (size_t e = 0; e < (size_t)a->n_layers * a->C; e++) worst = fmax(worst, rel(a->b[e], b->b[e]));
    return worst;
}

static void test_token_identity_merge(const lens_model *m)
{
    enum { S = 23, MAX_T = 12 };
    int ids[S * MAX_T], lengths[S], sub_ids[S * MAX_T], sub_len[S];
    unsigned x = 777;
    size_t n = 0;
    for (int s = 0; s < S; s++) {
        lengths[s] = 3 + s % (MAX_T - 2);
        for (int t = 0; t < lengths[s]; t++) ids[n++] = (int)((x = x * 1103515245u + 12345u) >> 8) % m->cfg.vocab_size;
    }
    const lens_batch all = {.n_seqs = S, .lengths = lengths, .ids = ids};
    const int NL = m->cfg.n_layers + 1, C = m->cfg.d_model, CA = C + 1;
    const size_t nG = (size_t)NL * CA * CA, nXY = (size_t)NL * CA * C;
    double *G1 = calloc(nG, sizeof *G1), *XY1 = calloc(nXY, sizeof *XY1), *G = calloc(nG, sizeof *G),
           *XY = calloc(nXY, sizeof *XY), *Gs = calloc(nG, sizeof *Gs), *XYs = calloc(nXY, sizeof *XYs);
    lens_err err = {0};
    lens_ti_maps fit, one, merged;
    int ok = G1 && XY1 && G && XY && Gs && XYs && lens_ti_fit(m, &all, NULL, NULL, &fit, &err) == 0;
    CHECK(ok, "token identity fit: %s", err.msg);
    ok = ok && lens_ti_accumulate(m, &all, NULL, G1, XY1, &err) == 0 && lens_ti_solve(m, G1, XY1, NULL, &one, &err) == 0;
    CHECK(ok, "accumulate + solve: %s", err.msg);
    if (ok) {
        CHECK(maps_diff(&fit, &one) == 0, "accumulate + solve give lens_ti_fit's maps bit for bit");
        lens_ti_maps_free(&one);
    }
    const int shard_counts[] = {3, 7};
    int cases = 0;
    for (size_t k = 0; ok && k < sizeof shard_counts / sizeof *shard_counts; k++, cases++) {
        const int N = shard_counts[k];
        memset(G, 0, nG * sizeof *G), memset(XY, 0, nXY * sizeof *XY);
        for (int i = 0; ok && i < N; i++) { /* each shard its own sums, added in shard order as the merge does */
            lens_batch sub;
            ti_pick(&all, i, N, &sub, sub_ids, sub_len);
            memset(Gs, 0, nG * sizeof *Gs), memset(XYs, 0, nXY * sizeof *XYs);
            ok = lens_ti_accumulate(m, &sub, NULL, Gs, XYs, &err) == 0;
            for (size_t e = 0; e < nG; e++) G[e] += Gs[e];
            for (size_t e = 0; e < nXY; e++) XY[e] += XYs[e];
        }
        double dg = 0;
        for (size_t e = 0; e < nG; e++) dg = fmax(dg, rel(G[e], G1[e]));
        for (size_t e = 0; e < nXY; e++) dg = fmax(dg, rel(XY[e], XY1[e]));
        ok = ok && lens_ti_solve(m, G, XY, NULL, &merged, &err) == 0;
        CHECK(ok, "%d shards: %s", N, err.msg);
        if (!ok) break;
        const double dm = maps_diff(&fit, &merged);
        printf("token identity, %d shards: normal equations max relative difference %.2e, maps (float) %.2e\n", N,
               dg, dm);
        CHECK(G[(size_t)C * CA + C] == G1[(size_t)C * CA + C], "%d shards: the token count is exact", N);
        CHECK(dg <= 1e-9, "%d shards: normal equations differ by %g relative", N, dg);
        CHECK(dm <= 1e-6, "%d shards: maps differ by %g relative (float32 maps)", N, dm);
        lens_ti_maps_free(&merged);
    }
    CHECK(cases == 2, "token identity shard counts run: %d", cases);
    if (G1 && XY1 && G && XY && Gs && XYs && fit.w) lens_ti_maps_free(&fit);
    free(G1), free(XY1), free(G), free(XY), free(Gs), free(XYs);
}

/* ------------------------------------ the Indexed Job's command, processes */

/* args of deploy/k8s/jobs/shard-job.yaml (a flow sequence of quoted strings,
 * which is JSON) and its env values, or NULL. */
static json_t *manifest_args(json_t **env)
{
    FILE *f = fopen("deploy/k8s/jobs/shard-job.yaml", "r");
    if (!f) return NULL;
    char line[2048], name[128] = "";
    json_t *args = NULL;
    *env = json_object();
    while (fgets(line, sizeof line, f)) {
        char *p;
        if ((p = strstr(line, "- name: ")) && sscanf(p + 8, "%127s", name) == 1) continue;
        if ((p = strstr(line, "value: ")) && *name) {
            char value[512];
            if (sscanf(p + 7, " \"%511[^\"]\"", value) == 1 || sscanf(p + 7, "%511s", value) == 1)
                json_object_set_new(*env, name, json_string(value));
            *name = 0;
        }
        if ((p = strstr(line, "args: ["))) { /* the flow sequence, over as many lines as it takes */
            char seq[8192] = "";
            size_t used = 0;
            for (char *part = p + 6; part; part = strchr(seq, ']') ? NULL : fgets(line, sizeof line, f) ? line : NULL)
                used += (size_t)snprintf(seq + used, used < sizeof seq ? sizeof seq - used : 0, "%s", part);
            args = json_loads(seq, JSON_DISABLE_EOF_CHECK, NULL);
        }
    }
    fclose(f);
    return args;
}

/* The manifest's args with its variables and volume paths set for this test. */
static int run_manifest_shard(json_t *args, json_t *env, const char *kind, const char *params, const char *parts_dir,
                              int index, int N)
{
    char cmd[8192], shards[16];
    snprintf(shards, sizeof shards, "%d", N);
    size_t used = (size_t)snprintf(cmd, sizeof cmd, "JOB_COMPLETION_INDEX=%d %s", index, lensd());
    size_t i;
    json_t *a;
    json_array_foreach(args, i, a) {
        char word[1024];
        const char *s = json_string_value(a);
        if (!strcmp(s, "$(LENSD_JOB_KIND)")) s = kind;
        else if (!strcmp(s, "$(LENSD_JOB_SHARDS)")) s = shards;
        else if (!strcmp(s, "$(LENSD_JOB_MODEL)")) s = DEMO;
        else if (!strcmp(s, "/params/params.json")) s = params;
        else if (!strcmp(s, "/data")) s = ".";
        else if (!strncmp(s, "/parts/", 7)) {
            snprintf(word, sizeof word, "%s/%s", parts_dir, s + 7);
            s = word;
        }
        used += (size_t)snprintf(cmd + used, sizeof cmd - used, " '%s'", s);
    }
    (void)env;
    used += (size_t)snprintf(cmd + used, sizeof cmd - used, " 2>/dev/null");
    return used < sizeof cmd ? system(cmd) : -1;
}

static json_t *merge(const char *parts, const char *out, char *stderr_text, size_t size)
{
    char cmd[4096], errp[700];
    snprintf(errp, sizeof errp, "%s.err", out);
    snprintf(cmd, sizeof cmd, "%s job merge --model %s --data-dir . --out %s %s 2>%s", lensd(), DEMO, out, parts, errp);
    int rc = system(cmd);
    FILE *f = fopen(errp, "r");
    size_t n = f ? fread(stderr_text, 1, size - 1, f) : 0;
    stderr_text[n] = 0;
    if (f) fclose(f);
    if (rc != 0) return NULL;
    json_t *r = json_load_file(out, 0, NULL);
    if (r) json_object_del(r, "timing_ms");
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(r, "results"), i, item) json_object_del(item, "timing_ms"); /* a batch's */
    return r;
}

static void write_params(const char *path, json_t *params)
{
    json_dump_file(params, path, JSON_COMPACT);
    json_decref(params);
}

static json_t *sst2_rows(int n)
{
    static const char *texts[] = {"a charming and funny film", "dull , tedious and far too long",
                                  "the best movie of the year", "awful acting and a silly plot",
                                  "i loved every minute of it", "a mess from start to finish",
                                  "warm , witty and wise", "nothing here works", "a small gem",
                                  "painfully boring"};
    json_t *rows = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(rows, json_pack("{s:s, s:i}", "text", texts[i % 10], "label", (i + 1) % 2));
    return rows;
}

/* The first n sentences of SST-2 dev (../shared), or sst2_rows' texts without it. */
static json_t *sst2_dev_texts(int n)
{
    json_t *texts = json_array();
    const char *shared = check_shared_dir();
    char path[600], line[4096];
    snprintf(path, sizeof path, "%s/data/sst2/dev.tsv", shared ? shared : ".");
    FILE *f = shared ? fopen(path, "r") : NULL;
    while (f && (int)json_array_size(texts) < n && fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        if (tab && strncmp(line, "sentence\t", 9)) json_array_append_new(texts, json_stringn(line, (size_t)(tab - line)));
    }
    if (f) fclose(f);
    json_t *rows = sst2_rows(n), *row;
    size_t i;
    json_array_foreach(rows, i, row) if ((int)json_array_size(texts) < n) json_array_append(texts, json_object_get(row, "text"));
    json_decref(rows);
    return texts;
}

static void test_processes(const char *dir)
{
    json_t *env = NULL, *args = manifest_args(&env);
    CHECK(args && json_array_size(args) > 8, "deploy/k8s/jobs/shard-job.yaml has an args list");
    if (!args) return;
    char hp[600], tp[600], dp[600];
    snprintf(hp, sizeof hp, "%s/head.json", dir);
    snprintf(tp, sizeof tp, "%s/trig.json", dir);
    snprintf(dp, sizeof dp, "%s/decomp.json", dir);
    write_params(hp, json_pack("{s:s, s:o, s:i, s:i}", "model", "demo-sst2", "rows", sst2_rows(7), "steps", 2,
                               "seeds", 2));
    write_params(tp, json_pack("{s:s, s:o, s:i, s:i, s:s}", "model", "demo-sst2", "rows", sst2_rows(10), "steps",
                               2, "sources", 6, "definition", "lensd"));
    json_t *windows = json_array(), *labels = json_array();
    unsigned x = 7;
    for (int w = 0; w < 1900; w++) { /* 256 windows a batch: 8 batches */
        json_t *win = json_array();
        for (int t = 0; t < 8; t++) json_array_append_new(win, json_integer(1000 + (x = x * 1103515245u + 12345u) % 5000));
        json_array_append_new(windows, win);
        json_array_append_new(labels, json_string(w % 4 ? "a" : "b"));
    }
    write_params(dp, json_pack("{s:s, s:o, s:o}", "model", "demo-sst2", "windows", windows, "labels", labels));
    char ip[600], ap[600];
    snprintf(ip, sizeof ip, "%s/identity.json", dir);
    snprintf(ap, sizeof ap, "%s/attribution.json", dir);
    json_t *texts = json_array(), *rows = sst2_rows(16);
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        char text[256];
        snprintf(text, sizeof text, "%s , number %zu", json_string_value(json_object_get(row, "text")), i);
        json_array_append_new(texts, json_string(text));
    }
    json_decref(rows);
    write_params(ip, json_pack("{s:s, s:O, s:f}", "model", "demo-sst2", "texts", texts, "heldout_fraction", 0.25));
    json_t *cm_texts = json_deep_copy(texts);
    json_array_set_new(texts, 5, json_integer(5)); /* a bad row: its error stays in its slot */
    write_params(ap, json_pack("{s:s, s:o, s:i, s:b}", "model", "demo-sst2", "texts", texts, "steps", 2, "tree", 1));
    char fp[600];
    snprintf(fp, sizeof fp, "%s/faithfulness.json", dir);
    write_params(fp, json_pack("{s:s, s:o, s:i}", "model", "demo-sst2", "texts", sst2_dev_texts(7), "steps", 2));
    char fhp[600]; /* unit heads: the heads zero-ablated, random and attention-attribution */
    snprintf(fhp, sizeof fhp, "%s/faithfulness-heads.json", dir);
    write_params(fhp, json_pack("{s:s, s:o, s:i, s:s}", "model", "demo-sst2", "texts", sst2_dev_texts(7), "steps", 2,
                                "unit", "heads"));
    char cp[600];
    snprintf(cp, sizeof cp, "%s/context-mixing.json", dir);
    write_params(cp, json_pack("{s:s, s:o, s:[s,s,s,s]}", "model", "demo-sst2", "texts", cm_texts, "methods", "rollout",
                               "alti", "globenc", "value-zeroing"));
    const struct {
        const char *kind, *params, *tag; /* tag: a second params set of a kind (its partials' folder) */
    } kinds[] = {{"head-importance", hp, ""}, {"adversarial-triggers", tp, ""}, {"decomposition", dp, ""},
                 {"token-identity-map", ip, ""}, {"attribution", ap, ""}, {"faithfulness", fp, ""},
                 {"context-mixing", cp, ""}, {"faithfulness", fhp, "-heads"}};
    int n_kinds = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++, n_kinds++) {
        json_t *one = NULL;
        const int shard_counts[] = {1, 3, 7};
        for (size_t s = 0; s < 3; s++) {
            const int N = shard_counts[s];
            char parts_dir[700], glob[800], out[800], why[1024];
            snprintf(parts_dir, sizeof parts_dir, "%s/%s%s-%d", dir, kinds[k].kind, kinds[k].tag, N);
            mkdir(parts_dir, 0700);
            int failed = 0;
            for (int i = 0; i < N; i++)
                failed |= run_manifest_shard(args, env, kinds[k].kind, kinds[k].params, parts_dir, i, N) != 0;
            CHECK(!failed, "%s: a shard of %d failed", kinds[k].kind, N);
            snprintf(glob, sizeof glob, "%s/part-*.lpart", parts_dir);
            snprintf(out, sizeof out, "%s/result.json", parts_dir);
            json_t *r = merge(glob, out, why, sizeof why);
            CHECK(r != NULL, "%s: merge of %d shards failed: %s", kinds[k].kind, N, why);
            if (!r) continue;
            if (!one) one = r;
            else {
                CHECK(json_equal(one, r), "%s: %d shards merged differ from 1 shard", kinds[k].kind, N);
                printf("%s: %d separate shard processes merged = 1 shard: %s\n", kinds[k].kind, N,
                       json_equal(one, r) ? "identical" : "DIFFERENT");
                json_decref(r);
            }
            if (N == 3 && k == 0) { /* refusals, on the head-importance partials */
                char two[4096];
                snprintf(two, sizeof two, "%s/part-0.lpart %s/part-2.lpart", parts_dir, parts_dir);
                CHECK(!merge(two, out, why, sizeof why) && strstr(why, "missing shard(s) 1 of 3"),
                      "a missing shard is named: %s", why);
                snprintf(two, sizeof two, "%s/part-0.lpart %s/part-1.lpart %s/part-1.lpart %s/part-2.lpart", parts_dir,
                         parts_dir, parts_dir, parts_dir);
                CHECK(!merge(two, out, why, sizeof why) && strstr(why, "given twice"), "a duplicate is refused: %s",
                      why);
            }
        }
        json_decref(one);
    }
    CHECK(n_kinds == 8, "kinds run: %d", n_kinds);

    /* more shards than texts: a 422 naming texts, before any work */
    char cmd[4096], why[1024], out[700];
    snprintf(out, sizeof out, "%s/few.err", dir);
    snprintf(cmd, sizeof cmd, "%s job run --model %s --kind context-mixing --params %s --shard 0/17 --out %s/few.lpart 2>%s",
             lensd(), DEMO, cp, dir, out);
    int few_rc = system(cmd);
    FILE *few = fopen(out, "r");
    size_t few_n = few ? fread(why, 1, sizeof why - 1, few) : 0;
    why[few_n] = 0;
    if (few) fclose(few);
    CHECK(few_rc != 0 && strstr(why, "\"field\":\"texts\"") && strstr(why, "16 text(s) for 17 shards"),
          "fewer texts than shards is a 422 on texts: %s", why);

    /* other params: shard 1 of 3 computed with 3 steps */
    char p3[700];
    snprintf(p3, sizeof p3, "%s/head3.json", dir);
    write_params(p3, json_pack("{s:s, s:o, s:i, s:i}", "model", "demo-sst2", "rows", sst2_rows(7), "steps", 3,
                               "seeds", 2));
    snprintf(cmd, sizeof cmd, "%s job run --model %s --kind head-importance --params %s --shard 1/3 --out %s/other.lpart 2>/dev/null",
             lensd(), DEMO, p3, dir);
    CHECK(system(cmd) == 0, "shard with other params ran");
    snprintf(cmd, sizeof cmd, "%s/head-importance-3/part-0.lpart %s/other.lpart %s/head-importance-3/part-2.lpart",
             dir, dir, dir);
    snprintf(out, sizeof out, "%s/x.json", dir);
    CHECK(!merge(cmd, out, why, sizeof why) && strstr(why, "params_hash"), "other params are refused: %s", why);

    /* another model with the same name: a random checkpoint in a folder demo-sst2 */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/other && %s mkmodel --arch bert --preset micro --task classification --seed 9 --out %s/other/demo-sst2 >/dev/null 2>&1",
             dir, lensd(), dir);
    if (system(cmd) == 0) {
        snprintf(cmd, sizeof cmd, "%s job merge --model %s/other/demo-sst2 --out %s %s/head-importance-3/part-*.lpart 2>%s.err",
                 lensd(), dir, out, dir, out);
        int rc = system(cmd);
        char errp[800];
        snprintf(errp, sizeof errp, "%s.err", out);
        FILE *f = fopen(errp, "r");
        size_t n = f ? fread(why, 1, sizeof why - 1, f) : 0;
        why[n] = 0;
        if (f) fclose(f);
        CHECK(rc != 0 && strstr(why, "another model"), "partials of another model are refused: %s", why);
    } else {
        CHECK(0, "mkmodel for the other-model case failed");
    }
    json_decref(args);
    json_decref(env);
}

int main(void)
{
    char dir[] = "/tmp/lens_test_shard_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_partial_file(dir);
    lens_err err = {0};
    lens_model *m = lens_model_load(DEMO, &err);
    CHECK(m != NULL, "load %s: %s", DEMO, err.msg);
    if (m) {
        test_decomposition_merge(m);
        test_token_identity_merge(m);
        lens_model_free(m);
    }
    test_processes(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return check_done("test_shard");
}
