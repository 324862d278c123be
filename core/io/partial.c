/* partial.c - reading and writing shard partials (format in partial.h).
 * The reader trusts nothing: magic, header length, JSON, every tensor's name,
 * dtype, length and offset are checked against the file size before use. */
#include "core/io/partial.h"

#include "core/io/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC "LENSPART"
#define MAX_HEADER (64u << 20)
#define MAX_TENSORS 4096

uint64_t lens_fnv1a64(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {[LENS_PT_F64] = {"f64", sizeof(double)}, [LENS_PT_I64] = {"i64", sizeof(int64_t)}, [LENS_PT_U8] = {"u8", 1}};

size_t lens_partial_dtype_size(lens_pt_dtype d) { return dtypes[d].size; }
static const char *dtype_name(lens_pt_dtype d) { return dtypes[d].name; }

int lens_partial_init(lens_partial *p, lens_err *err)
{
    memset(p, 0, sizeof *p);
    p->header = json_pack("{s:s, s:i}", "format", "lensd-partial", "version", LENS_PARTIAL_VERSION);
    return p->header ? 0 : lens_fail(err, LENS_ENOMEM, "out of memory for a partial");
}

void lens_partial_free(lens_partial *p)
{
    for (int i = 0; i < p->n_tensors; i++) free(p->tensors[i].data);
    free(p->tensors);
    json_decref(p->header);
    memset(p, 0, sizeof *p);
}

const lens_pt_tensor *lens_partial_find(const lens_partial *p, const char *name)
{
    for (int i = 0; i < p->n_tensors; i++)
        if (!strcmp(p->tensors[i].name, name)) return &p->tensors[i];
    return NULL;
}

int lens_partial_add(lens_partial *p, const char *name, lens_pt_dtype dtype, int64_t length, const void *data,
                     lens_err *err)
{
    if (strlen(name) >= sizeof p->tensors->name || lens_partial_find(p, name) || length < 0 || p->n_tensors >= MAX_TENSORS)
        return lens_fail(err, LENS_EINVAL, "partial tensor \"%s\": bad or duplicate name, or bad length", name);
    lens_pt_tensor *t = realloc(p->tensors, sizeof *t * (size_t)(p->n_tensors + 1));
    if (!t) return lens_fail(err, LENS_ENOMEM, "out of memory for a partial");
    p->tensors = t;
    size_t bytes = (size_t)length * lens_partial_dtype_size(dtype);
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) return lens_fail(err, LENS_ENOMEM, "out of memory for partial tensor %s", name);
    if (bytes) memcpy(copy, data, bytes);
    t = &p->tensors[p->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype, t->length = length, t->data = copy;
    return 0;
}

const void *lens_partial_get(const lens_partial *p, const char *name, lens_pt_dtype dtype, int64_t length,
                             lens_err *err)
{
    const lens_pt_tensor *t = lens_partial_find(p, name);
    if (!t) {
        lens_fail(err, LENS_EFORMAT, "partial has no tensor \"%s\"", name);
        return NULL;
    }
    if (t->dtype != dtype || t->length != length) {
        lens_fail(err, LENS_EFORMAT, "partial tensor \"%s\" is %s[%lld], expected %s[%lld]", name,
                  dtype_name(t->dtype), (long long)t->length, dtype_name(dtype), (long long)length);
        return NULL;
    }
    return t->data;
}

int lens_partial_write(const lens_partial *p, const char *path, lens_err *err)
{
    json_t *h = json_deep_copy(p->header), *list = json_array();
    if (!h || !list) {
        json_decref(h), json_decref(list);
        return lens_fail(err, LENS_ENOMEM, "out of memory writing %s", path);
    }
    uint64_t offset = 0;
    for (int i = 0; i < p->n_tensors; i++) {
        const lens_pt_tensor *t = &p->tensors[i];
        json_array_append_new(list, json_pack("{s:s, s:s, s:I, s:I}", "name", t->name, "dtype", dtype_name(t->dtype),
                                              "length", (json_int_t)t->length, "offset", (json_int_t)offset));
        offset += (uint64_t)t->length * lens_partial_dtype_size(t->dtype);
    }
    json_object_set_new(h, "tensors", list);
    char *text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    if (!text) return lens_fail(err, LENS_ENOMEM, "out of memory writing %s", path);
    /* write to path.tmp and rename, so a killed shard never leaves a half file under the final name */
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        free(text);
        return lens_fail(err, LENS_EINVAL, "path too long: %s", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(text);
        return lens_fail(err, LENS_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    uint64_t n = strlen(text);
    unsigned char len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (unsigned char)(n >> (8 * i));
    int ok = fwrite(MAGIC, 1, 8, f) == 8 && fwrite(len_le, 1, 8, f) == 8 && fwrite(text, 1, n, f) == n;
    free(text);
    for (int i = 0; ok && i < p->n_tensors; i++) {
        const lens_pt_tensor *t = &p->tensors[i];
        ok = fwrite(t->data, lens_partial_dtype_size(t->dtype), (size_t)t->length, f) == (size_t)t->length;
    }
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return lens_fail(err, LENS_EIO, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

static int parse_tensor(lens_partial *p, json_t *d, const unsigned char *data, uint64_t data_len, lens_err *err)
{
    const char *name = NULL, *dtype = NULL;
    json_int_t length = -1, offset = -1;
    if (json_unpack(d, "{s:s, s:s, s:I, s:I}", "name", &name, "dtype", &dtype, "length", &length, "offset",
                    &offset) != 0)
        return lens_fail(err, LENS_EFORMAT, "partial: a tensor entry lacks name, dtype, length or offset");
    int dt = 0;
    while (dt < (int)(sizeof dtypes / sizeof *dtypes) && strcmp(dtype, dtypes[dt].name)) dt++;
    if (dt == (int)(sizeof dtypes / sizeof *dtypes))
        return lens_fail(err, LENS_EFORMAT, "partial tensor \"%.63s\": unknown dtype \"%.16s\"", name, dtype);
    const uint64_t size = lens_partial_dtype_size(dt);
    if (length < 0 || offset < 0 || (uint64_t)length > data_len / size || (uint64_t)offset > data_len ||
        (uint64_t)length * size > data_len - (uint64_t)offset)
        return lens_fail(err, LENS_EFORMAT, "partial tensor \"%.63s\": length %lld at offset %lld is outside the %llu "
                         "bytes of data", name, (long long)length, (long long)offset, (unsigned long long)data_len);
    return lens_partial_add(p, name, dt, length, data + offset, err);
}

int lens_partial_parse(const unsigned char *buf, size_t len, lens_partial *p, lens_err *err)
{
    memset(p, 0, sizeof *p);
    if (len < 16 || memcmp(buf, MAGIC, 8) != 0)
        return lens_fail(err, LENS_EFORMAT, "not a lensd partial (no LENSPART magic)");
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)buf[8 + i] << (8 * i);
    if (n > MAX_HEADER || n > len - 16)
        return lens_fail(err, LENS_EFORMAT, "partial header length %llu exceeds the file", (unsigned long long)n);
    json_error_t jerr;
    json_t *h = json_loadb((const char *)buf + 16, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!h || !json_is_object(h)) {
        json_decref(h);
        return lens_fail(err, LENS_EFORMAT, "partial header is not a JSON object");
    }
    const char *format = json_string_value(json_object_get(h, "format"));
    json_t *version = json_object_get(h, "version"), *list = json_object_get(h, "tensors");
    if (!format || strcmp(format, "lensd-partial") || !json_is_integer(version) || !json_is_array(list)) {
        json_decref(h);
        return lens_fail(err, LENS_EFORMAT, "partial header lacks format \"lensd-partial\", version or tensors");
    }
    if (json_integer_value(version) != LENS_PARTIAL_VERSION) {
        long long v = json_integer_value(version);
        json_decref(h);
        return lens_fail(err, LENS_EFORMAT, "partial version %lld; this lensd reads version %d", v,
                         LENS_PARTIAL_VERSION);
    }
    if (json_array_size(list) > MAX_TENSORS) {
        json_decref(h);
        return lens_fail(err, LENS_EFORMAT, "partial lists more than %d tensors", MAX_TENSORS);
    }
    const unsigned char *data = buf + 16 + n;
    const uint64_t data_len = len - 16 - n;
    size_t i;
    json_t *d;
    json_array_foreach(list, i, d) {
        if (parse_tensor(p, d, data, data_len, err)) {
            json_decref(h);
            lens_partial_free(p);
            return -1;
        }
    }
    json_object_del(h, "tensors");
    p->header = h;
    return 0;
}

int lens_partial_read(const char *path, lens_partial *p, lens_err *err)
{
    memset(p, 0, sizeof *p);
    size_t len = 0;
    unsigned char *buf = (unsigned char *)lens_file_read(path, &len, err);
    if (!buf) return -1;
    int rc = lens_partial_parse(buf, len, p, err);
    free(buf);
    if (rc && err) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        lens_fail(err, err->code, "%s: %s", path, why);
    }
    return rc;
}
