/* train_loop.c - shuffle, learning-rate schedule, progress meter and step
 * bookkeeping of the training loops (train_loop.h). */
#include "core/train/train_loop.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/model/arch.h"
#include "core/model/mkmodel.h"

void lens_train_shuffle(int *order, int n, unsigned long long seed, int epoch)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch + 1;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const int j = (int)(s % (uint64_t)(i + 1));
        const int x = order[i];
        order[i] = order[j], order[j] = x;
    }
}

int lens_train_new_config(const lens_train_opts *o, lens_task task, const lens_tokenizer *tok, lens_config *c,
                          lens_err *err)
{
    const lens_family *f = o->arch ? lens_family_find(o->arch) : NULL;
    if (!f) return lens_fail(err, LENS_EINVAL, "a new model needs --arch (%s) or --init DIR", lens_family_names());
    if (o->heads < 1 || o->hidden % o->heads)
        return lens_fail(err, LENS_EINVAL, "hidden %d is not a multiple of heads %d", o->hidden, o->heads);
    lens_config fresh = {.family = f};
    int rc = lens_mkmodel_new_config(&fresh, lens_task_name(task), err);
    if (!rc) {
        fresh.n_layers = o->layers, fresh.n_heads = o->heads, fresh.d_model = o->hidden, fresh.d_ff = o->ff;
        fresh.d_head_k = o->d_head_k ? o->d_head_k : o->hidden / o->heads;
        fresh.d_head_v = o->d_head_v ? o->d_head_v : o->hidden / o->heads;
        fresh.head_combination = o->head_combination, fresh.scale_by_dv = o->scale_by_dv;
        fresh.vocab_size = lens_tokenizer_vocab_size(tok), fresh.max_positions = o->max_len;
        if (fresh.rope.theta > 0) fresh.rope.dim = fresh.d_head_k;
        lens_config_set_attn_scale(&fresh);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->out_dir);
    if (!rc && mkdir(o->out_dir, 0755) && errno != EEXIST)
        rc = lens_fail(err, LENS_EIO, "%s: %s", o->out_dir, strerror(errno));
    if (!rc) rc = lens_config_save(path, &fresh, 0, NULL, err);
    lens_config_free(&fresh);
    return rc ? rc : lens_config_load(path, c, err);
}

float lens_train_lr(float lr, long step, long warmup, long total)
{
    return step < warmup ? lr * (step + 1) / warmup : lr * (float)(total - step) / (float)(total - warmup);
}

double lens_train_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void lens_train_meter_start(lens_train_meter *m)
{
    *m = (lens_train_meter){.t0 = lens_train_now()};
    m->last_print = m->t0;
}

void lens_train_meter_step(lens_train_meter *m, long step, long total, int epoch, float loss, float lr, long tokens)
{
    m->steps++;
    m->tokens += (double)tokens;
    m->loss_avg = m->steps == 1 ? loss : 0.98 * m->loss_avg + 0.02 * loss;
    const double now = lens_train_now();
    if (now - m->last_print > 5 || step == total) {
        const double eta = (now - m->t0) / m->steps * (total - step);
        fprintf(stderr, "step %ld/%ld epoch %d loss %.4f lr %.2e %.0f tokens/s ETA %.0fs\n", step, total, epoch + 1,
                m->loss_avg, lr, lens_train_meter_rate(m), eta);
        m->last_print = now;
    }
}

double lens_train_meter_rate(const lens_train_meter *m)
{
    const double busy = lens_train_now() - m->t0 - m->paused;
    return m->steps && busy > 0 ? m->tokens / busy : 0;
}

int lens_train_loop_begin(lens_train_loop *l, lens_trainer *t, const lens_train_opts *o, const char *tok_dir,
                          long steps_per_epoch, lens_err *err)
{
    *l = (lens_train_loop){.t = t, .o = o, .tok_dir = tok_dir, .steps_per_epoch = steps_per_epoch};
    if (lens_trainer_set_threads(t, o->threads, err)) return -1;
    if (o->init_dir) {
        int n_loaded;
        if (lens_trainer_load_weights(t, o->init_dir, &n_loaded, err)) return -1;
        fprintf(stderr, "train: %d tensors from %s\n", n_loaded, o->init_dir);
    }
    if (o->resume) {
        if (lens_trainer_load_weights(t, o->out_dir, NULL, err) || lens_trainer_load_state(t, o->out_dir, &l->step, err))
            return -1;
        fprintf(stderr, "train: resuming %s at step %ld\n", o->out_dir, l->step);
    }
    l->total = (long)o->epochs * steps_per_epoch;
    if (o->max_steps && o->max_steps < l->total) l->total = o->max_steps;
    l->warmup = (long)(o->warmup * l->total);
    lens_train_meter_start(&l->meter);
    return 0;
}

int lens_train_loop_step(lens_train_loop *l, int epoch, float loss, const lens_batch *b, lens_err *err)
{
    const lens_train_opts *o = l->o;
    const float lr = lens_train_lr(o->lr, l->step, l->warmup, l->total);
    lens_trainer_step(l->t, lr, o->weight_decay, o->clip);
    l->step++;
    long n_tokens = 0;
    for (int s = 0; s < b->n_seqs; s++) n_tokens += b->lengths[s];
    lens_train_meter_step(&l->meter, l->step, l->total, epoch, loss, lr, n_tokens);
    if (!o->save_every || l->step % o->save_every) return 0;
    char extra[64];
    snprintf(extra, sizeof extra, "\"epoch\": %d", epoch);
    return lens_trainer_save(l->t, o->out_dir, l->tok_dir, 1, extra, err);
}

int lens_train_loop_end_epoch(lens_train_loop *l, int epoch, const char *metric, float value, double eval_start,
                              lens_err *err)
{
    char extra[96];
    snprintf(extra, sizeof extra, "\"epoch\": %d, \"%s\": %.4f", epoch + 1, metric, value);
    const int rc = lens_trainer_save(l->t, l->o->out_dir, l->tok_dir, 1, extra, err);
    l->meter.paused += lens_train_now() - eval_start;
    return rc;
}
