/* request.c - shared request decoding, the error body, and shared response parts.
 *
 * Owns: api_call lifetime, api_fail (the one place the error JSON shape is
 * written), body parsing, and the decoders of fields that many endpoints
 * accept (model, text/text_pair/input_ids, index lists, format). Validation
 * is strict about types of known fields (422 naming the field), and an
 * unknown top-level field is a 422 naming it too (api_check_fields): a typo
 * such as "output" for "outputs" must not silently answer with defaults. */
#include "api/request.h"
#include "core/model/arch.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double api_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void api_call_init(api_call *c, const api_ctx *ctx, double t_start)
{
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->t_start = t_start;
    c->status = 200;
    c->content_type = "application/json";
    c->item = -1;
    c->principal = -1;
    jw_init(&c->out);
}

void api_call_free(api_call *c)
{
    if (c->req && c->free_req) c->free_req(c->req);
    c->req = NULL;
    if (c->body) json_decref(c->body);
    c->body = NULL;
    jw_free(&c->out);
    if (c->stream_free) c->stream_free(c->stream_user); /* a stream the server never took */
    c->stream_read = NULL, c->stream_free = NULL;
    api_model_release(c->ctx, c->model_ref); /* after the request, which may point into the model */
    c->model_ref = NULL;
}

int api_fail(api_call *c, int status, const char *code, const char *field, const char *fmt, ...)
{
    /* msg and field may quote client bytes cut inside a UTF-8 sequence (a
     * jansson "near" text, %.64s, the 600- and 160-byte bounds): jw_str
     * turns such bytes into U+FFFD, so the body stays valid JSON */
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jw_free(&c->out);
    c->status = status;
    c->content_type = "application/json";
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "error");
    jw_obj(w);
    jw_key(w, "code");
    jw_str(w, code);
    jw_key(w, "message");
    jw_str(w, msg);
    jw_key(w, "field");
    char full[160];
    const char *prefix = c->field_prefix ? c->field_prefix : "";
    if (field && c->item >= 0 && (!strcmp(field, "text") || !strcmp(field, "text_pair")))
        snprintf(full, sizeof full, "%s%ss[%d]", prefix, field, c->item);
    else if (field)
        snprintf(full, sizeof full, "%s%s", prefix, field);
    jw_str(w, field ? full : NULL);
    jw_end(w);
    jw_end(w);
    return -1;
}

/* jansson reports most allocation failures as syntax errors ("invalid
 * token" when a string cannot be copied), so its allocator is wrapped to
 * note them: a body that failed to parse for want of memory is the server's
 * fault (500), not the client's (400). */
static _Thread_local int json_alloc_failed;

static void *json_malloc_noting(size_t n)
{
    void *p = malloc(n);
    if (!p) json_alloc_failed = 1;
    return p;
}

static void json_free_noting(void *p) { free(p); }

static void json_alloc_install(void) { json_set_alloc_funcs(json_malloc_noting, json_free_noting); }

void api_json_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, json_alloc_install);
}

