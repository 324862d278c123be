/* head_importance.c - job kinds "head-importance" and "adversarial-triggers".
 *
 * Both run attribution (Hao et al., AAAI 2021) over a labelled dataset on a
 * BERT sequence classifier: core/analysis/head_importance.h (importance per head and
 * the pruning curve) and core/analysis/triggers.h (trigger extraction and the
 * attack); rules in docs/attribution.md.
 *
 * Params, both kinds: {model?, rows?: [{text, label}] | data?: "PATH" (a
 * TSV with a header naming a "sentence" (or "text") and a "label" column,
 * as SST-2's dev.tsv; PATH relative to the server's --data-dir, and it must
 * resolve inside it), max_rows? = 1000 (first rows of data), quadrature?,
 * steps?, riemann? (as /v1/attribution: api_decode_schedule), definition? = "paper-code" |
 * "lensd" (the defaults of the named choices below; docs/reproducing.md)}. label: a class index, its
 * decimal text or a label name. Texts longer than the token limit keep
 * their first limit - 1 tokens and the final [SEP].
 * head-importance adds {seeds? = 3 (1..20), seed? = 1, target? = "gold" (paper-code) |
 * "predicted" (lensd), prune_count? = "floor" (paper-code) | "round" (lensd)};
 * adversarial-triggers {sources? = half the rows (the first ones; the rest
 * are victims), rule? = "released" (paper-code) | "lensd", top_k? = 2
 * (released) | 3 (lensd) (1..20)}. Results: see openapi.yaml (HeadImportanceResult,
 * TriggersResult). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/analysis/head_importance.h"
#include "core/analysis/triggers.h"

#define DEFAULT_MAX_ROWS 1000
#define MAX_ROWS 100000

typedef struct {
    char *text; /* owned */
    int label;
} data_row;

typedef struct {
    const api_model *model;
    data_row *rows;
    int n;
    char *source; /* "rows" or the data path as given */
    api_schedule sched;
    int paper_code;       /* definition "paper-code" (default) or "lensd": docs/reproducing.md */
    int seeds, seed;      /* head-importance */
    int target_gold, prune_floor;
    int sources, top_k;   /* adversarial-triggers */
    lens_trigger_rule rule;
} dataset_req;

static void dataset_req_free(void *p)
{
    dataset_req *r = p;
    for (int i = 0; i < r->n; i++) free(r->rows[i].text);
    free(r->rows), free(r->source), free(r);
}

/* label: index, decimal text or label name; -1 when it is none of them */
static int parse_label(const lens_config *cfg, const char *s)
{
    char *end;
    errno = 0;
    long k = strtol(s, &end, 10);
    if (*s && !*end && !errno) return k >= 0 && k < cfg->n_labels ? (int)k : -1;
    for (int i = 0; cfg->labels && i < cfg->n_labels; i++)
        if (cfg->labels[i] && !strcmp(cfg->labels[i], s)) return i;
    return -1;
}

static int add_row(api_call *c, dataset_req *r, const char *text, size_t len, int label)
{
    if (r->n % 256 == 0) {
        data_row *g = realloc(r->rows, sizeof *g * (r->n + 256));
        if (!g) return api_fail(c, 500, "internal", NULL, "out of memory");
        r->rows = g;
    }
    char *t = strndup(text, len);
    if (!t) return api_fail(c, 500, "internal", NULL, "out of memory");
    r->rows[r->n++] = (data_row){t, label};
    return 0;
}

static int decode_rows(api_call *c, dataset_req *r, json_t *rows)
{
    const lens_config *cfg = &r->model->model->cfg;
    char field[64];
    if (!json_is_array(rows) || json_array_size(rows) == 0 || json_array_size(rows) > MAX_ROWS)
        return api_fail(c, 422, "invalid_request", "rows", "rows must be an array of 1..%d {text, label} objects",
                        MAX_ROWS);
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i), *text = json_object_get(row, "text"),
               *label = json_object_get(row, "label");
        if (!json_is_string(text) || !json_string_length(text)) {
            snprintf(field, sizeof field, "rows[%zu].text", i);
            return api_fail(c, 422, "invalid_request", field, "%s must be a non-empty string", field);
        }
        int k = -1;
        if (json_is_integer(label))
            k = json_integer_value(label) >= 0 && json_integer_value(label) < cfg->n_labels
                    ? (int)json_integer_value(label)
                    : -1;
        else if (json_is_string(label)) k = parse_label(cfg, json_string_value(label));
        if (k < 0) {
            snprintf(field, sizeof field, "rows[%zu].label", i);
            return api_fail(c, 422, "invalid_request", field,
                            "%s must be a class index in [0, %d) or a label name of the model", field,
                            cfg->n_labels);
        }
        if (add_row(c, r, json_string_value(text), json_string_length(text), k)) return -1;
    }
    return 0;
}


