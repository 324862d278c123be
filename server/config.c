/* config.c - the one table of `lensd serve` settings.
 *
 * Owns: every serve option's flag, environment variable, default, help text,
 * parser and whether /v1/info reports it. Adding a setting is one row here
 * plus a field in lensd_config.
 *
 * Threading policy (why threads-per-worker defaults to cores / workers):
 * each worker runs one request at a time and every BLAS call of that request
 * uses the process-wide OpenBLAS thread count, so the machine runs at most
 * workers x threads-per-worker compute threads; keeping that <= cores avoids
 * oversubscription (N request threads x M BLAS threads). The count is set
 * once at start-up with lens_blas_set_threads. The fast lane
 * (--fast-workers x --fast-threads, default 1 x 1) comes on top: its
 * requests are short, and a core shared with an analysis for milliseconds
 * is the price of a forward pass not waiting seconds behind it. */
#include "server/config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct config_opt config_opt;
typedef int (*config_parser)(lensd_config *cfg, const config_opt *opt, const char *value, int from_cli);

enum { INFO_NONE, INFO_TOP, INFO_LIMIT };
enum { KIND_STR, KIND_INT, KIND_BYTES, KIND_SECONDS, KIND_LIST, KIND_BOOL };

struct config_opt {
    const char *name;   /* --name */
    const char *env;    /* LENSD_NAME */
    const char *def;    /* default as text, NULL for none */
    const char *arg;    /* metavariable in --help */
    const char *help;
    int kind;
    size_t offset;      /* field in lensd_config */
    long long lo, hi;   /* bounds for numbers */
    int info;           /* reported in /v1/info */
};

#define OFF(field) offsetof(lensd_config, field)

