/* jobs.c - the async job store and its threads.
 *
 * Owns: every job from POST /v1/jobs (or an endpoint's async: true) until it
 * expires, the job threads, cancellation and expiry. One mutex guards the
 * store; job threads wait on `work`. A job holds the request body and the
 * decoded request its kind's prepare() made; a job thread runs the kind's
 * run() on a private api_call whose cancel flag is the job's (set by
 * DELETE or shutdown) and whose progress callback updates the job. The
 * result is kept as JSON text and written verbatim into GET responses.
 * Expired jobs are swept whenever the store is touched. A job belongs to
 * the API key that created it (api_call.principal): lookups by another key
 * find nothing (404). Each key may hold an equal share of the store
 * (max_stored / keys, at least 1); a key at its share, or finding the store
 * full, makes room by dropping its own finished job that finished first,
 * never another key's, so only a key's own queued and running jobs can
 * refuse its next one, and one key's jobs never push out another's results. */
#include "server/jobs.h"

#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "api/request.h"

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED } job_state;

static const char *const state_names[] = {"queued", "running", "done", "failed", "cancelled"};

typedef struct jobs jobs;

typedef struct job {
    char id[24];
    int principal;             /* api_call.principal of the request that created it */
    jobs *owner;
    const api_job_kind *kind;
    const api_ctx *ctx;
    job_state state;
    double progress;           /* 0..1 */
    volatile int cancel;       /* DELETE or shutdown */
    json_t *body;              /* params: the kind's run() reads it (decoded requests point into it) */
    void *req;                 /* the kind's decoded request */
    void (*free_req)(void *req);
    api_model *model_ref;      /* counted reference to the job's model until it has run (api_call_free drops it) */
    char model_name[136];      /* a copy: the model may be unloaded while the job is stored */
    char *result;              /* done: JSON text */
    size_t result_len;
    char *error;               /* failed / cancelled: JSON text of {code, message, field} */
    double created, started, finished; /* wall clock seconds (0 = not yet) */
    double finished_mono;      /* api_now() when it finished, for the TTL */
    struct job *next;          /* store list, newest first */
    struct job *queue_next;    /* FIFO of queued jobs */
} job;

struct jobs {
    pthread_mutex_t lock;
    pthread_cond_t work;
    job *all;
    job *queue_head, *queue_tail;
    int n_stored, max_stored;
    int per_key; /* jobs one principal may hold: max_stored / keys, at least 1 */
    int n_threads;
    pthread_t *threads;
    double ttl;
    int debug_delay_ms;
    int threads_per_job;
    int stopping;
    double sse_keepalive; /* seconds between keep-alive comments on an idle event stream */
    unsigned long long id_seed, id_counter;
};

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

