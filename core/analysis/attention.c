/* attention.c - effective attention and attention identifiability of one head
 * and of a whole model (POST /v1/attention).
 *
 * Papers.
 *   Brunner, Liu, Pascual, Richter, Ciaramita, Wattenhofer, "On
 *   Identifiability in Transformers", ICLR 2020 (sections 3 and 4.1).
 *   Bhardwaj, Majumder, Poria, Hovy, "More Identifiable yet Equally
 *   Performant Transformers for Text Classification", ACL 2021.
 *
 * One head. A [T][T] row-stochastic probabilities, V = x W_V + 1 b_V^T
 * [T][DV], Q [T][DK] queries, output A V [T][DV].
 *
 * 1. Effective attention (Brunner). Any Δ with Δ V = 0 leaves A V unchanged,
 *    so only the part of each row a_i in col(V) (a subspace of R^T) matters:
 *        V = U Σ W^T (thin SVD in double, from the DV x DV Gram matrix
 *        V^T V = W Σ^2 W^T by dsyevd; see thin_svd), r = #{σ_k > tol},
 *        tol = σ_max · ε_f32 · max(T, DV)      (ε_f32 = 2^-23: V is float32
 *        data, so directions below float32 resolution of V's largest
 *        singular value are noise; the max(T, DV) factor is LAPACK's usual
 *        rank rule),
 *        A_eff = A U_r U_r^T,   rank = r,   null_dim = T - r,
 *        identifiable = (r == T), and then A_eff = A exactly.
 *    Causal heads (GPT-2): row i only sees keys 0..i, so its alternatives are
 *    δ ∈ R^{i+1} with δ^T V_{0..i} = 0, and a_eff,i = projection of a_i[0..i]
 *    onto col(V_{0..i}) (entries beyond i stay 0). Computed for all prefixes
 *    at once in O(T · DV^2 + T^2 · DV) (no SVD per row): an orthonormal basis B
 *    of the row space of V_{0..i} grows by Gram-Schmidt (a row adds a
 *    direction when its distance to the span exceeds the same tol, taken from
 *    the full V); while every row so far added one, col(V_{0..i}) = R^{i+1}
 *    and a_eff,i = a_i; otherwise a_eff,i = V_{0..i} z_i with
 *        z_i = B H^-1 B^T y_i,  H = B^T V_{0..i}^T V_{0..i} B,  y_i = V^T a_i,
 *    H's Cholesky factor kept up to date by rank-one updates (rebuilt when B
 *    grows), and A_eff = tril(Z V^T). The prefix rank is certified as the
 *    per-row SVD counts it (σ_min(V_{0..i}) > tol, not only each Gram-Schmidt
 *    distance > tol: a square prefix at row DV - 1 can be near-singular with
 *    every distance well above tol): by 1/||L^-1||_F while every row added a
 *    direction, else by the eigenvalues of H; rows of a prefix with a singular
 *    value <= tol are projected on H's eigenvectors above tol^2. rank / null_dim / identifiable of a
 *    causal head are those of the full V (the last row's prefix).
 *    Sliding-window heads (Mistral, Gemma 2 / 3's local layers, window W): row
 *    i >= W sees keys i - W + 1..i, and is projected onto the values of that
 *    window instead (effective_window); ModernBERT's bidirectional windows
 *    likewise on keys |i - j| <= W / 2 (every row). rank / null_dim /
 *    rank([V, 1]) are those of that last row's band, and Pearson runs over
 *    the band the window allows.
 * 2. Row-stochastic refinement (Bhardwaj): alternatives must keep rows summing
 *    to 1, Δ 1 = 0 as well: dimension T - rank([V, 1]) per query row (causal:
 *    for the last row, which sees all T keys).
 * 3. Key-aware local dimension (Bhardwaj): A = softmax(Q K^T / sqrt(DK)); a
 *    change δK of the keys moves row i by
 *        δa_i = S_i δK q_i / sqrt(DK),  S_i = diag(a_i) - a_i a_i^T,
 *    a linear map J: R^{T x DK} -> R^{T x T}. The first-order alternatives
 *    that keys can produce and that leave the output unchanged are
 *        range(J) ∩ ker(M),  M(δA) = δA V,
 *        dim = dim ker(M J) - dim ker(J) = rank(J) - rank(M J).
 *    δK enters only through δK q_i = (δK W) (W^T q_i), W the rq = rank(Q)
 *    right singular vectors of Q, so J is built on the T·rq unknowns of
 *    Y = δK W with P = Q W [T][rq]; δK -> δK W is a co-isometry, so J and J'
 *    have the same nonzero singular values (and ranks with the same tol):
 *        J'[(i,j),(m,c)]  = S_i[j][m] P[i][c] / sqrt(DK)
 *        MJ'[(i,e),(m,c)] = a_im (V[m][e] - y_i[e]) P[i][c] / sqrt(DK),  y_i = V^T a_i,
 *    with V replaced by U_r, the orthonormal basis of its numerical column
 *    space (the r = rank(V) of `rank`): ker M is then the numerical null space
 *    that effective attention removes, and when r = T, M is an isometry and
 *    dim = 0 as identifiability says. With V itself M J's tolerance (T·DV
 *    rows) and spread (κ(V)) cut directions of J that M does not annihilate
 *    (demo-identifiable L1 H0, T = 9: rank V = 9 but rank(MJ) 56 < rank(J) 64).
 *    Ranks with tol = σ_max ε_f32 max(rows, T·DK), from the T·rq-square Gram
 *    matrices built on the Kronecker structure and counted by inertia
 *    (key_aware_gram; the dense dgesdd of J' and MJ' on request). Explicit when
 *    T·DK is at most LENS_ATTN_KEY_AWARE_MAX_UNKNOWNS (1024).
 *    When rank(Q) = T (T <= DK) range(J) splits by rows into range(S_i) =
 *    {x on supp(a_i), sum x = 0}, and dim = sum_i |supp a_i| - rank([V_supp, 1])
 *    for any T (closed form). Otherwise skipped, with the reason. Causal
 *    masks enter through a_i (zero beyond i, so S_i is too).
 * Statistics: Pearson correlation of raw and effective entries (causal: the
 * T(T+1)/2 entries j <= i); attention mass on a token set = mean over query
 * rows of the sum over the set's key columns, raw and effective. */
#include "core/analysis/attention.h"

#include <cblas.h>
#include <float.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/base/gemm.h"
#include "core/model/arch.h"
#include "core/nn/ops.h"
#include "core/nn/scores.h"

#define EPS_F32 ((double)FLT_EPSILON)

const char *lens_key_aware_method_name(lens_key_aware_method m)
{
    switch (m) {
    case LENS_KEY_AWARE_OFF: return "off";
    case LENS_KEY_AWARE_EXPLICIT: return "explicit";
    case LENS_KEY_AWARE_CLOSED_FORM: return "closed_form";
    case LENS_KEY_AWARE_SKIPPED: return "skipped";
    }
    return "?";
}

static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

static double rank_tol(double sigma_max, int m, int n) { return sigma_max * EPS_F32 * imax(m, n); }

static int count_above(const double *s, int k, double tol)
{
    int r = 0;
    while (r < k && s[r] > tol) r++;
    return r;
}

/* Singular values s[min(m,n)] (descending) of M [m][n] (row-major, double,
 * destroyed). Returns LAPACK's info. */
static int singular_values(double *M, int m, int n, double *s)
{
    if (m == 0 || n == 0) return 0;
    /* A row-major [m][n] array is the column-major n x m matrix M^T: same singular values. */
    return LAPACKE_dgesdd(LAPACK_COL_MAJOR, 'N', n, m, M, n, s, NULL, 1, NULL, 1);
}

/* rank of M [m][n] (destroyed) with tol = σ_max ε_f32 max(m, n, n_tol); -1 and err on LAPACK failure. */
static int numeric_rank(double *M, int m, int n, int n_tol, const char *what, lens_err *err)
{
    int k = imin(m, n);
    if (k == 0) return 0;
    double *s = malloc((size_t)k * sizeof *s);
    if (!s) return lens_fail(err, LENS_ENOMEM, "out of memory for the singular values of %s", what);
    int info = singular_values(M, m, n, s);
    int r = info ? -1 : count_above(s, k, rank_tol(s[0], m, imax(n, n_tol)));
    free(s);
    if (info) lens_fail(err, LENS_EFORMAT, "LAPACK dgesdd failed on %s (info %d)", what, info);
    return r;
}

/* Thin SVD of X [T][D] (row stride ld, float) in double: σ_max, tol =
 * σ_max ε_f32 max(T, D), rank, and when U_out is not NULL the left singular
 * vectors of the r nonzero singular values as float [T][r] (malloc'd; times
 * σ_k when scale_by_sigma, i.e. X W_r).
 * Computed from the D x D Gram matrix G = X^T X = W Σ^2 W^T (dsyrk + dsyevd,
 * σ_k = sqrt(λ_k), U = X W Σ^-1): O(T D^2) and ~4x faster than dgesdd on X
 * at T = 128, D = 64. In double the eigenvalues carry an absolute error of
 * ~D ε_f64 σ_max^2, so a zero singular value shows up as at most ~1e-7 σ_max,
 * far below tol (>= 7.6e-6 σ_max for D = 64): the rank is that of the SVD.
 * When dsyevd fails the SVD is taken by dgesdd on X itself. */
