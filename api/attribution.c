/* attribution.c - POST /v1/attribution, job kind "attribution" and
 * `lensd attribution`.
 *
 * Self-attention attribution (Hao et al., AAAI 2021) of one sequence on a
 * BERT sequence classifier (or GPT-2: target = a next-token id at the last
 * position, F = its probability; no tree), via core/analysis/attribution.h (conventions, the tree
 * rules and an example in docs/attribution.md).
 *
 * Request {model?, text | input_ids, text_pair?, target? ("predicted"
 * (default) | a label name | a class index), quadrature? = "riemann"
 * (default) | "gauss", steps? (gradient evaluations, 1..1000: Riemann steps,
 * default 20, or Gauss–Legendre nodes, default LENS_ATTR_GAUSS_NODES),
 * riemann? = "right" | "left" (riemann only), layers? (1..L, default all), heads? (default
 * all; selects what is returned), include_matrices? = true, tree? (true, or
 * {threshold: 0.4}; default none), objective? ({kind: "probability" |
 * "log_probability" | "logit" | "logit_difference", position? (causal LM),
 * target?, foil?}; docs/attribution.md "Objectives"), format?, async? =
 * false (true: 202 with a job of kind "attribution")}.
 *
 * Response {model, tokens, target: {index, label, prob (probability only)},
 * predicted: {index, label}, objective?: {kind, position?, foil?, value},
 * quadrature, steps, riemann, layers: [{layer, f_zero, attr_sum, heads: [{head,
 * importance, attribution?: [T][T]}]}], tree?: {root, threshold, nodes:
 * [{token, text, layer}], edges: [{layer, from, to, from_text, to_text, score}]}, timing_ms}
 * (text, from_text, to_text: the tokens' pieces, as tokens[].text).
 * attribution[i][j]: query token i, attended token j. The tree needs every
 * layer's attribution, so with tree all layers are computed and the
 * selected ones returned.
 *
 * Job "attribution" with texts (a batch: attribution over a dataset) is a
 * sharded kind: shard I of N answers the rows r % N == I, each exactly as
 * the single request would (its result or its error), and keeps their JSON
 * in the partial; the merge puts them back in row order as {"results":
 * [...]}, the batch's answer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/batch.h"
#include "api/cost.h"
#include "api/request.h"
#include "core/analysis/attribution.h"

typedef struct {
    api_input in;
    int target; /* -1 = predicted */
    lens_objective objective; /* position: as given (negative counts from the end), -1 = the last */
    int has_objective;
    api_schedule sched;
    api_index_list layers, heads;
    int matrices;
    int tree;
    double threshold;
    api_format format;
} attribution_req;

static void attribution_req_free(void *p)
{
    attribution_req *r = p;
    api_input_free(&r->in);
    free(r->layers.v);
    free(r->heads.v);
    free(r);
}

/* A causal LM's target is a next token; a classifier's, a class. */
static int targets_next_token(const lens_config *cfg) { return cfg->task == LENS_TASK_CAUSAL_LM; }

const char *const *api_attribution_targets(const lens_config *cfg)
{
    static const char *const token[] = {"predicted", "token", NULL}, *const cls[] = {"predicted", "label", "class", NULL};
    return targets_next_token(cfg) ? token : cls;
}

/* A causal LM: target = a next-token id (or "predicted"); range [0, V). */
static int decode_token_target(api_call *c, const lens_config *cfg, json_t *v, int *target)
{
    if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < cfg->vocab_size) {
        *target = (int)json_integer_value(v);
        return 0;
    }
    if (json_is_string(v) && !strcmp(json_string_value(v), "predicted")) return 0;
    return api_fail(c, 422, "invalid_request", "target",
                    "for a causal LM, target is \"predicted\" or a next-token id in [0, %d)", cfg->vocab_size);
}

