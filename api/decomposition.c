/* decomposition.c - POST /v1/decomposition, job kind "decomposition" and
 * `lensd decompose`.
 *
 * h = mean + pos + ctx + resid over windows of T tokens (Song & Zhong 2023),
 * via the streaming accumulator of core/analysis/decomposition.h (definitions in
 * docs/decomposition.md).
 *
 * Request {model?, texts: [string..] | windows: [[id..]..] | corpus: [path..],
 * length: T (required with texts and corpus; with windows it defaults to
 * their length), layers?
 * (hidden-state indices 0..L, default all), labels? (one string or integer
 * per text / window / corpus file), drop_first_position? = true, causal?
 * = false (BERT run causally, as the paper), top_k? (principal angles,
 * default 10), async? = false}. corpus names files inside --data-dir, each
 * read as one text and, without labels, its own topic. texts are tokenized without special
 * tokens, concatenated and cut into windows of T (the tail is dropped; with
 * labels no window spans two labels). async: true answers 202 with a job of
 * kind "decomposition" (GET /v1/jobs/{id} for progress and the result).
 *
 * Response {model, length, positions, first_position, windows, n_tokens,
 * labels?, layers: [{layer, variance_share {mean, pos, ctx, resid},
 * relative_norm {pos, ctx, resid}, pos_stable_rank, pos_explained {k2, k10,
 * k2_sq, k10_sq}, pos_smoothness, pos_pca: [[x, y]..per position..],
 * orthogonality {max_abs_cos, mean_abs_cos, principal_angles_deg}, topics?
 * {within, between, within_pairs, between_pairs}}], timing_ms}. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/decomposition.h"

typedef struct {
    const api_model *model;
    int T;                   /* window length, 0 until known */
    const char **texts;      /* point into the body or into corpus_data */
    char **corpus_data;      /* [n_texts] file contents when texts come from `corpus` */
    size_t *text_lens;
    int n_texts;
    int *windows;            /* [n_windows][T] when given as ids */
    int n_windows;
    int *labels;             /* [n_texts or n_windows] label index, or NULL */
    char **label_names;      /* distinct labels in order of first appearance */
    int n_label_names;
    api_index_list layers;
    int drop_first, top_k, causal;
} decomp_req;

static void decomp_req_free(void *p)
{
    decomp_req *r = p;
    for (int i = 0; r->corpus_data && i < r->n_texts; i++) free(r->corpus_data[i]);
    free(r->corpus_data);
    free(r->texts);
    free(r->text_lens);
    free(r->windows);
    free(r->labels);
    for (int i = 0; i < r->n_label_names; i++) free(r->label_names[i]);
    free(r->label_names);
    free(r->layers.v);
    free(r);
}

static int token_limit(const api_call *c, const lens_config *cfg)
{
    return c->ctx->max_tokens < cfg->max_positions ? c->ctx->max_tokens : cfg->max_positions;
}

static int decode_texts(api_call *c, decomp_req *r, json_t *v)
{
    if (!json_is_array(v)) return api_fail(c, 422, "invalid_request", "texts", "texts must be an array of strings");
    size_t n = json_array_size(v);
    if (n == 0) return api_fail(c, 422, "invalid_request", "texts", "texts must not be empty");
    if (n > 10000000) return api_fail(c, 422, "invalid_request", "texts", "too many texts");
    r->texts = malloc(n * sizeof *r->texts);
    r->text_lens = malloc(n * sizeof *r->text_lens);
    if (!r->texts || !r->text_lens) return api_fail(c, 500, "internal", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e))
            return api_fail(c, 422, "invalid_request", "texts", "texts[%zu] is not a string", i);
        r->texts[i] = json_string_value(e);
        r->text_lens[i] = json_string_length(e);
        if (memchr(r->texts[i], 0, r->text_lens[i]))
            return api_fail(c, 422, "invalid_request", "texts", "texts[%zu] contains a NUL character", i);
    }
    r->n_texts = (int)n;
    return 0;
}

