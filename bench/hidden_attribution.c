/* hidden_attribution.c - benchmark driver: hidden token attribution
 * (Brunner et al. 2020, core/analysis/hidden_attribution.h) over every layer of one
 * sequence.
 *
 *   hidden_attribution --model DIR [--method exact|estimate] [--probes 16] [--T 32]
 *                      [--threads 1] [--reps 5] [--warmup 1] [--seed 42] [--dump FILE]
 *
 * Times lens_hidden_attribution for layers 1..L (one primal pass from h^0,
 * then the T*C one-hot tangents (exact) or T*P Rademacher probes (estimate)
 * pushed through all layers by forward mode), median of --reps after
 * --warmup runs. Token ids: xorshift32 from --seed, id = x mod V
 * (bench/peer/hta_torch.py draws the same). Threads: a lens_pool of
 * --threads (lens_hta_opts.pool: the tangent GEMMs and the per-token work),
 * OpenBLAS at one thread (core/base/pool.h). --dump writes the contributions c^l_{j,i} as
 * float32 [L][T][T] for the agreement check against PyTorch.
 * Prints one JSON line (ms_median, ms_min, maxrss_kib, tangents, ...). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench/bench.h"
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/analysis/hidden_attribution.h"
#include "core/model/model.h"
#include "core/base/pool.h"

static int dump_contrib(const char *path, const lens_hta_result *r)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const size_t TT = (size_t)r->T * r->T;
    int bad = 0;
    for (int l = 0; l < r->n_layers; l++) bad |= fwrite(r->layers[l].contrib, sizeof(float), TT, f) != TT;
    return fclose(f) || bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *dir = NULL, *dump = NULL;
    int T = 32, threads = 1, reps = 5, warmup = 1, probes = 16;
    unsigned seed = 42;
    lens_hta_method method = LENS_HTA_EXACT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "hidden_attribution: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--T")) T = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--probes")) probes = atoi(v);
        else if (!strcmp(a, "--seed")) seed = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--dump")) dump = v;
        else if (!strcmp(a, "--method")) method = !strcmp(v, "estimate") ? LENS_HTA_ESTIMATE : LENS_HTA_EXACT;
        else {
            fprintf(stderr, "usage: hidden_attribution --model DIR [--method exact|estimate] [--probes 16] [--T 32]\n"
                            "         [--threads 1] [--reps 5] [--warmup 1] [--seed 42] [--dump FILE]\n");
            return 2;
        }
        i++;
    }
    if (!dir || T < 1 || threads < 1 || reps < 1 || warmup < 0 || probes < 2) {
        fprintf(stderr, "hidden_attribution: --model is required; T, threads, reps >= 1, probes >= 2\n");
        return 2;
    }
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "hidden_attribution: %s\n", err.msg);
        return 1;
    }
    /* core/base/pool.h: the passes run on a lens_pool of --threads, OpenBLAS at one thread */
    lens_blas_set_threads(1);
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
    int *ids = malloc(sizeof(int) * T);
    double *times = malloc(sizeof(double) * reps);
    bench_random_ids(ids, (size_t)T, m, seed);
    const lens_hta_opts o = {.method = method, .probes = probes, .pool = pool};
    lens_hta_result res = {0};
    for (int r = -warmup; r < reps; r++) {
        lens_hta_result_free(&res);
        const double start = now_ms();
        if (lens_hidden_attribution(m, ids, NULL, T, &o, &res, &err)) {
            fprintf(stderr, "hidden_attribution: %s\n", err.msg);
            return 1;
        }
        if (r >= 0) times[r] = now_ms() - start;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    qsort(times, reps, sizeof *times, cmp_double);
    if (dump && dump_contrib(dump, &res)) {
        fprintf(stderr, "hidden_attribution: cannot write %s\n", dump);
        return 1;
    }
    /* quality of the estimate: median over entries of stderr / norm2 in the last layer */
    double rel_stderr = 0;
    const lens_hta_layer *last = &res.layers[res.n_layers - 1];
    if (method == LENS_HTA_ESTIMATE) {
        const size_t TT = (size_t)T * T;
        double *rel = malloc(sizeof(double) * TT);
        for (size_t e = 0; e < TT; e++) rel[e] = last->norm2[e] > 0 ? last->norm2_stderr[e] / last->norm2[e] : 0;
        qsort(rel, TT, sizeof *rel, cmp_double);
        rel_stderr = rel[TT / 2];
        free(rel);
    }
    double self_mean = 0;
    for (int j = 0; j < T; j++) self_mean += last->self[j] / T;
    const int P = method == LENS_HTA_EXACT ? m->cfg.d_model : probes;
    printf("{\"impl\":\"lensd\",\"method\":\"%s\",\"model\":\"%s\",\"T\":%d,\"C\":%d,\"L\":%d,\"probes\":%d,"
           "\"tangents\":%d,\"threads\":%d,\"reps\":%d,\"ms_median\":%.1f,\"ms_min\":%.1f,\"maxrss_kib\":%ld,"
           "\"flops\":%.6g,\"last_layer_self_mean\":%.6g,\"median_rel_stderr\":%.4g,\"blas_core\":\"%s\"}\n",
           method == LENS_HTA_EXACT ? "exact" : "estimate", dir, T, m->cfg.d_model, m->cfg.n_layers,
           method == LENS_HTA_EXACT ? 0 : probes, T * P, threads, reps, times[reps / 2], times[0], ru.ru_maxrss,
           lens_hta_flops(m, T, m->cfg.n_layers, method, probes), self_mean, rel_stderr, lens_blas_core());
    lens_hta_result_free(&res);
    free(ids), free(times);
    lens_pool_free(pool);
    lens_model_free(m);
    return 0;
}
