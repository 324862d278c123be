/* forward.c - POST /v1/forward and `lensd forward`.
 *
 * Request {model?, text | input_ids, text_pair?, outputs?, layers?, heads?,
 * positions?, k?, logit_lens?, format?}. outputs is a subset of logits,
 * hidden_states, attentions, top_k (api/predictions.c), router, router_probs
 * (mixture-of-experts models; router_probs implies router); the default is ["logits"] for models with a task head and
 * ["hidden_states"] for bare encoders. layers selects hidden-state layers
 * (0 = embedding output .. L) and attention layers (1..L; 0 is skipped for
 * attentions); heads selects attention heads. positions restricts
 * token-level (masked / causal LM) logits to those token indices.
 *
 * Response {model, tokens, logits?, probs?, label?, label_id?, positions?,
 * hidden_layers?, hidden_states?: [layer][token][dim],
 * attentions?: [{layer, heads: [{head, weights: [T][T]}]}],
 * top_k?: [{position, predictions}], logit_lens?: [{position, layers}],
 * router?: [{layer, experts: [T][K], weights: [T][K], probs?: [T][E]}] (the
 * MoE layers among layers, 1..L: each token's experts, largest probability
 * first, their gate weights, and with router_probs every expert's router
 * probability), timing_ms}.
 * With format.encoding "base64" every float matrix (logits, each layer's
 * hidden states, each head's weights) is {dtype, shape, data} instead. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/batch.h"
#include "api/predictions.h"

enum { OUT_LOGITS = 1, OUT_HIDDEN = 2, OUT_ATTN = 4, OUT_TOP_K = 8, OUT_ROUTER = 16, OUT_ROUTER_PROBS = 32 };

typedef struct {
    api_input in;
    unsigned outputs;
    api_index_list layers, heads, positions;
    api_format format;
    api_predictions pred; /* top_k, logit_lens (api/predictions.c) */
} forward_req;

static void forward_req_free(void *p)
{
    forward_req *r = p;
    api_input_free(&r->in);
    free(r->layers.v);
    free(r->heads.v);
    free(r->positions.v);
    free(r);
}

static int decode_outputs(api_call *c, const lens_model *model, unsigned *out)
{
    const lens_config *cfg = &model->cfg;
    const char *why;
    json_t *v = json_object_get(c->body, "outputs");
    int has_head = cfg->task != LENS_TASK_ENCODER;
    if (!v || json_is_null(v)) {
        *out = has_head ? OUT_LOGITS : OUT_HIDDEN;
        return 0;
    }
    if (!json_is_array(v))
        return api_fail(c, 422, "invalid_request", "outputs", "outputs must be an array of strings");
    if (json_array_size(v) == 0)
        return api_fail(c, 422, "invalid_request", "outputs", "outputs must not be empty");
    *out = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        if (!s) return api_fail(c, 422, "invalid_request", "outputs", "outputs[%zu] is not a string", i);
        if (!strcmp(s, "logits")) *out |= OUT_LOGITS;
        else if (!strcmp(s, "hidden_states")) *out |= OUT_HIDDEN;
        else if (!strcmp(s, "attentions")) *out |= OUT_ATTN;
        else if (!strcmp(s, "top_k")) *out |= OUT_TOP_K;
        else if (!strcmp(s, "router")) *out |= OUT_ROUTER;
        else if (!strcmp(s, "router_probs")) *out |= OUT_ROUTER | OUT_ROUTER_PROBS;
        else
            return api_fail(c, 422, "invalid_request", "outputs",
                            "unknown output \"%.64s\" (known: logits, hidden_states, attentions, top_k, router, "
                            "router_probs)",
                            s);
    }
    /* the predicate GET /v1/models advertises "router" by */
    if ((*out & OUT_ROUTER) && !lens_model_supports(model, LENS_ANALYSIS_ROUTER, &why))
        return api_fail(c, 422, "invalid_request", "outputs", "%s (%s)", why, cfg->architecture);
    if ((*out & OUT_LOGITS) && !has_head)
        return api_fail(c, 422, "invalid_request", "outputs", "this model (%s) has no task head, so no logits",
                        cfg->architecture);
    return 0;
}

