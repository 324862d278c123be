/* tokenize.c - benchmark driver: lens_tokenize throughput on one text.
 *
 *   tokenize --tokenizer DIR --text FILE [--reps 7]
 *
 * Loads the tokenizer files of DIR (tokenizer.json, ...) as lensd does,
 * tokenizes the whole of FILE in one lens_tokenize call --reps times (plus
 * one warm-up) and prints one JSON line: bytes, tokens, the best wall and
 * CPU time of a call (ms) and tokens/s by each. One thread; the peer is
 * bench/peer/tokenize_hf.mjs (HF's Rust tokenizers through Node). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/io/file.h"
#include "core/io/tokenizer.h"

int main(int argc, char **argv)
{
    const char *dir = NULL, *text_path = NULL;
    int reps = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokenizer")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--text")) text_path = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (!dir || !text_path || reps < 1) {
        fprintf(stderr, "usage: tokenize --tokenizer DIR --text FILE [--reps 7]\n");
        return 2;
    }
    size_t len = 0;
    lens_err err = { 0 };
    char *text = lens_file_read(text_path, &len, &err);
    lens_tokenizer *tok = text ? lens_tokenizer_load(dir, &err) : NULL;
    if (!tok) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 1;
    }
    double best_wall = 1e30, best_cpu = 1e30;
    int n_tokens = 0;
    for (int r = 0; r <= reps; r++) {
        lens_token *t = NULL;
        int n = 0;
        const double w0 = now_ms(), c0 = cpu_ms();
        if (lens_tokenize(tok, text, len, NULL, 0, &t, &n, &err)) {
            fprintf(stderr, "tokenize: %s\n", err.msg);
            return 1;
        }
        const double wall = now_ms() - w0, cpu = cpu_ms() - c0;
        free(t);
        n_tokens = n;
        if (r == 0) continue; /* warm-up */
        if (wall < best_wall) best_wall = wall;
        if (cpu < best_cpu) best_cpu = cpu;
    }
    printf("{\"impl\": \"lensd\", \"bytes\": %zu, \"tokens\": %d, \"wall_ms\": %.2f, \"cpu_ms\": %.2f, "
           "\"tokens_per_s_wall\": %.0f, \"tokens_per_s_cpu\": %.0f}\n",
           len, n_tokens, best_wall, best_cpu, n_tokens / (best_wall / 1e3), n_tokens / (best_cpu / 1e3));
    lens_tokenizer_free(tok);
    free(text);
    return 0;
}