static int thin_svd(const float *X, int ld, int T, int D, double *sigma_max, double *tol, int *rank, float **U_out,
                    int scale_by_sigma, const char *what, lens_err *err)
{
    const int k = imin(T, D);
    double *x = calloc((size_t)T * D, sizeof *x), *G = malloc((size_t)D * D * sizeof *G); /* calloc: -O3 cannot see T, D >= 1 */
    double *lambda = malloc((size_t)D * sizeof *lambda), *s = malloc((size_t)D * sizeof *s);
    double *XW = U_out ? malloc((size_t)T * D * sizeof *XW) : NULL;
    int rc = 0;
    if (!x || !G || !lambda || !s || (U_out && !XW)) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for the SVD of %s (%d x %d)", what, T, D);
        goto done;
    }
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) x[(size_t)t * D + c] = X[(size_t)t * ld + c];
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, T, 1.0, x, D, 0.0, G, D);
    int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, U_out ? 'V' : 'N', 'U', D, G, D, lambda);
    if (info == 0) {
        /* eigenvalues ascending -> singular values descending; G's column D-1-c is W's column c */
        for (int c = 0; c < D; c++) s[c] = sqrt(fmax(lambda[D - 1 - c], 0.0));
        *sigma_max = s[0];
        *tol = rank_tol(*sigma_max, T, D);
        *rank = imin(count_above(s, D, *tol), k);
        if (U_out) {
            const int r = *rank;
            float *U = malloc((size_t)T * (r ? r : 1) * sizeof *U);
            if (!U) {
                rc = lens_fail(err, LENS_ENOMEM, "out of memory for the basis of %s", what);
                goto done;
            }
            /* XW [T][D] = X G: column D-1-c holds X w_c = σ_c u_c */
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, D, 1.0, x, D, G, D, 0.0, XW, D);
            for (int t = 0; t < T; t++)
                for (int c = 0; c < r; c++)
                    U[(size_t)t * r + c] = (float)(XW[(size_t)t * D + D - 1 - c] / (scale_by_sigma ? 1.0 : s[c]));
            *U_out = U;
        }
        goto done;
    }
    /* dsyevd failed: dgesdd on X. A row-major [T][D] array is the column-major
     * D x T matrix X^T = W Σ U^T, whose right vectors come back as U^T (k x T
     * column-major, ld k), i.e. U row-major [T][k]. */
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) x[(size_t)t * D + c] = X[(size_t)t * ld + c];
    double *ut = U_out ? malloc((size_t)k * T * sizeof *ut) : NULL, *w = U_out ? malloc((size_t)k * D * sizeof *w) : NULL;
    if (U_out && (!ut || !w)) {
        free(ut), free(w);
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for the SVD of %s (%d x %d)", what, T, D);
        goto done;
    }
    info = U_out ? LAPACKE_dgesdd(LAPACK_COL_MAJOR, 'S', D, T, x, D, s, w, D, ut, k) : singular_values(x, T, D, s);
    if (info) {
        free(ut), free(w);
        rc = lens_fail(err, LENS_EFORMAT, "LAPACK dgesdd failed on %s (info %d)", what, info);
        goto done;
    }
    *sigma_max = k ? s[0] : 0;
    *tol = rank_tol(*sigma_max, T, D);
    *rank = count_above(s, k, *tol);
    if (U_out) {
        const int r = *rank;
        float *U = malloc((size_t)T * (r ? r : 1) * sizeof *U);
        if (U)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < r; c++)
                    U[(size_t)t * r + c] = (float)(ut[(size_t)t * k + c] * (scale_by_sigma ? s[c] : 1.0));
        else
            rc = lens_fail(err, LENS_ENOMEM, "out of memory for the basis of %s", what);
        *U_out = U;
    }
    free(ut), free(w);
done:
    free(x), free(G), free(lambda), free(s), free(XW);
    return rc;
}

/* ------------------------------------------------------------ effective, full attention */

/* The Cholesky fast path of effective_full. G [D][D] (upper triangle, row
 * stride D) = X^T X of X [T][D], T >= D. Factors G = R^T R into Rinv (upper
 * triangle, R^-1; strictly lower part left as garbage) and returns 1 when
 * rank(X) = D is certified with the rank rule of thin_svd, i.e. every
 * σ_k > tol = σ_max ε_f32 max(T, D):
 *     λ_max(G) = σ_max^2 <= ||G||_∞   (any induced norm bounds it),
 *     λ_min(G) = σ_min^2 = 1 / ||R^-1||_2^2 >= 1 / ||R^-1||_F^2,
 *     so 1 / ||R^-1||_F^2 > 4 (ε_f32 max(T, D))^2 ||G||_∞  =>  σ_min > 2 tol.
 * The factor 4 covers the rounding of R^-1 (relative error ~ D ε_f64 κ^2,
 * below 1e-4 whenever the test can pass, κ < 1 / (2 ε_f32 max(T, D))).
 * Returns 0 (take the eigen path) when dpotrf or dtrtri fails or the bound
 * is not met: V rank-deficient or nearly so. Cost O(D^3 / 3) instead of
 * dsyevd's ~O(4 D^3) with eigenvectors. */
static int gram_full_rank(const double *G, int T, int D, double *R, double *Rinv, double *ginf_out)
{
    double ginf = 0;
    for (int i = 0; i < D; i++) {
        double row = 0;
        for (int j = 0; j < i; j++) row += fabs(G[(size_t)j * D + i]);
        for (int j = i; j < D; j++) row += fabs(G[(size_t)i * D + j]);
        if (row > ginf) ginf = row;
    }
    *ginf_out = ginf;
    if (!(ginf > 0)) return 0;
    /* G's row-major upper triangle is the column-major lower one: dpotrf 'L' there gives
     * L with G = L L^T, which read row-major is R = L^T (upper), G = R^T R; the _work
     * call skips LAPACKE's transposes and NaN scans. */
    memcpy(R, G, (size_t)D * D * sizeof *R);
    if (LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, 'L', D, R, D) != 0) return 0;
    /* R^-1 by a blocked triangular solve R Y = I (LAPACK's dtrtri at D = 64 is unblocked) */
    memset(Rinv, 0, (size_t)D * D * sizeof *Rinv);
    for (int i = 0; i < D; i++) Rinv[(size_t)i * D + i] = 1.0;
    cblas_dtrsm(CblasRowMajor, CblasLeft, CblasUpper, CblasNoTrans, CblasNonUnit, D, D, 1.0, R, D, Rinv, D);
    double f = 0;
    for (int i = 0; i < D; i++)
        for (int j = i; j < D; j++) f += Rinv[(size_t)i * D + j] * Rinv[(size_t)i * D + j];
    const double c = EPS_F32 * imax(T, D);
    return isfinite(f) && f > 0 && 1.0 / f > 4.0 * c * c * ginf;
}

/* eff [T][T] = A U_r U_r^T (BERT); eff = A when r == T.
 * Fast path (T >= DV and rank(V) = DV certified by gram_full_rank): the
 * projector onto col(V) is Q Q^T with Q = V R^-1 (Cholesky QR of V in double,
 * G = V^T V = R^T R), which needs no eigen decomposition; σ_max (and tol)
 * then come from the eigenvalues of G alone (dsyevd without vectors) when
 * exact_sigma is set, else from the bound sqrt(||G||_∞) (rank and eff do not
 * depend on it). Otherwise the eigen path of thin_svd. */
