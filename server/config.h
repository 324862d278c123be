/* config.h - `lensd serve` settings, defined once in a table (config.c).
 *
 * The table drives command-line parsing, LENSD_* environment variables,
 * `lensd serve --help` and the "workers"/"limits" part of GET /v1/info.
 * Precedence: built-in default < environment < command line. */
#ifndef LENSD_CONFIG_H
#define LENSD_CONFIG_H

#include <stddef.h>

#include "api/json_writer.h"

typedef struct {
    char *listen;            /* HOST:PORT */
    char **models;           /* NAME=DIR */
    int n_models;
    char *models_dir;
    int workers;
    int threads_per_worker;  /* 0 until resolved: cores / workers */
    int fast_workers;        /* fast-lane workers: tokenize and forward only (server/pool.h) */
    int fast_threads;        /* threads of each fast-lane worker */
    int queue;
    int max_tokens;
    int max_batch_items;     /* texts per batch request */
    int max_batch_tokens;    /* their tokens in total */
    long long max_body;
    double timeout;          /* seconds */
    char *api_key_file;
    char *cors_origin;       /* comma-separated list, "*" for any */
    int max_connections;     /* client connections open at once (libmicrohttpd's limit) */
    int max_connections_per_ip; /* 0 = no per-address limit */
    double header_timeout;   /* seconds from connect (or the last answer) to a complete request header */
    double body_timeout;     /* seconds from a complete header to the whole body */
    double idle_timeout;     /* seconds of silence before a connection is closed */
    int max_jobs;            /* async jobs running at once (job threads) */
    int max_stored_jobs;     /* queued + running + finished jobs kept before 429 */
    double job_ttl;          /* seconds a finished job's result is kept */
    double sse_keepalive;    /* seconds between keep-alive comments of an idle event stream */
    char *data_dir;          /* datasets jobs may read by path; NULL = none */
    char *openapi;           /* the spec GET /openapi.yaml serves (resolved at parse: repo or installed copy) */
    char *web_dir;           /* dashboard folder; NULL = installed copy or the repository's web/ */
    int no_web;              /* 1: no dashboard */
    int debug_delay_ms;      /* testing only: each pool job first sleeps this long */
    int debug_gflops;        /* testing only: the cost model's rate instead of the measured one; 0 = measure */
} lensd_config;

/* Parse argv (after "serve") and the environment into cfg. Returns 0, 1 when
 * --help was printed, or -1 after printing an error to stderr. */
int lensd_config_parse(lensd_config *cfg, int argc, char **argv);
void lensd_config_free(lensd_config *cfg);
void lensd_config_help(const char *prog);

/* "workers": .., "threads_per_worker": .., "limits": {..} (keys inside an object). */
void lensd_config_write_info(jw *w, const lensd_config *cfg);

int lensd_cores(void);

#endif
