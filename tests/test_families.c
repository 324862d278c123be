/* test_families.c - every model family against an independent reference.
 *
 * A table of (family, task) cases (family_cases.h); each runs on a random "tiny" checkpoint
 * that lens_mkmodel writes (preset micro) with the family's exact HF tensor names (no
 * ../shared needed), and compares lensd with tests/reference/
 * families_reference.py (float64 PyTorch written from the HF modeling code):
 *   forward      hidden states [L+1][T][C]    |diff| <= 1e-4 + 1e-4 |ref|
 *                attentions [L][NH][T][T]     |diff| <= 1e-5
 *                effective attention          |diff| <= 1e-4 (T = 12 > DV = 8)
 *                logits                       |diff| <= 1e-4 + 1e-4 |ref|
 *                routes (mixture of experts)  the same experts, in order, on every MoE layer
 *                                             and none on a dense one; gate weights and router
 *                                             probabilities |diff| <= 1e-5
 *   attribution  [L][NH][T][T], 4 steps       |diff| <= 1e-3 max|ref| + 1e-8
 *                (classifiers and causal LMs; the others must get a reason)
 *   HTA exact    ||dh^l_j/dh^0_i||_F^2 [L][T][T]  |diff| <= 1e-3 |ref| + 1e-4 max|ref|
 *   token identity  cosine rank [L+1][T]        equal (unless the reference's margin < 1e-5)
 *   decomposition   15 metrics x [L+1] over 6 windows of 9 tokens   |diff| <= 1e-4 + 1e-3 |ref|
 * plus exact identities: every analysis is either supported or has a
 * sentence saying why, and every family in lens_families has a case (so a
 * new family inherits these checks or this test fails), and mkmodel's
 * RoBERTa vocabulary from GPT-2's (../shared). The reference
 * needs /usr/bin/python3 with torch and numpy; without them (or with
 * LENS_FAMILIES_NO_REFERENCE=1, for quick runs) the
 * comparisons are skipped (and counted as skipped). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "family_cases.h"
#include "core/analysis/attention.h"
#include "core/analysis/attribution.h"
#include "core/analysis/decomposition.h"
#include "core/analysis/hidden_attribution.h"
#include "core/analysis/token_identity.h"
#include "core/model/arch.h"
#include "core/model/mkmodel.h"

#define PYTHON "/usr/bin/python3"
#define REFERENCE "tests/reference/families_reference.py"

/* A token sequence valid for every family's generated vocabulary; id 1 is
 * RoBERTa's <pad>, so its position ids skip it. T = 12 > DV = 8 of the micro
 * preset, so V has a left null space and effective attention differs from A;
 * 12 is also above the decoders' micro head_dim (8, 16) and sliding window
 * (4). Decoders run a second time on the first T_SHORT ids (below head_dim). */
static const int IDS[] = {0, 300, 301, 1, 302, 303, 304, 500, 42, 999, 7, 2};
#define T_IDS ((int)(sizeof IDS / sizeof IDS[0]))
#define T_SHORT 5

/* Decomposition windows: W_DECOMP windows of T_DECOMP ids valid in every
 * family's vocabulary (>= 300: clear of specials and RoBERTa's <pad>),
 * labels w % 2. */
#define W_DECOMP 6
#define T_DECOMP 9
static int window_id(int w, int t) { return 300 + (w * 37 + t * 11 + (w % 2) * 101) % 400; }

static int have_reference(void)
{
    return system(PYTHON " -c 'import torch, numpy' >/dev/null 2>&1") == 0;
}

