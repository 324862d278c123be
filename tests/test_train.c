/* test_train.c - training (core/train/train.c, `lensd train`).
 *
 * On lens_mkmodel's tiny BERT (L2 H128, 2 heads): the weight gradient of the
 * whole model against central finite differences, one probe per tensor (its
 * largest gradient entry); loss falls when 16 examples are overfit; a saved
 * checkpoint reloads with lens_model_load and lens_forward gives the same
 * logits; the identifiable variant (DK != DV) trains, saves and reloads.
 * GPT-2 likewise; then every family and task (check_families) and a Llama
 * and a RoBERTa trained from random weights on ../shared data
 * (check_from_random). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "family_cases.h"
#include "core/model/arch.h"
#include "core/model/model.h"
#include "core/model/mkmodel.h"
#include "core/io/safetensors.h"
#include "core/io/tokenizer.h"
#include "core/train/train.h"

static char tmp_root[] = "/tmp/lens_test_train_XXXXXX";

/* Two sequences of 5 and 7 ids, second with segment ids of a pair. */
static const int fd_lengths[2] = {5, 7};
static const int fd_ids[12] = {101, 2000, 2054, 2003, 102, 101, 7592, 2088, 102, 2129, 2024, 102};
static const int fd_types[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1};
static const int fd_labels[2] = {1, 0};

/* masked-LM targets of the same batch: 3 predicted positions */
static const int fd_targets[12] = {-1, 2000, -1, -1, -1, -1, -1, 2088, -1, 2129, -1, -1};

/* A batch and what its loss reads: the labels (classifier) or the
 * masked-LM targets. */
typedef struct {
    lens_batch b;
    const int *labels, *targets;
} probe_batch;

/* Classification loss of the labels, or masked-LM loss of the targets (fd_targets when NULL). */
static double batch_loss_of(lens_trainer *t, const lens_batch *b, const int *labels, const int *targets, int backward)
{
    float loss = 0;
    lens_err err;
    const lens_task task = lens_trainer_config(t)->task;
    int rc = task == LENS_TASK_MASKED_LM  ? lens_trainer_mlm_batch(t, b, targets, backward, &loss, NULL, &err)
             : task == LENS_TASK_CAUSAL_LM ? lens_trainer_causal_batch(t, b, backward, &loss, NULL, NULL, &err)
                                           : lens_trainer_batch(t, b, labels, backward, &loss, NULL, &err);
    if (rc) fprintf(stderr, "batch: %s\n", err.msg);
    return loss;
}

static double batch_loss(lens_trainer *t, const lens_batch *b, const int *labels, int backward)
{
    return batch_loss_of(t, b, labels, fd_targets, backward);
}

/* The copies of tiled entry j of a summed-heads output weight (row o of
 * [C][NH*DV]): written out per variant here rather than taken from model.h,
 * so the test states the layout. SUM: o_sum = sum_h o_h, so column h*DV+d
 * repeats compact column d; SUM_ADJACENT (declare-lab's reshape): output
 * feature i sums concat features i*NH .. i*NH+NH-1, so column m repeats
 * compact column m / NH. Returns the number of copies written to idx. */
static int summed_copies(const lens_config *c, size_t row_off, size_t j, size_t *idx)
{
    const int NH = c->n_heads, DV = c->d_head_v, VO = NH * DV;
    const int m0 = (int)(j - row_off) % VO;
    const size_t row = (j - row_off) / VO;
    const int src = c->head_combination == LENS_HEADS_SUM ? m0 % DV : m0 / NH;
    int n = 0;
    for (int m = 0; m < VO; m++)
        if ((c->head_combination == LENS_HEADS_SUM ? m % DV : m / NH) == src) idx[n++] = row_off + row * VO + m;
    return n;
}

/* Central differences with step h = 1e-2 on float32: the loss is computed in
 * double from float logits, so the difference quotient is good to ~1e-5
 * absolute; curvature over +-h adds a few percent. Tolerance: 5e-4 + 5%.
 * A summed-heads output weight is probed as the model's parameter: all NH
 * copies of the entry move together, and the trainer's gradient (equal in
 * every copy) must be the derivative w.r.t. that one parameter. */
static void check_gradient_on(lens_trainer *t, const char *what, const probe_batch *pb, int min_tensors)
{
    const lens_batch b = pb->b;
    lens_trainer_zero_grad(t);
    batch_loss_of(t, &b, pb->labels, pb->targets, 1);
    float *param = lens_trainer_params(t, NULL), *grad = lens_trainer_grads(t, NULL);
    const lens_config *c = lens_trainer_config(t);
    int bad = 0, probed = 0;
    double max_abs = 0, max_rel = 0;
    const char *name;
    size_t off, count, copies[4096];
    for (int i = 0; !lens_trainer_tensor(t, i, &name, &off, &count); i++) {
        size_t best = off;
        for (size_t j = off; j < off + count; j++)
            if (fabsf(grad[j]) > fabsf(grad[best])) best = j;
        const size_t len = strlen(name), suffix = strlen("attention.output.dense.weight");
        const int summed = c->head_combination && len > suffix && !strcmp(name + len - suffix, "attention.output.dense.weight");
        int n_copies = 1;
        copies[0] = best;
        if (summed) n_copies = summed_copies(c, off, best, copies);
        for (int k = 1; k < n_copies; k++)
            if (grad[copies[k]] != grad[best] || param[copies[k]] != param[best]) {
                bad++;
                fprintf(stderr, "FAIL %s: %s: copies of one entry differ\n", what, name);
                break;
            }
        const float keep = param[best], h = 1e-2f;
        for (int k = 0; k < n_copies; k++) param[copies[k]] = keep + h;
        const double up = batch_loss_of(t, &b, pb->labels, pb->targets, 0);
        for (int k = 0; k < n_copies; k++) param[copies[k]] = keep - h;
        const double down = batch_loss_of(t, &b, pb->labels, pb->targets, 0);
        for (int k = 0; k < n_copies; k++) param[copies[k]] = keep;
        const double fd = (up - down) / (2 * h), an = grad[best];
        probed++;
        if (fabs(fd - an) > max_abs) max_abs = fabs(fd - an);
        if (fabs(fd - an) / (fabs(fd) + 1e-3) > max_rel) max_rel = fabs(fd - an) / (fabs(fd) + 1e-3);
        if (fabs(fd - an) > 5e-4 + 0.05 * fabs(fd)) {
            bad++;
            fprintf(stderr, "FAIL %s: %s[%zu]: analytic %g, finite difference %g\n", what, name, best - off, an, fd);
        }
    }
    printf("%s: gradients of %d tensors vs finite differences: max |diff| %.2e, max relative %.2e\n", what, probed,
           max_abs, max_rel);
    CHECK(bad == 0 && probed >= min_tensors, "%s: %d of %d tensors' gradients differ from finite differences", what,
          bad, probed);
}

