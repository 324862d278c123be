/* train.c - benchmark driver: training throughput of the demo BERT
 * classifier (models/demo-sst2's configuration) with the trainer API.
 *
 *   train --data TSV --vocab DIR [--steps 300] [--warmup 10] [--batch 32] [--max-len 128]
 *         [--threads 2] [--seed 1] [--layers 2] [--hidden 128] [--heads 2] [--ff 512]
 *         [--dump-batches FILE]
 *
 * Data as `lensd train classify` reads it (core/train/train_classify.c): TSV
 * text<TAB>label with a header, tokenized with DIR's WordPiece vocabulary,
 * cut to --max-len tokens (the last kept token becomes [SEP]). The examples
 * are shuffled once (xorshift64 from --seed) and the first
 * (warmup + steps) * batch of them form the batches, in order.
 * --dump-batches writes those batches for bench/peer/train_torch.py, int32
 * little-endian: n_seqs, batch, then per sequence length, label, ids[length].
 *
 * Each step is what lens_train_classify does per batch: zero the gradient,
 * lens_trainer_batch (forward keeping activations + backward), then
 * lens_trainer_step (clip to global norm 1.0, AdamW lr 1e-3 constant, weight
 * decay 0.01). Threads: --threads for both OpenBLAS (the trainer's backward
 * GEMMs are cblas calls) and the trainer's forward GEMMs (a lens_pool), as
 * `lensd train classify --threads N` sets them. The first --warmup steps are
 * not timed. Tokens are real (packed, unpadded) tokens. Prints one JSON line
 * (tokens_per_s, steps_per_s, maxrss_kib, loss_first, loss_last, ...). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/model/arch.h"
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/model/model.h"
#include "core/io/tokenizer.h"
#include "core/train/train.h"

typedef struct {
    int *ids;      /* all tokens; example e at ids + start[e] */
    size_t *start;
    int *len, *label;
    int n;
    size_t n_tokens;
} examples;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int push_example(examples *d, const lens_token *toks, int n, int label, size_t *cap_tok, int *cap_n)
{
    if (d->n == *cap_n) {
        *cap_n = *cap_n ? 2 * *cap_n : 4096;
        d->start = realloc(d->start, sizeof *d->start * *cap_n);
        d->len = realloc(d->len, sizeof *d->len * *cap_n);
        d->label = realloc(d->label, sizeof *d->label * *cap_n);
    }
    while (d->n_tokens + (size_t)n > *cap_tok) {
        *cap_tok = *cap_tok ? 2 * *cap_tok : 65536;
        d->ids = realloc(d->ids, sizeof *d->ids * *cap_tok);
    }
    if (!d->start || !d->len || !d->label || !d->ids) return -1;
    d->start[d->n] = d->n_tokens, d->len[d->n] = n, d->label[d->n] = label;
    for (int i = 0; i < n; i++) d->ids[d->n_tokens + i] = toks[i].id;
    d->n_tokens += (size_t)n;
    d->n++;
    return 0;
}

/* TSV text<TAB>label (numeric labels), header line skipped. */
static int read_tsv(const char *path, const lens_tokenizer *tok, int max_len, examples *d, lens_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return lens_fail(err, LENS_ENOENT, "%s: %s", path, strerror(errno));
    const int sep = lens_tokenizer_id(tok, "[SEP]");
    char *line = NULL;
    size_t cap = 0, cap_tok = 0;
    int cap_n = 0, rc = 0;
    while (getline(&line, &cap, f) > 0) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        char *tab = strrchr(line, '\t');
        if (!tab || tab[1] < '0' || tab[1] > '9') continue; /* header or malformed */
        *tab = 0;
        lens_token *toks;
        int nt;
        if (lens_tokenize(tok, line, strlen(line), NULL, 0, &toks, &nt, err)) {
            rc = -1;
            break;
        }
        if (nt > max_len) nt = max_len, toks[nt - 1].id = sep;
        const int failed = push_example(d, toks, nt, atoi(tab + 1), &cap_tok, &cap_n);
        free(toks);
        if (failed) {
            rc = lens_fail(err, LENS_ENOMEM, "out of memory reading %s", path);
            break;
        }
    }
    free(line);
    fclose(f);
    if (!rc && d->n == 0) rc = lens_fail(err, LENS_EFORMAT, "%s: no examples", path);
    return rc;
}

static void shuffle(int *order, int n, unsigned long long seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const int j = (int)(s % (uint64_t)(i + 1));
        const int x = order[i];
        order[i] = order[j], order[j] = x;
    }
}