/* The reference's answer for model dir, or NULL. */
static json_t *reference(const char *dir, int T, int attribution, int hta)
{
    char req[600], cmd[1400];
    snprintf(req, sizeof req, "%s/request.json", dir);
    FILE *f = fopen(req, "w");
    if (!f) return NULL;
    fprintf(f, "{\"model\": \"%s\", \"ids\": [", dir);
    for (int t = 0; t < T; t++) fprintf(f, "%s%d", t ? ", " : "", IDS[t]);
    fprintf(f, "], \"steps\": 4, \"target\": -1, \"attribution\": %s, \"hta\": %s, \"windows\": [",
            attribution ? "true" : "false", hta ? "true" : "false");
    for (int w = 0; w < W_DECOMP; w++) {
        fprintf(f, "%s[", w ? ", " : "");
        for (int t = 0; t < T_DECOMP; t++) fprintf(f, "%s%d", t ? ", " : "", window_id(w, t));
        fprintf(f, "]");
    }
    fprintf(f, "], \"labels\": [");
    for (int w = 0; w < W_DECOMP; w++) fprintf(f, "%s%d", w ? ", " : "", w % 2);
    fprintf(f, "]}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, PYTHON " " REFERENCE " %s > %s/reference.json", req, dir);
    if (system(cmd) != 0) return NULL;
    snprintf(req, sizeof req, "%s/reference.json", dir);
    return json_load_file(req, 0, NULL);
}

/* Flattens a nested JSON array of numbers into out (n floats); returns count. */
static size_t flatten(json_t *v, float *out, size_t n)
{
    if (json_is_number(v)) {
        if (n) out[0] = (float)json_number_value(v);
        return 1;
    }
    size_t k = 0;
    for (size_t i = 0; i < json_array_size(v); i++) k += flatten(json_array_get(v, i), out + k, n > k ? n - k : 0);
    return k;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static void compare(const char *what, json_t *ref, const float *got, size_t n, double atol, double rtol)
{
    float *want = malloc(sizeof(float) * (n + 1));
    size_t k = want ? flatten(ref, want, n) : 0;
    CHECK(k == n, "%s: reference has %zu values, lensd %zu", what, k, n);
    if (k == n) {
        double d = check_close(what, got, want, n, atol, rtol);
        printf("  %-34s max |diff| %.2e (max |ref| %.2e)\n", what, d, max_abs(want, n));
    }
    free(want);
}

/* The routes of every layer against the reference's "router" (null: a dense layer). */
static void check_routes(const char *name, const lens_model *m, const lens_activations *act, json_t *ref, int T)
{
    const lens_config *c = &m->cfg;
    const int K = c->top_k, E = c->n_experts, RF = 2 * K + E;
    int moe_layers = 0, differ = 0;
    double worst = 0;
    for (int l = 1; l <= c->n_layers; l++) {
        json_t *want = json_array_get(ref, (size_t)l - 1);
        const float *got = lens_act_route(m, act, l, 0);
        CHECK(!got == json_is_null(want) && (got || want), "%s layer %d: routes %s, reference %s", name, l,
              got ? "kept" : "none", want ? (json_is_null(want) ? "null" : "kept") : "absent");
        if (!got || !json_is_object(want)) continue;
        moe_layers++;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++) {
                const json_t *ex = json_array_get(json_array_get(json_object_get(want, "experts"), t), j);
                const double w = json_number_value(json_array_get(json_array_get(json_object_get(want, "weights"), t), j));
                differ += !json_is_integer(ex) || (int)got[t * RF + j] != json_integer_value(ex);
                worst = fmax(worst, fabs(got[t * RF + K + j] - w));
            }
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++)
                worst = fmax(worst, fabs(got[t * RF + 2 * K + e] -
                                         json_number_value(json_array_get(
                                             json_array_get(json_object_get(want, "probs"), t), e))));
    }
    CHECK(moe_layers > 0 && differ == 0 && worst <= 1e-5,
          "%s: %d MoE layers, %d routed experts differ from the reference, gate weights / probabilities by %.2e",
          name, moe_layers, differ, worst);
    printf("  %-34s %d MoE layers, the same experts, weights max |diff| %.2e\n", name, moe_layers, worst);
}

