/* token_identity.c - POST /v1/token-identity, job kind "token-identity-map",
 * `lensd token-identity` and `lensd token-identity-map`.
 *
 * Token identifiability (Brunner et al. 2020) via core/analysis/token_identity.h
 * (math in docs/token-identity.md).
 *
 * POST /v1/token-identity {model?, text | input_ids, text_pair?, layers?
 * (0..L, default all), metric? = "cosine" | "l2", top_k? = 5 (0..100),
 * mapping? = "identity" | "linear", vocabulary? = false} ->
 * {model, tokens, metric, mapping, maps? (linear: how they were fitted),
 * layers: [{layer, rate, rate_excluding_special, ranks [T], neighbors
 * [T][top_k] (token indices), vocabulary?: {rate, ranks [T], neighbors
 * [T][top_k] (token ids)}}], timing_ms}. mapping "linear" needs maps: fitted
 * by the job below, or loaded at start from the checkpoint folder's
 * LENS_TI_MAPS_FILE.
 *
 * Job "token-identity-map" params {model?, texts?: [..] | data?: "PATH"
 * (inside --data-dir: a TSV whose header names a "sentence" or "text"
 * column, or plain lines), max_texts? = 2000, heldout_fraction? = 0.2 (the
 * last texts are held out), ridge? = LENS_TI_DEFAULT_RIDGE, metric?, save? =
 * false} -> {model, ridge, metric, train_texts, heldout_texts, train_tokens,
 * heldout_tokens, layers: [{layer, train_rate, heldout_rate,
 * identity_heldout_rate}], installed, saved (path or null), save_error?}.
 * The fitted maps replace the model's current ones for every later request;
 * with save they are also written next to the checkpoint. Texts longer than
 * the token limit keep their first tokens (and BERT's final [SEP]).
 * A sharded kind (api/shard.c): shard I of N adds up the normal equations
 * of the training texts r % N == I; the merge solves the maps and measures
 * the rates over every text (lens_ti_fit's stages, split where they add). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/token_identity.h"

#define MAX_TOP_K 100
#define DEFAULT_MAX_TEXTS 2000
#define MAX_TEXTS 1000000

/* ----------------------------------------------- the model's learned maps */

/* Learned maps are the only mutable part of a resident model: a job may
 * install new ones while requests use the old. Each holder counts a
 * reference; the last release frees. One lock for all models: it is held
 * only to swap or count. */
struct api_ti_maps {
    lens_ti_maps maps;
    int refs;
};

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;

api_ti_maps *api_maps_acquire(const api_model *m)
{
    pthread_mutex_lock(&maps_lock);
    api_ti_maps *p = m->ti_maps;
    if (p) p->refs++;
    pthread_mutex_unlock(&maps_lock);
    return p;
}

void api_maps_release(api_ti_maps *p)
{
    if (!p) return;
    pthread_mutex_lock(&maps_lock);
    int last = --p->refs == 0;
    pthread_mutex_unlock(&maps_lock);
    if (last) {
        lens_ti_maps_free(&p->maps);
        free(p);
    }
}

/* Takes over maps (moved into the store) as m's current maps. */
static int maps_install(const api_model *m, lens_ti_maps *maps)
{
    api_ti_maps *p = calloc(1, sizeof *p);
    if (!p) return -1;
    p->maps = *maps;
    memset(maps, 0, sizeof *maps);
    p->refs = 1;
    pthread_mutex_lock(&maps_lock);
    api_ti_maps *old = m->ti_maps;
    ((api_model *)m)->ti_maps = p; /* the one field of a resident model that changes, under the lock */
    pthread_mutex_unlock(&maps_lock);
    api_maps_release(old);
    return 0;
}

int api_model_load_maps(api_model *m, lens_err *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", m->model->dir, LENS_TI_MAPS_FILE);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fclose(f);
    lens_ti_maps maps;
    if (lens_ti_maps_load(path, m->model, &maps, err)) return -1;
    if (maps_install(m, &maps)) {
        lens_ti_maps_free(&maps);
        return lens_fail(err, LENS_ENOMEM, "out of memory");
    }
    return 1;
}

