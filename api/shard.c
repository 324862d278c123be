/* shard.c - dataset jobs split into shards and merged back
 * (lensd job run --shard I/N, lensd job merge; docs/operations.md).
 *
 * Owns the contract every sharded kind shares: which rows a shard takes
 * (r % N == I, so long and short rows spread evenly), the partial's header
 * (kind, params and their hash, model fingerprint, shard, row counts), and
 * the checks before a merge. What a partial holds and how it reduces is the
 * kind's (its shard() and merge() in the kind's file). A server job of a
 * sharded kind is shard 0 of 1 merged, the same code. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"

/* "fnv1a64:<16 hex digits>" of the params' canonical JSON into out; -1 out of memory. */
static int params_hash(json_t *params, char out[32])
{
    char *text = json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    if (!text) return -1;
    snprintf(out, 32, "fnv1a64:%016llx", (unsigned long long)lens_fnv1a64(LENS_FNV1A64_INIT, text, strlen(text)));
    free(text);
    return 0;
}

static void hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

/* The decoded request's model: every dataset kind's request starts with it. */
static const api_model *request_model(const api_call *c) { return c->model_ref ? c->model_ref : NULL; }

/* The model's fingerprint, computed on first use and kept in the api_model
 * (the weights never change after load). Two requests may both compute it
 * the first time; they store the same value. 0 without a model. */
static uint64_t model_fingerprint(const api_model *m)
{
    if (!m) return 0;
    api_model *cache = (api_model *)m; /* a cache, not the model's state */
    unsigned long long fp = atomic_load_explicit(&cache->fingerprint, memory_order_relaxed);
    if (!fp) {
        fp = lens_model_fingerprint(m->model);
        atomic_store_explicit(&cache->fingerprint, fp, memory_order_relaxed);
    }
    return fp;
}

int api_shard_rows(lens_partial *part, long total, long in_shard)
{
    return json_object_set_new(part->header, "rows", json_pack("{s:I, s:I}", "total", (json_int_t)total, "in_shard",
                                                                (json_int_t)in_shard));
}

int api_shard_gather_rows(api_call *c, lens_partial *const *parts, int n_parts, long total, int n_fields,
                          const char *const *names, const long *widths, double *const *outs, const char *what)
{
    char *seen = calloc((size_t)(total > 0 ? total : 1), 1);
    lens_err err = {0};
    int rc = seen ? 0 : lens_fail(&err, LENS_ENOMEM, "out of memory for %s", what);
    for (int p = 0; p < n_parts && !rc; p++) {
        json_int_t k = json_integer_value(json_object_get(json_object_get(parts[p]->header, "rows"), "in_shard"));
        const int64_t *rows = lens_partial_get(parts[p], "rows", LENS_PT_I64, k, &err);
        if (!rows) rc = -1;
        for (json_int_t i = 0; !rc && i < k; i++) {
            if (rows[i] < 0 || rows[i] >= total || seen[rows[i]]) {
                rc = lens_fail(&err, LENS_EFORMAT, "row %lld is out of range or in two shards", (long long)rows[i]);
                break;
            }
            seen[rows[i]] = 1;
        }
        for (int f = 0; f < n_fields && !rc; f++) {
            const double *v = lens_partial_get(parts[p], names[f], LENS_PT_F64, k * widths[f], &err);
            if (!v) rc = -1;
            for (json_int_t i = 0; !rc && i < k; i++)
                memcpy(outs[f] + (size_t)rows[i] * widths[f], v + (size_t)i * widths[f], sizeof(double) * widths[f]);
        }
    }
    for (long e = 0; e < total && !rc; e++)
        if (!seen[e]) rc = lens_fail(&err, LENS_EFORMAT, "row %ld is in no shard", e);
    free(seen);
    if (!rc) return 0;
    if (err.code == LENS_EFORMAT) return api_fail(c, 422, "partial_mismatch", "parts", "%s", err.msg);
    return api_fail_core(c, &err, "parts", NULL, what);
}

int api_shard_run(api_call *c, const api_job_kind *kind, int index, int count, lens_partial *part)
{
    lens_err err = {0};
    if (!kind->shard) return api_fail(c, 422, "invalid_request", "kind", "job kind %s cannot be sharded", kind->kind);
    if (count < 1 || index < 0 || index >= count)
        return api_fail(c, 422, "invalid_request", "shard", "shard %d/%d: want 0 <= I < N", index, count);
    if (lens_partial_init(part, &err)) return api_fail(c, 500, "internal", NULL, "%s", err.msg);
    const api_model *m = request_model(c);
    char fp[17], ph[32];
    hex64(model_fingerprint(m), fp);
    json_t *h = part->header;
    if (params_hash(c->body, ph) || json_object_set_new(h, "kind", json_string(kind->kind)) ||
        json_object_set(h, "params", c->body) || json_object_set_new(h, "params_hash", json_string(ph)) ||
        json_object_set_new(h, "model", json_pack("{s:s, s:s}", "name", m ? m->name : "", "fingerprint", fp)) ||
        json_object_set_new(h, "shard", json_pack("{s:i, s:i}", "index", index, "count", count))) {
        lens_partial_free(part);
        return api_fail(c, 500, "internal", NULL, "out of memory for the partial's header");
    }
    if (kind->shard(c, index, count, part)) {
        lens_partial_free(part);
        return -1;
    }
    return 0;
}

