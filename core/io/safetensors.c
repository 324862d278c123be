/* safetensors.c - owns checkpoint I/O: mapping and validating safetensors
 * files (lens_st_open), writing them tensor by tensor (lens_st_writer), the
 * F32/F16/BF16 element conversions, and the per-model weight table that
 * resolves tensor names across shards and hands out tensors in their file
 * dtype or as float32 (lens_weights).
 *
 * Trust model: the file is untrusted input. Nothing in the header is used
 * (no pointer formed, no size allocated) until the whole header has been
 * checked: header length bound, JSON object, every tensor's dtype, shape,
 * byte size and offsets, and that no two tensors overlap. Only then are the
 * lens_st_tensor.data pointers set.
 *
 * Byte order: safetensors is little-endian and tensors are served
 * straight from the mapping, so this file only builds on little-endian
 * hosts (every target lensd runs on). */
#include "core/io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c serves little-endian F32 data from the mapping; big-endian hosts need a byte-swapping path"
#endif

/* Same bound as the reference implementation (safetensors MAX_HEADER_SIZE):
 * large enough for any real checkpoint, small enough that a corrupt length
 * cannot make json_loadb walk hundreds of megabytes. */
#define ST_MAX_HEADER 100000000ULL

/* ------------------------------------------------------------- dtypes */

static size_t dtype_size(lens_dtype dt)
{
    return lens_dtype_size(dt);
}

/* Dtypes the format defines but lensd does not compute in. Listed so the
 * error can say "unsupported" (a real checkpoint we cannot use) rather than
 * "unknown" (a corrupt or foreign file). */
static const char *const st_other_dtypes[] = {
    "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64",
};

/* 0 and *dt set when s is F32/F16/BF16; 1 when known but unsupported;
 * -1 when not a safetensors dtype at all. */
static int parse_dtype(const char *s, lens_dtype *dt)
{
    if (!strcmp(s, "F32")) { *dt = LENS_DT_F32; return 0; }
    if (!strcmp(s, "F16")) { *dt = LENS_DT_F16; return 0; }
    if (!strcmp(s, "BF16")) { *dt = LENS_DT_BF16; return 0; }
    for (size_t i = 0; i < sizeof st_other_dtypes / sizeof *st_other_dtypes; i++)
        if (!strcmp(s, st_other_dtypes[i])) return 1;
    return -1;
}

/* "[128, 64]" into buf (always terminated; truncated if absurdly long). */
static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* ------------------------------------------------------------- reading */

/* Offsets kept apart from lens_st_tensor (which only has data/nbytes) for
 * the overlap check. */
typedef struct {
    uint64_t begin, end;
    int index;
} st_span;

static int cmp_span(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const lens_st_tensor *)a)->name, ((const lens_st_tensor *)b)->name);
}

