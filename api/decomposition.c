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
 * default 10), async? = false, definition? = "paper-code" | "lensd",
 * topics_self_pairs? (paper-code true), topics_pca? = 0, screenot_k? = 20,
 * reference_texts | reference_windows | reference_corpus? (a second set of
 * the same T whose pos and mean the metrics use; docs/reproducing.md)}. corpus names files inside --data-dir, each
 * read as one text and, without labels, its own topic. texts are tokenized without special
 * tokens, concatenated and cut into windows of T (the tail is dropped; with
 * labels no window spans two labels). async: true answers 202 with a job of
 * kind "decomposition" (GET /v1/jobs/{id} for progress and the result).
 *
 * Response {model, length, positions, first_position, windows, n_tokens,
 * definition, topics_self_pairs, topics_pca, screenot_k, reference_windows,
 * labels?, layers: [{layer, variance_share {mean, pos, ctx, resid},
 * relative_norm {pos, ctx, resid}, pos_stable_rank, pos_screenot {rank,
 * threshold, explained}, pos_explained {k2, k10,
 * k2_sq, k10_sq}, pos_smoothness, pos_pca: [[x, y]..per position..],
 * ctx_pca {variance_share: [k], window: [W], label?: [W], coords: [[k]..per
 * window..]} (each window's context mean on the top k = 3 principal axes of
 * the context means; label indexes labels), orthogonality {max_abs_cos, mean_abs_cos, principal_angles_deg}, topics?
 * {within, between, within_pairs, between_pairs}}], timing_ms}. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/decomposition.h"

typedef struct decomp_req {
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
    int paper_code;          /* definition "paper-code" (default) or "lensd" */
    int topics_self_pairs, topics_pca, screenot_k;
    struct decomp_req *ref;  /* reference_texts / reference_windows / reference_corpus, or NULL */
    api_format format;       /* without format: 6 decimals (4 for angles), as before format applied here */
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
    if (r->ref) decomp_req_free(r->ref);
    free(r);
}

static int decode_texts(api_call *c, decomp_req *r, json_t *v, const char *field)
{
    if (!json_is_array(v)) return api_fail(c, 422, "invalid_request", field, "%s must be an array of strings", field);
    size_t n = json_array_size(v);
    if (n == 0) return api_fail(c, 422, "invalid_request", field, "%s must not be empty", field);
    if (n > 10000000) return api_fail(c, 422, "invalid_request", field, "too many texts");
    r->texts = malloc(n * sizeof *r->texts);
    r->text_lens = malloc(n * sizeof *r->text_lens);
    if (!r->texts || !r->text_lens) return api_fail(c, 500, "internal", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e))
            return api_fail(c, 422, "invalid_request", field, "%s[%zu] is not a string", field, i);
        r->texts[i] = json_string_value(e);
        r->text_lens[i] = json_string_length(e);
        if (memchr(r->texts[i], 0, r->text_lens[i]))
            return api_fail(c, 422, "invalid_request", field, "%s[%zu] contains a NUL character", field, i);
    }
    r->n_texts = (int)n;
    return 0;
}

/* corpus: files inside --data-dir, each one text; unless labels are given,
 * each file is its own topic (label = its path), as the paper's topic
 * corpora are one file per topic. */
#define CORPUS_MAX_FILES 256
#define CORPUS_MAX_BYTES (256L << 20)