typedef struct {
    dataset_req *r;
    const char *path;
    int text_col, label_col, max_rows;
} tsv_reader;

static int tsv_row(api_call *c, void *ctx, char **cols, int n_cols, int line_no)
{
    tsv_reader *d = ctx;
    if (line_no == 1) {
        for (int i = 0; i < n_cols; i++) {
            if (!strcmp(cols[i], "sentence") || !strcmp(cols[i], "text")) d->text_col = i;
            if (!strcmp(cols[i], "label")) d->label_col = i;
        }
        if (d->text_col < 0 || d->label_col < 0)
            return api_fail(c, 422, "invalid_request", "data",
                            "\"%.200s\" needs a header line with \"sentence\" (or \"text\") and \"label\" columns",
                            d->path);
        return 0;
    }
    if (n_cols == 1 && !*cols[0]) return 0;
    const lens_config *cfg = &d->r->model->model->cfg;
    const int k = d->text_col < n_cols && d->label_col < n_cols ? parse_label(cfg, cols[d->label_col]) : -1;
    if (k < 0 || !*cols[d->text_col])
        return api_fail(c, 422, "invalid_request", "data",
                        "\"%.200s\" line %d: needs a text and a label index or name of the model", d->path, line_no);
    if (add_row(c, d->r, cols[d->text_col], strlen(cols[d->text_col]), k)) return -1;
    return d->r->n >= d->max_rows;
}

static int decode_tsv(api_call *c, dataset_req *r, const char *path, int max_rows)
{
    tsv_reader d = {.r = r, .path = path, .text_col = -1, .label_col = -1, .max_rows = max_rows};
    if (api_read_data_file(c, path, tsv_row, &d)) return -1;
    if (r->n == 0) return api_fail(c, 422, "invalid_request", "data", "\"%.200s\" has no rows", path);
    return 0;
}

static int dataset_prepare(api_call *c, dataset_req **out)
{
    dataset_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = dataset_req_free;
    *out = r;
    if (api_decode_model(c, &r->model)) return -1;
    const lens_config *cfg = &r->model->model->cfg;
    const char *why = NULL;
    if (!lens_model_supports(r->model->model, LENS_ANALYSIS_HEAD_IMPORTANCE, &why))
        return api_fail(c, 422, "invalid_request", "model", "%s; %s is %s (%s)", why, r->model->name,
                        lens_task_name(cfg->task), cfg->architecture);
    int max_rows = DEFAULT_MAX_ROWS, has_data;
    const char *data = NULL;
    if (api_decode_schedule(c, &r->sched) || api_get_int(c, "max_rows", 1, MAX_ROWS, &max_rows) < 0 ||
        (has_data = api_get_string(c, "data", &data, NULL)) < 0)
        return -1;
    json_t *rows = json_object_get(c->body, "rows");
    if (rows && json_is_null(rows)) rows = NULL;
    if (!rows == !has_data)
        return api_fail(c, 422, "invalid_request", rows ? "data" : "rows",
                        "give exactly one of rows ([{text, label}]) and data (a TSV path in the data directory)");
    if (rows ? decode_rows(c, r, rows) : decode_tsv(c, r, data, max_rows)) return -1;
    r->source = strdup(rows ? "rows" : data);
    if (!r->source) return api_fail(c, 500, "internal", NULL, "out of memory");
    const char *def = NULL;
    int has_def = api_get_string(c, "definition", &def, NULL);
    if (has_def < 0) return -1;
    if (has_def && strcmp(def, "paper-code") && strcmp(def, "lensd"))
        return api_fail(c, 422, "invalid_request", "definition", "definition must be \"paper-code\" or \"lensd\"");
    r->paper_code = !has_def || !strcmp(def, "paper-code");
    return 0;
}

