/* reference_run.h - what the tests that compare with a PyTorch reference
 * script share: whether /usr/bin/python3 has torch, running a script on a
 * request and reading its JSON answer, and temporary folders (random micro
 * checkpoints) removed afterwards. */
#ifndef LENS_REFERENCE_RUN_H
#define LENS_REFERENCE_RUN_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/model/mkmodel.h"
#include "tests/check.h"

#define REFERENCE_PYTHON "/usr/bin/python3"

/* 1 when the reference scripts can run; else a SKIP saying so. */
static inline int reference_available(void)
{
    const int ok = system(REFERENCE_PYTHON " -c 'import torch, numpy' >/dev/null 2>&1") == 0;
    if (!ok) SKIP("no " REFERENCE_PYTHON " with torch: identities only, no reference comparison");
    return ok;
}

static inline void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* script's JSON answer to the request (a JSON text), or NULL. */
static inline json_t *reference_run(const char *script, const char *request)
{
    char tmp[] = "/tmp/lensd-reference-XXXXXX", path[300], cmd[1000];
    if (!mkdtemp(tmp)) return NULL;
    snprintf(path, sizeof path, "%s/request.json", tmp);
    FILE *f = fopen(path, "w");
    json_t *answer = NULL;
    if (f) {
        fputs(request, f);
        fclose(f);
        snprintf(cmd, sizeof cmd, REFERENCE_PYTHON " %s %s > %s/answer.json", script, path, tmp);
        if (system(cmd) == 0) {
            snprintf(path, sizeof path, "%s/answer.json", tmp);
            answer = json_load_file(path, 0, NULL);
        }
    }
    remove_dir(tmp);
    return answer;
}

/* {"model": dir, "ids": [...]} plus extra (", \"k\": v" pairs or ""), malloc'd. */
static inline char *reference_request(const char *dir, const int *ids, int T, const char *extra)
{
    json_t *arr = json_array();
    for (int t = 0; t < T; t++) json_array_append_new(arr, json_integer(ids[t]));
    char *list = json_dumps(arr, 0);
    json_decref(arr);
    const size_t n = strlen(dir) + (list ? strlen(list) : 0) + strlen(extra) + 64;
    char *req = malloc(n);
    if (req) snprintf(req, n, "{\"model\": \"%s\", \"ids\": %s%s}", dir, list ? list : "[]", extra);
    free(list);
    return req;
}

/* A random micro checkpoint of arch / task (seed 11) in dir, a mkdtemp
 * template; name gets "arch task (random micro checkpoint)". 0, or -1 after
 * a failed CHECK (dir exists when mkdtemp succeeded). */
static inline int micro_checkpoint(const char *arch, const char *task, char *dir, char *name, size_t name_size)
{
    snprintf(name, name_size, "%s %s (random micro checkpoint)", arch, task);
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return -1;
    }
    lens_err err = {0};
    const int rc = lens_mkmodel(arch, "micro", task, 11, dir, &err);
    CHECK(rc == 0, "%s: %s", name, err.msg);
    return rc ? -1 : 0;
}

#endif