static int decode_corpus(api_call *c, decomp_req *r, json_t *v, const char *field)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return api_fail(c, 422, "invalid_request", field, "%s must be a non-empty array of file paths", field);
    size_t n = json_array_size(v);
    if (n > CORPUS_MAX_FILES)
        return api_fail(c, 422, "invalid_request", field, "%s names %zu files; at most %d", field, n, CORPUS_MAX_FILES);
    r->texts = calloc(n, sizeof *r->texts);
    r->text_lens = calloc(n, sizeof *r->text_lens);
    r->corpus_data = calloc(n, sizeof *r->corpus_data);
    if (!r->texts || !r->text_lens || !r->corpus_data) return api_fail(c, 500, "internal", NULL, "out of memory");
    long total = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        char path[PATH_MAX];
        if (!json_is_string(e)) return api_fail(c, 422, "invalid_request", field, "%s[%zu] is not a string", field, i);
        if (api_resolve_data_path(c, field, json_string_value(e), path)) return -1;
        FILE *f = fopen(path, "rb");
        long size = -1;
        if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
        if (size < 0 || (total += size) > CORPUS_MAX_BYTES) {
            if (f) fclose(f);
            return api_fail(c, 422, "invalid_request", field, "%s[%zu] cannot be read or the corpus is over %ld MiB", field,
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
    /* the main set's labels: decode_labels takes them; a reference set has none, and its
     * files stay separate topics so that no window spans two files */
    if (json_object_get(c->body, "labels") && strcmp(field, "reference_corpus")) return 0;
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

static int decode_windows(api_call *c, decomp_req *r, json_t *v, int vocab, const char *field)
{
    if (!json_is_array(v))
        return api_fail(c, 422, "invalid_request", field, "%s must be an array of arrays of token ids", field);
    size_t n = json_array_size(v);
    if (n == 0) return api_fail(c, 422, "invalid_request", field, "%s must not be empty", field);
    json_t *first = json_array_get(v, 0);
    if (!json_is_array(first) || json_array_size(first) == 0)
        return api_fail(c, 422, "invalid_request", field, "%s[0] must be a non-empty array of token ids", field);
    size_t T = json_array_size(first);
    if (r->T && (size_t)r->T != T)
        return api_fail(c, 422, "invalid_request", field, "%s[0] has %zu tokens but length is %d", field, T, r->T);
    const lens_config *cfg = &r->model->model->cfg;
    int limit = api_token_limit(c, cfg);
    if (T > (size_t)limit)
        return api_fail(c, 413, "too_many_tokens", field, "%s of %zu tokens; the limit is %d (%s)", field, T, limit,
                        api_token_limit_name(c, cfg));
    if (n > (size_t)(1u << 30) / T) return api_fail(c, 422, "invalid_request", field, "too many windows");
    r->T = (int)T;
    r->windows = malloc(n * T * sizeof *r->windows);
    if (!r->windows) return api_fail(c, 500, "internal", NULL, "out of memory");
    for (size_t w = 0; w < n; w++) {
        json_t *row = json_array_get(v, w);
        if (!json_is_array(row) || json_array_size(row) != T)
            return api_fail(c, 422, "invalid_request", field, "%s[%zu] is not an array of %zu token ids", field, w, T);
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
        const char *name = json_string_value(e); /* whole: a cut name could merge two labels */
        char number[24];
        if (json_is_integer(e)) {
            snprintf(number, sizeof number, "%lld", (long long)json_integer_value(e));
            name = number;
        }
        if (!name) return api_fail(c, 422, "invalid_request", "labels", "labels[%zu] is not a string or integer", i);
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

/* One set of windows: {prefix}texts | {prefix}windows | {prefix}corpus (the
 * reference set has prefix "reference_", no labels and the main set's T).
 * Returns 0 when the set is absent and absent is allowed (a reference). */
static int decode_window_set(api_call *c, decomp_req *r, const char *prefix, int has_len)
{
    const lens_config *cfg = &r->model->model->cfg;
    char f_texts[32], f_windows[32], f_corpus[32];
    snprintf(f_texts, sizeof f_texts, "%stexts", prefix);
    snprintf(f_windows, sizeof f_windows, "%swindows", prefix);
    snprintf(f_corpus, sizeof f_corpus, "%scorpus", prefix);
    const int main_set = !*prefix;
    json_t *texts = json_object_get(c->body, f_texts), *windows = json_object_get(c->body, f_windows);
    json_t *corpus = json_object_get(c->body, f_corpus);
    if (json_is_null(texts)) texts = NULL;
    if (json_is_null(windows)) windows = NULL;
    if (json_is_null(corpus)) corpus = NULL;
    if (!!texts + !!windows + !!corpus > 1)
        return api_fail(c, 422, "invalid_request", corpus ? f_corpus : f_windows, "give one of %s, %s or %s", f_texts,
                        f_windows, f_corpus);
    if (!texts && !windows && !corpus)
        return main_set ? api_fail(c, 422, "invalid_request", f_texts, "texts, windows or corpus is required") : 0;
    if (texts || corpus) {
        if (!has_len)
            return api_fail(c, 422, "invalid_request", "length", "length (the window size T) is required with %s",
                            texts ? f_texts : f_corpus);
        if ((texts ? decode_texts(c, r, texts, f_texts) : decode_corpus(c, r, corpus, f_corpus)) ||
            (main_set && !r->labels && decode_labels(c, r, (size_t)r->n_texts, texts ? "text" : "corpus file")))
            return -1;
    } else {
        if (decode_windows(c, r, windows, cfg->vocab_size, f_windows) ||
            (main_set && decode_labels(c, r, (size_t)r->n_windows, "window")))
            return -1;
        if (r->n_windows < 2)
            return api_fail(c, 422, "invalid_request", f_windows, "at least 2 windows are needed (got %d)",
                            r->n_windows);
    }
    int min_T = r->drop_first ? 3 : 2; /* at least 2 kept positions */
    if (r->T < min_T)
        return api_fail(c, 422, "invalid_request", texts ? "length" : f_windows, "windows need at least %d tokens (%s)",
                        min_T, r->drop_first ? "2 positions after dropping the first" : "2 positions");
    return 0;
}

/* definition: "paper-code" (default; the released code of Song & Zhong) or
 * "lensd" sets the defaults of topics_self_pairs; named options override it.
 * Then the reference set, with the main set's T. docs/reproducing.md. */
static int decode_definition(api_call *c, decomp_req *r)
{
    const char *def = NULL;
    int has = api_get_string(c, "definition", &def, NULL);
    if (has < 0) return -1;
    if (has && strcmp(def, "paper-code") && strcmp(def, "lensd"))
        return api_fail(c, 422, "invalid_request", "definition", "definition must be \"paper-code\" or \"lensd\"");
    r->paper_code = !has || !strcmp(def, "paper-code");
    r->topics_self_pairs = r->paper_code, r->topics_pca = 0, r->screenot_k = LENS_DECOMP_SCREENOT_K;
    if (api_get_bool(c, "topics_self_pairs", &r->topics_self_pairs) < 0 ||
        api_get_int(c, "topics_pca", 0, 4096, &r->topics_pca) < 0 ||
        api_get_int(c, "screenot_k", 1, 1000, &r->screenot_k) < 0)
        return -1;
    r->ref = calloc(1, sizeof *r->ref);
    if (!r->ref) return api_fail(c, 500, "internal", NULL, "out of memory");
    r->ref->model = r->model, r->ref->T = r->T, r->ref->drop_first = r->drop_first;
    if (decode_window_set(c, r->ref, "reference_", 1)) return -1;
    if (!r->ref->texts && !r->ref->windows) {
        decomp_req_free(r->ref);
        r->ref = NULL;
    } else if (r->ref->T != r->T)
        return api_fail(c, 422, "invalid_request", "reference_windows",
                        "reference windows have %d tokens; the windows have %d", r->ref->T, r->T);
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
    int limit = api_token_limit(c, cfg);
    r->drop_first = 1;
    r->top_k = 0;
    int has_len = api_get_int(c, "length", 1, 1LL << 40, &r->T);
    if (has_len < 0) return -1;
    if (has_len && r->T > limit)
        return api_fail(c, 413, "too_many_tokens", "length", "length %d is over the limit of %d tokens (%s)", r->T, limit,
                          api_token_limit_name(c, cfg));
    if (api_get_bool(c, "drop_first_position", &r->drop_first) < 0 ||
        api_get_int(c, "top_k", 1, 1000, &r->top_k) < 0 || api_get_bool(c, "causal", &r->causal) < 0 ||
        api_decode_index_list(c, "layers", 0, cfg->n_layers, &r->layers) || api_decode_format(c, &r->format))
        return -1;
    if (decode_window_set(c, r, "", has_len) || decode_definition(c, r)) return -1;
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

/* A [rows][cols] matrix as format asks (a base64 tensor, or arrays with its
 * precision), 6 decimals without a format. */
static void write_floats_2d(jw *w, const float *x, size_t rows, size_t cols, const api_format *f)
{
    if (f->given) api_write_matrix(w, x, rows, cols, f);
    else jw_floats_2d(w, x, rows, cols, cols, 6);
}

/* ctx_pca {variance_share: [k], window: [W], label?: [W] (indices into the
 * response's labels), coords: [[k]..per window..]} */
static void write_ctx_pca(jw *w, const lens_decomp_ctx_pca *p, const api_format *f)
{
    const int prec = f->given ? f->precision : 6;
    jw_obj(w);
    jw_key(w, "variance_share");
    jw_arr(w);
    for (int j = 0; j < p->k; j++) jw_float(w, p->share[j], prec);
    jw_end(w);
    jw_key(w, "window");
    jw_arr(w);
    for (long i = 0; i < p->W; i++) jw_int(w, p->window[i]);
    jw_end(w);
    if (p->label) {
        jw_key(w, "label");
        jw_arr(w);
        for (long i = 0; i < p->W; i++) jw_int(w, p->label[i]);
        jw_end(w);
    }
    jw_key(w, "coords");
    write_floats_2d(w, p->coords, (size_t)p->W, (size_t)p->k, f);
    jw_end(w);
}

static void write_layer(jw *w, const lens_decomp_layer *L, const lens_decomp_ctx_pca *ctx_pca,
                        const lens_decomp_result *res, const api_format *f)
{
    const int prec = f->given ? f->precision : 6;
    jw_obj(w);
    jw_key(w, "layer");
    jw_int(w, L->layer);
    jw_key(w, "variance_share");
    jw_obj(w);
    jw_key(w, "mean");
    jw_float(w, L->share_mean, prec);
    jw_key(w, "pos");
    jw_float(w, L->share_pos, prec);
    jw_key(w, "ctx");
    jw_float(w, L->share_ctx, prec);
    jw_key(w, "resid");
    jw_float(w, L->share_resid, prec);
    jw_end(w);
    jw_key(w, "relative_norm");
    jw_obj(w);
    jw_key(w, "pos");
    jw_float(w, L->norm_pos, prec);
    jw_key(w, "ctx");
    jw_float(w, L->norm_ctx, prec);
    jw_key(w, "resid");
    jw_float(w, L->norm_resid, prec);
    jw_end(w);
    jw_key(w, "pos_stable_rank");
    jw_float(w, L->pos_stable_rank, prec);
    jw_key(w, "pos_screenot");
    jw_obj(w);
    jw_key(w, "rank");
    if (L->pos_screenot_rank < 0) jw_null(w);
    else jw_int(w, L->pos_screenot_rank);
    jw_key(w, "threshold");
    jw_float(w, L->pos_screenot_threshold, prec);
    jw_key(w, "explained");
    jw_float(w, L->pos_explained_screenot, prec);
    jw_end(w);
    jw_key(w, "pos_explained");
    jw_obj(w);
    jw_key(w, "k2");
    jw_float(w, L->pos_explained_k2, prec);
    jw_key(w, "k10");
    jw_float(w, L->pos_explained_k10, prec);
    jw_key(w, "k2_sq");
    jw_float(w, L->pos_explained_k2_sq, prec);
    jw_key(w, "k10_sq");
    jw_float(w, L->pos_explained_k10_sq, prec);
    jw_end(w);
    jw_key(w, "pos_smoothness");
    jw_float(w, L->pos_smoothness, prec);
    jw_key(w, "pos_pca");
    if (L->pos_pca) write_floats_2d(w, L->pos_pca, (size_t)res->P, 2, f);
    else jw_null(w);
    jw_key(w, "ctx_pca");
    write_ctx_pca(w, ctx_pca, f);
    jw_key(w, "orthogonality");
    jw_obj(w);
    jw_key(w, "max_abs_cos");
    jw_float(w, L->max_abs_cos, prec);
    jw_key(w, "mean_abs_cos");
    jw_float(w, L->mean_abs_cos, prec);
    jw_key(w, "principal_angles_deg");
    jw_arr(w);
    for (int i = 0; i < L->n_angles; i++) jw_float(w, L->principal_angles_deg[i], f->given ? f->precision : 4);
    jw_end(w);
    jw_end(w);
    if (res->has_labels) {
        jw_key(w, "topics");
        jw_obj(w);
        jw_key(w, "within");
        jw_float(w, L->topics_within, prec);
        jw_key(w, "between");
        jw_float(w, L->topics_between, prec);
        jw_key(w, "within_pairs");
        jw_int(w, L->topics_within_pairs);
        jw_key(w, "between_pairs");
        jw_int(w, L->topics_between_pairs);
        jw_end(w);
    }
    jw_end(w);
}

/* The windows of a set (cut from its texts, or as given) into *ids / *labels
 * (*own_* to free); 0, or -1 with the error answered. */
static int set_windows(api_call *c, const decomp_req *r, const char *field, int **ids, int **labels, int *W,
                       int **own_ids, int **own_labels)
{
    lens_err err = {0};
    *ids = r->windows, *labels = r->labels, *W = r->n_windows, *own_ids = *own_labels = NULL;
    if (!r->texts) return 0;
    if (lens_decomp_windows_from_texts(r->model->model->tok, r->texts, r->text_lens, r->labels, r->n_texts, r->T,
                                       own_ids, r->labels ? own_labels : NULL, W, &err))
        return api_fail_core(c, &err, "length", field, "decomposition");
    *ids = *own_ids, *labels = *own_labels;
    if (*W < 2) {
        free(*own_ids), free(*own_labels);
        *own_ids = *own_labels = NULL;
        return api_fail(c, 422, "invalid_request", field, "the %s give %d window%s of %d tokens; at least 2 are needed",
                        field, *W, *W == 1 ? "" : "s", r->T);
    }
    return 0;
}

static lens_decomp *begin_set(api_call *c, const decomp_req *r, const lens_decomp_result *reference,
                              decomp_progress *prog, int index, int count, int W, lens_err *err)
{
    lens_decomp_opts opts = {.keep_first_position = !r->drop_first,
                             .causal = r->causal,
                             .top_k = r->top_k,
                             .cancel = c->cancel,
                             .pool = c->threads,
                             .progress = on_progress,
                             .progress_user = prog,
                             .windows_total = W,
                             .topics_self_pairs = r->topics_self_pairs,
                             .topics_pca = r->topics_pca,
                             .screenot_k = r->screenot_k,
                             .reference = reference,
                             .shard_index = index,
                             .shard_count = count};
    return lens_decomp_begin(r->model->model, r->T, r->layers.v, r->layers.n, &opts, err);
}

/* Shard index of count of one window set: its accumulators, names prefixed
 * by prefix. *W gets the set's window count. */
static int shard_set(api_call *c, const decomp_req *r, const char *field, const char *prefix,
                     decomp_progress *prog, int index, int count, lens_partial *part, int *W)
{
    int *ids, *labels, *own_ids, *own_labels;
    if (set_windows(c, r, field, &ids, &labels, W, &own_ids, &own_labels)) return -1;
    const lens_config *cfg = &r->model->model->cfg;
    if (api_cost_check(c, API_COST_DECOMPOSITION, (double)*W * api_cost_forward_flops(cfg, r->T, cfg->n_layers),
                       r->texts ? field : *prefix ? "reference_windows" : "windows")) {
        free(own_ids), free(own_labels);
        return -1;
    }
    lens_err err = {0};
    lens_decomp *acc = begin_set(c, r, NULL, prog, index, count, *W, &err);
    int rc = acc ? lens_decomp_add(acc, ids, labels, *W, &err) : -1;
    if (rc == 0) rc = lens_decomp_export(acc, part, prefix, &err);
    lens_decomp_free(acc);
    free(own_ids), free(own_labels);
    if (rc) return api_fail_core(c, &err, "length", NULL, "decomposition");
    return 0;
}

/* The decomposition of one window set from every shard's accumulators, and
 * when ctx_pca is not NULL its context means on their top CTX_PCA_K axes. */
#define CTX_PCA_K 3
static int merge_set(api_call *c, const decomp_req *r, const char *field, const char *prefix,
                     const lens_decomp_result *reference, lens_partial *const *parts, int n_parts,
                     lens_decomp_result *res, lens_decomp_ctx_pca **ctx_pca, int *W)
{
    int *ids, *labels, *own_ids, *own_labels;
    memset(res, 0, sizeof *res);
    if (set_windows(c, r, field, &ids, &labels, W, &own_ids, &own_labels)) return -1;
    free(own_ids), free(own_labels);
    lens_err err = {0};
    decomp_progress prog = {.c = c, .base = 0.95, .span = 0};
    lens_decomp *acc = begin_set(c, r, reference, &prog, 0, 1, *W, &err);
    int rc = acc ? 0 : -1;
    for (int i = 0; i < n_parts && !rc; i++) rc = lens_decomp_import(acc, parts[i], prefix, *W, &err);
    if (rc == 0) rc = lens_decomp_complete(acc, &err);
    if (rc == 0) rc = lens_decomp_finish(acc, res, &err);
    if (rc == 0 && ctx_pca && !(*ctx_pca = lens_decomp_ctx_pca_compute(acc, CTX_PCA_K, &err))) {
        lens_decomp_result_free(res);
        rc = -1;
    }
    lens_decomp_free(acc);
    if (rc && err.code == LENS_EFORMAT) return api_fail(c, 422, "partial_mismatch", "parts", "%s", err.msg);
    if (rc) return api_fail_core(c, &err, "length", NULL, "decomposition");
    return 0;
}

/* Shard index of count: the reference set's accumulators ("ref." tensors),
 * then the windows'. */
int api_decomposition_shard(api_call *c, int index, int count, lens_partial *part)
{
    decomp_req *r = c->req;
    api_progress(c, 0);
    int W = 0, ref_W = 0;
    decomp_progress prog = {.c = c, .base = 0.02, .span = r->ref ? 0.45 : 0};
    if (r->ref && shard_set(c, r->ref, "reference_texts", "ref.", &prog, index, count, part, &ref_W)) return -1;
    prog.base += prog.span, prog.span = 0.93 - prog.span;
    if (shard_set(c, r, "texts", "", &prog, index, count, part, &W)) return -1;
    c->n_tokens = r->T;
    if (api_shard_rows(part, W, lens_partial_find(part, "windows")->length))
        return api_fail(c, 500, "internal", NULL, "out of memory");
    return 0;
}

void api_decomposition_merge(api_call *c, lens_partial *const *parts, int n_parts)
{
    decomp_req *r = c->req;
    double t0 = api_now(), t1 = t0;
    int W = 0, ref_W = 0;
    lens_decomp_result res, ref_res;
    memset(&ref_res, 0, sizeof ref_res);
    lens_decomp_ctx_pca *ctx_pca = NULL;
    int rc = r->ref ? merge_set(c, r->ref, "reference_texts", "ref.", NULL, parts, n_parts, &ref_res, NULL, &ref_W)
                    : 0;
    if (rc == 0) rc = merge_set(c, r, "texts", "", r->ref ? &ref_res : NULL, parts, n_parts, &res, &ctx_pca, &W);
    lens_decomp_result_free(&ref_res);
    if (rc) return;
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
    jw_key(w, "definition");
    jw_str(w, r->paper_code ? "paper-code" : "lensd");
    jw_key(w, "topics_self_pairs");
    jw_bool(w, r->topics_self_pairs);
    jw_key(w, "topics_pca");
    jw_int(w, r->topics_pca);
    jw_key(w, "screenot_k");
    jw_int(w, r->screenot_k);
    jw_key(w, "reference_windows");
    if (r->ref) jw_int(w, ref_W);
    else jw_null(w);
    if (r->labels) {
        jw_key(w, "labels");
        jw_arr(w);
        for (int i = 0; i < r->n_label_names; i++) jw_str(w, r->label_names[i]);
        jw_end(w);
    }
    jw_key(w, "layers");
    jw_arr(w);
    for (int i = 0; i < res.n_layers; i++) write_layer(w, &res.layers[i], &ctx_pca[i], &res, &r->format);
    jw_end(w);
    lens_decomp_ctx_pca_free(ctx_pca, res.n_layers);
    lens_decomp_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

void api_decomposition_run(api_call *c) { api_shard_run_whole(c, api_job_kind_find("decomposition")); }
