/* patching.c - benchmark driver: the full activation-patching grid
 * (residual stream x positions, and every head) on a GPT-2-small-shape
 * causal LM (core/analysis/patching.h).
 *
 *   patching [--model DIR] [--T 32] [--threads 2] [--reps 1] [--seed 42]
 *            [--method exact|attribution|both] [--dump FILE]
 *
 * DIR defaults to build/bench-models/gpt2-small, written once with
 * lens_mkmodel (gpt2, base, causal-lm: L12 C768 12 heads d_ff 3072,
 * V 50257, seed 42) when it has no config.json. Clean ids: xorshift32 from
 * --seed, id = x mod V (bench/peer/patching_torch.py draws the same); the
 * corrupt ids are the clean ones with the token at T/2 replaced by
 * (id + 1) mod V. Objective: the probability of the clean run's prediction
 * at the last position. Times lens_patching_run (the clean and corrupt
 * passes and every patched run: L*T resid + L*NH heads), median of --reps;
 * prints one JSON line with ms, the process CPU ms (bench.h cpu_ms: the
 * figure to compare on a loaded machine), peak RSS (KiB) and F_clean / F_corrupt.
 * Threads: a lens_pool of --threads, OpenBLAS at one thread. --dump writes
 * the exact grids' F, float64 resid [L][T] then heads [L][NH], native-endian,
 * for bench/run.sh to compare with the peer's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/analysis/patching.h"
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/base/pool.h"

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *dir = "build/bench-models/gpt2-small", *dump = NULL, *method = "exact";
    int T = 32, threads = 2, reps = 1;
    unsigned seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "patching: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--T")) T = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--seed")) seed = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--method")) method = v;
        else if (!strcmp(a, "--dump")) dump = v;
        else {
            fprintf(stderr, "usage: patching [--model DIR] [--T 32] [--threads 2] [--reps 1] [--seed 42] "
                            "[--method exact|attribution|both] [--dump FILE]\n");
            return 2;
        }
        i++;
    }
    const unsigned methods = !strcmp(method, "attribution") ? LENS_PATCH_ATTRIBUTION
                             : !strcmp(method, "both")      ? LENS_PATCH_EXACT | LENS_PATCH_ATTRIBUTION
                             : !strcmp(method, "exact")     ? LENS_PATCH_EXACT
                                                            : 0;
    if (T < 2 || threads < 1 || reps < 1 || !methods) {
        fprintf(stderr, "patching: T >= 2, threads and reps >= 1, method exact, attribution or both\n");
        return 2;
    }
    lens_err err = {0};
    lens_model *m = bench_model("patching", dir, "gpt2", "base", "causal-lm", NULL);
    if (!m) return 1;
    lens_blas_set_threads(1);
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
    const int V = m->cfg.vocab_size;
    int *clean = malloc(sizeof(int) * T), *corrupt = malloc(sizeof(int) * T);
    uint32_t state = seed ? seed : 1;
    for (int t = 0; t < T; t++) clean[t] = corrupt[t] = (int)(xorshift32(&state) % (uint32_t)V);
    corrupt[T / 2] = (clean[T / 2] + 1) % V;
    double *times = malloc(sizeof(double) * reps), *cpu = malloc(sizeof(double) * reps);
    const lens_patching_opts o = {.grids = 1u << LENS_PATCH_RESID | 1u << LENS_PATCH_HEADS, .methods = methods,
                                  .target = -1, .pool = pool};
    lens_patching_result r = {0};
    for (int k = 0; k < reps; k++) {
        lens_patching_result_free(&r);
        const double start = now_ms(), cpu_start = cpu_ms();
        if (lens_patching_run(m, clean, corrupt, T, &o, &r, &err)) {
            fprintf(stderr, "patching: %s\n", err.msg);
            return 1;
        }
        times[k] = now_ms() - start, cpu[k] = cpu_ms() - cpu_start;
    }
    if (dump && (methods & LENS_PATCH_EXACT)) {
        FILE *f = fopen(dump, "wb");
        const lens_patching_grid *g0 = &r.grid[LENS_PATCH_RESID], *g1 = &r.grid[LENS_PATCH_HEADS];
        const int ok = f && fwrite(g0->value, sizeof(double), (size_t)g0->n, f) == (size_t)g0->n &&
                       fwrite(g1->value, sizeof(double), (size_t)g1->n, f) == (size_t)g1->n;
        if (!f || fclose(f) || !ok) {
            fprintf(stderr, "patching: cannot write %s\n", dump);
            return 1;
        }
    }
    const double ms = median(times, reps), cpu_median = median(cpu, reps);
    printf("{\"impl\":\"lensd\",\"method\":\"%s\",\"T\":%d,\"layers\":%d,\"heads\":%d,\"runs\":%d,\"threads\":%d,"
           "\"reps\":%d,\"ms_median\":%.1f,\"cpu_ms_median\":%.1f,\"maxrss_kib\":%ld,\"target\":%d,\"f_clean\":%.9g,"
           "\"f_corrupt\":%.9g}\n",
           method, T, r.n_layers, r.n_heads, r.n_layers * (T + r.n_heads), threads, reps, ms, cpu_median, maxrss_kib(),
           r.target, r.clean, r.corrupt);
    lens_patching_result_free(&r);
    free(clean), free(corrupt), free(times), free(cpu);
    lens_pool_free(pool);
    lens_model_free(m);
    return 0;
}