static int effective_full(const float *A, const float *V, int ldv, int T, int DV, float *eff, int *rank,
                          double *sigma_max, double *tol, int exact_sigma, lens_err *err)
{
    float *U = NULL;
    int fast = 0;
    if (T >= DV) {
        const size_t DD = (size_t)DV * DV;
        double *x = malloc((size_t)T * DV * sizeof *x), *G = malloc(3 * DD * sizeof *G);
        U = malloc((size_t)T * DV * sizeof *U);
        if (!x || !G || !U) {
            free(x), free(G), free(U);
            return lens_fail(err, LENS_ENOMEM, "out of memory for the projector of V (%d x %d)", T, DV);
        }
        double *R = G + DD, *Rinv = G + 2 * DD, ginf;
        for (int t = 0; t < T; t++)
            for (int c = 0; c < DV; c++) x[(size_t)t * DV + c] = V[(size_t)t * ldv + c];
        /* x is filled above (T, DV >= 1 here; -O3 cannot see it, see thin_svd) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, DV, T, 1.0, x, DV, 0.0, G, DV);
#pragma GCC diagnostic pop
        if (gram_full_rank(G, T, DV, R, Rinv, &ginf)) {
            fast = 1;
            double smax2 = ginf;
            if (exact_sigma) {
                double *lambda = malloc((size_t)DV * sizeof *lambda);
                if (lambda && LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'N', 'U', DV, G, DV, lambda) == 0) smax2 = lambda[DV - 1];
                else fast = 0;
                free(lambda);
            }
            if (fast) {
                /* Q = X R^-1 in place, then to float */
                cblas_dtrmm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, T, DV, 1.0, Rinv, DV, x,
                            DV);
                for (size_t k = 0; k < (size_t)T * DV; k++) U[k] = (float)x[k];
                *sigma_max = sqrt(smax2);
                *tol = rank_tol(*sigma_max, T, DV);
                *rank = DV;
            }
        }
        free(x), free(G);
        if (!fast) free(U), U = NULL;
    }
    if (!fast && thin_svd(V, ldv, T, DV, sigma_max, tol, rank, &U, 0, "V", err)) return -1;
    const int r = *rank;
    if (r == T) {
        memcpy(eff, A, (size_t)T * T * sizeof *eff);
    } else if (r == 0) {
        memset(eff, 0, (size_t)T * T * sizeof *eff);
    } else {
        float *AU = malloc((size_t)T * r * sizeof *AU); /* [T][r] */
        if (!AU) {
            free(U);
            return lens_fail(err, LENS_ENOMEM, "out of memory for A U (%d x %d)", T, r);
        }
        /* lens_gemm's kernel, on the calling thread (heads are the callers' tasks) */
        lens_gemm(&(lens_gemm_args){.M = T, .N = r, .K = T, .x = A, .ldx = (size_t)T, .w = U, .ld = (size_t)r,
                                    .w_kn = 1, .alpha = 1.0f, .y = AU, .ldy = (size_t)r},
                  NULL);
        lens_gemm(&(lens_gemm_args){.M = T, .N = T, .K = r, .x = AU, .ldx = (size_t)r, .w = U, .ld = (size_t)r,
                                    .w_kn = 0, .alpha = 1.0f, .y = eff, .ldy = (size_t)T},
                  NULL);
        free(AU);
    }
    free(U);
    return 0;
}

/* ------------------------------------------------------------ effective, causal attention */

/* H = R^T R (R upper, row stride ld, n x n) becomes the factor of H + c c^T
 * (c destroyed); the LINPACK dchud rotation sequence. */
static void cholesky_update(double *R, int ld, int n, double *c)
{
    for (int k = 0; k < n; k++) {
        double *row = R + (size_t)k * ld;
        const double rkk = row[k], r = hypot(rkk, c[k]);
        const double cs = r / rkk, sn = c[k] / rkk;
        row[k] = r;
        for (int j = k + 1; j < n; j++) {
            row[j] = (row[j] + sn * c[j]) / cs;
            c[j] = cs * c[j] - sn * row[j];
        }
    }
}

/* Row i of L^-1 [DV][DV] (lower, stride DV) for L_{i+1} = [L_i 0; l^T d], the
 * Gram-Schmidt factor V_{0..i} = L B: x = -(L_i^-T l) / d, then 1/d.
 * Returns the squared norm the new row adds to ||L^-1||_F^2. */
static double inverse_row(double *Linv, int DV, int i, const double *l, double d)
{
    double *row = Linv + (size_t)i * DV, sq = 1.0 / (d * d);
    memcpy(row, l, (size_t)i * sizeof *row);
    if (i > 0) cblas_dtrmv(CblasRowMajor, CblasLower, CblasTrans, CblasNonUnit, i, Linv, DV, row, 1);
    for (int k = 0; k < i; k++) row[k] = -row[k] / d, sq += row[k] * row[k];
    row[i] = 1.0 / d;
    return sq;
}

/* Causal workspace: everything effective_causal keeps between rows. */
typedef struct {
    int T, DV;
    double *v;      /* [T][DV] V in double */
    double *y;      /* [T][DV] y_i = V^T a_i */
    double *z;      /* [T][DV] a_eff,i = V z_i on j <= i */
    double *basis;  /* [r][DV] orthonormal rows spanning V's row prefix */
    double *R;      /* [r][r] (stride DV) Cholesky factor of H */
    double *E;      /* [r][r] (stride DV) eigenvectors of H (uncertified rows) */
    double *Linv;   /* [i+1][i+1] (stride DV) inverse of the Gram-Schmidt factor while col(V_{0..i}) = R^{i+1} */
    double *C;      /* [T][r] V_{0..i} B^T when H is rebuilt */
    double *w;      /* [4 DV] coef, l, resid, g / lambda */
} causal_ws;

/* H = C^T C, C = V_{0..i} B^T [i+1][r]: σ(C) = σ(V_{0..i}) restricted to span(B).
 * Its eigenvalues decide, exactly as the per-row SVD does, whether every
 * singular value exceeds tol (returns 1: certified, R = chol(H), or 0 when
 * dpotrf fails), or not (returns 2: E, lambda hold the eigenpairs for this
 * row's projection). -1: dsyevd failed. */
static int causal_rebuild(causal_ws *ws, int i, int r, double tol, double *lambda)
{
    const int DV = ws->DV;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i + 1, r, DV, 1.0, ws->v, DV, ws->basis, DV, 0.0, ws->C, r);
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, r, i + 1, 1.0, ws->C, r, 0.0, ws->R, DV);
    /* eigenvalues first (no vectors: ~7x cheaper), vectors only for an uncertified row */
    for (int vectors = 0; vectors < 2; vectors++) {
        for (int a = 0; a < r; a++) memcpy(ws->E + (size_t)a * DV, ws->R + (size_t)a * DV, (size_t)r * sizeof *ws->E);
        if (LAPACKE_dsyevd(LAPACK_ROW_MAJOR, vectors ? 'V' : 'N', 'U', r, ws->E, DV, lambda)) return -1;
        /* λ ascending; squared, the rank test reads λ_k > tol^2 (λ carries an absolute
         * error ~r ε_f64 σ_max^2, ~1e-8 of tol^2: the SVD's decision, see thin_svd) */
        if (lambda[0] > tol * tol) return LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', r, ws->R, DV) == 0 ? 1 : 0;
    }
    return 2;
}

/* z = B^T W_k Λ_k^-1 W_k^T B y over the eigenpairs with λ > tol^2: the projection
 * onto the singular vectors of V_{0..i} above tol, as the per-row SVD. */
static void causal_project_eig(const causal_ws *ws, int r, double tol, const double *lambda, const double *y,
                               double *g, double *h, double *z)
{
    const int DV = ws->DV;
    cblas_dgemv(CblasRowMajor, CblasNoTrans, r, DV, 1.0, ws->basis, DV, y, 1, 0.0, g, 1);
    cblas_dgemv(CblasRowMajor, CblasTrans, r, r, 1.0, ws->E, DV, g, 1, 0.0, h, 1);
    for (int k = 0; k < r; k++) h[k] = lambda[k] > tol * tol ? h[k] / lambda[k] : 0.0;
    cblas_dgemv(CblasRowMajor, CblasNoTrans, r, r, 1.0, ws->E, DV, h, 1, 0.0, g, 1);
    cblas_dgemv(CblasRowMajor, CblasTrans, r, DV, 1.0, ws->basis, DV, g, 1, 0.0, z, 1);
}