int api_parse_body(api_call *c, const char *data, size_t len)
{
    json_error_t jerr;
    if (len == 0) return api_fail(c, 400, "invalid_json", NULL, "request body is empty; expected a JSON object");
    api_json_init();
    json_alloc_failed = 0;
    c->body = json_loadb(data, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (json_alloc_failed || (!c->body && json_error_code(&jerr) == json_error_out_of_memory)) {
        /* even a parse that succeeded may hold a cut string: jansson's lexer
         * does not check every buffer append */
        json_decref(c->body);
        c->body = NULL;
        return api_fail(c, 500, "internal", NULL, "out of memory parsing the request body");
    }
    if (!c->body && strstr(jerr.text, "JSON_ALLOW_NUL")) /* jansson's text names its own flag */
        return api_fail(c, 400, "invalid_json", NULL,
                        "malformed JSON at line %d column %d: a string holds \\u0000 (NUL), which lensd does not accept",
                        jerr.line, jerr.column);
    if (!c->body)
        return api_fail(c, 400, "invalid_json", NULL, "malformed JSON at line %d column %d: %s",
                        jerr.line, jerr.column, jerr.text);
    if (!json_is_object(c->body))
        return api_fail(c, 422, "invalid_request", NULL, "request body must be a JSON object");
    return 0;
}

/* ------------------------------------------------------- allowed fields */

/* The top-level fields each endpoint (by route path) and each job kind (its
 * params, by kind) accepts. A new request field is one word in its row. */
#define INPUT_FIELDS "model", "text", "text_pair", "input_ids"
#define BATCH_FIELDS "texts", "text_pairs" /* api/batch.c */
#define DATASET_FIELDS "model", "data", "rows", "max_rows", "steps", "riemann", "quadrature"
typedef struct {
    const char *name;
    const char *fields[24]; /* NULL-terminated */
} api_field_set;

static const api_field_set field_sets[] = {
    {"/v1/tokenize", {INPUT_FIELDS}},
    {"/v1/detokenize", {"model", "ids", "skip_special_tokens"}},
    {"/v1/models", {"id", "path"}},
    {"/v1/forward", {INPUT_FIELDS, BATCH_FIELDS, "outputs", "layers", "heads", "positions", "k", "logit_lens", "format"}},
    {"/v1/attention", {INPUT_FIELDS, BATCH_FIELDS, "layers", "heads", "effective", "include_raw", "null", "identifiability", "format"}},
    {"/v1/attribution",
     {INPUT_FIELDS, BATCH_FIELDS, "layers", "heads", "steps", "riemann", "quadrature", "target", "objective", "tree", "include_matrices", "format", "async"}},
    {"/v1/decomposition",
     {"model", "texts", "windows", "corpus", "labels", "length", "drop_first_position", "top_k", "causal", "layers",
      "async", "definition", "topics_self_pairs", "topics_pca", "screenot_k", "reference_texts", "reference_windows",
      "reference_corpus", "format"}},
    {"/v1/token-identity", {INPUT_FIELDS, BATCH_FIELDS, "layers", "metric", "top_k", "mapping", "vocabulary", "format"}},
    {"/v1/hidden-attribution",
     {INPUT_FIELDS, BATCH_FIELDS, "layers", "method", "probes", "seed", "include_norms", "format", "async"}},
    {"/v1/context-mixing", {INPUT_FIELDS, BATCH_FIELDS, "method", "layers", "definition", "format"}},
    {"/v1/logit-attribution", {INPUT_FIELDS, "position", "target", "foil"}},
    {"/v1/ablation", {INPUT_FIELDS, "heads", "mlps", "mode", "reference_texts", "objective", "include_logits"}},
    {"/v1/patching", {"model", "clean", "corrupt", "objective", "targets", "per_position", "method"}},
    {"/v1/jobs", {"kind", "params"}},
    /* job kinds: params */
    {"decomposition",
     {"model", "texts", "windows", "corpus", "labels", "length", "drop_first_position", "top_k", "causal", "layers",
      "async", "definition", "topics_self_pairs", "topics_pca", "screenot_k", "reference_texts", "reference_windows",
      "reference_corpus", "format"}},
    {"attribution", /* texts: attribution over a dataset, a sharded kind (api/attribution.c) */
     {INPUT_FIELDS, BATCH_FIELDS, "layers", "heads", "steps", "riemann", "quadrature", "target", "objective", "tree", "include_matrices", "format", "async"}},
    {"hidden-attribution", {INPUT_FIELDS, "layers", "method", "probes", "seed", "include_norms", "format", "async"}},
    {"head-importance", {DATASET_FIELDS, "seeds", "seed", "definition", "target", "prune_count"}},
    {"adversarial-triggers", {DATASET_FIELDS, "sources", "top_k", "definition", "rule"}},
    {"faithfulness",
     {"model", "texts", "data", "max_rows", "methods", "unit", "fractions", "objective", "steps", "seed", "random_orderings"}},
    {"token-identity-map", {"model", "texts", "data", "max_texts", "metric", "save", "ridge", "heldout_fraction"}},
    {"context-mixing", {"model", "texts", "data", "max_texts", "methods", "definition"}},
};

const char *const *api_allowed_fields(const char *name)
{
    for (size_t i = 0; i < sizeof field_sets / sizeof *field_sets; i++)
        if (!strcmp(field_sets[i].name, name)) return field_sets[i].fields;
    return NULL;
}

int api_check_fields(api_call *c, const char *name)
{
    const char *const *allowed = api_allowed_fields(name);
    if (!allowed || !json_is_object(c->body)) return 0;
    const char *key;
    json_t *value;
    json_object_foreach(c->body, key, value) {
        int known = 0;
        for (int i = 0; allowed[i] && !known; i++) known = !strcmp(allowed[i], key);
        if (known) continue;
        char list[512];
        size_t used = 0;
        for (int i = 0; allowed[i] && used < sizeof list; i++) {
            int n = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", allowed[i]);
            if (n > 0) used += (size_t)n;
        }
        return api_fail(c, 422, "invalid_request", key, "unknown field \"%.64s\" (this %s takes: %s)", key,
                        name[0] == '/' ? "endpoint" : "job kind's params", list);
    }
    return 0;
}

/* async: true turns a synchronous request into a job of kind (202 with the
 * job); inside a job it is moot. */
int api_decode_async(api_call *c, const char *kind)
{
    int async = 0;
    if (api_get_bool(c, "async", &async) < 0) return -1;
    if (!async || c->field_prefix) return 0;
    if (!c->ctx->job_submit)
        return api_fail(c, 422, "invalid_request", "async", "async needs the server (lensd serve)");
    c->ctx->job_submit(c, api_job_kind_find(kind));
    c->answered = 1;
    return 0;
}

/* ------------------------------------------------------------ typed getters */

static json_t *field_value(api_call *c, const char *field)
{
    json_t *v = c->body ? json_object_get(c->body, field) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

int api_get_string(api_call *c, const char *field, const char **s, size_t *len)
{
    json_t *v = field_value(c, field);
    if (!v) return 0;
    if (!json_is_string(v)) {
        api_fail(c, 422, "invalid_request", field, "%s must be a string", field);
        return -1;
    }
    *s = json_string_value(v);
    if (len) *len = json_string_length(v);
    return 1;
}

int api_get_bool(api_call *c, const char *field, int *out)
{
    json_t *v = field_value(c, field);
    if (!v) return 0;
    if (!json_is_boolean(v)) {
        api_fail(c, 422, "invalid_request", field, "%s must be true or false", field);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

int api_get_int(api_call *c, const char *field, long long lo, long long hi, int *out)
{
    json_t *v = field_value(c, field);
    if (!v) return 0;
    if (!json_is_integer(v)) {
        api_fail(c, 422, "invalid_request", field, "%s must be an integer", field);
        return -1;
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        api_fail(c, 422, "invalid_request", field, "%s must be between %lld and %lld (got %lld)", field, lo, hi, x);
        return -1;
    }
    *out = (int)x;
    return 1;
}

/* ------------------------------------------------------------------ model */

/* A folder of tokenizer files only has no weights: it serves tokenize. */
static int tokenizer_only_check(api_call *c, const api_model *m)
{
    const char *why = NULL;
    if (!m->model->tokenizer_only || (c->route && !strcmp(c->route->path, "/v1/tokenize"))) return 0;
    lens_model_supports(m->model, LENS_ANALYSIS_FORWARD, &why);
    return api_fail(c, 422, "invalid_request", "model", "model \"%s\": %s", m->name, why);
}

int api_decode_model(api_call *c, const api_model **out)
{
    const char *name = NULL;
    size_t len = 0;
    int r = api_get_string(c, "model", &name, &len);
    if (r < 0) return -1;
    int n_resident = 0;
    api_model *m = api_model_acquire(c->ctx, r ? name : NULL, len, &n_resident);
    if (!m && r == 0)
        return api_fail(c, 422, "invalid_request", "model", "model is required when %d models are loaded", n_resident);
    if (!m)
        return api_fail(c, 404, "model_not_found", "model", "no model named \"%.100s\" is loaded (see GET /v1/models)",
                        name);
    api_model_release(c->ctx, c->model_ref); /* a batch or a retry decodes again */
    c->model_ref = m;
    c->model_name = m->name;
    *out = m;
    return tokenizer_only_check(c, m);
}

/* ------------------------------------------------------------------ input */

int api_model_takes_pairs(const lens_model *m)
{
    return lens_tokenizer_pair_template(m->tok);
}

int api_decode_input(api_call *c, const api_model *m, api_input *in)
{
    memset(in, 0, sizeof *in);
    in->model = m;
    int has_text = api_get_string(c, "text", &in->text, &in->text_len);
    if (has_text < 0) return -1;
    int has_pair = api_get_string(c, "text_pair", &in->pair, &in->pair_len);
    if (has_pair < 0) return -1;
    json_t *ids = field_value(c, "input_ids");
    if (ids && has_text)
        return api_fail(c, 422, "invalid_request", "input_ids", "give either text or input_ids, not both");
    if (!ids && !has_text)
        return api_fail(c, 422, "invalid_request", "text", "text (a non-empty string) or input_ids is required");
    if (has_text && in->text_len == 0)
        return api_fail(c, 422, "invalid_request", "text", "text must not be empty");
    if (has_pair && !has_text)
        return api_fail(c, 422, "invalid_request", "text_pair", "text_pair needs text (not input_ids)");
    if (has_pair && !api_model_takes_pairs(m->model))
        return api_fail(c, 422, "invalid_request", "text_pair",
                        "text_pair needs a tokenizer with a pair template (BERT's [CLS] A [SEP] B [SEP], RoBERTa's <s> A </s></s> B </s>)");
    if (has_pair && in->pair_len == 0)
        return api_fail(c, 422, "invalid_request", "text_pair", "text_pair must not be empty");
    if (has_text && memchr(in->text, 0, in->text_len))
        return api_fail(c, 422, "invalid_request", "text", "text must not contain NUL characters");
    if (has_pair && memchr(in->pair, 0, in->pair_len))
        return api_fail(c, 422, "invalid_request", "text_pair", "text_pair must not contain NUL characters");
    if (!ids) return 0;
    return api_decode_ids(c, ids, "input_ids", in);
}

int api_decode_ids(api_call *c, const json_t *ids, const char *field, api_input *in)
{
    if (!json_is_array(ids))
        return api_fail(c, 422, "invalid_request", field, "%s must be an array of integers", field);
    size_t n = json_array_size(ids);
    if (n == 0) return api_fail(c, 422, "invalid_request", field, "%s must not be empty", field);
    const lens_config *cfg = &in->model->model->cfg;
    int limit = api_token_limit(c, cfg);
    if (n > (size_t)limit)
        return api_fail(c, 413, "too_many_tokens", field, "%zu tokens; the limit is %d (%s)", n, limit,
                        api_token_limit_name(c, cfg));
    in->input_ids = malloc(n * sizeof *in->input_ids);
    if (!in->input_ids) return api_fail(c, 500, "internal", NULL, "out of memory");
    in->n_input_ids = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v)) return api_fail(c, 422, "invalid_request", field, "%s[%zu] is not an integer", field, i);
        long long id = json_integer_value(v);
        if (id < 0 || id >= cfg->vocab_size)
            return api_fail(c, 422, "invalid_request", field, "%s[%zu] = %lld is outside the vocabulary [0, %d)", field,
                            i, id, cfg->vocab_size);
        in->input_ids[i] = (int)id;
    }
    return 0;
}

void api_input_free(api_input *in)
{
    free(in->input_ids);
    in->input_ids = NULL;
}

int api_token_limit(const api_call *c, const lens_config *cfg)
{
    return c->ctx->max_tokens < cfg->max_positions ? c->ctx->max_tokens : cfg->max_positions;
}

const char *api_token_limit_name(const api_call *c, const lens_config *cfg)
{
    return c->ctx->max_tokens < cfg->max_positions ? "the server's --max-tokens" : "the model's max_positions";
}

int api_tokenize_input(api_call *c, const api_input *in, lens_token **toks, int *n)
{
    const lens_model *m = in->model->model;
    int limit = api_token_limit(c, &m->cfg);
    *toks = NULL, *n = 0;
    if (in->input_ids) {
        lens_token *t = calloc((size_t)in->n_input_ids, sizeof *t);
        if (!t) return api_fail(c, 500, "internal", NULL, "out of memory");
        for (int i = 0; i < in->n_input_ids; i++) {
            t[i].id = in->input_ids[i];
            t[i].start = t[i].end = t[i].text_index = -1;
            t[i].special = lens_tokenizer_is_special(m->tok, t[i].id);
        }
        *toks = t, *n = in->n_input_ids;
        return 0;
    }
    lens_err err = {0};
    if (!m->tok)
        return api_fail(c, 422, "invalid_request", "text",
                        "model \"%s\" has no tokenizer (no tokenizer files in its folder): send input_ids", in->model->name);
    if (lens_tokenize(m->tok, in->text, in->text_len, in->pair, in->pair ? in->pair_len : 0, toks, n, &err)) {
        *toks = NULL, *n = 0;
        if (err.code == LENS_EINVAL) return api_fail(c, 422, "invalid_request", "text", "%s", err.msg);
        if (err.code == LENS_ELIMIT) return api_fail(c, 413, "too_many_tokens", "text", "%s", err.msg);
        return api_fail(c, 500, "internal", NULL, "tokenizer failed: %s", err.msg);
    }
    c->n_tokens = *n;
    if (*n > limit) {
        int got = *n;
        free(*toks);
        *toks = NULL, *n = 0;
        return api_fail(c, 413, "too_many_tokens", "text", "the text is %d tokens; the limit is %d (%s)", got, limit,
                        api_token_limit_name(c, &m->cfg));
    }
    if (*n == 0) return api_fail(c, 422, "invalid_request", "text", "text produced no tokens");
    return 0;
}

int api_seq_begin(api_call *c, const api_input *in, api_seq *s)
{
    memset(s, 0, sizeof *s);
    if (api_tokenize_input(c, in, &s->toks, &s->T)) return -1;
    const int T = s->T;
    c->n_tokens = T;
    s->ids = malloc((size_t)T * sizeof *s->ids);
    s->types = malloc((size_t)T * sizeof *s->types);
    s->special = malloc((size_t)T);
    if (!s->ids || !s->types || !s->special) {
        api_seq_free(s);
        return api_fail(c, 500, "internal", NULL, "out of memory");
    }
    /* a model without segment embeddings (type_vocab_size 0) reads no segment
     * ids, as its Hugging Face tokenizer returns none: a pair's B is then
     * told apart by the template's separators alone */
    const int segments = in->model->model->cfg.type_vocab_size > 0;
    for (int i = 0; i < T; i++) {
        s->ids[i] = s->toks[i].id, s->types[i] = segments ? s->toks[i].segment : 0;
        s->special[i] = (unsigned char)s->toks[i].special;
    }
    return 0;
}

void api_seq_free(api_seq *s)
{
    free(s->toks), free(s->ids), free(s->types), free(s->special);
    memset(s, 0, sizeof *s);
}

void api_write_head(jw *w, const api_input *in, const api_seq *s)
{
    jw_obj(w);
    jw_key(w, "model");
    jw_str(w, in->model->name);
    api_write_tokens(w, in->model->model, s->toks, s->T);
}

int api_fail_core(api_call *c, const lens_err *err, const char *limit_field, const char *invalid_field,
                  const char *what)
{
    switch (err->code) {
    case LENS_ECANCEL:
        return api_fail(c, 503, "timeout", NULL, "the computation was stopped (deadline passed or job cancelled)%s%s",
                        c->hint ? "; " : "", c->hint ? c->hint : "");
    case LENS_ELIMIT: return api_fail(c, 413, "too_many_tokens", limit_field, "%s", err->msg);
    case LENS_EINVAL: return api_fail(c, 422, "invalid_request", invalid_field, "%s", err->msg);
    default: return api_fail(c, 500, "internal", NULL, "%s failed: %s", what, err->msg);
    }
}

/* --------------------------------------------------------- index lists */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int api_decode_index_list(api_call *c, const char *field, int lo, int hi, api_index_list *out)
{
    memset(out, 0, sizeof *out);
    json_t *v = field_value(c, field);
    if (!v) {
        int n = hi >= lo ? hi - lo + 1 : 0;
        out->v = malloc((size_t)(n > 0 ? n : 1) * sizeof *out->v);
        if (!out->v) return api_fail(c, 500, "internal", NULL, "out of memory");
        for (int i = 0; i < n; i++) out->v[i] = lo + i;
        out->n = n;
        return 0;
    }
    if (!json_is_array(v))
        return api_fail(c, 422, "invalid_request", field, "%s must be an array of integers", field);
    size_t n = json_array_size(v);
    if (n == 0) return api_fail(c, 422, "invalid_request", field, "%s must not be empty", field);
    if (n > 100000) return api_fail(c, 422, "invalid_request", field, "%s has too many entries", field);
    out->v = malloc(n * sizeof *out->v);
    if (!out->v) return api_fail(c, 500, "internal", NULL, "out of memory");
    out->given = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return api_fail(c, 422, "invalid_request", field, "%s[%zu] is not an integer", field, i);
        long long x = json_integer_value(e);
        if (x < lo || x > hi)
            return api_fail(c, 422, "invalid_request", field, "%s[%zu] = %lld is outside [%d, %d]", field, i, x, lo, hi);
        out->v[i] = (int)x;
    }
    qsort(out->v, n, sizeof *out->v, cmp_int);
    int k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || out->v[k - 1] != out->v[i]) out->v[k++] = out->v[i];
    out->n = k;
    return 0;
}