/* A classifier's class: a label name or an index (predicted: "predicted" allowed, *k stays -1). */
static int decode_class(api_call *c, const lens_config *cfg, const json_t *v, const char *field, int predicted, int *k)
{
    if (json_is_integer(v)) {
        long long i = json_integer_value(v);
        if (i < 0 || i >= cfg->n_labels)
            return api_fail(c, 422, "invalid_request", field, "%s class %lld is outside [0, %d)", field, i, cfg->n_labels);
        *k = (int)i;
        return 0;
    }
    if (!json_is_string(v))
        return api_fail(c, 422, "invalid_request", field, "%s must be %sa label name or a class index", field,
                        predicted ? "\"predicted\", " : "");
    const char *s = json_string_value(v);
    if (predicted && !strcmp(s, "predicted")) return 0;
    for (int i = 0; cfg->labels && i < cfg->n_labels; i++)
        if (cfg->labels[i] && !strcmp(cfg->labels[i], s)) {
            *k = i;
            return 0;
        }
    return api_fail(c, 422, "invalid_request", field, "\"%.64s\" is not a label of this model", s);
}

static int decode_target(api_call *c, const lens_config *cfg, int *target)
{
    json_t *v = json_object_get(c->body, "target");
    *target = -1;
    if (!v || json_is_null(v)) return 0;
    if (targets_next_token(cfg)) return decode_token_target(c, cfg, v, target);
    return decode_class(c, cfg, v, "target", 1, target);
}

int api_decode_objective(api_call *c, const lens_model *m, int *target, lens_objective *o, int *has)
{
    const lens_config *cfg = &m->cfg;
    const json_t *obj = json_object_get(c->body, "objective");
    *o = (lens_objective){.kind = LENS_OBJ_PROBABILITY, .position = -1, .foil = -1};
    if (!obj || json_is_null(obj)) return 0;
    if (!json_is_object(obj)) return api_fail(c, 422, "invalid_request", "objective", "objective must be an object");
    if (has) *has = 1;
    const char *key;
    const json_t *v;
    char field[64];
    json_object_foreach((json_t *)obj, key, v) {
        snprintf(field, sizeof field, "objective.%.40s", key);
        if (json_is_null(v)) continue;
        if (!strcmp(key, "kind")) {
            if (!json_is_string(v) || lens_objective_parse(json_string_value(v), &o->kind))
                return api_fail(c, 422, "invalid_request", field,
                                "objective.kind must be \"probability\", \"log_probability\", \"logit\" or "
                                "\"logit_difference\"");
        } else if (!strcmp(key, "position")) {
            if (!targets_next_token(cfg))
                return api_fail(c, 422, "invalid_request", field,
                                "a classifier's objective reads its pooled first token: no position");
            if (!json_is_integer(v) || json_integer_value(v) < -(1 << 30) || json_integer_value(v) >= (1 << 30))
                return api_fail(c, 422, "invalid_request", field, "objective.position must be an integer");
            o->position = (int)json_integer_value(v);
        } else if (!strcmp(key, "target")) {
            if (json_object_get(c->body, "target") && !json_is_null(json_object_get(c->body, "target")))
                return api_fail(c, 422, "invalid_request", field, "give the target once: target or objective.target");
            if (targets_next_token(cfg) && json_is_string(v) && !strcmp(json_string_value(v), "predicted")) continue;
            if (targets_next_token(cfg) ? api_decode_token(c, m, v, field, target)
                                        : decode_class(c, cfg, v, field, 1, target))
                return -1;
        } else if (!strcmp(key, "foil")) {
            if (targets_next_token(cfg) ? api_decode_token(c, m, v, field, &o->foil)
                                        : decode_class(c, cfg, v, field, 0, &o->foil))
                return -1;
        } else {
            return api_fail(c, 422, "invalid_request", field,
                            "unknown field \"%.40s\" (objective takes: kind, position, target, foil)", key);
        }
    }
    const int diff = o->kind == LENS_OBJ_LOGIT_DIFFERENCE;
    if (diff && o->foil < 0)
        return api_fail(c, 422, "invalid_request", "objective.foil", "logit_difference needs objective.foil");
    if (!diff && o->foil >= 0)
        return api_fail(c, 422, "invalid_request", "objective.foil", "a foil needs objective.kind logit_difference");
    if (diff && o->foil == *target)
        return api_fail(c, 422, "invalid_request", "objective.foil",
                        "objective.foil is the target (%d): their logit difference is 0", *target);
    return 0;
}

int api_decode_objective_model(api_call *c, const char *what, const api_model **am)
{
    if (api_decode_model(c, am)) return -1;
    const lens_config *cfg = &(*am)->model->cfg;
    if (cfg->task != LENS_TASK_CLASSIFICATION && cfg->task != LENS_TASK_CAUSAL_LM)
        return api_fail(c, 422, "invalid_request", "model",
                        "%s reads an objective of a sequence classifier or a causal LM; %s is %s", what, (*am)->name,
                        lens_task_name(cfg->task));
    return 0;
}

