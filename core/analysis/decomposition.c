/* decomposition.c - position / context / residual decomposition of hidden
 * states, streamed over windows (Song & Zhong 2023; POST /v1/decomposition).
 *
 * Shapes: W windows of T tokens, P kept positions per window (T - 1 with
 * position 0 dropped), N = W * P kept tokens, C = d_model, K = top_k.
 *
 * Per selected layer the accumulator keeps, for the shifted states
 * x = h - s (s [C]: the mean of the layer's first batch, a fixed float
 * vector that takes the large common component out before anything is
 * squared; it cancels from every metric):
 *   pos_sum [P][C]  sum_c x[c][t]                          (double)
 *   gram    [C][C]  sum_{c,t} x x^T   (upper triangle; float ssyrk per batch, summed in double)
 *   sumsq           sum_{c,t} |x|^2                        (double)
 *   ctx_mean[W][C]  mean_t x[c][t]                         (float, the only O(W) part)
 * With m = mu - s = sum_t pos_sum[t] / N:
 *   pos[t] = pos_sum[t] / W - m,   ctx[c] = ctx_mean[c] - m,
 *   (H - mu)^T (H - mu) = gram - N m m^T                          [C][C]
 *   resid^T resid = (H - mu)^T (H - mu) - W pos^T pos - P ctx^T ctx   (cross terms are 0:
 *       sum_t pos = 0, sum_c ctx = 0, sum_c resid[c][t] = 0, sum_t resid[c][t] = 0)
 *   |tile(pos)|_op = sqrt(W) |pos|_op,  |tile(ctx)|_op = sqrt(P) |ctx|_op
 *   sum|h|^2 = sumsq + 2 s.(N m) + N |s|^2,  sum|resid|^2 = sumsq - N|m|^2 - W sum|pos|^2 - P sum|ctx|^2
 * The layers of a batch accumulate in parallel on the request's pool, one
 * layer per task with per-thread scratch (one thread sums a layer, so the
 * bits do not depend on the thread count).
 * docs/decomposition.md has the derivations and the definitions of every metric. */
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/analysis/decomposition.h"
#include "core/base/pool.h"

typedef struct {
    int layer;
    float *shift;     /* [C] s */
    double *pos_sum;  /* [P][C] */
    double *gram;     /* [C][C], upper triangle (row-major: i <= j) */
    double sumsq;
    float *ctx_mean;  /* [cap][C] */
} layer_acc;

struct lens_decomp {
    const lens_model *m;
    int T, P, first, C, n_layers;
    lens_decomp_opts opts;
    layer_acc *acc;  /* [n_layers] */
    long W, cap;
    int labels_state; /* -1 unknown (no window yet), 0 none, 1 labelled */
    int *labels;      /* [cap] */
    long *window;     /* [cap] each accumulated window's index in the run (sharding: not the local order) */
    char *seen;       /* import: [cap] window already merged */
    int shift_set;    /* every layer's shift s is taken (from the run's first batch) */
    int threads;      /* pool threads: the layers of a batch accumulate in parallel, one layer per task */
    float *rows;      /* per thread [rows_windows * P][C] shifted kept rows of one layer */
    int rows_windows;
    float *gram_batch;/* per thread [C][C] */
    int batch_windows;
};

/* ---------------------------------------------------------------- begin / free */

void lens_decomp_free(lens_decomp *a)
{
    if (!a) return;
    for (int l = 0; a->acc && l < a->n_layers; l++) {
        free(a->acc[l].shift);
        free(a->acc[l].pos_sum);
        free(a->acc[l].gram);
        free(a->acc[l].ctx_mean);
    }
    free(a->acc);
    free(a->labels);
    free(a->window);
    free(a->seen);
    free(a->rows);
    free(a->gram_batch);
    free(a);
}

/* The reference layer of hidden-state index layer, or NULL. */
static const lens_decomp_layer *reference_layer(const lens_decomp_result *ref, int layer)
{
    for (int l = 0; l < ref->n_layers; l++)
        if (ref->layers[l].layer == layer) return &ref->layers[l];
    return NULL;
}

/* A reference run must have the same T, first position and width, and every selected layer. */
static int check_reference(const lens_decomp_result *ref, const lens_config *c, int T, int first, const int *layers,
                           int n_layers, lens_err *err)
{
    if (ref->T != T || ref->first_position != first || ref->d_model != c->d_model)
        return lens_fail(err, LENS_EINVAL,
                         "the reference has windows of %d tokens from position %d (width %d); these are %d from %d (%d)",
                         ref->T, ref->first_position, ref->d_model, T, first, c->d_model);
    for (int i = 0; i < (n_layers ? n_layers : c->n_layers + 1); i++) {
        const int layer = n_layers ? layers[i] : i;
        if (!reference_layer(ref, layer))
            return lens_fail(err, LENS_EINVAL, "the reference has no layer %d", layer);
    }
    return 0;
}

