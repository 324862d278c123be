/* fuzz_tokenizer_json.c - libFuzzer target for the tokenizer.json reader.
 *
 * The input is a tokenizer.json. Loading must either fail with a lens_err
 * (never crash, leak or read out of bounds), or give a tokenizer that then
 * tokenizes a few fixed strings and the input's own bytes (when valid
 * UTF-8) with offsets inside the text and ids inside the vocabulary, and
 * decodes those ids (skip_special both ways, and reversed) through the
 * file's decoder to valid UTF-8.
 * Seeds: tests/fuzz/corpus/tokenizer_json/ (WordPiece, byte-level BPE,
 * SentencePiece-style BPE with byte fallback, templates, added tokens). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer.h"
#include "core/io/tokenizer_impl.h"
#include "tests/fuzz/fuzz.h"

/* ids back to text: always succeeds (every id is the vocabulary's), valid UTF-8 */
static void probe_decode(const lens_tokenizer *tok, int *ids, int n)
{
    for (int k = 0; k < 3; k++) {
        if (k == 2)
            for (int i = 0; i < n / 2; i++) {
                int swap = ids[i];
                ids[i] = ids[n - 1 - i], ids[n - 1 - i] = swap;
            }
        char *text = NULL;
        size_t len = 0, bad_at;
        lens_err err;
        FUZZ_REQUIRE(lens_tokenizer_decode(tok, ids, n, k == 1, &text, &len, &err) == 0, "decode: %s", err.msg);
        FUZZ_REQUIRE(lens_utf8_valid(text, len, &bad_at), "decode: invalid UTF-8 at byte %zu", bad_at);
        free(text);
    }
}

static void probe(const lens_tokenizer *tok, const char *text, size_t len, const char *pair)
{
    lens_token *t = NULL;
    int n = 0;
    lens_err err;
    if (lens_tokenize(tok, text, len, pair, pair ? strlen(pair) : 0, &t, &n, &err) != 0) return;
    size_t limit = pair ? len + strlen(pair) : len; /* code points <= bytes */
    for (int i = 0; i < n; i++) {
        FUZZ_REQUIRE(t[i].id >= 0 && t[i].id < lens_tokenizer_vocab_size(tok), "token %d: id %d", i, t[i].id);
        FUZZ_REQUIRE(lens_tokenizer_piece(tok, t[i].id) != NULL, "token %d: no piece", i);
        FUZZ_REQUIRE(t[i].special == lens_tokenizer_is_special(tok, t[i].id), "token %d: special flag", i);
        if (t[i].start < 0)
            FUZZ_REQUIRE(t[i].end == -1 && t[i].special, "token %d: no span but not special", i);
        else
            FUZZ_REQUIRE(t[i].start <= t[i].end && (size_t)t[i].end <= limit, "token %d: span [%d, %d)", i,
                         t[i].start, t[i].end);
    }
    int *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    FUZZ_REQUIRE(ids != NULL, "out of memory");
    for (int i = 0; i < n; i++) ids[i] = t[i].id;
    probe_decode(tok, ids, n);
    free(ids);
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lens_err err;
    lens_tokenizer *tok = lens_tokenizer_from_json((const char *)data, size, &err);
    if (!tok) return 0;
    static const char *const texts[] = {
        "Hello world", "  leading  spaces\t\n", "[MASK] <s> </s> <|endoftext|>", "naïve café 😀👨‍👩‍👧 東京 123456",
        "", "e\xCC\x81 \xEF\xAC\x81 \xC4\xB0",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) probe(tok, texts[i], strlen(texts[i]), NULL);
    probe(tok, "first", 5, "second one");
    probe(tok, (const char *)data, size < 4096 ? size : 4096, NULL);
    lens_tokenizer_free(tok);
    return 0;
}
