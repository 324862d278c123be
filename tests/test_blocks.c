/* test_blocks.c - every family's block program (block.h) run forward,
 * backward and as a JVP by the interpreter, checked against each other and against finite
 * differences, over the family table (family_cases.h), on random micro
 * checkpoints (lens_mkmodel; no ../shared needed). Per family and layer,
 * T = 6 tokens of one sequence, random input x, tangent t, cotangent u:
 *   forward with a cache == forward without                      exact
 *   JVP J t vs central differences (f(x + εt) - f(x - εt)) / 2ε,  ε = 1e-2:
 *       |diff| <= 5e-3 max|fd|   (float32 differences: the O(ε²) term and rounding);
 *       a mixture of experts holds its top-k choice fixed, so ε shrinks (by 4, down to
 *       1e-4) until x ± εt route every token as x does
 *   the routes of x ± εt == those of x                             exact
 *   two tangents packed as 2T rows == each alone                 |diff| <= 1e-6 max
 *   a one-row tangent with jvp_row == the same without           |diff| <= 1e-6 max
 *   backward vs JVP: <J^T u, t> == <u, J t>                      relative 1e-4
 *   backward with weight gradients: the same J^T u               |diff| <= 1e-6 max,
 *       and a non-zero gradient for every parameter tensor the block reads
 *   forward from ATTEND on (lens_block_forward_from_attend) with every
 *       register but X, Q, K and V poisoned (NaN) == the whole block  exact
 *   forward after the attention output map (lens_block_forward_after_attn_out)
 *       with every register but X and the map's output poisoned == the whole block  exact
 * and the same for the final norm of the families that have one. A new
 * family gets all of it by adding its row to the table. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/base/gemm.h"
#include "core/model/mkmodel.h"
#include "core/nn/ops.h"
#include "family_cases.h"

enum { T = 6 };

/* Work buffers of one block pass over up to 2T rows, and one sequence's attention. */
typedef struct {
    const lens_model *m;
    float *x, *h, *n, *q, *k, *v, *ctx, *ff, *scratch;
    float *route; /* [T][2K + E] the routes of the last forward (MoE layers) */
    float *probs, *dprobs, *dscores, *dS; /* [NH][T][T] x2, [T][T] x2 */
    lens_block_cache cache, final;
} bench;

static float *floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static void attend(lens_block_io *io, int l)
{
    const bench *b = io->attend_ctx;
    const lens_config *c = &b->m->cfg;
    const lens_score_fn f = lens_model_scores(b->m, l, lens_has_cap(c, LENS_CAP_CAUSAL));
    lens_attention_forward(io->ctx, b->probs, (size_t)T * T, io->q, io->k, io->v, T, c->n_heads, c->d_head_k,
                           c->d_head_v, &f);
}

static int attend_backward(lens_block_io *io, int l)
{
    const bench *b = io->attend_ctx;
    const lens_config *c = &b->m->cfg;
    const lens_score_fn f = lens_model_scores(b->m, l, lens_has_cap(c, LENS_CAP_CAUSAL));
    const size_t QK = (size_t)c->n_heads * c->d_head_k, VO = (size_t)c->n_heads * c->d_head_v;
    memset(io->q, 0, sizeof(float) * T * QK);
    memset(io->k, 0, sizeof(float) * T * QK);
    memset(io->v, 0, sizeof(float) * T * VO);
    lens_attention_backward(io->q, io->k, io->v, b->dprobs, (size_t)T * T, b->dscores, io->ctx, io->cache->q,
                            io->cache->k, io->cache->v, b->probs, (size_t)T * T, T, c->n_heads, c->d_head_k,
                            c->d_head_v, &f);
    return 0;
}

static void attend_jvp(lens_block_io *io, int l)
{
    const bench *b = io->attend_ctx;
    const lens_config *c = &b->m->cfg;
    const lens_score_fn f = lens_model_scores(b->m, l, lens_has_cap(c, LENS_CAP_CAUSAL));
    lens_attention_jvp(io->ctx, io->q, io->k, io->v, io->cache->q, io->cache->k, io->cache->v, b->probs,
                       (size_t)T * T, io->N / T, T, c->n_heads, c->d_head_k, c->d_head_v, &f, b->dS);
}

