/* pool.h - the bounded worker pool that runs request computations.
 *
 * Fixed threads, a bounded FIFO queue, and a watchdog that sets a job's
 * cancel flag when its deadline passes (lens_forward checks that flag
 * between layers). Capacity is reserved before the HTTP connection is
 * suspended, so a full queue is known while the request can still get 429.
 *
 * Two cost lanes, so cheap requests never wait behind expensive ones: the
 * general workers take the oldest queued job of either lane; the fast-lane
 * workers take only cheap jobs (job->cheap), so however long the analyses
 * on the general workers run, a forward pass finds a worker of its own. */
#ifndef LENSD_POOL_H
#define LENSD_POOL_H

#include "core/base/pool.h"

typedef struct pool_job {
    void (*fn)(struct pool_job *job); /* runs on a worker thread */
    /* Called on the worker after the job has left the pool's books, so it may
     * free the job (e.g. by resuming its connection); NULL = nothing. */
    void (*done)(struct pool_job *job);
    double deadline;                  /* api_now() seconds; 0 = none */
    volatile int cancel;              /* set by the watchdog after the deadline */
    int cheap;                        /* 1: may run on a fast-lane worker (tokenize, forward) */
    unsigned long long seq;           /* submission order, set by pool_submit */
    lens_pool *threads;               /* the running worker's compute threads, set before fn */
    struct pool_job *next;
} pool_job;

typedef struct pool pool;

/* Each worker owns a lens_pool of threads_per_worker threads (itself
 * included) that its jobs compute with: workers x threads_per_worker is the
 * whole thread budget, and OpenBLAS stays single-threaded (core/base/pool.h). */
/* n_fast fast-lane workers of fast_threads threads each run only cheap
 * jobs (n_fast = 0: one lane, every worker takes every job in order). */
pool *pool_create(int n_workers, int n_fast, int queue_capacity, int threads_per_worker, int fast_threads);
/* Stops accepting, lets queued and running jobs finish, joins the threads. */
void pool_destroy(pool *p);

/* Reserve a queue slot: 1 on success, 0 when the queue is full. */
int pool_reserve(pool *p);
/* Enqueue a job into a reserved slot. */
void pool_submit(pool *p, pool_job *job);

int pool_queue_depth(pool *p); /* waiting jobs */
int pool_running(pool *p);     /* jobs on a worker now */

#endif