lens_decomp *lens_decomp_begin(const lens_model *m, int T, const int *layers, int n_layers,
                               const lens_decomp_opts *opts, lens_err *err)
{
    const lens_config *c = &m->cfg;
    lens_decomp_opts o = opts ? *opts : (lens_decomp_opts){0};
    int first = o.keep_first_position ? 0 : 1;
    if (T < first + 2 || T > c->max_positions) {
        lens_fail(err, T > c->max_positions ? LENS_ELIMIT : LENS_EINVAL,
                  "window length %d must lie in [%d, %d] (%s)", T, first + 2, c->max_positions,
                  first ? "position 0 is dropped, at least 2 positions must remain" : "at least 2 positions");
        return NULL;
    }
    if (o.top_k < 0 || o.batch_tokens < 0 || o.windows_total < 0) {
        lens_fail(err, LENS_EINVAL, "top_k, batch_tokens and windows_total must not be negative");
        return NULL;
    }
    if (o.topics_pca < 0 || o.screenot_k < 0) {
        lens_fail(err, LENS_EINVAL, "topics_pca and screenot_k must not be negative");
        return NULL;
    }
    if (!o.top_k) o.top_k = LENS_DECOMP_DEFAULT_TOP_K;
    if (!o.screenot_k) o.screenot_k = LENS_DECOMP_SCREENOT_K;
    if (!o.batch_tokens) o.batch_tokens = LENS_DECOMP_DEFAULT_BATCH_TOKENS;
    if (n_layers < 0 || (n_layers > 0 && !layers)) {
        lens_fail(err, LENS_EINVAL, "layers: %d given without a list", n_layers);
        return NULL;
    }
    int all = c->n_layers + 1;
    for (int i = 0; i < n_layers; i++) {
        if (layers[i] < 0 || layers[i] > c->n_layers) {
            lens_fail(err, LENS_EINVAL, "layer %d is outside [0, %d] (0 = embeddings, %d = last block)", layers[i],
                      c->n_layers, c->n_layers);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (layers[j] == layers[i]) {
                lens_fail(err, LENS_EINVAL, "layer %d is listed twice", layers[i]);
                return NULL;
            }
    }

    if (o.reference && check_reference(o.reference, c, T, first, layers, n_layers, err)) return NULL;

    lens_decomp *a = calloc(1, sizeof *a);
    if (!a) goto oom;
    a->m = m, a->T = T, a->first = first, a->P = T - first, a->C = c->d_model, a->opts = o;
    a->n_layers = n_layers ? n_layers : all;
    a->labels_state = -1;
    a->batch_windows = o.batch_tokens / T > 0 ? o.batch_tokens / T : 1;
    a->threads = lens_pool_threads(o.pool);
    const size_t C = (size_t)a->C, P = (size_t)a->P;
    a->acc = calloc((size_t)a->n_layers, sizeof *a->acc);
    a->gram_batch = malloc(a->threads * C * C * sizeof(float));
    if (!a->acc || !a->gram_batch) goto oom;
    for (int l = 0; l < a->n_layers; l++) {
        layer_acc *la = &a->acc[l];
        la->layer = n_layers ? layers[l] : l;
        la->shift = calloc(C, sizeof(float));
        la->pos_sum = calloc(P * C, sizeof(double));
        la->gram = calloc(C * C, sizeof(double));
        if (!la->shift || !la->pos_sum || !la->gram) goto oom;
    }
    return a;
oom:
    lens_decomp_free(a);
    lens_fail(err, LENS_ENOMEM, "out of memory for the decomposition accumulators");
    return NULL;
}

long lens_decomp_windows_done(const lens_decomp *a) { return a->W; }

/* ---------------------------------------------------------------- accumulate */

static int grow(lens_decomp *a, long need)
{
    if (need <= a->cap) return 0;
    long cap = a->cap ? a->cap : 64;
    while (cap < need) cap *= 2;
    for (int l = 0; l < a->n_layers; l++) {
        float *p = realloc(a->acc[l].ctx_mean, (size_t)cap * a->C * sizeof(float));
        if (!p) return -1;
        a->acc[l].ctx_mean = p;
    }
    int *lab = realloc(a->labels, (size_t)cap * sizeof(int));
    if (!lab) return -1;
    a->labels = lab;
    long *win = realloc(a->window, (size_t)cap * sizeof(long));
    if (!win) return -1;
    a->window = win;
    a->cap = cap;
    return 0;
}

/* s = mean of the run's first batch's kept rows. hidden: [S][T][C]. */
static void set_shift(const lens_decomp *a, layer_acc *la, const float *hidden, int S)
{
    const int C = a->C, P = a->P, T = a->T;
    double *mean = calloc((size_t)C, sizeof(double));
    if (!mean) return; /* s stays 0: correct, only less well conditioned */
    for (int s = 0; s < S; s++)
        for (int t = a->first; t < T; t++) {
            const float *h = hidden + ((size_t)s * T + t) * C;
            for (int i = 0; i < C; i++) mean[i] += h[i];
        }
    for (int i = 0; i < C; i++) la->shift[i] = (float)(mean[i] / ((double)S * P));
    free(mean);
}

/* One layer of one batch. hidden: [S][T][C] of this layer; rows and
 * gram_batch: the calling thread's scratch. */
static void accumulate_layer(const lens_decomp *a, layer_acc *la, const float *hidden, int S, float *rows,
                             float *gram_batch)
{
    const int C = a->C, P = a->P, T = a->T;
    if (!a->shift_set) set_shift(a, la, hidden, S);
    const float *shift = la->shift;
    for (int s = 0; s < S; s++) {
        float *ctx = la->ctx_mean + (size_t)(a->W + s) * C;
        double ctx_sum[C > 0 ? C : 1];
        memset(ctx_sum, 0, sizeof ctx_sum);
        for (int t = 0; t < P; t++) {
            const float *h = hidden + ((size_t)s * T + t + a->first) * C;
            float *x = rows + ((size_t)s * P + t) * C;
            double *ps = la->pos_sum + (size_t)t * C;
            double sq = 0;
            for (int i = 0; i < C; i++) {
                x[i] = h[i] - shift[i];
                ps[i] += x[i];
                ctx_sum[i] += x[i];
                sq += (double)x[i] * x[i];
            }
            la->sumsq += sq;
        }
        for (int i = 0; i < C; i++) ctx[i] = (float)(ctx_sum[i] / P);
    }
    /* gram_batch = X^T X over the S*P kept rows, upper triangle */
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, C, S * P, 1.0f, rows, C, 0.0f, gram_batch, C);
    for (int i = 0; i < C; i++) {
        double *g = la->gram + (size_t)i * C;
        const float *gb = gram_batch + (size_t)i * C;
        for (int j = i; j < C; j++) g[j] += gb[j];
    }
}

typedef struct {
    lens_decomp *a;
    const lens_activations *act;
    int S;
} accumulate_job;

/* Task l: layer l of the batch, on this pool thread's scratch. Each
 * layer is summed by one thread in one order: the same bits whatever the
 * thread count. */
static void accumulate_task(void *ctx, int l)
{
    const accumulate_job *j = ctx;
    lens_decomp *a = j->a;
    const size_t thread = (size_t)lens_pool_thread_index(), C = (size_t)a->C;
    accumulate_layer(a, &a->acc[l], lens_act_hidden(a->m, j->act, a->acc[l].layer, 0), j->S,
                     a->rows + thread * a->rows_windows * a->P * C, a->gram_batch + thread * C * C);
}

int lens_decomp_add(lens_decomp *a, const int *ids, const int *labels, int n_windows, lens_err *err)
{
    if (n_windows < 0 || (n_windows > 0 && !ids)) return lens_fail(err, LENS_EINVAL, "no windows given");
    if (n_windows == 0) return 0;
    int labelled = labels != NULL;
    if (a->labels_state >= 0 && a->labels_state != labelled)
        return lens_fail(err, LENS_EINVAL, "labels must be given for every window or for none");
    a->labels_state = labelled;

    const int batch = n_windows < a->batch_windows ? n_windows : a->batch_windows;
    if (batch > a->rows_windows) {
        float *rows = realloc(a->rows, (size_t)a->threads * batch * a->P * a->C * sizeof(float));
        if (!rows) return lens_fail(err, LENS_ENOMEM, "out of memory for a batch of %d windows", batch);
        a->rows = rows, a->rows_windows = batch;
    }
    int *lengths = malloc((size_t)batch * sizeof(int));
    if (!lengths) return lens_fail(err, LENS_ENOMEM, "out of memory for a batch of %d windows", batch);
    for (int s = 0; s < batch; s++) lengths[s] = a->T;
    int rc = 0;
    lens_forward_opts fo = {.keep = LENS_KEEP_HIDDEN, .cancel = a->opts.cancel, .pool = a->opts.pool,
                            .causal = a->opts.causal};
    const int shards = a->opts.shard_count > 1 ? a->opts.shard_count : 1;
    for (int start = 0, b = 0; start < n_windows && rc == 0; start += batch, b++) {
        const int mine = b % shards == a->opts.shard_index;
        if (!mine && (a->shift_set || b > 0)) continue; /* another shard's batch: only batch 0's shift is needed */
        if (lens_cancelled(a->opts.cancel)) {
            rc = lens_fail(err, LENS_ECANCEL, "decomposition cancelled after %ld windows", a->W);
            break;
        }
        int S = n_windows - start < batch ? n_windows - start : batch;
        lens_batch fb = {.n_seqs = S, .lengths = lengths, .ids = ids + (size_t)start * a->T};
        lens_activations act;
        memset(&act, 0, sizeof act);
        if (lens_forward(a->m, &fb, &fo, &act, err) != 0) {
            lens_activations_free(&act);
            if (err && err->code == LENS_ECANCEL)
                lens_fail(err, LENS_ECANCEL, "decomposition cancelled after %ld windows", a->W);
            rc = -1;
            break;
        }
        if (!mine) { /* batch 0 of another shard: the shift only */
            for (int l = 0; l < a->n_layers; l++) set_shift(a, &a->acc[l], lens_act_hidden(a->m, &act, a->acc[l].layer, 0), S);
            a->shift_set = 1;
            lens_activations_free(&act);
            continue;
        }
        if (grow(a, a->W + S) != 0) {
            lens_activations_free(&act);
            rc = lens_fail(err, LENS_ENOMEM, "out of memory for %ld context means", a->W + S);
            break;
        }
        accumulate_job job = {.a = a, .act = &act, .S = S};
        lens_pool_run(a->opts.pool, a->n_layers, accumulate_task, &job);
        lens_activations_free(&act);
        a->shift_set = 1;
        for (int s = 0; s < S; s++) {
            a->labels[a->W + s] = labelled ? labels[start + s] : 0;
            a->window[a->W + s] = start + s;
        }
        a->W += S;
        if (a->opts.progress) a->opts.progress(a->opts.progress_user, a->W, a->opts.windows_total);
    }
    free(lengths);
    return rc;
}

