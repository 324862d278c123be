/* faithfulness.c - job kind "faithfulness": for each explanation method,
 * deletion and insertion curves over a dataset, their areas (AOPC) and
 * ERASER's comprehensiveness and sufficiency against a seeded random
 * ordering (core/analysis/faithfulness.h; docs/faithfulness.md).
 *
 * Params {model?, texts?: [text..] | data?: "PATH" (a TSV with a header
 * naming a "sentence" or "text" column, as SST-2's dev.tsv, inside
 * --data-dir), max_rows? = 1000 (first rows of data), methods? = every
 * method defined on the model but hidden-attribution, unit? = "tokens" |
 * "heads" (zero-ablated heads instead of deleted tokens), fractions? = [0, 0.1, .., 1], objective? (as
 * /v1/attribution's; a negative position counts from each row's end),
 * steps? = 20 (attention attribution's m), seed? = 1, random_orderings? =
 * 10}. Sharded by row (r % N == I): a shard's partial holds, per row and
 * method, F(x), F(empty), the curves and the ERASER bins; the merge averages
 * them in row order, so 1 and N shards give the same numbers bit for bit.
 * Result: FaithfulnessResult in openapi.yaml. Bad input is a 422 naming the
 * field: an unknown or undefined method (methods), a fraction outside [0, 1]
 * (fractions), fewer rows than shards (texts / data). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/analysis/faithfulness.h"

#define DEFAULT_MAX_ROWS 1000
#define MAX_ROWS 100000
#define MAX_FRACTIONS 101

typedef struct {
    const api_model *model;
    char **texts; /* [n], owned */
    int n, from_data;
    char *source; /* "texts" or the data path as given */
    lens_faith_unit unit;
    lens_faith_method methods[LENS_FAITH_COUNT];
    int n_methods;
    double fractions[MAX_FRACTIONS];
    int n_fractions;
    int target; /* -1 = each row's prediction */
    lens_objective objective; /* position as given (negative counts from the end) */
    int steps, seed, orderings;
} faith_req;

/* the numbers a row gives per method: F(x), F(empty), D [nf], I [nf], ERASER D [5], I [5] */
static int row_width(const faith_req *r) { return 2 + 2 * r->n_fractions + 2 * LENS_FAITH_BINS; }

static void faith_req_free(void *p)
{
    faith_req *r = p;
    for (int i = 0; i < r->n; i++) free(r->texts[i]);
    free(r->texts), free(r->source), free(r);
}

static int add_text(api_call *c, faith_req *r, const char *text, size_t len)
{
    if (r->n % 256 == 0) {
        char **g = realloc(r->texts, sizeof *g * (r->n + 256));
        if (!g) return api_fail(c, 500, "internal", NULL, "out of memory");
        r->texts = g;
    }
    if (!(r->texts[r->n] = strndup(text, len))) return api_fail(c, 500, "internal", NULL, "out of memory");
    r->n++;
    return 0;
}

typedef struct {
    faith_req *r;
    const char *path;
    int text_col, max_rows;
} tsv_texts;

static int tsv_row(api_call *c, void *ctx, char **cols, int n_cols, int line_no)
{
    tsv_texts *d = ctx;
    if (line_no == 1) {
        for (int i = 0; i < n_cols && d->text_col < 0; i++)
            if (!strcmp(cols[i], "sentence") || !strcmp(cols[i], "text")) d->text_col = i;
        if (d->text_col < 0)
            return api_fail(c, 422, "invalid_request", "data",
                            "\"%.200s\" needs a header line with a \"sentence\" (or \"text\") column", d->path);
        return 0;
    }
    if (n_cols == 1 && !*cols[0]) return 0;
    if (d->text_col >= n_cols || !*cols[d->text_col])
        return api_fail(c, 422, "invalid_request", "data", "\"%.200s\" line %d has no text", d->path, line_no);
    if (add_text(c, d->r, cols[d->text_col], strlen(cols[d->text_col]))) return -1;
    return d->r->n >= d->max_rows;
}

