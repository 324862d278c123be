/* job_cli.c - `lensd job run` and `lensd job merge`: a dataset job split
 * into shards that run as separate processes (Kubernetes Indexed Jobs,
 * Slurm arrays) and merged into exactly the result one run gives
 * (api/shard.c owns the contract; docs/operations.md, "Sharded jobs"). */
#include "cli/job_cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "core/base/blas.h"
#include "core/base/pool.h"

static void job_usage(FILE *f)
{
    fprintf(f,
            "usage: lensd job run --model DIR --kind KIND --params FILE (--shard I/N | --shards N) --out PART\n"
            "                     [--data-dir DIR] [--threads N]\n"
            "       lensd job merge --model DIR --out RESULT [--data-dir DIR] [--threads N] PART...\n\n"
            "run computes shard I of N (rows r with r %% N == I) of a dataset job and writes its partial;\n"
            "--shards N takes I from $JOB_COMPLETION_INDEX (Kubernetes Indexed Job) or $SLURM_ARRAY_TASK_ID;\n"
            "\"{index}\" in --out is replaced by I. FILE holds the job's params (as POST /v1/jobs \"params\").\n"
            "merge checks that the partials are every shard of one job (kind, params, model) and writes the\n"
            "result JSON (RESULT \"-\" = stdout). Kinds:");
    for (int i = 0; i < api_n_job_kinds; i++)
        if (api_job_kinds[i].shard) fprintf(f, " %s", api_job_kinds[i].kind);
    fprintf(f, "\n");
}

typedef struct {
    const char *model, *kind, *params, *out, *data_dir;
    int index, count, threads;
    const char **parts;
    int n_parts;
} job_args;

static int parse_shard(const char *s, int *index, int *count)
{
    char *end;
    long i = strtol(s, &end, 10);
    if (end == s || *end != '/') return -1;
    long n = strtol(end + 1, &end, 10);
    if (*end || n < 1 || n > 100000 || i < 0 || i >= n) return -1;
    *index = (int)i, *count = (int)n;
    return 0;
}

/* --shards N: the index from the scheduler's environment. */
static int index_from_env(int *index, int count)
{
    const char *names[] = {"JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const char *v = getenv(names[k]);
        if (!v || !*v) continue;
        char *end;
        long i = strtol(v, &end, 10);
        if (*end || i < 0 || i >= count) {
            fprintf(stderr, "lensd job: %s=%s is not a shard index below %d\n", names[k], v, count);
            return -1;
        }
        *index = (int)i;
        return 0;
    }
    fprintf(stderr, "lensd job: --shards needs JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID (or use --shard I/N)\n");
    return -1;
}

static int parse_args(int argc, char **argv, int merge, job_args *a)
{
    memset(a, 0, sizeof *a);
    a->index = -1;
    a->parts = calloc((size_t)argc + 1, sizeof *a->parts);
    if (!a->parts) return -1;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        const char **str = !strcmp(arg, "--model")      ? &a->model
                           : !strcmp(arg, "--kind")     ? &a->kind
                           : !strcmp(arg, "--params")   ? &a->params
                           : !strcmp(arg, "--out")      ? &a->out
                           : !strcmp(arg, "--data-dir") ? &a->data_dir
                                                        : NULL;
        if (str || !strcmp(arg, "--shard") || !strcmp(arg, "--shards") || !strcmp(arg, "--threads")) {
            if (!val) {
                fprintf(stderr, "lensd job: %s needs a value\n", arg);
                return -1;
            }
            i++;
            if (str) *str = val;
            else if (!strcmp(arg, "--threads")) a->threads = atoi(val);
            else if (!strcmp(arg, "--shard") && parse_shard(val, &a->index, &a->count)) {
                fprintf(stderr, "lensd job: --shard wants I/N with 0 <= I < N (got %s)\n", val);
                return -1;
            } else if (!strcmp(arg, "--shards") && ((a->count = atoi(val)) < 1 || index_from_env(&a->index, a->count)))
                return -1;
        } else if (merge && strncmp(arg, "--", 2)) {
            a->parts[a->n_parts++] = arg;
        } else {
            fprintf(stderr, "lensd job: unknown argument %s\n", arg);
            return -1;
        }
    }
    const char *missing = !a->model ? "--model" : !a->out ? "--out" : NULL;
    if (!merge && !missing) missing = !a->kind ? "--kind" : !a->params ? "--params" : a->index < 0 ? "--shard" : NULL;
    if (merge && !missing && !a->n_parts) missing = "PART";
    if (missing) {
        fprintf(stderr, "lensd job: %s is required\n", missing);
        return -1;
    }
    return 0;
}

/* "{index}" in pattern -> index. */
static void expand_out(const char *pattern, int index, char *out, size_t size)
{
    const char *at = strstr(pattern, "{index}");
    if (!at) snprintf(out, size, "%s", pattern);
    else snprintf(out, size, "%.*s%d%s", (int)(at - pattern), pattern, index, at + 7);
}

