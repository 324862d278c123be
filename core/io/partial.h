/* partial.h - the partial state of one shard of a dataset job (lensd job run
 * --shard I/N), reduced by lensd job merge (docs/operations.md, "Sharded
 * jobs").
 *
 * File layout, little-endian:
 *   "LENSPART"                 8 bytes
 *   n                          u64, length of the header
 *   header                     n bytes of JSON (below)
 *   tensor data                each tensor's bytes at its offset (from the end of the header)
 * Header:
 *   {"format": "lensd-partial", "version": 1, "kind": K, "params": {...},
 *    "params_hash": "fnv1a64:...", "model": {"name", "fingerprint"},
 *    "shard": {"index": I, "count": N}, "rows": {"total": R, "in_shard": r},
 *    "tensors": [{"name", "dtype": "f64" | "i64" | "u8", "length", "offset"}]}
 * Tensors are flat arrays; the kind that wrote them knows their shapes and
 * checks the lengths when it reads them back. Readers validate every header
 * field and every offset before trusting it. */
#ifndef LENS_PARTIAL_H
#define LENS_PARTIAL_H

#include <jansson.h>
#include <stdint.h>

#include "core/base/err.h"

#define LENS_PARTIAL_VERSION 1

typedef enum { LENS_PT_F64, LENS_PT_I64, LENS_PT_U8 } lens_pt_dtype; /* u8: bytes, e.g. JSON text */

typedef struct {
    char name[64];
    lens_pt_dtype dtype;
    int64_t length;  /* elements */
    void *data;      /* double[length], int64_t[length] or unsigned char[length], owned */
} lens_pt_tensor;

typedef struct {
    json_t *header;  /* owned; every key but "tensors" (which read/write derive from the tensors) */
    int n_tensors;
    lens_pt_tensor *tensors;
} lens_partial;

/* Bytes per element of dtype. */
size_t lens_partial_dtype_size(lens_pt_dtype dtype);

/* An empty partial whose header is {"format", "version"}. */
int lens_partial_init(lens_partial *p, lens_err *err);
void lens_partial_free(lens_partial *p);

/* Copies data (length elements) in under name; names are unique. */
int lens_partial_add(lens_partial *p, const char *name, lens_pt_dtype dtype, int64_t length, const void *data,
                     lens_err *err);
/* The tensor called name, or NULL. */
const lens_pt_tensor *lens_partial_find(const lens_partial *p, const char *name);
/* The tensor called name with exactly length elements of dtype, or NULL and err says why. */
const void *lens_partial_get(const lens_partial *p, const char *name, lens_pt_dtype dtype, int64_t length,
                             lens_err *err);

int lens_partial_write(const lens_partial *p, const char *path, lens_err *err);
int lens_partial_read(const char *path, lens_partial *p, lens_err *err);
/* The same from memory (the fuzz target and the reader share it). */
int lens_partial_parse(const unsigned char *buf, size_t len, lens_partial *p, lens_err *err);

/* FNV-1a, 64 bits: the params and model fingerprints of a partial. */
uint64_t lens_fnv1a64(uint64_t h, const void *data, size_t n);
#define LENS_FNV1A64_INIT 0xcbf29ce484222325ULL

#endif
