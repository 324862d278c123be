/* pool.c - worker threads, the bounded queue, and deadlines.
 *
 * Owns: the worker threads and everything queued or running on them. One
 * mutex guards two FIFO queues, cheap and heavy (pool.h: cost lanes);
 * workers wait on `work`. Workers 0..n_workers-1 are general (the older
 * head of the two queues), the n_fast after them fast-lane (cheap only). The watchdog wakes every
 * 10 ms and raises the cancel flag of queued or running jobs whose deadline
 * has passed; a cancelled job still runs its fn (which sees the flag and
 * answers "timeout") so that every suspended connection is resumed. Once
 * the workers have been idle for TRIM_IDLE_S after some work, it gives freed
 * heap back to the system (malloc_trim). */
#include "server/pool.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "api/api.h"

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work, idle;
    pool_job *head[2], *tail[2]; /* [0] heavy, [1] cheap */
    int queued, reserved, capacity;
    int n_workers, n_fast, n_threads; /* general, fast lane, both */
    int threads_per_worker, fast_threads;
    unsigned long long next_seq;
    pool_job **running; /* [n_threads], NULL when idle */
    int n_running;
    int stopping;
    pthread_t *threads;
    pthread_t watchdog;
};

typedef struct {
    pool *p;
    int index;
} worker_arg;

/* The lane worker index should take from next, or -1 when it has none:
 * fast-lane workers only the cheap queue, general ones the older head. */
static int next_lane(const pool *p, int index)
{
    pool_job *heavy = p->head[0], *cheap = p->head[1];
    if (index >= p->n_workers) return cheap ? 1 : -1;
    if (heavy && cheap) return cheap->seq < heavy->seq ? 1 : 0;
    return cheap ? 1 : heavy ? 0 : -1;
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    pool *p = wa->p;
    int index = wa->index;
    free(wa);
    /* NULL: compute on this thread alone */
    lens_pool *threads = lens_pool_create(index < p->n_workers ? p->threads_per_worker : p->fast_threads);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        int lane;
        while ((lane = next_lane(p, index)) < 0 && !p->stopping) pthread_cond_wait(&p->work, &p->lock);
        if (lane < 0) break; /* stopping and drained */
        pool_job *job = p->head[lane];
        p->head[lane] = job->next;
        if (!p->head[lane]) p->tail[lane] = NULL;
        p->queued--;
        p->running[index] = job;
        p->n_running++;
        pthread_mutex_unlock(&p->lock);
        job->threads = threads;
        job->fn(job);
        pthread_mutex_lock(&p->lock);
        p->running[index] = NULL;
        p->n_running--;
        pthread_cond_broadcast(&p->idle);
        if (job->done) {
            /* the watchdog no longer sees the job: done() may free it */
            pthread_mutex_unlock(&p->lock);
            job->done(job);
            pthread_mutex_lock(&p->lock);
        }
    }
    pthread_mutex_unlock(&p->lock);
    lens_pool_free(threads);
    return NULL;
}

/* Seconds the workers must have been idle (nothing queued, reserved or
 * running) before the watchdog returns freed heap to the system: long enough
 * for the HTTP thread to send and free the last responses, short enough that
 * a burst's memory goes back before the next one. */
#define TRIM_IDLE_S 0.2

static void *watchdog_main(void *arg)
{
    pool *p = arg;
    int worked = 0;       /* a request ran since the last trim */
    double last_busy = 0; /* when the workers last had something */
    pthread_mutex_lock(&p->lock);
    while (!p->stopping || p->head[0] || p->head[1] || p->n_running) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&p->idle, &p->lock, &ts);
        double now = api_now();
        for (int lane = 0; lane < 2; lane++)
            for (pool_job *j = p->head[lane]; j; j = j->next)
                if (j->deadline > 0 && now >= j->deadline) lens_cancel_set(&j->cancel, 1);
        for (int i = 0; i < p->n_threads; i++) {
            pool_job *j = p->running[i];
            if (j && j->deadline > 0 && now >= j->deadline) lens_cancel_set(&j->cancel, 1);
        }
        /* Freed request buffers stay in glibc's arenas (free chunks below
         * each arena's top are not given back), so RSS after a burst
         * depended on how fragmented the arenas were left: make soak saw
         * 12.4-13.6 MiB of anonymous memory between rounds, of which
         * malloc_trim(0) returned 2.9 MiB each time (gdb, 4 rounds). */
        if (p->n_running || p->queued || p->reserved) worked = 1, last_busy = now;
        else if (worked && now - last_busy >= TRIM_IDLE_S) {
            worked = 0;
            pthread_mutex_unlock(&p->lock);
            malloc_trim(0);
            pthread_mutex_lock(&p->lock);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

pool *pool_create(int n_workers, int n_fast, int capacity, int threads_per_worker, int fast_threads)
{
    pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_workers = n_workers;
    p->n_fast = n_fast;
    p->n_threads = n_workers + n_fast;
    p->threads_per_worker = threads_per_worker;
    p->fast_threads = fast_threads;
    p->capacity = capacity;
    p->running = calloc((size_t)p->n_threads, sizeof *p->running);
    p->threads = calloc((size_t)p->n_threads, sizeof *p->threads);
    if (!p->running || !p->threads) {
        free(p->running), free(p->threads), free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    for (int i = 0; i < p->n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        wa->p = p, wa->index = i;
        pthread_create(&p->threads[i], NULL, worker_main, wa);
    }
    pthread_create(&p->watchdog, NULL, watchdog_main, p);
    return p;
}

void pool_destroy(pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->work);
    pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_join(p->watchdog, NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->idle);
    free(p->running);
    free(p->threads);
    free(p);
}

int pool_reserve(pool *p)
{
    pthread_mutex_lock(&p->lock);
    int ok = !p->stopping && p->queued + p->reserved < p->capacity + p->n_threads - p->n_running;
    if (ok) p->reserved++;
    pthread_mutex_unlock(&p->lock);
    return ok;
}

void pool_submit(pool *p, pool_job *job)
{
    job->next = NULL;
    lens_cancel_set(&job->cancel, 0);
    int lane = job->cheap && p->n_fast > 0; /* one lane when there is no fast lane */
    pthread_mutex_lock(&p->lock);
    p->reserved--;
    p->queued++;
    job->seq = p->next_seq++;
    if (p->tail[lane]) p->tail[lane]->next = job;
    else p->head[lane] = job;
    p->tail[lane] = job;
    pthread_cond_broadcast(&p->work); /* the right kind of worker must wake */
    pthread_mutex_unlock(&p->lock);
}

int pool_queue_depth(pool *p)
{
    pthread_mutex_lock(&p->lock);
    int n = p->queued;
    pthread_mutex_unlock(&p->lock);
    return n;
}

int pool_running(pool *p)
{
    pthread_mutex_lock(&p->lock);
    int n = p->n_running;
    pthread_mutex_unlock(&p->lock);
    return n;
}
