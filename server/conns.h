/* conns.h - the open client connections and their header and body deadlines.
 *
 * libmicrohttpd's idle timeout restarts with every byte, so a client that
 * trickles one header line every few seconds ("slowloris") would hold its
 * connection for ever. Every connection is tracked from accept to close. A
 * new connection must send a whole request header within --header-timeout
 * seconds of its accept; a kept-alive one, within --header-timeout of the
 * first line of its next request (while it sends nothing, --idle-timeout
 * applies, so gateways can keep upstream connections open). Past the
 * deadline a reaper thread shuts the socket down and libmicrohttpd closes
 * it. A request body, once its header is complete, must arrive whole within
 * --body-timeout seconds, however slowly it trickles (the same attack on
 * the body). A connection whose request is being computed or answered is
 * left alone (--idle-timeout covers silence). */
#ifndef LENSD_CONNS_H
#define LENSD_CONNS_H

#include <microhttpd.h>

typedef struct conns conns;

/* Starts the reaper thread; NULL when out of memory or threads. */
conns *conns_create(double header_timeout, double body_timeout);
/* Stops the reaper and frees what is left; after MHD_stop_daemon. */
void conns_destroy(conns *cs);

/* MHD_OPTION_NOTIFY_CONNECTION callback (cls = the conns). */
void conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                  enum MHD_ConnectionNotificationCode code);
/* MHD_OPTION_URI_LOG_CALLBACK (cls = the conns): a request line arrived;
 * on a kept-alive connection its header deadline starts now. Returns NULL
 * (the request's initial per-request pointer). */
void *conns_request_line(void *cls, const char *uri, struct MHD_Connection *conn);
/* A request's header is complete: the deadline no longer applies. */
void conns_header_done(conns *cs, struct MHD_Connection *conn);
/* After conns_header_done: a body follows; its deadline starts now. */
void conns_body_expected(conns *cs, struct MHD_Connection *conn);
/* The whole body has arrived: the body deadline no longer applies. */
void conns_body_done(conns *cs, struct MHD_Connection *conn);
/* 1 when the connection was shut down at its body deadline (for the
 * request's log line, written before the connection closes). */
int conns_body_expired(conns *cs, struct MHD_Connection *conn);
/* A request was answered: the connection idles until its next request line. */
void conns_request_done(conns *cs, struct MHD_Connection *conn);

/* Open connections, and connections closed for a late header or body since start. */
int conns_open(conns *cs);
long long conns_reaped(conns *cs);

#endif