static void check_forward(const char *name, const lens_model *m, json_t *ref, int T)
{
    const lens_config *c = &m->cfg;
    const int L = c->n_layers, C = c->d_model, NH = c->n_heads;
    const lens_batch b = {.n_seqs = 1, .lengths = (int[]){T}, .ids = IDS};
    const lens_forward_opts o = {.keep = LENS_KEEP_HIDDEN | LENS_KEEP_ATTN | LENS_KEEP_LOGITS | LENS_KEEP_VALUES |
                                         LENS_KEEP_ROUTER};
    lens_activations act;
    lens_err err = {0};
    CHECK(!lens_forward(m, &b, &o, &act, &err), "%s: forward: %s", name, err.msg);
    if (err.code) return;
    char what[160];
    snprintf(what, sizeof what, "%s hidden", name);
    compare(what, json_object_get(ref, "hidden"), act.hidden, (size_t)(L + 1) * T * C, 1e-4, 1e-4);
    snprintf(what, sizeof what, "%s attentions", name);
    compare(what, json_object_get(ref, "attentions"), act.attn, (size_t)L * NH * T * T, 1e-5, 0);
    /* effective attention of every head from lensd's own A and V */
    const int DV = c->d_head_v, causal = lens_has_cap(c, LENS_CAP_CAUSAL);
    float *eff = malloc(sizeof(float) * L * NH * T * T);
    /* some row attends more keys than DV (the projection is not the identity): the prefix of a full
     * causal layer at T > DV, a sliding window above DV (mistral's micro window 4 < DV 8 never is) */
    int nontrivial = 0, expect = 0;
    for (int l = 1; l <= L && eff; l++) {
        const int window = lens_layer_window(c, l - 1);
        expect |= (window && window < T ? window : T) > DV;
        for (int h = 0; h < NH; h++) {
            float *e = eff + ((size_t)(l - 1) * NH + h) * T * T;
            const float *A = lens_act_attn(m, &act, l, h, 0);
            CHECK(!lens_attention_effective(A, lens_act_values(m, &act, l, 0) + (size_t)h * DV, NH * DV, T, DV, causal,
                                            window, e, NULL, &err),
                  "%s: effective attention: %s", name, err.msg);
            for (int i = 0; i < T * T; i++) nontrivial |= fabsf(e[i] - A[i]) > 1e-3f;
        }
    }
    CHECK(nontrivial == expect, "%s: T %d, DV %d: effective attention %s A", name, T, DV,
          expect ? "equals" : "differs from");
    snprintf(what, sizeof what, "%s effective attention", name);
    if (eff) compare(what, json_object_get(ref, "effective"), eff, (size_t)L * NH * T * T, 1e-4, 0);
    free(eff);
    if (c->task != LENS_TASK_ENCODER) {
        const size_t n = c->task == LENS_TASK_CLASSIFICATION ? (size_t)c->n_labels : (size_t)T * c->vocab_size;
        snprintf(what, sizeof what, "%s logits", name);
        compare(what, json_object_get(ref, "logits"), act.logits, n, 1e-4, 1e-4);
    } else {
        CHECK(!act.logits && json_is_null(json_object_get(ref, "logits")), "%s: an encoder has no logits", name);
    }
    snprintf(what, sizeof what, "%s routes", name);
    if (c->n_experts) check_routes(what, m, &act, json_object_get(ref, "router"), T);
    else CHECK(!act.route && !json_object_get(ref, "router"), "%s: routes without experts", name);
    lens_activations_free(&act);
}

static void check_attribution(const char *name, const lens_model *m, json_t *ref)
{
    const lens_config *c = &m->cfg;
    const lens_attr_opts o = {.steps = 4, .target = -1};
    lens_attribution a;
    lens_err err = {0};
    CHECK(!lens_attribution_run(m, IDS, NULL, T_IDS, &o, &a, &err), "%s: attribution: %s", name, err.msg);
    if (err.code) return;
    CHECK(a.target == json_integer_value(json_object_get(ref, "target")), "%s: target %d, reference %lld", name,
          a.target, json_integer_value(json_object_get(ref, "target")));
    CHECK(fabs(a.f_full - json_number_value(json_object_get(ref, "f_full"))) < 1e-5, "%s: F %g, reference %g", name,
          a.f_full, json_number_value(json_object_get(ref, "f_full")));
    const size_t per = (size_t)c->n_heads * T_IDS * T_IDS;
    float *got = malloc(sizeof(float) * per * a.n_layers), *want = malloc(sizeof(float) * per * a.n_layers);
    for (int l = 0; l < a.n_layers; l++) memcpy(got + l * per, a.layers[l].attr, sizeof(float) * per);
    flatten(json_object_get(ref, "attribution"), want, per * a.n_layers);
    char what[160];
    snprintf(what, sizeof what, "%s attribution", name);
    compare(what, json_object_get(ref, "attribution"), got, per * a.n_layers, 1e-3 * max_abs(want, per * a.n_layers) + 1e-8,
            0);
    free(got), free(want);
    lens_attribution_free(&a);
}

