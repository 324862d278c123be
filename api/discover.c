/* discover.c - what a client can ask this server: GET /v1/jobs, job events,
 * GET /v1/capabilities, GET /openapi.yaml.
 *
 * Owns: the job listing's query decoding, GET /v1/jobs/{id}/events (the
 * stream itself is server/jobs.c's) (the store is server/jobs.c), the
 * capabilities object (analyses and their endpoints, job kinds with their
 * params and result schemas as JSON pointers into the served spec, the data
 * files under --data-dir jobs may name) and serving the spec file. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/request.h"

enum { JOBS_LIST_DEFAULT = 50, JOBS_LIST_MAX = 500, DATA_FILES_MAX = 500 };

static const char *query(const api_call *c, const char *name)
{
    return c->query_arg ? c->query_arg(c, name) : NULL;
}

void api_jobs_list(api_call *c)
{
    if (!c->ctx->job_list) {
        api_fail(c, 422, "invalid_request", NULL, "jobs need the server (lensd serve)");
        return;
    }
    const char *state = query(c, "state"), *limit_s = query(c, "limit");
    int limit = JOBS_LIST_DEFAULT;
    if (limit_s) {
        char *end;
        long v = strtol(limit_s, &end, 10);
        if (!*limit_s || *end || v < 1 || v > JOBS_LIST_MAX) {
            api_fail(c, 422, "invalid_request", "limit", "limit must be an integer from 1 to %d", JOBS_LIST_MAX);
            return;
        }
        limit = (int)v;
    }
    c->ctx->job_list(c, state && *state ? state : NULL, limit);
}

void api_job_events(api_call *c)
{
    if (!c->ctx->job_events) {
        api_fail(c, 404, "job_not_found", "id", "no job \"%.64s\"", c->param);
        return;
    }
    c->ctx->job_events(c, c->param);
}

/* Which endpoint serves each analysis synchronously (NULL: a job kind only). */
static const char *analysis_endpoint(lens_analysis a)
{
    switch (a) {
    case LENS_ANALYSIS_FORWARD: return "/v1/forward";
    case LENS_ANALYSIS_ATTENTION: return "/v1/attention";
    case LENS_ANALYSIS_ATTRIBUTION: return "/v1/attribution";
    case LENS_ANALYSIS_ATTRIBUTION_TREE: return "/v1/attribution";
    case LENS_ANALYSIS_TOKEN_IDENTITY: return "/v1/token-identity";
    case LENS_ANALYSIS_HIDDEN_ATTRIBUTION: return "/v1/hidden-attribution";
    case LENS_ANALYSIS_DECOMPOSITION: return "/v1/decomposition";
    case LENS_ANALYSIS_CONTEXT_MIXING: return "/v1/context-mixing";
    case LENS_ANALYSIS_LOGIT_ATTRIBUTION: return "/v1/logit-attribution";
    case LENS_ANALYSIS_ROUTER: return "/v1/forward";
    default: return NULL;
    }
}

static void write_schema_ref(jw *w, const char *key, const char *name)
{
    char ref[160];
    snprintf(ref, sizeof ref, "/openapi.yaml#/components/schemas/%s", name);
    jw_key(w, key);
    jw_str(w, ref);
}

/* Regular files under root (a realpath; relative names, one level of
 * subfolders), at most *left. A symlink is listed only when it resolves
 * inside root: jobs could not read any other (api/request.c confines data
 * paths to --data-dir), and its name and size would leak. */
static void write_data_files(jw *w, const char *root, const char *sub, int depth, int *left)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s%s%s", root, *sub ? "/" : "", sub);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while (*left > 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char rel[PATH_MAX], full[PATH_MAX];
        int n = snprintf(rel, sizeof rel, "%s%s%s", sub, *sub ? "/" : "", e->d_name);
        if (n < 0 || (size_t)n >= sizeof rel) continue;
        n = snprintf(full, sizeof full, "%s/%s", root, rel);
        if (n < 0 || (size_t)n >= sizeof full) continue;
        struct stat st;
        char real[PATH_MAX];
        size_t root_len = strlen(root);
        if (!realpath(full, real) || strncmp(real, root, root_len) || real[root_len] != '/') continue;
        if (stat(real, &st)) continue;
        if (S_ISDIR(st.st_mode)) {
            if (depth < 1) write_data_files(w, root, rel, depth + 1, left);
            continue;
        }
        if (!S_ISREG(st.st_mode)) continue;
        (*left)--;
        jw_obj(w);
        jw_key(w, "path");
        jw_str(w, rel);
        jw_key(w, "bytes");
        jw_int(w, (long long)st.st_size);
        jw_end(w);
    }
    closedir(d);
}

void api_capabilities(api_call *c)
{
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "analyses");
    jw_arr(w);
    for (int a = 0; a < LENS_ANALYSIS_COUNT; a++) {
        jw_obj(w);
        jw_key(w, "name");
        jw_str(w, lens_analysis_name((lens_analysis)a));
        jw_key(w, "endpoint");
        jw_str(w, analysis_endpoint((lens_analysis)a));
        jw_end(w);
    }
    jw_end(w);
    jw_key(w, "job_kinds");
    jw_arr(w);
    for (int i = 0; i < api_n_job_kinds; i++) {
        const api_job_kind *k = &api_job_kinds[i];
        jw_obj(w);
        jw_key(w, "kind");
        jw_str(w, k->kind);
        jw_key(w, "summary");
        jw_str(w, k->summary);
        write_schema_ref(w, "params_schema", k->params_schema);
        write_schema_ref(w, "result_schema", k->result_schema);
        jw_key(w, "params_fields"); /* what POST /v1/jobs accepts in params (the allowed-fields table) */
        jw_arr(w);
        const char *const *fields = api_allowed_fields(k->kind);
        for (int f = 0; fields && fields[f]; f++) jw_str(w, fields[f]);
        jw_end(w);
        jw_end(w);
    }
    jw_end(w);
    jw_key(w, "data_dir");
    jw_bool(w, c->ctx->data_dir != NULL);
    jw_key(w, "data_files");
    jw_arr(w);
    int left = DATA_FILES_MAX;
    char root[PATH_MAX];
    if (c->ctx->data_dir && realpath(c->ctx->data_dir, root)) write_data_files(w, root, "", 0, &left);
    jw_end(w);
    jw_end(w);
}

void api_openapi(api_call *c)
{
    const char *path = c->ctx->openapi_path;
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        api_fail(c, 404, "not_found", NULL, "the spec file %s is not installed (see --openapi)", path ? path : "");
        return;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) jw_raw(&c->out, buf, n);
    fclose(f);
    c->content_type = "application/yaml";
}