static int read_u64_index(json_t *arr, size_t i, uint64_t *out)
{
    json_t *v = json_array_get(arr, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Validate one header entry and fill t (name not set) and span. */
static int parse_tensor_entry(const char *path, const char *name, json_t *entry,
                              uint64_t data_len, lens_st_tensor *t, st_span *span,
                              lens_err *err)
{
    if (!json_is_object(entry))
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': header entry is not a JSON object", path, name);

    json_t *jdtype = json_object_get(entry, "dtype");
    json_t *jshape = json_object_get(entry, "shape");
    json_t *joffs = json_object_get(entry, "data_offsets");
    if (!jdtype) return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': missing \"dtype\"", path, name);
    if (!jshape) return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': missing \"shape\"", path, name);
    if (!joffs) return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': missing \"data_offsets\"", path, name);

    if (!json_is_string(jdtype))
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': \"dtype\" is not a string", path, name);
    const char *ds = json_string_value(jdtype);
    int known = parse_dtype(ds, &t->dtype);
    if (known > 0)
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': unsupported dtype %s (lensd reads F32, F16, BF16)",
                         path, name, ds);
    if (known < 0)
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': unknown dtype \"%.32s\"", path, name, ds);

    if (!json_is_array(jshape))
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': \"shape\" is not an array", path, name);
    size_t ndim = json_array_size(jshape);
    if (ndim > LENS_ST_MAX_DIMS)
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': %zu dimensions, at most %d supported",
                         path, name, ndim, LENS_ST_MAX_DIMS);
    t->ndim = (int)ndim;
    uint64_t nelem = 1;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(jshape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                             path, name, i);
        t->shape[i] = json_integer_value(d);
        if (__builtin_mul_overflow(nelem, (uint64_t)t->shape[i], &nelem))
            return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': shape element count overflows", path, name);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(nelem, (uint64_t)dtype_size(t->dtype), &nbytes) || nbytes > SIZE_MAX)
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': shape byte size overflows", path, name);

    uint64_t begin, end;
    if (!json_is_array(joffs) || json_array_size(joffs) != 2 || read_u64_index(joffs, 0, &begin) ||
        read_u64_index(joffs, 1, &end))
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': \"data_offsets\" is not [begin, end] of non-negative integers",
                         path, name);
    if (begin > end)
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu",
                         path, name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return lens_fail(err, LENS_EFORMAT,
                         "%s: tensor '%s': data_offsets end %llu is past the data section (%llu bytes; file truncated?)",
                         path, name, (unsigned long long)end, (unsigned long long)data_len);
    if (end - begin != nbytes) {
        char sb[160];
        return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': %s %s needs %llu bytes but data_offsets span %llu",
                         path, name, lens_dtype_name(t->dtype), shape_str(sb, sizeof sb, t->ndim, t->shape),
                         (unsigned long long)nbytes, (unsigned long long)(end - begin));
    }
    t->nbytes = (size_t)nbytes;
    span->begin = begin;
    span->end = end;
    return 0;
}

/* __metadata__ is free-form string -> string; checked so a malformed file is
 * not half-accepted, then ignored. */
static int check_metadata(const char *path, json_t *meta, lens_err *err)
{
    if (!json_is_object(meta))
        return lens_fail(err, LENS_EFORMAT, "%s: \"__metadata__\" is not a JSON object", path);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return lens_fail(err, LENS_EFORMAT, "%s: \"__metadata__\" value for '%s' is not a string", path, k);
    }
    return 0;
}

/* Validate the header of the mapped file [map, map+size) and build
 * st->tensors. st->map is already set; on failure the caller unmaps. */
