/* tokenize.c - POST /v1/tokenize and `lensd tokenize`.
 *
 * Request {model?, text, text_pair?} (or input_ids, echoed as tokens).
 * Response {model, tokens, input_ids, timing_ms}. */
#include <stdlib.h>

#include "api/request.h"

typedef struct {
    api_input in;
} tokenize_req;

static void tokenize_req_free(void *p)
{
    tokenize_req *r = p;
    api_input_free(&r->in);
    free(r);
}

int api_tokenize_prepare(api_call *c)
{
    tokenize_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = tokenize_req_free;
    const api_model *m;
    if (api_decode_model(c, &m) || api_decode_input(c, m, &r->in)) return -1;
    return 0;
}

void api_tokenize_run(api_call *c)
{
    tokenize_req *r = c->req;
    double t0 = api_now();
    lens_token *toks;
    int n;
    if (api_tokenize_input(c, &r->in, &toks, &n)) return;
    c->n_tokens = n;
    double t1 = api_now();
    const lens_model *m = r->in.model->model;
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "model");
    jw_str(w, r->in.model->name);
    api_write_tokens(w, m, toks, n);
    jw_key(w, "input_ids");
    jw_arr(w);
    for (int i = 0; i < n; i++) jw_int(w, toks[i].id);
    jw_end(w);
    free(toks);
    api_write_timing(c, t1 - t0, 0, t1);
    jw_end(w);
    c->status = 200;
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
}
