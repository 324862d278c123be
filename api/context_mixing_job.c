/* context_mixing_job.c - job kind "context-mixing": per-layer statistics of
 * context mixing averaged over a dataset (core/analysis/context_mixing.h;
 * docs/context-mixing.md "Over a dataset").
 *
 * Params {model?, texts?: [..] | data?: "PATH" (inside --data-dir: a TSV
 * whose header names a "sentence" or "text" column, or plain lines),
 * max_texts? = 1000, methods? (default every method the model defines but
 * value zeroing), definition? = "paper-code" | "lensd"} -> {model, source,
 * n_texts, n_tokens, definition, methods: [{method, layers: [{layer, self,
 * self_rollout, first, first_rollout}]}], timing_ms}. Each statistic is a
 * mean over every token of every text of a row share of the layer's matrix
 * (self: the diagonal, first: column 0) or of the rolled-out one, the row
 * divided by its sum (which only GlobEnc's paper-code rows need). Texts
 * longer than the token limit keep their first tokens (and a final [SEP]).
 *
 * A sharded kind (api/shard.c): shard I of N computes the texts r % N == I
 * and keeps each text's sums; the merge adds them in text order, so any N
 * gives the same result bit for bit. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/analysis/context_mixing.h"

#define DEFAULT_MAX_TEXTS 1000
#define MAX_TEXTS 100000
#define N_STATS 4 /* self, self_rollout, first, first_rollout */

typedef struct {
    const api_model *model;
    api_texts texts;
    char *source; /* "texts" or the data path as given */
    lens_cm_method methods[LENS_CM_COUNT];
    int n_methods, paper_code;
} cm_job_req;

static void cm_job_req_free(void *p)
{
    cm_job_req *r = p;
    api_texts_free(&r->texts);
    free(r->source), free(r);
}

/* methods?: an array of distinct method names, each defined for the model. */
static int decode_methods(api_call *c, cm_job_req *r)
{
    const lens_model *m = r->model->model;
    json_t *v = json_object_get(c->body, "methods");
    if (!v || json_is_null(v)) {
        for (int k = 0; k < LENS_CM_COUNT; k++)
            if (k != LENS_CM_VALUE_ZEROING && !lens_cm_undefined(m, (lens_cm_method)k))
                r->methods[r->n_methods++] = (lens_cm_method)k;
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > LENS_CM_COUNT)
        return api_fail(c, 422, "invalid_request", "methods",
                        "methods must be an array of 1..%d of \"rollout\", \"alti\", \"globenc\", \"value-zeroing\"",
                        LENS_CM_COUNT);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *name = json_string_value(json_array_get(v, i));
        lens_cm_method k;
        if (!name || lens_cm_method_parse(name, &k))
            return api_fail(c, 422, "invalid_request", "methods",
                            "methods[%zu] must be \"rollout\", \"alti\", \"globenc\", \"value-zeroing\" or \"decompx\"", i);
        for (int j = 0; j < r->n_methods; j++)
            if (r->methods[j] == k) return api_fail(c, 422, "invalid_request", "methods", "methods names %s twice", name);
        const char *why = lens_cm_undefined(m, k);
        if (why)
            return api_fail(c, 422, "invalid_request", "methods", "%s is undefined for this model: %s", name, why);
        r->methods[r->n_methods++] = k;
    }
    return 0;
}

int api_context_mixing_job_prepare(api_call *c)
{
    cm_job_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = cm_job_req_free;
    int max_texts = DEFAULT_MAX_TEXTS;
    if (api_decode_model(c, &r->model) || api_get_int(c, "max_texts", 1, MAX_TEXTS, &max_texts) < 0 ||
        decode_methods(c, r) || api_decode_texts(c, max_texts, &r->texts))
        return -1;
    const char *def = NULL;
    int has = api_get_string(c, "definition", &def, NULL);
    if (has < 0) return -1;
    if (has && strcmp(def, "paper-code") && strcmp(def, "lensd"))
        return api_fail(c, 422, "invalid_request", "definition", "definition must be \"paper-code\" or \"lensd\"");
    r->paper_code = !has || !strcmp(def, "paper-code");
    const char *data = json_string_value(json_object_get(c->body, "data"));
    r->source = strdup(strcmp(r->texts.field, "data") ? "texts" : data);
    if (!r->source) return api_fail(c, 500, "internal", NULL, "out of memory");
    return 0;
}

