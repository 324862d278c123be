/* test_head_importance.c - head masks in the forward pass, head importance,
 * the pruning curve (core/analysis/head_importance.h) and adversarial triggers
 * (core/analysis/triggers.h).
 *
 * Models: a random tiny BERT classifier from lens_mkmodel (always), and
 * bert-tiny-sst2 on the first 40 rows of SST-2 dev (SKIP without ../shared).
 *
 * Checks and tolerances:
 *  - an all-ones mask gives the unmasked logits bit for bit (same code path);
 *  - masking head h of layer l equals lens_attr_eval with that head's
 *    probabilities zeroed (an independent path through the layers above):
 *    class probabilities within 1e-5 (float32, different summation order);
 *  - pruning 0% of heads = the unmasked accuracy exactly, for all three
 *    orders; pruning 100% gives one prediction for every example (with no
 *    attention the [CLS] row sees only its own embedding) and all orders
 *    agree there;
 *  - the random curve is a mean over 3 seeds and identical across runs with
 *    the same seed; shuffles are permutations, reproducible per seed;
 *  - attribution importance = the mean over examples of lens_attribution_run's
 *    per-head importance to 1e-6 (same computation, float mean);
 *  - trigger insertion puts the pair at the stated relative positions and
 *    keeps [CLS] / [SEP]; accuracy before the attack equals
 *    lens_head_accuracy on the victims. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/attribution.h"
#include "core/analysis/head_importance.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "core/analysis/triggers.h"
#include "tests/check.h"

#define N_EX 12

static void logits_probs(const float *z, int K, double *p)
{
    double mx = z[0], s = 0;
    for (int k = 1; k < K; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < K; k++) s += p[k] = exp(z[k] - mx);
    for (int k = 0; k < K; k++) p[k] /= s;
}

static void test_mask_forward(const lens_model *m, const lens_example *e)
{
    const int L = m->cfg.n_layers, NH = m->cfg.n_heads, K = m->cfg.n_labels, T = e->T;
    lens_batch b = {.n_seqs = 1, .lengths = &e->T, .ids = e->ids};
    unsigned char ones[64];
    memset(ones, 1, sizeof ones);
    lens_forward_opts plain = {.keep = LENS_KEEP_LOGITS | LENS_KEEP_ATTN}, masked = plain;
    masked.head_mask = ones;
    lens_activations a, bm;
    lens_err err = {0};
    CHECK(!lens_forward(m, &b, &plain, &a, &err) && !lens_forward(m, &b, &masked, &bm, &err), "forward: %s", err.msg);
    CHECK(!memcmp(a.logits, bm.logits, sizeof(float) * K), "all-ones head mask changes the logits");
    lens_activations_free(&bm);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < NH; h++) {
            unsigned char mask[64];
            memset(mask, 1, sizeof mask);
            mask[l * NH + h] = 0;
            masked.head_mask = mask;
            CHECK(!lens_forward(m, &b, &masked, &bm, &err), "masked forward: %s", err.msg);
            const float *A = lens_act_attn(m, &bm, l + 1, h, 0);
            double zsum = 0;
            for (int i = 0; i < T * T; i++) zsum += fabs(A[i]);
            CHECK(zsum == 0, "pruned head %d.%d keeps attention probabilities", l + 1, h);
            /* the same ablation through lens_attr_eval: layer l's probabilities with head h zeroed */
            float *P = malloc(sizeof(float) * NH * T * T);
            for (int g = 0; g < NH; g++) memcpy(P + (size_t)g * T * T, lens_act_attn(m, &a, l + 1, g, 0), sizeof(float) * T * T);
            memset(P + (size_t)h * T * T, 0, sizeof(float) * T * T);
            double p[8], F;
            logits_probs(bm.logits, K, p);
            for (int k = 0; k < K; k++) {
                CHECK(!lens_attr_eval(m, e->ids, NULL, T, l + 1, P, k, &F, &err), "attr_eval: %s", err.msg);
                CHECK(fabs(F - p[k]) < 1e-5, "head %d.%d masked: p[%d] %.7f, lens_attr_eval %.7f", l + 1, h, k, p[k], F);
            }
            free(P);
            lens_activations_free(&bm);
        }
    lens_activations_free(&a);
}