/* ---------------------------------------------------------------- shards */

static void tensor_name(char *out, size_t size, const char *prefix, const char *what, int layer)
{
    if (layer < 0) snprintf(out, size, "%s%s", prefix, what);
    else snprintf(out, size, "%slayer%d.%s", prefix, layer, what);
}

int lens_decomp_export(const lens_decomp *a, lens_partial *p, const char *prefix, lens_err *err)
{
    const size_t C = (size_t)a->C, P = (size_t)a->P, W = (size_t)a->W;
    double *buf = malloc(sizeof(double) * (C * C > W * C ? C * C : W * C) + sizeof(double));
    int64_t *idx = malloc(sizeof(int64_t) * (W ? W : 1));
    char name[64];
    int rc = buf && idx ? 0 : lens_fail(err, LENS_ENOMEM, "out of memory exporting the decomposition");
    for (size_t w = 0; !rc && w < W; w++) idx[w] = a->window[w];
    tensor_name(name, sizeof name, prefix, "windows", -1);
    if (!rc) rc = lens_partial_add(p, name, LENS_PT_I64, (int64_t)W, idx, err);
    for (size_t w = 0; !rc && w < W; w++) idx[w] = a->labels[w];
    tensor_name(name, sizeof name, prefix, "labels", -1);
    if (!rc) rc = lens_partial_add(p, name, LENS_PT_I64, a->labels_state == 1 ? (int64_t)W : 0, idx, err);
    for (int l = 0; l < a->n_layers && !rc; l++) {
        const layer_acc *la = &a->acc[l];
        for (size_t i = 0; i < C; i++) buf[i] = la->shift[i];
        tensor_name(name, sizeof name, prefix, "shift", la->layer);
        rc = lens_partial_add(p, name, LENS_PT_F64, (int64_t)C, buf, err);
        tensor_name(name, sizeof name, prefix, "pos_sum", la->layer);
        if (!rc) rc = lens_partial_add(p, name, LENS_PT_F64, (int64_t)(P * C), la->pos_sum, err);
        tensor_name(name, sizeof name, prefix, "gram", la->layer);
        if (!rc) rc = lens_partial_add(p, name, LENS_PT_F64, (int64_t)(C * C), la->gram, err);
        tensor_name(name, sizeof name, prefix, "sumsq", la->layer);
        if (!rc) rc = lens_partial_add(p, name, LENS_PT_F64, 1, &la->sumsq, err);
        for (size_t i = 0; i < W * C; i++) buf[i] = la->ctx_mean[i];
        tensor_name(name, sizeof name, prefix, "ctx_mean", la->layer);
        if (!rc) rc = lens_partial_add(p, name, LENS_PT_F64, (int64_t)(W * C), buf, err);
    }
    free(buf), free(idx);
    return rc;
}

/* The tensor prefix+what (of layer, or -1) with length elements, or NULL (err). */
static const void *get(const lens_partial *p, const char *prefix, const char *what, int layer, lens_pt_dtype dt,
                       int64_t length, lens_err *err)
{
    char name[64];
    tensor_name(name, sizeof name, prefix, what, layer);
    return lens_partial_get(p, name, dt, length, err);
}

int lens_decomp_import(lens_decomp *a, const lens_partial *p, const char *prefix, long windows_total, lens_err *err)
{
    const size_t C = (size_t)a->C, P = (size_t)a->P;
    char name[64];
    tensor_name(name, sizeof name, prefix, "windows", -1);
    const lens_pt_tensor *wt = lens_partial_find(p, name);
    tensor_name(name, sizeof name, prefix, "labels", -1);
    const lens_pt_tensor *lt = lens_partial_find(p, name);
    if (!wt || !lt || wt->dtype != LENS_PT_I64 || lt->dtype != LENS_PT_I64 ||
        (lt->length != 0 && lt->length != wt->length))
        return lens_fail(err, LENS_EFORMAT, "partial has no %swindows and %slabels of one length", prefix, prefix);
    const int64_t k = wt->length;
    const int64_t *win = wt->data, *lab = lt->data;
    const int labelled = lt->length > 0;
    if (windows_total < 0 || grow(a, windows_total) != 0 || !(a->seen || (a->seen = calloc((size_t)a->cap, 1))))
        return lens_fail(err, LENS_ENOMEM, "out of memory for %ld context means", windows_total);
    if (k > 0) { /* a shard without windows says nothing about labels */
        if (a->labels_state >= 0 && a->labels_state != labelled)
            return lens_fail(err, LENS_EFORMAT, "partials disagree on whether windows are labelled");
        a->labels_state = labelled;
    }
    for (int64_t w = 0; w < k; w++)
        if (win[w] < 0 || win[w] >= windows_total || a->seen[win[w]])
            return lens_fail(err, LENS_EFORMAT, "window %lld is out of range or in two partials", (long long)win[w]);
    for (int l = 0; l < a->n_layers; l++) {
        layer_acc *la = &a->acc[l];
        const double *shift = get(p, prefix, "shift", la->layer, LENS_PT_F64, (int64_t)C, err);
        const double *pos = shift ? get(p, prefix, "pos_sum", la->layer, LENS_PT_F64, (int64_t)(P * C), err) : NULL;
        const double *gram = pos ? get(p, prefix, "gram", la->layer, LENS_PT_F64, (int64_t)(C * C), err) : NULL;
        const double *sq = gram ? get(p, prefix, "sumsq", la->layer, LENS_PT_F64, 1, err) : NULL;
        const double *ctx = sq ? get(p, prefix, "ctx_mean", la->layer, LENS_PT_F64, k * (int64_t)C, err) : NULL;
        if (!ctx) return -1;
        for (size_t i = 0; i < C; i++) {
            if (a->shift_set && (float)shift[i] != la->shift[i])
                return lens_fail(err, LENS_EFORMAT, "layer %d: the partials' shifts differ (not shards of one run)",
                                 la->layer);
            la->shift[i] = (float)shift[i];
        }
        for (size_t i = 0; i < P * C; i++) la->pos_sum[i] += pos[i];
        for (size_t i = 0; i < C * C; i++) la->gram[i] += gram[i];
        la->sumsq += sq[0];
        for (int64_t w = 0; w < k; w++)
            for (size_t i = 0; i < C; i++) la->ctx_mean[(size_t)win[w] * C + i] = (float)ctx[(size_t)w * C + i];
    }
    a->shift_set = 1;
    for (int64_t w = 0; w < k; w++) {
        a->seen[win[w]] = 1;
        a->labels[win[w]] = labelled ? (int)lab[w] : 0;
        a->window[win[w]] = win[w];
    }
    a->W = windows_total; /* lens_decomp_complete checks every window came */
    return 0;
}

int lens_decomp_complete(lens_decomp *a, lens_err *err)
{
    for (long w = 0; w < a->W; w++)
        if (!a->seen || !a->seen[w]) return lens_fail(err, LENS_EFORMAT, "window %ld is in no partial", w);
    if (a->labels_state < 0) a->labels_state = 0;
    return 0;
}

/* ---------------------------------------------------------------- spectra */

/* Full symmetric copy of the upper triangle of g [n][n]. */
static void symmetrize(double *g, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) g[(size_t)i * n + j] = g[(size_t)j * n + i];
}

