/* moe.c - the mixture-of-experts MLP (moe.h has the formulas and the saved
 * layout). Each pass visits the experts in turn: the (row, slot) pairs
 * routed to expert e are listed, their rows gathered, run through e's maps
 * as GEMMs of n_e rows, and scattered back weighted. */
#include "core/nn/moe.h"

#include <math.h>
#include <string.h>

#include "core/nn/ops.h"

/* Offsets in a saved row: route (experts, weights, probabilities), gate, up, y. */
#define W_AT(moe) ((size_t)(moe)->top_k)
#define P_AT(moe) (2 * (size_t)(moe)->top_k)
#define G_AT(moe) (P_AT(moe) + (size_t)(moe)->n_experts)
#define U_AT(moe) (G_AT(moe) + (size_t)(moe)->top_k * (moe)->ff)
#define Y_AT(moe) (U_AT(moe) + (size_t)(moe)->top_k * (moe)->ff)

size_t lens_moe_route_floats(const lens_moe *moe) { return P_AT(moe) + (size_t)moe->n_experts; }

size_t lens_moe_saved_floats(const lens_moe *moe, int C) { return Y_AT(moe) + (size_t)moe->top_k * C; }

size_t lens_moe_scratch_floats(const lens_moe *moe, int C)
{
    /* the backward's: dz [E], dw [K], dy, x, dx [C], gate, up, d gate, d up, act [F], the list; the
     * JVP's fused gate_up tangent [2F] */
    return (size_t)moe->n_experts + 2 * (size_t)moe->top_k + 3 * (size_t)C + 6 * (size_t)moe->ff + 1;
}

/* rec's probabilities from the logits in their place, then the route:
 * the K largest (largest first, ties to the lower index) and their weights. */
static void route_row(float *rec, const lens_moe *moe)
{
    const int E = moe->n_experts, K = moe->top_k;
    float *p = rec + P_AT(moe);
    float top = p[0];
    for (int e = 1; e < E; e++) top = p[e] > top ? p[e] : top;
    double sum = 0;
    for (int e = 0; e < E; e++) sum += exp((double)p[e] - top);
    for (int e = 0; e < E; e++) p[e] = (float)(exp((double)p[e] - top) / sum);
    unsigned char taken[LENS_MOE_MAX_EXPERTS] = {0};
    double Z = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        rec[j] = (float)best;
        Z += p[best];
    }
    for (int j = 0; j < K; j++) rec[W_AT(moe) + j] = (float)(p[(int)rec[j]] / (moe->norm_topk ? Z : 1.0));
}

/* gate, up rows of stride ld from fused [n][2F] = gate_up's interleaved outputs (g0 u0 g1 u1 ..). */
static void split_gate_up(float *gate, float *up, size_t ld, const float *fused, int n, int F)
{
    for (int i = 0; i < n; i++)
        for (int f = 0; f < F; f++) {
            gate[(size_t)i * ld + f] = fused[(size_t)i * 2 * F + 2 * f];
            up[(size_t)i * ld + f] = fused[(size_t)i * 2 * F + 2 * f + 1];
        }
}

/* gate, up = in W_gate, in W_up [n][F] (rows of stride ld) of expert ex; fused [n][2F] scratch. */
static void gate_up_forward(float *gate, float *up, size_t ld, const float *in, int n, int C, const lens_moe_expert *ex,
                            int F, float *fused, lens_pool *pool)
{
    if (!ex->gate_up.w) {
        lens_gemm_linear_ld(gate, ld, in, (size_t)C, &ex->gate, n, pool);
        lens_gemm_linear_ld(up, ld, in, (size_t)C, &ex->up, n, pool);
        return;
    }
    lens_gemm_linear_ld(fused, 2 * (size_t)F, in, (size_t)C, &ex->gate_up, n, pool);
    split_gate_up(gate, up, ld, fused, n, F);
}

