/* log.h - one JSON line per event on stderr. */
#ifndef LENSD_LOG_H
#define LENSD_LOG_H

#include "api/json_writer.h"

/* Starts a line {"time": "...", "level": level, ... : add keys to w, then
 * log_emit(w). */
void log_begin(jw *w, const char *level);
void log_emit(jw *w);

/* {"time", "level", "msg"} */
void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
