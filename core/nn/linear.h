/* linear.h - the parameter views the nn ops read (a linear map, a
 * LayerNorm's gain and bias) and a linear map's product through the GEMM,
 * forward and input gradient. A model's tensors are filled into these by
 * core/model; core/nn and core/base know nothing of models. */
#ifndef LENS_LINEAR_H
#define LENS_LINEAR_H

#include <stddef.h>

#include "core/base/dtype.h"
#include "core/base/gemm.h"
#include "core/base/pool.h"

/* A linear map y = x W^T + b (HF nn.Linear, W is [out][in]) or y = x W + b
 * (GPT-2 Conv1D, W is [in][out]); ld is W's row stride, which lets GPT-2's
 * fused c_attn be viewed as three maps. W is in the checkpoint's dtype,
 * served from its mapping (read it through lens_widen / lens_dtype_at, or
 * the GEMM, which widens while packing); the bias is always float32. */
typedef struct {
    const void *w;  /* [out][in] or [in][out] elements of dtype */
    const float *b;
    int in, out, ld;
    int w_in_out; /* 1: W stored [in][out] (Conv1D), 0: [out][in] (Linear) */
    const void *packed; /* W in lens_gemm panel layout in its dtype, packed at load (owned by the model), or NULL */
    lens_dtype dtype;    /* of w: F32 (0, what code building a map by hand gets), BF16, F16 */
} lens_linear;

typedef struct {
    const float *w, *b; /* [C] */
} lens_layernorm;

/* out[N][OC] = inp[N][IC] W + b for a lens_linear (packed weights when the
 * model packed them). */
void lens_gemm_linear(float *out, const float *inp, const lens_linear *lin, int N, lens_pool *pool);
/* The same with row strides: out[n] at out + n * ld_out, inp[n] at inp + n * ld_inp.
 * An output stride that is a multiple of 1024 floats puts a tile's 12 rows
 * in one L1 set (4 KiB aliasing, 10-20% at N = 3072): lens_gemm then works
 * on a padded copy of y (gemm.c product_padded), which costs a pass over y,
 * so buffers the caller owns are better padded (forward.c's ff rows). */
void lens_gemm_linear_ld(float *out, size_t ld_out, const float *inp, size_t ld_inp, const lens_linear *lin, int N,
                         lens_pool *pool);
/* The same followed by post(row, lin->out) on every output row, fused (see
 * lens_gemm_args.post). */
void lens_gemm_linear_post(float *out, size_t ld_out, const float *inp, size_t ld_inp, const lens_linear *lin, int N,
                           void (*post)(float *y, size_t n), lens_pool *pool);

/* The input gradient of a lens_linear: dinp[N][in] = dout[N][out] W^T in the
 * map's orientation (+= with accumulate), W^T packed panel by panel during the
 * call: from the map's packed panels when it has them (32 x 32 transposes;
 * the loader released the mapped weights after packing them), else from w. */
void lens_gemm_linear_backward(float *dinp, const float *dout, const lens_linear *lin, int N, int accumulate,
                               lens_pool *pool);

#endif