int api_decode_schedule(api_call *c, api_schedule *s)
{
    const char *riemann = NULL, *quadrature = NULL;
    const int has_quadrature = api_get_string(c, "quadrature", &quadrature, NULL);
    if (has_quadrature < 0) return -1;
    if (has_quadrature && strcmp(quadrature, "riemann") && strcmp(quadrature, "gauss"))
        return api_fail(c, 422, "invalid_request", "quadrature", "quadrature must be \"riemann\" or \"gauss\"");
    s->quadrature = has_quadrature && !strcmp(quadrature, "gauss") ? LENS_QUAD_GAUSS : LENS_QUAD_RIEMANN;
    s->steps = s->quadrature == LENS_QUAD_GAUSS ? LENS_ATTR_GAUSS_NODES : LENS_ATTR_RIEMANN_STEPS;
    const int has_riemann = api_get_string(c, "riemann", &riemann, NULL);
    if (has_riemann < 0) return -1;
    if (has_riemann && strcmp(riemann, "right") && strcmp(riemann, "left"))
        return api_fail(c, 422, "invalid_request", "riemann", "riemann must be \"right\" or \"left\"");
    if (has_riemann && s->quadrature == LENS_QUAD_GAUSS) /* Gauss nodes have no left/right convention */
        return api_fail(c, 422, "invalid_request", "riemann", "riemann applies to quadrature \"riemann\" only");
    s->riemann = has_riemann && !strcmp(riemann, "left") ? LENS_RIEMANN_LEFT : LENS_RIEMANN_RIGHT;
    return api_get_int(c, "steps", 1, 1000, &s->steps) < 0 ? -1 : 0;
}

void api_write_schedule(jw *w, const api_schedule *s)
{
    jw_key(w, "quadrature");
    jw_str(w, s->quadrature == LENS_QUAD_GAUSS ? "gauss" : "riemann");
    jw_key(w, "steps");
    jw_int(w, s->steps);
    jw_key(w, "riemann");
    jw_str(w, s->riemann == LENS_RIEMANN_LEFT ? "left" : "right");
}

static int decode_tree(api_call *c, attribution_req *r)
{
    json_t *v = json_object_get(c->body, "tree");
    r->tree = 0;
    r->threshold = 0.4;
    if (!v || json_is_null(v) || json_is_false(v)) return 0;
    if (json_is_true(v)) {
        r->tree = 1;
        return 0;
    }
    if (!json_is_object(v))
        return api_fail(c, 422, "invalid_request", "tree", "tree must be true, false or {\"threshold\": number}");
    r->tree = 1;
    json_t *t = json_object_get(v, "threshold");
    if (t && !json_is_null(t)) {
        if (!json_is_number(t) || !(json_number_value(t) >= 0 && json_number_value(t) <= 1))
            return api_fail(c, 422, "invalid_request", "tree.threshold", "tree.threshold must be a number in [0, 1]");
        r->threshold = json_number_value(t);
    }
    return 0;
}

int api_attribution_prepare(api_call *c)
{
    attribution_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = attribution_req_free;
    const api_model *m;
    if (api_decode_model(c, &m)) return -1;
    const lens_config *cfg = &m->model->cfg;
    const char *why = NULL;
    if (!lens_model_supports(m->model, LENS_ANALYSIS_ATTRIBUTION, &why))
        return api_fail(c, 422, "invalid_request", "model", "%s; %s is %s (%s)", why, m->name,
                        lens_task_name(cfg->task), cfg->architecture);
    if (api_decode_input(c, m, &r->in)) return -1;
    r->matrices = 1;
    if (api_decode_schedule(c, &r->sched) || decode_target(c, cfg, &r->target) || api_decode_objective(c, m->model, &r->target, &r->objective, &r->has_objective) ||
        api_get_bool(c, "include_matrices", &r->matrices) < 0 || decode_tree(c, r) ||
        api_decode_index_list(c, "layers", 1, cfg->n_layers, &r->layers) ||
        api_decode_index_list(c, "heads", 0, cfg->n_heads - 1, &r->heads) || api_decode_format(c, &r->format))
        return -1;
    if (r->tree && !lens_model_supports(m->model, LENS_ANALYSIS_ATTRIBUTION_TREE, &why))
        return api_fail(c, 422, "invalid_request", "tree", "%s", why);
    api_cost_hint(c, API_COST_ATTRIBUTION);
    return api_decode_async(c, "attribution");
}