static int dump_batches(const char *path, const examples *d, const int *order, int n_seqs, int batch)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int32_t head[2] = {n_seqs, batch};
    int bad = fwrite(head, sizeof head, 1, f) != 1;
    for (int k = 0; k < n_seqs; k++) {
        const int e = order[k];
        int32_t meta[2] = {d->len[e], d->label[e]};
        bad |= fwrite(meta, sizeof meta, 1, f) != 1;
        bad |= fwrite(d->ids + d->start[e], sizeof(int32_t), (size_t)d->len[e], f) != (size_t)d->len[e];
    }
    return fclose(f) || bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *data = NULL, *vocab = NULL, *dump = NULL;
    int steps = 300, warmup = 10, batch = 32, max_len = 128, threads = 2;
    int layers = 2, hidden = 128, heads = 2, ff = 512;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "train: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--vocab")) vocab = v;
        else if (!strcmp(a, "--dump-batches")) dump = v;
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--batch")) batch = atoi(v);
        else if (!strcmp(a, "--max-len")) max_len = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--hidden")) hidden = atoi(v);
        else if (!strcmp(a, "--heads")) heads = atoi(v);
        else if (!strcmp(a, "--ff")) ff = atoi(v);
        else {
            fprintf(stderr, "usage: train --data TSV --vocab DIR [--steps 300] [--warmup 10] [--batch 32]\n"
                            "         [--max-len 128] [--threads 2] [--seed 1] [--dump-batches FILE]\n");
            return 2;
        }
        i++;
    }
    if (!data || !vocab || steps < 1 || warmup < 0 || batch < 1 || max_len < 2 || threads < 1 || hidden % heads) {
        fprintf(stderr, "train: --data and --vocab are required; sizes must be positive\n");
        return 2;
    }
    lens_err err = {0};
    lens_tokenizer *tok = lens_tokenizer_load(vocab, &err);
    if (!tok) {
        fprintf(stderr, "train: %s\n", err.msg);
        return 1;
    }
    examples d = {0};
    if (read_tsv(data, tok, max_len, &d, &err)) {
        fprintf(stderr, "train: %s\n", err.msg);
        return 1;
    }
    const int n_seqs = (warmup + steps) * batch;
    if (n_seqs > d.n) {
        fprintf(stderr, "train: %d steps of %d need %d examples, %s has %d\n", warmup + steps, batch, n_seqs, data,
                d.n);
        return 1;
    }
    int *order = malloc(sizeof(int) * d.n);
    shuffle(order, d.n, seed);
    if (dump && dump_batches(dump, &d, order, n_seqs, batch)) {
        fprintf(stderr, "train: cannot write %s\n", dump);
        return 1;
    }
    char *labels[2] = {"negative", "positive"};
    lens_config cfg = {.family = lens_family_find("bert"), .task = LENS_TASK_CLASSIFICATION, .n_layers = layers,
                       .n_heads = heads, .d_model = hidden, .d_ff = ff, .d_head_k = hidden / heads,
                       .d_head_v = hidden / heads, .vocab_size = lens_tokenizer_vocab_size(tok),
                       .max_positions = max_len, .type_vocab_size = 2, .ln_eps = 1e-12f, .n_labels = 2,
                       .labels = labels};
    snprintf(cfg.architecture, sizeof cfg.architecture, "BertForSequenceClassification");
    lens_blas_set_threads(threads);
    lens_trainer *t = lens_trainer_new(&cfg, seed, &err);
    if (!t || lens_trainer_set_threads(t, threads, &err)) {
        fprintf(stderr, "train: %s\n", err.msg);
        return 1;
    }
    size_t n_params;
    lens_trainer_params(t, &n_params);
    int *ids = malloc(sizeof(int) * (size_t)batch * max_len), *lengths = malloc(sizeof(int) * batch);
    int *y = malloc(sizeof(int) * batch);
    double t0 = now_s(), tokens = 0, padded = 0;
    float loss_first = 0, loss = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) t0 = now_s(), tokens = 0, padded = 0;
        size_t n = 0;
        int longest = 0;
        for (int k = 0; k < batch; k++) {
            const int e = order[s * batch + k];
            memcpy(ids + n, d.ids + d.start[e], sizeof(int) * d.len[e]);
            n += (size_t)d.len[e];
            lengths[k] = d.len[e], y[k] = d.label[e];
            longest = d.len[e] > longest ? d.len[e] : longest;
        }
        const lens_batch b = {.n_seqs = batch, .lengths = lengths, .ids = ids};
        lens_trainer_zero_grad(t);
        if (lens_trainer_batch(t, &b, y, 1, &loss, NULL, &err)) {
            fprintf(stderr, "train: step %d: %s\n", s, err.msg);
            return 1;
        }
        lens_trainer_step(t, 1e-3f, 0.01f, 1.0f);
        if (s == 0) loss_first = loss;
        tokens += (double)n, padded += (double)batch * longest;
    }
    const double sec = now_s() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"impl\":\"lensd\",\"steps\":%d,\"warmup\":%d,\"batch\":%d,\"threads\":%d,\"params\":%zu,"
           "\"seconds\":%.3f,\"real_tokens\":%.0f,\"padded_tokens\":%.0f,\"tokens_per_s\":%.0f,"
           "\"padded_tokens_per_s\":%.0f,\"steps_per_s\":%.2f,\"loss_first\":%.4f,\"loss_last\":%.4f,"
           "\"maxrss_kib\":%ld,\"blas_core\":\"%s\"}\n",
           steps, warmup, batch, threads, n_params, sec, tokens, padded, tokens / sec, padded / sec, steps / sec,
           loss_first, loss, ru.ru_maxrss, lens_blas_core());
    lens_trainer_free(t);
    lens_tokenizer_free(tok);
    free(ids), free(lengths), free(y), free(order);
    free(d.ids), free(d.start), free(d.len), free(d.label);
    return 0;
}
