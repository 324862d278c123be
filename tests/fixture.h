/* fixture.h - reading the JSON fixtures that the PyTorch scripts in tests/reference write.
 * Include after tests/check.h (json_floats reports through CHECK). */
#ifndef LENS_FIXTURE_H
#define LENS_FIXTURE_H

#include <jansson.h>
#include <stdlib.h>
#include <sys/types.h>

/* Numbers in a nested JSON array, or (size_t)-1 if anything else is in it. */
static inline size_t fixture_count_numbers(const json_t *j)
{
    if (!json_is_array(j)) return json_is_number(j) ? 1 : (size_t)-1;
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(j); i++) {
        size_t k = fixture_count_numbers(json_array_get(j, i));
        if (k == (size_t)-1) return k;
        n += k;
    }
    return n;
}

static inline void fixture_flatten(const json_t *j, float *out, size_t *pos)
{
    if (!json_is_array(j)) {
        out[(*pos)++] = (float)json_number_value(j);
        return;
    }
    for (size_t i = 0; i < json_array_size(j); i++) fixture_flatten(json_array_get(j, i), out, pos);
}

/* n numbers of a nested JSON array, row-major, or NULL (a failed CHECK).
 * Caller frees. */
static inline float *json_floats(const json_t *j, size_t n, const char *what)
{
    size_t have = j ? fixture_count_numbers(j) : (size_t)-1;
    CHECK(have == n, "%s: expected %zu numbers, found %zd", what, n, (ssize_t)have);
    if (have != n || n > ((size_t)1 << 32)) return NULL; /* fixtures are small */
    float *out = malloc((n ? n : 1) * sizeof *out);
    size_t pos = 0;
    if (out) fixture_flatten(j, out, &pos);
    return out;
}

#endif
