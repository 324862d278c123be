/* fuzz_tok_wordpiece.c - BERT WordPiece (core/io/tokenizer.c): loading
 * vocab.txt, tokenizer_config.json and special_tokens_map.json, then
 * tokenizing text and an optional pair.
 *
 * Input, split at NUL bytes: vocab.txt, tokenizer_config.json,
 * special_tokens_map.json, text, pair (empty JSON parts: file absent; no
 * fifth part: no pair). */
#include "tests/fuzz/fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const files[] = {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json"};
    return fuzz_tokenizer_input(data, size, files, 3);
}
