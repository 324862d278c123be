/* ablation.c - POST /v1/ablation: the objective of one sequence with and
 * without a set of heads and MLPs ablated (core/analysis/ablation.h,
 * conventions in docs/ablation.md).
 *
 * Request {model?, text | input_ids, text_pair?, heads?: [[layer, head]..],
 * mlps?: [layer..], mode? = "zero" (default) | "mean", reference_texts?
 * (mean only: the mean over these texts' positions instead of the
 * request's), objective? (as /v1/attribution's), include_logits? (default
 * true on classifiers, false on causal LMs)}; layers count from 1, heads
 * from 0, as everywhere. Response {model, tokens, mode, target: {index,
 * label} | {id, token}, predicted, objective: {kind, position, foil?,
 * clean, ablated, change}, logits?: {clean, ablated}, probs?: {clean,
 * ablated} (at the objective's row), timing_ms}. Bad input is a 422 naming
 * the field: a head or layer out of range or a malformed pair (heads),
 * a layer out of range (mlps), nothing to ablate (heads), reference_texts
 * without mode mean or empty (reference_texts). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "core/analysis/ablation.h"

typedef struct {
    api_input in;
    unsigned char *heads, *mlps; /* [L][NH], [L]: 1 = ablate */
    lens_ablate_mode mode;
    int target;                  /* -1 = predicted */
    lens_objective objective;    /* position as given (negative counts from the end) */
    int logits;
    int n_ref, *ref_lengths, *ref_ids; /* the reference texts, tokenized */
} ablation_req;

static void ablation_req_free(void *p)
{
    ablation_req *r = p;
    api_input_free(&r->in);
    free(r->heads), free(r->mlps), free(r->ref_lengths), free(r->ref_ids);
    free(r);
}

/* heads: [[layer, head]..], layer 1..L, head 0..NH-1; *n = how many */
static int decode_heads(api_call *c, const lens_config *cfg, unsigned char *heads, int *n)
{
    const json_t *v = json_object_get(c->body, "heads");
    *n = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v))
        return api_fail(c, 422, "invalid_request", "heads", "heads must be an array of [layer, head] pairs");
    size_t i;
    const json_t *pair;
    json_array_foreach(v, i, pair) {
        const json_t *l = json_array_get(pair, 0), *h = json_array_get(pair, 1);
        if (!json_is_array(pair) || json_array_size(pair) != 2 || !json_is_integer(l) || !json_is_integer(h))
            return api_fail(c, 422, "invalid_request", "heads", "heads[%zu] must be a [layer, head] pair of integers", i);
        const long long layer = json_integer_value(l), head = json_integer_value(h);
        if (layer < 1 || layer > cfg->n_layers)
            return api_fail(c, 422, "invalid_request", "heads", "heads[%zu]: layer %lld is outside 1..%d", i, layer,
                            cfg->n_layers);
        if (head < 0 || head >= cfg->n_heads)
            return api_fail(c, 422, "invalid_request", "heads", "heads[%zu]: head %lld is outside 0..%d", i, head,
                            cfg->n_heads - 1);
        heads[(layer - 1) * cfg->n_heads + head] = 1;
        (*n)++;
    }
    return 0;
}

/* reference_texts: [text..], tokenized as the request's text is */
static int decode_reference(api_call *c, ablation_req *r)
{
    const json_t *v = json_object_get(c->body, "reference_texts");
    if (!v || json_is_null(v)) return 0;
    if (r->mode != LENS_ABLATE_MEAN)
        return api_fail(c, 422, "invalid_request", "reference_texts", "reference_texts need mode \"mean\"");
    if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > 4096)
        return api_fail(c, 422, "invalid_request", "reference_texts", "reference_texts must be 1..4096 texts");
    r->n_ref = (int)json_array_size(v);
    r->ref_lengths = malloc(sizeof(int) * r->n_ref);
    if (!r->ref_lengths) return api_fail(c, 500, "internal", NULL, "out of memory");
    size_t used = 0;
    for (int i = 0; i < r->n_ref; i++) {
        const json_t *t = json_array_get(v, i);
        if (!json_is_string(t))
            return api_fail(c, 422, "invalid_request", "reference_texts", "reference_texts[%d] must be a string", i);
        const api_input in = {.model = r->in.model, .text = json_string_value(t), .text_len = json_string_length(t)};
        lens_token *toks;
        int n;
        if (api_tokenize_input(c, &in, &toks, &n)) return -1;
        int *ids = realloc(r->ref_ids, sizeof(int) * (used + n + 1));
        if (!ids || !n) {
            free(toks);
            if (!ids) return api_fail(c, 500, "internal", NULL, "out of memory");
            return api_fail(c, 422, "invalid_request", "reference_texts", "reference_texts[%d] has no tokens", i);
        }
        r->ref_ids = ids;
        for (int k = 0; k < n; k++) r->ref_ids[used + k] = toks[k].id;
        used += (size_t)n;
        r->ref_lengths[i] = n;
        free(toks);
    }
    return 0;
}

