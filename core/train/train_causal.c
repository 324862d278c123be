/* train_causal.c - `lensd train causal`: causal-LM training of any family
 * with a causal-LM head (GPT-2, Llama, Mistral, Qwen2/3, Gemma 1/2,
 * GPT-NeoX: --init a checkpoint, or a new model of --arch) around a
 * lens_trainer (model, backward and checkpoints in train.c).
 *
 * Data: plain text. Each line (with its newline) is tokenized by the
 * tokenizer of --vocab (or --init), the ids of all lines are
 * concatenated and cut into windows of max_len tokens (a last shorter window
 * is kept when it has at least 2 tokens). A window of T tokens gives T - 1
 * next-token predictions, as HF's run_clm (group_texts + shifted labels); the
 * loss is their mean over a batch of windows, the dev loss their mean over
 * all dev windows, perplexity = exp(dev loss).
 *
 * Schedule as `train classify`: AdamW, linear warm-up over warmup * total
 * steps, then linear decay to 0, clipping to a global norm, a seeded shuffle
 * of the windows per epoch; out_dir/trainer_state.json makes a run
 * resumable at the exact batch. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model/arch.h"
#include "core/io/tokenizer.h"
#include "core/train/train.h"
#include "core/train/train_loop.h"

typedef struct {
    int *ids;        /* [n_tokens] the whole text */
    size_t n_tokens;
    int n_windows;   /* window w = ids[w * len .. + window_len(w)) */
    int len;         /* max_len */
} token_stream;

static int window_len(const token_stream *d, int w)
{
    const size_t start = (size_t)w * d->len, left = d->n_tokens - start;
    return left < (size_t)d->len ? (int)left : d->len;
}

