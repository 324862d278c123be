/* batch.c - many texts in one request: `texts: [...]` (and `text_pairs`)
 * on /v1/forward, /v1/attention, /v1/attribution, /v1/token-identity and
 * /v1/hidden-attribution.
 *
 * Owns: turning a batch body into one single-text call per item (each
 * validated by the endpoint's own prepare(), so an item answers exactly
 * what the same text sent alone would), the limits (items, total tokens:
 * 413 before any compute), running the items (packed through one forward
 * pass for /v1/forward, api/forward.c; in turn for the analyses whose core
 * works on one sequence), and the {"results": [...]} answer, in order,
 * with each failed item's error in its slot. */
#include "api/batch.h"

#include <stdlib.h>
#include <string.h>

int api_is_batch(const api_call *c)
{
    return c->body && json_object_get(c->body, "texts") != NULL;
}

static void batch_free(void *p)
{
    api_batch *b = p;
    for (int i = 0; i < b->n; i++) api_call_free(&b->items[i].call);
    free(b->items);
    free(b);
}

static int max_items(const api_ctx *ctx)
{
    return ctx->max_batch_items > 0 ? ctx->max_batch_items : API_MAX_BATCH_ITEMS_DEFAULT;
}

static int max_tokens(const api_ctx *ctx)
{
    return ctx->max_batch_tokens > 0 ? ctx->max_batch_tokens : API_MAX_BATCH_TOKENS_DEFAULT;
}

/* texts and text_pairs: arrays of the same length, 1..max items. */
static int check_texts(api_call *c, json_t *texts, json_t *pairs)
{
    if (!json_is_array(texts) || json_array_size(texts) == 0)
        return api_fail(c, 422, "invalid_request", "texts", "texts must be a non-empty array of strings");
    size_t n = json_array_size(texts);
    if (n > (size_t)max_items(c->ctx))
        return api_fail(c, 413, "payload_too_large", "texts", "%zu texts; the limit is %d per request (--max-batch-items)",
                        n, max_items(c->ctx));
    for (const char **f = (const char *[]){"text", "text_pair", "input_ids", NULL}; *f; f++)
        if (json_object_get(c->body, *f))
            return api_fail(c, 422, "invalid_request", *f, "give either texts (a batch) or %s, not both", *f);
    if (pairs && !json_is_null(pairs) && (!json_is_array(pairs) || json_array_size(pairs) != n))
        return api_fail(c, 422, "invalid_request", "text_pairs", "text_pairs must be an array as long as texts (%zu)", n);
    return 0;
}

/* The item body: the batch body with texts[i] / text_pairs[i] as text / text_pair. */
static json_t *item_body(const json_t *body, json_t *text, json_t *pair)
{
    json_t *b = json_copy((json_t *)body);
    if (!b) return NULL;
    json_object_del(b, "texts");
    json_object_del(b, "text_pairs");
    json_object_set(b, "text", text);
    if (pair && !json_is_null(pair)) json_object_set(b, "text_pair", pair);
    return b;
}

/* Every item failed with the same status and body: a request-level error. */
static int all_failed_alike(const api_batch *b)
{
    for (int i = 0; i < b->n; i++) {
        const api_call *a = &b->items[i].call, *z = &b->items[0].call;
        if (b->items[i].prepared || a->status != z->status || a->out.len != z->out.len ||
            memcmp(a->out.buf, z->out.buf, a->out.len))
            return 0;
    }
    return 1;
}

int api_batch_prepare(api_call *c, api_prepare_fn prepare_one, api_run_fn run_one)
{
    json_t *texts = json_object_get(c->body, "texts"), *pairs = json_object_get(c->body, "text_pairs");
    if (check_texts(c, texts, pairs)) return -1;
    api_batch *b = calloc(1, sizeof *b);
    int n = (int)json_array_size(texts);
    if (b) b->items = calloc((size_t)n, sizeof *b->items);
    if (!b || !b->items) {
        free(b);
        return api_fail(c, 500, "internal", NULL, "out of memory");
    }
    c->req = b;
    c->free_req = batch_free;
    b->n = n;
    b->run_one = run_one;
    for (int i = 0; i < n; i++) {
        api_call *item = &b->items[i].call;
        api_call_init(item, c->ctx, c->t_start);
        item->field_prefix = c->field_prefix;
        item->item = i;
        json_t *text = json_array_get(texts, (size_t)i);
        item->body = item_body(c->body, text, json_is_array(pairs) ? json_array_get(pairs, (size_t)i) : NULL);
        if (!item->body) return api_fail(c, 500, "internal", NULL, "out of memory");
        if (!json_is_string(text)) {
            api_fail(item, 422, "invalid_request", "text", "texts[%d] must be a string", i);
            continue;
        }
        b->items[i].prepared = prepare_one(item) == 0;
    }
    if (all_failed_alike(b)) {
        /* e.g. an unknown model or a bad option: answer it for the request */
        api_call *first = &b->items[0].call;
        jw_free(&c->out);
        c->out = first->out;
        jw_init(&first->out);
        c->status = first->status;
        return -1;
    }
    c->model_name = b->items[0].call.model_name;
    return 0;
}