void api_model_drop_maps(api_model *m)
{
    api_maps_release(m->ti_maps);
    m->ti_maps = NULL;
}

static int decode_metric(api_call *c, lens_ti_metric *metric)
{
    const char *s = NULL;
    int has = api_get_string(c, "metric", &s, NULL);
    if (has < 0) return -1;
    *metric = LENS_TI_COSINE;
    if (has && !strcmp(s, "l2")) *metric = LENS_TI_L2;
    else if (has && strcmp(s, "cosine"))
        return api_fail(c, 422, "invalid_request", "metric", "metric must be \"cosine\" or \"l2\"");
    return 0;
}

static const char *metric_name(lens_ti_metric metric) { return metric == LENS_TI_L2 ? "l2" : "cosine"; }

/* ------------------------------------------------------ POST /v1/token-identity */

typedef struct {
    api_input in;
    api_index_list layers;
    lens_ti_metric metric;
    int top_k, linear, vocabulary;
    api_ti_maps *maps; /* held from prepare to the end of run */
    api_format format; /* rates: 6 decimals without one, as before format applied here */
} ti_req;

static void ti_req_free(void *p)
{
    ti_req *r = p;
    api_input_free(&r->in);
    free(r->layers.v);
    api_maps_release(r->maps);
    free(r);
}

int api_token_identity_prepare(api_call *c)
{
    ti_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = ti_req_free;
    const api_model *m;
    if (api_decode_model(c, &m) || api_decode_input(c, m, &r->in)) return -1;
    r->top_k = 5;
    api_cost_hint(c, API_COST_TOKEN_IDENTITY);
    if (api_decode_index_list(c, "layers", 0, m->model->cfg.n_layers, &r->layers) || decode_metric(c, &r->metric) ||
        api_get_int(c, "top_k", 0, MAX_TOP_K, &r->top_k) < 0 || api_get_bool(c, "vocabulary", &r->vocabulary) < 0 ||
        api_decode_format(c, &r->format))
        return -1;
    const char *mapping = NULL;
    int has = api_get_string(c, "mapping", &mapping, NULL);
    if (has < 0) return -1;
    if (has && strcmp(mapping, "identity") && strcmp(mapping, "linear"))
        return api_fail(c, 422, "invalid_request", "mapping", "mapping must be \"identity\" or \"linear\"");
    r->linear = has && !strcmp(mapping, "linear");
    if (r->linear && !(r->maps = api_maps_acquire(m)))
        return api_fail(c, 422, "invalid_request", "mapping",
                        "model \"%s\" has no learned maps: fit them with the job \"token-identity-map\" first",
                        m->name);
    return 0;
}

static void write_rate(jw *w, const char *key, double v, int precision)
{
    jw_key(w, key);
    jw_float(w, v, precision); /* NaN -> null */
}

static void write_neighbors(jw *w, const int *nb, int T, int k)
{
    jw_arr(w);
    for (int i = 0; i < T; i++) jw_ints(w, nb + (size_t)i * k, (size_t)k);
    jw_end(w);
}

static void write_maps_info(jw *w, const lens_ti_maps *maps)
{
    jw_key(w, "maps");
    jw_obj(w);
    jw_key(w, "ridge");
    jw_float(w, maps->ridge, 9);
    jw_key(w, "metric");
    jw_str(w, metric_name(maps->metric));
    jw_key(w, "train_tokens");
    jw_int(w, maps->train_tokens);
    jw_key(w, "heldout_tokens");
    jw_int(w, maps->heldout_tokens);
    jw_end(w);
}

