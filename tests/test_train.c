/* test_train.c - BERT classification training (core/train.c).
 *
 * On lens_mkmodel's tiny BERT (L2 H128, 2 heads): the weight gradient of the
 * whole model against central finite differences, one probe per tensor (its
 * largest gradient entry); loss falls when 16 examples are overfit; a saved
 * checkpoint reloads with lens_model_load and lens_forward gives the same
 * logits; the identifiable variant (DK != DV) trains, saves and reloads. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/model.h"
#include "core/mkmodel.h"
#include "core/tokenizer.h"
#include "core/train.h"

static char tmp_root[] = "/tmp/lens_test_train_XXXXXX";

/* Two sequences of 5 and 7 ids, second with segment ids of a pair. */
static const int fd_lengths[2] = {5, 7};
static const int fd_ids[12] = {101, 2000, 2054, 2003, 102, 101, 7592, 2088, 102, 2129, 2024, 102};
static const int fd_types[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1};
static const int fd_labels[2] = {1, 0};

/* masked-LM targets of the same batch: 3 predicted positions */
static const int fd_targets[12] = {-1, 2000, -1, -1, -1, -1, -1, 2088, -1, 2129, -1, -1};

/* Classification loss of the labels, or masked-LM loss of fd_targets. */
static double batch_loss(lens_trainer *t, const lens_batch *b, const int *labels, int backward)
{
    float loss = 0;
    lens_err err;
    int rc = lens_trainer_config(t)->task == LENS_TASK_MASKED_LM
                 ? lens_trainer_mlm_batch(t, b, fd_targets, backward, &loss, NULL, &err)
                 : lens_trainer_batch(t, b, labels, backward, &loss, NULL, &err);
    if (rc) fprintf(stderr, "batch: %s\n", err.msg);
    return loss;
}

/* Central differences with step h = 1e-2 on float32: the loss is computed in
 * double from float logits, so the difference quotient is good to ~1e-5
 * absolute; curvature over +-h adds a few percent. Tolerance: 5e-4 + 5%. */
static void check_gradient(lens_trainer *t, const char *what)
{
    const lens_batch b = {.n_seqs = 2, .lengths = fd_lengths, .ids = fd_ids, .type_ids = fd_types};
    lens_trainer_zero_grad(t);
    batch_loss(t, &b, fd_labels, 1);
    float *param = lens_trainer_params(t, NULL), *grad = lens_trainer_grads(t, NULL);
    int bad = 0, probed = 0;
    const char *name;
    size_t off, count;
    for (int i = 0; !lens_trainer_tensor(t, i, &name, &off, &count); i++) {
        size_t best = off;
        for (size_t j = off; j < off + count; j++)
            if (fabsf(grad[j]) > fabsf(grad[best])) best = j;
        const float keep = param[best], h = 1e-2f;
        param[best] = keep + h;
        const double up = batch_loss(t, &b, fd_labels, 0);
        param[best] = keep - h;
        const double down = batch_loss(t, &b, fd_labels, 0);
        param[best] = keep;
        const double fd = (up - down) / (2 * h), an = grad[best];
        probed++;
        if (fabs(fd - an) > 5e-4 + 0.05 * fabs(fd)) {
            bad++;
            fprintf(stderr, "FAIL %s: %s[%zu]: analytic %g, finite difference %g\n", what, name, best - off, an, fd);
        }
    }
    CHECK(bad == 0 && probed > 30, "%s: %d of %d tensors' gradients differ from finite differences", what, bad,
          probed);
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
    lens_forward_opts opts = {.keep = LENS_KEEP_LOGITS};
    lens_activations act;
    if (!lens_forward(m, &b, &opts, &act, &err)) {
        check_close(what, act.logits, want, 4, 1e-4, 1e-4);
        lens_activations_free(&act);
    } else {
        CHECK(0, "%s: forward: %s", what, err.msg);
    }
    lens_model_free(m);
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
    lens_model_free(m);
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

    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp_root);
    return check_done("test_train");
}