/* The tree; each node and edge also names its tokens' texts (the pieces
 * of tokens[]), so a client need not join them with tokens. */
static void write_tree(jw *w, const lens_attr_tree *t, const lens_model *m, const int *ids, int precision)
{
    jw_key(w, "tree");
    jw_obj(w);
    jw_key(w, "root");
    jw_int(w, t->root);
    jw_key(w, "threshold");
    jw_float(w, t->threshold, 6);
    jw_key(w, "nodes");
    jw_arr(w);
    for (int i = 0; i < t->n_nodes; i++) {
        jw_obj(w);
        jw_key(w, "token");
        jw_int(w, t->nodes[i].token);
        jw_key(w, "text");
        jw_str(w, lens_tokenizer_piece(m->tok, ids[t->nodes[i].token]));
        jw_key(w, "layer");
        jw_int(w, t->nodes[i].layer);
        jw_end(w);
    }
    jw_end(w);
    jw_key(w, "edges");
    jw_arr(w);
    for (int i = 0; i < t->n_edges; i++) {
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, t->edges[i].layer);
        jw_key(w, "from");
        jw_int(w, t->edges[i].from);
        jw_key(w, "to");
        jw_int(w, t->edges[i].to);
        jw_key(w, "from_text");
        jw_str(w, lens_tokenizer_piece(m->tok, ids[t->edges[i].from]));
        jw_key(w, "to_text");
        jw_str(w, lens_tokenizer_piece(m->tok, ids[t->edges[i].to]));
        jw_key(w, "score");
        jw_float(w, t->edges[i].score, precision);
        jw_end(w);
    }
    jw_end(w);
    jw_end(w);
}

static void write_class(jw *w, const lens_model *m, const char *key, int index, double prob, int precision)
{
    const lens_config *cfg = &m->cfg;
    jw_key(w, key);
    jw_obj(w);
    jw_key(w, "index");
    jw_int(w, index);
    jw_key(w, "label");
    if (cfg->task == LENS_TASK_CAUSAL_LM) jw_str(w, lens_tokenizer_piece(m->tok, index)); /* the next token */
    else jw_str(w, cfg->labels && index >= 0 && index < cfg->n_labels ? cfg->labels[index] : NULL);
    if (!isnan(prob)) {
        jw_key(w, "prob");
        jw_float(w, prob, precision);
    }
    jw_end(w);
}

/* per target layer; the tree afterwards is cheap */
static void attribution_progress(void *user, double fraction) { api_progress(user, 0.99 * fraction); }