void api_token_identity_run(api_call *c)
{
    ti_req *r = c->req;
    const lens_model *m = r->in.model->model;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    const int T = seq.T;
    /* the forward pass, then per layer T x T (and with vocabulary T x V) distances of C-vectors */
    const double per_layer = 2.0 * T * m->cfg.d_model * (T + (r->vocabulary ? m->cfg.vocab_size : 0));
    if (api_cost_check(c, API_COST_TOKEN_IDENTITY,
                       api_cost_forward_flops(&m->cfg, T, m->cfg.n_layers) + per_layer * r->layers.n, "text")) {
        api_seq_free(&seq);
        return;
    }
    double t1 = api_now();
    lens_ti_opts opts = {
        .metric = r->metric,
        .top_k = r->top_k,
        .layers = r->layers.v,
        .n_layers = r->layers.n,
        .maps = r->maps ? &r->maps->maps : NULL,
        .vocabulary = r->vocabulary,
        .pool = c->threads,
        .cancel = c->cancel,
    };
    lens_ti_result res;
    lens_err err = {0};
    int rc = lens_token_identity(m, seq.ids, seq.types, seq.special, T, &opts, &res, &err);
    if (rc) {
        api_seq_free(&seq);
        api_fail_core(c, &err, "text", "layers", "token identity");
        return;
    }
    double t2 = api_now();

    jw *w = &c->out;
    const int prec = r->format.given ? r->format.precision : 6;
    api_write_head(w, &r->in, &seq);
    api_seq_free(&seq);
    jw_key(w, "metric");
    jw_str(w, metric_name(r->metric));
    jw_key(w, "mapping");
    jw_str(w, r->linear ? "linear" : "identity");
    if (r->maps) write_maps_info(w, &r->maps->maps);
    jw_key(w, "top_k");
    jw_int(w, res.top_k);
    jw_key(w, "layers");
    jw_arr(w);
    for (int k = 0; k < res.n_layers; k++) {
        const lens_ti_layer *y = &res.layers[k];
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, y->layer);
        write_rate(w, "rate", y->rate, prec);
        write_rate(w, "rate_excluding_special", y->rate_excluding_special, prec);
        jw_key(w, "ranks");
        jw_ints(w, y->rank, (size_t)T);
        jw_key(w, "neighbors");
        write_neighbors(w, y->neighbors, T, res.top_k);
        if (y->vocab_rank) {
            jw_key(w, "vocabulary");
            jw_obj(w);
            write_rate(w, "rate", y->vocab_rate, prec);
            jw_key(w, "ranks");
            jw_ints(w, y->vocab_rank, (size_t)T);
            jw_key(w, "neighbors");
            write_neighbors(w, y->vocab_neighbors, T, res.top_k);
            jw_end(w);
        }
        jw_end(w);
    }
    jw_end(w);
    lens_ti_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

/* ------------------------------------------------ job "token-identity-map" */

typedef struct {
    const api_model *model;
    api_texts texts;
    int n; /* texts.n */
    int n_heldout;
    double ridge;
    lens_ti_metric metric;
    int save;
} map_req;

static void map_req_free(void *p)
{
    map_req *r = p;
    api_texts_free(&r->texts);
    free(r);
}

int api_token_identity_map_prepare(api_call *c)
{
    map_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = map_req_free;
    if (api_decode_model(c, &r->model)) return -1;
    int max_texts = DEFAULT_MAX_TEXTS;
    r->ridge = LENS_TI_DEFAULT_RIDGE;
    if (api_get_int(c, "max_texts", 2, MAX_TEXTS, &max_texts) < 0 || decode_metric(c, &r->metric) ||
        api_get_bool(c, "save", &r->save) < 0)
        return -1;
    json_t *ridge = json_object_get(c->body, "ridge");
    if (ridge && !json_is_null(ridge)) {
        if (!json_is_number(ridge) || !(json_number_value(ridge) > 0) || json_number_value(ridge) > 1e3)
            return api_fail(c, 422, "invalid_request", "ridge", "ridge must be a number in (0, 1000]");
        r->ridge = json_number_value(ridge);
    }
    double heldout = 0.2;
    json_t *h = json_object_get(c->body, "heldout_fraction");
    if (h && !json_is_null(h)) {
        if (!json_is_number(h) || json_number_value(h) < 0 || json_number_value(h) >= 1)
            return api_fail(c, 422, "invalid_request", "heldout_fraction", "heldout_fraction must be in [0, 1)");
        heldout = json_number_value(h);
    }
    if (api_decode_texts(c, max_texts, &r->texts)) return -1;
    r->n = r->texts.n;
    r->n_heldout = (int)(heldout * r->n);
    if (r->n - r->n_heldout < 2)
        return api_fail(c, 422, "invalid_request", r->texts.field,
                        "the maps need at least 2 training texts (got %d after holding out %d)", r->n - r->n_heldout,
                        r->n_heldout);
    return 0;
}