static int parse_header(const char *path, const unsigned char *map, size_t size,
                        lens_safetensors *st, lens_err *err)
{
    if (size == 0)
        return lens_fail(err, LENS_EFORMAT, "%s: file is empty", path);
    if (size < 8)
        return lens_fail(err, LENS_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length (truncated?)",
                         path, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | map[i];
    if (hlen < 2)
        return lens_fail(err, LENS_EFORMAT, "%s: header length %llu is too small for a JSON object",
                         path, (unsigned long long)hlen);
    if (hlen > ST_MAX_HEADER)
        return lens_fail(err, LENS_EFORMAT, "%s: header length %llu exceeds the %llu-byte limit (corrupt file?)",
                         path, (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > size - 8)
        return lens_fail(err, LENS_EFORMAT, "%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                         path, (unsigned long long)hlen, size);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)map + 8, (size_t)hlen, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_duplicate_key)
            return lens_fail(err, LENS_EFORMAT, "%s: header names a tensor twice (%s)", path, jerr.text);
        return lens_fail(err, LENS_EFORMAT, "%s: header is not valid JSON: %s (at byte %d)",
                         path, jerr.text, jerr.position);
    }
    int rc = -1;
    st_span *spans = NULL;
    lens_st_tensor *tensors = NULL;
    int n = 0;
    if (!json_is_object(root)) {
        lens_fail(err, LENS_EFORMAT, "%s: header is not a JSON object", path);
        goto done;
    }

    size_t cap = json_object_size(root);
    uint64_t data_len = size - 8 - hlen;
    tensors = calloc(cap ? cap : 1, sizeof *tensors);
    spans = calloc(cap ? cap : 1, sizeof *spans);
    if (!tensors || !spans) {
        lens_fail(err, LENS_ENOMEM, "%s: out of memory for %zu header entries", path, cap);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (check_metadata(path, val, err)) goto done;
            continue;
        }
        lens_st_tensor *t = &tensors[n];
        if (parse_tensor_entry(path, key, val, data_len, t, &spans[n], err)) goto done;
        if (!(t->name = strdup(key))) {
            lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        spans[n].index = n;
        n++;
    }

    /* Overlap: sorted by begin, a non-empty tensor must start at or after
     * the furthest end seen so far. Empty tensors occupy no bytes. */
    qsort(spans, (size_t)n, sizeof *spans, cmp_span);
    uint64_t max_end = 0;
    int max_end_owner = -1;
    for (int i = 0; i < n; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (max_end_owner >= 0 && spans[i].begin < max_end) {
            lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (ends at %llu)",
                      path, tensors[spans[i].index].name, (unsigned long long)spans[i].begin,
                      (unsigned long long)spans[i].end, tensors[max_end_owner].name,
                      (unsigned long long)max_end);
            goto done;
        }
        if (spans[i].end > max_end) {
            max_end = spans[i].end;
            max_end_owner = spans[i].index;
        }
    }

    /* Everything checked: now form the pointers. */
    const unsigned char *data = map + 8 + hlen;
    for (int i = 0; i < n; i++) tensors[spans[i].index].data = data + spans[i].begin;
    qsort(tensors, (size_t)n, sizeof *tensors, cmp_tensor_name);
    /* jansson already rejected duplicate keys; this guards lens_st_find's
     * bsearch against any path where that changes. */
    for (int i = 1; i < n; i++) {
        if (!strcmp(tensors[i - 1].name, tensors[i].name)) {
            lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' appears twice", path, tensors[i].name);
            goto done;
        }
    }
    st->tensors = tensors;
    st->n_tensors = n;
    tensors = NULL;
    rc = 0;
done:
    if (tensors) {
        for (int i = 0; i < n; i++) free(tensors[i].name);
        free(tensors);
    }
    free(spans);
    json_decref(root);
    return rc;
}

int lens_st_open(const char *path, lens_safetensors *st, lens_err *err)
{
    memset(st, 0, sizeof *st);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return lens_fail(err, errno == ENOENT ? LENS_ENOENT : LENS_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return lens_fail(err, LENS_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return lens_fail(err, LENS_EIO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return lens_fail(err, LENS_EIO, "%s: cannot mmap %zu bytes: %s", path, size, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file alive */
    st->map = map;
    st->map_len = size;
    if (parse_header(path, map, size, st, err)) {
        lens_st_close(st);
        return -1;
    }
    return 0;
}

void lens_st_close(lens_safetensors *st)
{
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    if (st->map) munmap(st->map, st->map_len);
    memset(st, 0, sizeof *st);
}

const lens_st_tensor *lens_st_find(const lens_safetensors *st, const char *name)
{
    if (!st->n_tensors) return NULL;
    lens_st_tensor key = {.name = (char *)name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof key, cmp_tensor_name);
}

/* ------------------------------------------------------------- writing */

/* Header JSON (compact) for tensors laid out back to back in the given
 * order; *data_bytes gets the data section size. NULL + err on bad input. */
static char *build_header(const char *path, const lens_st_out *tensors, int n,
                          uint64_t *data_bytes, lens_err *err)
{
    json_t *root = json_object();
    json_t *meta = json_object();
    if (!root || !meta || json_object_set_new(meta, "format", json_string("pt")) ||
        json_object_set_new(root, "__metadata__", meta)) {
        json_decref(root);
        lens_fail(err, LENS_ENOMEM, "%s: out of memory building header", path);
        return NULL;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        const lens_st_out *t = &tensors[i];
        const char *name = t->name ? t->name : "(null)";
        if (!t->name || !strcmp(t->name, "__metadata__") || json_object_get(root, t->name)) {
            lens_fail(err, LENS_EINVAL, "%s: tensor %d: name '%s' is missing, reserved or repeated", path, i, name);
            goto fail;
        }
        if (t->ndim < 0 || t->ndim > LENS_ST_MAX_DIMS) {
            lens_fail(err, LENS_EINVAL, "%s: tensor '%s': ndim %d out of range 0..%d", path, name, t->ndim,
                      LENS_ST_MAX_DIMS);
            goto fail;
        }
        /* set_new steals the value even when it fails, so nothing is
         * decref'd twice here. */
        json_t *entry = json_object();
        json_t *shape = json_array();
        json_t *offs = json_array();
        if ((unsigned)t->dtype > LENS_DT_BF16) {
            json_decref(entry), json_decref(shape), json_decref(offs);
            lens_fail(err, LENS_EINVAL, "%s: tensor '%s': unknown dtype %d", path, name, (int)t->dtype);
            goto fail;
        }
        if (json_object_set_new(entry, "dtype", json_string(lens_dtype_name(t->dtype))) ||
            json_object_set_new(entry, "shape", shape) || json_object_set_new(entry, "data_offsets", offs)) {
            json_decref(entry);
            lens_fail(err, LENS_ENOMEM, "%s: out of memory building header", path);
            goto fail;
        }
        if (json_object_set_new(root, t->name, entry)) {
            lens_fail(err, LENS_EINVAL, "%s: tensor '%s': cannot add to header (name not UTF-8?)", path, name);
            goto fail;
        }
        uint64_t nbytes = dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || __builtin_mul_overflow(nbytes, (uint64_t)t->shape[d], &nbytes)) {
                lens_fail(err, LENS_EINVAL, "%s: tensor '%s': bad or overflowing shape", path, name);
                goto fail;
            }
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        json_array_append_new(offs, json_integer((json_int_t)offset));
        if (__builtin_add_overflow(offset, nbytes, &offset) || offset > INT64_MAX) {
            lens_fail(err, LENS_EINVAL, "%s: total data size overflows", path);
            goto fail;
        }
        json_array_append_new(offs, json_integer((json_int_t)offset));
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) lens_fail(err, LENS_ENOMEM, "%s: out of memory serialising header", path);
    *data_bytes = offset;
    return text;
fail:
    json_decref(root);
    return NULL;
}

struct lens_st_writer {
    char *path, *tmp;
    FILE *f;
    const lens_st_out *tensors; /* the caller's list: names, shapes, dtypes */
    int n, cur;                 /* tensor being filled, -1 before the first */
    size_t left;                /* its elements still to come */
};

/* Elements of tensor t (the header already checked the product). */
static size_t out_elems(const lens_st_out *t)
{
    size_t nelem = 1;
    for (int d = 0; d < t->ndim; d++) nelem *= (size_t)t->shape[d];
    return nelem;
}

void lens_st_writer_abort(lens_st_writer *w)
{
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->tmp) unlink(w->tmp);
    free(w->path), free(w->tmp), free(w);
}

lens_st_writer *lens_st_writer_open(const char *path, const lens_st_out *tensors, int n, lens_err *err)
{
    if (n < 0 || (n > 0 && !tensors)) {
        lens_fail(err, LENS_EINVAL, "%s: invalid tensor list (n = %d)", path, n);
        return NULL;
    }
    uint64_t data_bytes;
    char *header = build_header(path, tensors, n, &data_bytes, err);
    if (!header) return NULL;
    /* Pad with spaces (valid JSON whitespace) so the data section starts at
     * a multiple of 8, as the reference writer does: every tensor of one
     * dtype is then aligned to its element size in the mapping. */
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) & ~(size_t)7;
    unsigned char len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    lens_st_writer *w = calloc(1, sizeof *w);
    size_t plen = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(plen + 5))) {
        free(header);
        if (w) free(w->path), free(w);
        lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    memcpy(w->tmp, path, plen);
    memcpy(w->tmp + plen, ".tmp", 5);
    w->tensors = tensors, w->n = n, w->cur = -1;
    if (!(w->f = fopen(w->tmp, "wb"))) {
        lens_fail(err, errno == ENOENT ? LENS_ENOENT : LENS_EIO, "%s: cannot create: %s", w->tmp, strerror(errno));
        free(header), free(w->tmp), w->tmp = NULL;
        lens_st_writer_abort(w);
        return NULL;
    }
    static const char spaces[] = "       "; /* padding is at most 7 */
    const int ok = fwrite(len_le, 1, 8, w->f) == 8 && fwrite(header, 1, hlen, w->f) == hlen &&
                   fwrite(spaces, 1, padded - hlen, w->f) == padded - hlen;
    free(header);
    if (!ok) {
        lens_fail(err, LENS_EIO, "%s: write failed: %s", w->tmp, strerror(errno));
        lens_st_writer_abort(w);
        return NULL;
    }
    return w;
}

int lens_st_writer_put(lens_st_writer *w, const float *data, size_t n, lens_err *err)
{
    unsigned char buf[8192]; /* narrowed in chunks: nothing the size of a tensor */
    while (n > 0) {
        while (w->left == 0) {
            if (w->cur + 1 >= w->n) return lens_fail(err, LENS_EINVAL, "%s: more data than the header lists", w->path);
            w->left = out_elems(&w->tensors[++w->cur]);
        }
        const lens_dtype dt = w->tensors[w->cur].dtype;
        const size_t es = dtype_size(dt), cap = dt == LENS_DT_F32 ? n : sizeof buf / es;
        const size_t k = n < w->left && n < cap ? n : w->left < cap ? w->left : cap;
        if (dt != LENS_DT_F32) lens_narrow(buf, data, dt, k);
        if (fwrite(dt == LENS_DT_F32 ? (const void *)data : buf, es, k, w->f) != k)
            return lens_fail(err, LENS_EIO, "%s: write failed: %s", w->tmp, strerror(errno));
        data += k, n -= k, w->left -= k;
    }
    return 0;
}

int lens_st_writer_finish(lens_st_writer *w, lens_err *err)
{
    int missing = w->left > 0;
    for (int i = w->cur + 1; i < w->n; i++) missing |= out_elems(&w->tensors[i]) > 0;
    if (missing) {
        lens_fail(err, LENS_EINVAL, "%s: less data than the header lists (tensor %d of %d)", w->path, w->cur + 1, w->n);
        lens_st_writer_abort(w);
        return -1;
    }
    /* fsync so the rename never publishes a file whose data is not on disk. */
    int ok = !ferror(w->f) && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    int write_errno = errno;
    if (fclose(w->f) != 0 && ok) ok = 0, write_errno = errno;
    w->f = NULL;
    if (!ok) {
        lens_fail(err, LENS_EIO, "%s: write failed: %s", w->tmp, strerror(write_errno));
        lens_st_writer_abort(w);
        return -1;
    }
    if (rename(w->tmp, w->path) != 0) {
        lens_fail(err, LENS_EIO, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
        lens_st_writer_abort(w);
        return -1;
    }
    free(w->tmp), w->tmp = NULL;
    lens_st_writer_abort(w); /* nothing left to unlink: frees */
    return 0;
}

int lens_st_write(const char *path, const lens_st_out *tensors, int n, lens_err *err)
{
    lens_st_writer *w = lens_st_writer_open(path, tensors, n, err);
    if (!w) return -1;
    for (int i = 0; i < n; i++) {
        const size_t nelem = out_elems(&tensors[i]);
        if (nelem && !tensors[i].data) {
            lens_fail(err, LENS_EINVAL, "%s: tensor '%s': no data", path, tensors[i].name);
            lens_st_writer_abort(w);
            return -1;
        }
        if (lens_st_writer_put(w, tensors[i].data, nelem, err)) {
            lens_st_writer_abort(w);
            return -1;
        }
    }
    return lens_st_writer_finish(w, err);
}

/* ------------------------------------------------------------- weights */

typedef struct {
    const lens_st_tensor *t; /* owned by shards[shard] */
    int shard;
    float *converted;        /* F16/BF16 widened or misaligned F32 copied; NULL until first get */
} weight_entry;

struct lens_weights {
    char *dir;          /* for messages about names in no shard */
    lens_safetensors *shards;
    char **shard_paths; /* for messages */
    int n_shards;
    weight_entry *entries; /* sorted by name */
    int n_entries;
    size_t mapped_bytes;    /* aligned F32 tensors served from the mappings */
    size_t converted_bytes; /* sum of converted buffers */
};

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const weight_entry *)a)->t->name, ((const weight_entry *)b)->t->name);
}

