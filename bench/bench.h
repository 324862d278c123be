/* bench.h - what the benchmark drivers share: a monotonic clock, the
 * xorshift32 token ids the PyTorch peers in bench/peer draw too, medians,
 * peak RSS and the random checkpoint a driver writes once. */
#ifndef LENS_BENCH_H
#define LENS_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/model/mkmodel.h"
#include "core/model/model.h"

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* CPU time of the whole process (every thread): on a loaded machine the
 * comparable figure for a 1-thread run, since wall time counts the slices
 * other processes took. */
static inline double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static inline uint32_t xorshift32(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

/* n token ids as every driver and its PyTorch peer draw them: xorshift32
 * seeded with seed (0: 1), id = x mod V */
static inline void bench_random_ids(int *ids, size_t n, const lens_model *m, uint32_t seed)
{
    uint32_t state = seed ? seed : 1;
    for (size_t i = 0; i < n; i++) ids[i] = (int)(xorshift32(&state) % (uint32_t)m->cfg.vocab_size);
}

static inline int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* sorts v */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline long maxrss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss; /* Linux: KiB */
}

/* This process' anonymous memory in transparent huge pages, KiB (-1 when
 * /proc/self/smaps_rollup is not readable): lensd asks for them for its
 * packed weights, and the kernel may not have them to give. */
static inline long anon_huge_kib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

/* The checkpoint in dir, written first with lens_mkmodel(arch, preset,
 * task, seed 42) when dir has no config.json; NULL with a message on
 * stderr prefixed by who. *model_mib (may be NULL): model.safetensors' size. */
static inline lens_model *bench_model(const char *who, const char *dir, const char *arch, const char *preset,
                                      const char *task, double *model_mib)
{
    lens_err err = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) != 0) {
        char cmd[1100];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        if (system(cmd) != 0 || lens_mkmodel(arch, preset, task, 42, dir, &err)) {
            fprintf(stderr, "%s: mkmodel %s: %s\n", who, dir, err.msg);
            return NULL;
        }
    }
    lens_model *m = lens_model_load(dir, &err);
    if (!m) fprintf(stderr, "%s: %s\n", who, err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat st;
    if (model_mib) *model_mib = stat(path, &st) == 0 ? st.st_size / 1048576.0 : 0;
    return m;
}

#endif
