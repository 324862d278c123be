/* request.h - decoding the fields every analysis request shares.
 *
 * model, text / text_pair / input_ids, layers / heads style index lists and
 * format; plus writing the parts every response shares (model, tokens,
 * timing_ms). Each decoder returns 0, or -1 after api_fail() named the field.
 * Optional fields that are absent or null take their default. */
#ifndef LENS_API_REQUEST_H
#define LENS_API_REQUEST_H

#include "api/api.h"
#include "core/analysis/attribution.h"

typedef struct {
    const api_model *model;
    const char *text, *pair; /* point into the request body; NULL if absent */
    size_t text_len, pair_len;
    int *input_ids;          /* owned; NULL when text is given */
    int n_input_ids;
} api_input;

typedef struct {
    int precision; /* significant digits 1..9 (default 6), or'ed with JW_SIGNIFICANT: pass it to jw_float* as is */
    int base64;    /* encoding "base64" */
    int given;     /* the request had a format object: endpoints whose numbers predate format
                      (token-identity, decomposition) keep their fixed decimals without one */
} api_format;

/* An index list such as layers: values in [lo, hi], sorted, deduplicated.
 * Absent: all of [lo, hi] (given = 0). */
typedef struct {
    int *v;
    int n;
    int given;
} api_index_list;

int api_decode_model(api_call *c, const api_model **out);
/* Whether the model takes text_pair: its tokenizer has a pair template.
 * api_decode_input refuses a pair by it and ModelInfo.pairs reports it. */
int api_model_takes_pairs(const lens_model *m);
/* What /v1/attribution's target may be on this model, a NULL-terminated
 * list of kinds ("predicted", "label", "class" for classifiers; "predicted",
 * "token" for causal LMs): decode_target accepts by it and
 * ModelInfo.attribution_targets reports it. */
const char *const *api_attribution_targets(const lens_config *cfg);
int api_decode_input(api_call *c, const api_model *m, api_input *in);
void api_input_free(api_input *in);
/* ids (a JSON array of token ids in [0, V), at most the token limit) into
 * in->input_ids (in->model set); errors name field. */
int api_decode_ids(api_call *c, const json_t *ids, const char *field, api_input *in);
int api_decode_format(api_call *c, api_format *f);
int api_decode_index_list(api_call *c, const char *field, int lo, int hi, api_index_list *out);
int api_index_list_has(const api_index_list *l, int v);

/* The most tokens one sequence may have on a model: the smaller of the
 * server's --max-tokens and the model's max_positions. */
int api_token_limit(const api_call *c, const lens_config *cfg);
/* Which bound api_token_limit is, for messages: "the model's max_positions"
 * or "the server's --max-tokens". */
const char *api_token_limit_name(const api_call *c, const lens_config *cfg);

/* Tokenize the input (or wrap input_ids as tokens), enforcing max_tokens and
 * the model's max_positions (413 "too_many_tokens"). *toks is malloc'd. */
int api_tokenize_input(api_call *c, const api_input *in, lens_token **toks, int *n);

/* One tokenized input sequence, as the analyses of a single text use it. */
typedef struct {
    lens_token *toks; /* [T] */
    int T;
    int *ids, *types; /* [T] token ids and segment ids */
    unsigned char *special; /* [T] 1 for [CLS], [SEP], ... */
} api_seq;

/* Tokenize in (api_tokenize_input, which also sets c->n_tokens) and fill
 * ids, types and special; 0, or -1 with the error written and s empty. */
int api_seq_begin(api_call *c, const api_input *in, api_seq *s);
void api_seq_free(api_seq *s);
/* Opens the response object: {"model": ..., "tokens": [...], */
void api_write_head(jw *w, const api_input *in, const api_seq *s);

/* Answer a failed core call by its lens_status: cancelled -> 503 "timeout",
 * over a limit -> 413 naming limit_field, invalid -> 422 naming
 * invalid_field (may be NULL), anything else -> 500 "<what> failed". */
int api_fail_core(api_call *c, const lens_err *err, const char *limit_field, const char *invalid_field,
                  const char *what);

/* key: {index, label} of class k on a classifier, {id, token} of token k on a causal LM */
void api_write_output(jw *w, const lens_model *m, const char *key, int k);
/* opens "objective": {kind, position, foil?; the caller adds its values and closes it */
void api_write_objective_open(jw *w, const lens_model *m, const lens_objective *o);
/* "tokens": [{id, text, start, end, special, segment}, ...] */
void api_write_tokens(jw *w, const lens_model *m, const lens_token *t, int n);
/* One [rows][cols] float matrix per format (JSON arrays or a base64 tensor). */
void api_write_matrix(jw *w, const float *x, size_t rows, size_t cols, const api_format *f);
/* Report progress (0..1) when running as a job; a no-op otherwise. */
void api_progress(api_call *c, double fraction);
/* "timing_ms": {...}; encode_start is when encoding began. */
void api_write_timing(api_call *c, double t_tokenize, double t_compute, double encode_start);