int api_forward_prepare(api_call *c)
{
    forward_req *r = calloc(1, sizeof *r);
    if (!r) return api_fail(c, 500, "internal", NULL, "out of memory");
    c->req = r;
    c->free_req = forward_req_free;
    const api_model *m;
    if (api_decode_model(c, &m) || api_decode_input(c, m, &r->in)) return -1;
    const lens_config *cfg = &m->model->cfg;
    if (decode_outputs(c, m->model, &r->outputs) ||
        api_decode_index_list(c, "layers", 0, cfg->n_layers, &r->layers) ||
        api_decode_index_list(c, "heads", 0, cfg->n_heads - 1, &r->heads) ||
        api_decode_format(c, &r->format) || api_decode_predictions(c, m->model, r->outputs & OUT_TOP_K, &r->pred))
        return -1;
    json_t *pos = json_object_get(c->body, "positions");
    if (pos && !json_is_null(pos)) {
        if (cfg->task != LENS_TASK_MASKED_LM && cfg->task != LENS_TASK_CAUSAL_LM)
            return api_fail(c, 422, "invalid_request", "positions",
                            "positions applies to token-level (masked or causal LM) logits only");
        if (api_decode_index_list(c, "positions", 0, cfg->max_positions - 1, &r->positions)) return -1;
    }
    return 0;
}

static void write_matrix(jw *w, const float *x, size_t rows, size_t cols, const api_format *f)
{
    if (f->base64) {
        size_t shape[2] = {rows, cols};
        jw_base64_tensor(w, x, shape, 2);
    } else {
        jw_floats_2d(w, x, rows, cols, cols, f->precision);
    }
}

static void write_vector(jw *w, const float *x, size_t n, const api_format *f)
{
    if (f->base64) jw_base64_tensor(w, x, &n, 1);
    else jw_floats(w, x, n, f->precision);
}

static void write_logits(api_call *c, forward_req *r, const lens_model *m, const lens_activations *act, int s,
                         int T)
{
    jw *w = &c->out;
    const lens_config *cfg = &m->cfg;
    const float *logits = lens_act_logits(m, act, s);
    if (cfg->task == LENS_TASK_CLASSIFICATION) {
        int K = cfg->n_labels, best = 0;
        float *probs = malloc((size_t)(K > 0 ? K : 1) * sizeof *probs);
        double mx = -INFINITY, sum = 0;
        for (int k = 0; k < K; k++) {
            if (logits[k] > mx) mx = logits[k];
            if (logits[k] > logits[best]) best = k;
        }
        for (int k = 0; k < K; k++) sum += exp((double)logits[k] - mx);
        for (int k = 0; probs && k < K; k++) probs[k] = (float)(exp((double)logits[k] - mx) / sum);
        jw_key(w, "logits");
        write_vector(w, logits, (size_t)K, &r->format);
        jw_key(w, "probs");
        if (probs) jw_floats(w, probs, (size_t)K, r->format.precision);
        else jw_null(w);
        free(probs);
        jw_key(w, "label");
        jw_str(w, cfg->labels && K > 0 ? cfg->labels[best] : NULL);
        jw_key(w, "label_id");
        jw_int(w, best);
        return;
    }
    /* token-level logits [T][V] */
    size_t V = (size_t)cfg->vocab_size;
    if (!r->positions.given) {
        jw_key(w, "logits");
        write_matrix(w, logits, (size_t)T, V, &r->format);
        return;
    }
    jw_key(w, "positions");
    jw_ints(w, r->positions.v, (size_t)r->positions.n);
    jw_key(w, "logits");
    if (r->format.base64) {
        float *sel = malloc((size_t)r->positions.n * V * sizeof *sel);
        if (!sel) {
            jw_null(w);
            return;
        }
        for (int i = 0; i < r->positions.n; i++)
            memcpy(sel + (size_t)i * V, logits + (size_t)r->positions.v[i] * V, V * sizeof *sel);
        write_matrix(w, sel, (size_t)r->positions.n, V, &r->format);
        free(sel);
    } else {
        jw_arr(w);
        for (int i = 0; i < r->positions.n; i++)
            jw_floats(w, logits + (size_t)r->positions.v[i] * V, V, r->format.precision);
        jw_end(w);
    }
}

