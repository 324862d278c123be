/* context_mixing.h - how much of each input token is mixed into each
 * position by a whole layer: attention rollout, ALTI, GlobEnc, value zeroing,
 * DecompX.
 *
 * Papers and the released code each definition follows ("paper-code"):
 *   rollout       Abnar & Zuidema 2020, samiraabnar/attention_flow
 *                 (compute_joint_attention with add_residual)
 *   ALTI          Ferrando, Gállego & Costa-jussà 2022,
 *                 mt-upc/transformer-contributions (src/contributions.py,
 *                 normalize_contributions "min_sum" with the resultant's norm)
 *   GlobEnc       Modarressi, Fayyaz et al. 2022, mohsenfayyaz/GlobEnc
 *                 (N-Enc: norms[4] of src/modeling/modeling_bert.py, rolled out
 *                 by AttentionRollout)
 *   value zeroing Mohebbi, Zuidema, Chrupała & Alishahi 2023,
 *                 hmohebbi/ValueZeroing (scoring/value_zeroing.py, cosine)
 *   DecompX       Modarressi, Fayyaz et al. 2023, mohsenfayyaz/DecompX
 *                 (src/modeling_bert.py: BertLayer's decomposers with the
 *                 "absdot" biases, GeLU_ZO, frozen LayerNorm statistics;
 *                 the per-layer matrix with aggregation None, the rolled-out
 *                 one with aggregation "vector"; BertModel / ...ForSequence
 *                 Classification's pooler (tanh ZO) and classifier)
 * Every formula, and every difference between paper, code and lensd, is in
 * docs/context-mixing.md.
 *
 * For one sequence of T tokens, layer l (1..L) is block l - 1; its input is
 * the residual stream x = h^{l-1} [T][C]. Per head h, P^h [T][T] are the
 * attention probabilities, v^h_j the value vector of token j (with its bias)
 * and W_O^h the head's rows of the output projection. The decomposition
 * methods split the attention sublayer's output at i into one vector per
 * source token j:
 *
 *     t_ij = Σ_h P^h_ij v^h_j W_O^h + [i == j] x_i
 *
 * read off the block program (core/model/block.h): the linear map right
 * after ATTEND is W_O; a post-norm block (BERT: LN(x + Attn(x))) adds x to
 * it and normalises, a pre-norm block (GPT-2, Llama: x + Attn(norm(x)))
 * adds it to x, its input norm acting on each source token alone (inside
 * v_j). Any other shape (a norm between attention and the residual sum,
 * GPT-NeoX's parallel residual) has no such decomposition: LENS_EINVAL.
 *
 * Matrices [T][T]: row i = output position, column j = input token. */
#ifndef LENS_CONTEXT_MIXING_H
#define LENS_CONTEXT_MIXING_H

#include "core/model/block.h"

typedef enum {
    LENS_CM_ROLLOUT,
    LENS_CM_ALTI,
    LENS_CM_GLOBENC,
    LENS_CM_VALUE_ZEROING,
    LENS_CM_DECOMPX,
    LENS_CM_COUNT
} lens_cm_method;

typedef struct {
    lens_cm_method method;
    int paper_code;             /* 1: the released code's arithmetic, 0: lensd's (docs/context-mixing.md) */
    const int *layers;          /* 1..L to report, ascending; NULL = all */
    int n_layers;
    size_t max_scratch_bytes;   /* value zeroing's packed copies (0 = 32 MiB, also the most); DecompX's vectors, a bound
                                   (0 = 2 GiB, over it LENS_ELIMIT) */
    const volatile int *cancel; /* optional; non-zero stops with LENS_ECANCEL */
    lens_pool *pool;            /* NULL = the calling thread */
} lens_cm_opts;

typedef struct {
    int T, n_layers;
    int *layers;    /* [n_layers] */
    float *contrib; /* [n_layers][T][T] the layer's own mixing matrix */
    float *rollout; /* [n_layers][T][T] the product of layers 1..l's matrices (DecompX: the norms of
                       the vectors propagated through layers 1..l) */
    int n_classes;     /* DecompX on a classifier whose layers reach L, else 0 */
    float *classifier; /* [T][n_classes] DecompX: token j's share of each logit (they sum to the logits) */
} lens_cm_result;

const char *lens_cm_method_name(lens_cm_method m); /* "rollout", "alti", "globenc", "value-zeroing", "decompx" */
int lens_cm_method_parse(const char *name, lens_cm_method *m); /* -1: unknown */

/* NULL when method is defined for m, else a sentence saying why not. */
const char *lens_cm_undefined(const lens_model *m, lens_cm_method method);

int lens_context_mixing(const lens_model *m, const int *ids, const int *type_ids, int T, const lens_cm_opts *opts,
                        lens_cm_result *out, lens_err *err);
void lens_cm_result_free(lens_cm_result *r);

#endif