static int bench_init(bench *b, const lens_model *m)
{
    const lens_config *c = &m->cfg;
    const size_t R = 2 * T, C = c->d_model, QK = (size_t)c->n_heads * c->d_head_k,
                 VO = (size_t)c->n_heads * c->d_head_v, TT = (size_t)T * T;
    memset(b, 0, sizeof *b);
    b->m = m;
    b->x = floats(R * C), b->h = floats(R * C), b->n = floats(R * C), b->scratch = floats(C);
    b->q = floats(R * QK), b->k = floats(R * QK), b->v = floats(R * VO), b->ctx = floats(R * VO);
    b->ff = floats(R * (size_t)lens_ff_cols(m)); /* gate and up of a gated MLP, a fused q/k/v */
    b->route = floats((size_t)T * (2 * c->top_k + c->n_experts));
    b->probs = floats(c->n_heads * TT), b->dprobs = floats(c->n_heads * TT), b->dscores = floats(TT), b->dS = floats(2 * TT);
    /* one cache for every layer: the widest (ModernBERT's layer 0 has no attn_norm, so keeps less) */
    int widest = 0;
    for (int l = 1; l < c->n_layers; l++)
        if (lens_block_cache_floats(m, l, 1) > lens_block_cache_floats(m, widest, 1)) widest = l;
    if (lens_block_cache_init(&b->cache, m, widest, T, 1) || lens_block_cache_init(&b->final, m, c->n_layers, T, 1))
        return -1;
    return b->x && b->h && b->n && b->scratch && b->route && b->q && b->k && b->v && b->ctx && b->ff && b->probs && b->dprobs &&
                   b->dscores && b->dS
               ? 0
               : -1;
}

static void bench_free(bench *b)
{
    free(b->x), free(b->h), free(b->n), free(b->scratch), free(b->q), free(b->k), free(b->v), free(b->ctx);
    free(b->ff), free(b->route), free(b->probs), free(b->dprobs), free(b->dscores), free(b->dS);
    lens_block_cache_free(&b->cache), lens_block_cache_free(&b->final);
}

static lens_block_io io_of(bench *b, int rows, int final)
{
    lens_block_io io = {.N = rows, .x = b->x, .h = b->h, .n = b->n, .q = b->q, .k = b->k, .v = b->v, .ctx = b->ctx,
                        .ff = b->ff, .cache = final ? &b->final : &b->cache,
                        .jvp_row = -1, .row_scratch = b->scratch, .attend = attend,
                        .attend_backward = attend_backward, .attend_jvp = attend_jvp, .attend_ctx = b};
    return io;
}

/* y = block l (or the final norm) of x [T][C]; with cache, saving into b's caches. */
static void run_forward(bench *b, int l, int final, const float *x, float *y, int cache)
{
    const size_t TC = (size_t)T * b->m->cfg.d_model;
    memcpy(b->x, x, sizeof(float) * TC);
    lens_block_io io = io_of(b, T, final);
    io.route = b->route;
    if (!cache) io.cache = NULL, io.q = b->q, io.k = b->k, io.v = b->v;
    else if (!final) io.q = b->cache.q, io.k = b->cache.k, io.v = b->cache.v;
    lens_block_forward(b->m, &io, final ? b->m->cfg.n_layers : l);
    memcpy(y, b->x, sizeof(float) * TC);
}

/* out [B][T][C] = J tangents [B][T][C] (primal: the last cached forward);
 * row_jac: the block's row-wise tail as its explicit Jacobians, or NULL */
static void run_jvp_jac(bench *b, int l, int final, const float *tangents, int B, int row, const float *row_jac,
                        float *out)
{
    const size_t n = (size_t)B * T * b->m->cfg.d_model;
    memcpy(b->x, tangents, sizeof(float) * n);
    lens_block_io io = io_of(b, B * T, final);
    io.jvp_row = row;
    io.row_jac = row_jac;
    lens_block_jvp(b->m, &io, final ? b->m->cfg.n_layers : l);
    memcpy(out, b->x, sizeof(float) * n);
}

static void run_jvp(bench *b, int l, int final, const float *tangents, int B, int row, float *out)
{
    run_jvp_jac(b, l, final, tangents, B, row, NULL, out);
}

/* Weight gradients into one buffer per parameter tensor seen. */
typedef struct {
    lens_grad_map map;
    const float *param[64];
    float *grad[64];
    int n;
    size_t size;
} grad_table;