/* The k largest eigenvalues (descending) and, when vecs != NULL, their
 * eigenvectors vecs [k][n] (one per row) of the symmetric a [n][n] (upper
 * triangle used, a destroyed). */
static int top_eigen(double *a, int n, int k, double *vals, double *vecs, lens_err *err)
{
    lapack_int found = 0;
    double w[n];
    lapack_int isuppz[2 * n];
    double *z = vecs ? malloc((size_t)n * k * sizeof(double)) : NULL;
    if (vecs && !z) return lens_fail(err, LENS_ENOMEM, "out of memory for eigenvectors");
    lapack_int info = LAPACKE_dsyevr(LAPACK_ROW_MAJOR, vecs ? 'V' : 'N', 'I', 'U', n, a, n, 0, 0, n - k + 1, n, 0,
                                     &found, w, z ? z : w, z ? k : 1, isuppz);
    if (info != 0 || found != k) {
        free(z);
        return lens_fail(err, LENS_EINVAL, "eigenvalue solver failed (dsyevr info %d, %d of %d found)", (int)info,
                         (int)found, k);
    }
    for (int i = 0; i < k; i++) { /* dsyevr returns ascending */
        vals[i] = w[k - 1 - i];
        if (vecs)
            for (int r = 0; r < n; r++) vecs[(size_t)i * n + r] = z[(size_t)r * k + (k - 1 - i)];
    }
    free(z);
    return 0;
}

/* Largest eigenvalue of the symmetric positive semi-definite a [n][n] (upper
 * triangle used, not modified) by Lanczos with full re-orthogonalisation:
 * O(n^2) per step instead of the O(n^3) tridiagonal reduction of a full
 * eigensolver (13 layers x 2 matrices of 768 x 768 took seconds). Stops when
 * the Ritz value's residual bound beta_j |s_j| falls below 1e-13 of it (or the
 * Krylov space is exhausted), so the result is a LAPACK-accurate lambda_max. */
static double dot(const double *x, const double *y, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

static int top_eigenvalue(const double *a, int n, double *lambda, lens_err *err)
{
    const int max_steps = n < 300 ? n : 300;
    double *q = malloc((size_t)(max_steps + 1) * n * sizeof(double)); /* [steps + 1][n] Lanczos vectors */
    double *w = malloc((size_t)n * sizeof(double)), *coef = malloc((size_t)(max_steps + 1) * sizeof(double));
    double *alpha = malloc((size_t)max_steps * sizeof(double)), *beta = malloc((size_t)max_steps * sizeof(double));
    double *d = malloc((size_t)max_steps * sizeof(double)), *e = malloc((size_t)max_steps * sizeof(double));
    double *z = malloc((size_t)max_steps * max_steps * sizeof(double));
    if (!q || !w || !coef || !alpha || !beta || !d || !e || !z) {
        free(q), free(w), free(coef), free(alpha), free(beta), free(d), free(e), free(z);
        return lens_fail(err, LENS_ENOMEM, "out of memory for an eigenvalue of %d x %d", n, n);
    }
    uint32_t x = 2463534242u; /* fixed start vector: results are reproducible */
    double norm = 0;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        q[i] = (double)x / 4294967296.0 - 0.5;
        norm += q[i] * q[i];
    }
    for (int i = 0; i < n; i++) q[i] /= sqrt(norm);
    double best = 0;
    int rc = 0;
    for (int j = 0; j < max_steps; j++) {
        double *qj = q + (size_t)j * n;
        cblas_dsymv(CblasRowMajor, CblasUpper, n, 1.0, a, n, qj, 1, 0.0, w, 1);
        alpha[j] = dot(qj, w, n);
        for (int pass = 0; pass < 2; pass++) { /* w -= Q Q^T w, twice ("twice is enough") */
            cblas_dgemv(CblasRowMajor, CblasNoTrans, j + 1, n, 1.0, q, n, w, 1, 0.0, coef, 1);
            cblas_dgemv(CblasRowMajor, CblasTrans, j + 1, n, -1.0, q, n, coef, 1, 1.0, w, 1);
        }
        beta[j] = sqrt(dot(w, w, n));
        int last = j + 1 == max_steps || !(beta[j] > 1e-300);
        if (last || j % 8 == 7) {
            memcpy(d, alpha, (size_t)(j + 1) * sizeof(double));
            memcpy(e, beta, (size_t)j * sizeof(double));
            lapack_int info = LAPACKE_dstev(LAPACK_ROW_MAJOR, 'V', j + 1, d, e, z, j + 1);
            if (info != 0) {
                rc = lens_fail(err, LENS_EINVAL, "tridiagonal eigensolver failed (dstev info %d)", (int)info);
                break;
            }
            best = d[j]; /* ascending */
            double bound = fabs(beta[j] * z[(size_t)j * (j + 1) + j]);
            if (last || bound <= 1e-13 * fabs(best)) break;
        }
        for (int i = 0; i < n; i++) q[(size_t)(j + 1) * n + i] = w[i] / beta[j];
    }
    *lambda = best;
    free(q), free(w), free(coef), free(alpha), free(beta), free(d), free(e), free(z);
    return rc;
}

/* ---------------------------------------------------------------- ScreeNOT */

/* Psi_gamma(y; z) = y D'(y) / D(y) of Donoho, Gavish & Romanov for the
 * counting measure of z [n]: Phi(y) = mean y / (y^2 - z^2),
 * D(y) = Phi (gamma Phi + (1 - gamma) / y). Increasing in y > max z. */
static double screenot_psi(double y, const double *z, int n, double gamma)
{
    double phi = 0, phid = 0;
    for (int i = 0; i < n; i++) {
        const double d = y * y - z[i] * z[i];
        phi += y / d;
        phid -= (y * y + z[i] * z[i]) / (d * d);
    }
    phi /= n, phid /= n;
    const double d = phi * (gamma * phi + (1 - gamma) / y);
    const double dd = phid * (gamma * phi + (1 - gamma) / y) + phi * (gamma * phid - (1 - gamma) / (y * y));
    return y * dd / d;
}

/* The optimal threshold is the root of Psi = -4 above the noise bulk z: the
 * bulk is the singular values with the top k replaced by the imputation
 * z_(n-l+1) = z_(n-k) + a_l (z_(n-k) - z_(n-2k)), a_l = (1 - ((l-1)/k)^(2/3)) / (2^(2/3) - 1);
 * bracketing from max z + 2 and bisection to 1e-5 as the authors' package
 * (eladromanov/ScreeNOT, adaptiveHardThresholding with strategy "i"). */
int lens_screenot(const double *sv, int n, int rows, int cols, int k, double *threshold)
{
    *threshold = 0;
    if (k < 0 || 2 * k + 1 >= n) return -1;
    double z[n]; /* ascending */
    for (int i = 0; i < n; i++) z[i] = sv[n - 1 - i];
    const double diff = z[n - k - 1] - z[n - 2 * k - 1];
    for (int l = 1; l <= k; l++)
        z[n - l] = z[n - k - 1] + (1 - pow((l - 1) / (double)k, 2.0 / 3)) / (pow(2.0, 2.0 / 3) - 1) * diff;
    double low = z[0];
    for (int i = 1; i < n; i++) low = z[i] > low ? z[i] : low;
    const double gamma = rows < cols ? (double)rows / cols : (double)cols / rows;
    double high = low + 2.0, mid = high;
    while (screenot_psi(high, z, n, gamma) < -4) low = high, high *= 2;
    while (high - low > 1e-5) {
        mid = (high + low) / 2;
        if (screenot_psi(mid, z, n, gamma) < -4) low = mid;
        else high = mid;
    }
    int r = 0;
    for (int i = 0; i < n; i++) r += sv[i] > mid;
    *threshold = mid;
    return r;
}

