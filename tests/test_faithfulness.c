/* test_faithfulness.c - deletion / insertion curves (core/analysis/
 * faithfulness.c) against sequences this test builds and runs itself, on
 * the demo classifier (models/demo-sst2) with SST-2 dev rows and on the demo
 * causal LM (models/demo-gpt2).
 *
 *  - the ends of the curves: D(0) = I(1) = F(x), D(1) = I(0) = F of the
 *    special tokens alone (so they are never removed), the causal LM's input
 *    cut after the objective's position and that token kept;
 *  - removal is deletion and the order follows the scores: leave-one-out's
 *    D at k = 1 is min_j F(x \ {j}) over the removable j, computed here;
 *  - the random ordering: on short dev rows (n <= 8 removable tokens) the
 *    mean of 400 seeded orderings at every fraction lies within 4 standard
 *    errors of its expected value, the mean of F over every k-subset
 *    (enumerated here; the standard error from their variance);
 *  - unit heads (test_heads): the curve ends against F with every head
 *    masked, D at k = 1 against the top-scored head (scores computed here),
 *    the random ordering against the exact mean over k-subsets of heads;
 *  - refusals: an unknown method, a fraction outside [0, 1] (lensd job run:
 *    its message names the field), fewer rows than shards (names texts), a token method with
 *    unit heads, logit-attribution on a classifier or with unit tokens
 *    (names methods), an unknown unit.
 * Shards (1, 3, 7 processes, the result identical) are in test_shard.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/faithfulness.h"
#include "core/analysis/logit_attribution.h"
#include "core/io/tokenizer.h"
#include "tests/check.h"

static const double FRACTIONS[] = {0, 0.1, 0.25, 0.5, 0.75, 1};
#define NF 6

/* the probability of target (at the last row on a causal LM), the heads keep ([L][NH]) zeroes masked (NULL: none) */
static double objective_masked(const lens_model *m, const int *ids, int T, int target, const unsigned char *keep)
{
    const int lm = m->cfg.task == LENS_TASK_CAUSAL_LM, K = lm ? m->cfg.vocab_size : m->cfg.n_labels;
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    const lens_forward_opts fo = {.keep = LENS_KEEP_LOGITS, .head_mask = keep};
    lens_activations act;
    lens_err err = {0};
    if (lens_forward(m, &b, &fo, &act, &err)) return NAN;
    const float *z = lens_act_logits(m, &act, 0) + (lm ? (size_t)(T - 1) * K : 0);
    double mx = z[0], sum = 0;
    for (int k = 1; k < K; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < K; k++) sum += exp(z[k] - mx);
    const double p = exp(z[target] - mx) / sum;
    lens_activations_free(&act);
    return p;
}

static double objective(const lens_model *m, const int *ids, int T, int target)
{
    return objective_masked(m, ids, T, target, NULL);
}

static int tokenize(const lens_model *m, const char *text, int *ids, int max)
{
    lens_token *toks = NULL;
    int n = 0;
    lens_err err = {0};
    if (lens_tokenize(m->tok, text, strlen(text), NULL, 0, &toks, &n, &err)) return -1;
    n = n > max ? max : n;
    for (int t = 0; t < n; t++) ids[t] = toks[t].id;
    free(toks);
    return n;
}

/* ids with the removable tokens of mask (bit i: the i-th removable) kept only (keep 1) or dropped (keep 0) */
static int subset(const int *ids, int T, unsigned mask, int keep, const unsigned char *removable, int *out)
{
    int k = 0;
    for (int t = 0, i = 0; t < T; t++) {
        int in = 0;
        if (removable[t]) in = (mask >> i++) & 1;
        if (!removable[t] || in == keep) out[k++] = ids[t];
    }
    return k;
}

static void removable_of(const lens_model *m, const int *ids, int T, int lm, unsigned char *removable, int *pos, int *n)
{
    *n = 0;
    for (int t = 0; t < T; t++) {
        removable[t] = !lens_tokenizer_is_special(m->tok, ids[t]) && !(lm && t == T - 1);
        if (removable[t]) pos[(*n)++] = t;
    }
}