static const config_opt options[] = {
    {"listen", "LENSD_LISTEN", "127.0.0.1:8080", "HOST:PORT",
     "address to listen on (port 0 picks a free one)", KIND_STR, OFF(listen), 0, 0, INFO_NONE},
    {"model", "LENSD_MODEL", NULL, "NAME=DIR",
     "load the checkpoint folder DIR as model NAME; repeatable (env: comma-separated list)",
     KIND_LIST, OFF(models), 0, 0, INFO_NONE},
    {"models-dir", "LENSD_MODELS_DIR", NULL, "DIR",
     "load every subfolder of DIR that has a config.json, named by the folder", KIND_STR, OFF(models_dir), 0, 0,
     INFO_NONE},
    {"workers", "LENSD_WORKERS", "1", "N", "requests computed in parallel (worker threads)", KIND_INT,
     OFF(workers), 1, 1024, INFO_TOP},
    {"threads-per-worker", "LENSD_THREADS_PER_WORKER", "0", "N",
     "BLAS threads per worker; 0 = cores / workers, so workers x threads <= cores", KIND_INT,
     OFF(threads_per_worker), 0, 1024, INFO_TOP},
    {"fast-workers", "LENSD_FAST_WORKERS", "1", "N",
     "extra workers that run only cheap requests (tokenize, forward), so they never wait behind analyses; 0 = "
     "one lane",
     KIND_INT, OFF(fast_workers), 0, 64, INFO_TOP},
    {"fast-threads", "LENSD_FAST_THREADS", "1", "N", "BLAS threads of each fast-lane worker", KIND_INT,
     OFF(fast_threads), 1, 1024, INFO_TOP},
    {"queue", "LENSD_QUEUE", "64", "N", "requests waiting for a worker before 429", KIND_INT, OFF(queue), 0,
     1000000, INFO_LIMIT},
    {"max-tokens", "LENSD_MAX_TOKENS", "512", "N", "tokens per request before 413 (also capped by the model)",
     KIND_INT, OFF(max_tokens), 1, 1000000, INFO_LIMIT},
    {"max-batch-items", "LENSD_MAX_BATCH_ITEMS", "64", "N", "texts in one batch request (texts: [...]) before 413",
     KIND_INT, OFF(max_batch_items), 1, 100000, INFO_LIMIT},
    {"max-batch-tokens", "LENSD_MAX_BATCH_TOKENS", "16384", "N",
     "tokens of all texts of one batch request before 413 (checked before any compute)", KIND_INT,
     OFF(max_batch_tokens), 1, 100000000, INFO_LIMIT},
    {"max-body", "LENSD_MAX_BODY", "1MiB", "BYTES", "request body size before 413 (suffixes K, M, KiB, MiB)",
     KIND_BYTES, OFF(max_body), 1, 1LL << 32, INFO_LIMIT},
    {"timeout", "LENSD_TIMEOUT", "30", "SECONDS", "per-request deadline; past it the answer is 503 \"timeout\"",
     KIND_SECONDS, OFF(timeout), 0, 86400, INFO_LIMIT},
    {"api-key-file", "LENSD_API_KEY_FILE", NULL, "FILE",
     "require Authorization: Bearer <key> on /v1/* (one key per line)", KIND_STR, OFF(api_key_file), 0, 0,
     INFO_NONE},
    {"cors-origin", "LENSD_CORS_ORIGIN", NULL, "LIST", "origins allowed by CORS, comma-separated, or *",
     KIND_STR, OFF(cors_origin), 0, 0, INFO_NONE},
    {"max-connections", "LENSD_MAX_CONNECTIONS", "16384", "N",
     "open client connections at once; more wait in the listen backlog (lowered to the descriptor limit - 256)",
     KIND_INT, OFF(max_connections), 16, 1000000, INFO_NONE},
    {"max-connections-per-ip", "LENSD_MAX_CONNECTIONS_PER_IP", "0", "N",
     "open connections from one client address; 0 = no limit (behind a proxy every client has its address)",
     KIND_INT, OFF(max_connections_per_ip), 0, 1000000, INFO_NONE},
    {"header-timeout", "LENSD_HEADER_TIMEOUT", "10", "SECONDS",
     "a connection that has not sent a whole request header this long after it opened (kept alive: after the "
     "first line of its next request) is closed, however slowly it trickles",
     KIND_SECONDS, OFF(header_timeout), 0, 3600, INFO_NONE},
    {"body-timeout", "LENSD_BODY_TIMEOUT", "20", "SECONDS",
     "a request body must arrive whole this long after its header, however slowly it trickles, else the "
     "connection is closed",
     KIND_SECONDS, OFF(body_timeout), 0, 3600, INFO_NONE},
    {"idle-timeout", "LENSD_IDLE_TIMEOUT", "60", "SECONDS",
     "a connection silent this long while sending a body or reading an answer is closed (not one waiting for "
     "its worker)",
     KIND_SECONDS, OFF(idle_timeout), 0, 86400, INFO_NONE},
    {"max-jobs", "LENSD_MAX_JOBS", "1", "N", "async jobs computed at once (dedicated job threads); more wait queued",
     KIND_INT, OFF(max_jobs), 1, 64, INFO_LIMIT},
    {"max-stored-jobs", "LENSD_MAX_STORED_JOBS", "100", "N",
     "jobs kept (queued, running or finished), in equal shares per API key; a key's new job past its share drops "
     "its own oldest finished job, else POST /v1/jobs answers 429",
     KIND_INT, OFF(max_stored_jobs), 1, 1000000, INFO_LIMIT},
    {"job-ttl", "LENSD_JOB_TTL", "3600", "SECONDS", "how long a finished job's result is kept", KIND_SECONDS,
     OFF(job_ttl), 0, 31536000, INFO_LIMIT},
    {"sse-keepalive", "LENSD_SSE_KEEPALIVE", "15", "SECONDS",
     "a comment line on an idle GET /v1/jobs/{id}/events stream this often, so proxies keep it open", KIND_SECONDS,
     OFF(sse_keepalive), 0, 3600, INFO_NONE},
    {"data-dir", "LENSD_DATA_DIR", NULL, "DIR",
     "datasets jobs may read by path (params.data, e.g. a TSV); paths must resolve inside DIR; unset = none",
     KIND_STR, OFF(data_dir), 0, 0, INFO_NONE},
    {"openapi", "LENSD_OPENAPI", NULL, "FILE",
     "the spec GET /openapi.yaml serves; unset = ./openapi.yaml, else /usr/share/lensd/openapi.yaml", KIND_STR,
     OFF(openapi), 0, 0, INFO_NONE},
    {"web-dir", "LENSD_WEB_DIR", NULL, "DIR",
     "dashboard files served at / (default /usr/share/lensd/web when present, else the repository's web/)",
     KIND_STR, OFF(web_dir), 0, 0, INFO_NONE},
    {"no-web", "LENSD_NO_WEB", NULL, "", "do not serve the dashboard (/ answers 404); env: 1 or 0", KIND_BOOL,
     OFF(no_web), 0, 1, INFO_NONE},
    {"debug-delay-ms", "LENSD_DEBUG_DELAY_MS", "0", "MS", "testing: each queued request and each job first waits MS",
     KIND_INT, OFF(debug_delay_ms), 0, 3600000, INFO_NONE},
    {"debug-gflops", "LENSD_DEBUG_GFLOPS", "0", "N",
     "testing: the cost model takes N GFLOP/s instead of measuring the GEMM rate (0 = measure)", KIND_INT,
     OFF(debug_gflops), 0, 1000000, INFO_NONE},
};
#define N_OPTIONS (int)(sizeof options / sizeof *options)

