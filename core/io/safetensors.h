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
 * listed in model.safetensors.index.json, looked up by tensor name. Matrices
 * are served from the mapping in the file's dtype (lens_weights_get_raw: an
 * 8B BF16 checkpoint stays 16 GB, not 32); small vectors are returned as
 * float32 (lens_weights_get: F16/BF16 converted once into memory owned by
 * the lens_weights). */
#ifndef LENS_SAFETENSORS_H
#define LENS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/base/dtype.h"
#include "core/base/err.h"

#define LENS_ST_MAX_DIMS 8

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

/* Writing (used by `lensd mkmodel` and training): float32 data written in
 * dtype (F32 unless set; F16/BF16 rounded to nearest even). */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[LENS_ST_MAX_DIMS];
    const float *data;
    lens_dtype dtype;
} lens_st_out;
int lens_st_write(const char *path, const lens_st_out *tensors, int n, lens_err *err);

/* Streaming writer: the header is built from the tensors' names, shapes and
 * dtypes first (data not read; the list must outlive the writer), then the
 * data is appended as float32 in any chunks, filling the tensors in list
 * order, so a checkpoint larger than memory is written a chunk at a time.
 * lens_st_writer_finish checks every element came, fsyncs and renames
 * path.tmp to path. */
typedef struct lens_st_writer lens_st_writer;
lens_st_writer *lens_st_writer_open(const char *path, const lens_st_out *tensors, int n, lens_err *err);
int lens_st_writer_put(lens_st_writer *w, const float *data, size_t n, lens_err *err); /* next n elements */
int lens_st_writer_finish(lens_st_writer *w, lens_err *err); /* frees w, also on failure */
void lens_st_writer_abort(lens_st_writer *w); /* unlinks the temporary file, frees w */

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

/* The same check, returning the tensor in its file dtype (*dtype) served
 * from the mapping without a copy; only a tensor at an address misaligned
 * for its element size is copied (as float32, *dtype = LENS_DT_F32).
 * Thread-safety as lens_weights_get. */
const void *lens_weights_get_raw(lens_weights *w, const char *name, int ndim, const int64_t *shape,
                                 lens_dtype *dtype, lens_err *err);

/* Drop the pages of a tensor returned by lens_weights_get(_raw) from memory
 * when it is served from a file mapping (the page-aligned interior of
 * p[0..nbytes), madvise MADV_DONTNEED): a model that keeps its own copy
 * (packed GEMM weights) stops paying for both. The data stays valid and
 * faults back in from the file if read again. No-op for converted tensors. */
void lens_weights_release(lens_weights *w, const void *p, size_t nbytes);

/* Bytes of weight data held for the model: tensors served from the
 * mappings (in their file dtype) + converted copies. */
size_t lens_weights_bytes(const lens_weights *w);

#endif
