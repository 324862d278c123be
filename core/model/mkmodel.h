/* mkmodel.h - random-weight checkpoints in Hugging Face format.
 *
 * Writes config.json, model.safetensors (F32, HF tensor names) and tokenizer
 * files (a generated vocabulary of the preset's size) into out_dir, so that
 * benchmarks and demos can run at real model sizes without downloading
 * anything. Weights are N(0, 0.02) like HF's initialiser, LayerNorm 1/0. */
#ifndef LENS_MKMODEL_H
#define LENS_MKMODEL_H

#include "core/base/err.h"

/* arch: "bert" | "gpt2"; preset: "micro" (L2 H16 2 heads, vocab 1000: for
 * tests that run a model very often), "tiny" (L2 H128 2 heads), "small"
 * (L4 H256 4 heads), "base" (L12 H768 12 heads; BERT vocab 30522, GPT-2
 * 50257). task: NULL for the arch's default (bert: classification with 2
 * labels, gpt2: causal-lm) or "classification" | "masked-lm" | "encoder". */
int lens_mkmodel(const char *arch, const char *preset, const char *task,
                 unsigned long long seed, const char *out_dir, lens_err *err);

/* Names of the presets, NULL-terminated, for --help. */
extern const char *const lens_mkmodel_presets[];

#endif
