/* fuzz_tokenizer_json.c - libFuzzer target for the tokenizer.json reader.
 *
 * The input is a tokenizer.json. Loading must either fail with a lens_err
 * (never crash, leak or read out of bounds), or give a tokenizer that then
 * tokenizes a few fixed strings and the input's own bytes (when valid
 * UTF-8) with offsets inside the text and ids inside the vocabulary.
 * Seeds: tests/fuzz/corpus/tokenizer_json/ (WordPiece, byte-level BPE,
 * SentencePiece-style BPE with byte fallback, templates, added tokens). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer.h"

static void probe(const lens_tokenizer *tok, const char *text, size_t len, const char *pair)
{
    lens_token *t = NULL;
    int n = 0;
    lens_err err;
    if (lens_tokenize(tok, text, len, pair, pair ? strlen(pair) : 0, &t, &n, &err) != 0) return;
    for (int i = 0; i < n; i++) {
        /* a token outside the vocabulary or with an inverted span is a bug */
        if (t[i].id < 0 || t[i].id >= lens_tokenizer_vocab_size(tok) || t[i].start > t[i].end ||
            (t[i].start < 0) != (t[i].end < 0) ||
            (t[i].end > 0 && (size_t)t[i].end > (pair ? len + strlen(pair) : len)))
            abort();
        (void)lens_tokenizer_piece(tok, t[i].id);
        (void)lens_tokenizer_is_special(tok, t[i].id);
    }
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