/* list[] = r * K + j for the rows r < N (route records at rec + (r % T) *
 * ld) whose slot j chose expert e; returns their count. */
static int routed_to(int *list, const float *rec, size_t ld, int N, int T, int K, int e)
{
    int n = 0;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < K; j++)
            if ((int)rec[(size_t)(r % T) * ld + j] == e) list[n++] = r * K + j;
    return n;
}

void lens_moe_forward(float *out, const float *inp, int N, int C, const lens_moe *moe, float *saved, float *route,
                      float *scratch, lens_pool *pool)
{
    const int K = moe->top_k, F = moe->ff;
    const size_t RF = lens_moe_route_floats(moe), SF = lens_moe_saved_floats(moe, C), F2 = 2 * (size_t)F;
    float *rec = scratch, *x = rec + N * RF, *gu = x + (size_t)N * C, *y = gu + N * F2, *fused = y + (size_t)N * C;
    int *list = (int *)(fused + N * F2);
    lens_gemm_linear_ld(rec + P_AT(moe), RF, inp, (size_t)C, moe->router, N, pool); /* z = h W_r^T */
    for (int n = 0; n < N; n++) route_row(rec + n * RF, moe);
    memset(out, 0, sizeof(float) * N * C);
    for (int e = 0; e < moe->n_experts; e++) {
        const lens_moe_expert *ex = &moe->experts[e];
        const int ne = routed_to(list, rec, RF, N, N, K, e);
        if (!ne) continue;
        for (int i = 0; i < ne; i++) memcpy(x + (size_t)i * C, inp + (size_t)(list[i] / K) * C, sizeof(float) * C);
        gate_up_forward(gu, gu + F, F2, x, ne, C, ex, F, fused, pool);
        for (int i = 0; saved && i < ne; i++) {
            float *s = saved + (list[i] / K) * SF;
            const int j = list[i] % K;
            memcpy(s + G_AT(moe) + (size_t)j * F, gu + i * F2, sizeof(float) * F);
            memcpy(s + U_AT(moe) + (size_t)j * F, gu + i * F2 + F, sizeof(float) * F);
        }
        lens_glu_forward(gu, gu, gu + F, ne, F, F2, moe->act);
        lens_gemm_linear_ld(y, (size_t)C, gu, F2, &ex->down, ne, pool); /* y = W_down (act(g) * u) */
        for (int i = 0; i < ne; i++) {
            const int n = list[i] / K, j = list[i] % K;
            const float w = rec[n * RF + W_AT(moe) + j], *yi = y + (size_t)i * C;
            float *o = out + (size_t)n * C;
            for (int c = 0; c < C; c++) o[c] += w * yi[c]; /* out = sum_j w_j y_j */
            if (saved) memcpy(saved + n * SF + Y_AT(moe) + (size_t)j * C, yi, sizeof(float) * C);
        }
    }
    for (int n = 0; saved && n < N; n++) memcpy(saved + n * SF, rec + n * RF, sizeof(float) * RF);
    if (route) memcpy(route, rec, sizeof(float) * N * RF);
}

/* Gathers the saved gate and up of the listed (row, slot) pairs into g, u
 * [ne][F] (tangent rows r at primal row r % T). */
static void gather_gate_up(float *g, float *u, const float *saved, const int *list, int ne, int T, const lens_moe *moe,
                           size_t SF)
{
    const int K = moe->top_k, F = moe->ff;
    for (int i = 0; i < ne; i++) {
        const float *s = saved + (size_t)(list[i] / K % T) * SF;
        const int j = list[i] % K;
        memcpy(g + (size_t)i * F, s + G_AT(moe) + (size_t)j * F, sizeof(float) * F);
        memcpy(u + (size_t)i * F, s + U_AT(moe) + (size_t)j * F, sizeof(float) * F);
    }
}

/* dinp[n][IC] (+= with accumulate) = dout W of lin, plus its weight gradient
 * (input inp) when grad is set. */