static void check_gradient(lens_trainer *t, const char *what)
{
    const probe_batch pb = {{.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids, .type_ids = fd_types}, fd_labels,
                            fd_targets};
    check_gradient_on(t, what, &pb, 28);
}

/* 16 random sequences with random labels: a model that learns must drive
 * the training loss far below log 2 within 60 AdamW steps at lr 1e-3. */
static void check_overfit(lens_trainer *t, const char *what)
{
    enum { S = 16, T = 8 };
    int lengths[S], ids[S * T], labels[S];
    unsigned r = 12345;
    for (int s = 0; s < S; s++) {
        lengths[s] = T;
        labels[s] = (r = r * 1103515245u + 12345u) >> 16 & 1;
        for (int i = 0; i < T; i++) ids[s * T + i] = i == 0 ? 101 : 1000 + (int)((r = r * 1103515245u + 12345u) >> 16) % 3000;
    }
    const lens_batch b = {.n_seqs = S, .lengths = lengths, .ids = ids};
    lens_err err;
    float first = 0, loss = 0;
    for (int step = 0; step < 60; step++) {
        lens_trainer_zero_grad(t);
        if (lens_trainer_batch(t, &b, labels, 1, &loss, NULL, &err)) break;
        if (step == 0) first = loss;
        lens_trainer_step(t, 1e-3f, 0.01f, 1.0f);
    }
    CHECK(loss < 0.1f && first > 0.3f, "%s: loss %g -> %g after 60 steps (want < 0.1)", what, first, loss);
}

/* Save, reload with lens_model_load, compare lens_forward's logits with the
 * trainer's (same float ops up to GEMM summation order: 1e-4). */
static void check_reload(lens_trainer *t, const char *tokenizer_dir, const char *dir, const char *what)
{
    lens_err err;
    const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids, .type_ids = fd_types};
    float want[4], loss;
    CHECK(!lens_trainer_batch(t, &b, fd_labels, 0, &loss, want, &err), "%s: %s", what, err.msg);
    CHECK(!lens_trainer_save(t, dir, tokenizer_dir, 1, NULL, &err), "%s: save: %s", what, err.msg);
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: reload: %s", what, m ? "" : err.msg);
    if (!m) return;
    CHECK(m->cfg.task == LENS_TASK_CLASSIFICATION && m->cfg.n_labels == 2, "%s: reloaded task", what);
    const lens_config *c = lens_trainer_config(t);
    CHECK(m->cfg.d_head_k == c->d_head_k && m->cfg.d_head_v == c->d_head_v, "%s: head sizes %d/%d, want %d/%d", what,
          m->cfg.d_head_k, m->cfg.d_head_v, c->d_head_k, c->d_head_v);
    CHECK(m->cfg.head_combination == c->head_combination, "%s: head_combination %d, want %d", what,
          m->cfg.head_combination, c->head_combination);
    lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
    lens_activations act;
    if (!lens_forward(m, &b, &opts, &act, &err)) {
        printf("%s: reloaded logits max |diff| %.2e\n", what, check_close(what, act.logits, want, 4, 1e-4, 1e-4));
        lens_activations_free(&act);
    } else {
        CHECK(0, "%s: forward: %s", what, err.msg);
    }
    lens_model_free(m);
    if (c->head_combination) {
        /* the file holds the model's parameter, [C][DV], not the trainer's tiled copy */
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        lens_safetensors st;
        if (!lens_st_open(path, &st, &err)) {
            const lens_st_tensor *w = lens_st_find(&st, "bert.encoder.layer.0.attention.output.dense.weight");
            CHECK(w && w->ndim == 2 && w->shape[0] == c->d_model && w->shape[1] == c->d_head_v,
                  "%s: saved output weight shape", what);
            lens_st_close(&st);
        }
    }
    /* resume: moments and step come back */
    lens_config cfg = *c;
    lens_trainer *u = lens_trainer_new(&cfg, 1, &err);
    long step = -1;
    CHECK(u && !lens_trainer_load_weights(u, dir, NULL, &err) && !lens_trainer_load_state(u, dir, &step, &err),
          "%s: resume: %s", what, err.msg);
    size_t n;
    float *pt = lens_trainer_params(t, &n), *pu = u ? lens_trainer_params(u, NULL) : NULL;
    CHECK(pu && !memcmp(pt, pu, n * sizeof(float)) && step == 60, "%s: resumed parameters / step (%ld)", what, step);
    lens_trainer_free(u);
}

/* -log softmax(z)[y] over K logits, in double. */
static double cross_entropy_of(const float *z, int K, int y)
{
    double mx = z[0], sum = 0;
    for (int j = 1; j < K; j++) mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < K; j++) sum += exp(z[j] - mx);
    return log(sum) + mx - z[y];
}

/* The trainer's loss of pb recomputed from lens_forward's logits of model m:
 * classifier: mean over sequences; masked LM: mean over the targets; causal
 * LM: mean over the next-token predictions. -1 when the forward fails. */
static double forward_loss(const lens_model *m, const probe_batch *pb)
{
    lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
    lens_activations act;
    lens_err err;
    if (lens_forward(m, &pb->b, &opts, &act, &err)) {
        fprintf(stderr, "forward: %s\n", err.msg);
        return -1;
    }
    const lens_config *c = &m->cfg;
    double sum = 0;
    int n = 0;
    for (int s = 0, r = 0; s < pb->b.n_seqs; r += pb->b.lengths[s], s++)
        for (int i = 0; i < pb->b.lengths[s]; i++) {
            const float *z = act.logits + (size_t)(r + i) * c->vocab_size;
            if (c->task == LENS_TASK_CLASSIFICATION && i == 0)
                sum += cross_entropy_of(act.logits + (size_t)s * c->n_labels, c->n_labels, pb->labels[s]), n++;
            else if (c->task == LENS_TASK_MASKED_LM && pb->targets[r + i] >= 0)
                sum += cross_entropy_of(z, c->vocab_size, pb->targets[r + i]), n++;
            else if (c->task == LENS_TASK_CAUSAL_LM && i + 1 < pb->b.lengths[s])
                sum += cross_entropy_of(z, c->vocab_size, pb->b.ids[r + i + 1]), n++;
        }
    lens_activations_free(&act);
    return n ? sum / n : -1;
}

/* Every family of lens_families and every task it has an HF class for (a
 * new family is covered without touching this test): the mkmodel micro
 * checkpoint loads into a trainer tensor for tensor, the weight gradients
 * agree with finite differences, and after three AdamW steps the saved
 * checkpoint reloads and lens_forward's logits give the trainer's loss
 * (1e-5 relative: the same float ops up to GEMM summation order). */
