/* file.c - whole-file reads (file.h). */
#include "core/io/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *lens_file_read(const char *path, size_t *len, lens_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        lens_fail(err, errno == ENOENT ? LENS_ENOENT : LENS_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) { free(buf); buf = NULL; break; }
            buf = grown;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int read_error = ferror(f);
    fclose(f);
    if (!buf) { lens_fail(err, LENS_ENOMEM, "%s: out of memory", path); return NULL; }
    if (read_error) { free(buf); lens_fail(err, LENS_EIO, "%s: read error", path); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}