/* An optional string field that must be one of two names: *v = 1 for the
 * first, 0 for the second, unchanged when absent. */
static int get_choice(api_call *c, const char *field, const char *one, const char *zero, int *v)
{
    const char *s = NULL;
    int has = api_get_string(c, field, &s, NULL);
    if (has < 0) return -1;
    if (!has) return 0;
    if (strcmp(s, one) && strcmp(s, zero))
        return api_fail(c, 422, "invalid_request", field, "%s must be \"%s\" or \"%s\"", field, one, zero);
    *v = !strcmp(s, one);
    return 0;
}

int api_head_importance_prepare(api_call *c)
{
    dataset_req *r;
    if (dataset_prepare(c, &r)) return -1;
    r->seeds = 3, r->seed = 1;
    r->target_gold = r->prune_floor = r->paper_code;
    if (api_get_int(c, "seeds", 1, 20, &r->seeds) < 0 || api_get_int(c, "seed", 1, INT_MAX, &r->seed) < 0 ||
        get_choice(c, "target", "gold", "predicted", &r->target_gold) ||
        get_choice(c, "prune_count", "floor", "round", &r->prune_floor))
        return -1;
    return 0;
}

int api_triggers_prepare(api_call *c)
{
    dataset_req *r;
    if (dataset_prepare(c, &r)) return -1;
    if (r->n < 2)
        return api_fail(c, 422, "invalid_request", "rows", "adversarial-triggers needs at least 2 rows (sources and victims)");
    int released = r->paper_code;
    if (get_choice(c, "rule", "released", "lensd", &released)) return -1;
    r->rule = released ? LENS_TRIGGER_RULE_RELEASED : LENS_TRIGGER_RULE_LENSD;
    r->sources = r->n / 2, r->top_k = released ? 2 : 3;
    if (api_get_int(c, "sources", 1, r->n - 1, &r->sources) < 0 || api_get_int(c, "top_k", 1, 20, &r->top_k) < 0)
        return -1;
    return 0;
}

/* Tokenized rows (ids and segments in one allocation per example). */
static int tokenize_rows(api_call *c, const dataset_req *r, lens_example **out)
{
    const lens_model *m = r->model->model;
    const int limit = api_token_limit(c, &m->cfg);
    lens_example *ex = calloc((size_t)r->n, sizeof *ex);
    if (!ex) return api_fail(c, 500, "internal", NULL, "out of memory");
    *out = ex;
    for (int i = 0; i < r->n; i++) {
        lens_token *toks = NULL;
        int n = 0;
        lens_err err = {0};
        if (lens_tokenize(m->tok, r->rows[i].text, strlen(r->rows[i].text), NULL, 0, &toks, &n, &err))
            return err.code == LENS_ENOMEM ? api_fail(c, 500, "internal", NULL, "row %d: %s", i, err.msg)
                                           : api_fail(c, 422, "invalid_request", "rows", "row %d: %s", i, err.msg);
        int *ids = malloc(sizeof(int) * (n ? n : 1));
        if (!ids) {
            free(toks);
            return api_fail(c, 500, "internal", NULL, "out of memory");
        }
        const int T = n > limit ? limit : n;
        for (int t = 0; t < T; t++) ids[t] = toks[t].id;
        if (n > limit) ids[T - 1] = toks[n - 1].id; /* keep the final [SEP] */
        free(toks);
        ex[i] = (lens_example){.ids = ids, .T = T, .label = r->rows[i].label};
        if (T < 1) return api_fail(c, 422, "invalid_request", "rows", "row %d produced no tokens", i);
        api_progress(c, 0.01 * (i + 1) / r->n);
    }
    return 0;
}

static void free_examples(lens_example *ex, int n)
{
    for (int i = 0; ex && i < n; i++) free((void *)ex[i].ids);
    free(ex);
}

static void core_progress(void *user, double fraction) { api_progress(user, 0.01 + 0.98 * fraction); }

static void write_floats(jw *w, const double *v, int n, int precision)
{
    jw_arr(w);
    for (int i = 0; i < n; i++) jw_float(w, v[i], precision);
    jw_end(w);
}