int lensd_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void *field(lensd_config *cfg, const config_opt *o) { return (char *)cfg + o->offset; }

static int parse_ll(const char *s, long long *out, char **end)
{
    errno = 0;
    *out = strtoll(s, end, 10);
    return errno || *end == s ? -1 : 0;
}

static int set_value(lensd_config *cfg, const config_opt *o, const char *value, const char *source)
{
    char *end;
    long long v;
    switch (o->kind) {
    case KIND_STR: {
        char **p = field(cfg, o);
        free(*p);
        *p = strdup(value);
        return 0;
    }
    case KIND_LIST: {
        /* comma-separated in the environment, one per flag on the command line */
        char *copy = strdup(value), *save = NULL;
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (!*tok) continue;
            char **grown = realloc(cfg->models, (size_t)(cfg->n_models + 1) * sizeof *grown);
            if (!grown) break;
            cfg->models = grown;
            cfg->models[cfg->n_models++] = strdup(tok);
        }
        free(copy);
        return 0;
    }
    case KIND_BOOL:
        if (strcmp(value, "1") && strcmp(value, "0") && strcasecmp(value, "true") && strcasecmp(value, "false")) {
            fprintf(stderr, "lensd: %s: %s must be 1, 0, true or false, got \"%s\"\n", source, o->name, value);
            return -1;
        }
        *(int *)field(cfg, o) = !strcmp(value, "1") || !strcasecmp(value, "true");
        return 0;
    case KIND_INT:
        if (parse_ll(value, &v, &end) || *end || v < o->lo || v > o->hi) {
            fprintf(stderr, "lensd: %s: %s must be an integer in [%lld, %lld], got \"%s\"\n", source, o->name,
                    o->lo, o->hi, value);
            return -1;
        }
        *(int *)field(cfg, o) = (int)v;
        return 0;
    case KIND_BYTES: {
        if (parse_ll(value, &v, &end)) goto bad_bytes;
        long long mult = 1;
        if (!strcasecmp(end, "k") || !strcasecmp(end, "kb")) mult = 1000;
        else if (!strcasecmp(end, "m") || !strcasecmp(end, "mb")) mult = 1000000;
        else if (!strcasecmp(end, "kib")) mult = 1024;
        else if (!strcasecmp(end, "mib")) mult = 1024 * 1024;
        else if (!strcasecmp(end, "gib")) mult = 1024LL * 1024 * 1024;
        else if (*end) goto bad_bytes;
        v *= mult;
        if (v < o->lo || v > o->hi) goto bad_bytes;
        *(long long *)field(cfg, o) = v;
        return 0;
    bad_bytes:
        fprintf(stderr, "lensd: %s: %s must be a byte count such as 1048576 or 1MiB, got \"%s\"\n", source,
                o->name, value);
        return -1;
    }
    case KIND_SECONDS: {
        errno = 0;
        double d = strtod(value, &end);
        if (errno || end == value || *end || !(d > 0) || d > (double)o->hi) {
            fprintf(stderr, "lensd: %s: %s must be a positive number of seconds, got \"%s\"\n", source, o->name,
                    value);
            return -1;
        }
        *(double *)field(cfg, o) = d;
        return 0;
    }
    }
    return -1;
}

void lensd_config_help(const char *prog)
{
    printf("usage: %s serve [options]\n\n"
           "Keeps the given models resident and serves the HTTP/JSON API (see openapi.yaml).\n"
           "Every option can also be set by its environment variable; the command line wins.\n\n",
           prog);
    for (int i = 0; i < N_OPTIONS; i++) {
        const config_opt *o = &options[i];
        char flag[64];
        snprintf(flag, sizeof flag, "--%s%s%s", o->name, *o->arg ? " " : "", o->arg);
        printf("  %-30s %s\n", flag, o->help);
        printf("  %-30s env %s%s%s\n", "", o->env, o->def ? ", default " : "", o->def ? o->def : "");
    }
    printf("\nThreading: each worker computes one request at a time with threads-per-worker\n"
           "BLAS threads; the default keeps workers x threads-per-worker <= cores (%d here),\n"
           "and larger explicit values are lowered to that bound.\n",
           lensd_cores());
}