int api_index_list_has(const api_index_list *l, int v)
{
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == v) return 1;
    return 0;
}

/* ----------------------------------------------------------------- format */

int api_decode_format(api_call *c, api_format *f)
{
    f->precision = 6 | JW_SIGNIFICANT;
    f->base64 = 0;
    f->given = 0;
    json_t *v = field_value(c, "format");
    if (!v) return 0;
    f->given = 1;
    if (!json_is_object(v))
        return api_fail(c, 422, "invalid_request", "format", "format must be an object");
    json_t *p = json_object_get(v, "precision");
    if (p && !json_is_null(p)) {
        if (!json_is_integer(p) || json_integer_value(p) < 1 || json_integer_value(p) > 9)
            return api_fail(c, 422, "invalid_request", "format.precision",
                            "format.precision (significant digits) must be an integer in [1, 9]");
        f->precision = (int)json_integer_value(p) | JW_SIGNIFICANT;
    }
    json_t *e = json_object_get(v, "encoding");
    if (e && !json_is_null(e)) {
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        if (!s || (strcmp(s, "json") && strcmp(s, "base64")))
            return api_fail(c, 422, "invalid_request", "format.encoding", "format.encoding must be \"json\" or \"base64\"");
        f->base64 = !strcmp(s, "base64");
    }
    return 0;
}

