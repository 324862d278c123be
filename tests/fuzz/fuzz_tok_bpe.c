/* fuzz_tok_bpe.c - GPT-2 byte-level BPE (core/io/tokenizer.c): loading
 * vocab.json, merges.txt and tokenizer_config.json, then tokenizing text and
 * an optional pair.
 *
 * Input, split at NUL bytes: vocab.json, merges.txt, tokenizer_config.json,
 * text, pair (empty tokenizer_config part: absent; no fifth part: no pair). */
#include "tests/fuzz/fuzz_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const files[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
    return fuzz_tokenizer_input(data, size, files, 3);
}
