/* log.h - one JSON line per event on stderr. */
#ifndef LENSD_LOG_H
#define LENSD_LOG_H

#include <stdarg.h>

#include "api/json_writer.h"

/* Starts a line {"time": "...", "level": level, ... : add keys to w, then
 * log_emit(w). */
void log_begin(jw *w, const char *level);
void log_emit(jw *w);

/* Levels are "debug", "info", "warn" and "error". */

/* {"time", "level", "msg"} */
void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A library's own message (libmicrohttpd's MHD_OPTION_EXTERNAL_LOGGER;
 * cls is the library's name): {"time", "level": "debug", "source", "msg"}.
 * Clients can cause these at will (a closed connection, a malformed
 * request), so at most 10 are written per second; the next line written
 * says how many were left out ("suppressed"). */
void log_library(void *cls, const char *fmt, va_list ap);

#endif