static float *grad_of(const lens_grad_map *g, const float *param)
{
    grad_table *t = g->ctx;
    for (int i = 0; i < t->n; i++)
        if (t->param[i] == param) return t->grad[i];
    if (t->n == 64) return NULL;
    t->param[t->n] = param;
    return t->grad[t->n++] = floats(t->size); /* any tensor of a micro block fits */
}

/* out [T][C] = J^T u (primal: the last cached forward) */
static void run_backward(bench *b, int l, int final, const float *u, float *out, grad_table *g)
{
    const size_t n = (size_t)T * b->m->cfg.d_model;
    memcpy(b->x, u, sizeof(float) * n);
    lens_block_io io = io_of(b, T, final);
    io.grads = g ? &g->map : NULL;
    lens_block_backward(b->m, &io, final ? b->m->cfg.n_layers : l);
    memcpy(out, b->x, sizeof(float) * n);
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs((double)a[i] - b[i]) > m ? fabs((double)a[i] - b[i]) : m;
    return m;
}

static uint64_t rng = 88172645463325252ULL;
static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* 1 when the last forward's experts differ from those of the routes at_x. */
static int same_experts(const bench *b, const float *at_x)
{
    const int K = b->m->cfg.top_k, RF = 2 * K + b->m->cfg.n_experts;
    for (int r = 0; r < T && b->m->cfg.n_experts; r++)
        for (int j = 0; j < K; j++)
            if (b->route[r * RF + j] != at_x[r * RF + j]) return 1;
    return 0;
}

/* Starting at ATTEND reads nothing the skipped ops wrote but Q, K, V: with
 * the other registers NaN the block gives what it gives whole. */
static void check_from_attend(bench *b, const char *name, int l, int *skipped)
{
    const lens_config *c = &b->m->cfg;
    const size_t n = (size_t)T * c->d_model, R = 2 * (size_t)T;
    float *x = floats(n), *y = floats(n);
    for (size_t i = 0; i < n; i++) x[i] = uniform();
    run_forward(b, l, 0, x, y, 0);
    const float nan = 0.0f / 0.0f;
    for (size_t i = 0; i < R * c->d_model; i++) b->h[i] = b->n[i] = nan;
    for (size_t i = 0; i < R * (size_t)lens_ff_cols(b->m); i++) b->ff[i] = nan;
    for (size_t i = 0; i < R * c->n_heads * c->d_head_v; i++) b->ctx[i] = nan;
    memcpy(b->x, x, sizeof(float) * n);
    lens_block_io io = io_of(b, T, 0);
    io.route = b->route, io.cache = NULL;
    *skipped += lens_block_forward_from_attend(b->m, &io, l);
    CHECK(!memcmp(b->x, y, sizeof(float) * n), "%s block %d: the forward from ATTEND on equals the whole block", name, l);
    free(x), free(y);
}

/* Starting after the attention output map reads nothing the skipped ops
 * wrote: with every register but X and the map's output NaN, the map's
 * output computed here from the whole block's CTX gives what the block
 * gives whole. */
static void check_after_attn_out(bench *b, const char *name, int l, int *started)
{
    const lens_config *c = &b->m->cfg;
    const size_t n = (size_t)T * c->d_model, R = 2 * (size_t)T, QK = (size_t)c->n_heads * c->d_head_k;
    const lens_linear *map = NULL;
    const int r = lens_block_attn_out(b->m, l, &map);
    if (r < 0) return;
    float *x = floats(n), *y = floats(n), *out = floats(n);
    for (size_t i = 0; i < n; i++) x[i] = uniform();
    run_forward(b, l, 0, x, y, 0);
    lens_gemm_linear(out, b->ctx, map, T, NULL);
    const float nan = 0.0f / 0.0f;
    for (size_t i = 0; i < R * c->d_model; i++) b->h[i] = b->n[i] = nan;
    for (size_t i = 0; i < R * (size_t)lens_ff_cols(b->m); i++) b->ff[i] = nan;
    for (size_t i = 0; i < R * c->n_heads * c->d_head_v; i++) b->ctx[i] = b->v[i] = nan;
    for (size_t i = 0; i < R * QK; i++) b->q[i] = b->k[i] = nan;
    memcpy(b->x, x, sizeof(float) * n);
    lens_block_io io = io_of(b, T, 0);
    io.route = b->route, io.cache = NULL;
    memcpy(lens_block_register(&io, r), out, sizeof(float) * n);
    lens_block_forward_after_attn_out(b->m, &io, l);
    CHECK(!memcmp(b->x, y, sizeof(float) * n), "%s block %d: the forward after the attention output map equals the "
          "whole block", name, l);
    ++*started;
    free(x), free(y), free(out);
}

