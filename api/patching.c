/* patching.c - POST /v1/patching: activation patching and attribution
 * patching (core/analysis/patching.h, conventions in docs/patching.md).
 *
 * Request {model?, clean, corrupt (each a text or an array of token ids;
 * the same number of tokens), objective? (as /v1/attribution's; default the
 * probability of the clean run's prediction), targets? = ["resid"] (any of
 * "resid", "heads", "mlps"), per_position? = false (adds heads_pos and
 * mlps_pos), method? = "exact" | "attribution" | "both"}. Response {model,
 * tokens (the clean input's), corrupt_ids, target: {index, label} | {id,
 * token}, objective: {kind, position, foil?, clean, corrupt}, method, the
 * exact grids (exact, both): resid [L][T], heads [L][NH], heads_pos
 * [L][NH][T], mlps [L], mlps_pos [L][T] as asked, attribution? {the same
 * keys: attribution patching's grids} (attribution, both), timing_ms}; every
 * entry the normalised effect (patched − corrupt) / (clean − corrupt), null
 * where clean = corrupt; resid row l is the input of block l + 1 (row 0 the
 * embedding output). Bad input is a 422 naming the field: clean and corrupt
 * of different lengths (corrupt), an unknown or repeated target (targets),
 * an unknown method (method), per_position not a boolean. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/patching.h"

typedef struct {
    api_input clean, corrupt;
    int target;               /* -1 = predicted */
    lens_objective objective; /* position as given (negative counts from the end) */
    unsigned grids, methods;  /* lens_patching_opts */
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

/* targets: any of "resid", "heads", "mlps" (default ["resid"]); per_position:
 * the heads' and MLPs' per-position grids too; method: exact, attribution, both */
static int decode_grid(api_call *c, patching_req *r)
{
    static const struct { const char *name; lens_patch_grid grid, pos; } targets[] = {
        {"resid", LENS_PATCH_RESID, LENS_PATCH_RESID},
        {"heads", LENS_PATCH_HEADS, LENS_PATCH_HEADS_POS},
        {"mlps", LENS_PATCH_MLPS, LENS_PATCH_MLPS_POS},
    };
    static const char *const methods[] = {NULL, "exact", "attribution", "both"}; /* index: LENS_PATCH_* bits */
    int per_position = 0;
    if (api_get_bool(c, "per_position", &per_position) < 0) return -1;
    const json_t *t = json_object_get(c->body, "targets");
    size_t i;
    const json_t *v;
    r->grids = 1u << LENS_PATCH_RESID;
    if (t && !json_is_null(t)) {
        if (!json_is_array(t) || !json_array_size(t))
            return api_fail(c, 422, "invalid_request", "targets",
                            "targets must be a non-empty array of \"resid\", \"heads\", \"mlps\"");
        r->grids = 0;
        json_array_foreach(t, i, v) {
            size_t k = 0;
            while (k < 3 && !(json_is_string(v) && !strcmp(json_string_value(v), targets[k].name))) k++;
            if (k == 3)
                return api_fail(c, 422, "invalid_request", "targets",
                                "targets[%zu] must be \"resid\", \"heads\" or \"mlps\"", i);
            if (r->grids & 1u << targets[k].grid)
                return api_fail(c, 422, "invalid_request", "targets", "targets[%zu]: %s is named twice", i,
                                targets[k].name);
            r->grids |= 1u << targets[k].grid;
            if (per_position && targets[k].pos != targets[k].grid) r->grids |= 1u << targets[k].pos;
        }
    }
    const char *method = NULL;
    const int has = api_get_string(c, "method", &method, NULL);
    if (has < 0) return -1;
    r->methods = LENS_PATCH_EXACT;
    if (has) {
        r->methods = 0;
        for (unsigned k = 1; k < 4; k++)
            if (!strcmp(method, methods[k])) r->methods = k;
        if (!r->methods)
            return api_fail(c, 422, "invalid_request", "method",
                            "method must be \"exact\", \"attribution\" or \"both\"");
    }
    return 0;
}

