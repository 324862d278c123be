/* log.c - structured logging: one JSON object per line on stderr.
 *
 * Owns: the log line format. Every line has "time" (UTC, RFC 3339 with
 * milliseconds) and "level"; request lines are built by http.c with
 * request_id, method, path, route, status, ms, tokens, model. A line is
 * written with one fwrite so concurrent lines never interleave. Messages of
 * libraries (libmicrohttpd) are wrapped into the same shape and rate-limited. */
#include "server/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* A line stamped with ts (CLOCK_REALTIME). */
static void log_begin_at(jw *w, const char *level, const struct timespec *ts)
{
    struct tm tm;
    char stamp[64];
    gmtime_r(&ts->tv_sec, &tm);
    size_t n = strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(stamp + n, sizeof stamp - n, ".%03ldZ", ts->tv_nsec / 1000000);
    jw_init(w);
    jw_obj(w);
    jw_key(w, "time");
    jw_str(w, stamp);
    jw_key(w, "level");
    jw_str(w, level);
}

void log_begin(jw *w, const char *level)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    log_begin_at(w, level, &ts);
}

void log_emit(jw *w)
{
    jw_end(w);
    jw_raw(w, "\n", 1);
    if (!w->oom) fwrite(w->buf, 1, w->len, stderr);
    jw_free(w);
}

void log_msg(const char *level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jw w;
    log_begin(&w, level);
    jw_key(&w, "msg");
    jw_str(&w, msg);
    log_emit(&w);
}

#define LIBRARY_LINES_PER_SECOND 10

void log_library(void *cls, const char *fmt, va_list ap)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static time_t window;
    static int written;
    static long long suppressed;
    /* the window is the second the line is stamped with, read under the
     * lock: no stamped second holds more than the limit */
    struct timespec now;
    pthread_mutex_lock(&lock);
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec != window) window = now.tv_sec, written = 0;
    int allowed = written < LIBRARY_LINES_PER_SECOND;
    long long dropped = suppressed;
    if (allowed) written++, suppressed = 0;
    else suppressed++;
    pthread_mutex_unlock(&lock);
    if (!allowed) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = 0;
    jw w;
    log_begin_at(&w, "debug", &now);
    jw_key(&w, "source");
    jw_str(&w, cls ? (const char *)cls : "library");
    jw_key(&w, "msg");
    jw_str(&w, msg);
    if (dropped) {
        jw_key(&w, "suppressed");
        jw_int(&w, dropped);
    }
    log_emit(&w);
}
