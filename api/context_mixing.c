/* context_mixing.c - POST /v1/context-mixing and `lensd context-mixing`.
 *
 * How much of each input token is in each position after a layer
 * (attention rollout, ALTI, GlobEnc, value zeroing, DecompX) via
 * core/analysis/context_mixing.h (definitions in docs/context-mixing.md).
 *
 * Request {model?, text | input_ids, text_pair?, method: "rollout" | "alti" |
 * "globenc" | "value-zeroing" | "decompx", layers? (1..L, default all),
 * definition? = "paper-code" | "lensd", format?}. A method the model's blocks
 * do not define is a 422 on method.
 *
 * Response {model, tokens, method, definition, layers: [{layer,
 * contributions [T][T], rollout [T][T]}], classifier?, timing_ms};
 * contributions[i][j] = how much of input token j is in position i's output
 * of that layer, rollout the product of layers 1..layer's matrices (DecompX:
 * the norms of the propagated vectors); classifier (DecompX on a classifier,
 * layers reaching L) {labels [K], contributions [T][K]}: token j's part of
 * each logit. */
#include <stdlib.h>
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/context_mixing.h"
#include "core/analysis/decompx.h"

typedef struct {
    api_input in;
    api_index_list layers;
    api_format format;
    lens_cm_method method;
    int paper_code;
} cm_req;

static void cm_req_free(void *p)
{
    cm_req *r = p;
    api_input_free(&r->in);
    free(r->layers.v);
    free(r);
}

int api_context_mixing_prepare(api_call *c)
{
    cm_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = cm_req_free;
    api_cost_hint(c, API_COST_CONTEXT_MIXING);
    const api_model *m;
    if (api_decode_model(c, &m) || api_decode_input(c, m, &r->in)) return -1;
    const char *method = NULL, *def = NULL;
    int has = api_get_string(c, "method", &method, NULL);
    if (has < 0) return -1;
    if (!has)
        return api_fail(c, 422, "invalid_request", "method",
                        "method is required: \"rollout\", \"alti\", \"globenc\", \"value-zeroing\" or \"decompx\"");
    if (lens_cm_method_parse(method, &r->method))
        return api_fail(c, 422, "invalid_request", "method",
                        "method must be \"rollout\", \"alti\", \"globenc\", \"value-zeroing\" or \"decompx\"");
    const char *why = lens_cm_undefined(m->model, r->method);
    if (why) return api_fail(c, 422, "invalid_request", "method", "%s is undefined for this model: %s", method, why);
    has = api_get_string(c, "definition", &def, NULL);
    if (has < 0) return -1;
    if (has && strcmp(def, "paper-code") && strcmp(def, "lensd"))
        return api_fail(c, 422, "invalid_request", "definition", "definition must be \"paper-code\" or \"lensd\"");
    r->paper_code = !has || !strcmp(def, "paper-code");
    return api_decode_index_list(c, "layers", 1, m->model->cfg.n_layers, &r->layers) ||
                   api_decode_format(c, &r->format)
               ? -1
               : 0;
}

/* Flops of method on T tokens for layers [n] (ascending; top the last) (core/analysis/context_mixing.c): the
 * forward, then per layer rollout's T x T products; ALTI the head values through W_O, the attention output, and
 * the T² source vectors of C (NH multiply-adds each) with their L1 distances; GlobEnc the head values and the
 * Gram matrices; value zeroing T + 1 passes of each layer; DecompX T vectors per token through every map of
 * each layer up to top, twice for the layers asked (lens_decompx_flops). */
static double cm_flops(const lens_model *m, lens_cm_method method, int T, const int *layers, int n)
{
    const lens_config *cfg = &m->cfg;
    const int top = n ? layers[n - 1] : cfg->n_layers;
    const double fwd = api_cost_forward_flops(cfg, T, top), t = T, C = cfg->d_model, NH = cfg->n_heads;
    const double VO = NH * cfg->d_head_v;
    switch (method) {
    case LENS_CM_ALTI: return fwd + top * (4 * t * VO * C + t * t * C * (2 * NH + 3));
    case LENS_CM_GLOBENC: return fwd + top * (2 * t * VO * C + t * NH * NH * (C + t));
    case LENS_CM_VALUE_ZEROING: return (t + 2) * fwd;
    case LENS_CM_DECOMPX: return fwd + lens_decompx_flops(m, T, n ? layers : NULL, n);
    default: return fwd + top * 2 * t * t * t;
    }
}

void api_context_mixing_run(api_call *c)
{
    cm_req *r = c->req;
    const lens_model *m = r->in.model->model;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    const int T = seq.T;
    if (api_cost_check(c, API_COST_CONTEXT_MIXING, cm_flops(m, r->method, T, r->layers.v, r->layers.n), "text")) {
        api_seq_free(&seq);
        return;
    }
    double t1 = api_now();
    const lens_cm_opts opts = {.method = r->method, .paper_code = r->paper_code, .layers = r->layers.v,
                               .n_layers = r->layers.n, .cancel = c->cancel, .pool = c->threads};
    lens_cm_result res;
    lens_err err = {0};
    if (lens_context_mixing(m, seq.ids, seq.types, T, &opts, &res, &err)) {
        api_seq_free(&seq);
        api_fail_core(c, &err, "text", "method", "context mixing");
        return;
    }
    double t2 = api_now();
    jw *w = &c->out;
    api_write_head(w, &r->in, &seq);
    api_seq_free(&seq);
    jw_key(w, "method");
    jw_str(w, lens_cm_method_name(r->method));
    jw_key(w, "definition");
    jw_str(w, r->paper_code ? "paper-code" : "lensd");
    jw_key(w, "layers");
    jw_arr(w);
    const size_t TT = (size_t)T * T;
    for (int k = 0; k < res.n_layers; k++) {
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, res.layers[k]);
        jw_key(w, "contributions");
        api_write_matrix(w, res.contrib + k * TT, (size_t)T, (size_t)T, &r->format);
        jw_key(w, "rollout");
        api_write_matrix(w, res.rollout + k * TT, (size_t)T, (size_t)T, &r->format);
        jw_end(w);
    }
    jw_end(w);
    if (res.classifier) {
        jw_key(w, "classifier");
        jw_obj(w);
        jw_key(w, "labels");
        jw_arr(w);
        for (int k = 0; k < res.n_classes; k++) {
            const char *label = m->cfg.labels ? m->cfg.labels[k] : NULL;
            if (label) jw_str(w, label);
            else jw_int(w, k);
        }
        jw_end(w);
        jw_key(w, "contributions");
        api_write_matrix(w, res.classifier, (size_t)T, (size_t)res.n_classes, &r->format);
        jw_end(w);
    }
    lens_cm_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
