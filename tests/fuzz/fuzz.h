/* fuzz.h - what every libFuzzer target of tests/fuzz shares.
 *
 * The loaders under test read paths (mmap, fopen), so an input becomes files:
 * fuzz_dir() is a private folder made once per process (under $TMPDIR, or
 * /dev/shm when it exists so the writes stay in memory), fuzz_write() puts
 * bytes in one of its files. fuzz_part() splits an input at NUL bytes into
 * the parts a target needs (vocabulary, merges, text, ...): part i is the
 * bytes after the i-th NUL, an empty part when the input has fewer.
 * FUZZ_REQUIRE is an invariant the code under test promises; breaking it
 * aborts, which libFuzzer reports as a crash with the input saved. */
#ifndef LENS_FUZZ_H
#define LENS_FUZZ_H

#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_REQUIRE(cond, ...)                                                 \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz invariant %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* Keeps reads of data under test from being optimised away (ASan must see them). */
static inline void fuzz_consume(double x)
{
    static volatile double sink;
    sink = x;
    (void)sink;
}

static char fuzz_dir_path[256];

static int fuzz_remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

static void fuzz_remove_dir(void)
{
    nftw(fuzz_dir_path, fuzz_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Removed at exit (a crash leaves it, with what the crashing input wrote). */
static inline const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0]) return fuzz_dir_path;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/lensd-fuzz-XXXXXX", base);
    FUZZ_REQUIRE(mkdtemp(fuzz_dir_path) != NULL, "cannot make a folder under %s", base);
    atexit(fuzz_remove_dir);
    return fuzz_dir_path;
}

/* fuzz_dir()/name; the returned buffer is one of 4 rotating ones. */
static inline const char *fuzz_path(const char *name)
{
    static char paths[4][512];
    static int next;
    char *p = paths[next++ & 3];
    snprintf(p, sizeof paths[0], "%s/%s", fuzz_dir(), name);
    return p;
}

static inline void fuzz_write(const char *name, const void *data, size_t len)
{
    FILE *f = fopen(fuzz_path(name), "wb");
    FUZZ_REQUIRE(f != NULL, "cannot write %s", fuzz_path(name));
    FUZZ_REQUIRE(fwrite(data, 1, len, f) == len && fclose(f) == 0, "short write to %s", name);
}

static inline void fuzz_remove(const char *name)
{
    unlink(fuzz_path(name));
}

/* Part i of data split at NUL bytes (the NULs themselves excluded). */
static inline void fuzz_part(const uint8_t *data, size_t size, int i, const uint8_t **part, size_t *len)
{
    size_t at = 0;
    for (; i > 0 && at <= size; i--) {
        const uint8_t *nul = at < size ? memchr(data + at, 0, size - at) : NULL;
        at = nul ? (size_t)(nul - data) + 1 : size + 1;
    }
    if (at > size) {
        *part = data + size, *len = 0;
        return;
    }
    const uint8_t *nul = memchr(data + at, 0, size - at);
    *part = data + at;
    *len = nul ? (size_t)(nul - (data + at)) : size - at;
}

/* A copy of a part with a terminating NUL (for APIs that take C strings). */
static inline char *fuzz_strndup(const uint8_t *p, size_t len)
{
    char *s = malloc(len + 1);
    FUZZ_REQUIRE(s != NULL, "out of memory");
    memcpy(s, p, len);
    s[len] = 0;
    return s;
}

#endif
