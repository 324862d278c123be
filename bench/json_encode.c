/* json_encode.c - the fast float writer (api/json_writer.c) against jansson's
 * per-number path on a full BERT-base attention tensor:
 * 12 layers x 12 heads x 512 x 512 float32 = 37.7M values, precision 6
 * (significant digits, what format.precision means; 6 decimals for comparison).
 *
 * jansson path: per (layer, head), a json array of 512 arrays of 512
 * json_real, dumped with JSON_REAL_PRECISION(6) and freed (building all 144
 * matrices at once would need ~1.5 GB of json_t nodes). Writer path: the
 * same 144 matrices appended to one buffer with jw_floats_2d; and base64.
 * Prints seconds, MB written and the speed-up. Needs libapp (json_writer). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/json_writer.h"

#define L 12
#define NH 12
#define T 512

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int layers = argc > 1 ? atoi(argv[1]) : L; /* fewer layers for a quick run */
    size_t per = (size_t)T * T, n = (size_t)layers * NH * per;
    float *attn = malloc(n * sizeof *attn);
    if (!attn) return 1;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        attn[i] = (float)((double)(s >> 11) / 9007199254740992.0 * (2.0 / T)); /* softmax-like magnitudes */
    }

    double t0 = now();
    jw w;
    jw_init(&w);
    jw_arr(&w);
    for (int m = 0; m < layers * NH; m++) jw_floats_2d(&w, attn + (size_t)m * per, T, T, T, 6 | JW_SIGNIFICANT);
    jw_end(&w);
    double t_writer = now() - t0;
    size_t writer_bytes = w.len;
    jw_free(&w);

    /* the same with 6 decimals (the format before format.precision meant significant digits) */
    t0 = now();
    jw_init(&w);
    jw_arr(&w);
    for (int m = 0; m < layers * NH; m++) jw_floats_2d(&w, attn + (size_t)m * per, T, T, T, 6);
    jw_end(&w);
    double t_decimals = now() - t0;
    size_t decimals_bytes = w.len;
    jw_free(&w);

    t0 = now();
    jw_init(&w);
    jw_arr(&w);
    for (int m = 0; m < layers * NH; m++) {
        size_t shape[2] = {T, T};
        jw_base64_tensor(&w, attn + (size_t)m * per, shape, 2);
    }
    jw_end(&w);
    double t_base64 = now() - t0;
    size_t base64_bytes = w.len;
    jw_free(&w);

    t0 = now();
    size_t jansson_bytes = 0;
    for (int m = 0; m < layers * NH; m++) {
        const float *x = attn + (size_t)m * per;
        json_t *mat = json_array();
        for (int i = 0; i < T; i++) {
            json_t *row = json_array();
            for (int j = 0; j < T; j++) json_array_append_new(row, json_real(x[i * T + j]));
            json_array_append_new(mat, row);
        }
        char *out = json_dumps(mat, JSON_COMPACT | JSON_REAL_PRECISION(6));
        jansson_bytes += strlen(out);
        free(out);
        json_decref(mat);
    }
    double t_jansson = now() - t0;

    printf("attention tensor: %d layers x %d heads x %d x %d = %zu floats, precision 6\n", layers, NH, T, T, n);
    printf("jansson (json_real + json_dumps): %8.3f s  %7.1f MB  %6.1f Mfloat/s\n", t_jansson, jansson_bytes / 1e6,
           n / t_jansson / 1e6);
    printf("jw_floats_2d (6 significant):     %8.3f s  %7.1f MB  %6.1f Mfloat/s  %.1fx faster\n", t_writer,
           writer_bytes / 1e6, n / t_writer / 1e6, t_jansson / t_writer);
    printf("jw_floats_2d (6 decimals):        %8.3f s  %7.1f MB  %6.1f Mfloat/s  %.1fx faster\n", t_decimals,
           decimals_bytes / 1e6, n / t_decimals / 1e6, t_jansson / t_decimals);
    printf("jw_base64_tensor:                 %8.3f s  %7.1f MB  %6.1f Mfloat/s  %.1fx faster\n", t_base64,
           base64_bytes / 1e6, n / t_base64 / 1e6, t_jansson / t_base64);
    free(attn);
    return 0;
}