/* A stage's own progress fraction as [base, base + span] of the job's: a
 * server job runs the shard (first half) then the merge (second half). */
typedef struct {
    api_call *c;
    double base, span;
} phase;

static void phase_progress(void *user, double fraction)
{
    const phase *p = user;
    api_progress(p->c, p->base + p->span * fraction);
}

/* Rows [r0, r1) with r % count == index of the packed batch (ids, lengths)
 * as a new packed batch (owned ids and lengths). */
static int pick_rows(api_call *c, const int *ids, const int *lengths, int r0, int r1, int index, int count,
                     lens_batch *out)
{
    size_t n_ids = 0, tok0 = 0;
    for (int r = 0; r < r1; r++) n_ids += r >= r0 && r % count == index ? (size_t)lengths[r] : 0;
    int *pick_ids = malloc(sizeof *pick_ids * (n_ids + 1)), *pick_len = malloc(sizeof *pick_len * (size_t)(r1 - r0 + 1));
    if (!pick_ids || !pick_len) {
        free(pick_ids), free(pick_len);
        return api_fail(c, 500, "internal", NULL, "out of memory");
    }
    *out = (lens_batch){.ids = pick_ids, .lengths = pick_len};
    n_ids = 0;
    for (int r = 0; r < r1; tok0 += (size_t)lengths[r++]) {
        if (r < r0 || r % count != index) continue;
        memcpy(pick_ids + n_ids, ids + tok0, sizeof *ids * (size_t)lengths[r]);
        n_ids += (size_t)lengths[r];
        pick_len[out->n_seqs++] = lengths[r];
    }
    return 0;
}

static void batch_free(lens_batch *b) { free((void *)b->ids), free((void *)b->lengths); }

static long batch_tokens(const lens_batch *b)
{
    long n = 0;
    for (int s = 0; s < b->n_seqs; s++) n += b->lengths[s];
    return n;
}

static lens_ti_fit_opts fit_opts(api_call *c, const map_req *r, phase *ph)
{
    return (lens_ti_fit_opts){.ridge = r->ridge, .metric = r->metric, .pool = c->threads, .cancel = c->cancel,
                              .progress = phase_progress, .progress_user = ph};
}

/* Partial: the normal equations of the shard's training rows "G" f64
 * [L+1][C+1][C+1] and "XY" f64 [L+1][C+1][C]; the held-out tokens of its
 * held-out rows identified without a map "identity_heldout_hits" i64
 * [L+1]; its "tokens" i64 [2] (training, held-out). */
int api_token_identity_map_shard(api_call *c, int index, int count, lens_partial *part)
{
    map_req *r = c->req;
    const lens_model *m = r->model->model;
    const int NL = m->cfg.n_layers + 1, C = m->cfg.d_model, CA = C + 1, n_train = r->n - r->n_heldout;
    int *ids = NULL, *lengths = NULL;
    if (api_tokenize_texts(c, m, &r->texts, &ids, &lengths)) return -1;
    lens_batch train = {0}, heldout = {0};
    int rc = pick_rows(c, ids, lengths, 0, n_train, index, count, &train) ||
             pick_rows(c, ids, lengths, n_train, r->n, index, count, &heldout);
    free(ids), free(lengths);
    double *G = calloc((size_t)NL * CA * CA, sizeof *G), *XY = calloc((size_t)NL * CA * C, sizeof *XY);
    int64_t *hits = calloc((size_t)NL, sizeof *hits), tokens[2] = {batch_tokens(&train), batch_tokens(&heldout)};
    long *hits_l = calloc((size_t)NL, sizeof *hits_l);
    if (!rc && (!G || !XY || !hits || !hits_l)) rc = api_fail(c, 500, "internal", NULL, "out of memory");
    const double share = tokens[0] + tokens[1] > 0 ? 0.5 * tokens[0] / (tokens[0] + tokens[1]) : 0.5;
    phase ph = {c, 0, share};
    const lens_ti_fit_opts opts = fit_opts(c, r, &ph);
    lens_err err = {0};
    int failed = !rc && lens_ti_accumulate(m, &train, &opts, G, XY, &err);
    ph = (phase){c, share, 0.5 - share};
    failed = failed || (!rc && lens_ti_count(m, &heldout, NULL, &opts, NULL, hits_l, &err));
    if (failed) rc = api_fail_core(c, &err, "texts", NULL, "accumulating the token identity maps");
    for (int l = 0; !rc && l < NL; l++) hits[l] = hits_l[l];
    if (!rc && (lens_partial_add(part, "G", LENS_PT_F64, (int64_t)NL * CA * CA, G, &err) ||
                lens_partial_add(part, "XY", LENS_PT_F64, (int64_t)NL * CA * C, XY, &err) ||
                lens_partial_add(part, "identity_heldout_hits", LENS_PT_I64, NL, hits, &err) ||
                lens_partial_add(part, "tokens", LENS_PT_I64, 2, tokens, &err)))
        rc = api_fail(c, 500, "internal", NULL, "%s", err.msg);
    if (!rc && api_shard_rows(part, r->n, train.n_seqs + heldout.n_seqs))
        rc = api_fail(c, 500, "internal", NULL, "out of memory");
    batch_free(&train), batch_free(&heldout);
    free(G), free(XY), free(hits), free(hits_l);
    return rc ? -1 : 0;
}