static void write_common(jw *w, const dataset_req *r, int n)
{
    jw_key(w, "model");
    jw_str(w, r->model->name);
    jw_key(w, "source");
    jw_str(w, r->source);
    jw_key(w, "n_examples");
    jw_int(w, n);
    api_write_schedule(w, &r->sched);
    jw_key(w, "definition");
    jw_str(w, r->paper_code ? "paper-code" : "lensd");
}

/* Shard index of count: the per-head maxima of the examples e with
 * e % count == index ("rows" [k], "attr" and "attn" [k][L*NH]). */
int api_head_importance_shard(api_call *c, int index, int count, lens_partial *part)
{
    dataset_req *r = c->req;
    const lens_model *m = r->model->model;
    const int H = m->cfg.n_layers * m->cfg.n_heads;
    lens_example *ex = NULL;
    api_progress(c, 0);
    if (tokenize_rows(c, r, &ex)) {
        free_examples(ex, r->n);
        return -1;
    }
    double *attr = calloc((size_t)r->n * H, sizeof(double)), *attn = calloc((size_t)r->n * H, sizeof(double));
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)r->n);
    lens_head_opts o = {.steps = r->sched.steps, .riemann = r->sched.riemann,
                        .quadrature = r->sched.quadrature, .target_gold = r->target_gold,
                        .n_seeds = r->seeds, .seed = (unsigned long long)r->seed, .pool = c->threads,
                        .cancel = c->cancel, .progress = core_progress, .progress_user = c,
                        .stage = LENS_HEAD_EXAMPLES, .shard_index = index, .shard_count = count,
                        .example_attr = attr, .example_attn = attn};
    lens_head_importance hi;
    lens_err err = {0};
    int rc = attr && attn && rows ? lens_head_importance_run(m, ex, r->n, &o, &hi, &err)
                                  : lens_fail(&err, LENS_ENOMEM, "out of memory for head importance");
    free_examples(ex, r->n);
    long k = 0;
    for (int e = index; !rc && e < r->n; e += count) { /* pack this shard's rows */
        memmove(attr + (size_t)k * H, attr + (size_t)e * H, sizeof(double) * H);
        memmove(attn + (size_t)k * H, attn + (size_t)e * H, sizeof(double) * H);
        rows[k++] = e;
    }
    if (!rc && (lens_partial_add(part, "rows", LENS_PT_I64, k, rows, &err) ||
                lens_partial_add(part, "attr", LENS_PT_F64, k * H, attr, &err) ||
                lens_partial_add(part, "attn", LENS_PT_F64, k * H, attn, &err)))
        rc = -1;
    free(attr), free(attn), free(rows);
    if (rc) return api_fail_core(c, &err, "text", NULL, "head importance");
    if (api_shard_rows(part, r->n, k)) return api_fail(c, 500, "internal", NULL, "out of memory");
    return 0;
}

/* Gathers every example's maxima from the shards (each row exactly once),
 * then the means and the pruning curve over all examples. */