/* ---------------------------------------------------------------- finish */

typedef struct {
    double *pos;      /* [P][C] */
    double *ctx;      /* [W][C] */
    double *hc;       /* [C][C] (H-mu)^T (H-mu) */
    double *work;     /* [C][C] */
    double *ctx_gram; /* [C][C] ctx^T ctx */
    double *pos_gram; /* [P][P] pos pos^T, then its eigenvectors */
    double *ctx_unit; /* [W][C] ctx rows / |ctx| */
    double *pos_unit; /* [P][C] */
    double *block;    /* [64][max(W,P)] cosines of one block of rows */
    double *dct;      /* [P][P] */
} finish_scratch;

static void scratch_free(finish_scratch *s)
{
    free(s->pos), free(s->ctx), free(s->hc), free(s->work), free(s->ctx_gram), free(s->pos_gram);
    free(s->ctx_unit), free(s->pos_unit), free(s->block), free(s->dct);
}

#define COS_BLOCK 64

static void unit_rows(const double *x, double *u, long rows, int C)
{
    for (long r = 0; r < rows; r++) {
        double n = sqrt(dot(x + r * C, x + r * C, C));
        double inv = n > 0 ? 1.0 / n : 0.0;
        for (int i = 0; i < C; i++) u[r * C + i] = x[r * C + i] * inv;
    }
}

/* Singular values s (descending, >= 0) and left singular vectors of pos from
 * the eigen-decomposition of pos pos^T [P][P]: u_j = column j of vecs. */
static int pos_spectrum(finish_scratch *s, int P, int C, double *sv, lens_err *err)
{
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, P, C, 1.0, s->pos, C, 0.0, s->pos_gram, P);
    symmetrize(s->pos_gram, P);
    memcpy(s->work, s->pos_gram, (size_t)P * P * sizeof(double)); /* keep the Gram for smoothness */
    double w[P];
    lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', P, s->work, P, w);
    if (info != 0) return lens_fail(err, LENS_EINVAL, "eigenvalue solver failed on pos (dsyevd info %d)", (int)info);
    for (int j = 0; j < P; j++) sv[j] = sqrt(w[P - 1 - j] > 0 ? w[P - 1 - j] : 0);
    return 0;
}

/* u_j [P] of the j-th largest singular value: column P-1-j of the eigenvectors in s->work. */
static double pos_u(const finish_scratch *s, int P, int j, int t) { return s->work[(size_t)t * P + (P - 1 - j)]; }

static double smoothness(finish_scratch *s, int P)
{
    /* cos(pos_i, pos_j) from the Gram; F = D G D^T with the orthonormal DCT-II
     * D[k][i] = a_k cos(pi k (2i+1) / 2P), a_0 = sqrt(1/P), a_k = sqrt(2/P). */
    double *g = s->pos_gram, *tmp = s->ctx_gram; /* ctx_gram is free again here, P*P <= ... see finish */
    double dg[P];
    for (int i = 0; i < P; i++) dg[i] = g[(size_t)i * P + i] > 0 ? 1.0 / sqrt(g[(size_t)i * P + i]) : 0;
    for (int i = 0; i < P; i++)
        for (int j = 0; j < P; j++) g[(size_t)i * P + j] *= dg[i] * dg[j];
    for (int k = 0; k < P; k++)
        for (int i = 0; i < P; i++)
            s->dct[(size_t)k * P + i] = (k ? sqrt(2.0 / P) : sqrt(1.0 / P)) * cos(M_PI * k * (2 * i + 1) / (2.0 * P));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, P, P, P, 1.0, s->dct, P, g, P, 0.0, tmp, P);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, P, P, P, 1.0, tmp, P, s->dct, P, 0.0, g, P);
    int K = (P + 9) / 10;
    double low = 0, all = 0;
    for (int k = 0; k < P; k++)
        for (int l = 0; l < P; l++) {
            double e = g[(size_t)k * P + l] * g[(size_t)k * P + l];
            all += e;
            if (k < K && l < K) low += e;
        }
    return all > 0 ? low / all : 0;
}

/* Mean |cos| of the rows of u [W][dim] (unit or zero) over pairs of equal /
 * different label. Without self-pairs: pairs a < b. With them, as the
 * released avg_similarity_within: all ordered pairs (a, b) of equal label,
 * a == b included (so (2 S + W) / (2 p + W)); between is the same either way. */
static void topic_means(const lens_decomp *a, const double *u, int dim, double *block, lens_decomp_layer *out)
{
    const long W = a->W;
    double within = 0, between = 0;
    long nw = 0, nbw = 0;
    for (long c0 = 0; c0 < W; c0 += COS_BLOCK) {
        int nb = W - c0 < COS_BLOCK ? (int)(W - c0) : COS_BLOCK;
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, (int)W, dim, 1.0, u + c0 * dim, dim, u, dim, 0.0,
                    block, (int)W);
        for (int r = 0; r < nb; r++)
            for (long b = c0 + r + 1; b < W; b++) {
                double v = fabs(block[(size_t)r * W + b]);
                if (a->labels[c0 + r] == a->labels[b]) within += v, nw++;
                else between += v, nbw++;
            }
    }
    if (a->opts.topics_self_pairs) {
        double self = 0;
        for (long c = 0; c < W; c++) self += dot(u + c * dim, u + c * dim, dim) > 0.5; /* 1, or 0 for a zero row */
        within = 2 * within + self, nw = 2 * nw + W;
    }
    out->topics_within = nw ? within / nw : 0;
    out->topics_between = nbw ? between / nbw : 0;
    out->topics_within_pairs = nw, out->topics_between_pairs = nbw;
}

/* Topic cosines of ctx, or of its coordinates on the top topics_pca principal
 * axes (ctx V_k, V_k the top right singular vectors of ctx, which is not
 * re-centred: the released code takes svd(c) of the context means as they are). */
static int topics(const lens_decomp *a, finish_scratch *s, lens_decomp_layer *out, lens_err *err)
{
    const int C = a->C;
    const long W = a->W;
    int k = a->opts.topics_pca;
    if (k > C) k = C;
    if (k > W) k = (int)W;
    if (k <= 0) {
        topic_means(a, s->ctx_unit, C, s->block, out);
        return 0;
    }
    double *vecs = malloc((size_t)k * C * sizeof(double)), *coords = malloc((size_t)W * k * sizeof(double));
    double *vals = malloc((size_t)k * sizeof(double));
    int rc = vecs && coords && vals ? 0 : lens_fail(err, LENS_ENOMEM, "out of memory for the topic PCA");
    if (!rc) { /* s->work and s->ctx_gram are free again here */
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, C, (int)W, 1.0, s->ctx, C, 0.0, s->work, C);
        rc = top_eigen(s->work, C, k, vals, vecs, err);
    }
    if (!rc) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)W, k, C, 1.0, s->ctx, C, vecs, C, 0.0, coords, k);
        unit_rows(coords, coords, W, k);
        topic_means(a, coords, k, s->block, out);
    }
    free(vecs), free(coords), free(vals);
    return rc;
}