static void check_families(void)
{
    /* ids below every micro vocabulary (1000) */
    static const int ids[12] = {1, 20, 54, 3, 2, 1, 592, 88, 2, 129, 24, 2};
    static const int targets[12] = {-1, 20, -1, -1, -1, -1, -1, 88, -1, 129, -1, -1};
    int cases = 0;
    for (const lens_family *const *f = lens_families; *f; f++)
        for (lens_task task = LENS_TASK_CLASSIFICATION; task <= LENS_TASK_CAUSAL_LM; task++) {
            if (!(*f)->task_archs[task]) continue;
            char dir[256], out[256], what[96];
            snprintf(what, sizeof what, "%s %s", (*f)->model_type, lens_task_name(task));
            snprintf(dir, sizeof dir, "%s/micro-%s-%d", tmp_root, (*f)->model_type, (int)task);
            snprintf(out, sizeof out, "%s/trained-%s-%d", tmp_root, (*f)->model_type, (int)task);
            lens_err err;
            lens_model *m = NULL;
            if (lens_mkmodel((*f)->model_type, "micro", lens_task_name(task), 5, dir, &err) ||
                !(m = lens_model_load(dir, &err))) {
                CHECK(0, "%s: mkmodel: %s", what, err.msg);
                continue;
            }
            cases++;
            const int segments = lens_has_cap(&m->cfg, LENS_CAP_SEGMENTS);
            const probe_batch pb = {{.n_seqs = 2, .lengths = fd_lengths, .ids = ids, .type_ids = segments ? fd_types : NULL},
                                    fd_labels, targets};
            lens_trainer *t = lens_trainer_new(&m->cfg, 1, &err);
            lens_model_free(m);
            int loaded = 0, n_tensors = 0;
            CHECK(t && !lens_trainer_load_weights(t, dir, &loaded, &err), "%s: trainer: %s", what, err.msg);
            if (!t) continue;
            while (!lens_trainer_tensor(t, n_tensors, NULL, NULL, NULL)) n_tensors++;
            CHECK(loaded == n_tensors, "%s: %d of the trainer's %d tensors loaded", what, loaded, n_tensors);
            check_gradient_on(t, what, &pb, 8);
            for (int step = 0; step < 3; step++) {
                lens_trainer_zero_grad(t);
                batch_loss_of(t, &pb.b, pb.labels, pb.targets, 1);
                lens_trainer_step(t, 1e-3f, 0.01f, 1.0f);
            }
            const double want = batch_loss_of(t, &pb.b, pb.labels, pb.targets, 0);
            CHECK(!lens_trainer_save(t, out, dir, 0, NULL, &err), "%s: save: %s", what, err.msg);
            lens_trainer_free(t);
            lens_model *r = lens_model_load(out, &err);
            CHECK(r != NULL, "%s: reload: %s", what, r ? "" : err.msg);
            if (!r) continue;
            const double got = forward_loss(r, &pb);
            printf("%s: trainer loss %.6f, reloaded forward %.6f\n", what, want, got);
            CHECK(r->cfg.task == task && fabs(got - want) < 1e-5 * fabs(want) + 1e-6, "%s: reloaded loss %g, trainer %g",
                  what, got, want);
            lens_model_free(r);
        }
    CHECK(cases >= 14, "%d family / task cases (every family trains)", cases);
}

/* classifier_pooling "mean" (ModernBERT): the pooled row is every row's
 * mean, so the loss's gradient reaches every token through pooling's
 * backward (lens_classifier_unpool); finite differences check it. */
static void check_mean_pooling(void)
{
    static const int ids[12] = {1, 20, 54, 3, 2, 1, 592, 88, 2, 129, 24, 2};
    char dir[256];
    snprintf(dir, sizeof dir, "%s/micro-modernbert-mean", tmp_root);
    lens_err err;
    lens_model *m = family_variant_load("modernbert", "classification", 5, dir, "classifier_pooling", "mean", &err);
    CHECK(m && m->cfg.pool_mean, "modernbert mean pooling: %s", m ? "not read" : err.msg);
    lens_trainer *t = m ? lens_trainer_new(&m->cfg, 1, &err) : NULL;
    lens_model_free(m);
    int loaded = 0;
    CHECK(t && !lens_trainer_load_weights(t, dir, &loaded, &err), "modernbert mean pooling trainer: %s", err.msg);
    const probe_batch pb = {{.n_seqs = 2, .lengths = fd_lengths, .ids = ids}, fd_labels, NULL};
    if (t) check_gradient_on(t, "modernbert classification, mean pooling", &pb, 8);
    lens_trainer_free(t);
}

/* lines [from, to) of src into dst, blank lines dropped; 0 on success. */
static int copy_lines(const char *src, const char *dst, int from, int to)
{
    FILE *in = fopen(src, "r"), *out = in ? fopen(dst, "w") : NULL;
    if (!out) {
        if (in) fclose(in);
        return -1;
    }
    char line[8192];
    for (int n = 0; n < to && fgets(line, sizeof line, in); n++)
        if (n >= from && strspn(line, " \n") != strlen(line)) fputs(line, out);
    fclose(in);
    return fclose(out);
}

/* The dev loss of `lensd train` options o before training (one step at
 * learning rate 0 into o->out_dir + "-untrained") and after (o as given):
 * the loss must fall below `below` from above `above`. */
static void check_falls(lens_train_opts *o, int causal, float above, float below, const char *what)
{
    char untrained[300];
    snprintf(untrained, sizeof untrained, "%s-untrained", o->out_dir);
    lens_train_opts zero = *o;
    zero.out_dir = untrained, zero.max_steps = 1, zero.lr = 0;
    lens_train_result r0 = {0}, r1 = {0};
    lens_err err;
    CHECK(!(causal ? lens_train_causal : lens_train_classify)(&zero, &r0, &err), "%s untrained: %s", what, err.msg);
    CHECK(!(causal ? lens_train_causal : lens_train_classify)(o, &r1, &err), "%s: %s", what, err.msg);
    printf("%s: dev loss %.4f -> %.4f after %ld steps", what, r0.dev_loss, r1.dev_loss, r1.steps);
    printf(causal ? "\n" : " (dev accuracy %.3f)\n", r1.dev_accuracy);
    CHECK(r0.dev_loss > above && r1.dev_loss < below, "%s: dev loss %g -> %g (want > %g, then < %g)", what,
          r0.dev_loss, r1.dev_loss, above, below);
}

/* The check: families other than BERT and GPT-2 train from random
 * weights (lens_mkmodel's) on real data with falling dev loss, and the
 * checkpoint reloads. A micro Llama (GQA, RoPE, gated MLP, untied head) on
 * wikitext-2 (dev loss 7.9 -> 4.6 in 100 steps here), a tiny RoBERTa
 * classifier with GPT-2's BPE vocabulary on SST-2 (0.693 -> 0.51, dev
 * accuracy 0.76 after 200 steps). test_http_caps checks that models trained
 * by `lensd train` answer every analysis they advertise. */