static int decode_dataset(api_call *c, faith_req *r)
{
    int max_rows = DEFAULT_MAX_ROWS, has_data;
    const char *data = NULL;
    if (api_get_int(c, "max_rows", 1, MAX_ROWS, &max_rows) < 0 ||
        (has_data = api_get_string(c, "data", &data, NULL)) < 0)
        return -1;
    json_t *texts = json_object_get(c->body, "texts");
    if (texts && json_is_null(texts)) texts = NULL;
    if (!texts == !has_data)
        return api_fail(c, 422, "invalid_request", texts ? "data" : "texts",
                        "give exactly one of texts ([text..]) and data (a TSV path in the data directory)");
    if (has_data) {
        tsv_texts d = {.r = r, .path = data, .text_col = -1, .max_rows = max_rows};
        if (api_read_data_file(c, data, tsv_row, &d)) return -1;
        if (!r->n) return api_fail(c, 422, "invalid_request", "data", "\"%.200s\" has no rows", data);
    } else {
        if (!json_is_array(texts) || !json_array_size(texts) || json_array_size(texts) > MAX_ROWS)
            return api_fail(c, 422, "invalid_request", "texts", "texts must be an array of 1..%d texts", MAX_ROWS);
        for (size_t i = 0; i < json_array_size(texts); i++) {
            const json_t *t = json_array_get(texts, i);
            if (!json_is_string(t) || !json_string_length(t))
                return api_fail(c, 422, "invalid_request", "texts", "texts[%zu] must be a non-empty string", i);
            if (add_text(c, r, json_string_value(t), json_string_length(t))) return -1;
        }
    }
    r->from_data = has_data;
    r->source = strdup(has_data ? data : "texts");
    return r->source ? 0 : api_fail(c, 500, "internal", NULL, "out of memory");
}

/* methods: names, each once and defined on the model; absent = every defined
 * one but hidden-attribution (opt-in: its exact Jacobians cost more than all
 * the others together, docs/faithfulness.md "Cost") */
static int decode_methods(api_call *c, faith_req *r)
{
    const lens_model *m = r->model->model;
    const json_t *v = json_object_get(c->body, "methods");
    if (!v || json_is_null(v)) {
        for (int k = 0; k < LENS_FAITH_COUNT; k++)
            if (k != LENS_FAITH_HIDDEN && !lens_faith_undefined(m, (lens_faith_method)k, r->unit))
                r->methods[r->n_methods++] = (lens_faith_method)k;
        return 0;
    }
    if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > LENS_FAITH_COUNT)
        return api_fail(c, 422, "invalid_request", "methods", "methods must be an array of 1..%d method names",
                        LENS_FAITH_COUNT);
    size_t i;
    const json_t *name;
    json_array_foreach(v, i, name) {
        lens_faith_method k;
        if (!json_is_string(name) || lens_faith_method_parse(json_string_value(name), &k))
            return api_fail(c, 422, "invalid_request", "methods",
                            "methods[%zu] is not a method (random, attention, effective-attention, "
                            "attention-attribution, hidden-attribution, rollout, alti, globenc, value-zeroing, "
                            "leave-one-out, logit-attribution)", i);
        for (int j = 0; j < r->n_methods; j++)
            if (r->methods[j] == k)
                return api_fail(c, 422, "invalid_request", "methods", "methods[%zu]: %s is given twice", i,
                                lens_faith_method_name(k));
        const char *why = lens_faith_undefined(m, k, r->unit);
        if (why)
            return api_fail(c, 422, "invalid_request", "methods", "methods[%zu]: %s with unit %s: %s", i,
                            lens_faith_method_name(k), lens_faith_unit_name(r->unit), why);
        r->methods[r->n_methods++] = k;
    }
    return 0;
}

/* unit: "tokens" (default) or "heads" */
static int decode_unit(api_call *c, faith_req *r)
{
    const char *unit = NULL;
    const int has = api_get_string(c, "unit", &unit, NULL);
    if (has < 0) return -1;
    if (!has || !strcmp(unit, "tokens")) r->unit = LENS_FAITH_TOKENS;
    else if (!strcmp(unit, "heads")) r->unit = LENS_FAITH_HEADS;
    else return api_fail(c, 422, "invalid_request", "unit", "unit must be tokens or heads");
    return 0;
}

