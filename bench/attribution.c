/* attribution.c - benchmark driver: self-attention attribution (Hao et al.)
 * over all layers of a BERT-base-shape classifier.
 *
 *   attribution [--model DIR] [--T 64] [--steps 20] [--threads 2] [--reps 1]
 *               [--warmup 0] [--seed 42] [--riemann right|left]
 *               [--quadrature riemann|gauss] [--dump FILE]
 *
 * DIR defaults to build/bench-models/bert-base-cls, written once with
 * lens_mkmodel (bert, base, classification: L12 C768 12 heads d_ff 3072,
 * V 30522, 2 labels, seed 42) when it has no config.json. Token ids:
 * xorshift32 from --seed, id = x mod V (bench/peer/attribution_torch.py
 * draws the same). Times lens_attribution_run over every layer (one
 * forward keeping hidden states, then per layer the m steps batched through
 * the layers above and back), median of --reps; prints one JSON line with
 * ms, peak RSS (getrusage, KiB) and the checkpoint size. Threads: a lens_pool
 * of --threads (lens_attr_opts.pool), OpenBLAS at one thread (core/base/pool.h).
 * --steps 0 takes the quadrature's default (20 Riemann steps, LENS_ATTR_GAUSS_NODES
 * Gauss nodes). --dump writes the last run's attributions, float32 [L][NH][T][T]
 * native-endian, for bench/run.sh to measure errors against a reference run. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/analysis/attribution.h"
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "core/base/pool.h"

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *dir = "build/bench-models/bert-base-cls";
    int T = 64, steps = 20, threads = 2, reps = 1, warmup = 0;
    unsigned seed = 42;
    lens_riemann riemann = LENS_RIEMANN_RIGHT;
    lens_quadrature quad = LENS_QUAD_RIEMANN;
    const char *dump = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "attribution: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--T")) T = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--seed")) seed = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--riemann")) riemann = !strcmp(v, "left") ? LENS_RIEMANN_LEFT : LENS_RIEMANN_RIGHT;
        else if (!strcmp(a, "--quadrature")) quad = !strcmp(v, "gauss") ? LENS_QUAD_GAUSS : LENS_QUAD_RIEMANN;
        else if (!strcmp(a, "--dump")) dump = v;
        else {
            fprintf(stderr, "usage: attribution [--model DIR] [--T 64] [--steps 20] [--threads 2] [--reps 1]\n");
            return 2;
        }
        i++;
    }
    if (T < 1 || steps < 0 || threads < 1 || reps < 1) {
        fprintf(stderr, "attribution: T, threads and reps must be >= 1, steps >= 0\n");
        return 2;
    }
    lens_err err = {0};
    double model_mib = 0;
    lens_model *m = bench_model("attribution", dir, "bert", "base", "classification", &model_mib);
    if (!m) return 1;
    /* core/base/pool.h: the passes run on a lens_pool of --threads, OpenBLAS at one thread */
    lens_blas_set_threads(1);
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;

    int *ids = malloc(sizeof(int) * T);
    bench_random_ids(ids, (size_t)T, m, seed);
    double *times = malloc(sizeof(double) * reps);
    lens_attr_opts o = {.steps = steps, .riemann = riemann, .quadrature = quad, .target = -1, .pool = pool};
    lens_attribution at = {0};
    for (int r = -warmup; r < reps; r++) {
        if (r > -warmup) lens_attribution_free(&at);
        const double start = now_ms();
        if (lens_attribution_run(m, ids, NULL, T, &o, &at, &err)) {
            fprintf(stderr, "attribution: %s\n", err.msg);
            return 1;
        }
        if (r >= 0) times[r] = now_ms() - start;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    qsort(times, reps, sizeof *times, cmp_double);
    double max_gap = 0;
    for (int l = 0; l < at.n_layers; l++) {
        const double gap = fabs(at.layers[l].attr_sum - (at.f_full - at.layers[l].f_zero));
        max_gap = gap > max_gap ? gap : max_gap;
    }
    if (dump) {
        FILE *f = fopen(dump, "wb");
        const size_t n = (size_t)at.n_heads * T * T;
        int ok = f != NULL;
        for (int l = 0; ok && l < at.n_layers; l++) ok = fwrite(at.layers[l].attr, sizeof(float), n, f) == n;
        if (!f || fclose(f) || !ok) {
            fprintf(stderr, "attribution: cannot write %s\n", dump);
            return 1;
        }
    }
    printf("{\"impl\":\"lensd\",\"quadrature\":\"%s\",\"T\":%d,\"steps\":%d,\"layers\":%d,\"threads\":%d,\"reps\":%d,"
           "\"ms_median\":%.1f,\"ms_min\":%.1f,\"maxrss_kib\":%ld,\"model_mib\":%.1f,"
           "\"target\":%d,\"f_full\":%.6f,\"attr_sum_layer1\":%.6g,\"max_completeness_gap\":%.3g,"
           "\"blas_core\":\"%s\"}\n",
           quad == LENS_QUAD_GAUSS ? "gauss" : "riemann", T, at.steps, at.n_layers, threads, reps, times[reps / 2], times[0], ru.ru_maxrss, model_mib, at.target,
           at.f_full, at.layers[0].attr_sum, max_gap, lens_blas_core());
    lens_attribution_free(&at);
    free(ids), free(times);
    lens_pool_free(pool);
    lens_model_free(m);
    return 0;
}
