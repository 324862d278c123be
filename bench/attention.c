/* attention.c - benchmark of effective attention (core/analysis/attention.c) against
 * the forward pass it analyses.
 *
 *   attention [--model DIR] [--T 128,512] [--threads 1] [--reps 3] [--seed 42]
 *
 * DIR defaults to build/bench-models/bert-base when it holds a checkpoint,
 * else a random BERT-base (lens_mkmodel bert base encoder) is written to a
 * temporary folder. For each T: the median time of lens_forward (nothing
 * kept), of lens_attention_effective over all L x NH heads (the effective
 * matrices and ranks: a double Cholesky QR of V per head, or its SVD when
 * V is rank-deficient, plus two lens_gemm products), and of
 * lens_attention_analyze with statistics and identifiability (key-aware
 * dimension on: over its size limit at these T, so only its check runs).
 * Threads: one lens_pool of --threads runs the forward, the L x NH heads of
 * lens_attention_effective (one task per head) and the heads of
 * lens_attention_analyze; OpenBLAS at one thread (core/base/pool.h).
 * Token ids: xorshift32 from --seed, as bench/forward.c. One JSON line per T;
 * bench/peer/attention_torch.py prints the PyTorch counterpart.
 *
 *   attention --key-aware DIR [--key-aware-T 125] [--threads 1] [--reps 3]
 *
 * times the key-aware identifiability of every head of DIR (see
 * bench_key_aware) against the dense method it replaced. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/model/arch.h"
#include "core/analysis/attention.h"
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"
#include "core/base/pool.h"

/* All L x NH heads of one sequence as tasks of a pool: task = (layer, head). */
typedef struct {
    const lens_model *m;
    const lens_activations *act;
    int T;
    float *eff;          /* [threads][T][T] */
    int *rank, *failed;  /* [L * NH] */
} eff_job;

static void eff_task(void *ctx, int task)
{
    eff_job *j = ctx;
    const lens_config *c = &j->m->cfg;
    const int NH = c->n_heads, DV = c->d_head_v, l = task / NH + 1, h = task % NH;
    lens_err err = {0};
    j->failed[task] = lens_attention_effective(lens_act_attn(j->m, j->act, l, h, 0),
                                               lens_act_values(j->m, j->act, l, 0) + (size_t)h * DV, NH * DV, j->T, DV,
                                               lens_has_cap(c, LENS_CAP_CAUSAL), lens_layer_window(c, l - 1),
                                               j->eff + (size_t)lens_pool_thread_index() * j->T * j->T,
                                               &j->rank[task], &err);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int bench_T(const lens_model *m, lens_pool *pool, int T, int reps, uint32_t seed)
{
    const lens_config *c = &m->cfg;
    int *ids = malloc(sizeof(int) * (size_t)T);
    for (int t = 0; t < T; t++) ids[t] = (int)(xorshift32(&seed) % (uint32_t)c->vocab_size);
    const lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids};
    const lens_forward_opts plain = {.keep = 0, .pool = pool};
    const lens_forward_opts keep = {.keep = LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_HIDDEN, .pool = pool};
    double *t_fwd = malloc(sizeof(double) * reps), *t_eff = malloc(sizeof(double) * reps),
           *t_all = malloc(sizeof(double) * reps);
    const int n_all = c->n_layers * c->n_heads;
    float *eff = malloc(sizeof(float) * (size_t)lens_pool_threads(pool) * T * T);
    int *ranks = malloc(sizeof(int) * (size_t)n_all), *failed = malloc(sizeof(int) * (size_t)n_all);
    lens_err err = {0};
    lens_activations act;
    int rank_min = T, rank_max = 0;
    for (int r = -1; r < reps; r++) {
        double t0 = now_ms();
        if (lens_forward(m, &batch, &plain, &act, &err)) goto fail;
        double ms = now_ms() - t0;
        lens_activations_free(&act);
        if (r >= 0) t_fwd[r] = ms;
    }
    if (lens_forward(m, &batch, &keep, &act, &err)) goto fail;
    eff_job job = {.m = m, .act = &act, .T = T, .eff = eff, .rank = ranks, .failed = failed};
    for (int r = -1; r < reps; r++) {
        double t0 = now_ms();
        lens_pool_run(pool, n_all, eff_task, &job);
        double ms = now_ms() - t0;
        if (r >= 0) t_eff[r] = ms;
        for (int k = 0; k < n_all; k++) {
            if (failed[k]) {
                snprintf(err.msg, sizeof err.msg, "effective attention failed on head %d", k);
                goto fail;
            }
            rank_min = ranks[k] < rank_min ? ranks[k] : rank_min, rank_max = ranks[k] > rank_max ? ranks[k] : rank_max;
        }
    }
    for (int r = -1; r < reps; r++) {
        lens_attention_request req = {.ids = ids, .want_effective = 1, .head = {.key_aware = 1}, .pool = pool};
        lens_attention_result res;
        double t0 = now_ms();
        if (lens_attention_analyze(m, &act, 0, &req, &res, &err)) goto fail;
        double ms = now_ms() - t0;
        lens_attention_result_free(&res);
        if (r >= 0) t_all[r] = ms;
    }
    lens_activations_free(&act);
    const double fwd = median(t_fwd, reps), ef = median(t_eff, reps), all = median(t_all, reps);
    printf("{\"impl\":\"lensd\",\"bench\":\"attention\",\"T\":%d,\"heads\":%d,\"threads\":%d,\"reps\":%d,"
           "\"forward_ms\":%.2f,\"effective_ms\":%.2f,\"effective_over_forward\":%.4f,"
           "\"analyze_ms\":%.2f,\"analyze_over_forward\":%.4f,\"rank_min\":%d,\"rank_max\":%d}\n",
           T, n_all, lens_pool_threads(pool), reps, fwd, ef, ef / fwd, all, all / fwd, rank_min, rank_max);
    free(ids), free(t_fwd), free(t_eff), free(t_all), free(eff), free(ranks), free(failed);
    return 0;
fail:
    fprintf(stderr, "attention: T=%d: %s\n", T, err.msg);
    return 1;
}

