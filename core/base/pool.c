/* pool.c - the persistent thread pool (see pool.h).
 *
 * A job is published by bumping `generation`; workers notice it by spinning
 * (then by the condition variable once they sleep), claim task indices with
 * an atomic counter and, when no task is left, bump `finished`. The caller
 * returns only when every worker has finished, so the next job can reuse the
 * job fields without a worker still reading the old ones. */
#include "core/base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_NS 200000 /* how long an idle worker spins before sleeping */

typedef struct {
    struct lens_pool *pool;
    int index; /* 1 .. n_workers; the caller is 0 */
} worker_arg;

struct lens_pool {
    int n_workers;
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t run_lock; /* one job at a time */
    pthread_mutex_t lock;     /* with wake: sleeping workers */
    pthread_cond_t wake;
    atomic_int n_sleeping;
    atomic_uint generation;
    atomic_int next_task, finished, stop;
    /* the current job, valid while generation is unchanged */
    int n_tasks;
    void (*fn)(void *ctx, int task);
    void *ctx;
};

/* Set while a thread runs a task, so nested runs go inline; thread_index is
 * the running job's view of which thread this is. */
static _Thread_local int in_task, thread_index;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void run_tasks(lens_pool *p, int index)
{
    in_task = 1, thread_index = index;
    for (int t; (t = atomic_fetch_add(&p->next_task, 1)) < p->n_tasks;) p->fn(p->ctx, t);
    in_task = 0, thread_index = 0;
}

int lens_pool_thread_index(void)
{
    return thread_index;
}


/* Returns the new generation, or the old one when stopping. */
static unsigned wait_for_job(lens_pool *p, unsigned seen)
{
    const long long until = now_ns() + SPIN_NS;
    for (int spins = 0; atomic_load(&p->generation) == seen; spins++) {
        if (atomic_load(&p->stop)) return seen;
        cpu_relax();
        if ((spins & 63) == 63 && now_ns() > until) {
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->lock);
        }
    }
    return atomic_load(&p->generation);
}

static void *worker_main(void *arg)
{
    worker_arg *w = arg;
    lens_pool *p = w->pool;
    unsigned seen = 0; /* the generation at creation: a job published before this thread starts still counts */
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) return NULL;
        run_tasks(p, w->index);
        atomic_fetch_add(&p->finished, 1);
    }
}

lens_pool *lens_pool_create(int n_threads)
{
    lens_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_workers = n_threads > 1 ? n_threads - 1 : 0;
    p->threads = calloc((size_t)p->n_workers + 1, sizeof *p->threads);
    p->args = calloc((size_t)p->n_workers + 1, sizeof *p->args);
    if (!p->threads || !p->args) {
        free(p->threads), free(p->args), free(p);
        return NULL;
    }
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 4u << 20); /* kernels keep packing buffers on the stack */
    for (int i = 0; i < p->n_workers; i++) {
        p->args[i] = (worker_arg){p, i + 1};
        if (pthread_create(&p->threads[i], &attr, worker_main, &p->args[i])) {
            p->n_workers = i;
            pthread_attr_destroy(&attr);
            lens_pool_free(p);
            return NULL;
        }
    }
    pthread_attr_destroy(&attr);
    return p;
}

void lens_pool_free(lens_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->run_lock);
    free(p->threads);
    free(p->args);
    free(p);
}

int lens_pool_threads(const lens_pool *p)
{
    return p ? p->n_workers + 1 : 1;
}

void lens_pool_run(lens_pool *p, int n_tasks, void (*fn)(void *ctx, int task), void *ctx)
{
    if (n_tasks <= 0) return;
    if (!p || p->n_workers == 0 || n_tasks == 1 || in_task) {
        const int outer_in_task = in_task, outer_index = thread_index;
        in_task = 1, thread_index = 0;
        for (int t = 0; t < n_tasks; t++) fn(ctx, t);
        in_task = outer_in_task, thread_index = outer_index;
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    p->n_tasks = n_tasks, p->fn = fn, p->ctx = ctx;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->finished, 0);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: pairs with n_sleeping below */
    if (atomic_load(&p->n_sleeping)) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    run_tasks(p, 0);
    for (int spins = 0; atomic_load(&p->finished) < p->n_workers; spins++) {
        cpu_relax();
        if (spins > 4096) sched_yield(); /* a worker was descheduled: give it the core */
    }
    pthread_mutex_unlock(&p->run_lock);
}