/* corpus: files inside --data-dir, each one text; unless labels are given,
 * each file is its own topic (label = its path), as the paper's topic
 * corpora are one file per topic. */
#define CORPUS_MAX_FILES 256
#define CORPUS_MAX_BYTES (256L << 20)

static int decode_corpus(api_call *c, decomp_req *r, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return api_fail(c, 422, "invalid_request", "corpus", "corpus must be a non-empty array of file paths");
    size_t n = json_array_size(v);
    if (n > CORPUS_MAX_FILES)
        return api_fail(c, 422, "invalid_request", "corpus", "corpus names %zu files; at most %d", n, CORPUS_MAX_FILES);
    r->texts = calloc(n, sizeof *r->texts);
    r->text_lens = calloc(n, sizeof *r->text_lens);
    r->corpus_data = calloc(n, sizeof *r->corpus_data);
    if (!r->texts || !r->text_lens || !r->corpus_data) return api_fail(c, 500, "internal", NULL, "out of memory");
    long total = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        char path[PATH_MAX];
        if (!json_is_string(e)) return api_fail(c, 422, "invalid_request", "corpus", "corpus[%zu] is not a string", i);
        if (api_resolve_data_path(c, "corpus", json_string_value(e), path)) return -1;
        FILE *f = fopen(path, "rb");
        long size = -1;
        if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
        if (size < 0 || (total += size) > CORPUS_MAX_BYTES) {
            if (f) fclose(f);
            return api_fail(c, 422, "invalid_request", "corpus", "corpus[%zu] cannot be read or the corpus is over %ld MiB",
                            i, CORPUS_MAX_BYTES >> 20);
        }
        rewind(f);
        r->corpus_data[i] = malloc((size_t)size + 1);
        r->n_texts = (int)i + 1; /* owned buffers so far, for decomp_req_free */
        size_t got = r->corpus_data[i] ? fread(r->corpus_data[i], 1, (size_t)size, f) : 0;
        fclose(f);
        if (got != (size_t)size) return api_fail(c, 500, "internal", NULL, "reading corpus[%zu] failed", i);
        r->corpus_data[i][size] = 0;
        r->texts[i] = r->corpus_data[i];
        r->text_lens[i] = (size_t)size;
    }
    if (json_object_get(c->body, "labels")) return 0; /* decode_labels takes them */
    r->labels = malloc(n * sizeof *r->labels);
    r->label_names = calloc(n, sizeof *r->label_names);
    if (!r->labels || !r->label_names) return api_fail(c, 500, "internal", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        r->labels[i] = (int)i;
        r->label_names[i] = strdup(json_string_value(json_array_get(v, i)));
        if (!r->label_names[i]) return api_fail(c, 500, "internal", NULL, "out of memory");
        r->n_label_names++;
    }
    return 0;
}