/* Every check of one block (final = 0) or the final norm (final = 1). */
static void check_block(bench *b, const char *name, int l, int final)
{
    const int C = b->m->cfg.d_model;
    const size_t n = (size_t)T * C;
    float *x = floats(n), *t = floats(2 * n), *u = floats(n), *y0 = floats(n), *y1 = floats(n), *yp = floats(n),
          *ym = floats(n), *fd = floats(n), *jt = floats(2 * n), *jt2 = floats(2 * n), *g = floats(n), *gw = floats(n);
    char what[128];
    snprintf(what, sizeof what, "%s %s", name, final ? "final norm" : "block");
    if (!final) snprintf(what + strlen(what), sizeof what - strlen(what), " %d", l);
    for (size_t i = 0; i < n; i++) x[i] = uniform(), t[i] = uniform(), t[n + i] = uniform(), u[i] = uniform();
    /* finite differences first: the cached forward below is the JVP's primal */
    float eps = 1e-2f;
    int rerouted = 1;
    for (; rerouted && eps >= 1e-4f; eps /= 4) {
        run_forward(b, l, final, x, y0, 0);
        const int routes = b->m->cfg.n_experts ? T * (2 * b->m->cfg.top_k + b->m->cfg.n_experts) : 0;
        float *at_x = floats((size_t)routes);
        memcpy(at_x, b->route, sizeof(float) * routes);
        rerouted = 0;
        for (size_t i = 0; i < n; i++) y0[i] = x[i] + eps * t[i];
        run_forward(b, l, final, y0, yp, 0);
        rerouted |= same_experts(b, at_x);
        for (size_t i = 0; i < n; i++) y0[i] = x[i] - eps * t[i];
        run_forward(b, l, final, y0, ym, 0);
        rerouted |= same_experts(b, at_x);
        free(at_x);
        if (!rerouted)
            for (size_t i = 0; i < n; i++) fd[i] = (yp[i] - ym[i]) / (2 * eps);
    }
    CHECK(!rerouted, "%s: x +- 1e-4 t route tokens to other experts than x", what);
    run_forward(b, l, final, x, y0, 0);
    run_forward(b, l, final, x, y1, 1);
    CHECK(max_diff(y0, y1, n) == 0, "%s: forward with a cache differs by %g", what, max_diff(y0, y1, n));

    run_jvp(b, l, final, t, 1, -1, jt);
    const double d_fd = max_diff(jt, fd, n);
    CHECK(d_fd <= 5e-3 * max_abs(fd, n) && max_abs(fd, n) > 0, "%s: JVP vs finite differences %g (max %g)", what, d_fd,
          max_abs(fd, n));
    run_jvp(b, l, final, t, 2, -1, jt2);
    const double d_pack = max_diff(jt2, jt, n);
    run_jvp(b, l, final, t + n, 1, -1, jt); /* second tangent alone */
    const double d_pack2 = max_diff(jt2 + n, jt, n);
    CHECK(d_pack <= 1e-6 * max_abs(jt2, n) && d_pack2 <= 1e-6 * max_abs(jt, n),
          "%s: two packed tangents differ from each alone by %g, %g", what, d_pack, d_pack2);
    /* a tangent of one non-zero row (the first layer's input tokens) */
    const int row = 2;
    float *one = floats(n);
    memcpy(one + (size_t)row * C, t + (size_t)row * C, sizeof(float) * C);
    run_jvp(b, l, final, one, 1, -1, jt2);
    run_jvp(b, l, final, one, 1, final ? -1 : row, jt);
    const double d_row = max_diff(jt, jt2, n);
    CHECK(d_row <= 1e-6 * max_abs(jt2, n) + 1e-12, "%s: jvp_row differs by %g", what, d_row);
    free(one);
    /* the row-wise tail as explicit Jacobians (formed two tangents at a
     * time, C / 2 chunks) gives the tail's JVP up to rounding */
    if (!final && lens_block_has_tail(b->m, l)) {
        float *jac = floats(n * C), *packed = aligned_alloc(64, sizeof(float) * T * lens_gemm_packed_size(C, C));
        lens_block_io io = io_of(b, 2 * T, 0);
        lens_block_row_jacobian(b->m, &io, l, jac);
        lens_block_row_jac_pack(packed, jac, T, C);
        run_jvp(b, l, 0, t, 2, -1, jt);
        run_jvp_jac(b, l, 0, t, 2, -1, packed, jt2);
        const double d_jac = max_diff(jt, jt2, 2 * n);
        CHECK(d_jac <= 1e-5 * max_abs(jt, 2 * n) && max_abs(jt, 2 * n) > 0,
              "%s: JVP through the row Jacobians differs by %g (max %g)", what, d_jac, max_abs(jt, 2 * n));
        printf("  %-22s JVP through row Jacobians vs the tail's JVP %.1e (max %.1e)\n", what, d_jac,
               max_abs(jt, 2 * n));
        free(jac), free(packed);
    }

    run_jvp(b, l, final, t, 1, -1, jt);
    run_backward(b, l, final, u, g, NULL);
    const double lhs = dot(g, t, n), rhs = dot(u, jt, n);
    CHECK(fabs(lhs - rhs) <= 1e-4 * (fabs(lhs) + fabs(rhs)) && rhs != 0, "%s: <J^T u, t> %.8g vs <u, J t> %.8g", what,
          lhs, rhs);
    const lens_config *c = &b->m->cfg;
    grad_table gt = {.map = {.of = grad_of}, .size = (size_t)(c->d_ff > C ? c->d_ff : C) * 3 * C};
    gt.map.ctx = &gt;
    run_backward(b, l, final, u, gw, &gt);
    int zero = 0;
    for (int i = 0; i < gt.n; i++) zero += max_abs(gt.grad[i], gt.size) == 0;
    CHECK(max_diff(g, gw, n) <= 1e-6 * max_abs(g, n) && gt.n > 0 && !zero,
          "%s: with weight gradients: J^T u differs by %g; %d tensors, %d all zero", what, max_diff(g, gw, n), gt.n, zero);
    printf("  %-22s JVP vs differences %.1e (max %.1e), adjoint %.1e relative, %d weight tensors\n", what, d_fd,
           max_abs(fd, n), fabs(lhs - rhs) / (fabs(lhs) + fabs(rhs)), gt.n);
    for (int i = 0; i < gt.n; i++) free(gt.grad[i]);
    free(x), free(t), free(u), free(y0), free(y1), free(yp), free(ym), free(fd), free(jt), free(jt2), free(g), free(gw);
}

