/* safetensors.h - reading and writing Hugging Face safetensors checkpoints.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data section; offsets are relative to the
 * start of the data section. The file is mmap'd read-only and every header
 * field is validated before any tensor is touched: header length bound,
 * dtype known, shape non-negative and its byte size equal to end - begin,
 * offsets within the file, tensors not overlapping, data aligned to the
 * element size.
 *
 * lens_weights is what models load from: one model.safetensors or the shards
 * listed in model.safetensors.index.json, looked up by tensor name, returned
 * as float32 (F32 data served from the mapping when aligned, F16/BF16
 * converted once into memory owned by the lens_weights). */
#ifndef LENS_SAFETENSORS_H
#define LENS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/err.h"

#define LENS_ST_MAX_DIMS 8

typedef enum { LENS_DT_F32, LENS_DT_F16, LENS_DT_BF16 } lens_dtype;

typedef struct {
    char *name;
    lens_dtype dtype;
    int ndim;
    int64_t shape[LENS_ST_MAX_DIMS];
    size_t nbytes;
    const void *data; /* points into the mapping */
} lens_st_tensor;

typedef struct {
    void *map;
    size_t map_len;
    lens_st_tensor *tensors;
    int n_tensors;
} lens_safetensors;

int lens_st_open(const char *path, lens_safetensors *st, lens_err *err);
void lens_st_close(lens_safetensors *st);
const lens_st_tensor *lens_st_find(const lens_safetensors *st, const char *name);

/* Writing (used by `lensd mkmodel` and training): F32 tensors only. */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[LENS_ST_MAX_DIMS];
    const float *data;
} lens_st_out;
int lens_st_write(const char *path, const lens_st_out *tensors, int n, lens_err *err);

/* A checkpoint folder's weights (single file or sharded). */
typedef struct lens_weights lens_weights;

lens_weights *lens_weights_open(const char *dir, lens_err *err);
void lens_weights_close(lens_weights *w);

/* Find tensor `name` with exactly the given shape (ndim dims) and return it
 * as float32. Errors name the tensor: LENS_ENOENT if absent, LENS_EFORMAT if
 * the shape differs ("bert.encoder.layer.0.attention.self.query.weight has
 * shape [64, 128], expected [128, 128]"). The memory lives as long as w. */
const float *lens_weights_get(lens_weights *w, const char *name, int ndim,
                              const int64_t *shape, lens_err *err);
int lens_weights_has(const lens_weights *w, const char *name);

/* Drop the pages of a tensor returned by lens_weights_get from memory when
 * it is served from a file mapping (the page-aligned interior of
 * p[0..n_floats), madvise MADV_DONTNEED): a model that keeps its own copy
 * (packed GEMM weights) stops paying for both. The data stays valid and
 * faults back in from the file if read again. No-op for converted tensors. */
void lens_weights_release(lens_weights *w, const float *p, size_t n_floats);

/* Bytes of float32 data held for the model (mapped + converted). */
size_t lens_weights_bytes(const lens_weights *w);

#endif
