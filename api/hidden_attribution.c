/* hidden_attribution.c - POST /v1/hidden-attribution and `lensd hidden-attribution`.
 *
 * Hidden token attribution (Brunner et al. 2020) of one sequence via
 * core/analysis/hidden_attribution.h (math in docs/hidden-attribution.md).
 *
 * Request {model?, text | input_ids, text_pair?, layers? (0..L, default
 * 1..L), method? = "exact" | "estimate", probes? = 16 (estimate, 2..4096),
 * seed? = 1, include_norms? (default false for exact, true for estimate),
 * format?, async? = false (true: 202 with a job of kind "hidden-attribution")}.
 *
 * Response {model, tokens, method, probes (estimate), layers: [{layer,
 * contributions [T][T], self [T], self_rank [T], by_distance [T],
 * squared_norms? [T][T], squared_norms_stderr? [T][T] (estimate)}],
 * timing_ms}. contributions[j][i] = ‖∂h^l_j/∂h^0_i‖_F / Σ_k ‖∂h^l_j/∂h^0_k‖_F;
 * squared_norms[j][i] = ‖∂h^l_j/∂h^0_i‖_F² (estimate: the probe mean, with
 * its standard error).
 *
 * The exact method pushes T·C tangents of T rows through every layer, so its
 * cost grows as T²·C; a synchronous server request that would outlast the
 * server's deadline at the measured rate (api/cost.h) is refused up front
 * with a hint to use the estimate or a job (jobs and the CLI have no such
 * limit). */
#include <stdlib.h>
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/hidden_attribution.h"

#define MAX_PROBES 4096

typedef struct {
    api_input in;
    api_index_list layers;
    api_format format;
    lens_hta_method method;
    int probes, seed, include_norms;
} hta_req;

static void hta_req_free(void *p)
{
    hta_req *r = p;
    api_input_free(&r->in);
    free(r->layers.v);
    free(r);
}

int api_hidden_attribution_prepare(api_call *c)
{
    hta_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = hta_req_free;
    const api_model *m;
    if (api_decode_model(c, &m) || api_decode_input(c, m, &r->in)) return -1;
    const int L = m->model->cfg.n_layers;
    const char *method = NULL;
    int has = api_get_string(c, "method", &method, NULL);
    if (has < 0) return -1;
    r->method = LENS_HTA_EXACT;
    if (has && !strcmp(method, "estimate")) r->method = LENS_HTA_ESTIMATE;
    else if (has && strcmp(method, "exact"))
        return api_fail(c, 422, "invalid_request", "method", "method must be \"exact\" or \"estimate\"");
    r->probes = 16, r->seed = 1;
    r->include_norms = r->method == LENS_HTA_ESTIMATE;
    if (api_decode_index_list(c, "layers", 0, L, &r->layers) || api_decode_format(c, &r->format) ||
        api_get_int(c, "probes", 2, MAX_PROBES, &r->probes) < 0 || api_get_int(c, "seed", 1, 1 << 30, &r->seed) < 0 ||
        api_get_bool(c, "include_norms", &r->include_norms) < 0)
        return -1;
    if (!r->layers.given) { /* default 1..L: layer 0 is trivially the identity */
        memmove(r->layers.v, r->layers.v + 1, sizeof *r->layers.v * (size_t)L);
        r->layers.n = L;
    }
    api_cost_hint(c, API_COST_HIDDEN_ATTRIBUTION);
    return api_decode_async(c, "hidden-attribution");
}

static void write_layer(jw *w, const hta_req *r, const lens_hta_layer *y, int T)
{
    jw_obj(w);
    jw_key(w, "layer");
    jw_int(w, y->layer);
    jw_key(w, "contributions");
    api_write_matrix(w, y->contrib, (size_t)T, (size_t)T, &r->format);
    jw_key(w, "self");
    jw_floats(w, y->self, (size_t)T, r->format.precision);
    jw_key(w, "self_rank");
    jw_ints(w, y->self_rank, (size_t)T);
    jw_key(w, "by_distance");
    jw_floats(w, y->by_distance, (size_t)T, r->format.precision);
    if (r->include_norms) {
        jw_key(w, "squared_norms");
        api_write_matrix(w, y->norm2, (size_t)T, (size_t)T, &r->format);
        if (y->norm2_stderr) {
            jw_key(w, "squared_norms_stderr");
            api_write_matrix(w, y->norm2_stderr, (size_t)T, (size_t)T, &r->format);
        }
    }
    jw_end(w);
}

void api_hidden_attribution_run(api_call *c)
{
    hta_req *r = c->req;
    const lens_model *m = r->in.model->model;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    const int T = seq.T;
    int top = r->layers.v[r->layers.n - 1];
    /* T·C (exact) or T·probes (estimate) tangents, the path the core will take */
    const double flops = lens_hta_flops(m, T, top, r->method, r->probes);
    if (api_cost_check(c, API_COST_HIDDEN_ATTRIBUTION, flops, "text")) {
        api_seq_free(&seq);
        return;
    }
    double t1 = api_now();
    lens_hta_opts opts = {
        .method = r->method,
        .probes = r->probes,
        .seed = (uint64_t)r->seed,
        .layers = r->layers.v,
        .n_layers = r->layers.n,
        .cancel = c->cancel,
        .progress = c->progress,
        .progress_user = c->progress_user,
        .pool = c->threads,
    };
    lens_hta_result res;
    lens_err err = {0};
    int rc = lens_hidden_attribution(m, seq.ids, seq.types, T, &opts, &res, &err);
    if (rc) {
        api_seq_free(&seq);
        api_fail_core(c, &err, "text", "layers", "hidden token attribution");
        return;
    }
    double t2 = api_now();

    jw *w = &c->out;
    api_write_head(w, &r->in, &seq);
    api_seq_free(&seq);
    jw_key(w, "method");
    jw_str(w, r->method == LENS_HTA_EXACT ? "exact" : "estimate");
    if (r->method == LENS_HTA_ESTIMATE) {
        jw_key(w, "probes");
        jw_int(w, res.probes);
    }
    jw_key(w, "layers");
    jw_arr(w);
    for (int k = 0; k < res.n_layers; k++) write_layer(w, r, &res.layers[k], T);
    jw_end(w);
    lens_hta_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