static void check_hta(const char *name, const lens_model *m, json_t *ref)
{
    const int L = m->cfg.n_layers, T = T_IDS;
    const lens_hta_opts o = {.method = LENS_HTA_EXACT};
    lens_hta_result r;
    lens_err err = {0};
    CHECK(!lens_hidden_attribution(m, IDS, NULL, T, &o, &r, &err), "%s: HTA: %s", name, err.msg);
    if (err.code) return;
    const size_t TT = (size_t)T * T;
    float *got = malloc(sizeof(float) * TT * L), *want = malloc(sizeof(float) * TT * L);
    for (int l = 0; l < r.n_layers && l < L; l++) memcpy(got + l * TT, r.layers[l].norm2, sizeof(float) * TT);
    flatten(json_object_get(ref, "hta"), want, TT * L);
    char what[160];
    snprintf(what, sizeof what, "%s HTA norm2", name);
    compare(what, json_object_get(ref, "hta"), got, TT * L, 1e-4 * max_abs(want, TT * L), 1e-3);
    free(got), free(want);
    lens_hta_result_free(&r);
}

/* Token identity (cosine, identity mapping) per layer: lensd's rank of each
 * token == the reference's, except where the reference's margin between
 * the own and another candidate is below 1e-5 (float32 cannot order them). */
static void check_token_identity(const char *name, const lens_model *m, json_t *ref)
{
    const int L = m->cfg.n_layers, T = T_IDS;
    const lens_ti_opts o = {.metric = LENS_TI_COSINE};
    lens_ti_result r;
    lens_err err = {0};
    CHECK(!lens_token_identity(m, IDS, NULL, NULL, T, &o, &r, &err), "%s: token identity: %s", name, err.msg);
    if (err.code) return;
    json_t *ranks = json_object_get(ref, "ti_rank"), *margins = json_object_get(ref, "ti_margin");
    int same = 0, close = 0, n = 0, identified = 0;
    CHECK(r.n_layers == L + 1 && (int)json_array_size(ranks) == L + 1, "%s: %d layers ranked, reference %zu", name,
          r.n_layers, json_array_size(ranks));
    for (int l = 0; l < r.n_layers && l < (int)json_array_size(ranks); l++)
        for (int i = 0; i < T; i++, n++) {
            const int want = (int)json_integer_value(json_array_get(json_array_get(ranks, l), i));
            const double margin = json_number_value(json_array_get(json_array_get(margins, l), i));
            if (r.layers[l].rank[i] == want) same++;
            else if (margin < 1e-5) close++;
            identified += l == 0 && r.layers[l].rank[i] == 1;
        }
    CHECK(same + close == n && n == (L + 1) * T, "%s: token identity ranks: %d of %d equal, %d within 1e-5", name,
          same, n, close);
    CHECK(identified == T, "%s: layer 0 identifies all %d tokens (%d)", name, T, identified);
    printf("  %-34s %d of %d ranks equal (%d tie-close)\n", "token identity", same, n, close);
    lens_ti_result_free(&r);
}

/* Decomposition (position 0 dropped) over the request's windows: every
 * layer's shares, operator-norm ratios, position spectrum, smoothness,
 * cosines and topic means vs the reference's direct computation:
 * |diff| <= 1e-4 + 1e-3 |ref| (lensd streams float32 Gram blocks). */
static void check_decomposition(const char *name, const lens_model *m, json_t *ref)
{
    const int L = m->cfg.n_layers;
    int ids[W_DECOMP * T_DECOMP], labels[W_DECOMP];
    for (int w = 0; w < W_DECOMP; w++) {
        labels[w] = w % 2;
        for (int t = 0; t < T_DECOMP; t++) ids[w * T_DECOMP + t] = window_id(w, t);
    }
    lens_err err = {0};
    lens_decomp_result res = {0};
    lens_decomp *acc = lens_decomp_begin(m, T_DECOMP, NULL, 0, NULL, &err);
    CHECK(acc && !lens_decomp_add(acc, ids, labels, W_DECOMP, &err) && !lens_decomp_finish(acc, &res, &err),
          "%s: decomposition: %s", name, err.msg);
    lens_decomp_free(acc);
    json_t *want = json_object_get(ref, "decomposition");
    CHECK(res.n_layers == L + 1 && (int)json_array_size(want) == L + 1, "%s: decomposition of %d layers, reference %zu",
          name, res.n_layers, json_array_size(want));
    static const char *keys[] = {"share_mean", "share_pos", "share_ctx", "share_resid", "norm_pos", "norm_ctx",
                                 "norm_resid", "pos_stable_rank", "pos_explained_k2", "pos_explained_k2_sq",
                                 "pos_smoothness", "max_abs_cos", "mean_abs_cos", "topics_within", "topics_between"};
    const int K = (int)(sizeof keys / sizeof *keys);
    double worst = 0;
    int n = 0;
    for (int l = 0; l < res.n_layers && l < (int)json_array_size(want); l++) {
        const lens_decomp_layer *y = &res.layers[l];
        const double got[] = {y->share_mean, y->share_pos, y->share_ctx, y->share_resid, y->norm_pos, y->norm_ctx,
                              y->norm_resid, y->pos_stable_rank, y->pos_explained_k2, y->pos_explained_k2_sq,
                              y->pos_smoothness, y->max_abs_cos, y->mean_abs_cos, y->topics_within,
                              y->topics_between};
        for (int k = 0; k < K; k++, n++) {
            const double r = json_number_value(json_object_get(json_array_get(want, l), keys[k]));
            const double d = fabs(got[k] - r);
            CHECK(d <= 1e-4 + 1e-3 * fabs(r), "%s: decomposition layer %d %s: %.8g, reference %.8g", name, l, keys[k],
                  got[k], r);
            worst = d > worst ? d : worst;
        }
    }
    CHECK(n == (L + 1) * K, "%s: %d decomposition values compared", name, n);
    printf("  %-34s %d values, max |diff| %.2e\n", "decomposition", n, worst);
    lens_decomp_result_free(&res);
}