static int decode_fractions(api_call *c, faith_req *r)
{
    const json_t *v = json_object_get(c->body, "fractions");
    if (!v || json_is_null(v)) {
        for (int q = 0; q <= 10; q++) r->fractions[q] = q / 10.0;
        r->n_fractions = 11;
        return 0;
    }
    if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > MAX_FRACTIONS)
        return api_fail(c, 422, "invalid_request", "fractions", "fractions must be an array of 1..%d numbers in [0, 1]",
                        MAX_FRACTIONS);
    size_t i;
    const json_t *f;
    json_array_foreach(v, i, f) {
        const double x = json_number_value(f);
        if (!json_is_number(f) || !(x >= 0 && x <= 1) || (i && x <= r->fractions[i - 1]))
            return api_fail(c, 422, "invalid_request", "fractions",
                            "fractions[%zu] must be a number in [0, 1], above the one before it", i);
        r->fractions[r->n_fractions++] = x;
    }
    return 0;
}

int api_faithfulness_prepare(api_call *c)
{
    faith_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = faith_req_free;
    if (api_decode_objective_model(c, "faithfulness", &r->model)) return -1;
    if (!r->model->model->tok)
        return api_fail(c, 422, "invalid_request", "model", "faithfulness needs the model's tokenizer (texts)");
    r->target = -1, r->steps = 20, r->seed = 1, r->orderings = 10;
    if (decode_dataset(c, r) || decode_unit(c, r) || decode_methods(c, r) || decode_fractions(c, r) ||
        api_decode_objective(c, r->model->model, &r->target, &r->objective, NULL) ||
        api_get_int(c, "steps", 1, 1000, &r->steps) < 0 || api_get_int(c, "seed", 0, INT_MAX, &r->seed) < 0 ||
        api_get_int(c, "random_orderings", 1, 1000, &r->orderings) < 0)
        return -1;
    return 0;
}

/* Row e's ids (truncated to the token limit, the last token kept, as the
 * dataset jobs do) into *ids, *T. */
static int tokenize_row(api_call *c, const faith_req *r, int e, int **ids, int *T)
{
    const lens_model *m = r->model->model;
    const int limit = api_token_limit(c, &m->cfg);
    lens_token *toks = NULL;
    int n = 0;
    lens_err err = {0};
    if (lens_tokenize(m->tok, r->texts[e], strlen(r->texts[e]), NULL, 0, &toks, &n, &err))
        return err.code == LENS_ENOMEM ? api_fail(c, 500, "internal", NULL, "row %d: %s", e, err.msg)
                                       : api_fail(c, 422, "invalid_request", r->from_data ? "data" : "texts",
                                                  "row %d: %s", e, err.msg);
    *T = n > limit ? limit : n;
    *ids = malloc(sizeof(int) * (n ? n : 1));
    if (!*ids) {
        free(toks);
        return api_fail(c, 500, "internal", NULL, "out of memory");
    }
    for (int t = 0; t < *T; t++) (*ids)[t] = toks[t].id;
    if (n > limit) (*ids)[*T - 1] = toks[n - 1].id;
    free(toks);
    if (*T < 1) return api_fail(c, 422, "invalid_request", r->from_data ? "data" : "texts", "row %d produced no tokens", e);
    return 0;
}

