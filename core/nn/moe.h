/* moe.h - a mixture-of-experts MLP (Shazeer et al. 2017; HF's
 * MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock, OlmoeSparseMoeBlock):
 * forward, backward and JVP side by side.
 *
 * Per row h [C] (E experts, K of them routed, F each expert's width):
 *   z = h W_r^T [E];  p = softmax(z);  S = the K largest p, largest first (ties: lower index)
 *   w_j = p_{S_j} / Z,  Z = sum_{i in S} p_i with norm_topk (Mixtral always), else Z = 1
 *   y_j = W_down,e (act(h W_gate,e) * h W_up,e),  e = S_j;   out = sum_j w_j y_j
 * gpt-oss: the maps have biases, gate and up are one fused map whose outputs
 * interleave them (gate_up, gate = outputs 0, 2, .., up = 1, 3, ..: HF's
 * gate_up[..., ::2], [..., 1::2]), act the clamped SwiGLU (glu.h); its
 * softmax over the top-k logits is norm_topk's w_j = p_{S_j} / Z.
 * Only the routed experts are computed: each expert's rows are gathered and
 * run through its three maps as one GEMM each.
 *
 * The derivatives hold the choice S fixed at the input's routing (the
 * routing is piecewise constant in h; the gate weights w are
 * differentiable through the softmax):
 *   dw_j = dout . y_j;  dp_{S_j} = (dw_j - sum_i w_i dw_i) / Z (norm_topk), else dw_j;  dp = 0 off S
 *   dz = p * (dp - sum_e p_e dp_e);  dh = dz W_r + sum_j expert_{S_j}^T (w_j dout)
 * and the JVP the same forward-mode:
 *   tz = th W_r;  tp = p * (tz - sum_e p_e tz_e);  tw_j = (tp_{S_j} - w_j sum_i tp_{S_i}) / Z
 *   tout = sum_j (tw_j y_j + w_j ty_j),  ty_j the expert's JVP at the saved gate / up.
 *
 * Saved per row ([N][lens_moe_saved_floats], what backward and JVP read):
 *   the route [K] experts (as floats), [K] weights w, [E] probabilities p,
 *   then [K][F] gate pre-activations, [K][F] up, [K][C] expert outputs y. */
#ifndef LENS_MOE_H
#define LENS_MOE_H

#include <stddef.h>

#include "core/base/pool.h"
#include "core/nn/glu.h"
#include "core/nn/linear.h"

#define LENS_MOE_MAX_EXPERTS 128
#define LENS_MOE_MAX_LAYERS 256 /* mlp_only_layers indices lensd reads */

typedef struct {
    lens_linear gate, up, down; /* C -> F, C -> F, F -> C */
    lens_linear gate_up;        /* C -> 2F, gate and up interleaved (gpt-oss); when bound, gate and up are not */
} lens_moe_expert;

typedef struct {
    const lens_linear *router;      /* C -> E */
    const lens_moe_expert *experts; /* [E] */
    int n_experts, top_k, norm_topk, ff; /* E, K, Z's choice, F */
    lens_glu act;
} lens_moe;

/* Weight gradients: the gradient buffer of a weight (its layout), or NULL. */
typedef float *(*lens_moe_grad_fn)(void *ctx, const void *weight);

/* Floats per row: a route record (2K + E), the saved values, the scratch
 * the three passes need. */
size_t lens_moe_route_floats(const lens_moe *moe);
size_t lens_moe_saved_floats(const lens_moe *moe, int C);
size_t lens_moe_scratch_floats(const lens_moe *moe, int C);

/* out[N][C] = MoE(inp[N][C]). saved: NULL, or [N][saved_floats] to fill;
 * route: NULL, or [N][route_floats] to get each row's route record; scratch
 * [N][scratch_floats]. */
void lens_moe_forward(float *out, const float *inp, int N, int C, const lens_moe *moe, float *saved, float *route,
                      float *scratch, lens_pool *pool);
/* dinp[N][C] (+= with accumulate, else =) from dout[N][C]; weight gradients
 * through grad (NULL: none; then inp, the forward's input, is not read). */
void lens_moe_backward(float *dinp, int accumulate, const float *dout, const float *inp, int N, int C,
                       const lens_moe *moe, const float *saved, lens_moe_grad_fn grad, void *grad_ctx, float *scratch,
                       lens_pool *pool);
/* tout[N][C] from tinp[N][C]: N = B tangents of T saved rows, tangent row r
 * at primal row r % T. */
void lens_moe_jvp(float *tout, const float *tinp, int N, int T, int C, const lens_moe *moe, const float *saved,
                  float *scratch, lens_pool *pool);

#endif