static weight_entry *find_entry(const lens_weights *w, const char *name)
{
    if (!w->n_entries) return NULL;
    lens_st_tensor kt = {.name = (char *)name};
    weight_entry key = {.t = &kt};
    return bsearch(&key, w->entries, (size_t)w->n_entries, sizeof key, cmp_entry_name);
}

/* Served from the mapping as is: aligned to its element size. */
static int is_aligned(const lens_st_tensor *t)
{
    return (uintptr_t)t->data % dtype_size(t->dtype) == 0;
}

static int is_aligned_f32(const lens_st_tensor *t)
{
    return t->dtype == LENS_DT_F32 && is_aligned(t);
}

static char *path_join(const char *dir, const char *file)
{
    size_t a = strlen(dir), b = strlen(file);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, file, b + 1);
    return p;
}

/* A shard name from the index must stay inside the checkpoint folder. */
static int plain_file_name(const char *s)
{
    return s[0] && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..") && strcmp(s, ".");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Distinct shard file names listed in the index (borrowed from idx),
 * sorted. Validates the index structure. */
static int read_index(const char *ipath, json_t *idx, const char ***files_out, int *n_out, lens_err *err)
{
    json_t *wm = json_is_object(idx) ? json_object_get(idx, "weight_map") : NULL;
    if (!json_is_object(wm))
        return lens_fail(err, LENS_EFORMAT, "%s: no \"weight_map\" object", ipath);
    size_t n = json_object_size(wm);
    if (n == 0) return lens_fail(err, LENS_EFORMAT, "%s: \"weight_map\" lists no tensors", ipath);
    const char **files = malloc(n * sizeof *files);
    if (!files) return lens_fail(err, LENS_ENOMEM, "%s: out of memory", ipath);
    size_t k = 0;
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            free(files);
            return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': shard is not a string", ipath, name);
        }
        const char *file = json_string_value(v);
        if (!plain_file_name(file)) {
            free(files);
            return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s': shard \"%.200s\" is not a plain file name in the checkpoint folder",
                             ipath, name, file);
        }
        files[k++] = file;
    }
    qsort(files, k, sizeof *files, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || strcmp(files[u - 1], files[i])) files[u++] = files[i];
    *files_out = files;
    *n_out = (int)u;
    return 0;
}