/* Adds to sums [N_STATS] the row shares of one T x T matrix pair. */
static void add_shares(const float *M, const float *R, int T, double *sums)
{
    const float *mats[2] = {M, R};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < T; i++) {
            const float *row = mats[k] + (size_t)i * T;
            double sum = 0;
            for (int j = 0; j < T; j++) sum += row[j];
            if (sum > 0) sums[k] += row[i] / sum, sums[2 + k] += row[0] / sum; /* self, first */
        }
}

/* Partial: "rows" i64 [k] (text numbers), "tokens" i64 [k], "sums" f64
 * [k][methods][L][N_STATS] (each text's sums of the shares over its tokens). */
int api_context_mixing_job_shard(api_call *c, int index, int count, lens_partial *part)
{
    cm_job_req *r = c->req;
    const lens_model *m = r->model->model;
    const int L = m->cfg.n_layers, NM = r->n_methods, S = NM * L * N_STATS;
    if (r->texts.n < count)
        return api_fail(c, 422, "invalid_request", r->texts.field,
                        "%d text(s) for %d shards: every shard needs at least one", r->texts.n, count);
    int *ids = NULL, *lengths = NULL;
    api_progress(c, 0);
    if (api_tokenize_texts(c, m, &r->texts, &ids, &lengths)) return -1;
    const long k_max = (r->texts.n - index + count - 1) / count;
    int64_t *rows = malloc(sizeof *rows * (size_t)k_max), *tokens = malloc(sizeof *tokens * (size_t)k_max);
    double *sums = calloc((size_t)k_max * S, sizeof *sums);
    lens_err err = {0};
    int rc = rows && tokens && sums ? 0 : lens_fail(&err, LENS_ENOMEM, "out of memory for %ld texts", k_max);
    long k = 0;
    size_t tok0 = 0;
    for (int t = 0; t < r->texts.n && !rc; tok0 += (size_t)lengths[t++]) {
        if (t % count != index) continue;
        rows[k] = t, tokens[k] = lengths[t];
        for (int q = 0; q < NM && !rc; q++) {
            const lens_cm_opts o = {.method = r->methods[q], .paper_code = r->paper_code, .cancel = c->cancel,
                                    .pool = c->threads};
            lens_cm_result res;
            if ((rc = lens_context_mixing(m, ids + tok0, NULL, lengths[t], &o, &res, &err))) break;
            const size_t TT = (size_t)lengths[t] * lengths[t];
            for (int l = 0; l < L; l++)
                add_shares(res.contrib + l * TT, res.rollout + l * TT, lengths[t],
                           sums + (size_t)k * S + ((size_t)q * L + l) * N_STATS);
            lens_cm_result_free(&res);
        }
        k++;
        api_progress(c, (double)k / k_max);
    }
    free(ids), free(lengths);
    if (!rc && (lens_partial_add(part, "rows", LENS_PT_I64, k, rows, &err) ||
                lens_partial_add(part, "tokens", LENS_PT_I64, k, tokens, &err) ||
                lens_partial_add(part, "sums", LENS_PT_F64, k * S, sums, &err)))
        rc = -1;
    free(rows), free(tokens), free(sums);
    if (rc) return api_fail_core(c, &err, r->texts.field, "methods", "context mixing");
    if (api_shard_rows(part, r->texts.n, k)) return api_fail(c, 500, "internal", NULL, "out of memory");
    return 0;
}

