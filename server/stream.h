/* stream.h - streamed responses (Server-Sent Events) on libmicrohttpd's
 * internal polling thread, without busy waiting (server/stream.c). */
#ifndef LENSD_STREAM_H
#define LENSD_STREAM_H

#include <microhttpd.h>

#include "api/api.h"

typedef struct streams streams;

/* tick_ms: how often a waiting stream is polled for news. */
streams *streams_create(int tick_ms);
/* Ends every open stream (their next read is end-of-stream), wakes them and
 * stops the ticker; call before MHD_stop_daemon (no connection may stay suspended). */
void streams_close_all(streams *st);
void streams_destroy(streams *st);

/* A response reading c's stream (c->stream_read ...), which it takes over;
 * NULL when out of memory. */
struct MHD_Response *streams_response(streams *st, struct MHD_Connection *conn, api_call *c);

#endif
