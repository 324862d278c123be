/* decomposition.c - the lensd side of the decomposition benchmark.
 *
 *   decomposition --model DIR [--windows 256] [--T 128] [--threads 2]
 *                 [--batch-tokens 1024] [--seed 42]
 *       streams W = --windows windows of T tokens through
 *       lens_decomp_begin / add / finish (all L+1 layers, position 0
 *       dropped, labels w % 4) and prints one JSON line: wall time, tokens/s,
 *       the share of it spent in finish, peak RSS (getrusage), the size of the
 *       per-context means (the only part that grows with W: W (L+1) C
 *       floats) and a few metrics of the last layer for a cross-check with
 *       bench/peer/decomposition_torch.py.
 *   decomposition --mkmodel DIR [--seed S]
 *       writes the random BERT-base checkpoint (lens_mkmodel) into DIR.
 *
 * Peak RSS is per process, so 256 and 2048 windows are two runs:
 *   build/bench/decomposition --model build/bench-models/bert-base --windows 256
 *   build/bench/decomposition --model build/bench-models/bert-base --windows 2048   (slow on 2 cores)
 *
 * Token ids: xorshift32 from --seed, id = x mod V in window order, as
 * bench/forward.c and the PyTorch peer draw them. Threads: the forward pass
 * runs on a lens_pool of --threads; OpenBLAS (Gram matrices, LAPACK) at one
 * thread, as core/base/pool.h asks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench/bench.h"
#include "core/base/blas.h"
#include "core/analysis/decomposition.h"
#include "core/model/mkmodel.h"
#include "core/base/pool.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(void)
{
    fprintf(stderr, "usage: decomposition --model DIR [--windows 256] [--T 128] [--threads 2] [--batch-tokens 1024] "
                    "[--seed 42]\n       decomposition --mkmodel DIR [--seed S]\n");
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *mk_dir = NULL;
    int W = 256, T = 128, threads = 2, batch_tokens = 1024;
    unsigned seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage(), 2;
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--mkmodel")) mk_dir = v;
        else if (!strcmp(a, "--windows")) W = atoi(v);
        else if (!strcmp(a, "--T")) T = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--batch-tokens")) batch_tokens = atoi(v);
        else if (!strcmp(a, "--seed")) seed = (unsigned)strtoul(v, NULL, 10);
        else return usage(), 2;
        i++;
    }
    lens_err err = {0};
    if (mk_dir) {
        if (lens_mkmodel("bert", "base", "encoder", seed, mk_dir, &err)) {
            fprintf(stderr, "decomposition: mkmodel %s: %s\n", mk_dir, err.msg);
            return 1;
        }
        return 0;
    }
    if (!model_dir || W < 2 || T < 3 || threads < 1) return usage(), 2;
    lens_blas_set_threads(1);
    double t_load = now_s();
    lens_model *m = lens_model_load(model_dir, &err);
    if (!m) {
        fprintf(stderr, "decomposition: %s: %s\n", model_dir, err.msg);
        return 1;
    }
    t_load = now_s() - t_load;
    long rss_loaded = maxrss_kib();
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
    int *ids = malloc((size_t)W * T * sizeof(int)), *labels = malloc((size_t)W * sizeof(int));
    bench_random_ids(ids, (size_t)W * T, m, seed);
    for (int w = 0; w < W; w++) labels[w] = w % 4;

    lens_decomp_opts o = {.pool = pool, .batch_tokens = batch_tokens};
    double t0 = now_s();
    lens_decomp *acc = lens_decomp_begin(m, T, NULL, 0, &o, &err);
    lens_decomp_result res = {0};
    /* windows arrive in chunks of 64, as a job reading a corpus would feed them */
    int rc = acc ? 0 : -1;
    for (int w = 0; rc == 0 && w < W; w += 64)
        rc = lens_decomp_add(acc, ids + (size_t)w * T, labels + w, W - w < 64 ? W - w : 64, &err);
    double t_finish = now_s();
    if (rc == 0) rc = lens_decomp_finish(acc, &res, &err);
    double t1 = now_s();
    if (rc) {
        fprintf(stderr, "decomposition: %s\n", err.msg);
        return 1;
    }
    const lens_decomp_layer *last = &res.layers[res.n_layers - 1];
    double ctx_mib = (double)W * res.n_layers * res.d_model * sizeof(float) / (1 << 20);
    printf("{\"impl\":\"lensd\",\"windows\":%d,\"T\":%d,\"threads\":%d,\"tokens\":%ld,\"seconds\":%.2f,"
           "\"tokens_per_s\":%.1f,\"finish_seconds\":%.2f,\"load_seconds\":%.2f,\"maxrss_mib\":%.1f,"
           "\"rss_after_load_mib\":%.1f,\"ctx_means_mib\":%.1f,\"last_layer\":{\"share_pos\":%.6g,\"share_ctx\":%.6g,"
           "\"norm_pos\":%.6g,\"norm_ctx\":%.6g,\"norm_resid\":%.6g,\"pos_stable_rank\":%.6g,"
           "\"pos_smoothness\":%.6g,\"mean_abs_cos\":%.6g,\"topics_within\":%.6g}}\n",
           W, T, threads, (long)W * T, t1 - t0, (double)W * T / (t1 - t0), t1 - t_finish, t_load,
           maxrss_kib() / 1024.0, rss_loaded / 1024.0, ctx_mib, last->share_pos, last->share_ctx, last->norm_pos,
           last->norm_ctx, last->norm_resid, last->pos_stable_rank, last->pos_smoothness, last->mean_abs_cos,
           last->topics_within);
    lens_decomp_result_free(&res);
    lens_decomp_free(acc);
    lens_pool_free(pool);
    lens_model_free(m);
    free(ids), free(labels);
    return 0;
}