static const char *hdr_str(const lens_partial *p, const char *obj, const char *key)
{
    json_t *o = obj ? json_object_get(p->header, obj) : p->header;
    return json_string_value(json_object_get(o, key));
}

static int hdr_int(const lens_partial *p, const char *obj, const char *key)
{
    json_t *v = json_object_get(json_object_get(p->header, obj), key);
    return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < 1000000
               ? (int)json_integer_value(v) : -1;
}

static int by_shard(const void *a, const void *b)
{
    return hdr_int(*(lens_partial *const *)a, "shard", "index") - hdr_int(*(lens_partial *const *)b, "shard", "index");
}

static int fail_mismatch(api_call *c, int i, const char *what, const char *got, const char *want)
{
    return api_fail(c, 422, "partial_mismatch", "parts", "part %d has %s %.80s, part 0 has %.80s: not the same job", i,
                    what, got ? got : "(none)", want ? want : "(none)");
}

/* Same kind, params, model and shard count; indices unique and complete. */
static int check_parts(api_call *c, const api_job_kind *kind, lens_partial **parts, int n)
{
    if (n < 1) return api_fail(c, 422, "partial_mismatch", "parts", "no partials to merge");
    const char *fields[][2] = {{NULL, "kind"}, {NULL, "params_hash"}, {"model", "fingerprint"}};
    for (int i = 0; i < n; i++) {
        for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
            const char *got = hdr_str(parts[i], fields[f][0], fields[f][1]);
            const char *want = hdr_str(parts[0], fields[f][0], fields[f][1]);
            if (!got || !want || strcmp(got, want)) return fail_mismatch(c, i, fields[f][1], got, want);
        }
        if (hdr_int(parts[i], "shard", "count") != hdr_int(parts[0], "shard", "count"))
            return api_fail(c, 422, "partial_mismatch", "parts", "part %d is one of %d shards, part 0 one of %d", i,
                            hdr_int(parts[i], "shard", "count"), hdr_int(parts[0], "shard", "count"));
    }
    if (strcmp(hdr_str(parts[0], NULL, "kind"), kind->kind))
        return api_fail(c, 422, "partial_mismatch", "parts", "the partials are of kind %.64s, not %s",
                        hdr_str(parts[0], NULL, "kind"), kind->kind);
    const api_model *m = request_model(c);
    char fp[17];
    hex64(model_fingerprint(m), fp);
    if (strcmp(fp, hdr_str(parts[0], "model", "fingerprint")))
        return api_fail(c, 422, "partial_mismatch", "model",
                        "the partials were computed on another model (fingerprint %.20s, this one %s)",
                        hdr_str(parts[0], "model", "fingerprint"), fp);
    const int count = hdr_int(parts[0], "shard", "count");
    if (count < 1) return api_fail(c, 422, "partial_mismatch", "parts", "part 0 has no valid shard count");
    qsort(parts, (size_t)n, sizeof *parts, by_shard);
    for (int i = 0; i < n; i++) {
        int index = hdr_int(parts[i], "shard", "index");
        if (index < 0 || index >= count)
            return api_fail(c, 422, "partial_mismatch", "parts", "a part has shard index %d of %d", index, count);
        if (i && index == hdr_int(parts[i - 1], "shard", "index"))
            return api_fail(c, 422, "partial_mismatch", "parts", "shard %d of %d is given twice", index, count);
    }
    if (n < count) {
        char missing[256] = "";
        size_t used = 0;
        for (int want = 0, i = 0; want < count && used + 16 < sizeof missing; want++) {
            if (i < n && hdr_int(parts[i], "shard", "index") == want) {
                i++;
                continue;
            }
            used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", used ? ", " : "", want);
        }
        return api_fail(c, 422, "partial_mismatch", "parts", "missing shard(s) %s of %d", missing, count);
    }
    return 0;
}

/* verify_params 0: the parts were made by this very call (api_shard_run_whole),
 * from the same decoded params. */
static void shard_merge(api_call *c, const api_job_kind *kind, lens_partial **parts, int n, int verify_params)
{
    if (!kind->merge) {
        api_fail(c, 422, "invalid_request", "kind", "job kind %s cannot be sharded", kind->kind);
        return;
    }
    if (check_parts(c, kind, parts, n)) return;
    if (!verify_params) {
        kind->merge(c, parts, n);
        return;
    }
    char want[32];
    if (params_hash(c->body, want)) {
        api_fail(c, 500, "internal", NULL, "out of memory hashing the params");
        return;
    }
    if (strcmp(want, hdr_str(parts[0], NULL, "params_hash"))) {
        api_fail(c, 422, "partial_mismatch", "params", "the partials were computed with other params (%.40s, these %s)",
                 hdr_str(parts[0], NULL, "params_hash"), want);
        return;
    }
    kind->merge(c, parts, n);
}

void api_shard_merge(api_call *c, const api_job_kind *kind, lens_partial **parts, int n)
{
    shard_merge(c, kind, parts, n, 1);
}

void api_shard_run_whole(api_call *c, const api_job_kind *kind)
{
    lens_partial part;
    if (api_shard_run(c, kind, 0, 1, &part)) return;
    lens_partial *parts[1] = {&part};
    shard_merge(c, kind, parts, 1, 0);
    lens_partial_free(&part);
}