void api_attribution_run(api_call *c)
{
    attribution_req *r = c->req;
    const lens_model *m = r->in.model->model;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    int T = seq.T;
    /* per target layer, steps forward + backward passes (~3 forwards) of the whole model */
    const int n_targets = r->tree ? m->cfg.n_layers : r->layers.n;
    const double flops = 3.0 * r->sched.steps * n_targets * api_cost_forward_flops(&m->cfg, T, m->cfg.n_layers);
    if (api_cost_check(c, API_COST_ATTRIBUTION, flops, "text")) {
        api_seq_free(&seq);
        return;
    }
    double t1 = api_now();
    api_progress(c, 0);
    lens_objective objective = r->objective; /* a negative position counts from the end */
    if (objective.position < -1 || objective.position >= T) {
        const int p = objective.position < 0 ? T + objective.position : objective.position;
        if (p < 0 || p >= T) {
            api_seq_free(&seq);
            api_fail(c, 422, "invalid_request", "objective.position", "objective.position %d is outside the %d tokens",
                     r->objective.position, T);
            return;
        }
        objective.position = p;
    }

    lens_attr_opts opts = {.steps = r->sched.steps,
                           .riemann = r->sched.riemann,
                           .quadrature = r->sched.quadrature,
                           .target = r->target,
                           .objective = &objective,
                           .layers = r->tree ? NULL : r->layers.v, /* the tree needs every layer */
                           .n_layers = r->tree ? 0 : r->layers.n,
                           .cancel = c->cancel,
                           .pool = c->threads,
                           .progress = attribution_progress,
                           .progress_user = c};
    lens_attribution out;
    memset(&out, 0, sizeof out);
    lens_attr_tree tree;
    memset(&tree, 0, sizeof tree);
    lens_err err = {0};
    int rc = lens_attribution_run(m, seq.ids, seq.types, T, &opts, &out, &err);
    if (rc == 0 && r->tree) {
        const float **attr = malloc((size_t)out.n_layers * sizeof *attr);
        if (!attr) {
            rc = -1;
            err.code = LENS_ENOMEM;
            snprintf(err.msg, sizeof err.msg, "out of memory");
        } else {
            for (int i = 0; i < out.n_layers; i++) attr[i] = out.layers[i].attr;
            rc = lens_attr_tree_build(attr, out.n_layers, out.n_heads, T, (float)r->threshold, &tree, &err);
            free(attr);
        }
    }
    if (rc) {
        api_seq_free(&seq);
        lens_attribution_free(&out);
        api_fail_core(c, &err, "text", NULL, "attribution");
        return;
    }
    double t2 = api_now();

    jw *w = &c->out;
    const size_t TT = (size_t)T * T;
    api_write_head(w, &r->in, &seq);
    write_class(w, m, "target", out.target,
                out.objective.kind == LENS_OBJ_PROBABILITY ? out.f_full : NAN, r->format.precision);
    write_class(w, m, "predicted", out.predicted, NAN, r->format.precision);
    if (r->has_objective) { /* F(A); completeness: layers[].attr_sum vs value - layers[].f_zero */
        jw_key(w, "objective");
        jw_obj(w);
        jw_key(w, "kind");
        jw_str(w, lens_objective_name(out.objective.kind));
        if (targets_next_token(&m->cfg)) {
            jw_key(w, "position");
            jw_int(w, out.objective.position);
        }
        if (out.objective.foil >= 0) write_class(w, m, "foil", out.objective.foil, NAN, r->format.precision);
        jw_key(w, "value");
        jw_float(w, out.f_full, r->format.precision);
        jw_end(w);
    }
    api_write_schedule(w, &(api_schedule){.steps = out.steps, .riemann = out.riemann, .quadrature = out.quadrature});
    jw_key(w, "layers");
    jw_arr(w);
    for (int i = 0; i < out.n_layers; i++) {
        const lens_attr_layer *L = &out.layers[i];
        if (!api_index_list_has(&r->layers, L->layer)) continue;
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, L->layer);
        jw_key(w, "f_zero");
        jw_float(w, L->f_zero, r->format.precision);
        jw_key(w, "attr_sum");
        jw_float(w, L->attr_sum, r->format.precision);
        jw_key(w, "heads");
        jw_arr(w);
        for (int hi = 0; hi < r->heads.n; hi++) {
            const int h = r->heads.v[hi];
            jw_obj(w);
            jw_key(w, "head");
            jw_int(w, h);
            jw_key(w, "importance");
            jw_float(w, L->importance[h], r->format.precision);
            if (r->matrices) {
                jw_key(w, "attribution");
                api_write_matrix(w, L->attr + (size_t)h * TT, (size_t)T, (size_t)T, &r->format);
            }
            jw_end(w);
        }
        jw_end(w);
        jw_end(w);
    }
    jw_end(w);
    if (r->tree) write_tree(w, &tree, m, seq.ids, r->format.precision);
    api_seq_free(&seq);
    lens_attr_tree_free(&tree);
    lens_attribution_free(&out);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

/* ------------------------------------------- job "attribution" over texts */

int api_attribution_job_prepare(api_call *c)
{
    if (!api_is_batch(c)) return api_attribution_prepare(c);
    const api_model *m;
    /* the partial's header names the batch's model: the parent holds it too */
    return api_attribution_batched_prepare(c) || api_decode_model(c, &m) ? -1 : 0;
}

void api_attribution_job_run(api_call *c)
{
    if (api_is_batch(c)) api_shard_run_whole(c, api_job_kind_find("attribution"));
    else api_attribution_run(c);
}

/* Partial: "rows" i64 [k] (the shard's row numbers), "offsets" i64 [k + 1]
 * into "results" u8 (the rows' answers, JSON text one after another). */