void api_batch_item_begin(api_call *parent, api_call *item)
{
    item->cancel = parent->cancel;
    item->threads = parent->threads;
}

/* Sum of the prepared items' token counts; tokenizes each (cheap next to
 * any analysis) so the limit is checked before compute. -1 after an error. */
static long long count_tokens(api_call *c, api_batch *b)
{
    long long total = 0;
    for (int i = 0; i < b->n; i++) {
        if (!b->items[i].prepared) continue;
        api_call *item = &b->items[i].call;
        const api_model *m = item->model_ref;
        const char *text = json_string_value(json_object_get(item->body, "text"));
        json_t *pair = json_object_get(item->body, "text_pair");
        lens_token *toks = NULL;
        int n = 0;
        lens_err err = {0};
        if (m && m->model->tok &&
            !lens_tokenize(m->model->tok, text, strlen(text), pair ? json_string_value(pair) : NULL,
                           pair ? json_string_length(pair) : 0, &toks, &n, &err))
            total += n;
        free(toks);
    }
    if (total > max_tokens(c->ctx)) {
        api_fail(c, 413, "too_many_tokens", "texts", "the texts make %lld tokens; the limit is %d per request (--max-batch-tokens)",
                 total, max_tokens(c->ctx));
        return -1;
    }
    return total;
}

void api_batch_run(api_call *c, void (*run_packed)(api_call *c, api_batch *b))
{
    api_batch *b = c->req;
    long long total = count_tokens(c, b);
    if (total < 0) return;
    if (run_packed) {
        run_packed(c, b);
    } else {
        for (int i = 0; i < b->n; i++) {
            if (!b->items[i].prepared || b->items[i].call.answered) continue; /* answered: async, a job */
            if (lens_cancelled(c->cancel)) {
                api_fail(c, 503, "timeout", NULL, "the batch passed the server's deadline at item %d of %d", i, b->n);
                return;
            }
            api_batch_item_begin(c, &b->items[i].call);
            b->run_one(&b->items[i].call);
            api_progress(c, (double)(i + 1) / b->n);
        }
    }
    c->n_tokens = (int)total;
    const char **json = malloc(sizeof *json * (size_t)b->n);
    size_t *len = malloc(sizeof *len * (size_t)b->n);
    if (!json || !len) {
        free(json), free(len);
        api_fail(c, 500, "internal", NULL, "out of memory");
        return;
    }
    for (int i = 0; i < b->n; i++) json[i] = b->items[i].call.out.buf, len[i] = b->items[i].call.out.len;
    api_batch_write(c, b->n, json, len);
    free(json), free(len);
}

void api_batch_write(api_call *c, int n, const char *const *json, const size_t *len)
{
    jw *w = &c->out;
    jw_free(w);
    jw_obj(w);
    jw_key(w, "results");
    jw_arr(w);
    for (int i = 0; i < n; i++) jw_raw_value(w, json[i] ? json[i] : "null", json[i] ? len[i] : 4);
    jw_end(w);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

/* The route table's entries for the endpoints that take texts: a batch when
 * the body has texts, else the endpoint itself. */
#define API_BATCHED(name, packed)                                                              \
    int name##_batched_prepare(api_call *c)                                                    \
    {                                                                                          \
        return api_is_batch(c) ? api_batch_prepare(c, name##_prepare, name##_run) : name##_prepare(c); \
    }                                                                                          \
    void name##_batched_run(api_call *c)                                                       \
    {                                                                                          \
        if (c->free_req == batch_free) api_batch_run(c, packed);                               \
        else name##_run(c);                                                                    \
    }

API_BATCHED(api_forward, api_forward_run_packed)
API_BATCHED(api_attention, NULL)
API_BATCHED(api_attribution, NULL)
API_BATCHED(api_token_identity, NULL)
API_BATCHED(api_hidden_attribution, NULL)
API_BATCHED(api_context_mixing, NULL)
