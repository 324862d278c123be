/* context_mixing.c - benchmark driver: context mixing (attention rollout,
 * ALTI, GlobEnc, value zeroing, DecompX; core/analysis/context_mixing.h)
 * against the forward pass they ride on.
 *
 *   context_mixing --model DIR [--T 128] [--threads 2] [--reps 5] [--vz-reps 1]
 *                  [--warmup 1] [--seed 42]
 *   context_mixing --decompx FILE --model CLASSIFIER [--T 128] [--threads 2]
 *                  [--reps 1] [--warmup 1] [--seed 42]
 *
 * Per rep, interleaved so that a change of load hits all alike: the bare
 * lens_forward (nothing kept), then lens_context_mixing with rollout, ALTI
 * and GlobEnc (paper-code, every layer); then --vz-reps runs of value
 * zeroing (T + 1 layer passes per layer: the slow one). One lens_pool of
 * --threads, OpenBLAS at one thread. Token ids: xorshift32 from --seed, id =
 * x mod V (bench/peer/context_mixing_torch.py draws the same). Prints one
 * JSON line with the medians (ms) and each method's ratio to the forward.
 *
 * --decompx: --warmup + --reps bare forwards, then --reps runs of DecompX
 * (paper-code, every layer and the classifier; T² vectors through every
 * layer, so no warm-up run of it), the last one's contributions [L][T][T],
 * rollout [L][T][T] and classifier [T][K] written to FILE as float32 for the
 * comparison with the PyTorch peer's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/analysis/context_mixing.h"
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/base/pool.h"
#include "core/model/model.h"

/* One lens_forward, nothing kept; ms or -1. */
static double time_forward(const lens_model *m, const lens_batch *b, lens_pool *pool)
{
    lens_forward_opts fo = {.pool = pool};
    lens_activations act = {0};
    lens_err err = {0};
    const double start = now_ms();
    const int rc = lens_forward(m, b, &fo, &act, &err);
    const double ms = now_ms() - start;
    lens_activations_free(&act);
    if (rc) fprintf(stderr, "context_mixing: forward: %s\n", err.msg);
    return rc ? -1 : ms;
}

/* One lens_context_mixing of method; ms or -1. The result goes to keep
 * (which the caller frees) when given. */
static double time_method(const lens_model *m, const int *ids, int T, lens_cm_method method, lens_pool *pool,
                          lens_cm_result *keep)
{
    const lens_cm_opts o = {.method = method, .paper_code = 1, .pool = pool};
    lens_cm_result res;
    lens_err err = {0};
    const double start = now_ms();
    const int rc = lens_context_mixing(m, ids, NULL, T, &o, &res, &err);
    const double ms = now_ms() - start;
    if (rc) fprintf(stderr, "context_mixing: %s: %s\n", lens_cm_method_name(method), err.msg);
    else if (keep) *keep = res;
    else lens_cm_result_free(&res);
    return rc ? -1 : ms;
}

/* contributions [L][T][T], rollout [L][T][T], classifier [T][K] as float32 */
static int dump_decompx(const char *path, const lens_cm_result *r)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const size_t n = (size_t)r->n_layers * r->T * r->T, nk = (size_t)r->T * r->n_classes;
    int bad = fwrite(r->contrib, sizeof(float), n, f) != n || fwrite(r->rollout, sizeof(float), n, f) != n;
    bad |= r->classifier && fwrite(r->classifier, sizeof(float), nk, f) != nk;
    return fclose(f) || bad ? -1 : 0;
}