static void check_from_random(void)
{
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared not found: Llama and RoBERTa trained from random weights on wikitext-2 and SST-2");
        return;
    }
    char src[512], text[300], dev[300], init[300], out[300], vocab[512], tsv[512], dev_tsv[512];
    lens_err err;
    snprintf(src, sizeof src, "%s/data/wikitext2/valid.txt", shared);
    snprintf(text, sizeof text, "%s/wiki-train.txt", tmp_root);
    snprintf(dev, sizeof dev, "%s/wiki-dev.txt", tmp_root);
    snprintf(init, sizeof init, "%s/llama-random", tmp_root);
    snprintf(out, sizeof out, "%s/llama-trained", tmp_root);
    CHECK(!copy_lines(src, text, 0, 600) && !copy_lines(src, dev, 600, 800), "wikitext-2 excerpt from %s", src);
    CHECK(!lens_mkmodel("llama", "micro", "causal-lm", 1, init, &err), "mkmodel llama: %s", err.msg);
    lens_train_opts o;
    lens_train_opts_default(&o);
    o.init_dir = init, o.train_path = text, o.dev_path = dev, o.out_dir = out;
    o.max_len = 64, o.batch_size = 8, o.max_steps = 100, o.lr = 3e-3f;
    check_falls(&o, 1, 7.0f, 5.5f, "llama micro causal LM");
    lens_model *m = lens_model_load(out, &err);
    CHECK(m && m->cfg.family == lens_family_find("llama") && m->cfg.n_kv_heads == 2 && !m->cfg.tie_word_embeddings,
          "trained llama reloads: %s", m ? "" : err.msg);
    lens_model_free(m);

    snprintf(vocab, sizeof vocab, "%s/vocab/gpt2", shared);
    snprintf(tsv, sizeof tsv, "%s/data/sst2/train_part_alps.tsv", shared);
    snprintf(dev_tsv, sizeof dev_tsv, "%s/data/sst2/dev.tsv", shared);
    snprintf(init, sizeof init, "%s/roberta-random", tmp_root);
    snprintf(out, sizeof out, "%s/roberta-trained", tmp_root);
    CHECK(!lens_mkmodel_vocab("roberta", "tiny", "classification", 1, vocab, init, &err), "mkmodel roberta: %s",
          err.msg);
    lens_train_opts_default(&o);
    o.init_dir = init, o.train_path = tsv, o.dev_path = dev_tsv, o.out_dir = out;
    o.max_len = 48, o.batch_size = 32, o.max_train = 6400, o.max_steps = 200, o.lr = 1e-3f;
    check_falls(&o, 0, 0.68f, 0.6f, "roberta tiny classifier");
    m = lens_model_load(out, &err);
    CHECK(m && m->cfg.family == lens_family_find("roberta") && m->cfg.task == LENS_TASK_CLASSIFICATION && m->tok,
          "trained roberta reloads with its tokenizer: %s", m ? "" : err.msg);
    lens_model_free(m);
}

/* dir = the tiny BERT at base with every layer's attention.output.dense.weight
 * replaced by out_w[l] ([C][in]) and the JSON members extra added to its
 * config.json. */
static int write_variant(const char *base, const char *dir, float *const *out_w, int in, const char *extra)
{
    char path[512], cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/vocab.txt %s/tokenizer_config.json %s/", dir, base, base, dir);
    if (system(cmd)) return -1;
    snprintf(path, sizeof path, "%s/config.json", base);
    FILE *f = fopen(path, "r");
    char json[8192];
    size_t n = f ? fread(json, 1, sizeof json - 1, f) : 0;
    if (f) fclose(f);
    json[n] = 0;
    const char *brace = strchr(json, '{');
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!brace || !(f = fopen(path, "w"))) return -1;
    fprintf(f, "{%s,%s", extra, brace + 1);
    fclose(f);
    lens_err err;
    lens_safetensors st;
    snprintf(path, sizeof path, "%s/model.safetensors", base);
    if (lens_st_open(path, &st, &err)) return -1;
    lens_st_out out[128];
    int k = 0;
    for (int i = 0; i < st.n_tensors && k < 128; i++, k++) {
        const lens_st_tensor *x = &st.tensors[i];
        out[k] = (lens_st_out){.name = x->name, .ndim = x->ndim, .shape = {x->shape[0], x->shape[1]}, .data = x->data};
        int l;
        char rest[64];
        if (sscanf(x->name, "bert.encoder.layer.%d.attention.output.dense.%63s", &l, rest) == 2 &&
            !strcmp(rest, "weight"))
            out[k].shape[1] = in, out[k].data = out_w[l];
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const int rc = lens_st_write(path, out, k, &err);
    lens_st_close(&st);
    return rc;
}

/* A hand-built summed-heads checkpoint (output weight W [C][DV]) and the
 * concat checkpoint whose output weight is W tiled as the variant defines it
 * (summed_copies) give the same logits: the loader's expansion is exact, the
 * two models are the same function. Tolerance 1e-6 (same floats, same GEMM).
 * The two sum variants must differ from each other. */