/* eff [T][T]: row i = projection of A[i][0..i] onto col(V[0..i]); see the top comment. */
static int effective_causal(const float *A, const float *V, int ldv, int T, int DV, double tol, float *eff,
                            lens_err *err)
{
    const size_t TD = (size_t)T * DV, DD = (size_t)DV * DV;
    causal_ws ws = {.T = T, .DV = DV};
    ws.v = malloc(TD * sizeof *ws.v), ws.y = calloc(TD, sizeof *ws.y), ws.z = calloc(TD, sizeof *ws.z);
    ws.basis = malloc(DD * sizeof *ws.basis), ws.R = malloc(DD * sizeof *ws.R), ws.E = malloc(DD * sizeof *ws.E);
    ws.Linv = malloc(DD * sizeof *ws.Linv), ws.C = malloc(TD * sizeof *ws.C);
    ws.w = malloc((size_t)(6 * DV) * sizeof *ws.w);
    unsigned char *full = calloc((size_t)T, 1); /* row i: col(V_{0..i}) = R^{i+1} (certified) */
    int rc = 0;
    if (!ws.v || !ws.y || !ws.z || !ws.basis || !ws.R || !ws.E || !ws.Linv || !ws.C || !ws.w || !full) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for causal effective attention (T %d)", T);
        goto done;
    }
    double *coef = ws.w, *l = ws.w + DV, *resid = ws.w + 2 * DV, *g = ws.w + 3 * DV, *lambda = ws.w + 4 * DV;
    double *h = ws.w + 5 * DV;
    double *v = ws.v, *basis = ws.basis, *R = ws.R;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < DV; c++) v[(size_t)t * DV + c] = V[(size_t)t * ldv + c];
    for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) {
            const double a = A[(size_t)i * T + j];
            if (a != 0) cblas_daxpy(DV, a, v + (size_t)j * DV, 1, ws.y + (size_t)i * DV, 1);
        }

    /* certified: every singular value of C = V_{0..i} B^T is above tol. Adding a row
     * to C never lowers a singular value (interlacing), so it stays certified until
     * B grows; then H is rebuilt and checked again. */
    int r = 0, have_H = 0, certified = 0;
    double linv_f2 = 0; /* ||L^-1||_F^2 while every row added a direction */
    for (int i = 0; i < T; i++) {
        const double *vi = v + (size_t)i * DV;
        /* Gram-Schmidt twice ("twice is enough") against the current basis; l = the coefficients. */
        memcpy(resid, vi, (size_t)DV * sizeof *resid);
        memset(l, 0, (size_t)DV * sizeof *l);
        for (int pass = 0; pass < 2 && r > 0; pass++) {
            cblas_dgemv(CblasRowMajor, CblasNoTrans, r, DV, 1.0, basis, DV, resid, 1, 0.0, coef, 1);
            cblas_dgemv(CblasRowMajor, CblasTrans, r, DV, -1.0, basis, DV, coef, 1, 1.0, resid, 1);
            cblas_daxpy(r, 1.0, coef, 1, l, 1);
        }
        const double dist = cblas_dnrm2(DV, resid, 1);
        if (r < DV && dist > tol) {
            for (int c = 0; c < DV; c++) basis[(size_t)r * DV + c] = resid[c] / dist;
            r++;
            have_H = 0;
        }
        if (r == i + 1) {
            /* Gram-Schmidt distances above tol do not make σ_min(V_{0..i}) > tol (a square
             * prefix can be near-singular with every distance well above it): certify
             * σ_min = σ_min(L) >= 1 / ||L^-1||_F > 2 tol, else decide by the eigenvalues. */
            linv_f2 += inverse_row(ws.Linv, DV, i, l, dist);
            if (1.0 / linv_f2 > 4 * tol * tol) {
                full[i] = 1;
                continue;
            }
        }
        if (!have_H || !certified) {
            const int k = causal_rebuild(&ws, i, r, tol, lambda);
            if (k < 0) {
                rc = lens_fail(err, LENS_EFORMAT, "LAPACK dsyevd failed on a causal prefix of V (row %d)", i);
                goto done;
            }
            certified = k == 1, have_H = k == 1;
            if (k == 1 && r == i + 1) {
                full[i] = 1;
                continue;
            }
            if (k != 1) {
                /* near-singular prefix (or H not positive definite in floating point):
                 * this row from the eigenpairs, the next row rebuilds again */
                causal_project_eig(&ws, r, tol, lambda, ws.y + (size_t)i * DV, g, h, ws.z + (size_t)i * DV);
                continue;
            }
        } else {
            cblas_dgemv(CblasRowMajor, CblasNoTrans, r, DV, 1.0, basis, DV, vi, 1, 0.0, coef, 1);
            cholesky_update(R, DV, r, coef);
        }
        /* z_i = B^T R^-1 R^-T B y_i */
        cblas_dgemv(CblasRowMajor, CblasNoTrans, r, DV, 1.0, basis, DV, ws.y + (size_t)i * DV, 1, 0.0, g, 1);
        cblas_dtrsv(CblasRowMajor, CblasUpper, CblasTrans, CblasNonUnit, r, R, DV, g, 1);
        cblas_dtrsv(CblasRowMajor, CblasUpper, CblasNoTrans, CblasNonUnit, r, R, DV, g, 1);
        cblas_dgemv(CblasRowMajor, CblasTrans, r, DV, 1.0, basis, DV, g, 1, 0.0, ws.z + (size_t)i * DV, 1);
    }
    /* a_eff,i[j] = v_j . z_i for j <= i */
    for (int i = 0; i < T; i++) {
        float *out = eff + (size_t)i * T;
        if (full[i]) memcpy(out, A + (size_t)i * T, (size_t)(i + 1) * sizeof *out);
        else
            for (int j = 0; j <= i; j++)
                out[j] = (float)cblas_ddot(DV, v + (size_t)j * DV, 1, ws.z + (size_t)i * DV, 1);
        for (int j = i + 1; j < T; j++) out[j] = 0;
    }
done:
    free(ws.v), free(ws.y), free(ws.z), free(ws.basis), free(ws.R), free(ws.E), free(ws.Linv), free(ws.C), free(ws.w);
    free(full);
    return rc;
}

/* Sliding-window rows: row i sees the keys of its band lo .. hi - 1 only
 * (lens_key_band: causal, i - W < j <= i, Mistral and Gemma's local layers;
 * bidirectional, |i - j| <= W / 2, ModernBERT's), so its alternatives are δ
 * with δ^T V_{lo..hi-1} = 0 and a_eff,i = projection of a_i[lo..hi-1] onto
 * col(V_{lo..hi-1}) (zero elsewhere); causal rows i < W are the causal
 * prefixes effective_causal computed. The band's Gram matrix G =
 * V_band^T V_band [DV][DV] slides by rank-one updates and downdates as the
 * band moves (in double: the cancellation error, ~T ε_f64 σ_max^2, is far
 * below tol^2), and z_i = W_k Λ_k^-1 W_k^T V_band^T a_i over its eigenpairs
 * with λ_k > tol^2 (the rank rule of the per-row SVD), so a_eff,i[j] =
 * v_j . z_i. O(T (DV^3 + W DV)). */
static int effective_window(const float *A, const float *V, int ldv, int T, int DV, int causal, int W, double tol,
                            float *eff, const volatile int *cancel, lens_err *err)
{
    const size_t DD = (size_t)DV * DV;
    double *v = malloc((size_t)T * DV * sizeof *v), *G = calloc(DD, sizeof *G), *E = malloc(DD * sizeof *E);
    double *w = malloc(4 * (size_t)DV * sizeof *w);
    int rc = 0;
    if (!v || !G || !E || !w) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for windowed effective attention (T %d, DV %d)", T, DV);
        goto done;
    }
    double *lambda = w, *y = w + DV, *g = w + 2 * DV, *z = w + 3 * DV;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < DV; c++) v[(size_t)t * DV + c] = V[(size_t)t * ldv + c];
    int in_lo = 0, in_hi = 0; /* G sums v_j v_j^T over in_lo <= j < in_hi */
    for (int i = 0; i < T; i++) {
        int lo, hi;
        lens_key_band(i, T, causal, W, &lo, &hi);
        for (; in_hi < hi; in_hi++) cblas_dsyr(CblasRowMajor, CblasUpper, DV, 1.0, v + (size_t)in_hi * DV, 1, G, DV);
        if (causal && i < W) continue; /* row i's window is its causal prefix */
        if (lens_cancelled(cancel)) {
            rc = lens_fail(err, LENS_ECANCEL, "windowed effective attention cancelled at row %d", i);
            goto done;
        }
        for (; in_lo < lo; in_lo++) cblas_dsyr(CblasRowMajor, CblasUpper, DV, -1.0, v + (size_t)in_lo * DV, 1, G, DV);
        memcpy(E, G, DD * sizeof *E);
        if (LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', DV, E, DV, lambda)) {
            rc = lens_fail(err, LENS_EFORMAT, "LAPACK dsyevd failed on the window of V at row %d", i);
            goto done;
        }
        const float *a = A + (size_t)i * T;
        /* y = V_band^T a_i[band] */
        memset(y, 0, (size_t)DV * sizeof *y);
        for (int j = lo; j < hi; j++)
            if (a[j] != 0) cblas_daxpy(DV, a[j], v + (size_t)j * DV, 1, y, 1);
        /* z = E Λ^-1 E^T y over λ > tol^2 */
        cblas_dgemv(CblasRowMajor, CblasTrans, DV, DV, 1.0, E, DV, y, 1, 0.0, g, 1);
        for (int k = 0; k < DV; k++) g[k] = lambda[k] > tol * tol ? g[k] / lambda[k] : 0.0;
        cblas_dgemv(CblasRowMajor, CblasNoTrans, DV, DV, 1.0, E, DV, g, 1, 0.0, z, 1);
        float *out = eff + (size_t)i * T;
        for (int j = 0; j < T; j++) out[j] = j >= lo && j < hi ? (float)cblas_ddot(DV, v + (size_t)j * DV, 1, z, 1) : 0.0f;
    }
done:
    free(v), free(G), free(E), free(w);
    return rc;
}

int lens_attention_effective(const float *A, const float *V, int ldv, int T, int DV, int causal, int window,
                             float *effective, int *rank, lens_err *err)
{
    if (!A || !V || !effective || T < 1 || DV < 1 || ldv < DV || window < 0)
        return lens_fail(err, LENS_EINVAL, "effective attention: bad arguments (T %d, DV %d, window %d)", T, DV,
                         window);
    double sigma_max, tol;
    int r;
    if (!causal) {
        if (effective_full(A, V, ldv, T, DV, effective, &r, &sigma_max, &tol, 0, err)) return -1;
    } else {
        if (thin_svd(V, ldv, T, DV, &sigma_max, &tol, &r, NULL, 0, "V", err)) return -1;
        if (effective_causal(A, V, ldv, T, DV, tol, effective, err)) return -1;
    }
    if (window && effective_window(A, V, ldv, T, DV, causal, window, tol, effective, NULL, err)) return -1;
    if (rank) *rank = r;
    return 0;
}

/* ------------------------------------------------------------ identifiability */

