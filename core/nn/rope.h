/* rope.h - rotary position embeddings (Su et al. 2021) in Hugging Face's
 * rotate_half layout, with partial rotary (GPT-NeoX rotary_pct) and the
 * rope_scaling types "linear" and "llama3"; forward, backward and JVP.
 *
 * Shapes: x [N][NH*D], N rows (packed tokens), NH heads of D channels; pos
 * [N] the position of each row inside its sequence (NULL: row n is at
 * position n, one sequence). The first R = dim
 * channels of each head rotate, the rest pass through. With
 * inv_freq[i] = theta^(-2i/R) (then scaled) and a = pos * inv_freq[i],
 * for i < R/2 (pairs i and i + R/2, HF's rotate_half):
 *   y_i       = x_i cos a - x_{i+R/2} sin a
 *   y_{i+R/2} = x_{i+R/2} cos a + x_i sin a
 * A rotation: the backward is the rotation by -a and the JVP is the forward
 * applied to the tangent. Scores q_i . k_j after RoPE depend on positions
 * only through i - j. Angles run in double (HF builds its cos / sin tables
 * in float32; at the positions tested the two agree to 1e-6). */
#ifndef LENS_ROPE_H
#define LENS_ROPE_H

#include <stddef.h>

enum { LENS_ROPE_DEFAULT = 0, LENS_ROPE_LINEAR = 1, LENS_ROPE_LLAMA3 = 2, LENS_ROPE_YARN = 3 };

typedef struct {
    int dim;        /* R rotary channels per head, even; 0 = no RoPE */
    double theta;   /* config rope_theta (rotary_emb_base for GPT-NeoX) */
    int type;       /* LENS_ROPE_*: rope_scaling.rope_type */
    double factor;  /* linear, llama3: rope_scaling.factor */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int original_max_positions;               /* llama3, yarn: original_max_position_embeddings */
    double beta_fast, beta_slow;              /* yarn: the correction range's rotation counts */
    int truncate;                             /* yarn: the range's ends rounded out to integers */
    double attention_factor;                  /* yarn: cos and sin times this (HF attention_scaling); the
                                                 model folds its square into the score scale */
} lens_rope_params;

/* inv_freq [R/2] of p, scaled as its type says (HF _compute_llama3_parameters:
 * wavelengths above original / low_freq_factor divided by factor, below
 * original / high_freq_factor kept, smooth interpolation between; HF
 * _compute_yarn_parameters: with d(n) = R ln(O / (2 pi n)) / (2 ln theta),
 * O = original_max_positions, the channels i below d(beta_fast) keep f_i,
 * above d(beta_slow) take f_i / factor, a linear ramp between:
 *   f_i' = f_i / factor (1 - e_i) + f_i e_i,  e_i = 1 - clamp((i - lo) / (hi - lo), 0, 1)). */
void lens_rope_inv_freq(const lens_rope_params *p, double *inv_freq);

/* x = RoPE(x) in place; inv_freq from lens_rope_inv_freq. */
void lens_rope_forward(float *x, const int *pos, int N, int NH, int D, int R, const double *inv_freq);
/* dx = RoPE^T(dy) in place (d holds dy on entry, dx on return). */
void lens_rope_backward(float *d, const int *pos, int N, int NH, int D, int R, const double *inv_freq);
/* tangent t = RoPE(t) in place: the map is linear in x. */
static inline void lens_rope_jvp(float *t, const int *pos, int N, int NH, int D, int R, const double *inv_freq)
{
    lens_rope_forward(t, pos, N, NH, D, R, inv_freq);
}

#endif