static void check_summed_checkpoint(const char *base)
{
    enum { L = 2, C = 128, NH = 2, DV = 64 };
    static float compact[L][C * DV], tiled[2][L][C * NH * DV];
    unsigned r = 777;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < C * DV; i++)
            compact[l][i] = 0.1f * ((float)((r = r * 1103515245u + 12345u) >> 16 & 0x7fff) / 32768.0f - 0.5f);
    float logits[2][2][4]; /* [variant][sum, concat][S*K] */
    const char *names[2] = {"sum", "sum_adjacent"};
    for (int v = 0; v < 2; v++) {
        for (int l = 0; l < L; l++)
            for (int o = 0; o < C; o++)
                for (int m = 0; m < NH * DV; m++)
                    tiled[v][l][o * NH * DV + m] = compact[l][o * DV + (v == 0 ? m % DV : m / NH)];
        float *w_sum[L] = {compact[0], compact[1]}, *w_cat[L] = {tiled[v][0], tiled[v][1]};
        char dir_sum[512], dir_cat[512], extra[128];
        snprintf(dir_sum, sizeof dir_sum, "%s/hand-%s", tmp_root, names[v]);
        snprintf(dir_cat, sizeof dir_cat, "%s/hand-%s-concat", tmp_root, names[v]);
        snprintf(extra, sizeof extra, "\"head_combination\": \"%s\"", names[v]);
        CHECK(!write_variant(base, dir_sum, w_sum, DV, extra) &&
                  !write_variant(base, dir_cat, w_cat, NH * DV, "\"head_combination\": \"concat\""),
              "%s: writing the hand-built checkpoints", names[v]);
        const char *dirs[2] = {dir_sum, dir_cat};
        for (int d = 0; d < 2; d++) {
            lens_err err;
            lens_model *m = lens_model_load(dirs[d], &err);
            CHECK(m != NULL, "%s: load: %s", dirs[d], m ? "" : err.msg);
            if (!m) return;
            CHECK(m->cfg.head_combination == (d ? LENS_HEADS_CONCAT : (v ? LENS_HEADS_SUM_ADJACENT : LENS_HEADS_SUM)),
                  "%s: head_combination %d", dirs[d], m->cfg.head_combination);
            const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids, .type_ids = fd_types};
            lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
            lens_activations act;
            CHECK(!lens_forward(m, &b, &opts, &act, &err), "%s: forward: %s", dirs[d], err.msg);
            memcpy(logits[v][d], act.logits, sizeof logits[v][d]);
            lens_activations_free(&act);
            lens_model_free(m);
        }
        char what[64];
        snprintf(what, sizeof what, "hand-built %s vs tiled concat", names[v]);
        printf("%s: logits max |diff| %.2e\n", what, check_close(what, logits[v][0], logits[v][1], 4, 1e-6, 0));
    }
    double gap = 0;
    for (int i = 0; i < 4; i++) gap = fmax(gap, fabs(logits[0][0][i] - logits[1][0][i]));
    CHECK(gap > 1e-3, "sum and sum_adjacent give the same logits (max |diff| %g)", gap);
}

/* One central difference (h = 1e-2) of parameter j against the gradient
 * already in the buffer; returns |fd - analytic| and counts a failure as
 * check_gradient does (5e-4 + 5 %). */
static double probe_gradient(lens_trainer *t, size_t j, const char *what)
{
    const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids};
    float *param = lens_trainer_params(t, NULL), *grad = lens_trainer_grads(t, NULL);
    const float keep = param[j], h = 1e-2f;
    param[j] = keep + h;
    const double up = batch_loss(t, &b, NULL, 0);
    param[j] = keep - h;
    const double down = batch_loss(t, &b, NULL, 0);
    param[j] = keep;
    const double fd = (up - down) / (2 * h), an = grad[j];
    CHECK(fabs(fd - an) <= 5e-4 + 0.05 * fabs(fd), "%s: analytic %g, finite difference %g", what, an, fd);
    return fabs(fd - an);
}

/* The tied wte gets two gradients: as the LM head (every row) and as the
 * input embedding (rows of the input ids). Probed apart: row 101 is an input
 * of both sequences and never a target (head + embedding); row 5 appears
 * nowhere in the batch (head only); wpe row 6 exists only in the second
 * sequence. Each at the row's largest gradient entry. */
static void check_gpt2_tied_gradients(lens_trainer *t)
{
    const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids};
    lens_trainer_zero_grad(t);
    batch_loss(t, &b, NULL, 1);
    const float *grad = lens_trainer_grads(t, NULL);
    const int C = lens_trainer_config(t)->d_model;
    size_t wte = 0, wpe = 0, off, count;
    const char *name;
    for (int i = 0; !lens_trainer_tensor(t, i, &name, &off, &count); i++) {
        if (!strcmp(name, "transformer.wte.weight")) wte = off;
        if (!strcmp(name, "transformer.wpe.weight")) wpe = off;
    }
    const struct { size_t row; const char *what; } rows[3] = {
        {wte + 101 * (size_t)C, "wte row 101 (input, head)"}, {wte + 5 * (size_t)C, "wte row 5 (head only)"},
        {wpe + 6 * (size_t)C, "wpe row 6"}};
    double worst = 0;
    for (int r = 0; r < 3; r++) {
        size_t best = rows[r].row;
        for (size_t j = rows[r].row; j < rows[r].row + (size_t)C; j++)
            if (fabsf(grad[j]) > fabsf(grad[best])) best = j;
        worst = fmax(worst, probe_gradient(t, best, rows[r].what));
    }
    printf("gpt2: tied wte / wpe probes: max |diff| %.2e\n", worst);
}

/* A tiny GPT-2 (V 64, C 64, 2 layers, 2 heads) memorises 4 windows of 16
 * random tokens: mean next-token loss from ~log 64 = 4.2 to < 0.1 within
 * 150 AdamW steps at lr 3e-3 (a model that learns nothing stays near 4.2). */
static void check_gpt2_overfit(void)
{
    enum { S = 4, T = 16 };
    lens_config c = {.family = lens_family_find("gpt2"), .task = LENS_TASK_CAUSAL_LM, .n_layers = 2, .n_heads = 2, .d_model = 64,
                     .d_ff = 256, .vocab_size = 64, .max_positions = 32, .ln_eps = 1e-5f, .gelu_tanh = 1};
    lens_err err;
    lens_trainer *t = lens_trainer_new(&c, 21, &err);
    CHECK(t != NULL, "gpt2 overfit: %s", t ? "" : err.msg);
    if (!t) return;
    int lengths[S], ids[S * T];
    unsigned r = 4242;
    for (int i = 0; i < S * T; i++) ids[i] = (int)((r = r * 1103515245u + 12345u) >> 16) % 64;
    for (int s = 0; s < S; s++) lengths[s] = T;
    const lens_batch b = {.n_seqs = S, .lengths = lengths, .ids = ids};
    float first = 0, loss = 0;
    int n = 0;
    for (int step = 0; step < 150; step++) {
        lens_trainer_zero_grad(t);
        if (lens_trainer_causal_batch(t, &b, 1, &loss, &n, NULL, &err)) break;
        if (step == 0) first = loss;
        lens_trainer_step(t, 3e-3f, 0.0f, 1.0f);
    }
    printf("gpt2: overfit 4 x 16 tokens: loss %.3f -> %.4f after 150 steps (%d predictions)\n", first, loss, n);
    CHECK(n == S * (T - 1) && first > 3.5f && loss < 0.1f, "gpt2 overfit: loss %g -> %g", first, loss);
    lens_trainer_free(t);
}

/* The mkmodel GPT-2 (L2 C128, vocabulary 50257): gradients, save -> lens_model_load
 * -> lens_forward logits equal the trainer's (1e-4: same float ops up to
 * GEMM summation order), and resume: a trainer restored from the checkpoint
 * and its optimizer state takes the same next step bit for bit. */