static int decode_windows(api_call *c, decomp_req *r, json_t *v, int vocab)
{
    if (!json_is_array(v))
        return api_fail(c, 422, "invalid_request", "windows", "windows must be an array of arrays of token ids");
    size_t n = json_array_size(v);
    if (n == 0) return api_fail(c, 422, "invalid_request", "windows", "windows must not be empty");
    json_t *first = json_array_get(v, 0);
    if (!json_is_array(first) || json_array_size(first) == 0)
        return api_fail(c, 422, "invalid_request", "windows", "windows[0] must be a non-empty array of token ids");
    size_t T = json_array_size(first);
    if (r->T && (size_t)r->T != T)
        return api_fail(c, 422, "invalid_request", "windows", "windows[0] has %zu tokens but length is %d", T, r->T);
    int limit = token_limit(c, &r->model->model->cfg);
    if (T > (size_t)limit)
        return api_fail(c, 413, "too_many_tokens", "windows", "windows of %zu tokens; the limit is %d", T, limit);
    if (n > (size_t)(1u << 30) / T) return api_fail(c, 422, "invalid_request", "windows", "too many windows");
    r->T = (int)T;
    r->windows = malloc(n * T * sizeof *r->windows);
    if (!r->windows) return api_fail(c, 500, "internal", NULL, "out of memory");
    for (size_t w = 0; w < n; w++) {
        json_t *row = json_array_get(v, w);
        if (!json_is_array(row) || json_array_size(row) != T)
            return api_fail(c, 422, "invalid_request", "windows", "windows[%zu] is not an array of %zu token ids", w, T);
        for (size_t t = 0; t < T; t++) {
            json_t *e = json_array_get(row, t);
            long long id = json_is_integer(e) ? json_integer_value(e) : -1;
            if (!json_is_integer(e) || id < 0 || id >= vocab)
                return api_fail(c, 422, "invalid_request", "windows",
                                "windows[%zu][%zu] is not a token id in [0, %d)", w, t, vocab);
            r->windows[w * T + t] = (int)id;
        }
    }
    r->n_windows = (int)n;
    return 0;
}

/* labels: one string or integer per text / window -> indices of distinct names */
static int decode_labels(api_call *c, decomp_req *r, size_t want, const char *per)
{
    json_t *v = json_object_get(c->body, "labels");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v))
        return api_fail(c, 422, "invalid_request", "labels", "labels must be an array of strings or integers");
    if (json_array_size(v) != want)
        return api_fail(c, 422, "invalid_request", "labels", "labels has %zu entries; want one per %s (%zu)",
                        json_array_size(v), per, want);
    r->labels = malloc(want * sizeof *r->labels);
    r->label_names = calloc(want, sizeof *r->label_names);
    if (!r->labels || !r->label_names) return api_fail(c, 500, "internal", NULL, "out of memory");
    for (size_t i = 0; i < want; i++) {
        json_t *e = json_array_get(v, i);
        char name[128];
        if (json_is_string(e)) snprintf(name, sizeof name, "%s", json_string_value(e));
        else if (json_is_integer(e)) snprintf(name, sizeof name, "%lld", (long long)json_integer_value(e));
        else return api_fail(c, 422, "invalid_request", "labels", "labels[%zu] is not a string or integer", i);
        int k = 0;
        while (k < r->n_label_names && strcmp(r->label_names[k], name)) k++;
        if (k == r->n_label_names) {
            r->label_names[k] = strdup(name);
            if (!r->label_names[k]) return api_fail(c, 500, "internal", NULL, "out of memory");
            r->n_label_names++;
        }
        r->labels[i] = k;
    }
    return 0;
}