/* rank([V_rows, 1]) for the rows listed in idx[n] (all rows when idx is NULL);
 * tol = σ_max ε_f32 max(n, DV + 1). */
static int rank_v_one(const float *V, int ldv, int DV, const int *idx, int n, lens_err *err)
{
    if (n == 0) return 0;
    float *M = malloc((size_t)n * (DV + 1) * sizeof *M);
    if (!M) return lens_fail(err, LENS_ENOMEM, "out of memory for [V, 1]");
    for (int t = 0; t < n; t++) {
        memcpy(M + (size_t)t * (DV + 1), V + (size_t)(idx ? idx[t] : t) * ldv, (size_t)DV * sizeof *M);
        M[(size_t)t * (DV + 1) + DV] = 1.0f;
    }
    double smax, tol;
    int r;
    int rc = thin_svd(M, DV + 1, n, DV + 1, &smax, &tol, &r, NULL, 0, "[V, 1]", err);
    free(M);
    return rc ? -1 : r;
}

/* sum_i |supp a_i| - rank([V_supp(i), 1]); valid as the key-aware dimension when rank(Q) = T. */
static int key_aware_closed_form(const float *A, const float *V, int ldv, int T, int DV, int rank_v1,
                                 const volatile int *cancel, lens_err *err)
{
    int *idx = malloc((size_t)T * sizeof *idx), total = 0;
    if (!idx) return lens_fail(err, LENS_ENOMEM, "out of memory for the key-aware dimension");
    for (int i = 0; i < T; i++) {
        if (lens_cancelled(cancel)) {
            free(idx);
            return lens_fail(err, LENS_ECANCEL, "key-aware dimension cancelled at row %d", i);
        }
        int n = 0;
        for (int j = 0; j < T; j++)
            if (A[(size_t)i * T + j] > 0) idx[n++] = j;
        int r = n == T ? rank_v1 : rank_v_one(V, ldv, DV, idx, n, err);
        if (r < 0) {
            free(idx);
            return -1;
        }
        total += n - r;
    }
    free(idx);
    return total;
}

/* rank(J') - rank(M J') on the T * rq unknowns Y = δK P (see the top comment). */
static int key_aware_explicit(const float *A, const float *V, int ldv, const float *P, int rq, int T, int DV,
                              int DK, int causal, const volatile int *cancel, lens_head_attention *res, lens_err *err)
{
    const int n = T * rq;
    int rows_j = 0;
    for (int i = 0; i < T; i++) rows_j += causal ? i + 1 : T;
    const int rows_mj = T * DV;
    double *J = calloc((size_t)rows_j * n, sizeof *J), *MJ = calloc((size_t)rows_mj * n, sizeof *MJ);
    double *y = malloc((size_t)DV * sizeof *y);
    int rc = -1;
    if (!J || !MJ || !y) {
        lens_fail(err, LENS_ENOMEM, "out of memory for the key-aware matrices (%d + %d rows x %d)", rows_j, rows_mj,
                  n);
        goto done;
    }
    /* J and M J scale alike: their ranks are the same for 1/sqrt(DV) (attention_scale "DV") */
    const double scale = 1.0 / sqrt((double)DK);
    int row = 0;
    for (int i = 0; i < T; i++) {
        const float *a = A + (size_t)i * T, *p = P + (size_t)i * rq;
        const int keys = causal ? i + 1 : T;
        /* J'[(i,j),(m,c)] = (a_ij [j == m] - a_ij a_im) p_ic */
        for (int j = 0; j < keys; j++, row++) {
            double *out = J + (size_t)row * n;
            for (int m = 0; m < keys; m++) {
                const double s = scale * ((j == m ? (double)a[j] : 0.0) - (double)a[j] * a[m]);
                if (s != 0)
                    for (int c = 0; c < rq; c++) out[(size_t)m * rq + c] = s * p[c];
            }
        }
        /* MJ'[(i,e),(m,c)] = a_im (V[m][e] - y_i[e]) p_ic */
        for (int e = 0; e < DV; e++) {
            double ye = 0;
            for (int j = 0; j < keys; j++) ye += (double)a[j] * V[(size_t)j * ldv + e];
            y[e] = ye;
        }
        for (int e = 0; e < DV; e++) {
            double *out = MJ + ((size_t)i * DV + e) * n;
            for (int m = 0; m < keys; m++) {
                const double s = scale * (double)a[m] * ((double)V[(size_t)m * ldv + e] - y[e]);
                if (s != 0)
                    for (int c = 0; c < rq; c++) out[(size_t)m * rq + c] = s * p[c];
            }
        }
    }
    if (lens_cancelled(cancel)) {
        lens_fail(err, LENS_ECANCEL, "key-aware dimension cancelled");
        goto done;
    }
    int rj = numeric_rank(J, rows_j, n, T * DK, "the key Jacobian J", err);
    if (rj >= 0 && lens_cancelled(cancel)) rj = lens_fail(err, LENS_ECANCEL, "key-aware dimension cancelled");
    int rmj = rj < 0 ? -1 : numeric_rank(MJ, rows_mj, n, T * DK, "M J", err);
    if (rj >= 0 && rmj >= 0) {
        res->rank_j = rj, res->rank_mj = rmj;
        res->key_aware_dim = rj - rmj;
        rc = 0;
    }
done:
    free(J), free(MJ), free(y);
    return rc;
}

/* Largest eigenvalue of the symmetric G [n][n] (row-major, upper triangle) by
 * Lanczos with full reorthogonalisation, at most 60 steps from a fixed start:
 * the largest Ritz value converges to λ_max long before (it only sets tol, so a
 * relative error of 1e-8 moves no count unless a singular value sits that close
 * to tol, where any SVD's count is a coin toss too). work [61 n + 5 * 61]. */
static double lanczos_max(const double *G, int n, double *work)
{
    const int kmax = imin(n, 60);
    double *Qk = work, *w = work + (size_t)kmax * n, *alpha = w + n, *beta = alpha + kmax, *top = beta + 4 * kmax;
    *top = 0;
    for (int k = 0; k < n; k++) Qk[k] = 1.0 + 0.5 * sin(1.0 + k); /* any vector not orthogonal to the top one */
    cblas_dscal(n, 1.0 / cblas_dnrm2(n, Qk, 1), Qk, 1);
    int k = 0;
    for (; k < kmax; k++) {
        const double *q = Qk + (size_t)k * n;
        cblas_dsymv(CblasRowMajor, CblasUpper, n, 1.0, G, n, q, 1, 0.0, w, 1);
        alpha[k] = cblas_ddot(n, q, 1, w, 1);
        /* w -= Q_k (Q_k^T w), twice */
        double *h = beta + kmax;
        for (int pass = 0; pass < 2; pass++) {
            cblas_dgemv(CblasRowMajor, CblasNoTrans, k + 1, n, 1.0, Qk, n, w, 1, 0.0, h, 1);
            cblas_dgemv(CblasRowMajor, CblasTrans, k + 1, n, -1.0, Qk, n, h, 1, 1.0, w, 1);
        }
        beta[k] = cblas_dnrm2(n, w, 1);
        if (k + 1 == kmax || beta[k] <= 1e-14 * fabs(alpha[0])) {
            k++;
            break;
        }
        if (k >= 8 && k % 4 == 0) {
            /* stop once the top Ritz value settles to 1e-12 (each step reads all of G) */
            double *d = h + kmax, *e = d + kmax;
            memcpy(d, alpha, (size_t)(k + 1) * sizeof *d), memcpy(e, beta, (size_t)k * sizeof *e);
            if (LAPACKE_dsterf(k + 1, d, e) == 0) {
                if (fabs(d[k] - *top) <= 1e-12 * fabs(d[k])) {
                    k++;
                    break;
                }
                *top = d[k];
            }
        }
        double *next = Qk + (size_t)(k + 1) * n;
        for (int t = 0; t < n; t++) next[t] = w[t] / beta[k];
    }
    /* eigenvalues of the k x k tridiagonal (alpha, beta) */
    if (LAPACKE_dsterf(k, alpha, beta)) return NAN;
    return alpha[k - 1];
}

/* #{eigenvalues of G > tau}, G [n][n] row-major upper (destroyed): by Sylvester's
 * law of inertia, the positive eigenvalues of D in G - tau I = L D L^T (dsytrf,
 * Bunch-Kaufman; D has 1x1 and 2x2 blocks). Backward stable: the count is exact
 * for a G within ~n ε_f64 ||G|| (the error of forming G). -1: LAPACK failed. */
static int count_eigs_above(double *G, int n, double tau, int *ipiv)
{
    for (int k = 0; k < n; k++) G[(size_t)k * n + k] -= tau;
    /* row-major upper = column-major lower */
    if (LAPACKE_dsytrf(LAPACK_COL_MAJOR, 'L', n, G, n, ipiv) < 0) return -1;
    int pos = 0;
    for (int k = 0; k < n; k++) {
        const double a = G[(size_t)k * n + k];
        if (ipiv[k] > 0 || k + 1 == n) {
            pos += a > 0;
            continue;
        }
        /* 2x2 block rows k, k+1: [a b; b c] */
        const double b = G[(size_t)k * n + k + 1], c = G[(size_t)(k + 1) * n + k + 1], det = a * c - b * b;
        pos += det < 0 ? 1 : det > 0 ? (a > 0) * 2 : (a + c > 0);
        k++;
    }
    return pos;
}