/* ------------------------------------------------------ response parts */

void api_write_output(jw *w, const lens_model *m, const char *key, int k)
{
    const lens_config *cfg = &m->cfg;
    jw_key(w, key);
    jw_obj(w);
    if (cfg->task == LENS_TASK_CAUSAL_LM) {
        jw_key(w, "id");
        jw_int(w, k);
        jw_key(w, "token");
        jw_str(w, m->tok ? lens_tokenizer_piece(m->tok, k) : NULL);
    } else {
        jw_key(w, "index");
        jw_int(w, k);
        jw_key(w, "label");
        jw_str(w, cfg->labels && k < cfg->n_labels ? cfg->labels[k] : NULL);
    }
    jw_end(w);
}

void api_write_objective_open(jw *w, const lens_model *m, const lens_objective *o)
{
    jw_key(w, "objective");
    jw_obj(w);
    jw_key(w, "kind");
    jw_str(w, lens_objective_name(o->kind));
    jw_key(w, "position");
    jw_int(w, o->position);
    if (o->foil >= 0) api_write_output(w, m, "foil", o->foil);
}

void api_write_tokens(jw *w, const lens_model *m, const lens_token *t, int n)
{
    jw_key(w, "tokens");
    jw_arr(w);
    for (int i = 0; i < n; i++) {
        jw_obj(w);
        jw_key(w, "id");
        jw_int(w, t[i].id);
        jw_key(w, "text");
        jw_str(w, lens_tokenizer_piece(m->tok, t[i].id));
        /* template tokens and input_ids have no span; special tokens typed
         * in the text keep theirs */
        jw_key(w, "start");
        if (t[i].start < 0) jw_null(w);
        else jw_int(w, t[i].start);
        jw_key(w, "end");
        if (t[i].end < 0) jw_null(w);
        else jw_int(w, t[i].end);
        jw_key(w, "special");
        jw_bool(w, t[i].special);
        jw_key(w, "segment");
        jw_int(w, t[i].segment);
        jw_key(w, "text_index");
        if (t[i].text_index < 0) jw_null(w);
        else jw_int(w, t[i].text_index);
        jw_end(w);
    }
    jw_end(w);
}

