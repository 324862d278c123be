/* attention.c - POST /v1/attention and `lensd attention`.
 *
 * Effective attention and identifiability (Brunner et al. 2020; Bhardwaj et
 * al. 2021) of one sequence, via core/analysis/attention.h (math and tolerances in
 * docs/identifiability.md).
 *
 * Request {model?, text | input_ids, text_pair?, layers? (1..L, default all),
 * heads? (default all), effective? = true, include_raw? = true, null? = false,
 * identifiability? = true, format?}. effective / include_raw / null say which
 * [T][T] matrices each head returns; rank, null_dim, identifiable and stats
 * are always computed. identifiability adds the row-stochastic and
 * key-aware dimensions (the latter needs the queries, so the forward pass
 * then also keeps hidden states).
 *
 * Response {model, tokens, layers: [{layer, heads: [{head, raw?, effective?,
 * null?, rank, null_dim, identifiable, stats: {pearson, special_mass_raw,
 * special_mass_effective, punct_mass_raw, punct_mass_effective}, error?}]}],
 * identifiability?: {seq_len, head_dim_value, head_dim_key, brunner_bound,
 * length_identifiable, layers: [{layer, heads: [{head, rank_v1,
 * stochastic_null_dim, key_aware: {method, dim, unknowns, rank_q, rank_j,
 * rank_mj, note}}]}]}, timing_ms}. NaN statistics are null; a head whose
 * linear algebra failed carries "error" and null numbers, the others are
 * unaffected. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/attention.h"

typedef struct {
    api_input in;
    api_index_list layers, heads;
    api_format format;
    int effective, raw, null, identifiability;
} attention_req;

static void attention_req_free(void *p)
{
    attention_req *r = p;
    api_input_free(&r->in);
    free(r->layers.v);
    free(r->heads.v);
    free(r);
}

int api_attention_prepare(api_call *c)
{
    attention_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = attention_req_free;
    const api_model *m;
    if (api_decode_model(c, &m) || api_decode_input(c, m, &r->in)) return -1;
    api_cost_hint(c, API_COST_IDENTIFIABILITY);
    const lens_config *cfg = &m->model->cfg;
    r->effective = r->raw = r->identifiability = 1;
    r->null = 0;
    if (api_decode_index_list(c, "layers", 1, cfg->n_layers, &r->layers) ||
        api_decode_index_list(c, "heads", 0, cfg->n_heads - 1, &r->heads) || api_decode_format(c, &r->format) ||
        api_get_bool(c, "effective", &r->effective) < 0 || api_get_bool(c, "include_raw", &r->raw) < 0 ||
        api_get_bool(c, "null", &r->null) < 0 || api_get_bool(c, "identifiability", &r->identifiability) < 0)
        return -1;
    return 0;
}

/* -1 (not computed) as null */
static void write_count(jw *w, const char *key, int v)
{
    jw_key(w, key);
    if (v < 0) jw_null(w);
    else jw_int(w, v);
}

static void write_num(jw *w, const char *key, double v, int precision)
{
    jw_key(w, key);
    jw_float(w, v, precision); /* NaN -> null */
}

static void write_head(jw *w, const attention_req *r, const lens_head_attention *h, int head, const float *raw,
                       const float *eff, const float *null, int T)
{
    jw_obj(w);
    jw_key(w, "head");
    jw_int(w, head);
    if (r->raw) {
        jw_key(w, "raw");
        api_write_matrix(w, raw, (size_t)T, (size_t)T, &r->format);
    }
    if (h->ok && eff) {
        jw_key(w, "effective");
        api_write_matrix(w, eff, (size_t)T, (size_t)T, &r->format);
    }
    if (h->ok && null) {
        jw_key(w, "null");
        api_write_matrix(w, null, (size_t)T, (size_t)T, &r->format);
    }
    write_count(w, "rank", h->ok ? h->rank : -1);
    write_count(w, "null_dim", h->ok ? h->null_dim : -1);
    jw_key(w, "identifiable");
    if (h->ok) jw_bool(w, h->identifiable);
    else jw_null(w);
    jw_key(w, "stats");
    jw_obj(w);
    write_num(w, "pearson", h->ok ? h->pearson : NAN, r->format.precision);
    write_num(w, "special_mass_raw", h->ok ? h->special_mass_raw : NAN, r->format.precision);
    write_num(w, "special_mass_effective", h->ok ? h->special_mass_effective : NAN, r->format.precision);
    write_num(w, "punct_mass_raw", h->ok ? h->punct_mass_raw : NAN, r->format.precision);
    write_num(w, "punct_mass_effective", h->ok ? h->punct_mass_effective : NAN, r->format.precision);
    jw_end(w);
    if (!h->ok) {
        jw_key(w, "error");
        jw_obj(w);
        jw_key(w, "code");
        jw_str(w, "internal");
        jw_key(w, "message");
        jw_str(w, h->err.msg[0] ? h->err.msg : "this head's computation failed");
        jw_end(w);
    }
    jw_end(w);
}