static int load_text(const char *path, const lens_tokenizer *tok, int max_len, token_stream *d, lens_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return lens_fail(err, LENS_ENOENT, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, cap_tokens = 0;
    ssize_t n_bytes;
    int rc = 0, lineno = 0;
    while ((n_bytes = getline(&line, &cap, f)) > 0) {
        lineno++;
        lens_token *toks;
        int n;
        lens_err tok_err;
        if (lens_tokenize(tok, line, (size_t)n_bytes, NULL, 0, &toks, &n, &tok_err)) {
            rc = lens_fail(err, tok_err.code, "%s:%d: %s", path, lineno, tok_err.msg);
            break;
        }
        while (d->n_tokens + (size_t)n > cap_tokens) {
            cap_tokens = cap_tokens ? 2 * cap_tokens : 1 << 16;
            int *ids = realloc(d->ids, sizeof *ids * cap_tokens);
            if (!ids) break;
            d->ids = ids;
        }
        if (d->n_tokens + (size_t)n > cap_tokens) {
            free(toks);
            rc = lens_fail(err, LENS_ENOMEM, "out of memory reading %s", path);
            break;
        }
        for (int i = 0; i < n; i++) d->ids[d->n_tokens++] = toks[i].id;
        free(toks);
    }
    free(line);
    fclose(f);
    if (rc) return rc;
    d->len = max_len;
    d->n_windows = (int)(d->n_tokens / (size_t)max_len) + (d->n_tokens % (size_t)max_len >= 2);
    if (!d->n_windows) return lens_fail(err, LENS_EFORMAT, "%s: fewer than 2 tokens", path);
    return 0;
}

/* Packs windows order[from..to) into ids / lengths. */
static void gather(const token_stream *d, const int *order, int from, int to, int *ids, int *lengths)
{
    size_t n = 0;
    for (int i = from; i < to; i++) {
        const int w = order ? order[i] : i, T = window_len(d, w);
        memcpy(ids + n, d->ids + (size_t)w * d->len, sizeof(int) * T);
        n += (size_t)T;
        lengths[i - from] = T;
    }
}

/* Mean next-token loss over every prediction of the dev windows. */
static float evaluate(lens_trainer *t, const token_stream *d, int *ids, int *lengths, int batch, lens_err *err)
{
    double sum = 0;
    long n = 0;
    for (int from = 0; from < d->n_windows; from += batch) {
        const int to = from + batch < d->n_windows ? from + batch : d->n_windows;
        gather(d, NULL, from, to, ids, lengths);
        const lens_batch b = {.n_seqs = to - from, .lengths = lengths, .ids = ids};
        float loss;
        int m;
        if (lens_trainer_causal_batch(t, &b, 0, &loss, &m, NULL, err)) return -1;
        sum += (double)loss * m, n += m;
    }
    return n ? (float)(sum / n) : 0;
}

int lens_train_causal(const lens_train_opts *o, lens_train_result *res, lens_err *err)
{
    const char *tok_dir = o->init_dir ? o->init_dir : o->vocab_dir;
    if (!o->train_path || !o->out_dir || !tok_dir)
        return lens_fail(err, LENS_EINVAL, "train causal needs --train, --out and --vocab or --init");
    lens_tokenizer *tok = lens_tokenizer_load(tok_dir, err);
    if (!tok) return -1;
    lens_config cfg = {0};
    token_stream train = {0}, dev = {0};
    lens_trainer *t = NULL;
    int *order = NULL, *ids = NULL, *lengths = NULL, rc = -1;
    char path[4096];
    if (o->init_dir) {
        snprintf(path, sizeof path, "%s/config.json", o->init_dir);
        if (lens_config_load(path, &cfg, err)) goto done;
        if (!cfg.family->task_archs[LENS_TASK_CAUSAL_LM]) {
            lens_fail(err, LENS_EINVAL, "%s: %s has no causal-LM head to train", o->init_dir, cfg.family->model_type);
            goto done;
        }
        cfg.task = LENS_TASK_CAUSAL_LM;
    } else if (lens_train_new_config(o, LENS_TASK_CAUSAL_LM, tok, &cfg, err)) {
        goto done;
    }
    const int max_len = o->max_len && o->max_len < cfg.max_positions ? o->max_len : cfg.max_positions;
    if (max_len < 2) {
        lens_fail(err, LENS_EINVAL, "windows need at least 2 tokens");
        goto done;
    }
    if (load_text(o->train_path, tok, max_len, &train, err)) goto done;
    if (o->dev_path && load_text(o->dev_path, tok, max_len, &dev, err)) goto done;
    if (!(t = lens_trainer_new(&cfg, o->seed, err))) goto done;
    const int B = o->batch_size > 0 ? o->batch_size : 8;
    lens_train_loop loop;
    if (lens_train_loop_begin(&loop, t, o, tok_dir, (train.n_windows + B - 1) / B, err)) goto done;
    size_t n_param;
    lens_trainer_params(t, &n_param);
    fprintf(stderr,
            "train: %zu tokens in %d windows of %d, dev %zu tokens in %d; %s L%d C%d heads %d FF %d V %d, "
            "%zu parameters; %ld steps of %d windows\n",
            train.n_tokens, train.n_windows, max_len, dev.n_tokens, dev.n_windows, cfg.family->model_type, cfg.n_layers, cfg.d_model,
            cfg.n_heads, cfg.d_ff, cfg.vocab_size, n_param, loop.total, B);
    order = malloc(sizeof(int) * train.n_windows);
    ids = malloc(sizeof(int) * (size_t)B * max_len);
    lengths = malloc(sizeof(int) * B);
    if (!order || !ids || !lengths) {
        lens_fail(err, LENS_ENOMEM, "out of memory");
        goto done;
    }
    float dev_loss = -1;
    for (int epoch = (int)(loop.step / loop.steps_per_epoch); loop.step < loop.total; epoch++) {
        lens_train_shuffle(order, train.n_windows, o->seed, epoch);
        for (long i = loop.step - epoch * loop.steps_per_epoch; i < loop.steps_per_epoch && loop.step < loop.total;
             i++) {
            const int from = (int)(i * B), to = from + B < train.n_windows ? from + B : train.n_windows;
            gather(&train, order, from, to, ids, lengths);
            const lens_batch b = {.n_seqs = to - from, .lengths = lengths, .ids = ids};
            float loss;
            lens_trainer_zero_grad(t);
            if (lens_trainer_causal_batch(t, &b, 1, &loss, NULL, NULL, err) ||
                lens_train_loop_step(&loop, epoch, loss, &b, err))
                goto done;
        }
        const double eval_start = lens_train_now();
        if (dev.n_windows) {
            dev_loss = evaluate(t, &dev, ids, lengths, B, err);
            if (dev_loss < 0) goto done;
            fprintf(stderr, "epoch %d: dev loss %.4f perplexity %.2f (%zu tokens, %d windows)\n", epoch + 1,
                    dev_loss, exp(dev_loss), dev.n_tokens, dev.n_windows);
        }
        if (lens_train_loop_end_epoch(&loop, epoch, "dev_loss", dev_loss, eval_start, err)) goto done;
    }
    if (res) {
        res->train_loss = (float)loop.meter.loss_avg, res->dev_loss = dev_loss, res->dev_accuracy = -1;
        res->steps = loop.step, res->tokens_per_s = (float)lens_train_meter_rate(&loop.meter);
    }
    rc = 0;
done:
    lens_config_free(&cfg);
    lens_trainer_free(t);
    lens_tokenizer_free(tok);
    free(train.ids), free(dev.ids);
    free(order), free(ids), free(lengths);
    return rc;
}