void api_head_importance_merge(api_call *c, lens_partial *const *parts, int n_parts)
{
    dataset_req *r = c->req;
    const lens_model *m = r->model->model;
    const int H = m->cfg.n_layers * m->cfg.n_heads;
    double t0 = api_now();
    double *attr = calloc((size_t)r->n * H, sizeof(double)), *attn = calloc((size_t)r->n * H, sizeof(double));
    const char *const names[] = {"attr", "attn"};
    const long widths[] = {H, H};
    double *const outs[] = {attr, attn};
    if (!attr || !attn) {
        free(attr), free(attn);
        api_fail(c, 500, "internal", NULL, "out of memory for head importance");
        return;
    }
    if (api_shard_gather_rows(c, parts, n_parts, r->n, 2, names, widths, outs, "head importance")) {
        free(attr), free(attn);
        return;
    }
    lens_example *ex = NULL;
    if (tokenize_rows(c, r, &ex)) {
        free_examples(ex, r->n);
        free(attr), free(attn);
        return;
    }
    double t1 = api_now();
    lens_head_opts o = {.steps = r->sched.steps, .riemann = r->sched.riemann,
                        .quadrature = r->sched.quadrature, .target_gold = r->target_gold,
                        .prune_floor = r->prune_floor, .n_seeds = r->seeds,
                        .seed = (unsigned long long)r->seed, .pool = c->threads, .cancel = c->cancel,
                        .progress = core_progress, .progress_user = c, .stage = LENS_HEAD_FINISH,
                        .example_attr = attr, .example_attn = attn};
    lens_head_importance hi;
    lens_err err = {0};
    const int rc = lens_head_importance_run(m, ex, r->n, &o, &hi, &err);
    free_examples(ex, r->n);
    free(attr), free(attn);
    if (rc) {
        api_fail_core(c, &err, "text", NULL, "head importance");
        return;
    }
    double t2 = api_now();
    const int L = hi.n_layers, NH = hi.n_heads;
    jw *w = &c->out;
    jw_obj(w);
    write_common(w, r, hi.n_examples);
    jw_key(w, "target");
    jw_str(w, r->target_gold ? "gold" : "predicted");
    jw_key(w, "prune_count");
    jw_str(w, r->prune_floor ? "floor" : "round");
    jw_key(w, "heads");
    jw_arr(w);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < NH; h++) {
            jw_obj(w);
            jw_key(w, "layer");
            jw_int(w, l + 1);
            jw_key(w, "head");
            jw_int(w, h);
            jw_key(w, "attribution");
            jw_float(w, hi.attr_importance[l * NH + h], 9);
            jw_key(w, "attention");
            jw_float(w, hi.attn_importance[l * NH + h], 9);
            jw_end(w);
        }
    jw_end(w);
    jw_key(w, "baseline_accuracy");
    jw_float(w, hi.acc_attr[0], 6);
    jw_key(w, "pruning");
    jw_obj(w);
    jw_key(w, "fraction");
    write_floats(w, hi.fraction, LENS_PRUNE_POINTS, 2);
    jw_key(w, "heads_pruned");
    jw_ints(w, hi.n_pruned, LENS_PRUNE_POINTS);
    jw_key(w, "attribution");
    write_floats(w, hi.acc_attr, LENS_PRUNE_POINTS, 6);
    jw_key(w, "attention");
    write_floats(w, hi.acc_attn, LENS_PRUNE_POINTS, 6);
    jw_key(w, "random");
    write_floats(w, hi.acc_random, LENS_PRUNE_POINTS, 6);
    jw_key(w, "seeds");
    jw_int(w, hi.n_seeds);
    jw_key(w, "seed");
    jw_int(w, r->seed);
    jw_end(w);
    lens_head_importance_free(&hi);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

void api_head_importance_run(api_call *c) { api_shard_run_whole(c, api_job_kind_find("head-importance")); }

/* The partial's tensors of one source field, each [k][LENS_TRIGGER_MAX_TOP_K] or [k]. */
#define TOPK LENS_TRIGGER_MAX_TOP_K

