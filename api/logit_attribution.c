/* logit_attribution.c - POST /v1/logit-attribution and `lensd logit-attribution`.
 *
 * Direct logit attribution of a decoder via core/analysis/logit_attribution.h
 * (convention in docs/logit-attribution.md).
 *
 * Request {model?, text | input_ids, position? (default the last token;
 * negative counts from the end), target: id | text (one token), foil?: id |
 * text}. Response {model, tokens, position, target: {id, token}, foil?,
 * logit, total, embed, bias, heads: [{layer, head, value}], mlps: [{layer,
 * value}], timing_ms}; layers count from 1 as everywhere; logit is the
 * model's logit of target (minus foil's) at position before any soft-cap,
 * total the sum of embed, bias, heads and mlps. Bad input is a 422 naming the
 * field: a model that is not a pre-norm causal LM (model), a target or foil
 * that is not one token (target / foil), the foil equal to the target (foil),
 * a position outside the tokens (position). */
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/analysis/logit_attribution.h"

typedef struct {
    api_input in;
    int position, has_position;
    int target, foil; /* foil -1 = none */
} dla_req;

static void dla_req_free(void *p)
{
    dla_req *r = p;
    api_input_free(&r->in);
    free(r);
}

int api_logit_attribution_prepare(api_call *c)
{
    dla_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = dla_req_free;
    const api_model *am;
    if (api_decode_model(c, &am)) return -1;
    const lens_model *m = am->model;
    const char *why = NULL;
    if (!lens_model_supports(m, LENS_ANALYSIS_LOGIT_ATTRIBUTION, &why))
        return api_fail(c, 422, "invalid_request", "model", "%s", why);
    if (api_decode_input(c, am, &r->in)) return -1;
    if (!json_object_get(c->body, "target") || json_is_null(json_object_get(c->body, "target")))
        return api_fail(c, 422, "invalid_request", "target", "target is required: a token id or a one-token text");
    r->position = -1;
    const int has = api_get_int(c, "position", -(1 << 30), 1 << 30, &r->position);
    if (has < 0 || api_decode_token(c, m, json_object_get(c->body, "target"), "target", &r->target) ||
        api_decode_token(c, m, json_object_get(c->body, "foil"), "foil", &r->foil)) return -1;
    r->has_position = has;
    if (r->foil == r->target)
        return api_fail(c, 422, "invalid_request", "foil", "foil is the target (%d): their logit difference is 0",
                        r->target);
    return 0;
}

static void write_token(jw *w, const lens_model *m, const char *key, int id)
{
    jw_key(w, key);
    jw_obj(w);
    jw_key(w, "id");
    jw_int(w, id);
    jw_key(w, "token");
    jw_str(w, m->tok ? lens_tokenizer_piece(m->tok, id) : NULL);
    jw_end(w);
}

void api_logit_attribution_run(api_call *c)
{
    dla_req *r = c->req;
    const lens_model *m = r->in.model->model;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    const int T = seq.T;
    const int p = r->position < 0 ? T + r->position : r->position;
    if (p < 0 || p >= T) {
        api_seq_free(&seq);
        api_fail(c, 422, "invalid_request", "position", "position %d is outside the %d tokens", r->position, T);
        return;
    }
    double t1 = api_now();
    const lens_dla_opts opts = {.position = p, .target = r->target, .foil = r->foil, .cancel = c->cancel,
                                .pool = c->threads};
    lens_dla_result res;
    lens_err err = {0};
    if (lens_logit_attribution(m, seq.ids, T, &opts, &res, &err)) {
        api_seq_free(&seq);
        api_fail_core(c, &err, "text", "model", "logit attribution");
        return;
    }
    double t2 = api_now();
    const int prec = 9;
    jw *w = &c->out;
    api_write_head(w, &r->in, &seq);
    api_seq_free(&seq);
    jw_key(w, "position");
    jw_int(w, p);
    write_token(w, m, "target", r->target);
    if (r->foil >= 0) write_token(w, m, "foil", r->foil);
    jw_key(w, "logit");
    jw_float(w, res.logit, prec);
    jw_key(w, "total");
    jw_float(w, res.total, prec);
    jw_key(w, "embed");
    jw_float(w, res.embed, prec);
    jw_key(w, "bias");
    jw_float(w, res.bias, prec);
    jw_key(w, "heads");
    jw_arr(w);
    for (int l = 0; l < res.n_layers; l++)
        for (int h = 0; h < res.n_heads; h++) {
            jw_obj(w);
            jw_key(w, "layer");
            jw_int(w, l + 1);
            jw_key(w, "head");
            jw_int(w, h);
            jw_key(w, "value");
            jw_float(w, res.heads[(size_t)l * res.n_heads + h], prec);
            jw_end(w);
        }
    jw_end(w);
    jw_key(w, "mlps");
    jw_arr(w);
    for (int l = 0; l < res.n_layers; l++) {
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, l + 1);
        jw_key(w, "value");
        jw_float(w, res.mlps[l], prec);
        jw_end(w);
    }
    jw_end(w);
    lens_dla_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
