/* train_loop.c - shuffle, learning-rate schedule and progress meter of the
 * training loops (train_loop.h). */
#include "train_loop.h"

#include <stdint.h>
#include <stdio.h>
#include <time.h>

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