int api_patching_prepare(api_call *c)
{
    patching_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = patching_req_free;
    api_cost_hint(c, API_COST_PATCHING);
    const api_model *am;
    if (api_decode_objective_model(c, "patching", &am)) return -1;
    r->target = -1;
    if (decode_side(c, am, "clean", &r->clean) || decode_side(c, am, "corrupt", &r->corrupt) || decode_grid(c, r) ||
        api_decode_objective(c, am->model, &r->target, &r->objective, NULL))
        return -1;
    return 0;
}

/* x[0 .. dims product) as nested arrays of dims[0] x dims[1] x ..., null where not finite */
static void write_nested(jw *w, const double *x, const int *dims, int n_dims)
{
    size_t inner = 1;
    for (int d = 1; d < n_dims; d++) inner *= (size_t)dims[d];
    jw_arr(w);
    for (int i = 0; i < dims[0]; i++) {
        if (n_dims > 1) write_nested(w, x + i * inner, dims + 1, n_dims - 1);
        else if (isfinite(x[i])) jw_float(w, x[i], 9);
        else jw_null(w);
    }
    jw_end(w);
}

/* Every grid res holds under its name: the exact effects, or attribution patching's. */
static void write_grids(jw *w, const lens_patching_result *res, int attribution)
{
    const int L = res->n_layers, T = res->T, NH = res->n_heads;
    const int dims[LENS_PATCH_GRIDS][4] = {{2, L, T}, {2, L, NH}, {3, L, NH, T}, {1, L}, {2, L, T}};
    for (int k = 0; k < LENS_PATCH_GRIDS; k++) {
        const lens_patching_grid *g = &res->grid[k];
        if (!g->n) continue;
        jw_key(w, lens_patch_grid_name((lens_patch_grid)k));
        write_nested(w, attribution ? g->attribution : g->effect, dims[k] + 1, dims[k][0]);
    }
}

/* Flops of the grids asked for: an exact patched run recomputes the blocks from its layer on (half a forward
 * on average: it starts from the corrupt run's cached input of that layer), attribution patching is a forward
 * and a backward of each input (about 6 forwards), both on top of the clean and corrupt runs. */
static double patching_flops(const lens_config *cfg, const patching_req *r, int T)
{
    const double fwd = api_cost_forward_flops(cfg, T, cfg->n_layers), L = cfg->n_layers, NH = cfg->n_heads;
    const double runs[LENS_PATCH_GRIDS] = {[LENS_PATCH_RESID] = L * T, [LENS_PATCH_HEADS] = L * NH,
                                           [LENS_PATCH_HEADS_POS] = L * NH * T, [LENS_PATCH_MLPS] = L,
                                           [LENS_PATCH_MLPS_POS] = L * T};
    double n = 0;
    for (int k = 0; k < LENS_PATCH_GRIDS; k++)
        if (r->grids & 1u << k) n += runs[k];
    return 2 * fwd + (r->methods & LENS_PATCH_EXACT ? n * fwd / 2 : 0) + (r->methods & LENS_PATCH_ATTRIBUTION ? 6 * fwd : 0);
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
    if (api_cost_check(c, API_COST_PATCHING, patching_flops(&m->cfg, r, T), "clean")) {
        api_seq_free(&clean), api_seq_free(&corrupt);
        return;
    }
    double t1 = api_now();
    const lens_patching_opts opts = {.grids = r->grids, .methods = r->methods, .target = r->target,
                                     .objective = &obj, .cancel = c->cancel, .pool = c->threads};
    lens_patching_result res;
    lens_err err = {0};
    if (lens_patching_run(m, clean.ids, corrupt.ids, T, &opts, &res, &err)) {
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
    jw_key(w, "method");
    jw_str(w, r->methods == LENS_PATCH_EXACT ? "exact" : r->methods == LENS_PATCH_ATTRIBUTION ? "attribution" : "both");
    if (r->methods & LENS_PATCH_EXACT) write_grids(w, &res, 0);
    if (r->methods & LENS_PATCH_ATTRIBUTION) {
        jw_key(w, "attribution");
        jw_obj(w);
        write_grids(w, &res, 1);
        jw_end(w);
    }
    lens_patching_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