/* Sums the parts' normal equations, counts and identity hits (shard order) into G, XY, tokens, hits. */
static int sum_parts(api_call *c, const lens_model *m, lens_partial *const *parts, int n, double *G, double *XY,
                     int64_t tokens[2], long *hits)
{
    const int NL = m->cfg.n_layers + 1, C = m->cfg.d_model, CA = C + 1;
    const size_t nG = (size_t)NL * CA * CA, nXY = (size_t)NL * CA * C;
    for (int i = 0; i < n; i++) {
        lens_err err = {0};
        const double *g = lens_partial_get(parts[i], "G", LENS_PT_F64, (int64_t)nG, &err);
        const double *xy = g ? lens_partial_get(parts[i], "XY", LENS_PT_F64, (int64_t)nXY, &err) : NULL;
        const int64_t *h = xy ? lens_partial_get(parts[i], "identity_heldout_hits", LENS_PT_I64, NL, &err) : NULL;
        const int64_t *t = h ? lens_partial_get(parts[i], "tokens", LENS_PT_I64, 2, &err) : NULL;
        if (!t) return api_fail(c, 422, "partial_mismatch", "parts", "part %d: %s", i, err.msg);
        for (size_t e = 0; e < nG; e++) G[e] += g[e];
        for (size_t e = 0; e < nXY; e++) XY[e] += xy[e];
        for (int l = 0; l < NL; l++) hits[l] += (long)h[l];
        tokens[0] += t[0], tokens[1] += t[1];
    }
    return 0;
}

/* The maps from the summed normal equations, then the rates with them:
 * forward passes over every text (the merge's cost: about half the job). */