/* splitmix64: ids that are unique per process and not guessable from each other */
static unsigned long long mix64(unsigned long long x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void job_free(job *jb)
{
    if (jb->req && jb->free_req) jb->free_req(jb->req);
    api_model_release(jb->ctx, jb->model_ref); /* a job cancelled before it ran */
    if (jb->body) json_decref(jb->body);
    free(jb->result);
    free(jb->error);
    free(jb);
}

static char *error_json(const char *code, const char *message)
{
    json_t *e = json_pack("{s:s, s:s, s:n}", "code", code, "message", message, "field");
    char *s = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return s;
}

/* Drop finished jobs older than the TTL. Lock held. */
static void sweep(jobs *j)
{
    double now = api_now();
    job **pp = &j->all;
    while (*pp) {
        job *jb = *pp;
        if (jb->state >= JOB_DONE && now - jb->finished_mono >= j->ttl) {
            *pp = jb->next;
            j->n_stored--;
            job_free(jb);
        } else {
            pp = &jb->next;
        }
    }
}

/* The job id of principal, or NULL (unknown, expired, or another key's). Lock held. */
static job *find(jobs *j, const char *id, int principal)
{
    for (job *jb = j->all; jb; jb = jb->next)
        if (!strcmp(jb->id, id)) return jb->principal == principal ? jb : NULL;
    return NULL;
}

/* Unlink jb from the store and free it. Lock held; jb is finished (no thread holds it). */
static void drop(jobs *j, job *jb)
{
    job **pp = &j->all;
    while (*pp && *pp != jb) pp = &(*pp)->next;
    if (!*pp) return;
    *pp = jb->next;
    j->n_stored--;
    job_free(jb);
}

/* Jobs of principal in the store. Lock held. */
static int count_of(const jobs *j, int principal)
{
    int n = 0;
    for (const job *jb = j->all; jb; jb = jb->next) n += jb->principal == principal;
    return n;
}

/* Drops principal's finished job that finished first; 0 when every job of
 * principal is still queued or running (or it has none). Lock held. */
static int make_room(jobs *j, int principal)
{
    job *oldest = NULL;
    for (job *jb = j->all; jb; jb = jb->next)
        if (jb->principal == principal && jb->state >= JOB_DONE &&
            (!oldest || jb->finished_mono < oldest->finished_mono))
            oldest = jb;
    if (!oldest) return 0;
    drop(j, oldest);
    return 1;
}

/* Room for one more job of c's principal, made from its own finished jobs;
 * 0 and a 429 in c when there is none. Lock held. */
static int admit(jobs *j, api_call *c)
{
    int own = count_of(j, c->principal);
    if (own < j->per_key && j->n_stored < j->max_stored) return 1;
    if (make_room(j, c->principal)) return 1;
    c->retry_after = 60;
    if (own >= j->per_key)
        api_fail(c, 429, "too_many_jobs", NULL,
                 "%d jobs of this API key are queued or running (its share of the store); retry when one finishes",
                 own);
    else
        api_fail(c, 429, "too_many_jobs", NULL,
                 "the store's %d jobs are full (more API keys than --max-stored-jobs); retry when one expires",
                 j->max_stored);
    return 0;
}

static void write_time(jw *w, const char *key, double t)
{
    jw_key(w, key);
    if (t <= 0) {
        jw_null(w);
        return;
    }
    time_t sec = (time_t)t;
    struct tm tm;
    gmtime_r(&sec, &tm);
    char buf[96];
    int ms = (int)((t - (double)sec) * 1000);
    if (ms < 0) ms = 0;
    snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, ms > 999 ? 999 : ms);
    jw_str(w, buf);
}

/* The job object of every job response. Lock held. */
static void write_job(jw *w, const job *jb, double ttl)
{
    jw_obj(w);
    jw_key(w, "id");
    jw_str(w, jb->id);
    jw_key(w, "kind");
    jw_str(w, jb->kind->kind);
    jw_key(w, "state");
    jw_str(w, state_names[jb->state]);
    jw_key(w, "progress");
    jw_float(w, jb->progress, 4);
    jw_key(w, "model");
    jw_str(w, jb->model_name[0] ? jb->model_name : NULL);
    write_time(w, "created", jb->created);
    write_time(w, "started", jb->started);
    write_time(w, "finished", jb->finished);
    if (jb->state >= JOB_DONE) write_time(w, "expires", jb->finished + ttl);
    if (jb->result) {
        jw_key(w, "result");
        jw_raw_value(w, jb->result, jb->result_len);
    }
    if (jb->error) {
        jw_key(w, "error");
        jw_raw_value(w, jb->error, strlen(jb->error));
    }
    jw_end(w);
}

static void on_progress(void *user, double fraction)
{
    job *jb = user;
    pthread_mutex_lock(&jb->owner->lock);
    jb->progress = fraction;
    pthread_mutex_unlock(&jb->owner->lock);
}

/* Store the outcome of run(). Lock held. */
static void finish(job *jb, api_call *c)
{
    jb->finished = wall_now();
    jb->finished_mono = api_now();
    if (lens_cancelled(&jb->cancel)) {
        jb->state = JOB_CANCELLED;
        jb->error = error_json("cancelled", "the job was cancelled (DELETE /v1/jobs/{id} or shutdown)");
        return;
    }
    if (c->status == 200 && !c->out.oom) {
        jb->state = JOB_DONE;
        jb->progress = 1;
        jb->result = jw_take(&c->out, &jb->result_len);
        return;
    }
    jb->state = JOB_FAILED;
    /* c->out is {"error": {...}} from api_fail: keep the inner object */
    json_t *body = json_loadb(c->out.buf ? c->out.buf : "", c->out.len, 0, NULL);
    json_t *inner = json_object_get(body, "error");
    jb->error = inner ? json_dumps(inner, JSON_COMPACT) : error_json("internal", "the job failed");
    json_decref(body);
}

