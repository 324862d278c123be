/* train_classify.c - `lensd train classify` and `lensd train mlm`: the
 * training loop around a lens_trainer for sequence classification (BERT,
 * RoBERTa, DistilBERT) and masked-LM pre-training, of a checkpoint (--init)
 * or a new model of --arch.
 *
 * Data: TSV, one example a line, text<TAB>label (the text is everything
 * before the last tab); a first line whose label field is "label" is a
 * header. Numeric labels are ids (names from --label-names or LABEL_i);
 * other labels are names, ids in sorted order (or the order of the
 * checkpoint's id2label when fine-tuning). Texts are tokenized with the
 * checkpoint's tokenizer (its template's special tokens included) and cut
 * to max_len tokens, the template's closing token ([SEP], </s>) kept last.
 *
 * Schedule: AdamW, linear warm-up over warmup * total steps, then linear
 * decay to 0; gradient clipping to a global norm; the order of examples is a
 * seeded shuffle per epoch, so a resumed run (out_dir/trainer_state.json)
 * skips exactly the batches already seen. Dev accuracy and loss after each
 * epoch. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model/arch.h"
#include "core/train/train.h"
#include "core/train/train_loop.h"

typedef struct {
    int *ids;  /* all tokens, example i at ids + start[i] */
    size_t *start;
    int *len, *label;
    int n;
    size_t n_tokens;
} dataset;

typedef struct {
    char **names;
    int n, numeric;
} label_set;

static void dataset_free(dataset *d)
{
    free(d->ids), free(d->start), free(d->len), free(d->label);
    memset(d, 0, sizeof *d);
}

/* Splits line at its last tab into text and label (both trimmed). */
static int split_line(char *line, char **text, char **label)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    char *tab = strrchr(line, '\t');
    if (!tab) return -1;
    *tab = 0;
    *text = line, *label = tab + 1;
    while (**label == ' ') (*label)++;
    for (char *e = *label + strlen(*label); e > *label && e[-1] == ' '; e--) e[-1] = 0;
    return 0;
}

