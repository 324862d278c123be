/* mkmodel.h - random-weight checkpoints in Hugging Face format.
 *
 * Writes config.json, model.safetensors (F32, HF tensor names) and tokenizer
 * files (a generated vocabulary of the preset's size) into out_dir, so that
 * benchmarks and demos can run at real model sizes without downloading
 * anything. Weights are N(0, 0.02) like HF's initialiser (GPT-2's residual
 * projections 0.02 / sqrt(2 L), as HF), LayerNorm 1/0. */
#ifndef LENS_MKMODEL_H
#define LENS_MKMODEL_H

#include <stdint.h>
#include <stdio.h>

#include "core/base/err.h"
#include "core/io/safetensors.h"
#include "core/model/model.h"

/* arch: a family's model_type ("bert", "gpt2", "roberta", "distilbert");
 * preset: "micro" (L2 H16 2 heads, vocab 1000: for tests that run a model
 * very often), "tiny" (L2 H128 2 heads), "small"
 * (L4 H256 4 heads), "base" (L12 H768 12 heads; BERT vocab 30522, GPT-2
 * 50257), "xl" (GPT-2 XL's L48 H1600 25 heads: 1.56 B parameters, for
 * make bigmodel); the decoder families (llama, mistral, qwen2, qwen3, gemma,
 * gemma2, gpt_neox) have their own micro, tiny and the real shapes 1b / 8b
 * (docs/families.md). task: NULL for the arch's default (bert: classification with 2
 * labels, gpt2: causal-lm) or "classification" | "masked-lm" | "encoder". */
int lens_mkmodel(const char *arch, const char *preset, const char *task,
                 unsigned long long seed, const char *out_dir, lens_err *err);

/* The same with the tokenizer files made from an existing vocabulary
 * (vocab_dir, NULL = generated): WordPiece vocab.txt copied; GPT-2's
 * vocab.json + merges.txt with the family's special tokens added (RoBERTa:
 * <s> <pad> </s> <unk> at 0..3 and <mask> last, as roberta-base); the
 * model's vocab_size follows. A vocab_dir holding tokenizer.json (a Hugging
 * Face fast tokenizer, e.g. Llama-3's or Gemma's) has it copied as is, with
 * its tokenizer_config.json. */
int lens_mkmodel_vocab(const char *arch, const char *preset, const char *task, unsigned long long seed,
                       const char *vocab_dir, const char *out_dir, lens_err *err);

/* How the weights are written: dtype of the matrices (embeddings and
 * linear weights, as HF's torch_dtype; biases and norms are written in it
 * too), and max_shard_bytes > 0 splits them into model-0000i-of-0000n
 * shards of at most that many bytes plus model.safetensors.index.json
 * (HF's max_shard_size). Tensors are generated and written a chunk at a
 * time, so a checkpoint larger than memory can be written. */
typedef struct {
    lens_dtype dtype;
    uint64_t max_shard_bytes; /* 0: one model.safetensors */
} lens_mkmodel_out;
int lens_mkmodel_write(const char *arch, const char *preset, const char *task, unsigned long long seed,
                       const char *vocab_dir, const char *out_dir, const lens_mkmodel_out *out, lens_err *err);

/* A new checkpoint's config for c->family before its sizes: the keys'
 * defaults, the task (NULL: the family's default) and its class, labels
 * negative / positive for a classifier, then the family's own values. */
int lens_mkmodel_new_config(lens_config *c, const char *task, lens_err *err);

/* "5GB" (10^9), "500MB", "2GiB" (2^30), "100KB", "123" (bytes), as
 * transformers' max_shard_size; -1 on anything else. */
int lens_parse_size(const char *s, uint64_t *bytes);

/* Names of the presets, NULL-terminated, for --help. */
extern const char *const lens_mkmodel_presets[];

/* The "--arch a|b --preset x|y" lines of mkmodel's help, one per preset
 * list, from the family registry; lines after the first start with indent. */
void lens_mkmodel_usage(FILE *f, const char *indent);

#endif