/* x [T][cols] from the columns of src rows of stride ld, written as a matrix. */
static void write_columns(jw *w, const float *src, size_t ld, int T, int cols, const api_format *f)
{
    float *x = malloc(sizeof(float) * (size_t)T * cols + 1);
    if (!x) {
        w->oom = 1;
        return;
    }
    for (int t = 0; t < T; t++) memcpy(x + (size_t)t * cols, src + (size_t)t * ld, sizeof(float) * cols);
    write_matrix(w, x, (size_t)T, (size_t)cols, f);
    free(x);
}

/* router: the routes of the selected MoE layers (moe.h's route records). */
static void write_router(jw *w, const forward_req *r, const lens_model *m, const lens_activations *act, int s, int T)
{
    const int K = m->cfg.top_k, E = m->cfg.n_experts;
    const size_t RF = 2 * (size_t)K + E;
    jw_key(w, "router");
    jw_arr(w);
    for (int i = 0; i < r->layers.n; i++) {
        const float *route = lens_act_route(m, act, r->layers.v[i], s);
        if (!route) continue; /* the embeddings, a dense layer */
        jw_obj(w);
        jw_key(w, "layer");
        jw_int(w, r->layers.v[i]);
        jw_key(w, "experts");
        jw_arr(w);
        for (int t = 0; t < T; t++) {
            int experts[LENS_MOE_MAX_EXPERTS];
            for (int j = 0; j < K; j++) experts[j] = (int)route[t * RF + j];
            jw_ints(w, experts, (size_t)K);
        }
        jw_end(w);
        jw_key(w, "weights");
        write_columns(w, route + K, RF, T, K, &r->format);
        if (r->outputs & OUT_ROUTER_PROBS) {
            jw_key(w, "probs");
            write_columns(w, route + 2 * K, RF, T, E, &r->format);
        }
        jw_end(w);
    }
    jw_end(w);
}

/* One item's response {model, tokens, ...} from sequence s of the packed activations. */
static void write_response(api_call *c, const lens_model *m, const lens_activations *act, int s, api_seq *seq,
                           double t_tokenize, double t_compute, double t_end)
{
    forward_req *r = c->req;
    const lens_config *cfg = &m->cfg;
    const int T = seq->T;
    jw *w = &c->out;
    int *rows = NULL, n_rows = 0;
    if ((r->outputs & OUT_TOP_K) || r->pred.logit_lens) n_rows = api_prediction_rows(m, seq->ids, T, &r->positions, &rows);
    api_write_head(w, &r->in, seq);
    if (r->outputs & OUT_LOGITS) write_logits(c, r, m, act, s, T);
    if (r->outputs & OUT_TOP_K)
        api_write_top_k(w, m, lens_act_logits(m, act, s), rows, n_rows, r->pred.k, r->format.precision);
    if (r->pred.logit_lens &&
        api_write_logit_lens(c, w, m, act, s, rows, n_rows, r->pred.k, r->format.precision)) {
        free(rows);
        return;
    }
    free(rows);
    if (r->outputs & OUT_HIDDEN) {
        jw_key(w, "hidden_layers");
        jw_ints(w, r->layers.v, (size_t)r->layers.n);
        jw_key(w, "hidden_states");
        jw_arr(w);
        for (int i = 0; i < r->layers.n; i++)
            write_matrix(w, lens_act_hidden(m, act, r->layers.v[i], s), (size_t)T, (size_t)cfg->d_model, &r->format);
        jw_end(w);
    }
    if (r->outputs & OUT_ATTN) {
        jw_key(w, "attentions");
        jw_arr(w);
        for (int i = 0; i < r->layers.n; i++) {
            int layer = r->layers.v[i];
            if (layer == 0) continue;
            jw_obj(w);
            jw_key(w, "layer");
            jw_int(w, layer);
            jw_key(w, "heads");
            jw_arr(w);
            for (int j = 0; j < r->heads.n; j++) {
                jw_obj(w);
                jw_key(w, "head");
                jw_int(w, r->heads.v[j]);
                jw_key(w, "weights");
                write_matrix(w, lens_act_attn(m, act, layer, r->heads.v[j], s), (size_t)T, (size_t)T, &r->format);
                jw_end(w);
            }
            jw_end(w);
            jw_end(w);
        }
        jw_end(w);
    }
    if (r->outputs & OUT_ROUTER) write_router(w, r, m, act, s, T);
    api_write_timing(c, t_tokenize, t_compute, t_end);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}