static int merge_maps(api_call *c, map_req *r, lens_partial *const *parts, int n, lens_ti_maps *maps)
{
    const lens_model *m = r->model->model;
    const int NL = m->cfg.n_layers + 1, C = m->cfg.d_model, CA = C + 1, n_train = r->n - r->n_heldout;
    double *G = calloc((size_t)NL * CA * CA, sizeof *G), *XY = calloc((size_t)NL * CA * C, sizeof *XY);
    long *hits = calloc((size_t)NL * 3, sizeof *hits); /* train, held-out mapped, held-out identity */
    int64_t tokens[2] = {0, 0};
    int *ids = NULL, *lengths = NULL;
    memset(maps, 0, sizeof *maps);
    int rc = G && XY && hits ? 0 : api_fail(c, 500, "internal", NULL, "out of memory");
    if (!rc) rc = sum_parts(c, m, parts, n, G, XY, tokens, hits + 2 * NL);
    if (!rc && tokens[0] < 2)
        rc = api_fail(c, 422, "invalid_request", "texts", "fitting the maps needs at least 2 training tokens (got %lld)",
                      (long long)tokens[0]);
    const double share = tokens[0] + tokens[1] > 0 ? 0.5 * (double)tokens[0] / (double)(tokens[0] + tokens[1]) : 0.5;
    phase ph = {c, 0.5, share};
    const lens_ti_fit_opts opts = fit_opts(c, r, &ph);
    lens_err err = {0};
    if (!rc && lens_ti_solve(m, G, XY, &opts, maps, &err))
        rc = api_fail_core(c, &err, "texts", NULL, "fitting the token identity maps");
    free(G), free(XY);
    if (!rc && (rc = api_tokenize_texts(c, m, &r->texts, &ids, &lengths)) == 0) {
        long train_tokens = 0;
        for (int i = 0; i < n_train; i++) train_tokens += lengths[i];
        const lens_batch train = {.n_seqs = n_train, .lengths = lengths, .ids = ids};
        const lens_batch heldout = {.n_seqs = r->n_heldout, .lengths = lengths + n_train, .ids = ids + train_tokens};
        maps->train_tokens = (long)tokens[0], maps->heldout_tokens = (long)tokens[1];
        if (train_tokens != tokens[0] || batch_tokens(&heldout) != tokens[1])
            rc = api_fail(c, 422, "partial_mismatch", "parts", "the partials hold %lld + %lld tokens, the texts %ld + %ld",
                          (long long)tokens[0], (long long)tokens[1], train_tokens, batch_tokens(&heldout));
        int failed = !rc && lens_ti_count(m, &train, maps, &opts, hits, NULL, &err);
        ph = (phase){c, 0.5 + share, 0.5 - share};
        failed = failed || (!rc && lens_ti_count(m, &heldout, maps, &opts, hits + NL, NULL, &err));
        if (failed) rc = api_fail_core(c, &err, "texts", NULL, "measuring the token identity rates");
        if (!rc) lens_ti_set_rates(maps, hits, hits + NL, hits + 2 * NL);
    }
    free(ids), free(lengths), free(hits);
    if (rc) lens_ti_maps_free(maps);
    return rc ? -1 : 0;
}

void api_token_identity_map_merge(api_call *c, lens_partial *const *parts, int n)
{
    map_req *r = c->req;
    const lens_model *m = r->model->model;
    double t0 = api_now();
    lens_ti_maps maps;
    if (merge_maps(c, r, parts, n, &maps)) return;
    double t2 = api_now();
    char path[PATH_MAX] = "";
    lens_err save_err = {0};
    int saved = 0;
    if (r->save) {
        snprintf(path, sizeof path, "%s/%s", m->dir, LENS_TI_MAPS_FILE);
        saved = lens_ti_maps_save(&maps, path, &save_err) == 0;
    }
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "model");
    jw_str(w, r->model->name);
    jw_key(w, "ridge");
    jw_float(w, maps.ridge, 9);
    jw_key(w, "metric");
    jw_str(w, metric_name(maps.metric));
    jw_key(w, "train_texts");
    jw_int(w, r->n - r->n_heldout);
    jw_key(w, "heldout_texts");
    jw_int(w, r->n_heldout);
    jw_key(w, "train_tokens");
    jw_int(w, maps.train_tokens);
    jw_key(w, "heldout_tokens");
    jw_int(w, maps.heldout_tokens);
    jw_key(w, "layers");
    jw_arr(w);
    for (int l = 0; l < maps.n_layers; l++) {
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, l);
        write_rate(w, "train_rate", maps.train_rate[l], 6);
        write_rate(w, "heldout_rate", maps.heldout_rate[l], 6);
        write_rate(w, "identity_heldout_rate", maps.identity_heldout_rate[l], 6);
        jw_end(w);
    }
    jw_end(w);
    int installed = maps_install(r->model, &maps) == 0;
    if (!installed) lens_ti_maps_free(&maps);
    jw_key(w, "installed");
    jw_bool(w, installed);
    jw_key(w, "saved");
    jw_str(w, saved ? path : NULL);
    if (r->save && !saved) {
        jw_key(w, "save_error");
        jw_str(w, save_err.msg);
    }
    api_write_timing(c, 0, t2 - t0, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

void api_token_identity_map_run(api_call *c) { api_shard_run_whole(c, api_job_kind_find("token-identity-map")); }
