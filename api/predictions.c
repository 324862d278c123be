/* predictions.c - decoded top-k predictions instead of logit dumps:
 * `outputs: ["top_k"]` with `k`, and `"logit_lens": true`, on POST /v1/forward.
 *
 * Owns: which positions are read (positions if given; else a masked LM's
 * [MASK] positions, or every position when there is none / for a causal
 * LM), the softmax over the vocabulary, the top-k selection and the
 * {id, token, prob} entries with readable token text
 * (lens_tokenizer_decode: " film", not "Ġfilm"). The logit lens itself is
 * core/analysis/logit_lens.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/predictions.h"
#include "core/analysis/logit_lens.h"

#define API_TOP_K_DEFAULT 10
#define API_TOP_K_MAX 1000

int api_decode_predictions(api_call *c, const lens_model *m, int want_top_k, api_predictions *p)
{
    memset(p, 0, sizeof p[0]);
    p->top_k = want_top_k;
    p->k = API_TOP_K_DEFAULT;
    int rc = api_get_int(c, "k", 1, API_TOP_K_MAX, &p->k);
    if (rc < 0) return -1;
    if (rc > 0 && !want_top_k && !json_is_true(json_object_get(c->body, "logit_lens")))
        return api_fail(c, 422, "invalid_request", "k", "k applies to outputs \"top_k\" and logit_lens only");
    if (api_get_bool(c, "logit_lens", &p->logit_lens) < 0) return -1;
    if (p->k > m->cfg.vocab_size) p->k = m->cfg.vocab_size;
    if ((p->top_k || p->logit_lens) && !lens_has_lm_head(m))
        return api_fail(c, 422, "invalid_request", p->logit_lens ? "logit_lens" : "outputs",
                        "%s needs a model with an LM head (masked-lm or causal-lm); this one is %s",
                        p->logit_lens ? "logit_lens" : "top_k", lens_task_name(m->cfg.task));
    if ((p->top_k || p->logit_lens) && !m->tok)
        return api_fail(c, 422, "invalid_request", "model", "this model has no tokenizer to decode predictions with");
    return 0;
}

int api_prediction_rows(const lens_model *m, const int *ids, int T, const api_index_list *positions, int **rows)
{
    int n = 0;
    *rows = malloc((size_t)T * sizeof **rows);
    if (!*rows) return -1;
    if (positions->given) {
        for (int i = 0; i < positions->n; i++) (*rows)[n++] = positions->v[i];
        return n;
    }
    int mask = m->cfg.task == LENS_TASK_MASKED_LM ? lens_tokenizer_id(m->tok, "[MASK]") : -1;
    for (int t = 0; mask >= 0 && t < T; t++)
        if (ids[t] == mask) (*rows)[n++] = t;
    if (n == 0)
        for (int t = 0; t < T; t++) (*rows)[n++] = t;
    return n;
}

/* [{id, token, prob}] of the k most probable ids of one row of logits[V]. */
static void write_top(jw *w, const lens_model *m, const float *logits, int V, int k, int precision)
{
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++)
        if (logits[v] > mx) mx = logits[v];
    for (int v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
    int *best = malloc((size_t)k * sizeof *best);
    int n = 0;
    /* insertion into a sorted list of k: O(V k), k is small */
    for (int v = 0; best && v < V; v++) {
        if (n == k && logits[v] <= logits[best[n - 1]]) continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && logits[best[at - 1]] < logits[v]) best[at] = best[at - 1], at--;
        best[at] = v;
    }
    jw_arr(w);
    for (int i = 0; i < n; i++) {
        char *text = NULL;
        lens_tokenizer_decode(m->tok, &best[i], 1, 0, &text, NULL, NULL);
        jw_obj(w);
        jw_key(w, "id");
        jw_int(w, best[i]);
        jw_key(w, "token");
        jw_str(w, text);
        jw_key(w, "prob");
        jw_float(w, exp((double)logits[best[i]] - mx) / sum, precision);
        jw_end(w);
        free(text);
    }
    jw_end(w);
    free(best);
}

void api_write_top_k(jw *w, const lens_model *m, const float *logits, const int *rows, int n_rows, int k,
                     int precision)
{
    const int V = m->cfg.vocab_size;
    jw_key(w, "top_k");
    jw_arr(w);
    for (int i = 0; i < n_rows; i++) {
        jw_obj(w);
        jw_key(w, "position");
        jw_int(w, rows[i]);
        jw_key(w, "predictions");
        write_top(w, m, logits + (size_t)rows[i] * V, V, k, precision);
        jw_end(w);
    }
    jw_end(w);
}

int api_write_logit_lens(api_call *c, jw *w, const lens_model *m, const lens_activations *act, int s, const int *rows,
                         int n_rows, int k, int precision)
{
    const int C = m->cfg.d_model, V = m->cfg.vocab_size, L = m->cfg.n_layers;
    float *x = malloc((size_t)n_rows * C * sizeof *x);
    float *all = malloc((size_t)(L + 1) * n_rows * V * sizeof *all); /* [L+1][R][V] */
    lens_err err = {0};
    int rc = x && all ? 0 : lens_fail(&err, LENS_ENOMEM, "out of memory for the logit lens");
    for (int l = 0; !rc && l <= L; l++) {
        if (c->cancel && *c->cancel) {
            rc = lens_fail(&err, LENS_ECANCEL, "cancelled at layer %d", l);
            break;
        }
        const float *h = lens_act_hidden(m, act, l, s);
        for (int i = 0; i < n_rows; i++) memcpy(x + (size_t)i * C, h + (size_t)rows[i] * C, (size_t)C * sizeof *x);
        rc = lens_logit_lens(m, x, n_rows, l, all + (size_t)l * n_rows * V, c->threads, &err);
    }
    if (!rc) {
        jw_key(w, "logit_lens");
        jw_arr(w);
        for (int i = 0; i < n_rows; i++) {
            jw_obj(w);
            jw_key(w, "position");
            jw_int(w, rows[i]);
            jw_key(w, "layers");
            jw_arr(w);
            for (int l = 0; l <= L; l++) {
                jw_obj(w);
                jw_key(w, "layer");
                jw_int(w, l);
                jw_key(w, "predictions");
                write_top(w, m, all + ((size_t)l * n_rows + i) * V, V, k, precision);
                jw_end(w);
            }
            jw_end(w);
            jw_end(w);
        }
        jw_end(w);
    }
    free(x);
    free(all);
    return rc ? api_fail_core(c, &err, "text", NULL, "the logit lens") : 0;
}