/* Every analysis is either supported or says why (a typed 422 in the API). */
static void check_supports(const char *name, const lens_model *m)
{
    for (int a = 0; a < LENS_ANALYSIS_COUNT; a++) {
        const char *why = NULL;
        const int ok = lens_model_supports(m, (lens_analysis)a, &why);
        CHECK(ok ? why == NULL : why && strlen(why) > 10, "%s: %s: supported %d, why %s", name,
              lens_analysis_name((lens_analysis)a), ok, why ? why : "(none)");
    }
    const int lm_or_classifier = m->cfg.task == LENS_TASK_CLASSIFICATION || m->cfg.task == LENS_TASK_CAUSAL_LM;
    /* every family has a block backward, so the gradient analyses run too */
    CHECK(lens_model_supports(m, LENS_ANALYSIS_FORWARD, NULL) && lens_model_supports(m, LENS_ANALYSIS_ATTENTION, NULL) &&
              lens_model_supports(m, LENS_ANALYSIS_TOKEN_IDENTITY, NULL) &&
              lens_model_supports(m, LENS_ANALYSIS_DECOMPOSITION, NULL) &&
              lens_model_supports(m, LENS_ANALYSIS_HIDDEN_ATTRIBUTION, NULL) &&
              lens_model_supports(m, LENS_ANALYSIS_ATTRIBUTION, NULL) == lm_or_classifier,
          "%s: the per-sequence analyses run on every family", name);
}