/* v (NULL or null: absent, *id = -1): a token id in [0, V) or a text that
 * tokenizes to exactly one token (the template's special tokens aside);
 * errors name field. 0, or -1 with the 422 written. */
int api_decode_token(api_call *c, const lens_model *m, const json_t *v, const char *field, int *id);

/* objective? = {kind?, position? (causal LM), target?, foil?}
 * (docs/attribution.md "Objectives"; api/attribution.c): *o the objective
 * (default: probability, position -1 = the last, no foil), *target set when
 * objective.target is given (a class of a classifier, a token of a causal
 * LM; left as it is otherwise), *has (may be NULL) 1 when the request had
 * one. Errors name "objective.<key>". 0, or -1 with the 422 written. */
int api_decode_objective(api_call *c, const lens_model *m, int *target, lens_objective *o, int *has);
/* model, refused (422 naming it) unless it has an objective to read: a
 * sequence classifier or a causal LM; what names the analysis. */
int api_decode_objective_model(api_call *c, const char *what, const api_model **am);

/* Optional typed getters: 0 absent/null, 1 present and right type, -1 wrong type (failed). */
int api_get_string(api_call *c, const char *field, const char **s, size_t *len);
int api_get_bool(api_call *c, const char *field, int *v);

/* A file path a client names, resolved inside the server's --data-dir (out
 * holds PATH_MAX bytes): 422 naming field when there is no data directory,
 * the file does not exist, or it resolves outside the directory ("..",
 * absolute paths, symlinks). */
int api_resolve_data_path(api_call *c, const char *field, const char *path, char *out);

/* A dataset file inside --data-dir (errors name field "data"), read line by
 * line: each line without its end of line, split at tabs into at most
 * API_MAX_COLUMNS columns, goes to row(c, ctx, cols, n_cols, line_no), line
 * numbers from 1, until row returns non-zero (1: enough rows, -1: failed,
 * error set on c). Returns 0 or -1. */
#define API_MAX_COLUMNS 16
typedef int (*api_row_fn)(api_call *c, void *ctx, char **cols, int n_cols, int line_no);
int api_read_data_file(api_call *c, const char *path, api_row_fn row, void *ctx);
int api_get_int(api_call *c, const char *field, long long lo, long long hi, int *v);

/* A dataset job's texts: texts (a non-empty array of non-empty strings) or
 * data (a file inside --data-dir: a TSV whose header names a "sentence" or
 * "text" column, or plain lines), exactly one of them, the first max_texts.
 * field names the one given, for later errors. */
typedef struct {
    char **v; /* [n] owned */
    int n;
    const char *field; /* "texts" or "data" */
} api_texts;
int api_decode_texts(api_call *c, int max_texts, api_texts *out);
void api_texts_free(api_texts *t);
/* The texts tokenized as one packed batch (*ids, *lengths owned): each keeps
 * its first token-limit tokens, and a final special token ([SEP]) when cut;
 * a text without tokens is a 422 on texts. */
int api_tokenize_texts(api_call *c, const lens_model *m, const api_texts *t, int **ids, int **lengths);

/* Unknown top-level fields: 422 naming the first one that name (a route
 * path such as "/v1/forward", or a job kind for its params) does not take;
 * 0 when all are known or name has no field list. */
int api_check_fields(api_call *c, const char *name);
/* The NULL-terminated field list of name, or NULL. */
const char *const *api_allowed_fields(const char *name);
/* Reads "async"; when true (and not already in a job) submits the call as a
 * job of kind and marks it answered. 0, or -1 with the error written. */
int api_decode_async(api_call *c, const char *kind);

/* The attribution schedule every attribution-based request takes
 * (api/attribution.c): quadrature? = "riemann" (default) | "gauss", steps?
 * (1..1000 gradient evaluations: Riemann steps, default 20, or
 * Gauss–Legendre nodes, default LENS_ATTR_GAUSS_NODES), riemann? = "right"
 * (default) | "left" (riemann only: with gauss it is a 422). */
typedef struct {
    int steps;
    lens_riemann riemann;
    lens_quadrature quadrature;
} api_schedule;
int api_decode_schedule(api_call *c, api_schedule *s);
/* "quadrature", "steps", "riemann" keys of a response */
void api_write_schedule(jw *w, const api_schedule *s);

#endif
