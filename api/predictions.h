/* predictions.h - top-k predictions and the logit lens on POST /v1/forward
 * (api/predictions.c). */
#ifndef LENS_API_PREDICTIONS_H
#define LENS_API_PREDICTIONS_H

#include "api/request.h"

typedef struct {
    int top_k;      /* outputs has "top_k" */
    int logit_lens; /* "logit_lens": true */
    int k;          /* predictions per position, default 10, at most the vocabulary */
} api_predictions;

/* Decodes k and logit_lens; 422 when either is asked of a model without an
 * LM head or without a tokenizer. */
int api_decode_predictions(api_call *c, const lens_model *m, int want_top_k, api_predictions *p);
/* The positions read: positions when given, else a masked LM's [MASK]
 * positions, else all T. *rows is malloc'd [T]; returns the count (-1: out of memory). */
int api_prediction_rows(const lens_model *m, const int *ids, int T, const api_index_list *positions, int **rows);
/* "top_k": [{position, predictions: [{id, token, prob}]}] from logits[T][V]. */
void api_write_top_k(jw *w, const lens_model *m, const float *logits, const int *rows, int n_rows, int k,
                     int precision);
/* "logit_lens": [{position, layers: [{layer, predictions}]}] for layers 0..L
 * of sequence s (hidden states kept); 0, or -1 with the error written to c. */
int api_write_logit_lens(api_call *c, jw *w, const lens_model *m, const lens_activations *act, int s, const int *rows,
                         int n_rows, int k, int precision);

#endif