static int is_number(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

static int label_index(const label_set *ls, const char *s)
{
    if (ls->numeric) return is_number(s) ? atoi(s) : -1;
    for (int i = 0; i < ls->n; i++)
        if (!strcmp(ls->names[i], s)) return i;
    return -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Collect the label set of a file when no checkpoint defines it. */
static int scan_labels(const char *path, label_set *ls, lens_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return lens_fail(err, LENS_ENOENT, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int numeric = 1, max_id = -1, first = 1, cap_names = 0;
    while (getline(&line, &cap, f) > 0) {
        char *text, *label;
        if (split_line(line, &text, &label)) continue;
        if (first && !strcmp(label, "label")) {
            first = 0;
            continue;
        }
        first = 0;
        if (is_number(label)) max_id = atoi(label) > max_id ? atoi(label) : max_id;
        else numeric = 0;
        if (label_index(&(label_set){ls->names, ls->n, 0}, label) < 0) {
            if (ls->n == cap_names) {
                cap_names = cap_names ? 2 * cap_names : 8;
                char **names = realloc(ls->names, sizeof *names * cap_names);
                if (!names) break;
                ls->names = names;
            }
            ls->names[ls->n++] = strdup(label);
        }
    }
    free(line);
    fclose(f);
    if (numeric) {
        for (int i = 0; i < ls->n; i++) free(ls->names[i]);
        free(ls->names);
        ls->names = NULL;
        ls->n = max_id + 1, ls->numeric = 1;
    } else {
        qsort(ls->names, (size_t)ls->n, sizeof *ls->names, cmp_str);
    }
    if (ls->n < 2) return lens_fail(err, LENS_EFORMAT, "%s: fewer than 2 labels", path);
    return 0;
}

static int load_tsv(const char *path, const lens_tokenizer *tok, const label_set *ls, int max_len, int max_n,
                    dataset *d, lens_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return lens_fail(err, LENS_ENOENT, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, cap_tokens = 0;
    int cap_n = 0, first = 1, lineno = 0, rc = 0;
    while (getline(&line, &cap, f) > 0 && (!max_n || d->n < max_n)) {
        lineno++;
        char *text, *label = NULL;
        if (split_line(line, &text, &label)) {
            if (ls) continue;
            text = line; /* masked LM: a plain text line */
        }
        if (first && label && !strcmp(label, "label")) {
            first = 0;
            continue;
        }
        first = 0;
        if (!*text) continue;
        const int y = ls ? label_index(ls, label) : 0;
        if (ls && (y < 0 || y >= ls->n)) {
            rc = lens_fail(err, LENS_EFORMAT, "%s:%d: unknown label \"%s\"", path, lineno, label);
            break;
        }
        lens_token *toks;
        int n;
        if (lens_tokenize(tok, text, strlen(text), NULL, 0, &toks, &n, err)) {
            rc = -1;
            break;
        }
        if (n > max_len) { /* cut, keeping the template's closing token ([SEP], </s>) */
            if (toks[n - 1].special) toks[max_len - 1] = toks[n - 1];
            n = max_len;
        }
        if (d->n == cap_n) {
            cap_n = cap_n ? 2 * cap_n : 1024;
            d->start = realloc(d->start, sizeof *d->start * cap_n);
            d->len = realloc(d->len, sizeof *d->len * cap_n);
            d->label = realloc(d->label, sizeof *d->label * cap_n);
        }
        while (d->n_tokens + (size_t)n > cap_tokens) {
            cap_tokens = cap_tokens ? 2 * cap_tokens : 65536;
            d->ids = realloc(d->ids, sizeof *d->ids * cap_tokens);
        }
        if (!d->start || !d->len || !d->label || !d->ids) {
            free(toks);
            rc = lens_fail(err, LENS_ENOMEM, "out of memory reading %s", path);
            break;
        }
        d->start[d->n] = d->n_tokens, d->len[d->n] = n, d->label[d->n] = y;
        for (int i = 0; i < n; i++) d->ids[d->n_tokens + i] = toks[i].id;
        d->n_tokens += (size_t)n;
        d->n++;
        free(toks);
    }
    free(line);
    fclose(f);
    if (!rc && d->n == 0) rc = lens_fail(err, LENS_EFORMAT, "%s: no examples", path);
    return rc;
}

/* Packs examples order[from..to) into ids / lengths / labels. */
static void gather(const dataset *d, const int *order, int from, int to, int *ids, int *lengths, int *labels)
{
    size_t n = 0;
    for (int i = from; i < to; i++) {
        const int e = order ? order[i] : i;
        memcpy(ids + n, d->ids + d->start[e], sizeof(int) * d->len[e]);
        n += (size_t)d->len[e];
        lengths[i - from] = d->len[e], labels[i - from] = d->label[e];
    }
}

static float evaluate(lens_trainer *t, const dataset *d, int *ids, int *lengths, int *labels, float *logits,
                      int batch, float *loss_out)
{
    const int K = lens_trainer_config(t)->n_labels;
    int correct = 0;
    double loss_sum = 0;
    for (int from = 0; from < d->n; from += batch) {
        const int to = from + batch < d->n ? from + batch : d->n;
        gather(d, NULL, from, to, ids, lengths, labels);
        const lens_batch b = {.n_seqs = to - from, .lengths = lengths, .ids = ids};
        float loss;
        lens_err err;
        if (lens_trainer_batch(t, &b, labels, 0, &loss, logits, &err)) return -1;
        loss_sum += (double)loss * (to - from);
        for (int s = 0; s < to - from; s++) {
            int best = 0;
            for (int j = 1; j < K; j++)
                if (logits[s * K + j] > logits[s * K + best]) best = j;
            correct += best == labels[s];
        }
    }
    if (loss_out) *loss_out = (float)(loss_sum / d->n);
    return (float)correct / d->n;
}

/* The mask token of a WordPiece ([MASK]) or byte-level BPE (<mask>)
 * vocabulary, or -1. */
static int mask_id(const lens_tokenizer *tok)
{
    const int wordpiece = lens_tokenizer_id(tok, "[MASK]");
    return wordpiece >= 0 ? wordpiece : lens_tokenizer_id(tok, "<mask>");
}

/* BERT masking of the packed ids [n] (special tokens never chosen): each
 * other token is predicted with probability 0.15; a predicted token becomes
 * the mask token (80 %), a random id (10 %) or stays (10 %). targets[i] =
 * the original id or -1. Returns the number predicted. */
static int mask_tokens(int *ids, int *targets, size_t n, const lens_tokenizer *tok, int vocab, uint64_t *s)
{
    const int mask = mask_id(tok);
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        targets[i] = -1;
        if (lens_tokenizer_is_special(tok, ids[i])) continue;
        *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
        const double r = (*s >> 11) * (1.0 / 9007199254740992.0);
        if (r >= 0.15) continue;
        targets[i] = ids[i], m++;
        if (r < 0.12) ids[i] = mask;
        else if (r < 0.135) ids[i] = (int)(*s % (uint64_t)vocab);
    }
    return m;
}

/* Mean masked-LM loss over the dev set with a fixed masking seed. */
static float evaluate_mlm(lens_trainer *t, const dataset *d, const lens_tokenizer *tok, int *ids, int *lengths,
                          int *targets, int batch)
{
    uint64_t s = 0x5EED;
    double sum = 0;
    long n = 0;
    for (int from = 0; from < d->n; from += batch) {
        const int to = from + batch < d->n ? from + batch : d->n;
        int *labels = targets; /* gather writes labels; overwritten by mask_tokens */
        gather(d, NULL, from, to, ids, lengths, labels);
        size_t N = 0;
        for (int i = 0; i < to - from; i++) N += (size_t)lengths[i];
        mask_tokens(ids, targets, N, tok, lens_trainer_config(t)->vocab_size, &s);
        const lens_batch b = {.n_seqs = to - from, .lengths = lengths, .ids = ids};
        float loss;
        int m;
        lens_err err;
        if (lens_trainer_mlm_batch(t, &b, targets, 0, &loss, &m, &err)) return -1;
        sum += (double)loss * m, n += m;
    }
    return n ? (float)(sum / n) : 0;
}

void lens_train_opts_default(lens_train_opts *o)
{
    *o = (lens_train_opts){.layers = 2, .hidden = 128, .heads = 2, .ff = 512, .max_len = 64, .epochs = 1,
                           .batch_size = 32, .lr = 1e-3f, .warmup = 0.06f, .weight_decay = 0.01f,
                           .clip = 1.0f, .seed = 1, .threads = 1};
}

/* Label names for numeric labels: --label-names "a,b" or LABEL_i. */
static int name_numeric_labels(label_set *ls, const char *names, lens_err *err)
{
    ls->names = calloc((size_t)ls->n, sizeof *ls->names);
    if (!ls->names) return lens_fail(err, LENS_ENOMEM, "out of memory");
    const char *p = names;
    for (int i = 0; i < ls->n; i++) {
        char buf[64];
        if (p && *p) {
            size_t n = strcspn(p, ",");
            snprintf(buf, sizeof buf, "%.*s", (int)(n < 63 ? n : 63), p);
            p += n + (p[n] == ',');
        } else {
            snprintf(buf, sizeof buf, "LABEL_%d", i);
        }
        ls->names[i] = strdup(buf);
    }
    return 0;
}

int lens_train_classify(const lens_train_opts *o, lens_train_result *res, lens_err *err)
{
    const char *tok_dir = o->init_dir ? o->init_dir : o->vocab_dir;
    if (!o->train_path || !o->out_dir || !tok_dir)
        return lens_fail(err, LENS_EINVAL, "train classify needs --train, --out and --init or --vocab");
    lens_tokenizer *tok = lens_tokenizer_load(tok_dir, err);
    if (!tok) return -1;
    label_set ls = {0};
    lens_config cfg = {0}, init_cfg = {0};
    dataset train = {0}, dev = {0};
    lens_trainer *t = NULL;
    int *order = NULL, *ids = NULL, *lengths = NULL, *labels = NULL, rc = -1;
    float *logits = NULL;
    char path[4096];
    const lens_task task = o->masked_lm ? LENS_TASK_MASKED_LM : LENS_TASK_CLASSIFICATION;
    if (o->init_dir) {
        snprintf(path, sizeof path, "%s/config.json", o->init_dir);
        if (lens_config_load(path, &init_cfg, err)) goto done;
        if (!init_cfg.family->task_archs[task]) {
            lens_fail(err, LENS_EINVAL, "%s: %s has no %s head to train", o->init_dir, init_cfg.family->model_type,
                      lens_task_name(task));
            goto done;
        }
    } else if (lens_train_new_config(o, task, tok, &init_cfg, err)) {
        goto done;
    }
    if (o->masked_lm) {
        /* no labels */
    } else if (o->init_dir && init_cfg.task == LENS_TASK_CLASSIFICATION && init_cfg.labels) {
        ls.names = init_cfg.labels, ls.n = init_cfg.n_labels;
        label_set probe = {0};
        if (scan_labels(o->train_path, &probe, err)) goto done;
        ls.numeric = probe.numeric;
        for (int i = 0; i < probe.n && probe.names; i++) free(probe.names[i]);
        free(probe.names);
    } else {
        if (scan_labels(o->train_path, &ls, err)) goto done;
        if (ls.numeric && name_numeric_labels(&ls, o->label_names, err)) goto done;
    }
    cfg = init_cfg;
    cfg.task = task;
    cfg.n_labels = ls.n, cfg.labels = ls.names; /* borrowed: lens_trainer_new copies */
    if (o->masked_lm) cfg.n_labels = 0, cfg.labels = NULL;
    if (o->masked_lm && mask_id(tok) < 0) {
        lens_fail(err, LENS_EINVAL, "%s: the tokenizer has no [MASK] or <mask> token", tok_dir);
        goto done;
    }
    const int max_len = o->max_len && o->max_len < cfg.max_positions ? o->max_len : cfg.max_positions;
    const label_set *lsp = o->masked_lm ? NULL : &ls;
    if (load_tsv(o->train_path, tok, lsp, max_len, o->max_train, &train, err)) goto done;
    if (o->dev_path && load_tsv(o->dev_path, tok, lsp, max_len, 0, &dev, err)) goto done;
    if (!(t = lens_trainer_new(&cfg, o->seed, err))) goto done;
    const int B = o->batch_size > 0 ? o->batch_size : 32, K = cfg.n_labels > 0 ? cfg.n_labels : 1;
    const int eval_batch = 64 > B ? 64 : B;
    lens_train_loop loop;
    if (lens_train_loop_begin(&loop, t, o, tok_dir, (train.n + B - 1) / B, err)) goto done;
    size_t n_param;
    lens_trainer_params(t, &n_param);
    if (cfg.head_combination) /* the trainer holds W_O tiled NH times; the model has one copy */
        n_param -= (size_t)cfg.n_layers * cfg.d_model * (cfg.n_heads - 1) * cfg.d_head_v;
    fprintf(stderr,
            "train: %d examples (%zu tokens), dev %d; L%d H%d heads %d DK %d DV %d (%s), %zu parameters; "
            "%ld steps of %d\n",
            train.n, train.n_tokens, dev.n, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head_k, cfg.d_head_v,
            lens_head_combination_name(cfg.head_combination), n_param, loop.total, B);
    order = malloc(sizeof(int) * train.n);
    ids = malloc(sizeof(int) * (size_t)eval_batch * max_len);
    lengths = malloc(sizeof(int) * eval_batch);
    labels = malloc(sizeof(int) * (size_t)eval_batch * max_len); /* masked LM: targets [N] */
    logits = malloc(sizeof(float) * eval_batch * K);
    if (!order || !ids || !lengths || !labels || !logits) {
        lens_fail(err, LENS_ENOMEM, "out of memory");
        goto done;
    }
    float dev_acc = -1, dev_loss = -1;
    for (int epoch = (int)(loop.step / loop.steps_per_epoch); loop.step < loop.total; epoch++) {
        lens_train_shuffle(order, train.n, o->seed, epoch);
        for (long i = loop.step - epoch * loop.steps_per_epoch; i < loop.steps_per_epoch && loop.step < loop.total;
             i++) {
            const int from = (int)(i * B), to = from + B < train.n ? from + B : train.n;
            gather(&train, order, from, to, ids, lengths, labels);
            const lens_batch b = {.n_seqs = to - from, .lengths = lengths, .ids = ids};
            float loss;
            lens_trainer_zero_grad(t);
            if (o->masked_lm) {
                size_t n = 0;
                for (int s = 0; s < b.n_seqs; s++) n += (size_t)lengths[s];
                uint64_t ms = o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)loop.step * 0xBF58476D1CE4E5B9ull + 1;
                mask_tokens(ids, labels, n, tok, cfg.vocab_size, &ms);
                if (lens_trainer_mlm_batch(t, &b, labels, 1, &loss, NULL, err)) goto done;
            } else if (lens_trainer_batch(t, &b, labels, 1, &loss, NULL, err)) {
                goto done;
            }
            if (lens_train_loop_step(&loop, epoch, loss, &b, err)) goto done;
        }
        const double eval_start = lens_train_now();
        if (dev.n && o->masked_lm) {
            dev_loss = evaluate_mlm(t, &dev, tok, ids, lengths, labels, eval_batch);
            dev_acc = dev_loss;
            fprintf(stderr, "epoch %d: dev masked-LM loss %.4f perplexity %.1f (%d texts)\n", epoch + 1, dev_loss,
                    exp(dev_loss), dev.n);
        } else if (dev.n) {
            dev_acc = evaluate(t, &dev, ids, lengths, labels, logits, eval_batch, &dev_loss);
            fprintf(stderr, "epoch %d: dev accuracy %.4f loss %.4f (%d examples)\n", epoch + 1, dev_acc, dev_loss,
                    dev.n);
        }
        if (lens_train_loop_end_epoch(&loop, epoch, o->masked_lm ? "dev_mlm_loss" : "dev_accuracy", dev_acc,
                                      eval_start, err))
            goto done;
    }
    if (res) {
        res->train_loss = (float)loop.meter.loss_avg, res->dev_accuracy = dev_acc, res->dev_loss = dev_loss;
        res->steps = loop.step, res->tokens_per_s = (float)lens_train_meter_rate(&loop.meter);
    }
    rc = 0;
done:
    if (ls.names != init_cfg.labels) {
        for (int i = 0; i < ls.n && ls.names; i++) free(ls.names[i]);
        free(ls.names);
    }
    lens_config_free(&init_cfg);
    lens_trainer_free(t);
    lens_tokenizer_free(tok);
    dataset_free(&train), dataset_free(&dev);
    free(order), free(ids), free(lengths), free(labels), free(logits);
    return rc;
}
