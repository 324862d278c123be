/* pool.h - a small persistent thread pool for the forward pass.
 *
 * lens_pool_run(pool, n, fn, ctx) calls fn(ctx, task) once for every task in
 * 0..n-1 and returns when all have finished. Tasks are handed out one at a
 * time from a shared counter, so uneven tasks balance themselves; the calling
 * thread takes tasks too, so a pool of n threads starts n - 1 workers.
 * Between jobs a worker spins for ~200 us (a forward pass issues jobs every
 * few tens of microseconds) and then sleeps on a condition variable, so an
 * idle pool costs no CPU.
 *
 * A NULL pool runs every task inline on the caller, in order. A call made
 * from inside a task (of any pool) also runs inline, so kernels may use a
 * pool without knowing whether they are already parallel. One pool serves one
 * caller at a time (the server makes one per worker); concurrent runs on the
 * same pool are serialised.
 *
 * Threading policy: the forward pass (core/model/forward.c, core/base/gemm.c) is
 * threaded only by this pool; OpenBLAS is left for LAPACK and the analyses
 * and should run single-threaded (lens_blas_set_threads(1)) in any process
 * that uses pools. Measured at BERT-base T=128 on 2 cores: OpenBLAS at 2
 * threads next to a 2-thread pool gains nothing (the forward makes no BLAS
 * call) and any BLAS call made inside a task would start a second set of
 * spinning threads on the same cores, which is what made the OpenMP attempt
 * 3x slower. */
#ifndef LENS_POOL_H
#define LENS_POOL_H

typedef struct lens_pool lens_pool;

/* n_threads >= 1 counts the caller; NULL when threads cannot be created. */
lens_pool *lens_pool_create(int n_threads);
void lens_pool_free(lens_pool *pool);

/* Threads that run tasks (1 for NULL). */
int lens_pool_threads(const lens_pool *pool);

void lens_pool_run(lens_pool *pool, int n_tasks, void (*fn)(void *ctx, int task), void *ctx);

/* Inside a task: which of the job's threads runs it, 0 .. threads - 1 (0 for
 * inline runs), so a task can use per-thread scratch sized by
 * lens_pool_threads. 0 outside any task. */
int lens_pool_thread_index(void);

#endif