static void *job_thread(void *arg)
{
    jobs *j = arg;
    lens_pool *threads = lens_pool_create(j->threads_per_job); /* NULL: compute on this thread alone */
    pthread_mutex_lock(&j->lock);
    for (;;) {
        while (!j->queue_head && !j->stopping) pthread_cond_wait(&j->work, &j->lock);
        if (!j->queue_head) break;
        job *jb = j->queue_head;
        j->queue_head = jb->queue_next;
        if (!j->queue_head) j->queue_tail = NULL;
        jb->state = JOB_RUNNING;
        jb->started = wall_now();
        pthread_mutex_unlock(&j->lock);

        api_call c;
        api_call_init(&c, jb->ctx, api_now());
        c.body = jb->body;
        c.req = jb->req;
        c.free_req = jb->free_req;
        c.model_ref = jb->model_ref;
        jb->body = NULL, jb->req = NULL, jb->model_ref = NULL;
        c.cancel = &jb->cancel;
        c.threads = threads;
        c.job_kind = jb->kind;
        c.field_prefix = "params."; /* run-time errors name the params field, as prepare's do */
        c.progress = on_progress;
        c.progress_user = jb;
        for (int waited = 0; waited < j->debug_delay_ms && !lens_cancelled(&jb->cancel); waited += 10) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (!lens_cancelled(&jb->cancel)) jb->kind->run(&c);

        pthread_mutex_lock(&j->lock);
        finish(jb, &c);
        pthread_mutex_unlock(&j->lock);
        api_call_free(&c); /* frees body and request outside the lock */
        pthread_mutex_lock(&j->lock);
    }
    pthread_mutex_unlock(&j->lock);
    lens_pool_free(threads);
    return NULL;
}

jobs *jobs_create(int max_running, int max_stored, int n_keys, double ttl_seconds, int threads_per_job,
                  int debug_delay_ms)
{
    jobs *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->threads = calloc((size_t)max_running, sizeof *j->threads);
    if (!j->threads) {
        free(j);
        return NULL;
    }
    j->max_stored = max_stored;
    int share = max_stored / (n_keys > 0 ? n_keys : 1);
    j->per_key = share > 0 ? share : 1;
    j->ttl = ttl_seconds;
    j->debug_delay_ms = debug_delay_ms;
    j->sse_keepalive = 15;
    j->threads_per_job = threads_per_job;
    unsigned long long seed = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32);
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        unsigned long long r;
        if (read(fd, &r, sizeof r) == (ssize_t)sizeof r) seed ^= r;
        close(fd);
    }
    j->id_seed = seed;
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->work, NULL);
    for (int i = 0; i < max_running; i++) {
        if (pthread_create(&j->threads[i], NULL, job_thread, j)) break;
        j->n_threads++;
    }
    return j;
}

void jobs_destroy(jobs *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->lock);
    j->stopping = 1;
    for (job *jb = j->all; jb; jb = jb->next) lens_cancel_set(&jb->cancel, 1);
    /* queued jobs never start */
    for (job *jb = j->queue_head; jb; jb = jb->queue_next) {
        jb->state = JOB_CANCELLED;
        jb->finished = wall_now();
    }
    j->queue_head = j->queue_tail = NULL;
    pthread_cond_broadcast(&j->work);
    pthread_mutex_unlock(&j->lock);
    for (int i = 0; i < j->n_threads; i++) pthread_join(j->threads[i], NULL);
    while (j->all) {
        job *jb = j->all;
        j->all = jb->next;
        job_free(jb);
    }
    pthread_mutex_destroy(&j->lock);
    pthread_cond_destroy(&j->work);
    free(j->threads);
    free(j);
}