int api_decomposition_prepare(api_call *c)
{
    decomp_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = decomp_req_free;
    if (api_decode_model(c, &r->model)) return -1;
    const lens_config *cfg = &r->model->model->cfg;
    int limit = token_limit(c, cfg);
    r->drop_first = 1;
    r->top_k = 0;
    int has_len = api_get_int(c, "length", 1, 1LL << 40, &r->T);
    if (has_len < 0) return -1;
    if (has_len && r->T > limit)
        return api_fail(c, 413, "too_many_tokens", "length", "length %d is over the limit of %d tokens", r->T, limit);
    if (api_get_bool(c, "drop_first_position", &r->drop_first) < 0 ||
        api_get_int(c, "top_k", 1, 1000, &r->top_k) < 0 || api_get_bool(c, "causal", &r->causal) < 0 ||
        api_decode_index_list(c, "layers", 0, cfg->n_layers, &r->layers))
        return -1;
    json_t *texts = json_object_get(c->body, "texts"), *windows = json_object_get(c->body, "windows");
    json_t *corpus = json_object_get(c->body, "corpus");
    if (json_is_null(texts)) texts = NULL;
    if (json_is_null(windows)) windows = NULL;
    if (json_is_null(corpus)) corpus = NULL;
    if (!!texts + !!windows + !!corpus > 1)
        return api_fail(c, 422, "invalid_request", corpus ? "corpus" : "windows",
                        "give one of texts, windows or corpus");
    if (!texts && !windows && !corpus)
        return api_fail(c, 422, "invalid_request", "texts", "texts, windows or corpus is required");
    if (texts || corpus) {
        if (!has_len)
            return api_fail(c, 422, "invalid_request", "length", "length (the window size T) is required with %s",
                            texts ? "texts" : "corpus");
        if ((texts ? decode_texts(c, r, texts) : decode_corpus(c, r, corpus)) ||
            (!r->labels && decode_labels(c, r, (size_t)r->n_texts, texts ? "text" : "corpus file")))
            return -1;
    } else {
        if (decode_windows(c, r, windows, cfg->vocab_size) || decode_labels(c, r, (size_t)r->n_windows, "window"))
            return -1;
        if (r->n_windows < 2)
            return api_fail(c, 422, "invalid_request", "windows", "at least 2 windows are needed (got %d)", r->n_windows);
    }
    int min_T = r->drop_first ? 3 : 2; /* at least 2 kept positions */
    if (r->T < min_T)
        return api_fail(c, 422, "invalid_request", texts ? "length" : "windows",
                        "windows need at least %d tokens (%s)", min_T,
                        r->drop_first ? "2 positions after dropping the first" : "2 positions");
    api_cost_hint(c, API_COST_DECOMPOSITION);
    return api_decode_async(c, "decomposition");
}

typedef struct {
    api_call *c;
    double base, span; /* fraction range the forward passes cover */
} decomp_progress;

static void on_progress(void *user, long done, long total)
{
    decomp_progress *p = user;
    if (total > 0) api_progress(p->c, p->base + p->span * (double)done / (double)total);
}

static void write_layer(jw *w, const lens_decomp_layer *L, const lens_decomp_result *res)
{
    jw_obj(w);
    jw_key(w, "layer");
    jw_int(w, L->layer);
    jw_key(w, "variance_share");
    jw_obj(w);
    jw_key(w, "mean");
    jw_float(w, L->share_mean, 6);
    jw_key(w, "pos");
    jw_float(w, L->share_pos, 6);
    jw_key(w, "ctx");
    jw_float(w, L->share_ctx, 6);
    jw_key(w, "resid");
    jw_float(w, L->share_resid, 6);
    jw_end(w);
    jw_key(w, "relative_norm");
    jw_obj(w);
    jw_key(w, "pos");
    jw_float(w, L->norm_pos, 6);
    jw_key(w, "ctx");
    jw_float(w, L->norm_ctx, 6);
    jw_key(w, "resid");
    jw_float(w, L->norm_resid, 6);
    jw_end(w);
    jw_key(w, "pos_stable_rank");
    jw_float(w, L->pos_stable_rank, 6);
    jw_key(w, "pos_explained");
    jw_obj(w);
    jw_key(w, "k2");
    jw_float(w, L->pos_explained_k2, 6);
    jw_key(w, "k10");
    jw_float(w, L->pos_explained_k10, 6);
    jw_key(w, "k2_sq");
    jw_float(w, L->pos_explained_k2_sq, 6);
    jw_key(w, "k10_sq");
    jw_float(w, L->pos_explained_k10_sq, 6);
    jw_end(w);
    jw_key(w, "pos_smoothness");
    jw_float(w, L->pos_smoothness, 6);
    jw_key(w, "pos_pca");
    if (L->pos_pca) jw_floats_2d(w, L->pos_pca, (size_t)res->P, 2, 2, 6);
    else jw_null(w);
    jw_key(w, "orthogonality");
    jw_obj(w);
    jw_key(w, "max_abs_cos");
    jw_float(w, L->max_abs_cos, 6);
    jw_key(w, "mean_abs_cos");
    jw_float(w, L->mean_abs_cos, 6);
    jw_key(w, "principal_angles_deg");
    jw_arr(w);
    for (int i = 0; i < L->n_angles; i++) jw_float(w, L->principal_angles_deg[i], 4);
    jw_end(w);
    jw_end(w);
    if (res->has_labels) {
        jw_key(w, "topics");
        jw_obj(w);
        jw_key(w, "within");
        jw_float(w, L->topics_within, 6);
        jw_key(w, "between");
        jw_float(w, L->topics_between, 6);
        jw_key(w, "within_pairs");
        jw_int(w, L->topics_within_pairs);
        jw_key(w, "between_pairs");
        jw_int(w, L->topics_between_pairs);
        jw_end(w);
    }
    jw_end(w);
}