static void check_gpt2(void)
{
    char base[256], out[256];
    snprintf(base, sizeof base, "%s/tiny-gpt2", tmp_root);
    snprintf(out, sizeof out, "%s/trained-gpt2", tmp_root);
    lens_err err;
    lens_model *m = NULL;
    if (lens_mkmodel("gpt2", "tiny", "causal-lm", 13, base, &err) || !(m = lens_model_load(base, &err))) {
        CHECK(0, "mkmodel gpt2: %s", err.msg);
        return;
    }
    lens_trainer *t = lens_trainer_new(&m->cfg, 3, &err);
    int loaded = 0;
    CHECK(t && !lens_trainer_load_weights(t, base, &loaded, &err) && loaded == 2 + 2 * 12 + 2, "gpt2 load: %d: %s",
          loaded, err.msg);
    lens_model_free(m);
    if (!t) return;
    check_gradient(t, "gpt2");
    check_gpt2_tied_gradients(t);
    /* a few steps so that the saved weights are not the loaded ones */
    const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids};
    for (int step = 0; step < 3; step++) {
        lens_trainer_zero_grad(t);
        batch_loss(t, &b, NULL, 1);
        lens_trainer_step(t, 1e-3f, 0.01f, 1.0f);
    }
    const int V = lens_trainer_config(t)->vocab_size;
    float *want = malloc(sizeof(float) * 12 * (size_t)V);
    float loss;
    int n;
    CHECK(want && !lens_trainer_causal_batch(t, &b, 0, &loss, &n, want, &err) && n == 10, "gpt2 logits: %s", err.msg);
    CHECK(!lens_trainer_save(t, out, base, 1, NULL, &err), "gpt2 save: %s", err.msg);
    lens_model *r = lens_model_load(out, &err);
    CHECK(r != NULL, "gpt2 reload: %s", r ? "" : err.msg);
    if (r && want) {
        CHECK(r->cfg.family == lens_family_find("gpt2") && r->cfg.task == LENS_TASK_CAUSAL_LM && r->cfg.gelu_tanh &&
                  r->cfg.d_ff == 512 && r->cfg.max_positions == 256,
              "gpt2 reloaded config");
        lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
        lens_activations act;
        if (!lens_forward(r, &b, &opts, &act, &err)) {
            const double d = check_close("gpt2 reload logits", act.logits, want, 12 * (size_t)V, 1e-4, 1e-4);
            printf("gpt2: reloaded logits max |diff| %.2e (12 x %d)\n", d, V);
            lens_activations_free(&act);
        } else {
            CHECK(0, "gpt2 forward: %s", err.msg);
        }
    }
    lens_model_free(r);
    free(want);
    /* resume: same parameters and step, then the same next step */
    lens_trainer *u = lens_trainer_new(lens_trainer_config(t), 99, &err);
    long step = -1;
    CHECK(u && !lens_trainer_load_weights(u, out, NULL, &err) && !lens_trainer_load_state(u, out, &step, &err) &&
              step == 3,
          "gpt2 resume: %s (step %ld)", err.msg, step);
    if (u) {
        lens_trainer *both[2] = {t, u};
        for (int i = 0; i < 2; i++) {
            lens_trainer_zero_grad(both[i]);
            batch_loss(both[i], &b, NULL, 1);
            lens_trainer_step(both[i], 1e-3f, 0.01f, 1.0f);
        }
        size_t np;
        const float *pt = lens_trainer_params(t, &np), *pu = lens_trainer_params(u, NULL);
        CHECK(!memcmp(pt, pu, np * sizeof(float)), "gpt2 resume: the step after resuming differs");
    }
    lens_trainer_free(u);
    lens_trainer_free(t);
}

/* Forward threads change nothing: two trainers from the same seed, one with
 * 3 forward threads, take the same 3 steps and end bit-identical. */
static void check_threads(const lens_config *cfg)
{
    lens_err err;
    lens_trainer *one = lens_trainer_new(cfg, 21, &err), *three = lens_trainer_new(cfg, 21, &err);
    CHECK(one && three && !lens_trainer_set_threads(three, 3, &err), "threads: %s", err.msg);
    if (!one || !three) goto done;
    const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids, .type_ids = fd_types};
    float l1 = 0, l3 = 0;
    for (int s = 0; s < 3; s++) {
        lens_trainer_zero_grad(one), lens_trainer_zero_grad(three);
        CHECK(!lens_trainer_batch(one, &b, fd_labels, 1, &l1, NULL, &err) &&
                  !lens_trainer_batch(three, &b, fd_labels, 1, &l3, NULL, &err),
              "threads: %s", err.msg);
        lens_trainer_step(one, 1e-3f, 0.01f, 1.0f), lens_trainer_step(three, 1e-3f, 0.01f, 1.0f);
    }
    size_t n1, n3;
    const float *p1 = lens_trainer_params(one, &n1), *p3 = lens_trainer_params(three, &n3);
    CHECK(l1 == l3 && n1 == n3 && !memcmp(p1, p3, n1 * sizeof(float)),
          "3 forward threads vs 1: losses %.9g / %.9g, parameters %s", l1, l3,
          n1 == n3 && !memcmp(p1, p3, n1 * sizeof(float)) ? "equal" : "differ");
done:
    lens_trainer_free(one), lens_trainer_free(three);
}

/* A Hugging Face tokenizer truncating to tokenizer_config.json's
 * model_max_length must stay within the model's position embeddings. */
static void check_model_max_length(const char *dir, int max_positions, const char *what)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *tc = json_load_file(path, 0, NULL);
    CHECK(json_integer_value(json_object_get(tc, "model_max_length")) == max_positions,
          "%s: tokenizer_config.json model_max_length = the model's %d positions", what, max_positions);
    json_decref(tc);
}

/* `lensd train causal` end to end on a small text with the mkmodel GPT-2
 * tokenizer (vocabulary 50257): 4 steps, a finite dev loss, a checkpoint
 * lens_model_load reads, and --resume continuing from step 4 to 6. */
static void check_train_causal(void)
{
    char text[256], vocab[256], out[256];
    snprintf(text, sizeof text, "%s/text.txt", tmp_root);
    snprintf(vocab, sizeof vocab, "%s/tiny-gpt2", tmp_root);
    snprintf(out, sizeof out, "%s/causal-run", tmp_root);
    FILE *f = fopen(text, "w");
    if (!f) return;
    for (int i = 0; i < 30; i++)
        fprintf(f, " = Section %d = \n\n The cat sat on the mat , and the dog sat on the log .\n", i);
    fclose(f);
    lens_train_opts o;
    lens_train_opts_default(&o);
    o.train_path = o.dev_path = text, o.vocab_dir = vocab, o.out_dir = out, o.arch = "gpt2";
    o.layers = 1, o.hidden = 32, o.heads = 2, o.ff = 64, o.max_len = 16, o.batch_size = 4, o.max_steps = 4;
    lens_train_result r;
    lens_err err;
    CHECK(!lens_train_causal(&o, &r, &err), "train causal: %s", err.msg);
    CHECK(r.steps == 4 && r.dev_loss > 0 && r.dev_loss < 11.5f && r.tokens_per_s > 0,
          "train causal: %ld steps, dev loss %g", r.steps, r.dev_loss);
    lens_model *m = lens_model_load(out, &err);
    CHECK(m && m->cfg.family == lens_family_find("gpt2") && m->cfg.d_model == 32 && m->cfg.max_positions == 16,
          "train causal: reload: %s", m ? "" : err.msg);
    check_model_max_length(out, 16, "train causal");
    lens_model_free(m);
    o.max_steps = 6, o.resume = 1;
    CHECK(!lens_train_causal(&o, &r, &err) && r.steps == 6, "train causal --resume: %s (%ld steps)", err.msg, r.steps);
}