/* Shard index of count: the patterns of the source examples e % count == index. */
int api_triggers_shard(api_call *c, int index, int count, lens_partial *part)
{
    dataset_req *r = c->req;
    const lens_model *m = r->model->model;
    lens_example *ex = NULL;
    api_progress(c, 0);
    if (tokenize_rows(c, r, &ex)) {
        free_examples(ex, r->n);
        return -1;
    }
    const int n = r->sources;
    lens_trigger_source *src = calloc((size_t)n, sizeof *src);
    int64_t *ints = malloc(sizeof(int64_t) * (size_t)n * (3 + 2 * TOPK));
    double *reals = malloc(sizeof(double) * (size_t)n * 3 * TOPK);
    lens_trigger_opts o = {.steps = r->sched.steps, .riemann = r->sched.riemann,
                           .quadrature = r->sched.quadrature, .rule = r->rule, .top_k = r->top_k,
                           .pool = c->threads, .cancel = c->cancel, .progress = core_progress, .progress_user = c,
                           .stage = LENS_TRIGGER_SOURCES, .shard_index = index, .shard_count = count,
                           .sources = src};
    lens_trigger_result tr;
    lens_err err = {0};
    int rc = src && ints && reals ? lens_triggers_run(m, ex, n, ex + n, r->n - n, &o, &tr, &err)
                                  : lens_fail(&err, LENS_ENOMEM, "out of memory for triggers");
    free_examples(ex, r->n);
    long k = 0;
    for (int e = index; !rc && e < n; e += count) k++;
    int64_t *rows = ints, *cls = rows + k, *np = cls + k, *ta = np + k, *tb = ta + k * TOPK;
    double *pa = reals, *pb = pa + k * TOPK, *sc = pb + k * TOPK;
    for (int e = index, i = 0; !rc && e < n; e += count, i++) {
        rows[i] = e, cls[i] = src[e].cls, np[i] = src[e].n;
        for (int q = 0; q < TOPK; q++) {
            ta[i * TOPK + q] = src[e].a[q], tb[i * TOPK + q] = src[e].b[q];
            pa[i * TOPK + q] = src[e].pos_a[q], pb[i * TOPK + q] = src[e].pos_b[q], sc[i * TOPK + q] = src[e].score[q];
        }
    }
    const char *names[] = {"rows", "cls", "n", "a", "b", "pos_a", "pos_b", "score"};
    const int64_t *iv[] = {rows, cls, np, ta, tb};
    const double *dv[] = {pa, pb, sc};
    for (int t = 0; t < 8 && !rc; t++)
        rc = t < 5 ? lens_partial_add(part, names[t], LENS_PT_I64, t < 3 ? k : k * TOPK, iv[t], &err)
                   : lens_partial_add(part, names[t], LENS_PT_F64, k * TOPK, dv[t - 5], &err);
    free(src), free(ints), free(reals);
    if (rc) return api_fail_core(c, &err, "text", NULL, "adversarial triggers");
    if (api_shard_rows(part, n, k)) return api_fail(c, 500, "internal", NULL, "out of memory");
    return 0;
}

/* Every source's patterns from the shards (each source once), then the
 * selection of triggers and the attack on the victims. */