static int open_shards(lens_weights *w, const char *dir, const char *const *files, int n, lens_err *err)
{
    w->shards = calloc((size_t)n, sizeof *w->shards);
    w->shard_paths = calloc((size_t)n, sizeof *w->shard_paths);
    if (!w->shards || !w->shard_paths) return lens_fail(err, LENS_ENOMEM, "%s: out of memory", dir);
    for (int i = 0; i < n; i++) {
        if (!(w->shard_paths[i] = path_join(dir, files[i]))) return lens_fail(err, LENS_ENOMEM, "%s: out of memory", dir);
        w->n_shards = i + 1; /* count paths so close frees them; lens_st_close is safe on a zeroed struct */
        if (lens_st_open(w->shard_paths[i], &w->shards[i], err)) return -1;
    }
    return 0;
}

/* One sorted name table across all shards; a name in two shards is an error
 * since which copy a model gets would otherwise depend on shard order. */
static int build_entries(lens_weights *w, const char *dir, lens_err *err)
{
    size_t total = 0;
    for (int s = 0; s < w->n_shards; s++) total += (size_t)w->shards[s].n_tensors;
    w->entries = calloc(total ? total : 1, sizeof *w->entries);
    if (!w->entries) return lens_fail(err, LENS_ENOMEM, "%s: out of memory", dir);
    int k = 0;
    for (int s = 0; s < w->n_shards; s++) {
        for (int i = 0; i < w->shards[s].n_tensors; i++) {
            const lens_st_tensor *t = &w->shards[s].tensors[i];
            w->entries[k].t = t;
            w->entries[k].shard = s;
            k++;
            if (is_aligned(t)) w->mapped_bytes += t->nbytes;
        }
    }
    w->n_entries = k;
    qsort(w->entries, (size_t)k, sizeof *w->entries, cmp_entry_name);
    for (int i = 1; i < k; i++) {
        if (!strcmp(w->entries[i - 1].t->name, w->entries[i].t->name))
            return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' is in both %s and %s", dir, w->entries[i].t->name,
                             w->shard_paths[w->entries[i - 1].shard], w->shard_paths[w->entries[i].shard]);
    }
    return 0;
}