static void test_curve(const lens_model *m, const lens_example *ex, int n, const char *what)
{
    const int H = m->cfg.n_layers * m->cfg.n_heads;
    lens_err err = {0};
    double base;
    int pred[256];
    CHECK(!lens_head_accuracy(m, ex, n, NULL, NULL, NULL, pred, &base, &err), "accuracy: %s", err.msg);
    lens_head_opts o = {.steps = 8, .seed = 7};
    lens_head_importance hi, again;
    int rc = lens_head_importance_run(m, ex, n, &o, &hi, &err);
    CHECK(rc == 0, "%s: head importance: %s", what, err.msg);
    if (rc) return;
    CHECK(!lens_head_importance_run(m, ex, n, &o, &again, &err), "second run: %s", err.msg);
    printf("  %s: %d examples, baseline accuracy %.3f\n  pruned  attr   attn   random\n", what, n, base);
    for (int p = 0; p < LENS_PRUNE_POINTS; p++)
        printf("  %3.0f%% %2d %.3f  %.3f  %.3f\n", 100 * hi.fraction[p], hi.n_pruned[p], hi.acc_attr[p],
               hi.acc_attn[p], hi.acc_random[p]);
    CHECK(hi.n_pruned[0] == 0 && hi.n_pruned[LENS_PRUNE_POINTS - 1] == H, "%s: 0..%d heads pruned", what, H);
    CHECK(hi.acc_attr[0] == base && hi.acc_attn[0] == base && hi.acc_random[0] == base,
          "%s: 0%% pruned: %.4f %.4f %.4f, want the baseline %.4f", what, hi.acc_attr[0], hi.acc_attn[0],
          hi.acc_random[0], base);
    const int last = LENS_PRUNE_POINTS - 1;
    CHECK(hi.acc_attr[last] == hi.acc_attn[last] && hi.acc_attr[last] == hi.acc_random[last],
          "%s: 100%% pruned differs between orders", what);
    CHECK(hi.n_seeds == 3, "%s: 3 seeds by default", what);
    CHECK(!memcmp(hi.acc_random, again.acc_random, sizeof hi.acc_random) &&
              !memcmp(hi.attr_importance, again.attr_importance, sizeof(float) * H),
          "%s: the same seed gives the same curve", what);
    /* mean over seeds 7, 8, 9 by hand at one point */
    const int pt = 5, k = hi.n_pruned[pt];
    unsigned char mask[256];
    int order[256];
    double sum = 0, acc;
    for (int s = 0; s < 3; s++) {
        lens_head_shuffle(7 + s, H, order);
        memset(mask, 1, H);
        for (int i = 0; i < k; i++) mask[order[i]] = 0;
        lens_head_accuracy(m, ex, n, mask, NULL, NULL, NULL, &acc, &err);
        sum += acc;
    }
    CHECK(fabs(sum / 3 - hi.acc_random[pt]) < 1e-12, "%s: random at %d pruned %.6f, by hand %.6f", what, k,
          hi.acc_random[pt], sum / 3);
    /* everything pruned: one prediction */
    memset(mask, 0, H);
    CHECK(!lens_head_accuracy(m, ex, n, mask, NULL, NULL, pred, &acc, &err), "all pruned: %s", err.msg);
    int constant = 1;
    for (int i = 1; i < n; i++) constant &= pred[i] == pred[0];
    CHECK(constant && fabs(acc - hi.acc_attr[last]) < 1e-12, "%s: 100%% pruned is not one constant prediction", what);
    /* attribution importance = mean of the per-example importances */
    double *mean = calloc((size_t)H, sizeof(double));
    for (int e = 0; e < n; e++) {
        lens_attr_opts ao = {.steps = 8, .target = -1};
        lens_attribution a;
        CHECK(!lens_attribution_run(m, ex[e].ids, NULL, ex[e].T, &ao, &a, &err), "attribution: %s", err.msg);
        for (int l = 0; l < a.n_layers; l++)
            for (int h = 0; h < a.n_heads; h++) mean[l * a.n_heads + h] += a.layers[l].importance[h] / n;
        lens_attribution_free(&a);
    }
    double worst = 0;
    for (int i = 0; i < H; i++) worst = fmax(worst, fabs(mean[i] - hi.attr_importance[i]));
    CHECK(worst < 1e-6, "%s: importance differs from the mean of lens_attribution_run by %g", what, worst);
    free(mean);
    /* cancel */
    volatile int stop = 1;
    o.cancel = &stop;
    lens_head_importance c;
    CHECK(lens_head_importance_run(m, ex, n, &o, &c, &err) == -1 && err.code == LENS_ECANCEL, "cancel stops the run");
    lens_head_importance_free(&hi);
    lens_head_importance_free(&again);
}