/* `lensd train classify` fine-tuning the mkmodel classifier at init_dir and
 * `lensd train mlm` from its vocabulary, end to end on a small TSV: the
 * steps run, the dev metric is finite, the checkpoint loads with the right
 * head, and --resume continues from step 4 to 6. */
static void check_train_classify(const char *init_dir)
{
    char tsv[256], out[256];
    snprintf(tsv, sizeof tsv, "%s/sst.tsv", tmp_root);
    FILE *f = fopen(tsv, "w");
    if (!f) return;
    fprintf(f, "sentence\tlabel\n");
    for (int i = 0; i < 20; i++) fprintf(f, "a fine and funny film .\t1\nthe plot is dull .\t0\n");
    fclose(f);
    for (int mlm = 0; mlm < 2; mlm++) {
        const char *what = mlm ? "train mlm" : "train classify";
        snprintf(out, sizeof out, "%s/%s-run", tmp_root, mlm ? "mlm" : "classify");
        lens_train_opts o;
        lens_train_opts_default(&o);
        o.train_path = o.dev_path = tsv, o.out_dir = out, o.masked_lm = mlm;
        o.batch_size = 8, o.max_steps = 4, o.max_len = 16, o.epochs = 2; /* 5 steps an epoch */
        if (mlm) o.vocab_dir = init_dir, o.arch = "bert", o.layers = 1, o.hidden = 32, o.heads = 2, o.ff = 64;
        else o.init_dir = init_dir;
        lens_train_result r;
        lens_err err;
        CHECK(!lens_train_classify(&o, &r, &err), "%s: %s", what, err.msg);
        const int dev_ok = mlm ? r.dev_accuracy > 0 && r.dev_accuracy < 20 : r.dev_accuracy >= 0 && r.dev_accuracy <= 1;
        CHECK(r.steps == 4 && dev_ok && r.tokens_per_s > 0, "%s: %ld steps, dev metric %g", what, r.steps,
              r.dev_accuracy);
        lens_model *m = lens_model_load(out, &err);
        CHECK(m && m->cfg.task == (mlm ? LENS_TASK_MASKED_LM : LENS_TASK_CLASSIFICATION) &&
                  (mlm ? m->cfg.d_model == 32 : m->cfg.n_labels == 2),
              "%s: reload: %s", what, m ? "" : err.msg);
        if (m) check_model_max_length(out, m->cfg.max_positions, what);
        lens_model_free(m);
        o.max_steps = 6, o.resume = 1;
        CHECK(!lens_train_classify(&o, &r, &err) && r.steps == 6, "%s --resume: %s (%ld steps)", what, err.msg,
              r.steps);
    }
}

/* A vocabulary learned from a small TSV loads as a WordPiece tokenizer;
 * frequent words become single tokens, no word of the corpus is [UNK], and
 * the requested size is reached exactly. */
static void check_vocab(void)
{
    char corpus[256], dir[256];
    snprintf(corpus, sizeof corpus, "%s/corpus.tsv", tmp_root);
    snprintf(dir, sizeof dir, "%s/vocab", tmp_root);
    FILE *f = fopen(corpus, "w");
    if (!f) return;
    fprintf(f, "sentence\tlabel\n");
    for (int i = 0; i < 20; i++)
        fprintf(f, "the cat sat on the mat , said the other cat .\t1\nthe dog sat on the log .\t0\n");
    fclose(f);
    lens_err err;
    const char *paths[1] = {corpus};
    CHECK(!lens_train_vocab(paths, 1, 40, 2, dir, &err), "train vocab: %s", err.msg);
    lens_tokenizer *tok = lens_tokenizer_load(dir, &err);
    CHECK(tok != NULL, "vocab reload: %s", tok ? "" : err.msg);
    if (!tok) return;
    CHECK(lens_tokenizer_vocab_size(tok) == 40, "vocab size %d, want 40", lens_tokenizer_vocab_size(tok));
    CHECK(lens_tokenizer_id(tok, "the") >= 0 && lens_tokenizer_id(tok, "[PAD]") == 0, "\"the\" / [PAD] ids");
    lens_token *t;
    int n;
    const char *text = "The other dog sat on the cat.";
    if (!lens_tokenize(tok, text, strlen(text), NULL, 0, &t, &n, &err)) {
        int unk = 0;
        for (int i = 0; i < n; i++) unk += t[i].id == lens_tokenizer_id(tok, "[UNK]");
        CHECK(unk == 0 && n >= 10, "%d tokens, %d [UNK]", n, unk);
        free(t);
    }
    lens_tokenizer_free(tok);
}

/* The trained demo classifier (make demo-models), when present: clear
 * sentences get the right label. */
static void check_demo_model(void)
{
    lens_err err;
    lens_model *m = lens_model_load("models/demo-sst2", &err);
    if (!m) {
        SKIP("models/demo-sst2 not built (make demo-models): %s", err.msg);
        return;
    }
    const char *texts[4] = {"a gorgeous , witty , seductive movie .", "the plot is dull and the acting is terrible .",
                            "one of the best films of the year .", "a boring , pointless mess ."};
    const int want[4] = {1, 0, 1, 0};
    for (int i = 0; i < 4; i++) {
        lens_token *tk;
        int n;
        if (lens_tokenize(m->tok, texts[i], strlen(texts[i]), NULL, 0, &tk, &n, &err)) continue;
        int ids[64], T = n < 64 ? n : 64;
        for (int j = 0; j < T; j++) ids[j] = tk[j].id;
        free(tk);
        const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
        lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
        lens_activations act;
        if (lens_forward(m, &b, &opts, &act, &err)) continue;
        const int got = act.logits[1] > act.logits[0];
        CHECK(got == want[i], "demo-sst2: \"%s\" -> %s", texts[i], m->cfg.labels[got]);
        lens_activations_free(&act);
    }
    lens_model_free(m);
}

