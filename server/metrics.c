/* metrics.c - the counters behind GET /metrics.
 *
 * Owns: lensd_requests_total{method,route,status} and
 * lensd_request_duration_seconds{method,route} (histogram). One series set
 * per route-table row, and a row is a (method, path) pair, so two rows that
 * share a path (GET and DELETE /v1/jobs/{id}) differ by their method label
 * instead of printing the same series twice. The gauges
 * (queue depth, in-flight, model bytes) are read live by http.c when the
 * page is written. `route` is the route's path pattern ("/v1/models/{id}"),
 * never the raw URL, so label cardinality stays bounded; unmatched requests
 * count under method="", route="unmatched" (the raw method is client
 * text and would make cardinality unbounded). */
#include "server/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"

#define MAX_ROUTES 64
#define MAX_STATUSES 24

static const double buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
#define N_BUCKETS (int)(sizeof buckets / sizeof *buckets)

typedef struct {
    int status[MAX_STATUSES];
    unsigned long long count[MAX_STATUSES];
    int n_status;
    unsigned long long bucket[N_BUCKETS];
    unsigned long long observations;
    double sum;
} route_metrics;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static route_metrics routes[MAX_ROUTES + 1]; /* last: unmatched */

void metrics_record(int route, int status, double seconds)
{
    if (route < 0 || route >= api_n_routes || route >= MAX_ROUTES) route = MAX_ROUTES;
    pthread_mutex_lock(&lock);
    route_metrics *r = &routes[route];
    int i = 0;
    while (i < r->n_status && r->status[i] != status) i++;
    if (i == r->n_status && i < MAX_STATUSES) r->status[r->n_status++] = status;
    if (i < MAX_STATUSES) r->count[i]++;
    for (int b = 0; b < N_BUCKETS; b++)
        if (seconds <= buckets[b]) r->bucket[b]++;
    r->observations++;
    r->sum += seconds;
    pthread_mutex_unlock(&lock);
}

/* method="...",route="..." of slot i, the labels every series of the slot shares */
static void route_labels(int i, char *out, size_t size)
{
    if (i == MAX_ROUTES) snprintf(out, size, "method=\"\",route=\"unmatched\"");
    else snprintf(out, size, "method=\"%s\",route=\"%s\"", api_routes[i].method, api_routes[i].path);
}

void metrics_write(jw *w)
{
    char line[512], labels[320];
    int n;
    pthread_mutex_lock(&lock);
    n = snprintf(line, sizeof line,
                 "# HELP lensd_requests_total HTTP requests by method, route pattern and status.\n"
                 "# TYPE lensd_requests_total counter\n");
    jw_raw(w, line, (size_t)n);
    for (int i = 0; i <= MAX_ROUTES; i++) {
        if (i < MAX_ROUTES && i >= api_n_routes) continue;
        route_metrics *r = &routes[i];
        route_labels(i, labels, sizeof labels);
        for (int s = 0; s < r->n_status; s++) {
            n = snprintf(line, sizeof line, "lensd_requests_total{%s,status=\"%d\"} %llu\n", labels, r->status[s],
                         r->count[s]);
            jw_raw(w, line, (size_t)n);
        }
    }
    n = snprintf(line, sizeof line,
                 "# HELP lensd_request_duration_seconds Time from request headers to response, by method and route.\n"
                 "# TYPE lensd_request_duration_seconds histogram\n");
    jw_raw(w, line, (size_t)n);
    for (int i = 0; i <= MAX_ROUTES; i++) {
        if (i < MAX_ROUTES && i >= api_n_routes) continue;
        route_metrics *r = &routes[i];
        if (i == MAX_ROUTES && !r->observations) continue;
        route_labels(i, labels, sizeof labels);
        for (int b = 0; b < N_BUCKETS; b++) {
            n = snprintf(line, sizeof line, "lensd_request_duration_seconds_bucket{%s,le=\"%g\"} %llu\n", labels,
                         buckets[b], r->bucket[b]);
            jw_raw(w, line, (size_t)n);
        }
        n = snprintf(line, sizeof line,
                     "lensd_request_duration_seconds_bucket{%s,le=\"+Inf\"} %llu\n"
                     "lensd_request_duration_seconds_sum{%s} %.6f\n"
                     "lensd_request_duration_seconds_count{%s} %llu\n",
                     labels, r->observations, labels, r->sum, labels, r->observations);
        jw_raw(w, line, (size_t)n);
    }
    pthread_mutex_unlock(&lock);
}
