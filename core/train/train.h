/* train.h - training classifiers, masked LMs and causal LMs of every family
 * with a block backward (and learning vocabularies).
 *
 * A lens_trainer owns every parameter of a model in one float buffer (HF
 * tensor order, named pointers in a lens_params view), a gradient buffer of
 * the same layout and the AdamW moments. Its forward pass keeps every
 * activation the backward pass needs; the backward pass (the heads' and
 * embedding's of core/model, the family's blocks) accumulates weight
 * gradients. Checkpoints are Hugging Face folders (config.json,
 * model.safetensors, the tokenizer files, tokenizer_config.json) that
 * lens_model_load reads; trainer_state.json + optimizer.safetensors next to
 * them make a run resumable.
 *
 * Shapes: S sequences, N packed tokens, C = d_model, K labels. */
#ifndef LENS_TRAIN_H
#define LENS_TRAIN_H

#include <stddef.h>

#include "core/base/err.h"
#include "core/model/model.h"

typedef struct lens_trainer lens_trainer;

/* A trainer for cfg: its family (which must have a block backward) and its
 * task (classification with >= 2 labels, masked LM or causal LM, one the
 * family has an HF class for); d_head_k / d_head_v (0: C / NH) and
 * head_combination honoured. Weights drawn N(0, init_std of the walker)
 * from seed, biases 0, norm gains 1 (Gemma's unit-offset gains 0). A summed-heads model keeps its
 * output weight tiled (model.h); lens_trainer_tensor then gives the tiled
 * [C][NH*DV] extent, whose NH copies of each entry hold equal values and
 * equal gradients (dL/d of the compact entry); files hold [C][DV]. */
lens_trainer *lens_trainer_new(const lens_config *cfg, unsigned long long seed, lens_err *err);
void lens_trainer_free(lens_trainer *t);

/* Copy every tensor of checkpoint dir that the trainer has (same names and
 * shapes; the family's base prefix, "bert.", optional); tensors the checkpoint lacks (pooler,
 * classifier of an MLM parent) keep their initial values. *n_loaded may be NULL. */
int lens_trainer_load_weights(lens_trainer *t, const char *dir, int *n_loaded, lens_err *err);

/* Splits the forward passes' GEMMs over a pool of `threads` (1: the calling
 * thread, the default). The backward's GEMMs are cblas calls on OpenBLAS's
 * own threads, so a training process sets both to the same count
 * (lens_train_opts.threads). Results do not depend on it: lens_gemm sums
 * every element in the same order. */
int lens_trainer_set_threads(lens_trainer *t, int threads, lens_err *err);

const lens_config *lens_trainer_config(const lens_trainer *t);
float *lens_trainer_params(lens_trainer *t, size_t *n);
float *lens_trainer_grads(lens_trainer *t, size_t *n);
/* Tensor i (HF name, parameter offset, element count); -1 past the end. */
int lens_trainer_tensor(const lens_trainer *t, int i, const char **name, size_t *offset, size_t *count);

/* Mean cross-entropy of the batch for labels[S]. With backward != 0 the
 * gradient of that mean is ADDED to the gradient buffer (zero it with
 * lens_trainer_zero_grad). logits [S][K] receives the logits when not NULL.
 * Returns -1 with err on an invalid batch. */
int lens_trainer_batch(lens_trainer *t, const lens_batch *b, const int *labels, int backward, float *loss,
                       float *logits, lens_err *err);
void lens_trainer_zero_grad(lens_trainer *t);
/* Masked-LM trainer (cfg task LENS_TASK_MASKED_LM): mean cross-entropy over
 * the rows with targets[i] >= 0 (targets [N], -1 = not predicted), the
 * decoder tied to the word embeddings; *n_predicted (may be NULL) = their
 * count. Gradient added as by lens_trainer_batch. */
int lens_trainer_mlm_batch(lens_trainer *t, const lens_batch *b, const int *targets, int backward_pass,
                           float *loss, int *n_predicted, lens_err *err);

/* Causal-LM trainer (see train.c for the model): mean
 * next-token cross-entropy, row i of a sequence predicting ids[i + 1] of the
 * same sequence (T - 1 predictions per sequence, *n_predicted = their sum;
 * may be NULL), through the LM head (tied or lm_head, soft-capped when the
 * config says). logits [N][V] receives every row's
 * logits when not NULL. Gradient added as by lens_trainer_batch. */