static int finish_layer(lens_decomp *a, layer_acc *la, finish_scratch *s, lens_decomp_layer *out, lens_err *err)
{
    const int C = a->C, P = a->P;
    const long W = a->W;
    const double N = (double)W * P;
    out->layer = la->layer;
    out->mean = malloc((size_t)C * sizeof(double));
    out->pos = malloc((size_t)P * C * sizeof(double));
    out->pos_pca = malloc((size_t)P * 2 * sizeof(float));
    if (!out->mean || !out->pos || !out->pos_pca) return lens_fail(err, LENS_ENOMEM, "out of memory for results");

    /* m = mu - s, pos, ctx */
    double m[C];
    memset(m, 0, sizeof m);
    for (int t = 0; t < P; t++)
        for (int i = 0; i < C; i++) m[i] += la->pos_sum[(size_t)t * C + i];
    for (int i = 0; i < C; i++) m[i] /= N;
    for (int t = 0; t < P; t++)
        for (int i = 0; i < C; i++) s->pos[(size_t)t * C + i] = la->pos_sum[(size_t)t * C + i] / W - m[i];
    for (long c = 0; c < W; c++)
        for (int i = 0; i < C; i++) s->ctx[c * C + i] = la->ctx_mean[c * C + i] - m[i];
    for (int i = 0; i < C; i++) out->mean[i] = la->shift[i] + m[i];
    memcpy(out->pos, s->pos, (size_t)P * C * sizeof(double));

    /* variance shares */
    double ss_pos = 0, ss_ctx = 0, sum_x_dot_s = 0, s2 = 0;
    for (int t = 0; t < P; t++) ss_pos += dot(s->pos + (size_t)t * C, s->pos + (size_t)t * C, C);
    for (long c = 0; c < W; c++) ss_ctx += dot(s->ctx + c * C, s->ctx + c * C, C);
    ss_pos *= W, ss_ctx *= P;
    for (int i = 0; i < C; i++) sum_x_dot_s += (double)la->shift[i] * m[i] * N, s2 += (double)la->shift[i] * la->shift[i];
    double ss_centered = la->sumsq - N * dot(m, m, C);
    double ss_total = la->sumsq + 2 * sum_x_dot_s + N * s2;
    double ss_mean = N * dot(out->mean, out->mean, C);
    double ss_resid = ss_centered - ss_pos - ss_ctx;
    out->share_mean = ss_total > 0 ? ss_mean / ss_total : 0;
    out->share_pos = ss_total > 0 ? ss_pos / ss_total : 0;
    out->share_ctx = ss_total > 0 ? ss_ctx / ss_total : 0;
    out->share_resid = ss_total > 0 ? ss_resid / ss_total : 0;

    /* Grams [C][C] (upper triangles): hc = gram - N m m^T, ctx^T ctx, resid = hc - W pos^T pos - P ctx^T ctx */
    for (int i = 0; i < C; i++)
        for (int j = i; j < C; j++) s->hc[(size_t)i * C + j] = la->gram[(size_t)i * C + j] - N * m[i] * m[j];
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, C, (int)W, 1.0, s->ctx, C, 0.0, s->ctx_gram, C);
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, C, P, 1.0, s->pos, C, 0.0, s->work, C);
    for (int i = 0; i < C; i++)
        for (int j = i; j < C; j++) {
            size_t k = (size_t)i * C + j;
            s->work[k] = s->hc[k] - (double)W * s->work[k] - (double)P * s->ctx_gram[k];
        }
    double lam_resid, lam_h;
    if (top_eigenvalue(s->work, C, &lam_resid, err) != 0) return -1;
    if (top_eigenvalue(s->hc, C, &lam_h, err) != 0) return -1;

    /* From here on pos and ctx may be measured against a reference run's pos and mu */
    const lens_decomp_layer *ref = a->opts.reference ? reference_layer(a->opts.reference, la->layer) : NULL;
    if (ref) {
        memcpy(s->pos, ref->pos, (size_t)P * C * sizeof(double));
        memcpy(out->pos, ref->pos, (size_t)P * C * sizeof(double));
        for (long c = 0; c < W; c++)
            for (int i = 0; i < C; i++)
                s->ctx[c * C + i] = (double)la->ctx_mean[c * C + i] + la->shift[i] - ref->mean[i];
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, C, (int)W, 1.0, s->ctx, C, 0.0, s->ctx_gram, C);
    }

    /* ctx: top-K right singular vectors and |ctx|_op from ctx^T ctx */
    int K = a->opts.top_k;
    if (K > P - 1) K = P - 1; /* pos has rank <= P - 1 (its rows sum to 0) */
    if (K > W - 1) K = (int)(W - 1);
    if (K > C) K = C;
    /* from ctx ctx^T [W][W] when W < C (v_j = ctx^T u_j / s_j), else from ctx^T ctx [C][C] */
    const int Kc = K > 0 ? K : 1;
    double ctx_vals[Kc];
    double *ctx_vecs = malloc((size_t)Kc * C * sizeof(double));
    if (!ctx_vecs) return lens_fail(err, LENS_ENOMEM, "out of memory for ctx subspace");
    if (W < C) {
        double *small = s->ctx_unit, *u = s->pos_unit; /* both free until the cosines below: W*W <= W*C, Kc*W <= P*C */
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)W, C, 1.0, s->ctx, C, 0.0, small, (int)W);
        if (Kc * W > (long)P * C) u = malloc((size_t)Kc * W * sizeof(double));
        int rc = u ? top_eigen(small, (int)W, Kc, ctx_vals, u, err) : lens_fail(err, LENS_ENOMEM, "out of memory");
        for (int j = 0; rc == 0 && j < Kc; j++) {
            double sj = sqrt(ctx_vals[j] > 0 ? ctx_vals[j] : 0);
            cblas_dgemv(CblasRowMajor, CblasTrans, (int)W, C, sj > 0 ? 1.0 / sj : 0.0, s->ctx, C, u + (size_t)j * W,
                        1, 0.0, ctx_vecs + (size_t)j * C, 1);
        }
        if (u != s->pos_unit) free(u);
        if (rc != 0) {
            free(ctx_vecs);
            return -1;
        }
    } else if (top_eigen(s->ctx_gram, C, Kc, ctx_vals, ctx_vecs, err) != 0) {
        free(ctx_vecs);
        return -1;
    }

    /* pos: singular values, stable rank, explained ratios, PCA, right singular vectors */
    double sv[P];
    if (pos_spectrum(s, P, C, sv, err) != 0) {
        free(ctx_vecs);
        return -1;
    }
    double sum_s = 0, sum_s2 = 0, k2 = 0, k10 = 0, k2sq = 0, k10sq = 0;
    for (int j = 0; j < P; j++) {
        sum_s += sv[j], sum_s2 += sv[j] * sv[j];
        if (j < 2) k2 += sv[j], k2sq += sv[j] * sv[j];
        if (j < 10) k10 += sv[j], k10sq += sv[j] * sv[j];
    }
    out->pos_stable_rank = sv[0] > 0 ? sum_s2 / (sv[0] * sv[0]) : 0;
    out->pos_explained_k2 = sum_s > 0 ? k2 / sum_s : 0;
    out->pos_explained_k10 = sum_s > 0 ? k10 / sum_s : 0;
    out->pos_explained_k2_sq = sum_s2 > 0 ? k2sq / sum_s2 : 0;
    out->pos_explained_k10_sq = sum_s2 > 0 ? k10sq / sum_s2 : 0;
    const int n_sv = P < C ? P : C;
    out->pos_screenot_rank = lens_screenot(sv, n_sv, P, C, a->opts.screenot_k, &out->pos_screenot_threshold);
    double at_rank = 0;
    for (int j = 0; j < out->pos_screenot_rank; j++) at_rank += sv[j];
    out->pos_explained_screenot = sum_s > 0 ? at_rank / sum_s : 0;
    for (int j = 0; j < 2; j++) {
        int big = 0;
        for (int t = 1; t < P; t++)
            if (fabs(pos_u(s, P, j, t)) > fabs(pos_u(s, P, j, big))) big = t;
        double sign = pos_u(s, P, j, big) < 0 ? -1.0 : 1.0;
        for (int t = 0; t < P; t++) out->pos_pca[t * 2 + j] = (float)(sign * pos_u(s, P, j, t) * sv[j]);
    }

    double h_op = sqrt(lam_h > 0 ? lam_h : 0);
    out->norm_pos = h_op > 0 ? sqrt((double)W) * sv[0] / h_op : 0;
    out->norm_ctx = h_op > 0 ? sqrt((double)P) * sqrt(ctx_vals[0] > 0 ? ctx_vals[0] : 0) / h_op : 0;
    out->norm_resid = h_op > 0 ? sqrt(lam_resid > 0 ? lam_resid : 0) / h_op : 0;

    /* principal angles: Q_pos [K][C] rows v_j = pos^T u_j / s_j; M = Q_pos Q_ctx^T [K][K] */
    while (K > 0 && !(sv[K - 1] > 1e-12 * sv[0])) K--;
    out->n_angles = K;
    out->principal_angles_deg = malloc((size_t)(K > 0 ? K : 1) * sizeof(double));
    double *qpos = malloc((size_t)(K > 0 ? K : 1) * C * sizeof(double));
    double *mk = malloc((size_t)(K > 0 ? K * K : 1) * sizeof(double));
    if (!out->principal_angles_deg || !qpos || !mk) {
        free(ctx_vecs), free(qpos), free(mk);
        return lens_fail(err, LENS_ENOMEM, "out of memory for principal angles");
    }
    for (int j = 0; j < K; j++)
        for (int i = 0; i < C; i++) {
            double v = 0;
            for (int t = 0; t < P; t++) v += s->pos[(size_t)t * C + i] * pos_u(s, P, j, t);
            qpos[(size_t)j * C + i] = v / sv[j];
        }
    if (K > 0) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, K, K, C, 1.0, qpos, C, ctx_vecs, C, 0.0, mk, K);
        double cosines[K], unused_u[K * K], unused_vt[K * K]; /* LAPACKE checks ldu, ldvt even for 'N' */
        lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'N', K, K, mk, K, cosines, unused_u, K, unused_vt, K);
        if (info != 0) {
            free(ctx_vecs), free(qpos), free(mk);
            return lens_fail(err, LENS_EINVAL, "SVD failed on the subspace overlap (dgesdd info %d)", (int)info);
        }
        for (int j = 0; j < K; j++) {
            double cj = cosines[j] > 1 ? 1 : cosines[j];
            out->principal_angles_deg[j] = acos(cj) * 180.0 / M_PI;
        }
    }
    free(ctx_vecs), free(qpos), free(mk);

    out->pos_smoothness = smoothness(s, P);

    /* |cos(pos_t, ctx_c)| */
    unit_rows(s->pos, s->pos_unit, P, C);
    unit_rows(s->ctx, s->ctx_unit, W, C);
    double max_cos = 0, sum_cos = 0;
    for (int t0 = 0; t0 < P; t0 += COS_BLOCK) {
        int nb = P - t0 < COS_BLOCK ? P - t0 : COS_BLOCK;
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, (int)W, C, 1.0, s->pos_unit + (size_t)t0 * C, C,
                    s->ctx_unit, C, 0.0, s->block, (int)W);
        for (size_t k = 0; k < (size_t)nb * W; k++) {
            double v = fabs(s->block[k]);
            sum_cos += v;
            if (v > max_cos) max_cos = v;
        }
    }
    out->max_abs_cos = max_cos;
    out->mean_abs_cos = sum_cos / ((double)P * W);

    if (a->labels_state == 1) return topics(a, s, out, err);
    return 0;
}