/* Decodes params as kind's job params ("params." in error fields). */
static int prepare(api_call *call, const api_job_kind *kind, json_t *params)
{
    call->body = json_incref(params);
    call->field_prefix = "params.";
    call->job_kind = kind;
    int rc = kind->prepare ? kind->prepare(call) : 0;
    call->field_prefix = NULL;
    return rc;
}

static int print_error(const api_call *call)
{
    fprintf(stderr, "lensd job: %.*s\n", (int)call->out.len, call->out.buf);
    return 1;
}

static int job_run(const job_args *a, api_call *call)
{
    const api_job_kind *kind = api_job_kind_find(a->kind);
    if (!kind || !kind->shard) {
        fprintf(stderr, "lensd job: kind \"%s\" cannot be sharded\n", a->kind);
        job_usage(stderr);
        return 2;
    }
    json_error_t jerr;
    json_t *params = json_load_file(a->params, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(params)) {
        fprintf(stderr, "lensd job: %s: not a JSON object (%s, line %d)\n", a->params, jerr.text, jerr.line);
        json_decref(params);
        return 1;
    }
    int rc = prepare(call, kind, params);
    json_decref(params);
    if (rc) return print_error(call);
    lens_partial part;
    if (api_shard_run(call, kind, a->index, a->count, &part)) return print_error(call);
    char path[4096];
    expand_out(a->out, a->index, path, sizeof path);
    lens_err err = {0};
    rc = lens_partial_write(&part, path, &err);
    lens_partial_free(&part);
    if (rc) {
        fprintf(stderr, "lensd job: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "lensd job: shard %d/%d of %s -> %s\n", a->index, a->count, kind->kind, path);
    return 0;
}

static int job_merge(const job_args *a, api_call *call)
{
    lens_partial *store = calloc((size_t)a->n_parts, sizeof *store);
    lens_partial **parts = calloc((size_t)a->n_parts, sizeof *parts);
    int rc = store && parts ? 0 : 1, n = 0;
    for (; !rc && n < a->n_parts; n++) {
        lens_err err = {0};
        if (lens_partial_read(a->parts[n], &store[n], &err)) {
            fprintf(stderr, "lensd job: %s\n", err.msg);
            rc = 1;
            break;
        }
        parts[n] = &store[n];
    }
    const char *name = rc ? NULL : json_string_value(json_object_get(store[0].header, "kind"));
    const api_job_kind *kind = name ? api_job_kind_find(name) : NULL;
    json_t *params = rc ? NULL : json_object_get(store[0].header, "params");
    if (!rc && (!kind || !kind->merge || !json_is_object(params))) {
        fprintf(stderr, "lensd job: %s: no mergeable kind or params in its header\n", a->parts[0]);
        rc = 1;
    }
    if (!rc && prepare(call, kind, params)) rc = print_error(call);
    if (!rc) {
        api_shard_merge(call, kind, parts, a->n_parts);
        if (call->status != 200) rc = print_error(call);
    }
    if (!rc) {
        FILE *f = strcmp(a->out, "-") ? fopen(a->out, "w") : stdout;
        if (!f || fwrite(call->out.buf, 1, call->out.len, f) != call->out.len || fputc('\n', f) == EOF) rc = 1;
        if (f && f != stdout && fclose(f)) rc = 1;
        if (rc) fprintf(stderr, "lensd job: cannot write %s\n", a->out);
    }
    for (int i = 0; i < n; i++) lens_partial_free(&store[i]);
    free(store), free(parts);
    return rc;
}

int lensd_cmd_job(int argc, char **argv)
{
    const int merge = argc > 0 && !strcmp(argv[0], "merge");
    if (argc < 1 || (!merge && strcmp(argv[0], "run"))) {
        job_usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : (!strcmp(argv[0], "--help") ? 0 : 2);
    }
    job_args a;
    if (parse_args(argc - 1, argv + 1, merge, &a)) {
        free(a.parts);
        job_usage(stderr);
        return 2;
    }
    lens_err err = {0};
    lens_model *m = lens_model_load(a.model, &err);
    if (!m) {
        fprintf(stderr, "lensd job: %s\n", err.msg);
        free(a.parts);
        return 1;
    }
    char name[256]; /* the folder's last component, as `lensd serve --model DIR` names it */
    size_t end = strlen(a.model);
    while (end > 1 && a.model[end - 1] == '/') end--;
    size_t start = end;
    while (start > 0 && a.model[start - 1] != '/') start--;
    snprintf(name, sizeof name, "%.*s", (int)(end - start), a.model + start);
    api_model am = {.name = name, .model = m};
    api_ctx ctx = {.models = &am, .n_models = 1, .max_tokens = 1 << 30, .data_dir = a.data_dir};
    api_call call;
    api_call_init(&call, &ctx, api_now());
    lens_blas_set_threads(1); /* computation threads come from the pool (core/base/pool.h) */
    call.threads = lens_pool_create(a.threads > 0 ? a.threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    int rc = merge ? job_merge(&a, &call) : job_run(&a, &call);
    lens_pool_free(call.threads);
    api_call_free(&call);
    api_model_drop_maps(&am); /* a token-identity-map merge installs its maps on the model */
    lens_model_free(m);
    free(a.parts);
    return rc;
}
