/* pool.c - worker threads, the bounded queue, and deadlines.
 *
 * Owns: the worker threads and everything queued or running on them. One
 * mutex guards the queue; workers wait on `work`. The watchdog wakes every
 * 10 ms and raises the cancel flag of queued or running jobs whose deadline
 * has passed; a cancelled job still runs its fn (which sees the flag and
 * answers "timeout") so that every suspended connection is resumed. */
#include "server/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "api/api.h"

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work, idle;
    pool_job *head, *tail;
    int queued, reserved, capacity;
    int n_workers;
    int threads_per_worker;
    pool_job **running; /* [n_workers], NULL when idle */
    int n_running;
    int stopping;
    pthread_t *threads;
    pthread_t watchdog;
};

typedef struct {
    pool *p;
    int index;
} worker_arg;

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    pool *p = wa->p;
    int index = wa->index;
    free(wa);
    lens_pool *threads = lens_pool_create(p->threads_per_worker); /* NULL: compute on this thread alone */
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stopping) pthread_cond_wait(&p->work, &p->lock);
        if (!p->head) break; /* stopping and drained */
        pool_job *job = p->head;
        p->head = job->next;
        if (!p->head) p->tail = NULL;
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

static void *watchdog_main(void *arg)
{
    pool *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stopping || p->head || p->n_running) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&p->idle, &p->lock, &ts);
        double now = api_now();
        for (pool_job *j = p->head; j; j = j->next)
            if (j->deadline > 0 && now >= j->deadline) lens_cancel_set(&j->cancel, 1);
        for (int i = 0; i < p->n_workers; i++) {
            pool_job *j = p->running[i];
            if (j && j->deadline > 0 && now >= j->deadline) lens_cancel_set(&j->cancel, 1);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

pool *pool_create(int n_workers, int capacity, int threads_per_worker)
{
    pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_workers = n_workers;
    p->threads_per_worker = threads_per_worker;
    p->capacity = capacity;
    p->running = calloc((size_t)n_workers, sizeof *p->running);
    p->threads = calloc((size_t)n_workers, sizeof *p->threads);
    if (!p->running || !p->threads) {
        free(p->running), free(p->threads), free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    for (int i = 0; i < n_workers; i++) {
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
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
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
    int ok = !p->stopping && p->queued + p->reserved < p->capacity + p->n_workers - p->n_running;
    if (ok) p->reserved++;
    pthread_mutex_unlock(&p->lock);
    return ok;
}

void pool_submit(pool *p, pool_job *job)
{
    job->next = NULL;
    lens_cancel_set(&job->cancel, 0);
    pthread_mutex_lock(&p->lock);
    p->reserved--;
    p->queued++;
    if (p->tail) p->tail->next = job;
    else p->head = job;
    p->tail = job;
    pthread_cond_signal(&p->work);
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
