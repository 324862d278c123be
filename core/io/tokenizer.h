/* tokenizer.h - Hugging Face compatible tokenizers with character offsets.
 *
 * Chosen by the files in a folder, as AutoTokenizer does:
 *   tokenizer.json            -> any HF fast tokenizer it describes
 *                                (WordPiece, byte-level BPE, SentencePiece-style
 *                                BPE with byte fallback; see tokenizer_json.c)
 *   vocab.txt                 -> BERT WordPiece, options from tokenizer_config.json
 *   vocab.json + merges.txt   -> byte-level BPE: GPT2Tokenizer, or
 *                                RobertaTokenizer when tokenizer_config.json's
 *                                tokenizer_class says so (<s> A </s></s> B </s>)
 * Output ids equal Hugging Face's for the same files. Offsets are in Unicode
 * code points (Python str indices) into the UTF-8 input, [start, end). */
#ifndef LENS_TOKENIZER_H
#define LENS_TOKENIZER_H

#include <stddef.h>

#include "core/base/err.h"

typedef enum { LENS_TOK_WORDPIECE, LENS_TOK_BPE, LENS_TOK_UNIGRAM } lens_tok_kind;

typedef struct {
    int id;
    int start, end; /* code-point offsets into its segment's text; -1 for special tokens */
    int segment;    /* the template's token type id (BERT: 0 text, 1 text_pair; RoBERTa: 0 for both) */
    int text_index; /* the input the token comes from (the text its start / end index): 0 text,
                     * 1 text_pair; -1 for the template's special tokens and input_ids */
    int special;    /* lens_tokenizer_is_special(id): [CLS], [SEP], <s>, ...
                     * added by the template, and special tokens written in
                     * the text ("[MASK]", "<|endoftext|>"), which keep
                     * their span. */
} lens_token;

typedef struct lens_tokenizer lens_tokenizer;

/* Load from a folder (checkpoint or tokenizer files only). Fails with
 * LENS_ENOENT when no known tokenizer files are present, LENS_EFORMAT when
 * they are malformed. The queries below accept tok NULL (a model without
 * tokenizer files) and answer "nothing"; lens_tokenize then fails with
 * LENS_ENOENT. */
lens_tokenizer *lens_tokenizer_load(const char *dir, lens_err *err);
void lens_tokenizer_free(lens_tokenizer *tok);

/* A tokenizer from the text of a tokenizer.json (tests, fuzzing). A file
 * lensd cannot honour exactly fails with LENS_EFORMAT naming the part. */
lens_tokenizer *lens_tokenizer_from_json(const char *data, size_t len, lens_err *err);

lens_tok_kind lens_tokenizer_kind(const lens_tokenizer *tok);
int lens_tokenizer_vocab_size(const lens_tokenizer *tok);

/* The vocabulary string of id ("##ing", "Ġworld"), NULL when out of range.
 * Always valid UTF-8. */
const char *lens_tokenizer_piece(const lens_tokenizer *tok, int id);

/* Id of a vocabulary string, -1 when absent. */
int lens_tokenizer_id(const lens_tokenizer *tok, const char *piece);

/* Is id one of the tokenizer's special tokens (tokenizer.json added tokens
 * with "special": true, the template's tokens, the special tokens named in
 * tokenizer_config.json / special_tokens_map.json)? The one place that
 * decides it, for tokens from text and for input_ids alike. */
int lens_tokenizer_is_special(const lens_tokenizer *tok, int id);

/* Does the tokenizer's post-processor have a pair form (BERT, RoBERTa,
 * TemplateProcessing with "pair")? Without one (GPT-2) a pair is just A B
 * with nothing to mark where B starts. */
int lens_tokenizer_pair_template(const lens_tokenizer *tok);

/* Tokenize text (and optional pair; pair may be NULL) as Hugging Face's
 * tokenizer(text, text_pair) does with add_special_tokens=True:
 *   template (post_processor): e.g. [CLS] A [SEP] (B [SEP]), <s> A </s>
 *   (</s> B </s>), <bos> A; segment = the template's type id
 *   no template (GPT-2): A (B), segment ids 0 / 1
 * Invalid UTF-8 fails with LENS_EINVAL and says at which byte.
 * On success *out is malloc'd (caller frees) and *n_out set. */
int lens_tokenize(const lens_tokenizer *tok, const char *text, size_t len,
                  const char *pair, size_t pair_len,
                  lens_token **out, int *n_out, lens_err *err);

/* Ids back to text, as HF's decode: through tokenizer.json's "decoder" as
 * the Rust library runs it (core/io/decode.c); without a tokenizer.json,
 * WordPiece joins pieces with spaces, glues "##" continuations and cleans up
 * spaces before punctuation, byte-level BPE maps each piece's symbols back
 * to bytes (invalid UTF-8 as U+FFFD). skip_special drops [CLS], [SEP] and
 * added special tokens. An id
 * outside the vocabulary fails with LENS_EINVAL. *text is malloc'd. */
int lens_tokenizer_decode(const lens_tokenizer *tok, const int *ids, int n, int skip_special, char **text,
                          size_t *len, lens_err *err);

/* GPT-2's pre-tokenizer alone (the regex the BPE kind splits text with,
 * without special tokens): calls word(ctx, start, end) with the byte range
 * of each pre-token, in order; a non-zero return from word stops the walk and
 * is returned. Invalid UTF-8 fails with LENS_EINVAL. Used by the BPE
 * vocabulary learner (core/train/train_bpe.c). */
int lens_gpt2_pretokenize(const char *text, size_t len, int (*word)(void *ctx, size_t start, size_t end),
                          void *ctx, lens_err *err);

#endif