/* Key-aware identifiability (issue 20 item 2): lens_attention_analyze with the
 * key-aware dimension of every head, by the Gram/inertia method (median of reps)
 * and by the dense SVDs of J and M J it replaced (the peer, once: ~50 s at
 * T = 125 on demo-identifiable). Prints one JSON line with both times, their
 * ratio and how many heads gave the same rank(J), rank(M J). */
static int bench_key_aware(const char *dir, lens_pool *pool, int T, int reps, uint32_t seed)
{
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "attention: %s: %s\n", dir, err.msg);
        return 1;
    }
    int *ids = malloc(sizeof(int) * (size_t)T);
    for (int t = 0; t < T; t++) ids[t] = (int)(xorshift32(&seed) % (uint32_t)m->cfg.vocab_size);
    const lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = ids};
    const lens_forward_opts keep = {.keep = LENS_KEEP_ATTN | LENS_KEEP_VALUES | LENS_KEEP_HIDDEN, .pool = pool};
    lens_activations act;
    double *t_gram = malloc(sizeof(double) * reps), *c_gram = malloc(sizeof(double) * reps), t_dense = 0, c_dense = 0;
    lens_attention_result fast = {0}, dense = {0};
    int rc = 1, agree = 0, nonzero = 0;
    if (T < 1 || T > m->cfg.max_positions || lens_forward(m, &batch, &keep, &act, &err)) goto out;
    lens_attention_request req = {.ids = ids, .pool = pool, .head = {.key_aware = 1}};
    for (int r = -1; r < reps; r++) {
        lens_attention_result_free(&fast);
        double t0 = now_ms(), c0 = cpu_ms();
        if (lens_attention_analyze(m, &act, 0, &req, &fast, &err)) goto free_act;
        if (r >= 0) t_gram[r] = now_ms() - t0, c_gram[r] = cpu_ms() - c0;
    }
    req.head.key_aware_dense = 1;
    double t0 = now_ms(), c0 = cpu_ms();
    if (lens_attention_analyze(m, &act, 0, &req, &dense, &err)) goto free_act;
    t_dense = now_ms() - t0, c_dense = cpu_ms() - c0;
    const int n = fast.n_layers * fast.n_heads;
    for (int k = 0; k < n; k++) {
        const lens_head_attention *a = &fast.head[k], *b = &dense.head[k];
        agree += a->ok && b->ok && a->key_aware_method == LENS_KEY_AWARE_EXPLICIT && a->rank_j == b->rank_j &&
                 a->rank_mj == b->rank_mj;
        nonzero += a->key_aware_dim > 0;
    }
    const double g = median(t_gram, reps), gc = median(c_gram, reps);
    printf("{\"impl\":\"lensd\",\"bench\":\"key_aware\",\"model\":\"%s\",\"T\":%d,\"heads\":%d,\"threads\":%d,"
           "\"reps\":%d,\"gram_ms\":%.1f,\"dense_ms\":%.1f,\"dense_over_gram\":%.1f,\"gram_cpu_ms\":%.1f,"
           "\"dense_cpu_ms\":%.1f,\"agree\":%d,\"nonzero\":%d}\n",
           dir, T, n, lens_pool_threads(pool), reps, g, t_dense, t_dense / g, gc, c_dense, agree, nonzero);
    rc = 0;