int lens_trainer_causal_batch(lens_trainer *t, const lens_batch *b, int backward_pass, float *loss,
                              int *n_predicted, float *logits, lens_err *err);

/* Clip the gradient to global L2 norm max_norm (<= 0: no clipping), then one
 * AdamW step (beta1 .9, beta2 .999, eps 1e-8, decoupled weight decay wd on
 * every tensor except biases and LayerNorm). Returns the norm before clipping. */
float lens_trainer_step(lens_trainer *t, float lr, float wd, float max_norm);

/* Write a Hugging Face checkpoint into dir (created); tokenizer files
 * (vocab.txt, tokenizer_config.json) are copied from tokenizer_dir. With
 * with_state, the optimizer moments and step go to optimizer.safetensors and
 * trainer_state.json (extra = a JSON object's members to add, or NULL). */
int lens_trainer_save(const lens_trainer *t, const char *dir, const char *tokenizer_dir, int with_state,
                      const char *extra, lens_err *err);
/* Moments and step from dir/optimizer.safetensors; *step receives the step. */
int lens_trainer_load_state(lens_trainer *t, const char *dir, long *step, lens_err *err);

/* ------------------------------------------------------- `lensd train classify` */

typedef struct {
    const char *train_path, *dev_path; /* TSV text<TAB>label, optional header */
    const char *init_dir;  /* checkpoint to fine-tune, or NULL (then vocab_dir and arch) */
    const char *vocab_dir; /* folder with the tokenizer files (vocab.txt, vocab.json + merges.txt, tokenizer.json) */
    const char *arch;      /* a new model's family ("model_type", lens_family_find) when init_dir is NULL */
    const char *out_dir;
    const char *label_names; /* "negative,positive" for numeric labels, or NULL */
    int layers, hidden, heads, ff, max_len, d_head_k, d_head_v; /* 0: defaults */
    int head_combination; /* LENS_HEADS_* (model.h) for a new model; --init keeps the checkpoint's */
    int scale_by_dv;      /* scores scaled by 1/sqrt(DV) as declare-lab's code (config "attention_scale": "DV");
                           * 0: 1/sqrt(DK), the paper. --init keeps the checkpoint's */
    int epochs, batch_size, max_train; /* max_train 0: all examples */
    long max_steps;                    /* 0: epochs decide */
    float lr, warmup, weight_decay, clip; /* warmup: fraction of the steps */
    unsigned long long seed;
    int save_every;  /* steps between checkpoints (0: each epoch) */
    int resume;      /* continue from out_dir's trainer_state.json */
    int threads;
    int masked_lm;   /* `train mlm`: masked-LM pre-training, labels ignored
                      * (TSV text column or plain lines); dev metric = MLM loss */
} lens_train_opts;

void lens_train_opts_default(lens_train_opts *o);

typedef struct {
    float train_loss, dev_accuracy, tokens_per_s; /* masked LM: dev_accuracy = dev MLM loss */
    float dev_loss; /* mean loss on --dev (-1 without): next-token (causal LM, perplexity = exp), masked-LM, or
                     * the classifier's cross-entropy */
    long steps;
} lens_train_result;

int lens_train_classify(const lens_train_opts *o, lens_train_result *res, lens_err *err);

/* ---------------------------------------------------------- `lensd train causal` */

/* GPT-2 causal-LM training, see train_causal.c: train_path / dev_path are
 * plain text, vocab_dir (or init_dir) holds a byte-level BPE tokenizer
 * (vocab.json, merges.txt); layers, hidden, heads, ff, max_len (windows and
 * n_positions), the schedule, save_every and resume as for classify;
 * d_head_*, head_combination, label_names, max_train and masked_lm unused. */
int lens_train_causal(const lens_train_opts *o, lens_train_result *res, lens_err *err);

/* ---------------------------------------------------------- `lensd train vocab` */

/* Learn a WordPiece vocabulary of about vocab_size entries from the text of
 * the given files (TSV: first column), see train_vocab.c; writes
 * out_dir/vocab.txt and tokenizer_config.json. */
int lens_train_vocab(const char *const *paths, int n_paths, int vocab_size, int min_count, const char *out_dir,
                     lens_err *err);

#endif