/* Every index entry must be found in the shard it names, so a stale index
 * fails at open rather than as a missing tensor later. */
static int check_index_matches(const lens_weights *w, const char *ipath, json_t *idx, lens_err *err)
{
    json_t *wm = json_object_get(idx, "weight_map");
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        const weight_entry *e = find_entry(w, name);
        const char *file = json_string_value(v);
        const char *got = e ? strrchr(w->shard_paths[e->shard], '/') + 1 : NULL;
        if (!e || strcmp(got, file))
            return lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' is mapped to %s but that shard does not contain it",
                             ipath, name, file);
    }
    return 0;
}

lens_weights *lens_weights_open(const char *dir, lens_err *err)
{
    lens_weights *w = calloc(1, sizeof *w);
    char *single = path_join(dir, "model.safetensors");
    char *ipath = path_join(dir, "model.safetensors.index.json");
    json_t *idx = NULL;
    const char **files = NULL;
    if (!w || !single || !ipath || !(w->dir = strdup(dir))) {
        lens_fail(err, LENS_ENOMEM, "%s: out of memory", dir);
        goto fail;
    }
    int have_single = access(single, F_OK) == 0, have_index = access(ipath, F_OK) == 0;
    if (!have_single && !have_index) {
        lens_fail(err, LENS_ENOENT, "%s: no model.safetensors or model.safetensors.index.json", dir);
        goto fail;
    }
    if (have_single) {
        /* A folder with both is taken to be unsharded, as transformers does. */
        const char *one = "model.safetensors";
        if (open_shards(w, dir, &one, 1, err)) goto fail;
        if (build_entries(w, dir, err)) goto fail;
    } else {
        json_error_t jerr;
        idx = json_load_file(ipath, JSON_REJECT_DUPLICATES, &jerr);
        if (!idx) {
            lens_fail(err, LENS_EFORMAT, "%s: not valid JSON: %s (line %d)", ipath, jerr.text, jerr.line);
            goto fail;
        }
        int n_files = 0;
        if (read_index(ipath, idx, &files, &n_files, err)) goto fail;
        if (open_shards(w, dir, files, n_files, err)) goto fail;
        if (build_entries(w, dir, err)) goto fail;
        if (check_index_matches(w, ipath, idx, err)) goto fail;
    }
    free(files);
    json_decref(idx);
    free(single);
    free(ipath);
    return w;
fail:
    free(files);
    json_decref(idx);
    free(single);
    free(ipath);
    lens_weights_close(w);
    return NULL;
}