static void test_ends(const lens_model *m, const char *name, const int *ids, int T)
{
    const int lm = m->cfg.task == LENS_TASK_CAUSAL_LM;
    unsigned char removable[128];
    int pos[128], n, kept[128];
    removable_of(m, ids, T, lm, removable, pos, &n);
    const lens_faith_opts o = {.fractions = FRACTIONS, .n_fractions = NF, .target = -1, .seed = 7};
    for (int k = 0; k < LENS_FAITH_COUNT; k++) {
        lens_faith_row r;
        lens_err err = {0};
        if (lens_faith_undefined(m, (lens_faith_method)k, LENS_FAITH_TOKENS)) continue;
        if (lens_faith_run(m, ids, NULL, T, (lens_faith_method)k, &o, &r, &err)) {
            CHECK(0, "%s %s: %s", name, lens_faith_method_name((lens_faith_method)k), err.msg);
            continue;
        }
        const double full = objective(m, ids, T, r.target);
        const int T0 = subset(ids, T, 0, 1, removable, kept);
        const double empty = objective(m, kept, T0, r.target);
        /* the same forward on the same tokens: a batch of one or of many gives float32 sums in another order */
        const double tol = 1e-5;
        CHECK(n == r.n_removable && fabs(r.full - full) < tol && fabs(r.empty - empty) < tol &&
                  fabs(r.deletion[0] - full) < tol && fabs(r.insertion[NF - 1] - full) < tol &&
                  fabs(r.deletion[NF - 1] - empty) < tol && fabs(r.insertion[0] - empty) < tol,
              "%s %s: n %d (want %d), full %.7f (%.7f), empty %.7f (%.7f), D(0) %.7f, I(1) %.7f, D(1) %.7f, I(0) %.7f",
              name, lens_faith_method_name((lens_faith_method)k), r.n_removable, n, r.full, full, r.empty, empty,
              r.deletion[0], r.insertion[NF - 1], r.deletion[NF - 1], r.insertion[0]);
        if (k == LENS_FAITH_LEAVE_ONE_OUT) { /* D(k = 1) = min_j F(x \ {j}) */
            const double one[] = {1e-6};
            const lens_faith_opts o1 = {.fractions = one, .n_fractions = 1, .target = r.target};
            lens_faith_row r1;
            double best = INFINITY;
            for (int i = 0; i < n; i++) {
                const int Ti = subset(ids, T, 1u << i, 0, removable, kept);
                const double f = objective(m, kept, Ti, r.target);
                best = f < best ? f : best;
            }
            CHECK(!lens_faith_run(m, ids, NULL, T, LENS_FAITH_LEAVE_ONE_OUT, &o1, &r1, &err) &&
                      fabs(r1.deletion[0] - best) < tol,
                  "%s leave-one-out: D(k=1) %.7f, min_j F(x \\ j) %.7f", name, r1.deletion[0], best);
            if (!err.code) lens_faith_row_free(&r1);
        }
        lens_faith_row_free(&r);
    }
}