void api_write_matrix(jw *w, const float *x, size_t rows, size_t cols, const api_format *f)
{
    if (f->base64) {
        size_t shape[2] = {rows, cols};
        jw_base64_tensor(w, x, shape, 2);
    } else {
        jw_floats_2d(w, x, rows, cols, cols, f->precision);
    }
}

void api_progress(api_call *c, double fraction)
{
    if (c->progress) c->progress(c->progress_user, fraction < 0 ? 0 : fraction > 1 ? 1 : fraction);
}

void api_write_timing(api_call *c, double t_tokenize, double t_compute, double encode_start)
{
    double now = api_now();
    jw *w = &c->out;
    jw_key(w, "timing_ms");
    jw_obj(w);
    jw_key(w, "tokenize");
    jw_float(w, t_tokenize * 1e3, 3);
    jw_key(w, "compute");
    jw_float(w, t_compute * 1e3, 3);
    jw_key(w, "encode");
    jw_float(w, (now - encode_start) * 1e3, 3);
    jw_key(w, "total");
    jw_float(w, (now - c->t_start) * 1e3, 3);
    jw_end(w);
}

/* What the endpoint (or job kind) of c takes inline instead of a dataset
 * path, from its field list: "rows", "texts", "texts or windows". */
static void inline_alternative(const api_call *c, char *out, size_t size)
{
    const char *name = c->job_kind ? c->job_kind->kind : c->route ? c->route->path : "";
    const char *const *fields = api_allowed_fields(name);
    static const char *const inline_fields[] = {"rows", "texts", "windows"};
    size_t used = 0;
    out[0] = 0;
    for (size_t k = 0; k < sizeof inline_fields / sizeof *inline_fields; k++)
        for (int i = 0; fields && fields[i]; i++)
            if (!strcmp(fields[i], inline_fields[k]) && used < size) {
                int n = snprintf(out + used, size - used, "%s%s", used ? " or " : "", fields[i]);
                if (n > 0) used += (size_t)n;
            }
    if (!out[0]) snprintf(out, size, "the data inline");
}

