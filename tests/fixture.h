/* fixture.h - reading the JSON fixtures that the PyTorch scripts in tests/reference write.
 * Include after tests/check.h (the readers report through CHECK). Every
 * reader opens its file with fixture_load and takes each list of cases with
 * fixture_list, so a missing or emptied list fails the test. */
#ifndef LENS_FIXTURE_H
#define LENS_FIXTURE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

/* Why v is not a usable list of fixture cases ("missing", "not a list",
 * "empty"), or NULL when it is a non-empty array (or a non-empty object of
 * named cases, such as models by name). */
static inline const char *fixture_cases_problem(const json_t *v)
{
    if (!v) return "missing";
    if (json_is_object(v)) return json_object_size(v) ? NULL : "empty";
    if (!json_is_array(v)) return "not a list";
    return json_array_size(v) ? NULL : "empty";
}

/* v when it holds cases, else NULL after a failed CHECK: a fixture whose
 * list was emptied or renamed must fail its test, never check nothing. */
static inline const json_t *fixture_cases(const json_t *v, const char *what)
{
    const char *problem = fixture_cases_problem(v);
    CHECK(!problem, "%s is %s (a fixture list must hold cases)", what, problem);
    return problem ? NULL : v;
}

/* The list obj[key] through fixture_cases. */
static inline const json_t *fixture_list(const json_t *obj, const char *key, const char *what)
{
    char full[256];
    snprintf(full, sizeof full, "%.180s: \"%.60s\"", what, key);
    return fixture_cases(obj ? json_object_get(obj, key) : NULL, full);
}

/* A fixture file, parsed (a failed CHECK and NULL if it cannot be), that
 * records the command that made it ("command", see `make fixtures`). */
static inline json_t *fixture_load(const char *path)
{
    json_error_t e;
    json_t *fx = json_load_file(path, JSON_ALLOW_NUL, &e);
    CHECK(fx != NULL, "%s: %s (line %d; run from the repository root)", path, e.text, e.line);
    const char *cmd = json_string_value(json_object_get(fx, "command"));
    CHECK(!fx || (cmd && *cmd), "%s records no \"command\" that made it", path);
    return fx;
}

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