void jobs_submit(jobs *j, api_call *c, const api_job_kind *kind)
{
    job *jb = calloc(1, sizeof *jb);
    if (!jb) {
        api_fail(c, 500, "internal", NULL, "out of memory");
        return;
    }
    pthread_mutex_lock(&j->lock);
    sweep(j);
    if (j->stopping) {
        pthread_mutex_unlock(&j->lock);
        free(jb);
        api_fail(c, 503, "shutting_down", NULL, "the server is shutting down");
        return;
    }
    if (!admit(j, c)) {
        pthread_mutex_unlock(&j->lock);
        free(jb);
        return;
    }
    snprintf(jb->id, sizeof jb->id, "%016llx", mix64(j->id_seed + j->id_counter++));
    jb->owner = j;
    jb->principal = c->principal;
    jb->kind = kind;
    jb->ctx = c->ctx;
    jb->state = JOB_QUEUED;
    jb->created = wall_now();
    snprintf(jb->model_name, sizeof jb->model_name, "%s", c->model_name ? c->model_name : "");
    jb->model_ref = c->model_ref, c->model_ref = NULL;
    jb->body = c->body, c->body = NULL;
    jb->req = c->req, c->req = NULL;
    jb->free_req = c->free_req;
    jb->next = j->all;
    j->all = jb;
    j->n_stored++;
    if (j->queue_tail) j->queue_tail->queue_next = jb;
    else j->queue_head = jb;
    j->queue_tail = jb;
    pthread_cond_signal(&j->work);
    jw_free(&c->out);
    write_job(&c->out, jb, j->ttl);
    c->status = 202;
    pthread_mutex_unlock(&j->lock);
}

void jobs_get(jobs *j, api_call *c, const char *id)
{
    pthread_mutex_lock(&j->lock);
    sweep(j);
    job *jb = find(j, id, c->principal);
    if (jb) {
        write_job(&c->out, jb, j->ttl);
        c->status = 200;
    }
    pthread_mutex_unlock(&j->lock);
    if (!jb) api_fail(c, 404, "job_not_found", "id", "no job \"%.64s\" (unknown, or expired)", id);
}

void jobs_cancel(jobs *j, api_call *c, const char *id)
{
    pthread_mutex_lock(&j->lock);
    sweep(j);
    job *jb = find(j, id, c->principal);
    int finished = jb && jb->state >= JOB_DONE;
    if (jb && jb->state == JOB_QUEUED) {
        /* unlink from the queue; it never runs */
        job **pp = &j->queue_head;
        job *prev = NULL;
        while (*pp && *pp != jb) prev = *pp, pp = &(*pp)->queue_next;
        if (*pp) {
            *pp = jb->queue_next;
            if (j->queue_tail == jb) j->queue_tail = prev;
        }
        lens_cancel_set(&jb->cancel, 1);
        jb->state = JOB_CANCELLED;
        jb->finished = wall_now();
        jb->finished_mono = api_now();
        jb->error = error_json("cancelled", "the job was cancelled before it started");
    } else if (jb && jb->state == JOB_RUNNING) {
        lens_cancel_set(&jb->cancel, 1); /* run() stops at its next check; the state turns cancelled then */
    }
    if (jb) {
        write_job(&c->out, jb, j->ttl);
        c->status = 200;
    }
    if (finished) drop(j, jb); /* answered with its last state; gone from now on */
    pthread_mutex_unlock(&j->lock);
    if (!jb) api_fail(c, 404, "job_not_found", "id", "no job \"%.64s\" (unknown, or expired)", id);
}

void jobs_write_metrics(jobs *j, jw *w)
{
    int counts[5] = {0};
    pthread_mutex_lock(&j->lock);
    sweep(j);
    for (job *jb = j->all; jb; jb = jb->next) counts[jb->state]++;
    pthread_mutex_unlock(&j->lock);
    char line[256];
    int n = snprintf(line, sizeof line, "# HELP lensd_jobs Stored async jobs by state.\n# TYPE lensd_jobs gauge\n");
    jw_raw(w, line, (size_t)n);
    for (int s = 0; s < 5; s++) {
        n = snprintf(line, sizeof line, "lensd_jobs{state=\"%s\"} %d\n", state_names[s], counts[s]);
        jw_raw(w, line, (size_t)n);
    }
}

void jobs_list(jobs *j, api_call *c, const char *state, int limit)
{
    int want = -1;
    for (int s = 0; state && s < 5; s++)
        if (!strcmp(state, state_names[s])) want = s;
    if (state && want < 0) {
        api_fail(c, 422, "invalid_request", "state",
                 "state must be one of queued, running, done, failed, cancelled (got \"%.40s\")", state);
        return;
    }
    jw *w = &c->out;
    pthread_mutex_lock(&j->lock);
    sweep(j);
    int total = 0;
    jw_obj(w);
    jw_key(w, "jobs");
    jw_arr(w);
    /* the store list is newest first; results are left out (GET /v1/jobs/{id} has them) */
    for (job *jb = j->all; jb; jb = jb->next) {
        if (jb->principal != c->principal || (want >= 0 && (int)jb->state != want)) continue;
        if (total++ >= limit) continue;
        char *result = jb->result;
        jb->result = NULL;
        write_job(w, jb, j->ttl);
        jb->result = result;
    }
    jw_end(w);
    jw_key(w, "total");
    jw_int(w, total);
    jw_end(w);
    pthread_mutex_unlock(&j->lock);
    c->status = 200;
}