/* Every text's sums from the shards (each text exactly once), added in text order. */
static int gather(api_call *c, const cm_job_req *r, lens_partial *const *parts, int n_parts, int S, double *total,
                  long *n_tokens)
{
    const int n = r->texts.n;
    double *sums = calloc((size_t)n * S, sizeof *sums);
    int64_t *tokens = calloc((size_t)n, sizeof *tokens);
    char *seen = calloc((size_t)n, 1);
    lens_err err = {0};
    int rc = sums && tokens && seen ? 0 : lens_fail(&err, LENS_ENOMEM, "out of memory for %d texts", n);
    for (int p = 0; p < n_parts && !rc; p++) {
        json_int_t k = json_integer_value(json_object_get(json_object_get(parts[p]->header, "rows"), "in_shard"));
        const int64_t *rows = lens_partial_get(parts[p], "rows", LENS_PT_I64, k, &err);
        const int64_t *tk = rows ? lens_partial_get(parts[p], "tokens", LENS_PT_I64, k, &err) : NULL;
        const double *s = tk ? lens_partial_get(parts[p], "sums", LENS_PT_F64, k * S, &err) : NULL;
        if (!s) rc = -1;
        for (json_int_t i = 0; !rc && i < k; i++) {
            if (rows[i] < 0 || rows[i] >= n || seen[rows[i]] || tk[i] < 1) {
                rc = lens_fail(&err, LENS_EFORMAT, "text %lld is out of range, in two shards or empty", (long long)rows[i]);
                break;
            }
            seen[rows[i]] = 1, tokens[rows[i]] = tk[i];
            memcpy(sums + (size_t)rows[i] * S, s + (size_t)i * S, sizeof *sums * S);
        }
    }
    for (int t = 0; t < n && !rc; t++) {
        if (!seen[t]) {
            rc = lens_fail(&err, LENS_EFORMAT, "text %d is in no shard", t);
            break;
        }
        *n_tokens += (long)tokens[t];
        for (int e = 0; e < S; e++) total[e] += sums[(size_t)t * S + e];
    }
    free(sums), free(tokens), free(seen);
    if (!rc) return 0;
    if (err.code == LENS_EFORMAT) return api_fail(c, 422, "partial_mismatch", "parts", "%s", err.msg);
    return api_fail_core(c, &err, "parts", NULL, "context mixing");
}

void api_context_mixing_job_merge(api_call *c, lens_partial *const *parts, int n_parts)
{
    cm_job_req *r = c->req;
    const int L = r->model->model->cfg.n_layers, S = r->n_methods * L * N_STATS;
    double t0 = api_now();
    double *total = calloc((size_t)S, sizeof *total);
    long n_tokens = 0;
    if (!total) {
        api_fail(c, 500, "internal", NULL, "out of memory");
        return;
    }
    if (gather(c, r, parts, n_parts, S, total, &n_tokens)) {
        free(total);
        return;
    }
    double t1 = api_now();
    static const char *const stat_names[N_STATS] = {"self", "self_rollout", "first", "first_rollout"};
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "model");
    jw_str(w, r->model->name);
    jw_key(w, "source");
    jw_str(w, r->source);
    jw_key(w, "n_texts");
    jw_int(w, r->texts.n);
    jw_key(w, "n_tokens");
    jw_int(w, n_tokens);
    jw_key(w, "definition");
    jw_str(w, r->paper_code ? "paper-code" : "lensd");
    jw_key(w, "methods");
    jw_arr(w);
    for (int q = 0; q < r->n_methods; q++) {
        jw_obj(w);
        jw_key(w, "method");
        jw_str(w, lens_cm_method_name(r->methods[q]));
        jw_key(w, "layers");
        jw_arr(w);
        for (int l = 0; l < L; l++) {
            const double *s = total + ((size_t)q * L + l) * N_STATS;
            jw_obj(w);
            jw_key(w, "layer");
            jw_int(w, l + 1);
            for (int k = 0; k < N_STATS; k++) {
                jw_key(w, stat_names[k]);
                jw_float(w, s[k] / (double)n_tokens, 9);
            }
            jw_end(w);
        }
        jw_end(w);
        jw_end(w);
    }
    jw_end(w);
    free(total);
    api_write_timing(c, 0, t1 - t0, t1);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

void api_context_mixing_job_run(api_call *c) { api_shard_run_whole(c, api_job_kind_find("context-mixing")); }
