/* conns.c - connection tracking and the header and body deadline reaper (conns.h).
 *
 * Owns: one `watch` per open connection (MHD's socket context, allocated at
 * NOTIFY_STARTED, freed at NOTIFY_CLOSED), a doubly linked list of them
 * under one mutex, and the reaper thread that checks the list twice a
 * second. The reaper may only touch a descriptor while its watch is in the
 * list: libmicrohttpd calls NOTIFY_CLOSED (which takes the mutex and
 * unlinks the watch) before it closes the socket, so a descriptor shut down
 * under the mutex cannot have been reused by another connection. */
#include "server/conns.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "api/api.h"

/* A connection's phase; the header deadline applies to the first two, the
 * body deadline to the third. */
enum { NEW, READING_HEADER, READING_BODY, BUSY, KEPT_ALIVE };

typedef struct watch {
    int fd;
    int phase;
    int reaped;      /* shut down once already */
    double deadline; /* api_now() by which the header (NEW, READING_HEADER) or body (READING_BODY) must be complete */
    struct watch *prev, *next;
} watch;

struct conns {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* stop */
    pthread_t reaper;
    int stopping;
    double header_timeout, body_timeout;
    watch *head;
    int n_open;
    long long n_reaped;
};

static void *reaper_thread(void *arg)
{
    conns *cs = arg;
    pthread_mutex_lock(&cs->lock);
    while (!cs->stopping) {
        double now = api_now();
        for (watch *w = cs->head; w; w = w->next) {
            if (w->phase >= BUSY || w->reaped || now < w->deadline) continue;
            shutdown(w->fd, SHUT_RDWR); /* MHD sees the end of the stream and closes the connection */
            w->reaped = 1;
            cs->n_reaped++;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 500 * 1000 * 1000;
        if (until.tv_nsec >= 1000 * 1000 * 1000) until.tv_sec++, until.tv_nsec -= 1000 * 1000 * 1000;
        pthread_cond_timedwait(&cs->wake, &cs->lock, &until);
    }
    pthread_mutex_unlock(&cs->lock);
    return NULL;
}

conns *conns_create(double header_timeout, double body_timeout)
{
    conns *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->header_timeout = header_timeout;
    cs->body_timeout = body_timeout;
    pthread_mutex_init(&cs->lock, NULL);
    pthread_cond_init(&cs->wake, NULL);
    if (pthread_create(&cs->reaper, NULL, reaper_thread, cs)) {
        pthread_mutex_destroy(&cs->lock);
        pthread_cond_destroy(&cs->wake);
        free(cs);
        return NULL;
    }
    return cs;
}

void conns_destroy(conns *cs)
{
    if (!cs) return;
    pthread_mutex_lock(&cs->lock);
    cs->stopping = 1;
    pthread_cond_signal(&cs->wake);
    pthread_mutex_unlock(&cs->lock);
    pthread_join(cs->reaper, NULL);
    while (cs->head) {
        watch *w = cs->head;
        cs->head = w->next;
        free(w);
    }
    pthread_mutex_destroy(&cs->lock);
    pthread_cond_destroy(&cs->wake);
    free(cs);
}

static void link_watch(conns *cs, watch *w)
{
    w->next = cs->head;
    if (cs->head) cs->head->prev = w;
    cs->head = w;
    cs->n_open++;
}

static void unlink_watch(conns *cs, watch *w)
{
    if (w->prev) w->prev->next = w->next;
    else cs->head = w->next;
    if (w->next) w->next->prev = w->prev;
    cs->n_open--;
}

void conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                  enum MHD_ConnectionNotificationCode code)
{
    conns *cs = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        watch *w = calloc(1, sizeof *w);
        if (!w || !info) { /* untracked: only --idle-timeout applies to it */
            free(w);
            return;
        }
        w->fd = info->connect_fd;
        w->phase = NEW;
        w->deadline = api_now() + cs->header_timeout;
        pthread_mutex_lock(&cs->lock);
        link_watch(cs, w);
        pthread_mutex_unlock(&cs->lock);
        *socket_context = w;
        return;
    }
    watch *w = *socket_context;
    if (!w) return;
    pthread_mutex_lock(&cs->lock);
    unlink_watch(cs, w);
    pthread_mutex_unlock(&cs->lock);
    *socket_context = NULL;
    free(w);
}

static watch *watch_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

void *conns_request_line(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)uri;
    conns *cs = cls;
    watch *w = watch_of(conn);
    if (!w) return NULL;
    pthread_mutex_lock(&cs->lock);
    if (w->phase == KEPT_ALIVE) { /* a new connection keeps the deadline of its accept */
        w->phase = READING_HEADER;
        w->deadline = api_now() + cs->header_timeout;
    }
    pthread_mutex_unlock(&cs->lock);
    return NULL;
}

static void set_phase(conns *cs, struct MHD_Connection *conn, int phase)
{
    watch *w = watch_of(conn);
    if (!w) return;
    pthread_mutex_lock(&cs->lock);
    w->phase = phase;
    pthread_mutex_unlock(&cs->lock);
}

void conns_header_done(conns *cs, struct MHD_Connection *conn) { set_phase(cs, conn, BUSY); }

void conns_body_expected(conns *cs, struct MHD_Connection *conn)
{
    watch *w = watch_of(conn);
    if (!w) return;
    pthread_mutex_lock(&cs->lock);
    w->phase = READING_BODY;
    w->deadline = api_now() + cs->body_timeout; /* fixed: bytes arriving do not move it */
    pthread_mutex_unlock(&cs->lock);
}

void conns_body_done(conns *cs, struct MHD_Connection *conn) { set_phase(cs, conn, BUSY); }

int conns_body_expired(conns *cs, struct MHD_Connection *conn)
{
    watch *w = watch_of(conn);
    if (!w) return 0;
    pthread_mutex_lock(&cs->lock);
    int expired = w->reaped && w->phase == READING_BODY;
    pthread_mutex_unlock(&cs->lock);
    return expired;
}

void conns_request_done(conns *cs, struct MHD_Connection *conn) { set_phase(cs, conn, KEPT_ALIVE); }

int conns_open(conns *cs)
{
    pthread_mutex_lock(&cs->lock);
    int n = cs->n_open;
    pthread_mutex_unlock(&cs->lock);
    return n;
}

long long conns_reaped(conns *cs)
{
    pthread_mutex_lock(&cs->lock);
    long long n = cs->n_reaped;
    pthread_mutex_unlock(&cs->lock);
    return n;
}