/* rank of a Gram matrix G = F^T F [n][n] (destroyed) under numeric_rank's rule for F
 * (rows x n): #{σ > tol}, σ_max = sqrt(λ_max), tol = σ_max ε_f32 max(rows, n, n_tol). */
static int gram_rank(double *G, int n, int rows, int n_tol, double *work, int *ipiv, const char *what, lens_err *err)
{
    if (n == 0) return 0;
    const double lmax = lanczos_max(G, n, work);
    if (!(lmax >= 0)) return lens_fail(err, LENS_EFORMAT, "LAPACK dsterf failed on %s", what);
    if (lmax == 0) return 0;
    const double tol = rank_tol(sqrt(lmax), rows, imax(n, n_tol));
    const int r = count_eigs_above(G, n, tol * tol, ipiv);
    if (r < 0) return lens_fail(err, LENS_EFORMAT, "LAPACK dsytrf failed on %s", what);
    return r;
}

/* rank(J') - rank(M J') as key_aware_explicit, without forming J' (T^2 x T·rq) or
 * M J' (T·DV x T·rq): their Gram matrices (T·rq square) from the Kronecker
 * structure J'_i = (diag(a_i) - a_i a_i^T) ⊗ p_i^T, M J'_i = V^T S_i ⊗ p_i^T, with
 * x1_i = a_i ⊗ p_i, x2_i = (a_i ∘ a_i) ⊗ p_i, x3_i = (a_i ∘ V y_i) ⊗ p_i (rows of
 * X1, X2, X3 [T][T·rq], all / sqrt(DK)), s2_i = |a_i|^2, K = V V^T:
 *   J'^T J'   = Σ_i diag_m(a_im^2 p_i p_i^T) + X1^T diag(s2) X1 - X1^T X2 - X2^T X1
 *   MJ'^T MJ' = (X1^T X1) ∘ (K ⊗ 1 1^T) + X1^T diag(|y|^2) X1 - X1^T X3 - X3^T X1
 * (two dsyrk/dsyr2k of T·rq x T·rq x T, O(T^3 rq^2), against the O(T^4 rq^2)
 * SVDs), ranks by inertia (gram_rank). Squaring costs no count: eigenvalues
 * carry ~n ε_f64 λ_max, tol^2 >= (ε_f32 T^2)^2 λ_max is 1e4 times larger. */
static int key_aware_gram(const float *A, const float *V, int ldv, const float *P, int rq, int T, int DV, int DK,
                          int causal, const volatile int *cancel, lens_head_attention *res, lens_err *err)
{
    const int n = T * rq;
    int rows_j = 0;
    for (int i = 0; i < T; i++) rows_j += causal ? i + 1 : T;
    if (n == 0) { /* Q = 0: the keys move nothing */
        res->rank_j = res->rank_mj = res->key_aware_dim = 0;
        return 0;
    }
    const size_t nn = (size_t)n * n, Tn = (size_t)T * n;
    double *G = malloc(nn * sizeof *G), *X1 = malloc(Tn * sizeof *X1);
    double *X2 = malloc(Tn * sizeof *X2), *vd = malloc((size_t)T * DV * sizeof *vd);
    double *y = malloc((size_t)T * DV * sizeof *y), *K = malloc((size_t)T * T * sizeof *K);
    double *work = malloc(((size_t)61 * n + 5 * 61) * sizeof *work);
    int *ipiv = malloc((size_t)n * sizeof *ipiv);
    int rc = -1;
    if (!G || !X1 || !X2 || !vd || !y || !K || !work || !ipiv) {
        lens_fail(err, LENS_ENOMEM, "out of memory for the key-aware Gram matrices (%d x %d)", n, n);
        goto done;
    }
    const double scale = 1.0 / sqrt((double)DK);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < DV; e++) vd[(size_t)t * DV + e] = V[(size_t)t * ldv + e];
    /* y_i = V^T a_i (a_i is zero beyond i for causal heads) */
    for (int i = 0; i < T; i++)
        for (int e = 0; e < DV; e++) {
            double ye = 0;
            for (int j = 0; j < T; j++) ye += (double)A[(size_t)i * T + j] * vd[(size_t)j * DV + e];
            y[(size_t)i * DV + e] = ye;
        }
    /* J: X1 and B = s2/2 X1 - X2 (in X2), G = X1^T B + B^T A + the block diagonal */
    for (int i = 0; i < T; i++) {
        const float *a = A + (size_t)i * T, *p = P + (size_t)i * rq;
        double s2 = 0;
        for (int m = 0; m < T; m++) s2 += (double)a[m] * a[m];
        for (int m = 0; m < T; m++)
            for (int c = 0; c < rq; c++) {
                const double x = scale * a[m] * p[c];
                X1[(size_t)i * n + m * rq + c] = x;
                X2[(size_t)i * n + m * rq + c] = 0.5 * s2 * x - a[m] * x;
            }
    }
    cblas_dsyr2k(CblasRowMajor, CblasUpper, CblasTrans, n, T, 1.0, X1, n, X2, n, 0.0, G, n);
    for (int m = 0; m < T; m++) /* Σ_i a_im^2 p_ic p_ic' / DK on the diagonal blocks */
        for (int i = 0; i < T; i++) {
            const double *x = X1 + (size_t)i * n + m * rq;
            for (int c = 0; c < rq; c++)
                for (int d = c; d < rq; d++) G[(size_t)(m * rq + c) * n + m * rq + d] += x[c] * x[d];
        }
    if (lens_cancelled(cancel)) goto stop;
    const int rj = gram_rank(G, n, rows_j, T * DK, work, ipiv, "the key Jacobian J", err);
    if (rj < 0) goto done;
    if (lens_cancelled(cancel)) goto stop;
    /* M J: G = (X1^T X1) ∘ (K ⊗ 1 1^T), then + X1^T B + B^T X1 with B = |y|^2/2 X1 - X3 */
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, n, T, 1.0, X1, n, 0.0, G, n);
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, T, DV, 1.0, vd, DV, 0.0, K, T);
    for (int r = 0; r < n; r++)
        for (int c = r; c < n; c++) {
            const int m = r / rq, m2 = c / rq;
            G[(size_t)r * n + c] *= m <= m2 ? K[(size_t)m * T + m2] : K[(size_t)m2 * T + m];
        }
    for (int i = 0; i < T; i++) {
        const double *yi = y + (size_t)i * DV, yy = cblas_ddot(DV, yi, 1, yi, 1);
        for (int m = 0; m < T; m++) {
            const double km = cblas_ddot(DV, vd + (size_t)m * DV, 1, yi, 1);
            for (int c = 0; c < rq; c++) {
                const double x = X1[(size_t)i * n + m * rq + c];
                X2[(size_t)i * n + m * rq + c] = 0.5 * yy * x - km * x;
            }
        }
    }
    cblas_dsyr2k(CblasRowMajor, CblasUpper, CblasTrans, n, T, 1.0, X1, n, X2, n, 1.0, G, n);
    if (lens_cancelled(cancel)) goto stop;
    const int rmj = gram_rank(G, n, T * DV, T * DK, work, ipiv, "M J", err);
    if (rmj < 0) goto done;
    res->rank_j = rj, res->rank_mj = rmj;
    res->key_aware_dim = rj - rmj;
    rc = 0;
    goto done;
stop:
    lens_fail(err, LENS_ECANCEL, "key-aware dimension cancelled");
done:
    free(G), free(X1), free(X2), free(vd), free(y), free(K), free(work), free(ipiv);
    return rc;
}

/* U_r [T][r] (malloc'd), the orthonormal basis of col(V) under thin_svd's
 * rank, which the key-aware step takes for V: M(δA) = δA U_r has the same
 * kernel as δA V with V's own tolerance. r = 0 (V = 0) gives one zero column,
 * so that M annihilates everything. */
static int value_basis(const float *V, int ldv, int T, int DV, float **U, int *r, lens_err *err)
{
    double smax, tol;
    if (thin_svd(V, ldv, T, DV, &smax, &tol, r, U, 0, "V", err)) return -1;
    if (*r == 0) {
        memset(*U, 0, (size_t)T * sizeof **U);
        *r = 1;
    }
    return 0;
}

