/* linear.c - a lens_linear's product and input gradient as lens_gemm calls
 * (core/nn/linear.h). */
#include "core/nn/linear.h"

void lens_gemm_linear_post(float *out, size_t ld_out, const float *inp, size_t ld_inp, const lens_linear *lin, int N,
                           void (*post)(float *y, size_t n), lens_pool *pool)
{
    const lens_gemm_args g = {.M = N, .N = lin->out, .K = lin->in, .x = inp, .ldx = ld_inp, .packed = lin->packed,
                              .w = lin->w, .w_dtype = lin->dtype, .ld = (size_t)lin->ld, .w_kn = lin->w_in_out,
                              .alpha = 1.0f,
                              .bias = lin->b, .y = out, .ldy = ld_out, .post = post};
    lens_gemm(&g, pool);
}

void lens_gemm_linear_ld(float *out, size_t ld_out, const float *inp, size_t ld_inp, const lens_linear *lin, int N,
                         lens_pool *pool)
{
    lens_gemm_linear_post(out, ld_out, inp, ld_inp, lin, N, NULL, pool);
}

void lens_gemm_linear(float *out, const float *inp, const lens_linear *lin, int N, lens_pool *pool)
{
    lens_gemm_linear_ld(out, (size_t)lin->out, inp, (size_t)lin->in, lin, N, pool);
}

void lens_gemm_linear_backward(float *dinp, const float *dout, const lens_linear *lin, int N, int accumulate,
                               lens_pool *pool)
{
    /* forward: out = inp W' with W'[in][out]; dinp = dout W'^T, and W'^T[o][i]
     * is w[o*ld + i] for a Linear ([out][in], k-major here) or w[i*ld + o]
     * for a Conv1D ([in][out], n-major here) */
    const lens_gemm_args g = {.M = N, .N = lin->in, .K = lin->out, .x = dout, .ldx = (size_t)lin->out,
                              .packed_t = lin->dtype == LENS_DT_F32 ? lin->packed : NULL, .w = lin->w, .w_dtype = lin->dtype, .ld = (size_t)lin->ld,
                              .w_kn = !lin->w_in_out, .alpha = 1.0f, .y = dinp, .ldy = (size_t)lin->in,
                              .accumulate = accumulate};
    lens_gemm(&g, pool);
}