/* The random ordering's curves against the exact mean over k-subsets. */
static void test_random(const lens_model *m, const char *text)
{
    int ids[64], kept[64], pos[64], n;
    unsigned char removable[64];
    const int T = tokenize(m, text, ids, 64);
    removable_of(m, ids, T, 0, removable, pos, &n);
    if (n > 8 || n < 3) return;
    const int R = 400;
    const lens_faith_opts o = {.fractions = FRACTIONS, .n_fractions = NF, .target = -1, .seed = 11,
                               .random_orderings = R, .row = 3};
    lens_faith_row r;
    lens_err err = {0};
    if (lens_faith_run(m, ids, NULL, T, LENS_FAITH_RANDOM, &o, &r, &err)) {
        CHECK(0, "random on \"%s\": %s", text, err.msg);
        return;
    }
    for (int q = 0; q < NF; q++) {
        const int k = lens_faith_count(FRACTIONS[q], n);
        for (int keep = 0; keep < 2; keep++) {
            double sum = 0, sum2 = 0;
            int count = 0;
            for (unsigned mask = 0; mask < 1u << n; mask++) {
                if (__builtin_popcount(mask) != k) continue;
                const double f = objective(m, kept, subset(ids, T, mask, keep, removable, kept), r.target);
                sum += f, sum2 += f * f, count++;
            }
            const double mean = sum / count, var = fmax(0, sum2 / count - mean * mean);
            const double got = keep ? r.insertion[q] : r.deletion[q], bound = 4 * sqrt(var / R) + 1e-6;
            CHECK(fabs(got - mean) <= bound, "random %s at f = %.2f (k = %d of %d) on \"%s\": %.6f, expected %.6f +- %.6f",
                  keep ? "insertion" : "deletion", FRACTIONS[q], k, n, text, got, mean, bound);
        }
    }
    lens_faith_row_free(&r);
}

/* keep [H] from the bits of mask (bit i set: head i masked), inverted when keep_set */
static void head_keep(unsigned mask, int H, int keep_set, unsigned char *keep)
{
    for (int i = 0; i < H; i++) keep[i] = (unsigned char)(((mask >> i) & 1) == (unsigned)keep_set);
}

/* unit heads: every head-ranking method's curve ends (D(0) = I(1) = F(x),
 * D(1) = I(0) = F with every head masked, computed here), D at k = 1 = F
 * with the top-scored head masked (the score computed here: attention
 * attribution's max_ij Attr, |direct logit attribution|), and the random
 * ordering's mean of 400 orderings against the exact mean over k-subsets
 * of heads (within 4 standard errors). */