static int key_aware(const float *A, const float *V, int ldv, const float *Q, int ldq, int T, int DV, int DK,
                     int causal, const lens_attention_opts *opts, lens_head_attention *res, lens_err *err)
{
    const int limit = opts->key_aware_max_unknowns > 0 ? opts->key_aware_max_unknowns : LENS_ATTN_KEY_AWARE_MAX_UNKNOWNS;
    res->key_aware_unknowns = T * DK;
    if (!Q) return lens_fail(err, LENS_EINVAL, "the key-aware dimension needs the queries Q");
    const int explicit_ok = (long)T * DK <= limit;
    double smax, tol;
    int rq;
    float *P = NULL;
    if (thin_svd(Q, ldq, T, DK, &smax, &tol, &rq, explicit_ok ? &P : NULL, 1, "Q", err)) return -1;
    res->rank_q = rq;
    int rc = 0;
    if (explicit_ok) {
        res->key_aware_method = LENS_KEY_AWARE_EXPLICIT;
        float *U = NULL;
        int rv;
        rc = value_basis(V, ldv, T, DV, &U, &rv, err);
        if (rc == 0)
            rc = opts->key_aware_dense
                     ? key_aware_explicit(A, U, rv, P, rq, T, rv, DK, causal, opts->cancel, res, err)
                     : key_aware_gram(A, U, rv, P, rq, T, rv, DK, causal, opts->cancel, res, err);
        free(U);
    } else if (rq == T) {
        res->key_aware_method = LENS_KEY_AWARE_CLOSED_FORM;
        int d = key_aware_closed_form(A, V, ldv, T, DV, res->rank_v1, opts->cancel, err);
        if (d < 0) rc = -1;
        else res->key_aware_dim = d;
    } else {
        res->key_aware_method = LENS_KEY_AWARE_SKIPPED;
        snprintf(res->key_aware_note, sizeof res->key_aware_note,
                 "T*DK = %d unknowns exceeds the limit %d and rank(Q) = %d < T = %d (no closed form)", T * DK, limit,
                 rq, T);
    }
    free(P);
    return rc;
}

/* ------------------------------------------------------------ statistics */

/* over the entries a row may attend (lens_key_band: all, j <= i, or a sliding window) */
static double pearson(const float *x, const float *y, int T, int causal, int window)
{
    double sx = 0, sy = 0, n = 0;
    int lo, hi;
    for (int i = 0; i < T; i++)
        for (lens_key_band(i, T, causal, window, &lo, &hi); lo < hi; lo++)
            sx += x[(size_t)i * T + lo], sy += y[(size_t)i * T + lo], n++;
    const double mx = sx / n, my = sy / n;
    double sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < T; i++)
        for (lens_key_band(i, T, causal, window, &lo, &hi); lo < hi; lo++) {
            const int j = lo;
            const double dx = x[(size_t)i * T + j] - mx, dy = y[(size_t)i * T + j] - my;
            sxy += dx * dy, sxx += dx * dx, syy += dy * dy;
        }
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN;
}

static double mass(const float *M, int T, const unsigned char *mask)
{
    if (!mask) return NAN;
    double total = 0;
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++)
            if (mask[j]) total += M[(size_t)i * T + j];
    return total / T;
}

/* max_i ||(eff - A)_i V|| / ||A V||_F (two sgemms; a self-check reported per head) */
static double identity_residual(const float *A, const float *eff, const float *V, int ldv, int T, int DV)
{
    float *av = malloc((size_t)T * DV * sizeof *av), *ev = malloc((size_t)T * DV * sizeof *ev);
    if (!av || !ev) {
        free(av), free(ev);
        return NAN;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, A, T, V, ldv, 0.0f, av, DV);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, DV, T, 1.0f, eff, T, V, ldv, 0.0f, ev, DV);
    double norm_av = 0, worst = 0;
    for (int i = 0; i < T; i++) {
        double rn = 0;
        for (int c = 0; c < DV; c++) {
            const double x = av[(size_t)i * DV + c], d = (double)ev[(size_t)i * DV + c] - x;
            norm_av += x * x, rn += d * d;
        }
        if (rn > worst) worst = rn;
    }
    free(av), free(ev);
    return norm_av > 0 ? sqrt(worst / norm_av) : (worst > 0 ? INFINITY : 0);
}

/* ------------------------------------------------------------ one head */

static void head_init(lens_head_attention *res, int T, int DV, int DK, int causal)
{
    memset(res, 0, sizeof *res);
    res->T = T, res->DV = DV, res->DK = DK, res->causal = causal;
    res->rank = res->null_dim = res->rank_v1 = res->stochastic_null_dim = -1;
    res->key_aware_dim = res->rank_q = res->rank_j = res->rank_mj = -1;
    res->key_aware_unknowns = T * DK;
    res->sigma_max = res->tol = res->pearson = NAN;
    res->special_mass_raw = res->special_mass_effective = res->punct_mass_raw = res->punct_mass_effective = NAN;
    res->max_identity_residual = NAN;
}

static int head_failed(lens_head_attention *res, lens_err *err)
{
    res->ok = 0;
    if (err) res->err = *err;
    return -1;
}

int lens_attention_head(const float *A, const float *V, int ldv, const float *Q, int ldq, int T, int DV, int DK,
                        int causal, int window, const unsigned char *special, const unsigned char *punct,
                        const lens_attention_opts *opts, float *effective, float *null, lens_head_attention *res,
                        lens_err *err)
{
    lens_err local = {0};
    if (!err) err = &local;
    const lens_attention_opts defaults = {0};
    if (!opts) opts = &defaults;
    head_init(res, T, DV, DK, causal);
    if (lens_cancelled(opts->cancel)) {
        lens_fail(err, LENS_ECANCEL, "attention analysis cancelled");
        return head_failed(res, err);
    }
    if (!A || !V || T < 1 || DV < 1 || ldv < DV || (opts->key_aware && (!Q || DK < 1 || ldq < DK)) || window < 0) {
        lens_fail(err, LENS_EINVAL, "attention head: bad arguments (T %d, DV %d, DK %d, window %d)", T, DV, DK, window);
        return head_failed(res, err);
    }
    float *eff = effective ? effective : malloc((size_t)T * T * sizeof *eff);
    if (!eff) {
        lens_fail(err, LENS_ENOMEM, "out of memory for a %d x %d effective attention", T, T);
        return head_failed(res, err);
    }
    int rc = 0;
    if (!causal) {
        rc = effective_full(A, V, ldv, T, DV, eff, &res->rank, &res->sigma_max, &res->tol, 1, err);
    } else {
        rc = thin_svd(V, ldv, T, DV, &res->sigma_max, &res->tol, &res->rank, NULL, 0, "V", err);
        if (!rc) rc = effective_causal(A, V, ldv, T, DV, res->tol, eff, err);
    }
    if (!rc && window) rc = effective_window(A, V, ldv, T, DV, causal, window, res->tol, eff, opts->cancel, err);
    /* the last row's keys: all T, or its band in a sliding window */
    int first, end;
    lens_key_band(T - 1, T, causal, window, &first, &end);
    const int keys = end - first;
    const float *Vk = V + (size_t)first * ldv;
    if (!rc && keys < T) {
        double smax, tol; /* sigma_max / tol stay the full V's: the effective rows used them */
        rc = thin_svd(Vk, ldv, keys, DV, &smax, &tol, &res->rank, NULL, 0, "the last window of V", err);
    }
    if (!rc) {
        res->null_dim = keys - res->rank;
        res->identifiable = res->rank == keys;
        res->rank_v1 = rank_v_one(Vk, ldv, DV, NULL, keys, err);
        rc = res->rank_v1 < 0 ? -1 : 0;
        res->stochastic_null_dim = rc ? -1 : keys - res->rank_v1;
    }
    if (!rc) {
        res->pearson = pearson(A, eff, T, causal, window);
        res->special_mass_raw = mass(A, T, special), res->special_mass_effective = mass(eff, T, special);
        res->punct_mass_raw = mass(A, T, punct), res->punct_mass_effective = mass(eff, T, punct);
        res->max_identity_residual = identity_residual(A, eff, V, ldv, T, DV);
        if (null)
            for (size_t k = 0; k < (size_t)T * T; k++) null[k] = A[k] - eff[k];
        if (opts->key_aware) {
            rc = key_aware(A, V, ldv, Q, ldq, T, DV, DK, causal, opts, res, err);
        }
    }
    if (eff != effective) free(eff);
    if (rc) return head_failed(res, err);
    res->ok = 1;
    return 0;
}

/* ------------------------------------------------------------ token masks */

static int is_punct_piece(const char *s)
{
    if (!s || !*s) return 0;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    int n = 0;
    while (*p) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate(p, -1, &cp);
        if (len <= 0) return 0;
        switch (utf8proc_category(cp)) {
        case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
        case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
        case UTF8PROC_CATEGORY_PO:
            break;
        default:
            return 0;
        }
        p += len, n++;
    }
    return n > 0;
}

void lens_attention_token_masks(const lens_model *m, const int *ids, int T, unsigned char *special,
                                unsigned char *punct)
{
    /* decoders add no markers: their first token plays the sink role */
    const int causal = lens_has_cap(&m->cfg, LENS_CAP_CAUSAL);
    const int bpe = m->tok && lens_tokenizer_kind(m->tok) == LENS_TOK_BPE;
    for (int t = 0; t < T; t++) {
        const char *piece = m->tok ? lens_tokenizer_piece(m->tok, ids[t]) : NULL;
        if (special) {
            if (causal) special[t] = t == 0;
            else special[t] = lens_tokenizer_is_special(m->tok, ids[t]);
        }
        if (punct) {
            const char *core = piece;
            if (core && bpe && !strncmp(core, "\xC4\xA0", 2)) core += 2; /* Ġ: a leading space */
            if (core && !bpe && !strncmp(core, "##", 2)) core += 2;
            punct[t] = is_punct_piece(core);
        }
    }
}

