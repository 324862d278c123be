/* http.h - the libmicrohttpd daemon: accept, route, limit, queue, respond. */
#ifndef LENSD_HTTP_H
#define LENSD_HTTP_H

#include "api/api.h"
#include "server/config.h"
#include "server/registry.h"

typedef struct server server;

/* Starts listening (state LOADING: /healthz answers, /readyz is 503) and the
 * worker pool. Returns NULL after logging why. */
server *server_start(const lensd_config *cfg);
int server_port(const server *s);
/* Publish the model registry (its hooks) and turn ready. */
void server_set_registry(server *s, registry *models);
/* Refuse new work (503), wait up to max_wait seconds for in-flight requests
 * to be answered. Returns the number still in flight (0 = clean). */
int server_drain(server *s, double max_wait);
/* Stop the daemon and the pool; frees s (not the models). */
void server_stop(server *s);

#endif