static void test_heads(const lens_model *m, const char *name, const int *ids, int T)
{
    const int L = m->cfg.n_layers, NH = m->cfg.n_heads, H = L * NH;
    unsigned char keep[64];
    const double tol = 1e-5;
    if (H > 12) {
        CHECK(0, "%s: %d heads, too many to enumerate", name, H);
        return;
    }
    int ran = 0;
    for (int k = 0; k < LENS_FAITH_COUNT; k++) {
        const lens_faith_method method = (lens_faith_method)k;
        if (lens_faith_undefined(m, method, LENS_FAITH_HEADS)) continue;
        const int R = method == LENS_FAITH_RANDOM ? 400 : 1;
        const lens_faith_opts o = {.fractions = FRACTIONS, .n_fractions = NF, .unit = LENS_FAITH_HEADS, .target = -1,
                                   .seed = 5, .random_orderings = R};
        lens_faith_row r;
        lens_err err = {0};
        if (lens_faith_run(m, ids, NULL, T, method, &o, &r, &err)) {
            CHECK(0, "%s heads %s: %s", name, lens_faith_method_name(method), err.msg);
            continue;
        }
        ran++;
        const double full = objective(m, ids, T, r.target);
        memset(keep, 0, sizeof keep);
        const double none = objective_masked(m, ids, T, r.target, keep);
        CHECK(r.n_removable == H && fabs(r.full - full) < tol && fabs(r.empty - none) < tol &&
                  fabs(r.deletion[0] - full) < tol && fabs(r.insertion[NF - 1] - full) < tol &&
                  fabs(r.deletion[NF - 1] - none) < tol && fabs(r.insertion[0] - none) < tol,
              "%s heads %s: n %d (want %d), full %.7f (%.7f), every head masked %.7f (%.7f), D(0) %.7f, I(1) %.7f, "
              "D(1) %.7f, I(0) %.7f", name, lens_faith_method_name(method), r.n_removable, H, r.full, full, r.empty,
              none, r.deletion[0], r.insertion[NF - 1], r.deletion[NF - 1], r.insertion[0]);
        if (method == LENS_FAITH_RANDOM) {
            for (int q = 0; q < NF; q++)
                for (int keep_set = 0; keep_set < 2; keep_set++) {
                    const int kq = lens_faith_count(FRACTIONS[q], H);
                    double sum = 0, sum2 = 0;
                    int count = 0;
                    for (unsigned mask = 0; mask < 1u << H; mask++) {
                        if (__builtin_popcount(mask) != kq) continue;
                        head_keep(mask, H, keep_set, keep);
                        const double f = objective_masked(m, ids, T, r.target, keep);
                        sum += f, sum2 += f * f, count++;
                    }
                    const double mean = sum / count, var = fmax(0, sum2 / count - mean * mean);
                    const double got = keep_set ? r.insertion[q] : r.deletion[q], bound = 4 * sqrt(var / R) + 1e-6;
                    CHECK(fabs(got - mean) <= bound,
                          "%s heads random %s at f = %.2f (k = %d of %d): %.6f, expected %.6f +- %.6f",
                          name, keep_set ? "insertion" : "deletion", FRACTIONS[q], kq, H, got, mean, bound);
                }
        } else { /* D(k = 1): the top-scored head masked */
            double score[64];
            if (method == LENS_FAITH_ATTRIBUTION) {
                const lens_attr_opts ao = {.steps = 20, .target = r.target};
                lens_attribution a;
                CHECK(!lens_attribution_run(m, ids, NULL, T, &ao, &a, &err), "%s attribution: %s", name, err.msg);
                for (int i = 0; i < H && !err.code; i++) score[i] = a.layers[i / NH].importance[i % NH];
                if (!err.code) lens_attribution_free(&a);
            } else {
                const lens_dla_opts dopt = {.position = T - 1, .target = r.target, .foil = -1};
                lens_dla_result d;
                CHECK(!lens_logit_attribution(m, ids, T, &dopt, &d, &err), "%s logit attribution: %s", name, err.msg);
                for (int i = 0; i < H && !err.code; i++) score[i] = fabs(d.heads[i]);
                if (!err.code) lens_dla_result_free(&d);
            }
            int top = 0;
            for (int i = 1; i < H; i++) top = score[i] > score[top] ? i : top;
            head_keep(1u << top, H, 0, keep);
            const double want = objective_masked(m, ids, T, r.target, keep);
            const double one[] = {1e-6};
            const lens_faith_opts o1 = {.fractions = one, .n_fractions = 1, .unit = LENS_FAITH_HEADS,
                                        .target = r.target};
            lens_faith_row r1;
            CHECK(!lens_faith_run(m, ids, NULL, T, method, &o1, &r1, &err) && fabs(r1.deletion[0] - want) < tol,
                  "%s heads %s: D(k=1) %.7f, F with head %d masked %.7f", name, lens_faith_method_name(method),
                  err.code ? NAN : r1.deletion[0], top, want);
            if (!err.code) lens_faith_row_free(&r1);
        }
        lens_faith_row_free(&r);
    }
    const int lm = m->cfg.task == LENS_TASK_CAUSAL_LM;
    CHECK(ran == 2 + lm, "%s: %d head-ranking methods ran (random, attention-attribution%s)", name, ran,
          lm ? ", logit-attribution" : "");
    /* the token methods do not rank heads, and logit-attribution no tokens */
    CHECK(lens_faith_undefined(m, LENS_FAITH_ROLLOUT, LENS_FAITH_HEADS) &&
              lens_faith_undefined(m, LENS_FAITH_LOGIT_ATTRIBUTION, LENS_FAITH_TOKENS) &&
              (lm || lens_faith_undefined(m, LENS_FAITH_LOGIT_ATTRIBUTION, LENS_FAITH_HEADS)),
          "%s: methods undefined for a unit", name);
}