/* ------------------------------------------------ GET /v1/jobs/{id}/events */

/* One SSE subscriber: what it was last sent, and the unsent rest of an event. */
typedef struct {
    jobs *owner;
    char id[24];
    int principal;
    int sent_any, ended;
    job_state last_state;
    double last_progress;
    double last_sent; /* api_now() */
    jw pending;
    size_t pending_off;
} job_events;

static void events_free(void *user)
{
    job_events *ev = user;
    jw_free(&ev->pending);
    free(ev);
}

/* "event: NAME\ndata: JSON\n\n" into ev->pending; data is jb's job object
 * when jb is given, else error_data. Lock held. */
static void queue_event(job_events *ev, const char *name, const job *jb, const char *error_data)
{
    jw *w = &ev->pending;
    jw data;
    jw_init(&data);
    if (jb) write_job(&data, jb, ev->owner->ttl);
    else jw_raw(&data, error_data, strlen(error_data));
    jw_reset(w);
    jw_raw(w, "event: ", 7);
    jw_raw(w, name, strlen(name));
    jw_raw(w, "\ndata: ", 7);
    if (data.buf) jw_raw(w, data.buf, data.len);
    jw_raw(w, "\n\n", 2);
    jw_free(&data);
    ev->pending_off = 0;
}

/* The next bytes of the stream: a state or progress change, a keep-alive
 * comment when nothing was sent for keepalive seconds, else 0 (poll later).
 * Ends after the event of a terminal state (done, failed, cancelled). */
static long events_read(void *user, char *buf, size_t max)
{
    job_events *ev = user;
    if (ev->pending_off < ev->pending.len) {
        size_t n = ev->pending.len - ev->pending_off;
        if (n > max) n = max;
        memcpy(buf, ev->pending.buf + ev->pending_off, n);
        ev->pending_off += n;
        return (long)n;
    }
    if (ev->ended) return -1;
    jobs *j = ev->owner;
    double now = api_now();
    pthread_mutex_lock(&j->lock);
    job *jb = find(j, ev->id, ev->principal);
    if (!jb) {
        queue_event(ev, "error", NULL, "{\"code\":\"job_not_found\",\"message\":\"the job expired\",\"field\":\"id\"}");
        ev->ended = 1;
    } else if (!ev->sent_any || jb->state != ev->last_state || jb->progress != ev->last_progress) {
        queue_event(ev, jb->state >= JOB_DONE ? state_names[jb->state] : "progress", jb, NULL);
        ev->sent_any = 1;
        ev->last_state = jb->state;
        ev->last_progress = jb->progress;
        ev->ended = jb->state >= JOB_DONE;
    } else if (now - ev->last_sent >= j->sse_keepalive) {
        jw_reset(&ev->pending);
        jw_raw(&ev->pending, ": keep-alive\n\n", 14);
        ev->pending_off = 0;
    }
    pthread_mutex_unlock(&j->lock);
    if (ev->pending_off >= ev->pending.len) return 0;
    ev->last_sent = now;
    return events_read(user, buf, max);
}

void jobs_events(jobs *j, api_call *c, const char *id)
{
    pthread_mutex_lock(&j->lock);
    sweep(j);
    int known = find(j, id, c->principal) != NULL;
    pthread_mutex_unlock(&j->lock);
    if (!known) {
        api_fail(c, 404, "job_not_found", "id", "no job \"%.64s\" (unknown, or expired)", id);
        return;
    }
    job_events *ev = calloc(1, sizeof *ev);
    if (!ev) {
        api_fail(c, 500, "internal", NULL, "out of memory");
        return;
    }
    ev->owner = j;
    ev->principal = c->principal;
    snprintf(ev->id, sizeof ev->id, "%s", id);
    ev->last_sent = api_now();
    jw_init(&ev->pending);
    c->content_type = "text/event-stream";
    c->stream_read = events_read;
    c->stream_free = events_free;
    c->stream_user = ev;
    c->status = 200;
}

void jobs_set_keepalive(jobs *j, double seconds)
{
    j->sse_keepalive = seconds;
}