void lens_weights_close(lens_weights *w)
{
    if (!w) return;
    for (int i = 0; i < w->n_entries; i++) free(w->entries[i].converted);
    free(w->entries);
    for (int s = 0; s < w->n_shards; s++) {
        if (w->shards) lens_st_close(&w->shards[s]);
        free(w->shard_paths[s]);
    }
    free(w->shards);
    free(w->shard_paths);
    free(w->dir);
    free(w);
}

/* The entry of `name` when its shape is exactly shape[ndim], else NULL
 * and err names the tensor. */
static weight_entry *checked_entry(lens_weights *w, const char *name, int ndim, const int64_t *shape, lens_err *err)
{
    if (ndim < 0 || ndim > LENS_ST_MAX_DIMS || (ndim > 0 && !shape)) {
        lens_fail(err, LENS_EINVAL, "tensor '%s': expected ndim %d out of range", name, ndim);
        return NULL;
    }
    weight_entry *e = find_entry(w, name);
    if (!e) {
        lens_fail(err, LENS_ENOENT, "%s: no tensor '%s'", w->n_shards == 1 ? w->shard_paths[0] : w->dir, name);
        return NULL;
    }
    const lens_st_tensor *t = e->t;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        lens_fail(err, LENS_EFORMAT, "%s: tensor '%s' has shape %s, expected %s", w->shard_paths[e->shard], name,
                  shape_str(got, sizeof got, t->ndim, t->shape), shape_str(want, sizeof want, ndim, shape));
        return NULL;
    }
    return e;
}