static void test_refusals(void)
{
    static const struct {
        const char *params, *field;
    } cases[] = {
        {"{\"texts\": [\"a fine film\", \"a dull one\"], \"methods\": [\"random\", \"saliency\"]}", "methods"},
        {"{\"texts\": [\"a fine film\", \"a dull one\"], \"fractions\": [0, 1.5]}", "fractions"},
        {"{\"texts\": [\"a fine film\", \"a dull one\", \"fine\"], \"methods\": [\"random\"], \"shards\": 4}", "texts"},
        {"{\"texts\": [\"a fine film\"], \"unit\": \"heads\", \"methods\": [\"random\", \"rollout\"]}", "methods"},
        {"{\"texts\": [\"a fine film\"], \"unit\": \"heads\", \"methods\": [\"logit-attribution\"]}", "methods"},
        {"{\"texts\": [\"a fine film\"], \"methods\": [\"logit-attribution\"]}", "methods"},
        {"{\"texts\": [\"a fine film\"], \"unit\": \"layers\"}", "unit"},
    };
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++, ran++) {
        char path[] = "/tmp/lensd-faith-XXXXXX", cmd[1024], out[1024] = "";
        const int fd = mkstemp(path);
        FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
        if (!f) {
            CHECK(0, "temp file");
            continue;
        }
        const char *shards = strstr(cases[i].params, "\"shards\"") ? "0/4" : "0/1";
        char params[512];
        snprintf(params, sizeof params, "%s", cases[i].params);
        char *s = strstr(params, ", \"shards\": 4");
        if (s) strcpy(s, "}");
        fputs(params, f);
        fclose(f);
        const char *build = getenv("BUILD");
        snprintf(cmd, sizeof cmd, "%s/lensd job run --model models/demo-sst2 --kind faithfulness --params %s --shard %s --out %s.lpart 2>&1",
                 build && *build ? build : "build", path, shards, path);
        FILE *p = popen(cmd, "r");
        size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[got] = 0;
        const int rc = p ? pclose(p) : -1;
        CHECK(rc != 0 && strstr(out, cases[i].field), "%s: refused naming %s: %s", params, cases[i].field, out);
        remove(path);
        snprintf(cmd, sizeof cmd, "%s.lpart", path);
        remove(cmd);
    }
    CHECK(ran == 7, "refusal cases run: %d", ran);
}

int main(void)
{
    lens_err err = {0};
    lens_model *sst2 = lens_model_load("models/demo-sst2", &err);
    CHECK(sst2 != NULL, "models/demo-sst2: %s", err.msg);
    const char *shared = check_shared_dir();
    int rows = 0, short_rows = 0;
    if (sst2 && shared) {
        char path[600], line[4096];
        snprintf(path, sizeof path, "%s/data/sst2/dev.tsv", shared);
        FILE *f = fopen(path, "r");
        CHECK(f != NULL, "%s", path);
        while (f && fgets(line, sizeof line, f) && (rows < 3 || short_rows < 2)) {
            char *tab = strchr(line, '\t');
            if (!tab || !strncmp(line, "sentence\t", 9)) continue;
            *tab = 0;
            int ids[128];
            const int T = tokenize(sst2, line, ids, 128);
            if (T < 3) continue;
            if (rows < 3) {
                test_ends(sst2, "demo-sst2", ids, T);
                if (!rows) test_heads(sst2, "demo-sst2", ids, T);
                rows++;
            }
            if (T <= 10 && short_rows < 2) {
                test_random(sst2, line);
                short_rows++;
            }
        }
        if (f) fclose(f);
        CHECK(rows == 3 && short_rows == 2, "dev rows checked: %d, short rows: %d", rows, short_rows);
    } else if (!shared) {
        SKIP("no ../shared: the SST-2 dev rows are not checked");
    }
    lens_model_free(sst2);
    lens_model *gpt2 = lens_model_load("models/demo-gpt2", &err);
    CHECK(gpt2 != NULL, "models/demo-gpt2: %s", err.msg);
    if (gpt2) {
        int ids[64];
        const int T = tokenize(gpt2, "The quick brown fox jumps over the lazy", ids, 64);
        CHECK(T > 4, "gpt2 tokens: %d", T);
        if (T > 4) test_ends(gpt2, "demo-gpt2", ids, T);
        if (T > 4) test_heads(gpt2, "demo-gpt2", ids, T);
    }
    lens_model_free(gpt2);
    test_refusals();
    return check_done("test_faithfulness");
}