static void write_identifiability(jw *w, const lens_config *cfg, const lens_attention_result *res)
{
    jw_key(w, "identifiability");
    jw_obj(w);
    jw_key(w, "seq_len");
    jw_int(w, res->T);
    jw_key(w, "head_dim_value");
    jw_int(w, cfg->d_head_v);
    jw_key(w, "head_dim_key");
    jw_int(w, cfg->d_head_k);
    /* Brunner et al.: rank(V) <= DV, so attention can be identifiable only while T <= DV */
    jw_key(w, "brunner_bound");
    jw_int(w, cfg->d_head_v);
    jw_key(w, "length_identifiable");
    jw_bool(w, res->T <= cfg->d_head_v);
    jw_key(w, "key_aware_max_unknowns");
    jw_int(w, LENS_ATTN_KEY_AWARE_MAX_UNKNOWNS);
    jw_key(w, "layers");
    jw_arr(w);
    for (int li = 0; li < res->n_layers; li++) {
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, res->layers[li]);
        jw_key(w, "heads");
        jw_arr(w);
        for (int hi = 0; hi < res->n_heads; hi++) {
            const lens_head_attention *h = &res->head[(size_t)li * res->n_heads + hi];
            jw_obj(w);
            jw_key(w, "head");
            jw_int(w, res->heads[hi]);
            write_count(w, "rank_v1", h->ok ? h->rank_v1 : -1);
            write_count(w, "stochastic_null_dim", h->ok ? h->stochastic_null_dim : -1);
            jw_key(w, "key_aware");
            jw_obj(w);
            jw_key(w, "method");
            jw_str(w, h->ok ? lens_key_aware_method_name(h->key_aware_method) : "skipped");
            write_count(w, "dim", h->ok ? h->key_aware_dim : -1);
            write_count(w, "unknowns", h->ok ? h->key_aware_unknowns : -1);
            write_count(w, "rank_q", h->ok ? h->rank_q : -1);
            write_count(w, "rank_j", h->ok ? h->rank_j : -1);
            write_count(w, "rank_mj", h->ok ? h->rank_mj : -1);
            jw_key(w, "note");
            jw_str(w, h->ok && h->key_aware_note[0] ? h->key_aware_note : NULL);
            jw_end(w);
            jw_end(w);
        }
        jw_end(w);
        jw_end(w);
    }
    jw_end(w);
    jw_end(w);
}

void api_attention_run(api_call *c)
{
    attention_req *r = c->req;
    const lens_model *m = r->in.model->model;
    const lens_config *cfg = &m->cfg;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    int T = seq.T;
    if (r->identifiability) {
        /* the key-aware dimension per head: a least-squares system of T² equations in n = T·DK
         * unknowns (SVD ~ 4 T² n² + 8 n³) while n is within the limit; past it, a closed form */
        const double n = (double)T * cfg->d_head_k, eqs = (double)T * T;
        const double per_head = n <= LENS_ATTN_KEY_AWARE_MAX_UNKNOWNS ? 4 * eqs * n * n + 8 * n * n * n
                                                                      : 2.0 * T * T * cfg->d_head_v;
        const double flops = api_cost_forward_flops(cfg, T, cfg->n_layers) + per_head * r->layers.n * r->heads.n;
        if (api_cost_check(c, API_COST_IDENTIFIABILITY, flops, "text")) {
            api_seq_free(&seq);
            return;
        }
    }
    double t1 = api_now();

    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = seq.ids, .type_ids = seq.types};
    lens_forward_opts opts = {.keep = LENS_KEEP_ATTN | LENS_KEEP_VALUES, .cancel = c->cancel, .pool = c->threads};
    if (r->identifiability) opts.keep |= LENS_KEEP_HIDDEN; /* queries for the key-aware dimension */
    lens_activations act;
    memset(&act, 0, sizeof act);
    lens_attention_result res;
    memset(&res, 0, sizeof res);
    lens_err err = {0};
    int rc = lens_forward(m, &batch, &opts, &act, &err);
    if (rc == 0) {
        lens_attention_request areq = {
            .layers = r->layers.v,
            .n_layers = r->layers.n,
            .heads = r->heads.v,
            .n_heads = r->heads.n,
            .ids = seq.ids,
            .want_effective = r->effective,
            .pool = c->threads,
            .head = {.null_component = r->null, .key_aware = r->identifiability, .cancel = c->cancel},
        };
        rc = lens_attention_analyze(m, &act, 0, &areq, &res, &err);
    }
    if (rc) {
        api_seq_free(&seq);
        lens_activations_free(&act);
        api_fail_core(c, &err, "text", NULL, "attention analysis");
        return;
    }
    double t2 = api_now();

    jw *w = &c->out;
    const size_t TT = (size_t)T * T;
    api_write_head(w, &r->in, &seq);
    api_seq_free(&seq);
    jw_key(w, "layers");
    jw_arr(w);
    for (int li = 0; li < res.n_layers; li++) {
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, res.layers[li]);
        jw_key(w, "heads");
        jw_arr(w);
        for (int hi = 0; hi < res.n_heads; hi++) {
            const size_t k = (size_t)li * res.n_heads + hi;
            write_head(w, r, &res.head[k], res.heads[hi], lens_act_attn(m, &act, res.layers[li], res.heads[hi], 0),
                       res.effective ? res.effective + k * TT : NULL, res.null ? res.null + k * TT : NULL, T);
        }
        jw_end(w);
        jw_end(w);
    }
    jw_end(w);
    if (r->identifiability) write_identifiability(w, cfg, &res);
    lens_attention_result_free(&res);
    lens_activations_free(&act);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
