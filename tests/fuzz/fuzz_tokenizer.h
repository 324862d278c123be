/* fuzz_tokenizer.h - the tokenizer fuzzers' shared body: vocabulary files
 * and text from one input, the loader, then lens_tokenize with the
 * invariants tokenizer.h promises for what it returns. */
#ifndef LENS_FUZZ_TOKENIZER_H
#define LENS_FUZZ_TOKENIZER_H

#include "core/io/tokenizer.h"
#include "tests/fuzz/fuzz.h"

/* Input part i into file name; an empty part removes the file (optional
 * files are then absent, as in most checkpoints). */
static inline void fuzz_file_part(const uint8_t *data, size_t size, int i, const char *name)
{
    const uint8_t *p;
    size_t len;
    fuzz_part(data, size, i, &p, &len);
    if (len) fuzz_write(name, p, len);
    else fuzz_remove(name);
}

static inline int fuzz_code_points(const char *s, size_t len)
{
    int n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

/* Input parts 0..n_files-1 become the files named (empty: absent), then
 * the tokenizer loaded from fuzz_dir() tokenizes part n_files and part
 * n_files + 1 (the pair, when the input has that many parts). */
static inline int fuzz_tokenizer_input(const uint8_t *data, size_t size, const char *const *files, int n_files)
{
    for (int i = 0; i < n_files; i++) fuzz_file_part(data, size, i, files[i]);
    const int text_part = n_files;
    lens_err err = {0};
    lens_tokenizer *tok = lens_tokenizer_load(fuzz_dir(), &err);
    if (!tok) {
        FUZZ_REQUIRE(err.msg[0], "refused without a message");
        return 0;
    }
    int V = lens_tokenizer_vocab_size(tok);
    FUZZ_REQUIRE(V > 0, "empty vocabulary accepted");
    const uint8_t *text, *pair;
    size_t text_len, pair_len;
    fuzz_part(data, size, text_part, &text, &text_len);
    fuzz_part(data, size, text_part + 1, &pair, &pair_len);
    int has_pair = pair != data + size || pair_len > 0;
    lens_token *t = NULL;
    int n = 0;
    if (lens_tokenize(tok, (const char *)text, text_len, has_pair ? (const char *)pair : NULL, pair_len, &t, &n,
                      &err) == 0) {
        int cps[2] = {fuzz_code_points((const char *)text, text_len), fuzz_code_points((const char *)pair, pair_len)};
        for (int i = 0; i < n; i++) {
            FUZZ_REQUIRE(t[i].id >= 0 && t[i].id < V, "token %d: id %d outside [0, %d)", i, t[i].id, V);
            FUZZ_REQUIRE(lens_tokenizer_piece(tok, t[i].id) != NULL, "token %d: no piece", i);
            FUZZ_REQUIRE(t[i].segment == 0 || (t[i].segment == 1 && has_pair), "token %d: segment %d", i, t[i].segment);
            /* a special token the template adds has no span; one typed in the text keeps its span
             * (docs/api-notes.md); every other token has one inside its segment */
            if (t[i].special && t[i].start == -1) {
                FUZZ_REQUIRE(t[i].end == -1, "special token %d: start -1 but end %d", i, t[i].end);
            } else {
                FUZZ_REQUIRE(0 <= t[i].start && t[i].start <= t[i].end && t[i].end <= cps[t[i].segment],
                             "token %d: span [%d, %d) outside [0, %d]", i, t[i].start, t[i].end, cps[t[i].segment]);
            }
        }
        free(t);
    } else {
        FUZZ_REQUIRE(err.msg[0], "tokenize failed without a message");
    }
    lens_tokenizer_free(tok);
    return 0;
}

#endif
