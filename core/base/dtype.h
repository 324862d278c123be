/* dtype.h - the element types weights are held in (F32, F16, BF16) and
 * their exact widening to / rounding from float32. The safetensors reader
 * (core/io) names tensors' dtypes with these; the GEMM (core/base/gemm.h)
 * and every weight reader (core/nn, core/model) read elements through them. */
#ifndef LENS_DTYPE_H
#define LENS_DTYPE_H

#include <stddef.h>

typedef enum { LENS_DT_F32, LENS_DT_F16, LENS_DT_BF16 } lens_dtype;

/* Element helpers for weights held in a file dtype: every code that reads
 * weights element-wise (embedding rows, per-head slices, the GEMM's packing)
 * goes through these instead of dereferencing a float pointer. */
static inline size_t lens_dtype_size(lens_dtype dt)
{
    return dt == LENS_DT_F32 ? 4 : 2;
}
/* &base[i] for elements of dtype dt. */
static inline const void *lens_dtype_at(const void *base, lens_dtype dt, size_t i)
{
    return (const unsigned char *)base + i * lens_dtype_size(dt);
}
const char *lens_dtype_name(lens_dtype dt); /* "F32", "F16", "BF16" */
int lens_dtype_parse(const char *name, lens_dtype *dt); /* f32|bf16|f16, any case; -1: unknown */
/* dst[0..n) = src[0..n) widened to float32 (exact for all three dtypes);
 * src at any alignment. */
void lens_widen(float *dst, const void *src, lens_dtype dt, size_t n);
/* dst[i] += src[i] widened. */
void lens_widen_add(float *dst, const void *src, lens_dtype dt, size_t n);
/* dst[0..n) = src rounded to dt (round to nearest even; F32 copies). */
void lens_narrow(void *dst, const float *src, lens_dtype dt, size_t n);

#endif
