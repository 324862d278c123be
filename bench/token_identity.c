/* token_identity.c - benchmark driver: token identifiability rankings
 * (Brunner et al. 2020, core/analysis/token_identity.h) against the forward pass
 * they ride on.
 *
 *   token_identity --model DIR [--T 128] [--threads 2] [--reps 10] [--vocab-reps 3]
 *                  [--warmup 2] [--top-k 5] [--metric cosine|l2] [--seed 42]
 *
 * Per rep, interleaved so that a change of load hits all three alike:
 *   forward   lens_forward of the sequence, nothing kept (the bare pass)
 *   hidden    lens_forward keeping the hidden states (what the ranking reads)
 *   identity  lens_token_identity: all layers 0..L, identity mapping, --metric,
 *             --top-k neighbours, no vocabulary ranking
 * then --vocab-reps runs of lens_token_identity with opts.vocabulary = 1
 * (every query also ranked against the V x C input embedding table).
 * All on one lens_pool of --threads, OpenBLAS at one thread (core/base/pool.h).
 * Token ids: xorshift32 from --seed, id = x mod V. Prints one JSON line with
 * the medians (ms), the overhead of identity over forward and the
 * vocabulary ranking's extra cost. */
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
#include "core/model/model.h"
#include "core/base/pool.h"
#include "core/analysis/token_identity.h"

/* One lens_forward with keep; returns ms or -1. */
static double time_forward(const lens_model *m, const lens_batch *b, unsigned keep, lens_pool *pool)
{
    lens_forward_opts fo = {.keep = keep, .pool = pool};
    lens_activations act = {0};
    lens_err err = {0};
    const double start = now_ms();
    const int rc = lens_forward(m, b, &fo, &act, &err);
    const double ms = now_ms() - start;
    lens_activations_free(&act);
    if (rc) fprintf(stderr, "token_identity: forward: %s\n", err.msg);
    return rc ? -1 : ms;
}

/* One lens_token_identity; returns ms or -1; *res is replaced. */
static double time_identity(const lens_model *m, const int *ids, int T, const lens_ti_opts *o, lens_ti_result *res)
{
    lens_err err = {0};
    lens_ti_result_free(res);
    const double start = now_ms();
    const int rc = lens_token_identity(m, ids, NULL, NULL, T, o, res, &err);
    const double ms = now_ms() - start;
    if (rc) fprintf(stderr, "token_identity: lens_token_identity: %s\n", err.msg);
    return rc ? -1 : ms;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *dir = NULL;
    int T = 128, threads = 2, reps = 10, vocab_reps = 3, warmup = 2, top_k = 5;
    unsigned seed = 42;
    lens_ti_metric metric = LENS_TI_COSINE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "token_identity: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--T")) T = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--vocab-reps")) vocab_reps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--top-k")) top_k = atoi(v);
        else if (!strcmp(a, "--seed")) seed = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--metric")) metric = !strcmp(v, "l2") ? LENS_TI_L2 : LENS_TI_COSINE;
        else {
            fprintf(stderr, "usage: token_identity --model DIR [--T 128] [--threads 2] [--reps 10] [--vocab-reps 3]\n"
                            "         [--warmup 2] [--top-k 5] [--metric cosine|l2] [--seed 42]\n");
            return 2;
        }
        i++;
    }
    if (!dir || T < 1 || threads < 1 || reps < 1 || vocab_reps < 0 || warmup < 0 || top_k < 0) {
        fprintf(stderr, "token_identity: --model is required; T, threads, reps >= 1\n");
        return 2;
    }
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "token_identity: %s\n", err.msg);
        return 1;
    }
    if (T > m->cfg.max_positions) T = m->cfg.max_positions;
    lens_blas_set_threads(1);
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
    int *ids = malloc(sizeof(int) * T);
    bench_random_ids(ids, (size_t)T, m, seed);
    const lens_batch b = {.n_seqs = 1, .lengths = &T, .ids = ids};
    lens_ti_opts o = {.metric = metric, .top_k = top_k, .pool = pool};
    lens_ti_result res = {0};
    double *fwd = malloc(sizeof(double) * reps), *hid = malloc(sizeof(double) * reps);
    double *ti = malloc(sizeof(double) * reps), *tv = malloc(sizeof(double) * (vocab_reps + 1));
    int failed = 0;
    for (int r = -warmup; r < reps && !failed; r++) {
        const double f = time_forward(m, &b, 0, pool), h = time_forward(m, &b, LENS_KEEP_HIDDEN, pool);
        const double t = time_identity(m, ids, T, &o, &res);
        failed = f < 0 || h < 0 || t < 0;
        if (r >= 0) fwd[r] = f, hid[r] = h, ti[r] = t;
    }
    if (failed) return 1;
    /* rates of the plain run, before the vocabulary run replaces res */
    const float rate_first = res.n_layers ? res.layers[1 < res.n_layers ? 1 : 0].rate : NAN;
    const float rate_last = res.n_layers ? res.layers[res.n_layers - 1].rate : NAN;
    const int n_layers = res.n_layers;
    double vocab_ms = NAN;
    float vocab_rate_last = NAN;
    if (vocab_reps > 0) {
        o.vocabulary = 1;
        for (int r = -1; r < vocab_reps && !failed; r++) { /* one warm-up: the V x C table is paged in */
            const double t = time_identity(m, ids, T, &o, &res);
            failed = t < 0;
            if (r >= 0) tv[r] = t;
        }
        if (failed) return 1;
        vocab_ms = median(tv, vocab_reps);
        vocab_rate_last = res.n_layers ? res.layers[res.n_layers - 1].vocab_rate : NAN;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double fwd_ms = median(fwd, reps), hid_ms = median(hid, reps), ti_ms = median(ti, reps);
    printf("{\"impl\":\"lensd\",\"T\":%d,\"C\":%d,\"L\":%d,\"V\":%d,\"threads\":%d,\"reps\":%d,\"vocab_reps\":%d,"
           "\"metric\":\"%s\",\"top_k\":%d,\"layers\":%d,\"forward_ms\":%.2f,\"forward_hidden_ms\":%.2f,"
           "\"identity_ms\":%.2f,\"overhead\":%.4f,\"identity_vocab_ms\":%.2f,\"vocab_extra_ms\":%.2f,"
           "\"rate_layer1\":%.4f,\"rate_last\":%.4f,\"vocab_rate_last\":%.4f,\"maxrss_kib\":%ld,\"blas_core\":\"%s\"}\n",
           T, m->cfg.d_model, m->cfg.n_layers, m->cfg.vocab_size, threads, reps, vocab_reps,
           metric == LENS_TI_COSINE ? "cosine" : "l2", top_k, n_layers, fwd_ms, hid_ms, ti_ms, ti_ms / fwd_ms - 1,
           vocab_ms, vocab_ms - ti_ms, rate_first, rate_last, vocab_rate_last, ru.ru_maxrss, lens_blas_core());
    lens_ti_result_free(&res);
    free(ids), free(fwd), free(hid), free(ti), free(tv);
    lens_pool_free(pool);
    lens_model_free(m);
    return 0;
}