void lens_decomp_result_free(lens_decomp_result *r)
{
    if (!r) return;
    for (int l = 0; r->layers && l < r->n_layers; l++) {
        free(r->layers[l].pos_pca);
        free(r->layers[l].principal_angles_deg);
        free(r->layers[l].mean);
        free(r->layers[l].pos);
    }
    free(r->layers);
    memset(r, 0, sizeof *r);
}

int lens_decomp_finish(lens_decomp *a, lens_decomp_result *res, lens_err *err)
{
    memset(res, 0, sizeof *res);
    if (a->W < 2) return lens_fail(err, LENS_EINVAL, "the decomposition needs at least 2 windows, got %ld", a->W);
    const size_t C = (size_t)a->C, P = (size_t)a->P, W = (size_t)a->W;
    size_t wide = W > P ? W : P;
    finish_scratch s = {0};
    s.pos = malloc(P * C * sizeof(double));
    s.ctx = malloc(W * C * sizeof(double));
    s.hc = malloc(C * C * sizeof(double));
    s.work = malloc((C > P ? C * C : P * P) * sizeof(double));
    s.ctx_gram = malloc((C > P ? C * C : P * P) * sizeof(double));
    s.pos_gram = malloc(P * P * sizeof(double));
    s.ctx_unit = malloc(W * C * sizeof(double));
    s.pos_unit = malloc(P * C * sizeof(double));
    s.block = malloc((size_t)COS_BLOCK * wide * sizeof(double));
    s.dct = malloc(P * P * sizeof(double));
    res->layers = calloc((size_t)a->n_layers, sizeof *res->layers);
    if (!s.pos || !s.ctx || !s.hc || !s.work || !s.ctx_gram || !s.pos_gram || !s.ctx_unit || !s.pos_unit ||
        !s.block || !s.dct || !res->layers) {
        scratch_free(&s);
        free(res->layers);
        res->layers = NULL;
        return lens_fail(err, LENS_ENOMEM, "out of memory for the decomposition of %zu windows", W);
    }
    res->n_layers = a->n_layers;
    res->n_windows = a->W, res->T = a->T, res->P = a->P, res->first_position = a->first, res->d_model = a->C;
    res->has_labels = a->labels_state == 1;
    int rc = 0;
    for (int l = 0; l < a->n_layers && rc == 0; l++) {
        if (lens_cancelled(a->opts.cancel)) rc = lens_fail(err, LENS_ECANCEL, "decomposition cancelled");
        else rc = finish_layer(a, &a->acc[l], &s, &res->layers[l], err);
    }
    scratch_free(&s);
    if (rc != 0) lens_decomp_result_free(res);
    return rc;
}

/* ---------------------------------------------------------------- inputs */

int lens_decomp_windows_from_texts(const lens_tokenizer *tok, const char *const *texts, const size_t *lens,
                                   const int *labels, int n_texts, int T, int **ids_out, int **labels_out,
                                   int *n_windows, lens_err *err)
{
    *ids_out = NULL, *n_windows = 0;
    if (labels_out) *labels_out = NULL;
    if (T < 1) return lens_fail(err, LENS_EINVAL, "window length %d must be positive", T);
    if (n_texts < 0 || (n_texts > 0 && !texts)) return lens_fail(err, LENS_EINVAL, "no texts given");
    int *ids = NULL, *wl = NULL, *stream = NULL;
    size_t n_ids_cap = 0, stream_len = 0, stream_cap = 0;
    int W = 0;
    for (int i = 0; i <= n_texts; i++) {
        /* a label change (or the end) closes the stream: its tail < T is dropped */
        if (i == n_texts || (labels && i > 0 && labels[i] != labels[i - 1])) stream_len = 0;
        if (i == n_texts) break;
        lens_token *toks = NULL;
        int nt = 0;
        const char *text = texts[i] ? texts[i] : "";
        if (lens_tokenize(tok, text, lens ? lens[i] : strlen(text), NULL, 0, &toks, &nt, err) != 0) {
            free(ids), free(wl), free(stream);
            if (!err) return -1;
            char msg[400];
            snprintf(msg, sizeof msg, "%.380s", err->msg);
            return lens_fail(err, err->code, "text %d: %s", i, msg);
        }
        for (int k = 0; k < nt; k++) {
            if (toks[k].special) continue;
            if (stream_len == stream_cap) {
                size_t cap = stream_cap ? 2 * stream_cap : (size_t)T;
                int *p = realloc(stream, cap * sizeof(int));
                if (!p) goto oom_tokens;
                stream = p, stream_cap = cap;
            }
            stream[stream_len++] = toks[k].id;
            if (stream_len == (size_t)T) { /* a full window */
                if ((size_t)(W + 1) * T > n_ids_cap) {
                    size_t cap = n_ids_cap ? 2 * n_ids_cap : (size_t)16 * T;
                    int *p = realloc(ids, cap * sizeof(int));
                    if (!p) goto oom_tokens;
                    ids = p;
                    int *q = realloc(wl, cap / T * sizeof(int));
                    if (!q) goto oom_tokens;
                    wl = q, n_ids_cap = cap;
                }
                memcpy(ids + (size_t)W * T, stream, (size_t)T * sizeof(int));
                wl[W++] = labels ? labels[i] : 0;
                stream_len = 0;
            }
        }
        free(toks);
        continue;
    oom_tokens:
        free(toks), free(ids), free(wl), free(stream);
        return lens_fail(err, LENS_ENOMEM, "out of memory while cutting windows");
    }
    free(stream);
    *ids_out = ids, *n_windows = W;
    if (labels_out && labels) *labels_out = wl;
    else free(wl);
    return 0;
}

