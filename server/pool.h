/* pool.h - the bounded worker pool that runs request computations.
 *
 * Fixed threads, a bounded FIFO queue, and a watchdog that sets a job's
 * cancel flag when its deadline passes (lens_forward checks that flag
 * between layers). Capacity is reserved before the HTTP connection is
 * suspended, so a full queue is known while the request can still get 429. */
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
    lens_pool *threads;               /* the running worker's compute threads, set before fn */
    struct pool_job *next;
} pool_job;

typedef struct pool pool;

/* Each worker owns a lens_pool of threads_per_worker threads (itself
 * included) that its jobs compute with: workers x threads_per_worker is the
 * whole thread budget, and OpenBLAS stays single-threaded (core/base/pool.h). */
pool *pool_create(int n_workers, int queue_capacity, int threads_per_worker);
/* Stops accepting, lets queued and running jobs finish, joins the threads. */
void pool_destroy(pool *p);

/* Reserve a queue slot: 1 on success, 0 when the queue is full. */
int pool_reserve(pool *p);
/* Enqueue a job into a reserved slot. */
void pool_submit(pool *p, pool_job *job);

int pool_queue_depth(pool *p); /* waiting jobs */
int pool_running(pool *p);     /* jobs on a worker now */

#endif