static void map_backward(float *dinp, int accumulate, const float *dout, const float *inp, const lens_linear *lin,
                         int N, lens_moe_grad_fn grad, void *ctx, lens_pool *pool)
{
    if (!grad) {
        lens_gemm_linear_backward(dinp, dout, lin, N, accumulate, pool);
        return;
    }
    if (!accumulate) memset(dinp, 0, sizeof(float) * (size_t)N * lin->in);
    lens_linear_backward(dinp, grad(ctx, lin->w), lin->b ? grad(ctx, lin->b) : NULL, dout, inp, lin, N);
}

void lens_moe_backward(float *dinp, int accumulate, const float *dout, const float *inp, int N, int C,
                       const lens_moe *moe, const float *saved, lens_moe_grad_fn grad, void *grad_ctx, float *scratch,
                       lens_pool *pool)
{
    const int E = moe->n_experts, K = moe->top_k, F = moe->ff;
    const size_t SF = lens_moe_saved_floats(moe, C);
    float *dz = scratch, *dw = dz + (size_t)N * E, *dy = dw + (size_t)N * K, *g = dy + (size_t)N * C;
    float *u = g + (size_t)N * F, *dg = u + (size_t)N * F, *du = dg + (size_t)N * F, *a = du + (size_t)N * F;
    float *x = a + (size_t)N * F, *dx = x + (size_t)N * C;
    int *list = (int *)(dx + (size_t)N * C);
    for (int n = 0; n < N; n++) {
        const float *s = saved + n * SF, *p = s + P_AT(moe), *w = s + W_AT(moe), *dn = dout + (size_t)n * C;
        double Z = 0, wdw = 0, pdp = 0, dp[LENS_MOE_MAX_EXPERTS];
        for (int j = 0; j < K; j++) {
            double d = 0; /* dw_j = dout . y_j */
            for (int c = 0; c < C; c++) d += (double)dn[c] * s[Y_AT(moe) + (size_t)j * C + c];
            dp[j] = d, wdw += w[j] * d, Z += p[(int)s[j]];
        }
        for (int j = 0; j < K; j++) {
            if (moe->norm_topk) dp[j] = (dp[j] - wdw) / Z; /* w_j = p_{S_j} / Z */
            pdp += p[(int)s[j]] * dp[j];
        }
        float *dzn = dz + (size_t)n * E; /* dz = p * (dp - sum p dp) */
        for (int e = 0; e < E; e++) dzn[e] = (float)(-p[e] * pdp);
        for (int j = 0; j < K; j++) dzn[(int)s[j]] += (float)(p[(int)s[j]] * dp[j]);
    }
    map_backward(dinp, accumulate, dz, inp, moe->router, N, grad, grad_ctx, pool);
    for (int e = 0; e < E; e++) {
        const lens_moe_expert *ex = &moe->experts[e];
        const int ne = routed_to(list, saved, SF, N, N, K, e);
        if (!ne) continue;
        for (int i = 0; i < ne; i++) { /* dy_j = w_j dout */
            const int n = list[i] / K, j = list[i] % K;
            const float wj = saved[n * SF + W_AT(moe) + j];
            for (int c = 0; c < C; c++) dy[(size_t)i * C + c] = wj * dout[(size_t)n * C + c];
            if (grad) memcpy(x + (size_t)i * C, inp + (size_t)n * C, sizeof(float) * C);
        }
        gather_gate_up(g, u, saved, list, ne, N, moe, SF);
        if (grad) lens_glu_forward(a, g, u, ne, F, (size_t)F, moe->act); /* the down map's input */
        map_backward(dg, 0, dy, a, &ex->down, ne, grad, grad_ctx, pool);
        lens_glu_backward_inplace(dg, du, g, u, ne, F, (size_t)F, moe->act);
        if (ex->gate_up.w) { /* forward: gate = gate_up[..., ::2], up = gate_up[..., 1::2]; g, u are free now */
            for (int i = 0; i < ne; i++)
                for (int f = 0; f < F; f++) {
                    g[(size_t)i * 2 * F + 2 * f] = dg[(size_t)i * F + f];
                    g[(size_t)i * 2 * F + 2 * f + 1] = du[(size_t)i * F + f];
                }
            map_backward(dx, 0, g, x, &ex->gate_up, ne, grad, grad_ctx, pool);
        } else {
            map_backward(dx, 0, dg, x, &ex->gate, ne, grad, grad_ctx, pool);
            map_backward(dx, 1, du, x, &ex->up, ne, grad, grad_ctx, pool);
        }
        for (int i = 0; i < ne; i++)
            lens_residual_forward(dinp + (size_t)(list[i] / K) * C, dx + (size_t)i * C, (size_t)C);
    }
}

