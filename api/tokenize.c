/* tokenize.c - POST /v1/tokenize and `lensd tokenize`, POST /v1/detokenize.
 *
 * Request {model?, text, text_pair?} (or input_ids, echoed as tokens).
 * Response {model, tokens, input_ids, timing_ms}. */
#include <stdlib.h>
#include <string.h>

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

/* POST /v1/detokenize {model?, ids, skip_special_tokens?} -> {model, text,
 * tokens: [{id, piece, text}]}: text is HF's decode of the ids; each
 * token's text is its id decoded alone (" film" where the piece is "Ġfilm"). */
typedef struct {
    const api_model *model;
    int *ids;
    int n;
    int skip_special;
} detokenize_req;

static void detokenize_req_free(void *p)
{
    detokenize_req *r = p;
    free(r->ids);
    free(r);
}

int api_detokenize_prepare(api_call *c)
{
    detokenize_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = detokenize_req_free;
    if (api_decode_model(c, &r->model)) return -1;
    if (!r->model->model->tok)
        return api_fail(c, 422, "invalid_request", "model", "this model has no tokenizer files to decode with");
    if (api_get_bool(c, "skip_special_tokens", &r->skip_special) < 0) return -1;
    json_t *ids = json_object_get(c->body, "ids");
    if (!json_is_array(ids) || json_array_size(ids) == 0)
        return api_fail(c, 422, "invalid_request", "ids", "ids (a non-empty array of token ids) is required");
    size_t n = json_array_size(ids);
    if (n > (size_t)c->ctx->max_tokens)
        return api_fail(c, 413, "too_many_tokens", "ids", "%zu ids; the limit is %d", n, c->ctx->max_tokens);
    r->ids = malloc(n * sizeof *r->ids);
    if (!r->ids) return api_fail(c, 500, "internal", NULL, "out of memory");
    int V = lens_tokenizer_vocab_size(r->model->model->tok);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(ids, i);
        long long v = json_is_integer(e) ? json_integer_value(e) : -1;
        if (v < 0 || v >= V || !lens_tokenizer_piece(r->model->model->tok, (int)v))
            return api_fail(c, 422, "invalid_request", "ids", "ids[%zu] is not a token id of this vocabulary (0..%d)", i,
                            V - 1);
        r->ids[i] = (int)v;
    }
    r->n = (int)n;
    return 0;
}

void api_detokenize_run(api_call *c)
{
    detokenize_req *r = c->req;
    const lens_tokenizer *tok = r->model->model->tok;
    double t0 = api_now();
    char *text = NULL;
    lens_err err = {0};
    if (lens_tokenizer_decode(tok, r->ids, r->n, r->skip_special, &text, NULL, &err)) {
        api_fail_core(c, &err, "ids", "ids", "decoding");
        return;
    }
    c->n_tokens = r->n;
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "model");
    jw_str(w, r->model->name);
    jw_key(w, "text");
    jw_str(w, text);
    free(text);
    jw_key(w, "tokens");
    jw_arr(w);
    for (int i = 0; i < r->n; i++) {
        char *piece_text = NULL;
        lens_tokenizer_decode(tok, &r->ids[i], 1, 0, &piece_text, NULL, NULL);
        jw_obj(w);
        jw_key(w, "id");
        jw_int(w, r->ids[i]);
        jw_key(w, "piece");
        jw_str(w, lens_tokenizer_piece(tok, r->ids[i]));
        jw_key(w, "text");
        jw_str(w, piece_text);
        jw_end(w);
        free(piece_text);
    }
    jw_end(w);
    api_write_timing(c, 0, api_now() - t0, api_now());
    jw_end(w);
    c->status = 200;
}