/* ------------------------------------------------------------ a whole model */

void lens_attention_result_free(lens_attention_result *res)
{
    if (!res) return;
    free(res->layers), free(res->heads), free(res->head), free(res->effective), free(res->null);
    memset(res, 0, sizeof *res);
}

static int select_indices(const int *want, int n_want, int lo, int hi, const char *what, int **out, int *n_out,
                          lens_err *err)
{
    const int n = want ? n_want : hi - lo + 1;
    if (want && n_want < 1) return lens_fail(err, LENS_EINVAL, "%s: empty selection", what);
    *out = malloc((size_t)n * sizeof **out);
    if (!*out) return lens_fail(err, LENS_ENOMEM, "out of memory");
    for (int k = 0; k < n; k++) {
        const int v = want ? want[k] : lo + k;
        if (v < lo || v > hi) return lens_fail(err, LENS_EINVAL, "%s %d is outside %d..%d", what, v, lo, hi);
        (*out)[k] = v;
    }
    *n_out = n;
    return 0;
}

/* max |P_h - A_h| over the selected heads of one layer, P_h the probabilities recomputed from Q_h, K_h by the
 * layer's score function f (scale, soft-cap, sliding window, attention sinks as the forward has them). */
static double score_diff(const float *Q, const float *K, int NH, int DK, int T, const lens_score_fn *f, int h,
                         const float *A, float *scores)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, DK, f->scale, Q, NH * DK, K, NH * DK,
                0.0f, scores, T);
    lens_scores_forward(scores, T, f, h);
    double worst = 0;
    for (size_t k = 0; k < (size_t)T * T; k++) {
        const double d = fabs((double)scores[k] - A[k]);
        if (d > worst) worst = d;
    }
    return worst;
}

/* One layer's heads as pool tasks: task hi is head res->heads[hi] of layer job->li. */
typedef struct {
    const lens_attention_request *req;
    lens_attention_result *res;
    const unsigned char *special, *punct;
    const float *Q, *K, *values;
    float *scores;        /* [threads][T][T] for verify_scores */
    const float **A;      /* [n_heads] this layer's attention of each selected head */
    double *diff;         /* [n_heads] score_diff */
    lens_err *err;        /* [n_heads] */
    int li, T, NH, DK, DV, causal;
    int window;           /* this layer's sliding window (0 = none) */
    lens_score_fn f;      /* this layer's scores (lens_model_scores) */
} head_job;

static void head_task(void *ctx, int hi)
{
    head_job *j = ctx;
    lens_attention_result *res = j->res;
    const int h = res->heads[hi], T = j->T;
    const size_t k = (size_t)j->li * res->n_heads + hi, TT = (size_t)T * T;
    if (j->K)
        j->diff[hi] = score_diff(j->Q + (size_t)h * j->DK, j->K + (size_t)h * j->DK, j->NH, j->DK, T, &j->f, h, j->A[hi],
                                 j->scores + (size_t)lens_pool_thread_index() * TT);
    lens_attention_head(j->A[hi], j->values + (size_t)h * j->DV, j->NH * j->DV,
                        j->Q ? j->Q + (size_t)h * j->DK : NULL, j->NH * j->DK, T, j->DV, j->DK, j->causal, j->window, j->special,
                        j->punct, &j->req->head, res->effective ? res->effective + k * TT : NULL,
                        res->null ? res->null + k * TT : NULL, &res->head[k], &j->err[hi]);
    if (j->req->heads_done && res->head[k].ok) atomic_fetch_add(j->req->heads_done, 1);
}

int lens_attention_analyze(const lens_model *m, const lens_activations *act, int seq,
                           const lens_attention_request *req, lens_attention_result *res, lens_err *err)
{
    memset(res, 0, sizeof *res);
    res->scores_max_diff = NAN;
    const lens_config *c = &m->cfg;
    if (seq < 0 || seq >= act->n_seqs) return lens_fail(err, LENS_EINVAL, "sequence %d is not in the batch", seq);
    if (!act->attn || !act->values)
        return lens_fail(err, LENS_EINVAL, "attention analysis needs kept attention probabilities and values");
    const int need_q = req->head.key_aware || req->verify_scores;
    if (need_q && !act->hidden)
        return lens_fail(err, LENS_EINVAL, "the key-aware dimension needs kept hidden states (LENS_KEEP_HIDDEN)");
    const int T = act->lengths[seq], NH = c->n_heads, DK = c->d_head_k, DV = c->d_head_v;
    const int causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    res->T = T;
    if (select_indices(req->layers, req->n_layers, 1, c->n_layers, "layer", &res->layers, &res->n_layers, err) ||
        select_indices(req->heads, req->n_heads, 0, NH - 1, "head", &res->heads, &res->n_heads, err)) {
        lens_attention_result_free(res);
        return -1;
    }
    const size_t n_heads_total = (size_t)res->n_layers * res->n_heads, TT = (size_t)T * T;
    res->head = calloc(n_heads_total, sizeof *res->head);
    if (req->want_effective) res->effective = malloc(n_heads_total * TT * sizeof *res->effective);
    if (req->head.null_component) res->null = malloc(n_heads_total * TT * sizeof *res->null);
    unsigned char *masks = malloc(2 * (size_t)T);
    float *Q = need_q ? malloc((size_t)T * NH * DK * sizeof *Q) : NULL;
    float *K = need_q ? malloc((size_t)T * NH * DK * sizeof *K) : NULL; /* computed with Q */
    const int n_threads = lens_pool_threads(req->pool);
    float *scores = req->verify_scores ? malloc((size_t)n_threads * TT * sizeof *scores) : NULL;
    head_job job = {0};
    job.A = malloc((size_t)res->n_heads * sizeof *job.A);
    job.diff = malloc((size_t)res->n_heads * sizeof *job.diff);
    job.err = malloc((size_t)res->n_heads * sizeof *job.err);
    int rc = 0;
    if (!res->head || (req->want_effective && !res->effective) || (req->head.null_component && !res->null) ||
        !masks || !job.A || !job.diff || !job.err || (need_q && (!Q || !K)) || (req->verify_scores && (!K || !scores))) {
        rc = lens_fail(err, LENS_ENOMEM, "out of memory for attention analysis of %zu heads at T = %d", n_heads_total,
                       T);
        goto done;
    }
    const unsigned char *special = req->special, *punct = req->punct;
    if (req->ids && (!special || !punct)) {
        lens_attention_token_masks(m, req->ids, T, masks, masks + T);
        if (!special) special = masks;
        if (!punct) punct = masks + T;
    }
    if (req->verify_scores) res->scores_max_diff = 0;
    job = (head_job){.req = req, .res = res, .special = special, .punct = punct, .Q = Q, .K = req->verify_scores ? K : NULL, .scores = scores,
                     .T = T, .NH = NH, .DK = DK, .DV = DV, .causal = causal, .A = job.A,
                     .diff = job.diff,
                     .err = job.err};
    for (int li = 0; li < res->n_layers; li++) {
        const int l = res->layers[li];
        if (lens_cancelled(req->head.cancel)) {
            rc = lens_fail(err, LENS_ECANCEL, "attention analysis cancelled before layer %d", l);
            goto done;
        }
        job.window = lens_layer_window(c, l - 1);
        job.f = lens_model_scores(m, l - 1, causal);
        /* q, k as the scores see them (norms, RoPE, QK-norm, GQA heads repeated) */
        if (need_q && lens_block_attn_qk(m, l - 1, lens_act_hidden(m, act, l - 1, seq), T, Q, K)) {
            rc = lens_fail(err, LENS_ENOMEM, "out of memory for the queries of layer %d", l);
            goto done;
        }
        job.li = li;
        job.values = lens_act_values(m, act, l, seq);
        for (int hi = 0; hi < res->n_heads; hi++) {
            job.A[hi] = lens_act_attn(m, act, l, res->heads[hi], seq);
            job.diff[hi] = 0;
            job.err[hi] = (lens_err){0};
        }
        lens_pool_run(req->pool, res->n_heads, head_task, &job);
        for (int hi = 0; hi < res->n_heads; hi++) {
            const size_t k = (size_t)li * res->n_heads + hi;
            if (job.K && job.diff[hi] > res->scores_max_diff) res->scores_max_diff = job.diff[hi];
            if (!res->head[k].ok) {
                if (job.err[hi].code == LENS_ECANCEL) {
                    rc = lens_fail(err, LENS_ECANCEL, "attention analysis cancelled at layer %d head %d", l,
                                   res->heads[hi]);
                    goto done;
                }
                if (job.err[hi].code == LENS_ENOMEM) {
                    rc = lens_fail(err, LENS_ENOMEM, "layer %d head %d: %s", l, res->heads[hi], job.err[hi].msg);
                    goto done;
                }
                res->n_failed++;
            }
        }
    }
done:
    free(masks), free(Q), free(K), free(scores), free(job.A), free(job.diff), free(job.err);
    if (rc) lens_attention_result_free(res);
    return rc;
}