void api_decomposition_run(api_call *c)
{
    decomp_req *r = c->req;
    const lens_model *m = r->model->model;
    double t0 = api_now();
    lens_err err = {0};
    int *ids = r->windows, *labels = r->labels, W = r->n_windows;
    int *own_ids = NULL, *own_labels = NULL;
    api_progress(c, 0);
    if (r->texts) {
        if (lens_decomp_windows_from_texts(m->tok, r->texts, r->text_lens, r->labels, r->n_texts, r->T, &own_ids,
                                           r->labels ? &own_labels : NULL, &W, &err)) {
            api_fail_core(c, &err, "length", "texts", "decomposition");
            return;
        }
        ids = own_ids, labels = own_labels;
        if (W < 2) {
            free(own_ids), free(own_labels);
            api_fail(c, 422, "invalid_request", "texts",
                     "the texts give %d window%s of %d tokens; at least 2 are needed", W, W == 1 ? "" : "s", r->T);
            return;
        }
    }
    c->n_tokens = r->T;
    if (api_cost_check(c, API_COST_DECOMPOSITION, (double)W * api_cost_forward_flops(&m->cfg, r->T, m->cfg.n_layers),
                       r->texts ? "texts" : "windows")) {
        free(own_ids), free(own_labels);
        return;
    }
    double t1 = api_now();
    decomp_progress prog = {.c = c, .base = 0.02, .span = 0.93};
    api_progress(c, prog.base);
    lens_decomp_opts opts = {.keep_first_position = !r->drop_first,
                             .causal = r->causal,
                             .top_k = r->top_k,
                             .cancel = c->cancel,
                             .pool = c->threads,
                             .progress = on_progress,
                             .progress_user = &prog,
                             .windows_total = W};
    lens_decomp_result res;
    memset(&res, 0, sizeof res);
    lens_decomp *acc = lens_decomp_begin(m, r->T, r->layers.v, r->layers.n, &opts, &err);
    int rc = acc ? 0 : -1;
    if (acc) rc = lens_decomp_add(acc, ids, labels, W, &err);
    if (acc && rc == 0) rc = lens_decomp_finish(acc, &res, &err);
    lens_decomp_free(acc);
    free(own_ids), free(own_labels);
    if (rc) {
        api_fail_core(c, &err, "length", NULL, "decomposition");
        return;
    }
    double t2 = api_now();
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "model");
    jw_str(w, r->model->name);
    jw_key(w, "length");
    jw_int(w, res.T);
    jw_key(w, "positions");
    jw_int(w, res.P);
    jw_key(w, "first_position");
    jw_int(w, res.first_position);
    jw_key(w, "windows");
    jw_int(w, res.n_windows);
    jw_key(w, "n_tokens");
    jw_int(w, (long long)res.n_windows * res.T);
    if (r->labels) {
        jw_key(w, "labels");
        jw_arr(w);
        for (int i = 0; i < r->n_label_names; i++) jw_str(w, r->label_names[i]);
        jw_end(w);
    }
    jw_key(w, "layers");
    jw_arr(w);
    for (int i = 0; i < res.n_layers; i++) write_layer(w, &res.layers[i], &res);
    jw_end(w);
    lens_decomp_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