/* PATH inside the data directory: realpath of both, then a prefix check
 * that ends at a '/' (so /data2 is not inside /data). */
int api_resolve_data_path(api_call *c, const char *field, const char *path, char *out)
{
    const char *dir = c->ctx->data_dir;
    if (!dir || !*dir) {
        char alt[64];
        inline_alternative(c, alt, sizeof alt);
        return api_fail(c, 422, "invalid_request", field,
                        "this server reads no datasets by path (start it with --data-dir); send %s instead", alt);
    }
    char real_dir[PATH_MAX], joined[PATH_MAX * 2];
    if (!realpath(dir, real_dir))
        return api_fail(c, 500, "internal", NULL, "the data directory cannot be resolved");
    snprintf(joined, sizeof joined, "%s%s%s", path[0] == '/' ? "" : real_dir, path[0] == '/' ? "" : "/", path);
    if (!realpath(joined, out))
        return api_fail(c, 422, "invalid_request", field, "no dataset \"%.200s\" in the data directory", path);
    size_t n = strlen(real_dir);
    if (strncmp(out, real_dir, n) || (out[n] != '/' && !(n == 1 && real_dir[0] == '/')))
        return api_fail(c, 422, "invalid_request", field, "\"%.200s\" is outside the data directory", path);
    return 0;
}