/* values [M][W] of row e: every method's lens_faith_run */
static int run_row(api_call *c, const faith_req *r, int e, double *values)
{
    int *ids = NULL, T = 0;
    if (tokenize_row(c, r, e, &ids, &T)) {
        free(ids);
        return -1;
    }
    lens_objective obj = r->objective;
    if (obj.position < -1) obj.position += T; /* -1 stays: the last, resolved by the core */
    if (r->model->model->cfg.task == LENS_TASK_CAUSAL_LM && (obj.position < -1 || obj.position >= T)) {
        free(ids);
        return api_fail(c, 422, "invalid_request", "objective.position", "objective.position %d is outside row %d's %d tokens",
                        r->objective.position, e, T);
    }
    const lens_faith_opts o = {.fractions = r->fractions, .n_fractions = r->n_fractions, .unit = r->unit,
                               .target = r->target, .objective = &obj, .steps = r->steps,
                               .seed = (unsigned long long)r->seed, .row = e, .random_orderings = r->orderings,
                               .cancel = c->cancel, .pool = c->threads};
    const int nf = r->n_fractions, W = row_width(r);
    int rc = 0;
    for (int k = 0; k < r->n_methods && !rc; k++) {
        lens_faith_row fr;
        lens_err err = {0};
        if (lens_faith_run(r->model->model, ids, NULL, T, r->methods[k], &o, &fr, &err)) {
            rc = api_fail_core(c, &err, r->from_data ? "data" : "texts", "objective", "faithfulness");
            break;
        }
        double *v = values + (size_t)k * W;
        v[0] = fr.full, v[1] = fr.empty;
        memcpy(v + 2, fr.deletion, sizeof(double) * nf);
        memcpy(v + 2 + nf, fr.insertion, sizeof(double) * nf);
        memcpy(v + 2 + 2 * nf, fr.eraser_deletion, sizeof fr.eraser_deletion);
        memcpy(v + 2 + 2 * nf + LENS_FAITH_BINS, fr.eraser_insertion, sizeof fr.eraser_insertion);
        lens_faith_row_free(&fr);
    }
    free(ids);
    return rc;
}

/* Shard index of count: rows e with e % count == index ("rows" [k], "values" [k][M][W]). */
int api_faithfulness_shard(api_call *c, int index, int count, lens_partial *part)
{
    faith_req *r = c->req;
    if (r->n < count)
        return api_fail(c, 422, "invalid_request", r->from_data ? "data" : "texts",
                        "%d rows for %d shards: every shard needs a row", r->n, count);
    const int W = row_width(r), M = r->n_methods;
    const long k_max = (r->n - index + count - 1) / count;
    double *values = malloc(sizeof(double) * (size_t)k_max * M * W);
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)k_max);
    if (!values || !rows) {
        free(values), free(rows);
        return api_fail(c, 500, "internal", NULL, "out of memory");
    }
    long k = 0;
    int rc = 0;
    api_progress(c, 0);
    for (int e = index; e < r->n && !rc; e += count, k++) {
        rows[k] = e;
        rc = run_row(c, r, e, values + (size_t)k * M * W);
        api_progress(c, 0.99 * (k + 1) / k_max);
    }
    lens_err err = {0};
    if (!rc && (lens_partial_add(part, "rows", LENS_PT_I64, k, rows, &err) ||
                lens_partial_add(part, "values", LENS_PT_F64, k * M * W, values, &err)))
        rc = api_fail(c, 500, "internal", NULL, "%s", err.msg);
    free(values), free(rows);
    if (rc) return -1;
    return api_shard_rows(part, r->n, k) ? api_fail(c, 500, "internal", NULL, "out of memory") : 0;
}

static void write_curve(jw *w, const char *key, const double *v, int n, int precision)
{
    jw_key(w, key);
    jw_arr(w);
    for (int i = 0; i < n; i++) jw_float(w, v[i], precision);
    jw_end(w);
}

/* The table of one method from every row's values (row order):
 * mean curves; AOPC deletion = mean_f (F(x) - D(f)), AOPC insertion =
 * mean_f (I(f) - F(empty)); comprehensiveness = mean_b (F(x) - D(b)),
 * sufficiency = mean_b (F(x) - I(b)); each averaged over rows. */