/* --decompx: the forward's median, then DecompX reps; one JSON line, the last run dumped. 0 or 1. */
static int bench_decompx(const lens_model *m, const int *ids, int T, lens_pool *pool, int threads, int reps,
                         int warmup, const char *dump)
{
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    double fwd[reps], dx[reps];
    for (int r = -warmup; r < reps; r++) {
        const double t = time_forward(m, &b, pool);
        if (t < 0) return 1;
        if (r >= 0) fwd[r] = t;
    }
    lens_cm_result res = {0};
    for (int r = 0; r < reps; r++) {
        lens_cm_result_free(&res);
        if ((dx[r] = time_method(m, ids, T, LENS_CM_DECOMPX, pool, &res)) < 0) return 1;
    }
    const int failed = dump_decompx(dump, &res);
    if (failed) fprintf(stderr, "context_mixing: cannot write %s\n", dump);
    const double fwd_ms = median(fwd, reps), dx_ms = median(dx, reps);
    printf("{\"impl\":\"lensd\",\"method\":\"decompx\",\"T\":%d,\"C\":%d,\"L\":%d,\"K\":%d,\"threads\":%d,"
           "\"reps\":%d,\"forward_ms\":%.2f,\"decompx_ms\":%.2f,\"decompx_x_forward\":%.1f,\"maxrss_kib\":%ld}\n",
           T, m->cfg.d_model, m->cfg.n_layers, res.n_classes, threads, reps, fwd_ms, dx_ms, dx_ms / fwd_ms,
           maxrss_kib());
    lens_cm_result_free(&res);
    return failed;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *dir = NULL, *decompx = NULL;
    int T = 128, threads = 2, reps = 5, vz_reps = 1, warmup = 1;
    unsigned seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "context_mixing: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--T")) T = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--vz-reps")) vz_reps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--seed")) seed = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--decompx")) decompx = v;
        else {
            fprintf(stderr, "usage: context_mixing --model DIR [--T 128] [--threads 2] [--reps 5] [--vz-reps 1]\n"
                            "         [--warmup 1] [--seed 42]\n"
                            "       context_mixing --decompx FILE --model CLASSIFIER [--T 128] [--threads 2]\n"
                            "         [--reps 1] [--warmup 1] [--seed 42]\n");
            return 2;
        }
        i++;
    }
    if (!dir || T < 1 || threads < 1 || reps < 1 || vz_reps < 0 || warmup < 0) {
        fprintf(stderr, "context_mixing: --model is required; T, threads, reps >= 1\n");
        return 2;
    }
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "context_mixing: %s\n", err.msg);
        return 1;
    }
    if (T > m->cfg.max_positions) T = m->cfg.max_positions;
    lens_blas_set_threads(1);
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
    int *ids = malloc(sizeof(int) * T);
    bench_random_ids(ids, (size_t)T, m, seed);
    if (decompx) {
        const int rc = bench_decompx(m, ids, T, pool, threads, reps, warmup, decompx);
        free(ids);
        lens_pool_free(pool);
        lens_model_free(m);
        return rc;
    }
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    enum { FWD, ROLLOUT, ALTI, GLOBENC, N_TIMED };
    const lens_cm_method methods[N_TIMED] = {0, LENS_CM_ROLLOUT, LENS_CM_ALTI, LENS_CM_GLOBENC};
    double *ms[N_TIMED], *vz = malloc(sizeof(double) * (vz_reps + 1)), med[N_TIMED];
    for (int k = 0; k < N_TIMED; k++) ms[k] = malloc(sizeof(double) * reps);
    int failed = 0;
    for (int r = -warmup; r < reps && !failed; r++)
        for (int k = 0; k < N_TIMED && !failed; k++) {
            const double t = k == FWD ? time_forward(m, &b, pool) : time_method(m, ids, T, methods[k], pool, NULL);
            failed = t < 0;
            if (r >= 0) ms[k][r] = t;
        }
    for (int r = 0; r < vz_reps && !failed; r++)
        failed = (vz[r] = time_method(m, ids, T, LENS_CM_VALUE_ZEROING, pool, NULL)) < 0;
    if (failed) return 1;
    for (int k = 0; k < N_TIMED; k++) med[k] = median(ms[k], reps);
    const double vz_ms = vz_reps ? median(vz, vz_reps) : -1;
    printf("{\"impl\":\"lensd\",\"T\":%d,\"C\":%d,\"L\":%d,\"threads\":%d,\"reps\":%d,\"vz_reps\":%d,"
           "\"forward_ms\":%.2f,\"rollout_ms\":%.2f,\"alti_ms\":%.2f,\"globenc_ms\":%.2f,\"value_zeroing_ms\":%.2f,"
           "\"rollout_x_forward\":%.3f,\"alti_x_forward\":%.3f,\"globenc_x_forward\":%.3f,\"maxrss_kib\":%ld}\n",
           T, m->cfg.d_model, m->cfg.n_layers, threads, reps, vz_reps, med[FWD], med[ROLLOUT], med[ALTI],
           med[GLOBENC], vz_ms, med[ROLLOUT] / med[FWD], med[ALTI] / med[FWD], med[GLOBENC] / med[FWD], maxrss_kib());
    for (int k = 0; k < N_TIMED; k++) free(ms[k]);
    free(ids), free(vz);
    lens_pool_free(pool);
    lens_model_free(m);
    return 0;
}
