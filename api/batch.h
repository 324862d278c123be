/* batch.h - `texts: [...]` (and `text_pairs`) on the single-text analysis
 * endpoints, answered {"results": [...]} in order (api/batch.c). */
#ifndef LENS_API_BATCH_H
#define LENS_API_BATCH_H

#include "api/request.h"

/* One item of a batch: a complete single-text call whose body is the
 * batch body with texts[i] as text (and text_pairs[i] as text_pair). */
typedef struct {
    api_call call;
    int prepared; /* prepare() succeeded; else call.out holds its error */
} api_batch_item;

typedef struct {
    api_batch_item *items;
    int n;
    api_run_fn run_one;
} api_batch;

/* 1 when the body has "texts" (a batch), 0 otherwise. */
int api_is_batch(const api_call *c);
/* Validates texts / text_pairs (422, 413 over --max-batch-items) and runs
 * prepare_one on every item; when every item fails the same way, that is
 * the request's answer (a bad model or option, not a bad item). c->req
 * becomes the api_batch. */
int api_batch_prepare(api_call *c, api_prepare_fn prepare_one, api_run_fn run_one);
/* Counts the tokens of every prepared item (413 "too_many_tokens" over
 * --max-batch-tokens, before any compute) and runs them: through
 * run_packed when given (one forward pass for all), else run_one each in
 * turn, honouring the deadline; then writes {"results": [...]}. */
void api_batch_run(api_call *c, void (*run_packed)(api_call *c, api_batch *b));
/* {"results": [...]}: item i's answer is json[i] (len[i] bytes; NULL = null). */
void api_batch_write(api_call *c, int n, const char *const *json, const size_t *len);
/* The parent's deadline, threads and progress hooks, set on an item before it runs. */
void api_batch_item_begin(api_call *parent, api_call *item);

/* POST /v1/forward's packed run (api/forward.c). */
void api_forward_run_packed(api_call *c, api_batch *b);

#define API_MAX_BATCH_ITEMS_DEFAULT 64
#define API_MAX_BATCH_TOKENS_DEFAULT 16384

#endif