static void write_method(jw *w, const faith_req *r, const double *all, int k, double *del, double *ins)
{
    const int nf = r->n_fractions, W = row_width(r), M = r->n_methods;
    double aopc_del = 0, aopc_ins = 0, comp = 0, suff = 0;
    memset(del, 0, sizeof(double) * nf), memset(ins, 0, sizeof(double) * nf);
    for (int e = 0; e < r->n; e++) {
        const double *v = all + ((size_t)e * M + k) * W, full = v[0], empty = v[1];
        for (int q = 0; q < nf; q++) {
            del[q] += v[2 + q] / r->n, ins[q] += v[2 + nf + q] / r->n;
            aopc_del += (full - v[2 + q]) / nf / r->n, aopc_ins += (v[2 + nf + q] - empty) / nf / r->n;
        }
        for (int b = 0; b < LENS_FAITH_BINS; b++) {
            comp += (full - v[2 + 2 * nf + b]) / LENS_FAITH_BINS / r->n;
            suff += (full - v[2 + 2 * nf + LENS_FAITH_BINS + b]) / LENS_FAITH_BINS / r->n;
        }
    }
    jw_obj(w);
    jw_key(w, "method");
    jw_str(w, lens_faith_method_name(r->methods[k]));
    jw_key(w, "aopc_deletion");
    jw_float(w, aopc_del, 9);
    jw_key(w, "aopc_insertion");
    jw_float(w, aopc_ins, 9);
    jw_key(w, "comprehensiveness");
    jw_float(w, comp, 9);
    jw_key(w, "sufficiency");
    jw_float(w, suff, 9);
    write_curve(w, "deletion_curve", del, nf, 9);
    write_curve(w, "insertion_curve", ins, nf, 9);
    jw_end(w);
}

/* Every row's values from the shards (each row exactly once), then the table. */
void api_faithfulness_merge(api_call *c, lens_partial *const *parts, int n_parts)
{
    faith_req *r = c->req;
    const int W = row_width(r), M = r->n_methods, nf = r->n_fractions;
    double t0 = api_now();
    double *all = malloc(sizeof(double) * (size_t)r->n * M * W);
    double *curve = malloc(sizeof(double) * 2 * nf);
    const char *const names[] = {"values"};
    const long widths[] = {(long)M * W};
    if (!all || !curve) {
        free(all), free(curve);
        api_fail(c, 500, "internal", NULL, "out of memory for faithfulness");
        return;
    }
    if (api_shard_gather_rows(c, parts, n_parts, r->n, 1, names, widths, &all, "faithfulness")) {
        free(all), free(curve);
        return;
    }
    const lens_model *m = r->model->model;
    double full = 0, empty = 0;
    for (int e = 0; e < r->n; e++) full += all[(size_t)e * M * W] / r->n, empty += all[(size_t)e * M * W + 1] / r->n;
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "model");
    jw_str(w, r->model->name);
    jw_key(w, "source");
    jw_str(w, r->source);
    jw_key(w, "n_examples");
    jw_int(w, r->n);
    api_write_objective_open(w, m, &r->objective);
    jw_end(w);
    if (r->target < 0) {
        jw_key(w, "target");
        jw_str(w, "predicted");
    } else {
        api_write_output(w, m, "target", r->target);
    }
    jw_key(w, "unit");
    jw_str(w, lens_faith_unit_name(r->unit));
    jw_key(w, "removal");
    jw_str(w, r->unit == LENS_FAITH_HEADS ? "zero-ablate" : "delete");
    write_curve(w, "fractions", r->fractions, nf, 6);
    write_curve(w, "eraser_bins", lens_faith_eraser_bins, LENS_FAITH_BINS, 6);
    jw_key(w, "seed");
    jw_int(w, r->seed);
    jw_key(w, "random_orderings");
    jw_int(w, r->orderings);
    jw_key(w, "steps");
    jw_int(w, r->steps);
    jw_key(w, "full");
    jw_float(w, full, 9);
    jw_key(w, "empty");
    jw_float(w, empty, 9);
    jw_key(w, "methods");
    jw_arr(w);
    for (int k = 0; k < M; k++) write_method(w, r, all, k, curve, curve + nf);
    jw_end(w);
    free(all), free(curve);
    double t1 = api_now();
    api_write_timing(c, 0, t1 - t0, t1);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

void api_faithfulness_run(api_call *c) { api_shard_run_whole(c, api_job_kind_find("faithfulness")); }
