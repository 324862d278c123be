/* forward.c - POST /v1/forward and `lensd forward`.
 *
 * Request {model?, text | input_ids, text_pair?, outputs?, layers?, heads?,
 * positions?, k?, logit_lens?, format?}. outputs is a subset of logits,
 * hidden_states, attentions, top_k (api/predictions.c); the default is ["logits"] for models with a task head and
 * ["hidden_states"] for bare encoders. layers selects hidden-state layers
 * (0 = embedding output .. L) and attention layers (1..L; 0 is skipped for
 * attentions); heads selects attention heads. positions restricts
 * token-level (masked / causal LM) logits to those token indices.
 *
 * Response {model, tokens, logits?, probs?, label?, label_id?, positions?,
 * hidden_layers?, hidden_states?: [layer][token][dim],
 * attentions?: [{layer, heads: [{head, weights: [T][T]}]}],
 * top_k?: [{position, predictions}], logit_lens?: [{position, layers}], timing_ms}.
 * With format.encoding "base64" every float matrix (logits, each layer's
 * hidden states, each head's weights) is {dtype, shape, data} instead. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/predictions.h"

enum { OUT_LOGITS = 1, OUT_HIDDEN = 2, OUT_ATTN = 4, OUT_TOP_K = 8 };

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

static int decode_outputs(api_call *c, const lens_config *cfg, unsigned *out)
{
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
        else
            return api_fail(c, 422, "invalid_request", "outputs",
                            "unknown output \"%.64s\" (known: logits, hidden_states, attentions, top_k)", s);
    }
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
    if (decode_outputs(c, cfg, &r->outputs) ||
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

static void write_logits(api_call *c, forward_req *r, const lens_model *m, const lens_activations *act, int T)
{
    jw *w = &c->out;
    const lens_config *cfg = &m->cfg;
    const float *logits = lens_act_logits(m, act, 0);
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

void api_forward_run(api_call *c)
{
    forward_req *r = c->req;
    const lens_model *m = r->in.model->model;
    const lens_config *cfg = &m->cfg;
    double t0 = api_now();
    api_seq seq;
    if (api_seq_begin(c, &r->in, &seq)) return;
    int T = seq.T;
    for (int i = 0; r->positions.given && i < r->positions.n; i++) {
        if (r->positions.v[i] >= T) {
            api_fail(c, 422, "invalid_request", "positions", "position %d is outside the %d tokens", r->positions.v[i], T);
            api_seq_free(&seq);
            return;
        }
    }
    double t1 = api_now();

    lens_batch batch = {.n_seqs = 1, .lengths = &T, .ids = seq.ids, .type_ids = seq.types};
    lens_forward_opts opts = {.keep = 0, .cancel = c->cancel, .pool = c->threads};
    if (r->outputs & (OUT_LOGITS | OUT_TOP_K)) opts.keep |= LENS_KEEP_LOGITS;
    if ((r->outputs & OUT_HIDDEN) || r->pred.logit_lens) opts.keep |= LENS_KEEP_HIDDEN;
    if (r->outputs & OUT_ATTN) opts.keep |= LENS_KEEP_ATTN;
    lens_activations act;
    memset(&act, 0, sizeof act);
    lens_err err = {0};
    int rc = lens_forward(m, &batch, &opts, &act, &err);
    if (rc) {
        api_seq_free(&seq);
        lens_activations_free(&act);
        api_fail_core(c, &err, "text", NULL, "the forward pass");
        return;
    }
    double t2 = api_now();

    jw *w = &c->out;
    int *rows = NULL, n_rows = 0;
    if ((r->outputs & OUT_TOP_K) || r->pred.logit_lens) n_rows = api_prediction_rows(m, seq.ids, T, &r->positions, &rows);
    api_write_head(w, &r->in, &seq);
    api_seq_free(&seq);
    if (r->outputs & OUT_LOGITS) write_logits(c, r, m, &act, T);
    if (r->outputs & OUT_TOP_K)
        api_write_top_k(w, m, lens_act_logits(m, &act, 0), rows, n_rows, r->pred.k, r->format.precision);
    if (r->pred.logit_lens &&
        api_write_logit_lens(c, w, m, &act, rows, n_rows, r->pred.k, r->format.precision)) {
        free(rows);
        lens_activations_free(&act);
        return;
    }
    free(rows);
    if (r->outputs & OUT_HIDDEN) {
        jw_key(w, "hidden_layers");
        jw_ints(w, r->layers.v, (size_t)r->layers.n);
        jw_key(w, "hidden_states");
        jw_arr(w);
        for (int i = 0; i < r->layers.n; i++)
            write_matrix(w, lens_act_hidden(m, &act, r->layers.v[i], 0), (size_t)T, (size_t)cfg->d_model, &r->format);
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
                write_matrix(w, lens_act_attn(m, &act, layer, r->heads.v[j], 0), (size_t)T, (size_t)T, &r->format);
                jw_end(w);
            }
            jw_end(w);
            jw_end(w);
        }
        jw_end(w);
    }
    lens_activations_free(&act);
    api_write_timing(c, t1 - t0, t2 - t1, t2);
    jw_end(w);
    if (w->oom) api_fail(c, 500, "internal", NULL, "out of memory while writing the response");
    else c->status = 200;
}