void api_triggers_merge(api_call *c, lens_partial *const *parts, int n_parts)
{
    dataset_req *r = c->req;
    const lens_model *m = r->model->model;
    const lens_config *cfg = &m->cfg;
    double t0 = api_now();
    const int n = r->sources;
    lens_trigger_source *src = calloc((size_t)n, sizeof *src);
    char *seen = calloc((size_t)n, 1);
    lens_err err = {0};
    int rc = src && seen ? 0 : lens_fail(&err, LENS_ENOMEM, "out of memory for triggers");
    for (int p = 0; p < n_parts && !rc; p++) {
        json_int_t k = json_integer_value(json_object_get(json_object_get(parts[p]->header, "rows"), "in_shard"));
        const int64_t *rows = lens_partial_get(parts[p], "rows", LENS_PT_I64, k, &err);
        const int64_t *cls = rows ? lens_partial_get(parts[p], "cls", LENS_PT_I64, k, &err) : NULL;
        const int64_t *np = cls ? lens_partial_get(parts[p], "n", LENS_PT_I64, k, &err) : NULL;
        const int64_t *ta = np ? lens_partial_get(parts[p], "a", LENS_PT_I64, k * TOPK, &err) : NULL;
        const int64_t *tb = ta ? lens_partial_get(parts[p], "b", LENS_PT_I64, k * TOPK, &err) : NULL;
        const double *pa = tb ? lens_partial_get(parts[p], "pos_a", LENS_PT_F64, k * TOPK, &err) : NULL;
        const double *pb = pa ? lens_partial_get(parts[p], "pos_b", LENS_PT_F64, k * TOPK, &err) : NULL;
        const double *sc = pb ? lens_partial_get(parts[p], "score", LENS_PT_F64, k * TOPK, &err) : NULL;
        if (!sc) rc = -1;
        for (json_int_t i = 0; !rc && i < k; i++) {
            const int64_t e = rows[i];
            if (e < 0 || e >= n || seen[e] || np[i] < 0 || np[i] > TOPK || cls[i] < -1 || cls[i] >= cfg->n_labels) {
                rc = lens_fail(&err, LENS_EFORMAT, "source %lld is out of range, in two shards or malformed",
                               (long long)e);
                break;
            }
            seen[e] = 1;
            src[e].cls = (int)cls[i], src[e].n = (int)np[i];
            for (int q = 0; q < TOPK; q++) {
                src[e].a[q] = (int)ta[i * TOPK + q], src[e].b[q] = (int)tb[i * TOPK + q];
                src[e].pos_a[q] = pa[i * TOPK + q], src[e].pos_b[q] = pb[i * TOPK + q];
                src[e].score[q] = sc[i * TOPK + q];
            }
        }
    }
    for (int e = 0; e < n && !rc; e++)
        if (!seen[e]) rc = lens_fail(&err, LENS_EFORMAT, "source %d is in no shard", e);
    free(seen);
    if (rc) {
        free(src);
        if (err.code == LENS_EFORMAT) api_fail(c, 422, "partial_mismatch", "parts", "%s", err.msg);
        else api_fail_core(c, &err, "parts", NULL, "adversarial triggers");
        return;
    }
    lens_example *ex = NULL;
    if (tokenize_rows(c, r, &ex)) {
        free_examples(ex, r->n);
        free(src);
        return;
    }
    double t1 = api_now();
    lens_trigger_opts o = {.steps = r->sched.steps, .riemann = r->sched.riemann,
                           .quadrature = r->sched.quadrature, .rule = r->rule, .top_k = r->top_k,
                           .pool = c->threads, .cancel = c->cancel, .progress = core_progress, .progress_user = c,
                           .stage = LENS_TRIGGER_FINISH, .sources = src};
    lens_trigger_result tr;
    rc = lens_triggers_run(m, ex, n, ex + n, r->n - n, &o, &tr, &err);
    free_examples(ex, r->n);
    free(src);
    if (rc) {
        api_fail_core(c, &err, "text", NULL, "adversarial triggers");
        return;
    }
    double t2 = api_now();
    jw *w = &c->out;
    jw_obj(w);
    write_common(w, r, r->n);
    jw_key(w, "sources");
    jw_int(w, r->sources);
    jw_key(w, "victims");
    jw_int(w, r->n - r->sources);
    jw_key(w, "rule");
    jw_str(w, r->rule == LENS_TRIGGER_RULE_RELEASED ? "released" : "lensd");
    jw_key(w, "top_k");
    jw_int(w, r->top_k);
    jw_key(w, "triggers");
    jw_arr(w);
    for (int k = 0; k < tr.n_labels; k++) {
        const lens_trigger *t = &tr.triggers[k];
        jw_obj(w);
        jw_key(w, "label");
        jw_int(w, k);
        jw_key(w, "label_name");
        jw_str(w, cfg->labels ? cfg->labels[k] : NULL);
        jw_key(w, "found");
        jw_bool(w, t->found);
        if (t->found) {
            int ids[2] = {t->token_a, t->token_b};
            jw_key(w, "token_ids");
            jw_ints(w, ids, 2);
            jw_key(w, "tokens");
            jw_arr(w);
            jw_str(w, lens_tokenizer_piece(m->tok, t->token_a));
            jw_str(w, lens_tokenizer_piece(m->tok, t->token_b));
            jw_end(w);
            double pos[2] = {t->pos_a, t->pos_b};
            jw_key(w, "positions");
            write_floats(w, pos, 2, 4);
            jw_key(w, "count");
            jw_int(w, t->count);
            jw_key(w, "score");
            jw_float(w, t->score, 6);
        }
        jw_end(w);
    }
    jw_end(w);
    jw_key(w, "attack");
    jw_arr(w);
    for (int k = 0; k < tr.n_labels; k++) {
        jw_obj(w);
        jw_key(w, "label");
        jw_int(w, k);
        jw_key(w, "label_name");
        jw_str(w, cfg->labels ? cfg->labels[k] : NULL);
        jw_key(w, "n");
        jw_int(w, tr.n_victims[k]);
        jw_key(w, "trigger_from");
        if (tr.trigger_label[k] < 0) jw_null(w);
        else jw_int(w, tr.trigger_label[k]);
        jw_key(w, "accuracy_before");
        jw_float(w, tr.acc_before[k], 6);
        jw_key(w, "accuracy_after");
        jw_float(w, tr.acc_after[k], 6);
        jw_end(w);
    }
    jw_end(w);
    jw_key(w, "accuracy_before");
    jw_float(w, tr.total_before, 6);
    jw_key(w, "accuracy_after");
    jw_float(w, tr.total_after, 6);
    lens_trigger_result_free(&tr);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

void api_triggers_run(api_call *c) { api_shard_run_whole(c, api_job_kind_find("adversarial-triggers")); }