static void test_shuffle(void)
{
    int a[24], b[24], seen[24] = {0};
    lens_head_shuffle(3, 24, a);
    lens_head_shuffle(3, 24, b);
    for (int i = 0; i < 24; i++) seen[a[i]]++;
    int perm = 1;
    for (int i = 0; i < 24; i++) perm &= seen[i] == 1;
    CHECK(perm && !memcmp(a, b, sizeof a), "lens_head_shuffle: a reproducible permutation");
    lens_head_shuffle(4, 24, b);
    CHECK(memcmp(a, b, sizeof a) != 0, "seeds 3 and 4 give different orders");
    float imp[5] = {0.3f, 0.1f, 0.3f, -1, 0.2f};
    int order[5], want[5] = {3, 1, 4, 0, 2};
    lens_head_order(imp, 5, order);
    CHECK(!memcmp(order, want, sizeof want), "lens_head_order: ascending, ties by index");
}

static void test_insert(void)
{
    /* [CLS] c1..c8 [SEP]; the trigger at relative 0.25 and 0.75 */
    int ids[10] = {101, 1, 2, 3, 4, 5, 6, 7, 8, 102}, out[12];
    lens_trigger t = {.found = 1, .token_a = 900, .token_b = 901, .pos_a = 0.25, .pos_b = 0.75};
    lens_trigger_insert(&t, ids, 10, out);
    int want[12] = {101, 1, 2, 900, 3, 4, 5, 6, 901, 7, 8, 102};
    CHECK(!memcmp(out, want, sizeof want), "trigger insertion at 2/8 and 7/9 of the content");
    t.pos_a = 1, t.pos_b = 1;
    lens_trigger_insert(&t, ids, 10, out);
    CHECK(out[9] == 900 && out[10] == 901 && out[11] == 102, "trigger at the end stays before [SEP]");
}

static void test_triggers(const lens_model *m, const lens_example *ex, int n)
{
    lens_err err = {0};
    lens_trigger_opts o = {.steps = 8};
    lens_trigger_result r;
    const int ns = n / 2;
    int rc = lens_triggers_run(m, ex, ns, ex + ns, n - ns, &o, &r, &err);
    CHECK(rc == 0, "triggers: %s", err.msg);
    if (rc) return;
    double acc;
    int pred[256];
    lens_head_accuracy(m, ex + ns, n - ns, NULL, NULL, NULL, pred, &acc, &err);
    CHECK(fabs(acc - r.total_before) < 1e-12, "accuracy before the attack %.4f, lens_head_accuracy %.4f",
          r.total_before, acc);
    int found = 0, victims = 0;
    for (int k = 0; k < r.n_labels; k++) found += r.triggers[k].found, victims += r.n_victims[k];
    CHECK(found >= 1 && victims == n - ns, "triggers found %d, victims %d", found, victims);
    for (int k = 0; k < r.n_labels; k++)
        printf("  class %d: trigger %s (%d, %d) at %.2f %.2f count %d; victims %d: %.3f -> %.3f\n", k,
               r.triggers[k].found ? "" : "none", r.triggers[k].token_a, r.triggers[k].token_b, r.triggers[k].pos_a,
               r.triggers[k].pos_b, r.triggers[k].count, r.n_victims[k], r.acc_before[k], r.acc_after[k]);
    lens_trigger_result_free(&r);
}