void lens_decomp_components(const float *h, int W, int P, int C, double *mu, double *pos, double *ctx,
                            double *resid)
{
    const double N = (double)W * P;
    memset(mu, 0, (size_t)C * sizeof(double));
    memset(pos, 0, (size_t)P * C * sizeof(double));
    memset(ctx, 0, (size_t)W * C * sizeof(double));
    for (int c = 0; c < W; c++)
        for (int t = 0; t < P; t++)
            for (int i = 0; i < C; i++) {
                double x = h[((size_t)c * P + t) * C + i];
                mu[i] += x / N;
                pos[(size_t)t * C + i] += x / W;
                ctx[(size_t)c * C + i] += x / P;
            }
    for (int t = 0; t < P; t++)
        for (int i = 0; i < C; i++) pos[(size_t)t * C + i] -= mu[i];
    for (int c = 0; c < W; c++)
        for (int i = 0; i < C; i++) ctx[(size_t)c * C + i] -= mu[i];
    if (!resid) return;
    for (int c = 0; c < W; c++)
        for (int t = 0; t < P; t++)
            for (int i = 0; i < C; i++) {
                size_t k = ((size_t)c * P + t) * C + i;
                resid[k] = h[k] - mu[i] - pos[(size_t)t * C + i] - ctx[(size_t)c * C + i];
            }
}

/* ---------------------------------------------------------------- context means on their principal axes */

/* Kept apart from lens_decomp_finish: it reads only the per-window context
 * means and labels the accumulator already holds (for shard partials), so the
 * dashboard's scatter of windows coloured by topic costs one W x C PCA per
 * layer and no change to the metrics' compute path.
 *
 * X [W][C] = ctx_mean - their mean over windows (= ctx of the header, the
 * shift cancels). Its top-k principal axes v_i are the eigenvectors of X^T X
 * [C][C]; when W <= C the same coordinates come cheaper from X X^T [W][W]:
 * X X^T u_i = lambda_i u_i gives X v_i = sqrt(lambda_i) u_i. */
static int ctx_pca_layer(const lens_decomp *a, const layer_acc *la, int k, double *x, double *g,
                         lens_decomp_ctx_pca *out, lens_err *err)
{
    const int C = a->C;
    const long W = a->W;
    const int n = W <= C ? (int)W : C; /* the Gram's side */
    double mean[C];
    memset(mean, 0, sizeof mean);
    for (long w = 0; w < W; w++)
        for (int i = 0; i < C; i++) mean[i] += la->ctx_mean[(size_t)w * C + i];
    for (int i = 0; i < C; i++) mean[i] /= (double)W;
    double total = 0;
    for (long w = 0; w < W; w++)
        for (int i = 0; i < C; i++) {
            double d = la->ctx_mean[(size_t)w * C + i] - mean[i];
            x[(size_t)w * C + i] = d;
            total += d * d;
        }
    if (W <= C) cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)W, C, 1.0, x, C, 0.0, g, n);
    else cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, C, (int)W, 1.0, x, C, 0.0, g, n);
    double vals[k], *vecs = malloc((size_t)k * n * sizeof(double));
    if (!vecs) return lens_fail(err, LENS_ENOMEM, "out of memory for the context means' axes");
    if (top_eigen(g, n, k, vals, vecs, err) != 0) {
        free(vecs);
        return -1;
    }
    out->layer = la->layer, out->k = k, out->W = W;
    for (int j = 0; j < k; j++) {
        double lam = vals[j] > 0 ? vals[j] : 0, big = 0;
        out->share[j] = total > 0 ? lam / total : 0;
        for (long w = 0; w < W; w++) {
            double v = W <= C ? sqrt(lam) * vecs[(size_t)j * n + w] : dot(x + (size_t)w * C, vecs + (size_t)j * n, C);
            out->coords[(size_t)w * k + j] = (float)v;
            if (fabs(v) > fabs(big)) big = v;
        }
        if (big < 0) /* the sign convention of pos_pca: the largest entry positive */
            for (long w = 0; w < W; w++) out->coords[(size_t)w * k + j] = -out->coords[(size_t)w * k + j];
    }
    for (long w = 0; w < W; w++) {
        out->window[w] = a->window[w];
        if (out->label) out->label[w] = a->labels[w];
    }
    free(vecs);
    return 0;
}

void lens_decomp_ctx_pca_free(lens_decomp_ctx_pca *p, int n_layers)
{
    for (int l = 0; p && l < n_layers; l++) free(p[l].coords), free(p[l].share), free(p[l].window), free(p[l].label);
    free(p);
}

lens_decomp_ctx_pca *lens_decomp_ctx_pca_compute(const lens_decomp *a, int k, lens_err *err)
{
    if (a->W < 2) {
        lens_fail(err, LENS_EINVAL, "the context means' PCA needs at least 2 windows, got %ld", a->W);
        return NULL;
    }
    const size_t C = (size_t)a->C, W = (size_t)a->W, n = W <= C ? W : C;
    if (k > (int)W - 1) k = (int)W - 1; /* the centred means have rank <= W - 1 */
    if (k > (int)C) k = (int)C;
    if (k < 1) k = 1;
    lens_decomp_ctx_pca *p = calloc((size_t)a->n_layers, sizeof *p);
    double *x = malloc(W * C * sizeof(double)), *g = malloc(n * n * sizeof(double));
    int rc = p && x && g ? 0 : lens_fail(err, LENS_ENOMEM, "out of memory for the context means' PCA");
    for (int l = 0; l < a->n_layers && rc == 0; l++) {
        lens_decomp_ctx_pca *o = &p[l];
        o->coords = malloc(W * (size_t)k * sizeof(float));
        o->share = malloc((size_t)k * sizeof(double));
        o->window = malloc(W * sizeof(long));
        o->label = a->labels_state == 1 ? malloc(W * sizeof(int)) : NULL;
        if (!o->coords || !o->share || !o->window || (a->labels_state == 1 && !o->label))
            rc = lens_fail(err, LENS_ENOMEM, "out of memory for the context means' PCA");
        else if (lens_cancelled(a->opts.cancel)) rc = lens_fail(err, LENS_ECANCEL, "decomposition cancelled");
        else rc = ctx_pca_layer(a, &a->acc[l], k, x, g, o, err);
    }
    free(x), free(g);
    if (rc) {
        lens_decomp_ctx_pca_free(p, p ? a->n_layers : 0);
        return NULL;
    }
    return p;
}