void lens_moe_jvp(float *tout, const float *tinp, int N, int T, int C, const lens_moe *moe, const float *saved,
                  float *scratch, lens_pool *pool)
{
    const int E = moe->n_experts, K = moe->top_k, F = moe->ff;
    const size_t SF = lens_moe_saved_floats(moe, C);
    float *tz = scratch, *x = tz + (size_t)N * E, *tg = x + (size_t)N * C, *tu = tg + (size_t)N * F;
    float *g = tu + (size_t)N * F, *u = g + (size_t)N * F, *ty = u + (size_t)N * F, *fused = ty + (size_t)N * C;
    int *list = (int *)(fused + (size_t)N * 2 * F);
    lens_linear_jvp(tz, tinp, moe->router, N, pool); /* tz = th W_r^T */
    for (int r = 0; r < N; r++) {
        const float *s = saved + (size_t)(r % T) * SF, *p = s + P_AT(moe), *w = s + W_AT(moe), *tzr = tz + (size_t)r * E;
        double ptz = 0, Z = 0, tsum = 0, tp[LENS_MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) ptz += (double)p[e] * tzr[e];
        for (int j = 0; j < K; j++) { /* tp = p * (tz - sum p tz) on S */
            const int e = (int)s[j];
            tp[j] = p[e] * (tzr[e] - ptz), Z += p[e], tsum += tp[j];
        }
        float *o = tout + (size_t)r * C;
        memset(o, 0, sizeof(float) * C);
        for (int j = 0; j < K; j++) {
            const float tw = (float)(moe->norm_topk ? (tp[j] - w[j] * tsum) / Z : tp[j]);
            for (int c = 0; c < C; c++) o[c] += tw * s[Y_AT(moe) + (size_t)j * C + c]; /* tw_j y_j */
        }
    }
    for (int e = 0; e < E; e++) {
        const lens_moe_expert *ex = &moe->experts[e];
        const int ne = routed_to(list, saved, SF, N, T, K, e);
        if (!ne) continue;
        for (int i = 0; i < ne; i++) memcpy(x + (size_t)i * C, tinp + (size_t)(list[i] / K) * C, sizeof(float) * C);
        gather_gate_up(g, u, saved, list, ne, T, moe, SF);
        if (ex->gate_up.w) {
            lens_linear_jvp(fused, x, &ex->gate_up, ne, pool);
            split_gate_up(tg, tu, (size_t)F, fused, ne, F);
        } else {
            lens_linear_jvp(tg, x, &ex->gate, ne, pool);
            lens_linear_jvp(tu, x, &ex->up, ne, pool);
        }
        lens_glu_jvp(tg, tg, tu, g, u, ne, F, (size_t)F, moe->act);
        lens_linear_jvp(ty, tg, &ex->down, ne, pool);
        for (int i = 0; i < ne; i++) { /* + w_j ty_j */
            const int r = list[i] / K, j = list[i] % K;
            const float wj = saved[(size_t)(r % T) * SF + W_AT(moe) + j];
            for (int c = 0; c < C; c++) tout[(size_t)r * C + c] += wj * ty[(size_t)i * C + c];
        }
    }
}