int main(void)
{
    family_cases_check();
    int families = 0;
    for (int k = 0; k < N_FAMILY_CASES; k++) {
        int seen = 0; /* blocks do not depend on the task: one case per family */
        for (int j = 0; j < k; j++) seen |= !strcmp(family_cases[j].arch, family_cases[k].arch);
        if (seen) continue;
        char dir[] = "/tmp/lensd-blocks-XXXXXX", cmd[600];
        lens_err err = {0};
        lens_model *m = NULL;
        if (mkdtemp(dir) && lens_mkmodel(family_cases[k].arch, "micro", family_cases[k].task, 5, dir, &err) == 0)
            m = lens_model_load(dir, &err);
        CHECK(m != NULL, "%s: %s", family_cases[k].arch, err.msg);
        bench b;
        if (m && !bench_init(&b, m)) {
            const char *name = m->cfg.family->model_type;
            int skipped = 0, after = 0;
            for (int l = 0; l < m->cfg.n_layers; l++)
                check_block(&b, name, l, 0), check_from_attend(&b, name, l, &skipped), check_after_attn_out(&b, name, l, &after);
            printf("  %s: the forward from ATTEND on skips the projections in %d of %d layers, and can start after "
                   "W_O in %d\n", name, skipped, m->cfg.n_layers, after);
            if (lens_block_cache_floats(m, m->cfg.n_layers, 0)) check_block(&b, name, 0, 1); /* a final norm */
            families++;
        }
        if (m) bench_free(&b);
        lens_model_free(m);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    CHECK(families > 0, "no family ran");
    printf("%d families\n", families);
    return check_done("test_blocks");
}
