/* train_loop.h - what the training loops of train_classify.c (classify, mlm)
 * and train_causal.c (causal) share: the per-epoch shuffle, the
 * learning-rate schedule, the progress meter and the bookkeeping around each
 * step (initial weights, resume, optimiser step, checkpoints). Internal to
 * core/. */
#ifndef LENS_TRAIN_LOOP_H
#define LENS_TRAIN_LOOP_H

#include "core/io/tokenizer.h"
#include "core/train/train.h"

/* order = a permutation of 0..n-1, fixed by (seed, epoch). */
void lens_train_shuffle(int *order, int n, unsigned long long seed, int epoch);

/* Linear warm-up over the first `warmup` steps, then linear decay to 0 at `total`. */
float lens_train_lr(float lr, long step, long warmup, long total);

/* Tokens/s (evaluation time left out), a smoothed loss and a progress line
 * on stderr every 5 s and at the last step. */
typedef struct {
    double t0, last_print, paused; /* paused: seconds spent outside steps (evaluation) */
    double tokens, loss_avg;
    long steps;
} lens_train_meter;

double lens_train_now(void);
void lens_train_meter_start(lens_train_meter *m);
void lens_train_meter_step(lens_train_meter *m, long step, long total, int epoch, float loss, float lr, long tokens);
double lens_train_meter_rate(const lens_train_meter *m);

/* A new model's config for task: o->arch's defaults (the family's
 * new_config), o's shape (layers, hidden, heads, ff, max_len, head sizes,
 * head combination, scale), the vocabulary of tok, RoPE over whole heads
 * when the family rotates. It is written as o->out_dir/config.json and read
 * back, so the trainer sees what a reload of its checkpoint will (values the
 * loader derives, such as Gemma's embedding scale). Free with
 * lens_config_free. */
int lens_train_new_config(const lens_train_opts *o, lens_task task, const lens_tokenizer *tok, lens_config *c,
                          lens_err *err);

/* One run: trainer t, options o, tokenizer files copied from tok_dir into
 * every checkpoint. step counts optimiser steps (resumed with o->resume);
 * total = epochs * steps_per_epoch, capped by o->max_steps. */
typedef struct {
    lens_trainer *t;
    const lens_train_opts *o;
    const char *tok_dir;
    long step, total, warmup, steps_per_epoch;
    lens_train_meter meter;
} lens_train_loop;

/* Gives the trainer o->threads forward threads, loads o->init_dir's
 * weights (if set), then with o->resume out_dir's weights and step; fixes
 * the schedule and starts the meter. */
int lens_train_loop_begin(lens_train_loop *l, lens_trainer *t, const lens_train_opts *o, const char *tok_dir,
                          long steps_per_epoch, lens_err *err);

/* After batch b's gradients (mean loss `loss`): the AdamW step at the
 * scheduled rate, the meter, and a checkpoint every o->save_every steps. */
int lens_train_loop_step(lens_train_loop *l, int epoch, float loss, const lens_batch *b, lens_err *err);

/* The end-of-epoch checkpoint with `"metric": value` in its trainer state;
 * the time since eval_start (evaluation, saving) is left out of tokens/s. */
int lens_train_loop_end_epoch(lens_train_loop *l, int epoch, const char *metric, float value, double eval_start,
                              lens_err *err);

#endif