free_act:
    lens_activations_free(&act);
out:
    if (rc) fprintf(stderr, "attention: key-aware %s T=%d: %s\n", dir, T, err.msg);
    lens_attention_result_free(&fast), lens_attention_result_free(&dense);
    free(ids), free(t_gram), free(c_gram);
    lens_model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    const char *model_dir = NULL, *Ts = "128,512", *ka_model = NULL;
    int ka_T = 125;
    int threads = 1, reps = 3;
    unsigned seed = 42;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--T")) Ts = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--key-aware")) ka_model = argv[i + 1];
        else if (!strcmp(argv[i], "--key-aware-T")) ka_T = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: attention [--model DIR] [--T 128,512] [--threads 1] [--reps 3] [--seed 42]\n"
                            "       attention --key-aware DIR [--key-aware-T 125] [--threads 1] [--reps 3]\n");
            return 2;
        }
    }
    if (reps < 1 || threads < 1) return 2;
    if (ka_model) {
        lens_blas_set_threads(1);
        lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
        int rc = bench_key_aware(ka_model, pool, ka_T, reps, seed ? seed : 1);
        lens_pool_free(pool);
        return rc;
    }
    char tmp[] = "/tmp/lens-bench-attention-XXXXXX";
    int made = 0;
    lens_err err = {0};
    if (!model_dir && access("build/bench-models/bert-base/config.json", R_OK) == 0)
        model_dir = "build/bench-models/bert-base";
    if (!model_dir) {
        if (!mkdtemp(tmp) || lens_mkmodel("bert", "base", "encoder", 42, tmp, &err)) {
            fprintf(stderr, "attention: cannot write a random BERT-base: %s\n", err.msg);
            return 1;
        }
        model_dir = tmp, made = 1;
    }
    lens_model *m = lens_model_load(model_dir, &err);
    if (!m) {
        fprintf(stderr, "attention: %s: %s\n", model_dir, err.msg);
        return 1;
    }
    /* core/base/pool.h: the forward and the heads run on the pool; OpenBLAS (LAPACK, the small BLAS calls) at 1 thread */
    lens_blas_set_threads(1);
    lens_pool *pool = threads > 1 ? lens_pool_create(threads) : NULL;
    int rc = 0;
    for (const char *p = Ts; *p && !rc;) {
        int T = atoi(p);
        if (T < 1 || T > m->cfg.max_positions) {
            fprintf(stderr, "attention: bad T %d\n", T);
            rc = 1;
            break;
        }
        rc = bench_T(m, pool, T, reps, seed ? seed : 1);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    lens_pool_free(pool);
    lens_model_free(m);
    if (made) nftw(tmp, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    return rc;
}