/* Tokenize item i; 0, or -1 with the item's error written (positions past its tokens). */
static int begin_item(api_call *c, api_seq *seq)
{
    forward_req *r = c->req;
    if (api_seq_begin(c, &r->in, seq)) return -1;
    for (int i = 0; r->positions.given && i < r->positions.n; i++) {
        if (r->positions.v[i] >= seq->T) {
            api_fail(c, 422, "invalid_request", "positions", "position %d is outside the %d tokens", r->positions.v[i],
                     seq->T);
            api_seq_free(seq);
            return -1;
        }
    }
    return 0;
}

/* The n calls (same model and options, their own texts) through one
 * lens_forward: the sequences are packed row after row (no padding
 * computed), then each call's response is written from its sequence.
 * parent carries the deadline and threads. */
static void forward_packed(api_call *parent, api_call *const *calls, int n)
{
    double t0 = api_now();
    api_seq *seqs = calloc((size_t)n, sizeof *seqs);
    api_call **live = calloc((size_t)n, sizeof *live); /* the calls whose input tokenized */
    int *lengths = calloc((size_t)n, sizeof *lengths);
    if (!seqs || !live || !lengths) {
        for (int i = 0; i < n; i++) api_fail(calls[i], 500, "internal", NULL, "out of memory");
        goto done;
    }
    int S = 0;
    size_t N = 0;
    for (int i = 0; i < n; i++) {
        if (begin_item(calls[i], &seqs[S])) continue;
        live[S] = calls[i];
        lengths[S] = seqs[S].T;
        N += (size_t)seqs[S].T;
        S++;
    }
    if (S == 0) goto done;
    int *ids = malloc(N * sizeof *ids), *types = malloc(N * sizeof *types);
    for (int i = 0, row = 0; ids && types && i < S; row += seqs[i].T, i++) {
        memcpy(ids + row, seqs[i].ids, (size_t)seqs[i].T * sizeof *ids);
        memcpy(types + row, seqs[i].types, (size_t)seqs[i].T * sizeof *types);
    }
    const forward_req *r = live[0]->req;
    const lens_model *m = r->in.model->model;
    double t1 = api_now();
    lens_batch batch = {.n_seqs = S, .lengths = lengths, .ids = ids, .type_ids = types};
    lens_forward_opts opts = {.keep = 0, .cancel = parent->cancel, .pool = parent->threads};
    if (r->outputs & (OUT_LOGITS | OUT_TOP_K)) opts.keep |= LENS_KEEP_LOGITS;
    if ((r->outputs & OUT_HIDDEN) || r->pred.logit_lens) opts.keep |= LENS_KEEP_HIDDEN;
    if (r->outputs & OUT_ATTN) opts.keep |= LENS_KEEP_ATTN;
    if (r->outputs & OUT_ROUTER) opts.keep |= LENS_KEEP_ROUTER;
    lens_activations act;
    memset(&act, 0, sizeof act);
    lens_err err = {0};
    int rc = ids && types ? lens_forward(m, &batch, &opts, &act, &err) : lens_fail(&err, LENS_ENOMEM, "out of memory");
    double t2 = api_now();
    for (int i = 0; i < S; i++) {
        if (rc) api_fail_core(live[i], &err, "text", NULL, "the forward pass");
        else write_response(live[i], m, &act, i, &seqs[i], t1 - t0, t2 - t1, t2);
    }
    lens_activations_free(&act);
    free(ids);
    free(types);
done:
    for (int i = 0; seqs && i < n; i++) api_seq_free(&seqs[i]);
    free(seqs);
    free(live);
    free(lengths);
}

void api_forward_run(api_call *c)
{
    forward_packed(c, &c, 1);
}

void api_forward_run_packed(api_call *c, api_batch *b)
{
    api_call **calls = malloc((size_t)b->n * sizeof *calls);
    int n = 0;
    for (int i = 0; calls && i < b->n; i++)
        if (b->items[i].prepared) calls[n++] = &b->items[i].call;
    if (!calls) {
        api_fail(c, 500, "internal", NULL, "out of memory");
        return;
    }
    if (n) forward_packed(c, calls, n);
    free(calls);
}