int api_ablation_prepare(api_call *c)
{
    ablation_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = ablation_req_free;
    const api_model *am;
    if (api_decode_objective_model(c, "ablation", &am)) return -1;
    const lens_config *cfg = &am->model->cfg;
    if (api_decode_input(c, am, &r->in)) return -1;
    r->heads = calloc((size_t)cfg->n_layers * cfg->n_heads, 1);
    r->mlps = calloc((size_t)cfg->n_layers, 1);
    if (!r->heads || !r->mlps) return api_fail(c, 500, "internal", NULL, "out of memory");
    int n_heads = 0;
    api_index_list mlps = {0};
    if (decode_heads(c, cfg, r->heads, &n_heads) || api_decode_index_list(c, "mlps", 1, cfg->n_layers, &mlps))
        return -1;
    for (int i = 0; mlps.given && i < mlps.n; i++) r->mlps[mlps.v[i] - 1] = 1;
    const int n_mlps = mlps.given ? mlps.n : 0;
    free(mlps.v);
    if (!n_heads && !n_mlps)
        return api_fail(c, 422, "invalid_request", "heads", "nothing to ablate: give heads ([[layer, head]..]) or mlps");
    const char *mode = NULL;
    const int has_mode = api_get_string(c, "mode", &mode, NULL);
    if (has_mode < 0) return -1;
    if (has_mode && strcmp(mode, "zero") && strcmp(mode, "mean"))
        return api_fail(c, 422, "invalid_request", "mode", "mode must be \"zero\" or \"mean\"");
    r->mode = has_mode && !strcmp(mode, "mean") ? LENS_ABLATE_MEAN : LENS_ABLATE_ZERO;
    r->target = -1;
    r->logits = cfg->task == LENS_TASK_CLASSIFICATION;
    if (api_decode_objective(c, am->model, &r->target, &r->objective, NULL) || decode_reference(c, r) ||
        api_get_bool(c, "include_logits", &r->logits) < 0)
        return -1;
    return 0;
}

/* {clean: [K], ablated: [K]}; probs: softmax of each */
static void write_pair(jw *w, const char *key, lens_ablation_result *res, int probs)
{
    jw_key(w, key);
    jw_obj(w);
    float *z[2] = {res->logits_clean, res->logits_ablated};
    const char *names[2] = {"clean", "ablated"};
    const lens_objective p = {.kind = LENS_OBJ_PROBABILITY, .foil = -1};
    for (int i = 0; i < 2; i++) {
        if (probs) lens_objective_at(&p, z[i], res->K, 0, z[i]); /* in place: the logits were written before */
        jw_key(w, names[i]);
        jw_arr(w);
        for (int k = 0; k < res->K; k++) jw_float(w, z[i][k], 9);
        jw_end(w);
    }
    jw_end(w);
}

void api_ablation_run(api_call *c)
{
    ablation_req *r = c->req;
    const lens_model *m = r->in.model->model;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    const int T = seq.T;
    lens_objective obj = r->objective; /* a negative position counts from the end */
    obj.position = obj.position < 0 ? T + obj.position : obj.position;
    if (obj.position < 0 || obj.position >= T) {
        api_seq_free(&seq);
        api_fail(c, 422, "invalid_request", "objective.position", "objective.position %d is outside the %d tokens",
                 r->objective.position, T);
        return;
    }
    double t1 = api_now();
    const lens_ablation_opts opts = {.heads = r->heads, .mlps = r->mlps, .mode = r->mode, .ref_ids = r->ref_ids,
                                     .ref_lengths = r->ref_lengths, .n_ref = r->n_ref, .target = r->target,
                                     .objective = &obj, .cancel = c->cancel, .pool = c->threads};
    lens_ablation_result res;
    lens_err err = {0};
    if (lens_ablation_run(m, seq.ids, seq.types, T, &opts, &res, &err)) {
        api_seq_free(&seq);
        api_fail_core(c, &err, "text", "objective", "ablation");
        return;
    }
    double t2 = api_now();
    jw *w = &c->out;
    api_write_head(w, &r->in, &seq);
    api_seq_free(&seq);
    jw_key(w, "mode");
    jw_str(w, r->mode == LENS_ABLATE_MEAN ? "mean" : "zero");
    api_write_output(w, m, "target", res.target);
    api_write_output(w, m, "predicted", res.predicted);
    api_write_objective_open(w, m, &res.objective);
    jw_key(w, "clean");
    jw_float(w, res.clean, 9);
    jw_key(w, "ablated");
    jw_float(w, res.ablated, 9);
    jw_key(w, "change");
    jw_float(w, res.ablated - res.clean, 9);
    jw_end(w);
    if (r->logits) {
        write_pair(w, "logits", &res, 0);
        write_pair(w, "probs", &res, 1);
    }
    lens_ablation_result_free(&res);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