int lensd_config_parse(lensd_config *cfg, int argc, char **argv)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < N_OPTIONS; i++)
        if (options[i].def && set_value(cfg, &options[i], options[i].def, "default")) return -1;
    for (int i = 0; i < N_OPTIONS; i++) {
        const char *v = getenv(options[i].env);
        if (v && *v && set_value(cfg, &options[i], v, options[i].env)) return -1;
    }
    int cli_models = 0;
    for (int a = 0; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            lensd_config_help("lensd");
            return 1;
        }
        if (strncmp(arg, "--", 2)) {
            fprintf(stderr, "lensd serve: unexpected argument \"%s\" (see lensd serve --help)\n", arg);
            return -1;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const config_opt *o = NULL;
        for (int i = 0; i < N_OPTIONS; i++)
            if (strlen(options[i].name) == name_len && !strncmp(options[i].name, name, name_len)) o = &options[i];
        if (!o) {
            fprintf(stderr, "lensd serve: unknown option \"%s\" (see lensd serve --help)\n", arg);
            return -1;
        }
        /* a switch (--no-web) takes no value unless given as --no-web=0 */
        const char *value = eq ? eq + 1 : o->kind == KIND_BOOL ? "1" : (a + 1 < argc ? argv[++a] : NULL);
        if (!value) {
            fprintf(stderr, "lensd serve: --%s needs a value\n", o->name);
            return -1;
        }
        if (o->kind == KIND_LIST && !cli_models++) {
            /* the command line replaces the environment's list */
            for (int i = 0; i < cfg->n_models; i++) free(cfg->models[i]);
            cfg->n_models = 0;
        }
        if (o->kind == KIND_LIST) {
            char **grown = realloc(cfg->models, (size_t)(cfg->n_models + 1) * sizeof *grown);
            if (!grown) return -1;
            cfg->models = grown;
            cfg->models[cfg->n_models++] = strdup(value);
        } else if (set_value(cfg, o, value, "command line")) {
            return -1;
        }
    }
    if (!cfg->openapi) {
        /* a checkout's spec, else the installed copy (Dockerfile) */
        const char *spec = access("openapi.yaml", R_OK) ? "/usr/share/lensd/openapi.yaml" : "openapi.yaml";
        cfg->openapi = strdup(spec);
    }
    int cores = lensd_cores();
    int fair = cores / cfg->workers > 0 ? cores / cfg->workers : 1;
    if (cfg->threads_per_worker == 0) {
        cfg->threads_per_worker = fair;
    } else if (cfg->threads_per_worker > fair) {
        fprintf(stderr,
                "lensd: threads-per-worker %d x workers %d exceeds %d cores; using %d BLAS threads per worker\n",
                cfg->threads_per_worker, cfg->workers, cores, fair);
        cfg->threads_per_worker = fair;
    }
    return 0;
}

void lensd_config_free(lensd_config *cfg)
{
    free(cfg->listen);
    for (int i = 0; i < cfg->n_models; i++) free(cfg->models[i]);
    free(cfg->models);
    free(cfg->models_dir);
    free(cfg->api_key_file);
    free(cfg->cors_origin);
    free(cfg->data_dir);
    free(cfg->openapi);
    free(cfg->web_dir);
    memset(cfg, 0, sizeof *cfg);
}

static void write_option_value(jw *w, lensd_config *cfg, const config_opt *o)
{
    char key[64];
    snprintf(key, sizeof key, "%s", o->name);
    for (char *p = key; *p; p++)
        if (*p == '-') *p = '_';
    if (o->kind == KIND_SECONDS) {
        strncat(key, "_s", sizeof key - strlen(key) - 1);
        jw_key(w, key);
        jw_float(w, *(double *)field(cfg, o), 3);
    } else if (o->kind == KIND_BYTES) {
        jw_key(w, key);
        jw_int(w, *(long long *)field(cfg, o));
    } else if (o->kind == KIND_INT) {
        jw_key(w, key);
        jw_int(w, *(int *)field(cfg, o));
    }
}

void lensd_config_write_info(jw *w, const lensd_config *cfg_in)
{
    lensd_config *cfg = (lensd_config *)cfg_in; /* field() is read-only here */
    for (int i = 0; i < N_OPTIONS; i++)
        if (options[i].info == INFO_TOP) write_option_value(w, cfg, &options[i]);
    jw_key(w, "limits");
    jw_obj(w);
    for (int i = 0; i < N_OPTIONS; i++)
        if (options[i].info == INFO_LIMIT) write_option_value(w, cfg, &options[i]);
    jw_end(w);
}
