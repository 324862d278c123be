/* stream.c - streamed responses: GET /v1/jobs/{id}/events (SSE).
 *
 * Owns: the libmicrohttpd callback responses of streaming routes, and the
 * ticker thread that wakes them. A stream's source (api_call.stream_read,
 * e.g. server/jobs.c's job events) answers bytes, "nothing yet" or "end".
 * On "nothing yet" the content reader suspends its connection (the only
 * way libmicrohttpd's internal polling thread does not busy-wait on it) and
 * the ticker resumes it every tick_ms, so a stream costs one poll per tick
 * and the polling thread never blocks. One mutex orders suspend and resume:
 * resume is only called on a connection this file suspended. */
#include "server/stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

typedef struct stream {
    streams *owner;
    struct MHD_Connection *conn;
    long (*read)(void *user, char *buf, size_t max);
    void (*free_user)(void *user);
    void *user;
    int suspended; /* guarded by owner->lock */
    struct stream *next;
} stream;

struct streams {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    stream *all;
    int closing;
    int tick_ms;
    pthread_t ticker;
    int has_ticker;
};

static void *ticker_main(void *arg)
{
    streams *st = arg;
    pthread_mutex_lock(&st->lock);
    while (!st->closing) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)st->tick_ms * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&st->wake, &st->lock, &until);
        for (stream *s = st->all; s; s = s->next) {
            if (!s->suspended) continue;
            s->suspended = 0;
            MHD_resume_connection(s->conn);
        }
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

streams *streams_create(int tick_ms)
{
    streams *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->tick_ms = tick_ms > 0 ? tick_ms : 200;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->wake, NULL);
    st->has_ticker = pthread_create(&st->ticker, NULL, ticker_main, st) == 0;
    return st;
}

void streams_close_all(streams *st)
{
    if (!st) return;
    pthread_mutex_lock(&st->lock);
    st->closing = 1;
    for (stream *s = st->all; s; s = s->next) {
        if (!s->suspended) continue;
        s->suspended = 0;
        MHD_resume_connection(s->conn);
    }
    pthread_cond_broadcast(&st->wake);
    pthread_mutex_unlock(&st->lock);
    if (st->has_ticker) pthread_join(st->ticker, NULL);
    st->has_ticker = 0;
}

void streams_destroy(streams *st)
{
    if (!st) return;
    streams_close_all(st);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->wake);
    free(st);
}

static ssize_t on_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream *s = cls;
    streams *st = s->owner;
    pthread_mutex_lock(&st->lock);
    int closing = st->closing;
    pthread_mutex_unlock(&st->lock);
    if (closing) return MHD_CONTENT_READER_END_OF_STREAM;
    long n = s->read(s->user, buf, max);
    if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n > 0) return (ssize_t)n;
    pthread_mutex_lock(&st->lock);
    if (!st->closing) {
        MHD_suspend_connection(s->conn);
        s->suspended = 1;
    }
    pthread_mutex_unlock(&st->lock);
    return 0;
}

static void on_free(void *cls)
{
    stream *s = cls;
    streams *st = s->owner;
    pthread_mutex_lock(&st->lock);
    for (stream **pp = &st->all; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&st->lock);
    if (s->free_user) s->free_user(s->user);
    free(s);
}

struct MHD_Response *streams_response(streams *st, struct MHD_Connection *conn, api_call *c)
{
    stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->owner = st;
    s->conn = conn;
    s->read = c->stream_read;
    s->free_user = c->stream_free;
    s->user = c->stream_user;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, on_read, s, on_free);
    if (!resp) {
        free(s);
        return NULL;
    }
    c->stream_read = NULL, c->stream_free = NULL, c->stream_user = NULL; /* the response owns them now */
    pthread_mutex_lock(&st->lock);
    s->next = st->all;
    st->all = s;
    pthread_mutex_unlock(&st->lock);
    return resp;
}
