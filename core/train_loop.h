/* train_loop.h - what the training loops of train_classify.c (classify, mlm)
 * and train_causal.c (causal) share: the per-epoch shuffle, the
 * learning-rate schedule and the progress meter. Internal to core/. */
#ifndef LENS_TRAIN_LOOP_H
#define LENS_TRAIN_LOOP_H

#include "train.h"

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

#endif