/* The float32 copy of e's tensor, made on first use. F32 at an odd offset
 * (a header not padded to 4) is copied rather than rejected: the file is
 * valid, only unaligned float loads would be UB. */
static const float *converted(lens_weights *w, weight_entry *e, lens_err *err)
{
    if (e->converted) return e->converted;
    const lens_st_tensor *t = e->t;
    size_t nelem = t->nbytes / dtype_size(t->dtype);
    float *out = malloc(nelem ? nelem * sizeof *out : 1);
    if (!out) {
        lens_fail(err, LENS_ENOMEM, "%s: tensor '%s': out of memory converting %zu %s values",
                  w->shard_paths[e->shard], t->name, nelem, lens_dtype_name(t->dtype));
        return NULL;
    }
    lens_widen(out, t->data, t->dtype, nelem);
    e->converted = out;
    w->converted_bytes += nelem * sizeof *out;
    return out;
}

/* Not thread-safe: the first get of an F16/BF16 (or misaligned) tensor
 * allocates and caches its float32 copy. Models call this while loading, on
 * one thread; after that the weights are only read. */
const float *lens_weights_get(lens_weights *w, const char *name, int ndim,
                              const int64_t *shape, lens_err *err)
{
    weight_entry *e = checked_entry(w, name, ndim, shape, err);
    if (!e) return NULL;
    if (is_aligned_f32(e->t)) return e->t->data;
    return converted(w, e, err);
}

const void *lens_weights_get_raw(lens_weights *w, const char *name, int ndim, const int64_t *shape,
                                 lens_dtype *dtype, lens_err *err)
{
    weight_entry *e = checked_entry(w, name, ndim, shape, err);
    if (!e) return NULL;
    *dtype = is_aligned(e->t) ? e->t->dtype : LENS_DT_F32;
    return is_aligned(e->t) ? e->t->data : converted(w, e, err);
}

int lens_weights_has(const lens_weights *w, const char *name)
{
    return find_entry(w, name) != NULL;
}

size_t lens_weights_bytes(const lens_weights *w)
{
    return w ? w->mapped_bytes + w->converted_bytes : 0; /* NULL: a tokenizer-only model */
}

void lens_weights_release(lens_weights *w, const void *p, size_t nbytes)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t begin = (uintptr_t)p, end = begin + nbytes;
    for (int s = 0; s < w->n_shards; s++) {
        const uintptr_t map = (uintptr_t)w->shards[s].map, map_end = map + w->shards[s].map_len;
        if (!map || begin < map || end > map_end) continue;
        /* only whole pages inside the tensor: neighbours may still be in use */
        const uintptr_t lo = (begin + page - 1) & ~(page - 1), hi = end & ~(page - 1);
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
        return;
    }
}