static void run_case(const family_case *fc, int with_reference)
{
    char dir[] = "/tmp/lensd-family-XXXXXX", name[96];
    snprintf(name, sizeof name, "%s %s", fc->arch, fc->task);
    printf("%s (random micro checkpoint)\n", name);
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    lens_err err = {0};
    lens_model *m = NULL;
    if (lens_mkmodel(fc->arch, "micro", fc->task, 11, dir, &err) == 0) m = lens_model_load(dir, &err);
    CHECK(m != NULL, "%s: %s", name, err.msg);
    if (m) {
        CHECK(!strcmp(m->cfg.family->model_type, fc->arch), "%s: loaded as %s", name, m->cfg.family->model_type);
        check_supports(name, m);
        const int attr = lens_model_supports(m, LENS_ANALYSIS_ATTRIBUTION, NULL);
        const int hta = lens_model_supports(m, LENS_ANALYSIS_HIDDEN_ATTRIBUTION, NULL);
        json_t *ref = with_reference ? reference(dir, T_IDS, attr, hta) : NULL;
        if (!with_reference) SKIP("%s: no " PYTHON " with torch for the reference", name);
        else CHECK(ref != NULL, "%s: the reference script failed", name);
        if (ref) {
            check_forward(name, m, ref, T_IDS);
            if (attr) check_attribution(name, m, ref);
            if (hta) check_hta(name, m, ref);
            check_token_identity(name, m, ref);
            check_decomposition(name, m, ref);
            json_decref(ref);
        }
        if (with_reference && m->cfg.rope.dim) { /* RoPE families: T below head_dim too */
            json_t *short_ref = reference(dir, T_SHORT, 0, 0);
            CHECK(short_ref != NULL, "%s: the reference script failed at T = %d", name, T_SHORT);
            snprintf(name + strlen(name), sizeof name - strlen(name), " T=%d", T_SHORT);
            if (short_ref) check_forward(name, m, short_ref, T_SHORT);
            json_decref(short_ref);
        }
        lens_model_free(m);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* mkmodel --vocab: GPT-2's released vocabulary with RoBERTa's specials at
 * 0..3 and <mask> last, every GPT-2 token 4 ids later (needs ../shared). */
static void check_roberta_vocab(void)
{
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("roberta --vocab: no ../shared (GPT-2 vocabulary)");
        return;
    }
    char dir[] = "/tmp/lensd-family-vocab-XXXXXX", gpt2[512], path[600];
    snprintf(gpt2, sizeof gpt2, "%s/vocab/gpt2", shared);
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    lens_err err = {0};
    lens_model *m = NULL;
    if (!lens_mkmodel_vocab("roberta", "tiny", "masked-lm", 1, gpt2, dir, &err)) m = lens_model_load(dir, &err);
    CHECK(m != NULL, "roberta --vocab: %s", err.msg);
    snprintf(path, sizeof path, "%s/encoder.json", gpt2);
    json_t *enc = json_load_file(path, 0, NULL);
    CHECK(enc != NULL, "%s", path);
    if (m && enc) {
        const lens_tokenizer *tok = m->tok;
        const int V = m->cfg.vocab_size;
        CHECK(V == (int)json_object_size(enc) + 5 && lens_tokenizer_vocab_size(tok) == V, "vocab_size %d, GPT-2 %zu",
              V, json_object_size(enc));
        CHECK(lens_tokenizer_id(tok, "<s>") == 0 && lens_tokenizer_id(tok, "<pad>") == 1 &&
                  lens_tokenizer_id(tok, "</s>") == 2 && lens_tokenizer_id(tok, "<unk>") == 3 &&
                  lens_tokenizer_id(tok, "<mask>") == V - 1,
              "roberta specials at 0..3 and last");
        int shifted = 0;
        const char *key;
        json_t *val;
        json_object_foreach(enc, key, val) shifted += lens_tokenizer_id(tok, key) == json_integer_value(val) + 4;
        CHECK(shifted == (int)json_object_size(enc), "%d of %zu GPT-2 tokens at id + 4", shifted, json_object_size(enc));
        printf("roberta --vocab %s: %d tokens, specials 0..3 and %d\n", gpt2, V, V - 1);
    }
    json_decref(enc);
    lens_model_free(m);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* A ModernBERT classifier with classifier_pooling "mean": the head reads
 * the mean of the final rows (logits and HTA against the reference), and
 * attribution, which follows the first row, answers why not. */
static void check_mean_pooling(int with_reference)
{
    char dir[] = "/tmp/lensd-family-mean-XXXXXX", path[600];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    lens_err err = {0};
    lens_model *m = family_variant_load("modernbert", "classification", 11, dir, "classifier_pooling", "mean", &err);
    CHECK(m != NULL && m->cfg.pool_mean, "modernbert mean pooling: %s", err.msg);
    if (m) {
        const char *why = NULL;
        CHECK(!lens_model_supports(m, LENS_ANALYSIS_ATTRIBUTION, &why) && why && strstr(why, "mean") &&
                  lens_model_supports(m, LENS_ANALYSIS_HIDDEN_ATTRIBUTION, NULL),
              "mean pooling: attribution refused with its reason (%s), HTA runs", why ? why : "none");
        json_t *ref = with_reference ? reference(dir, T_IDS, 0, 1) : NULL;
        if (!with_reference) SKIP("modernbert mean pooling: no " PYTHON " with torch for the reference");
        else CHECK(ref != NULL, "modernbert mean pooling: the reference script failed");
        if (ref) {
            check_forward("modernbert classification (mean pooling)", m, ref, T_IDS);
            check_hta("modernbert classification (mean pooling)", m, ref);
        }
        json_decref(ref);
        lens_model_free(m);
    }
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void)
{
    family_cases_check(); /* the table covers every family lensd knows */
    const int with_reference = getenv("LENS_FAMILIES_NO_REFERENCE") ? 0 : have_reference();
    for (int k = 0; k < N_FAMILY_CASES; k++) run_case(&family_cases[k], with_reference);
    check_roberta_vocab();
    check_mean_pooling(with_reference);
    return check_done("test_families");
}
