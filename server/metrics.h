/* metrics.h - request counters and latency histograms for GET /metrics. */
#ifndef LENSD_METRICS_H
#define LENSD_METRICS_H

#include "api/json_writer.h"

/* route: index into api_routes, or -1 for requests that matched no route. */
void metrics_record(int route, int status, double seconds);

/* Prometheus text exposition of the counters and histograms. */
void metrics_write(jw *w);

#endif
