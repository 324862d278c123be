/* hidden_attribution.h - hidden token attribution (Brunner et al. 2020).
 *
 * Paper: G. Brunner, Y. Liu, D. Pascual, O. Richter, M. Ciaramita,
 * R. Wattenhofer, "On Identifiability in Transformers", ICLR 2020, sec. 5.
 *
 * For one sequence of T tokens, h^0 [T][C] the embedding output (BERT: after
 * the embedding LayerNorm; GPT-2: token + position) and h^l [T][C] the
 * output of layer l (GPT-2 layer L with ln_f, as HF hidden_states):
 *
 *     c^l_{j,i} = ‖∂h^l_j/∂h^0_i‖_F / Σ_k ‖∂h^l_j/∂h^0_k‖_F
 *
 * ‖·‖_F is the Frobenius norm of the C x C Jacobian block (NOT ‖1ᵀJ‖).
 *
 * method exact: forward-mode derivatives (JVPs) of every one-hot input
 * direction e_{i,c} (T·C of them), batched as GEMM rows; one pass gives
 * ∂h^l/∂h^0_{i,c} for every layer l at once (docs/hidden-attribution.md has
 * the measurement against reverse mode).
 * method estimate: P random probes v ∈ {±1}^C (Rademacher) per input token
 * i, n̂ = (1/P) Σ_p ‖J_{ji} v_p‖², an unbiased estimate of ‖J_{ji}‖_F²
 * with Var(‖Jv‖²) = 2(‖JᵀJ‖_F² − Σ_k (JᵀJ)_kk²); the standard error per
 * entry is the sample standard deviation / sqrt(P). Costs P/C of exact.
 *
 * Shapes: T tokens, C = d_model, L layers; matrices [T][T], row j = output
 * token, column i = input token. */
#ifndef LENS_HIDDEN_ATTRIBUTION_H
#define LENS_HIDDEN_ATTRIBUTION_H

#include <stddef.h>
#include <stdint.h>

#include "core/model/model.h"

typedef enum { LENS_HTA_EXACT = 0, LENS_HTA_ESTIMATE = 1 } lens_hta_method;

typedef struct {
    lens_hta_method method;
    int probes;                 /* estimate: P per input token; 0 = 16 */
    uint64_t seed;              /* estimate: probe seed; 0 = 1 */
    const int *layers;          /* 0..L to report; NULL = 1..L */
    int n_layers;
    size_t max_scratch_bytes;   /* tangent buffers; 0 = 256 MiB */
    const volatile int *cancel; /* optional; non-zero stops with LENS_ECANCEL */
    void (*progress)(void *user, double fraction);
    void *progress_user;
    lens_pool *pool;            /* threads for the tangent GEMMs and heads (core/base/pool.h); NULL = the caller */
} lens_hta_opts;

typedef struct {
    int layer;
    float *norm2;        /* [T][T] ‖∂h^l_j/∂h^0_i‖_F² (estimate: the probe mean) */
    float *norm2_stderr; /* [T][T] estimate only: standard error of norm2, else NULL */
    float *contrib;      /* [T][T] c_{j,i}; rows sum to 1 */
    float *self;         /* [T] c_{j,j} */
    int *self_rank;      /* [T] rank of c_{j,j} in row j (1 = largest) */
    float *by_distance;  /* [T] mean c_{j,i} over pairs with |i−j| = d (causal: i <= j only) */
} lens_hta_layer;

typedef struct {
    int T, C;
    lens_hta_method method;
    int probes;
    int n_layers;
    lens_hta_layer *layers;
} lens_hta_result;

int lens_hidden_attribution(const lens_model *m, const int *ids, const int *type_ids, int T,
                            const lens_hta_opts *opts, lens_hta_result *out, lens_err *err);
void lens_hta_result_free(lens_hta_result *r);

/* The model from h^0 up, as the attribution differentiates it: hidden
 * [L+1][T][C] from h0 [T][C] (for tests: finite differences, agreement with
 * lens_forward). */
int lens_hta_forward_from(const lens_model *m, const float *h0, int T, float *hidden, lens_err *err);
/* Floating-point operations of lens_hidden_attribution for T tokens up to
 * layer top with method (probes: estimate's P, 0 = 16) on this
 * architecture, the path it will take included (the API's cost model). */
double lens_hta_flops(const lens_model *m, int T, int top, lens_hta_method method, int probes);
/* h^0 [T][C] of a sequence (the embedding output). */
int lens_hta_embed(const lens_model *m, const int *ids, const int *type_ids, int T, float *h0, lens_err *err);

#endif
