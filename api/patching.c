/* patching.c - POST /v1/patching: activation patching of the residual
 * stream, exact grid (core/analysis/patching.h, conventions in
 * docs/patching.md).
 *
 * Request {model?, clean, corrupt (each a text or an array of token ids;
 * the same number of tokens), objective? (as /v1/attribution's; default the
 * probability of the clean run's prediction), targets? = ["resid"], method?
 * = "exact"}. Response {model, tokens (the clean input's), corrupt_ids,
 * target: {index, label} | {id, token}, objective: {kind, position, foil?, clean, corrupt},
 * resid: [L][T] normalised effects (patched − corrupt) / (clean − corrupt),
 * null where clean = corrupt, timing_ms}; row l is the input of block l + 1
 * (row 0 the embedding output). Bad input is a 422 naming the field: clean
 * and corrupt of different lengths (corrupt), a target other than "resid"
 * (targets: heads and mlps are not served yet), a method other than
 * "exact" (method). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/analysis/patching.h"

typedef struct {
    api_input clean, corrupt;
    int target;               /* -1 = predicted */
    lens_objective objective; /* position as given (negative counts from the end) */
} patching_req;

static void patching_req_free(void *p)
{
    patching_req *r = p;
    api_input_free(&r->clean);
    api_input_free(&r->corrupt);
    free(r);
}

/* field: a non-empty text or an array of token ids */
static int decode_side(api_call *c, const api_model *am, const char *field, api_input *in)
{
    const json_t *v = json_object_get(c->body, field);
    memset(in, 0, sizeof *in);
    in->model = am;
    if (json_is_string(v) && json_string_length(v) > 0 && !memchr(json_string_value(v), 0, json_string_length(v))) {
        in->text = json_string_value(v), in->text_len = json_string_length(v);
        return 0;
    }
    if (json_is_array(v)) return api_decode_ids(c, v, field, in);
    return api_fail(c, 422, "invalid_request", field, "%s is required: a non-empty text or an array of token ids",
                    field);
}

/* targets: ["resid"]; method: "exact" */
static int decode_grid(api_call *c)
{
    const json_t *t = json_object_get(c->body, "targets");
    size_t i;
    const json_t *v;
    if (t && !json_is_null(t)) {
        if (!json_is_array(t) || !json_array_size(t))
            return api_fail(c, 422, "invalid_request", "targets", "targets must be a non-empty array, e.g. [\"resid\"]");
        json_array_foreach(t, i, v) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "resid"))
                return api_fail(c, 422, "invalid_request", "targets",
                                "targets[%zu]: only \"resid\" is served (heads and mlps are not yet)", i);
        }
    }
    const char *method = NULL;
    const int has = api_get_string(c, "method", &method, NULL);
    if (has < 0) return -1;
    if (has && strcmp(method, "exact"))
        return api_fail(c, 422, "invalid_request", "method", "method must be \"exact\" (attribution patching is not served yet)");
    return 0;
}

int api_patching_prepare(api_call *c)
{
    patching_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = patching_req_free;
    const api_model *am;
    if (api_decode_objective_model(c, "patching", &am)) return -1;
    r->target = -1;
    if (decode_side(c, am, "clean", &r->clean) || decode_side(c, am, "corrupt", &r->corrupt) || decode_grid(c) ||
        api_decode_objective(c, am->model, &r->target, &r->objective, NULL))
        return -1;
    return 0;
}

void api_patching_run(api_call *c)
{
    patching_req *r = c->req;
    const lens_model *m = r->clean.model->model;
    double t0 = api_now();
    api_seq clean, corrupt;
    if (api_seq_begin(c, &r->clean, &clean)) return;
    if (api_seq_begin(c, &r->corrupt, &corrupt)) {
        api_seq_free(&clean);
        return;
    }
    const int T = clean.T;
    lens_objective obj = r->objective; /* a negative position counts from the end */
    obj.position = obj.position < 0 ? T + obj.position : obj.position;
    const char *bad = corrupt.T != T ? "corrupt" : obj.position < 0 || obj.position >= T ? "objective.position" : NULL;
    if (bad) {
        api_fail(c, 422, "invalid_request", bad,
                 corrupt.T != T ? "clean has %d tokens and corrupt %d: patching needs equal lengths"
                                : "objective.position is outside the %d tokens",
                 T, corrupt.T);
        api_seq_free(&clean), api_seq_free(&corrupt);
        return;
    }
    double t1 = api_now();
    const lens_patching_opts opts = {.target = r->target, .objective = &obj, .cancel = c->cancel, .pool = c->threads};
    lens_patching_result res;
    lens_err err = {0};
    if (lens_patching_resid(m, clean.ids, corrupt.ids, T, &opts, &res, &err)) {
        api_seq_free(&clean), api_seq_free(&corrupt);
        api_fail_core(c, &err, "clean", "objective", "patching");
        return;
    }
    double t2 = api_now();
    jw *w = &c->out;
    api_write_head(w, &r->clean, &clean);
    jw_key(w, "corrupt_ids");
    jw_ints(w, corrupt.ids, (size_t)T);
    api_seq_free(&clean), api_seq_free(&corrupt);
    api_write_output(w, m, "target", res.target);
    api_write_objective_open(w, m, &res.objective);
    jw_key(w, "clean");
    jw_float(w, res.clean, 9);
    jw_key(w, "corrupt");
    jw_float(w, res.corrupt, 9);
    jw_end(w);
    jw_key(w, "resid");
    jw_arr(w);
    for (int l = 0; l < res.n_layers; l++) {
        jw_arr(w);
        for (int t = 0; t < T; t++) {
            const double e = res.effect[(size_t)l * T + t];
            if (isfinite(e)) jw_float(w, e, 9);
            else jw_null(w);
        }
        jw_end(w);
    }
    jw_end(w);
    lens_patching_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