int main(void)
{
    lens_err err;
    if (!mkdtemp(tmp_root)) return 1;
    char base[256], out[256], out_id[256];
    snprintf(base, sizeof base, "%s/tiny", tmp_root);
    snprintf(out, sizeof out, "%s/trained", tmp_root);
    snprintf(out_id, sizeof out_id, "%s/identifiable", tmp_root);
    if (lens_mkmodel("bert", "tiny", "classification", 7, base, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 1;
    }
    lens_model *m = lens_model_load(base, &err);
    if (!m) return 1;
    lens_config cfg = m->cfg;

    lens_trainer *t = lens_trainer_new(&cfg, 3, &err);
    int loaded = 0;
    CHECK(t && !lens_trainer_load_weights(t, base, &loaded, &err) && loaded == 5 + 2 * 16 + 4, "load: %d: %s",
          loaded, err.msg);
    if (t) {
        check_gradient(t, "standard");
        check_overfit(t, "standard");
        check_reload(t, base, out, "standard");
    }
    lens_trainer_free(t);
    check_threads(&cfg);

    /* identifiable variant: DK = 16 (small), DV = 96 (>= the lengths used) */
    cfg.d_head_k = 16, cfg.d_head_v = 96;
    t = lens_trainer_new(&cfg, 5, &err);
    CHECK(t != NULL, "identifiable: %s", err.msg);
    if (t) {
        check_gradient(t, "identifiable");
        check_overfit(t, "identifiable");
        check_reload(t, base, out_id, "identifiable");
    }
    lens_trainer_free(t);

    /* the same, scaled by 1/sqrt(DV) as declare-lab's code: gradient, training
     * and a reload whose config says "attention_scale": "DV" */
    cfg.scale_by_dv = 1;
    snprintf(out_id, sizeof out_id, "%s/identifiable-dv", tmp_root);
    t = lens_trainer_new(&cfg, 5, &err);
    CHECK(t != NULL, "identifiable DV-scaled: %s", err.msg);
    cfg.scale_by_dv = 0;
    lens_trainer *t_dk = lens_trainer_new(&cfg, 5, &err); /* same seed: same weights, scaled by 1/sqrt(DK) */
    cfg.scale_by_dv = 1;
    if (t && t_dk) {
        const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids, .type_ids = fd_types};
        float z_dv[4], z_dk[4], loss;
        CHECK(!lens_trainer_batch(t, &b, fd_labels, 0, &loss, z_dv, &err) &&
                  !lens_trainer_batch(t_dk, &b, fd_labels, 0, &loss, z_dk, &err),
              "DV vs DK logits: %s", err.msg);
        double d = 0;
        for (int i = 0; i < 4; i++) d = fmax(d, fabs((double)z_dv[i] - z_dk[i]));
        CHECK(d > 1e-6, "the DV scale changes nothing (max |diff| %g)", d);
    }
    lens_trainer_free(t_dk);
    if (t) {
        check_gradient(t, "identifiable, DV-scaled");
        check_overfit(t, "identifiable, DV-scaled");
        check_reload(t, base, out_id, "identifiable, DV-scaled");
        lens_model *r = lens_model_load(out_id, &err);
        CHECK(r && r->cfg.scale_by_dv && r->cfg.attn_scale == 1.0f / sqrtf(96.0f),
              "DV-scaled reload: scale_by_dv %d, attn_scale %g", r ? r->cfg.scale_by_dv : -1,
              r ? (double)r->cfg.attn_scale : 0.0);
        lens_model_free(r);
    }
    lens_trainer_free(t);
    cfg.scale_by_dv = 0;

    /* summed heads (Bhardwaj et al.): DK 8, DV 64; both variants */
    check_summed_checkpoint(base);
    for (int v = 0; v < 2; v++) {
        const char *what = v ? "sum_adjacent" : "sum";
        cfg.d_head_k = 8, cfg.d_head_v = 64, cfg.head_combination = v ? LENS_HEADS_SUM_ADJACENT : LENS_HEADS_SUM;
        snprintf(out_id, sizeof out_id, "%s/%s", tmp_root, what);
        t = lens_trainer_new(&cfg, 11, &err);
        CHECK(t != NULL, "%s: %s", what, err.msg);
        if (t) {
            check_gradient(t, what);
            check_overfit(t, what);
            check_reload(t, base, out_id, what);
        }
        lens_trainer_free(t);
    }
    lens_model_free(m);
    check_train_classify(base);
    check_vocab();
    check_demo_model();

    /* masked LM: gradient (decoder tied to the word embeddings), reload */
    snprintf(base, sizeof base, "%s/tiny-mlm", tmp_root);
    snprintf(out, sizeof out, "%s/trained-mlm", tmp_root);
    if (!lens_mkmodel("bert", "tiny", "masked-lm", 9, base, &err) && (m = lens_model_load(base, &err))) {
        t = lens_trainer_new(&m->cfg, 3, &err);
        CHECK(t && !lens_trainer_load_weights(t, base, &loaded, &err) && loaded == 5 + 2 * 16 + 5,
              "mlm load: %d", loaded);
        if (t) {
            check_gradient(t, "masked-lm");
            const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids, .type_ids = fd_types};
            const double want = batch_loss(t, &b, NULL, 0);
            CHECK(!lens_trainer_save(t, out, base, 0, NULL, &err), "mlm save: %s", err.msg);
            lens_model *r = lens_model_load(out, &err);
            lens_activations act;
            lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
            CHECK(r && r->cfg.task == LENS_TASK_MASKED_LM && !lens_forward(r, &b, &opts, &act, &err),
                  "mlm reload: %s", err.msg);
            if (r) {
                /* the loss from lens_forward's [N][V] logits equals the trainer's (1e-5 relative) */
                const int V = r->cfg.vocab_size;
                double got = 0;
                int n = 0;
                for (int i = 0; i < 12; i++) {
                    if (fd_targets[i] < 0) continue;
                    const float *z = act.logits + (size_t)i * V;
                    double mx = z[0], sum = 0;
                    for (int j = 1; j < V; j++) mx = z[j] > mx ? z[j] : mx;
                    for (int j = 0; j < V; j++) sum += exp(z[j] - mx);
                    got += log(sum) + mx - z[fd_targets[i]], n++;
                }
                got /= n;
                CHECK(fabs(got - want) < 1e-5 * fabs(want) + 1e-6, "mlm reload loss %g, trainer %g", got, want);
                lens_activations_free(&act);
            }
            lens_model_free(r);
        }
        lens_trainer_free(t);
        lens_model_free(m);
    } else {
        CHECK(0, "mkmodel masked-lm: %s", err.msg);
    }

    check_gpt2();
    check_gpt2_overfit();
    check_families();
    check_mean_pooling();
    check_from_random();
    check_train_causal();

    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp_root);
    return check_done("test_train");
}