/* first n rows of an SST-2 TSV (header "sentence\tlabel"), tokenized */
static int load_sst2(const lens_model *m, const char *path, int n, lens_example *ex)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int got = 0;
    if (!fgets(line, sizeof line, f)) n = 0;
    while (got < n && fgets(line, sizeof line, f)) {
        char *tab = strrchr(line, '\t');
        if (!tab) continue;
        *tab = 0;
        lens_token *toks;
        int T;
        lens_err err = {0};
        if (lens_tokenize(m->tok, line, strlen(line), NULL, 0, &toks, &T, &err)) continue;
        int *ids = malloc(sizeof(int) * T);
        for (int t = 0; t < T; t++) ids[t] = toks[t].id;
        free(toks);
        ex[got++] = (lens_example){.ids = ids, .T = T, .label = atoi(tab + 1)};
    }
    fclose(f);
    return got;
}

int main(void)
{
    char dir[] = "/tmp/lensd-headimp-XXXXXX", path[512];
    lens_err err = {0};
    test_shuffle();
    test_insert();
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return check_done("test_head_importance");
    }
    snprintf(path, sizeof path, "%s/bert", dir);
    CHECK(!lens_mkmodel("bert", "tiny", NULL, 5, path, &err), "mkmodel: %s", err.msg);
    lens_model *m = lens_model_load(path, &err);
    CHECK(m != NULL, "load: %s", err.msg);
    if (m) {
        lens_example ex[N_EX];
        int store[N_EX][16];
        unsigned s = 12345;
        for (int e = 0; e < N_EX; e++) {
            const int T = 5 + e % 7;
            store[e][0] = 2, store[e][T - 1] = 3;
            for (int t = 1; t < T - 1; t++) s = s * 1103515245u + 12345u, store[e][t] = 5 + (int)(s >> 16) % 200;
            ex[e] = (lens_example){.ids = store[e], .T = T, .label = e % 2};
        }
        test_mask_forward(m, &ex[3]);
        test_curve(m, ex, N_EX, "random tiny BERT");
        test_triggers(m, ex, N_EX);
        lens_model_free(m);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);

    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared not found: pruning curve on bert-tiny-sst2");
        return check_done("test_head_importance");
    }
    snprintf(path, sizeof path, "%s/models/bert-tiny-sst2", shared);
    m = lens_model_load(path, &err);
    CHECK(m != NULL, "load bert-tiny-sst2: %s", err.msg);
    if (!m) return check_done("test_head_importance");
    lens_example ex[40];
    snprintf(path, sizeof path, "%s/data/sst2/dev.tsv", shared);
    int n = load_sst2(m, path, 40, ex);
    CHECK(n == 40, "40 rows of %s (got %d)", path, n);
    if (n > 0) {
        double acc;
        lens_head_accuracy(m, ex, n, NULL, NULL, NULL, NULL, &acc, &err);
        CHECK(acc > 0.7, "bert-tiny-sst2 on 40 dev rows: accuracy %.3f, want > 0.7", acc);
        test_curve(m, ex, n, "bert-tiny-sst2, SST-2 dev[0:40]");
        test_triggers(m, ex, n);
    }
    for (int i = 0; i < n; i++) free((void *)ex[i].ids);
    lens_model_free(m);
    return check_done("test_head_importance");
}
