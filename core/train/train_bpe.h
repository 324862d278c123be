/* train_bpe.h - learning a GPT-2 byte-level BPE vocabulary (`lensd train
 * vocab --bpe`): vocab.json + merges.txt + tokenizer_config.json in the
 * format core/io/tokenizer.c (and HF GPT2Tokenizer) reads. Algorithm and
 * tie-breaking at the top of train_bpe.c. */
#ifndef LENS_TRAIN_BPE_H
#define LENS_TRAIN_BPE_H

#include <stddef.h>

#include "core/base/err.h"

/* A learned vocabulary. Ids: 0..255 the byte symbols in GPT-2's order
 * (bytes_to_unicode: printable bytes first), then one id per new symbol in
 * merge order, then "<|endoftext|>" as the last id. */
typedef struct {
    int n_pieces;
    char **piece;      /* [n_pieces] the symbol's raw bytes, NUL-terminated */
    int *piece_len;    /* [n_pieces] bytes (a byte symbol can be 0x00) */
    int n_merges;
    int (*merge)[3];   /* [n_merges] left id, right id, merged id, in rank order */
    long *merge_count; /* [n_merges] occurrences of the pair in the corpus when merged */
} lens_bpe_vocab;

typedef struct lens_bpe_trainer lens_bpe_trainer;

lens_bpe_trainer *lens_bpe_trainer_new(lens_err *err);
void lens_bpe_trainer_free(lens_bpe_trainer *tr);

/* Pre-tokenize UTF-8 text with GPT-2's regex (lens_gpt2_pretokenize) and
 * count its words. Invalid UTF-8 fails with LENS_EINVAL. */
int lens_bpe_trainer_add_text(lens_bpe_trainer *tr, const char *text, size_t len, lens_err *err);

/* Merge until the vocabulary has vocab_size entries (bytes + merged symbols
 * + <|endoftext|>) or no pair occurs min_count times. vocab_size must be at
 * least 258. The trainer can learn once. */
int lens_bpe_trainer_learn(lens_bpe_trainer *tr, int vocab_size, int min_count, lens_bpe_vocab *out,
                           lens_err *err);

/* Write out_dir/vocab.json, merges.txt and tokenizer_config.json (creates
 * out_dir). */
int lens_bpe_vocab_save(const lens_bpe_vocab *v, const char *out_dir, lens_err *err);
void lens_bpe_vocab_free(lens_bpe_vocab *v);

/* The whole of `lensd train vocab --bpe`: each file is read whole as UTF-8
 * text (plain text, no TSV handling). */
int lens_train_bpe(const char *const *paths, int n_paths, int vocab_size, int min_count, const char *out_dir,
                   lens_err *err);

#endif