int api_attribution_shard(api_call *c, int index, int count, lens_partial *part)
{
    if (!api_is_batch(c))
        return api_fail(c, 422, "invalid_request", "texts", "only attribution over texts (a dataset) is sharded");
    api_batch *b = c->req;
    const size_t most = (size_t)b->n / (size_t)count + 1;
    int64_t *rows = malloc(sizeof *rows * most), *offsets = calloc(most + 1, sizeof *offsets);
    int k = 0;
    jw all;
    jw_init(&all);
    for (int r = index; rows && offsets && r < b->n; r += count) {
        api_batch_item *item = &b->items[r];
        if (lens_cancelled(c->cancel)) {
            free(rows), free(offsets), jw_free(&all);
            return api_fail(c, 503, "timeout", NULL, "the job passed its deadline at row %d of %d", r, b->n);
        }
        if (item->prepared) {
            api_batch_item_begin(c, &item->call);
            b->run_one(&item->call);
        }
        const jw *out = &item->call.out;
        jw_raw(&all, out->buf ? out->buf : "null", out->buf ? out->len : 4); /* no separators: offsets delimit */
        rows[k] = r;
        offsets[++k] = (int64_t)all.len;
        api_progress(c, (double)k * count / b->n);
    }
    lens_err err = {0};
    int rc = !rows || !offsets || all.oom ? api_fail(c, 500, "internal", NULL, "out of memory") : 0;
    if (!rc && (lens_partial_add(part, "rows", LENS_PT_I64, k, rows, &err) ||
                lens_partial_add(part, "offsets", LENS_PT_I64, k + 1, offsets, &err) ||
                lens_partial_add(part, "results", LENS_PT_U8, (int64_t)all.len, all.buf, &err)))
        rc = api_fail(c, 500, "internal", NULL, "%s", err.msg);
    if (!rc && api_shard_rows(part, b->n, k)) rc = api_fail(c, 500, "internal", NULL, "out of memory");
    free(rows), free(offsets), jw_free(&all);
    return rc;
}

/* One part's rows into json/len; every row number valid and seen once. */
static int merge_part(api_call *c, const lens_partial *p, int n_rows, const char **json, size_t *len)
{
    lens_err err = {0};
    const lens_pt_tensor *rows_t = lens_partial_find(p, "rows"), *text_t = lens_partial_find(p, "results");
    const int64_t k = rows_t ? rows_t->length : -1;
    const int64_t *rows = rows_t ? lens_partial_get(p, "rows", LENS_PT_I64, k, &err) : NULL;
    const int64_t *off = rows ? lens_partial_get(p, "offsets", LENS_PT_I64, k + 1, &err) : NULL;
    if (!rows || !off || !text_t || text_t->dtype != LENS_PT_U8)
        return api_fail(c, 422, "partial_mismatch", "parts", "an attribution partial lacks rows, offsets or results%s%s",
                        err.msg[0] ? ": " : "", err.msg);
    for (int64_t i = 0; i < k; i++) {
        if (rows[i] < 0 || rows[i] >= n_rows || json[rows[i]] || off[i] < 0 || off[i] > off[i + 1] ||
            off[i + 1] > text_t->length)
            return api_fail(c, 422, "partial_mismatch", "parts", "an attribution partial has a bad or repeated row %lld",
                            (long long)rows[i]);
        json[rows[i]] = (const char *)text_t->data + off[i];
        len[rows[i]] = (size_t)(off[i + 1] - off[i]);
    }
    return 0;
}

void api_attribution_merge(api_call *c, lens_partial *const *parts, int n)
{
    if (!api_is_batch(c)) {
        api_fail(c, 422, "invalid_request", "texts", "only attribution over texts (a dataset) is sharded");
        return;
    }
    const int n_rows = ((api_batch *)c->req)->n;
    const char **json = calloc((size_t)n_rows, sizeof *json);
    size_t *len = calloc((size_t)n_rows, sizeof *len);
    int rc = json && len ? 0 : api_fail(c, 500, "internal", NULL, "out of memory");
    for (int i = 0; !rc && i < n; i++) rc = merge_part(c, parts[i], n_rows, json, len);
    for (int r = 0; !rc && r < n_rows; r++)
        if (!json[r]) rc = api_fail(c, 422, "partial_mismatch", "parts", "row %d is in no partial", r);
    if (!rc) api_batch_write(c, n_rows, json, len);
    free(json), free(len);
}