int api_read_data_file(api_call *c, const char *path, api_row_fn row, void *ctx)
{
    char real[PATH_MAX];
    if (api_resolve_data_path(c, "data", path, real)) return -1;
    FILE *f = fopen(real, "r");
    if (!f) return api_fail(c, 422, "invalid_request", "data", "cannot open \"%.200s\"", path);
    char *line = NULL, *cols[API_MAX_COLUMNS];
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (int line_no = 1; !rc && (len = getline(&line, &cap, f)) >= 0; line_no++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if ((size_t)len != strlen(line)) {
            rc = api_fail(c, 422, "invalid_request", "data", "\"%.200s\" line %d has a NUL byte", path, line_no);
            break;
        }
        int n_cols = 0;
        for (char *p = line, *tab; n_cols < API_MAX_COLUMNS; p = tab + 1) {
            cols[n_cols++] = p;
            if (!(tab = strchr(p, '\t'))) break;
            *tab = 0;
        }
        rc = row(c, ctx, cols, n_cols, line_no);
    }
    free(line);
    fclose(f);
    return rc < 0 ? -1 : 0;
}

int api_decode_token(api_call *c, const lens_model *m, const json_t *v, const char *field, int *id)
{
    *id = -1;
    if (!v || json_is_null(v)) return 0;
    const int V = m->cfg.vocab_size;
    if (json_is_integer(v)) {
        const json_int_t k = json_integer_value(v);
        if (k < 0 || k >= V) return api_fail(c, 422, "invalid_request", field, "%s id %lld is outside [0, %d)", field, k, V);
        *id = (int)k;
        return 0;
    }
    if (!json_is_string(v)) return api_fail(c, 422, "invalid_request", field, "%s must be a token id or a text", field);
    if (!m->tok) return api_fail(c, 422, "invalid_request", field, "this model has no tokenizer: give %s as an id", field);
    lens_token *toks = NULL;
    int n = 0, kept = 0;
    lens_err err = {0};
    if (lens_tokenize(m->tok, json_string_value(v), json_string_length(v), NULL, 0, &toks, &n, &err))
        return api_fail(c, 422, "invalid_request", field, "%s: %s", field, err.msg);
    for (int i = 0; i < n; i++)
        if (toks[i].text_index >= 0) *id = toks[i].id, kept++;
    free(toks);
    if (kept != 1)
        return api_fail(c, 422, "invalid_request", field,
                        "%s \"%.64s\" is %d tokens; it must be exactly one (give a token id to pick one)", field,
                        json_string_value(v), kept);
    return 0;
}

/* ------------------------------------------------------- a job's texts */

static int add_text(api_call *c, api_texts *t, const char *s, size_t len)
{
    if (t->n % 256 == 0) {
        char **g = realloc(t->v, sizeof *g * ((size_t)t->n + 256));
        if (!g) return api_fail(c, 500, "internal", NULL, "out of memory");
        t->v = g;
    }
    if (!(t->v[t->n] = strndup(s, len))) return api_fail(c, 500, "internal", NULL, "out of memory");
    t->n++;
    return 0;
}

typedef struct {
    api_texts *t;
    const char *path;
    int col, max_texts; /* col: the text column of a TSV, -1 for plain lines */
} text_reader;

static int text_row(api_call *c, void *ctx, char **cols, int n_cols, int line_no)
{
    text_reader *d = ctx;
    if (line_no == 1 && n_cols > 1) { /* a header names the text column */
        for (int i = 0; i < n_cols; i++)
            if (!strcmp(cols[i], "sentence") || !strcmp(cols[i], "text")) d->col = i;
        if (d->col < 0)
            return api_fail(c, 422, "invalid_request", "data",
                            "\"%.200s\" is a TSV without a \"sentence\" or \"text\" column in its header", d->path);
        return 0;
    }
    const char *text = cols[d->col < 0 ? 0 : d->col];
    if (d->col >= n_cols || !*text) return 0;
    if (add_text(c, d->t, text, strlen(text))) return -1;
    return d->t->n >= d->max_texts;
}

int api_decode_texts(api_call *c, int max_texts, api_texts *out)
{
    memset(out, 0, sizeof *out);
    json_t *texts = json_object_get(c->body, "texts");
    const char *data = NULL;
    int has_data = api_get_string(c, "data", &data, NULL);
    if (has_data < 0) return -1;
    if (json_is_null(texts)) texts = NULL;
    if (!!texts + has_data != 1) return api_fail(c, 422, "invalid_request", "texts", "give one of texts or data");
    out->field = texts ? "texts" : "data";
    if (texts) {
        if (!json_is_array(texts) || json_array_size(texts) == 0)
            return api_fail(c, 422, "invalid_request", "texts", "texts must be a non-empty array of strings");
        for (size_t i = 0; i < json_array_size(texts) && out->n < max_texts; i++) {
            json_t *e = json_array_get(texts, i);
            if (!json_is_string(e) || json_string_length(e) == 0)
                return api_fail(c, 422, "invalid_request", "texts", "texts[%zu] must be a non-empty string", i);
            if (add_text(c, out, json_string_value(e), json_string_length(e))) return -1;
        }
        return 0;
    }
    text_reader d = {.t = out, .path = data, .col = -1, .max_texts = max_texts};
    if (api_read_data_file(c, data, text_row, &d)) return -1;
    if (out->n == 0) return api_fail(c, 422, "invalid_request", "data", "\"%.200s\" has no texts", data);
    return 0;
}

void api_texts_free(api_texts *t)
{
    for (int i = 0; i < t->n; i++) free(t->v[i]);
    free(t->v);
    memset(t, 0, sizeof *t);
}

int api_tokenize_texts(api_call *c, const lens_model *m, const api_texts *t, int **ids_out, int **lengths_out)
{
    const int limit = api_token_limit(c, &m->cfg);
    int *lengths = malloc(sizeof *lengths * (size_t)(t->n ? t->n : 1)), *ids = NULL;
    size_t n_ids = 0, cap = 0;
    if (!lengths) return api_fail(c, 500, "internal", NULL, "out of memory");
    for (int i = 0; i < t->n; i++) {
        lens_token *toks = NULL;
        int n = 0;
        lens_err err = {0};
        int rc = lens_tokenize(m->tok, t->v[i], strlen(t->v[i]), NULL, 0, &toks, &n, &err);
        if (rc || n == 0) {
            free(lengths), free(ids), free(toks);
            if (rc && err.code == LENS_ENOMEM) return api_fail(c, 500, "internal", NULL, "text %d: %s", i, err.msg);
            return api_fail(c, 422, "invalid_request", "texts", "text %d: %s", i, rc ? err.msg : "no tokens");
        }
        const int T = n > limit ? limit : n;
        if (n_ids + (size_t)T > cap) {
            cap = 2 * cap + (size_t)T + 1024;
            int *g = realloc(ids, sizeof *g * cap);
            if (!g) {
                free(lengths), free(ids), free(toks);
                return api_fail(c, 500, "internal", NULL, "out of memory");
            }
            ids = g;
        }
        for (int k = 0; k < T; k++) ids[n_ids + k] = toks[k].id;
        if (n > limit && toks[n - 1].special) ids[n_ids + T - 1] = toks[n - 1].id; /* keep the final [SEP] */
        free(toks);
        lengths[i] = T;
        n_ids += (size_t)T;
    }
    *ids_out = ids, *lengths_out = lengths;
    return 0;
}
