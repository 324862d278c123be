/* test_http_analyses.c - the analysis endpoints and async jobs over HTTP.
 *
 * Starts the real build/lensd on tiny random BERT (classifier) and GPT-2
 * checkpoints from `lensd mkmodel` and checks /v1/attention,
 * /v1/decomposition, /v1/attribution and /v1/jobs: response shapes, the
 * identities each analysis must satisfy as seen through the JSON, that the
 * CLI prints what the API returns, a bad-input matrix (typed 4xx naming the
 * field, /healthz still 200 after each), and every JSON response against
 * openapi.yaml. Numbers go through JSON at 6 decimals unless a test uses
 * base64 (bit-exact float32); tolerances say which. */
#include <math.h>

#include "api/api.h"
#include "core/analysis/attribution.h"
#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[256];

static double num(const json_t *v) { return json_number_value(v); }
static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }
static long long ival(const json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

/* Bytes of a base64 string (standard alphabet, padded); caller frees. */
static unsigned char *b64_decode(const char *s, size_t *n_out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(s), k = 0;
    unsigned char *out = malloc(n + 1);
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n && s[i] != '='; i++) {
        const char *p = strchr(abc, s[i]);
        if (!p) break;
        acc = acc << 6 | (unsigned)(p - abc);
        bits += 6;
        if (bits >= 8) bits -= 8, out[k++] = (unsigned char)(acc >> bits);
    }
    *n_out = k;
    return out;
}

/* A base64 tensor of n floats; NULL when the shape differs. Caller frees. */
static float *b64_floats(const json_t *t, size_t n)
{
    const char *data = json_string_value(get(t, "data"));
    if (!data) return NULL;
    size_t k;
    unsigned char *bytes = b64_decode(data, &k);
    if (k != n * 4) {
        free(bytes);
        return NULL;
    }
    float *x = malloc(n * sizeof *x);
    memcpy(x, bytes, n * 4);
    free(bytes);
    return x;
}

/* ------------------------------------------------------------- attention */

/* max |a - b| over two [T][T] JSON matrices; INFINITY when shapes differ */
static double max_diff_2d(const json_t *a, const json_t *b, size_t T)
{
    if (json_array_size(a) != T || json_array_size(b) != T) return INFINITY;
    double worst = 0;
    for (size_t i = 0; i < T; i++) {
        const json_t *ra = json_array_get(a, i), *rb = json_array_get(b, i);
        if (json_array_size(ra) != T || json_array_size(rb) != T) return INFINITY;
        for (size_t j = 0; j < T; j++) worst = fmax(worst, fabs(num(json_array_get(ra, j)) - num(json_array_get(rb, j))));
    }
    return worst;
}

static void test_attention(test_server *s)
{
    const char *A = "/v1/attention";
    http_resp r;
    /* short BERT input: T = 8 <= DV = 64, so rank(V) = T and effective == raw exactly */
    http_post_json(s, &r, A, "{\"model\": \"bert\", \"text\": \"the movie was great, really\"}");
    CHECK(r.status == 200, "attention bert: %ld %.300s", r.status, r.body);
    check_schema(&r, A, "POST");
    size_t T = json_array_size(get(r.json, "tokens"));
    json_t *layers = get(r.json, "layers");
    CHECK(json_array_size(layers) == 2 && ival(json_array_get(layers, 0), "layer") == 1 &&
              ival(json_array_get(layers, 1), "layer") == 2,
          "default layers are 1..L");
    int heads_ok = 1, ident_ok = 1;
    double eff_vs_raw = 0;
    for (size_t l = 0; l < json_array_size(layers); l++) {
        json_t *heads = get(json_array_get(layers, l), "heads");
        heads_ok &= json_array_size(heads) == 2;
        for (size_t h = 0; h < json_array_size(heads); h++) {
            json_t *hd = json_array_get(heads, h);
            ident_ok &= ival(hd, "rank") == (long long)T && ival(hd, "null_dim") == 0 &&
                        json_is_true(get(hd, "identifiable")) && !get(hd, "error") && !get(hd, "null");
            eff_vs_raw = fmax(eff_vs_raw, max_diff_2d(get(hd, "raw"), get(hd, "effective"), T));
            ident_ok &= fabs(num(get(get(hd, "stats"), "pearson")) - 1) <= 1e-6;
        }
    }
    CHECK(heads_ok, "default heads are all (2) per layer");
    CHECK(ident_ok, "T = %zu <= DV: rank T, null_dim 0, identifiable, pearson 1", T);
    CHECK(eff_vs_raw == 0, "effective == raw when rank == T (max diff %g; copied, so exact)", eff_vs_raw);
    json_t *id = get(r.json, "identifiability");
    CHECK(ival(id, "seq_len") == (long long)T && ival(id, "head_dim_value") == 64 && ival(id, "head_dim_key") == 64 &&
              ival(id, "brunner_bound") == 64 && json_is_true(get(id, "length_identifiable")),
          "identifiability summary: seq_len T, head dims 64, brunner_bound 64");
    json_t *ih = json_array_get(get(json_array_get(get(id, "layers"), 0), "heads"), 0);
    CHECK(ival(ih, "rank_v1") >= 1 && ival(ih, "stochastic_null_dim") == (long long)T - ival(ih, "rank_v1") &&
              json_is_string(get(get(ih, "key_aware"), "method")),
          "row-stochastic dimension = T - rank([V,1])");
    http_resp_free(&r);

    /* one token: Pearson over a single (constant) entry is NaN, written null */
    http_post_json(s, &r, A, "{\"model\": \"gpt\", \"text\": \"a\", \"layers\": [1], \"heads\": [0]}");
    check_schema(&r, A, "POST");
    json_t *st1 = get(json_array_get(get(json_array_get(get(r.json, "layers"), 0), "heads"), 0), "stats");
    CHECK(r.status == 200 && json_array_size(get(r.json, "tokens")) == 1 && st1 && json_is_null(get(st1, "pearson")),
          "T = 1: pearson null (%ld %.300s)", r.status, r.body);
    http_resp_free(&r);

    /* selection and matrix switches */
    http_post_json(s, &r, A,
                   "{\"model\": \"bert\", \"text\": \"a b c\", \"layers\": [2], \"heads\": [1], \"include_raw\": false, "
                   "\"null\": true, \"identifiability\": false, \"format\": {\"precision\": 3}}");
    CHECK(r.status == 200, "attention selection: %ld %.300s", r.status, r.body);
    check_schema(&r, A, "POST");
    layers = get(r.json, "layers");
    json_t *hd = json_array_get(get(json_array_get(layers, 0), "heads"), 0);
    CHECK(json_array_size(layers) == 1 && ival(json_array_get(layers, 0), "layer") == 2 &&
              json_array_size(get(json_array_get(layers, 0), "heads")) == 1 && ival(hd, "head") == 1,
          "layers [2] heads [1] return exactly that head");
    CHECK(!get(hd, "raw") && get(hd, "effective") && get(hd, "null") && !get(r.json, "identifiability"),
          "include_raw false, null true, identifiability false");
    T = json_array_size(get(r.json, "tokens"));
    double null_max = 0;
    for (size_t i = 0; i < json_array_size(get(hd, "null")); i++)
        for (size_t j = 0; j < T; j++) null_max = fmax(null_max, fabs(num(json_array_get(json_array_get(get(hd, "null"), i), j))));
    CHECK(json_array_size(get(hd, "null")) == T && null_max == 0, "null component is 0 at full rank (max %g)", null_max);
    http_resp_free(&r);

    /* T = 90 > DV = 64 (input_ids, base64): rank <= min(T, DV), null = raw - effective, effective V-equivalent */
    char body[2048];
    int k = snprintf(body, sizeof body, "{\"model\": \"bert\", \"input_ids\": [101");
    for (int t = 1; t < 89; t++) k += snprintf(body + k, sizeof body - k, ", %d", 1000 + (t * 7919) % 5000);
    snprintf(body + k, sizeof body - k,
             ", 102], \"layers\": [1], \"null\": true, \"identifiability\": false, \"format\": {\"encoding\": \"base64\"}}");
    http_post_json(s, &r, A, body);
    CHECK(r.status == 200, "attention T=90: %ld %.300s", r.status, r.body);
    check_schema(&r, A, "POST");
    T = json_array_size(get(r.json, "tokens"));
    json_t *heads = get(json_array_get(get(r.json, "layers"), 0), "heads");
    for (size_t h = 0; h < json_array_size(heads); h++) {
        hd = json_array_get(heads, h);
        long long rank = ival(hd, "rank");
        CHECK(T == 90 && rank >= 1 && rank <= 64 && ival(hd, "null_dim") == (long long)T - rank &&
                  json_is_false(get(hd, "identifiable")),
              "T=90 head %zu: rank %lld <= min(T, DV) = 64, null_dim = T - rank, not identifiable", h, rank);
        float *raw = b64_floats(get(hd, "raw"), T * T), *eff = b64_floats(get(hd, "effective"), T * T),
              *nul = b64_floats(get(hd, "null"), T * T);
        CHECK(raw && eff && nul, "base64 matrices of [%zu][%zu]", T, T);
        if (raw && eff && nul) {
            double worst = 0, moved = 0;
            for (size_t i = 0; i < T * T; i++) {
                worst = fmax(worst, fabs((double)raw[i] - eff[i] - nul[i]));
                moved = fmax(moved, fabs((double)raw[i] - eff[i]));
            }
            /* float32 subtraction: one rounding of values <= 1 */
            CHECK(worst <= 1e-6, "null == raw - effective within float32 rounding (max %g)", worst);
            CHECK(moved > 1e-6, "effective differs from raw when the null space is not trivial (max %g)", moved);
        }
        free(raw), free(eff), free(nul);
    }
    http_resp_free(&r);

    /* GPT-2 (causal): effective stays zero above the diagonal */
    http_post_json(s, &r, A, "{\"model\": \"gpt\", \"text\": \"hello there, world\", \"heads\": [0]}");
    CHECK(r.status == 200, "attention gpt: %ld %.300s", r.status, r.body);
    check_schema(&r, A, "POST");
    T = json_array_size(get(r.json, "tokens"));
    hd = json_array_get(get(json_array_get(get(r.json, "layers"), 1), "heads"), 0);
    json_t *eff = get(hd, "effective");
    int upper_zero = json_array_size(eff) == T;
    for (size_t i = 0; i < T && upper_zero; i++)
        for (size_t j = i + 1; j < T; j++) upper_zero &= num(json_array_get(json_array_get(eff, i), j)) == 0;
    CHECK(upper_zero, "causal effective attention is 0 above the diagonal");
    http_resp_free(&r);

    /* the CLI prints the same JSON */
    http_post_json(s, &r, A, "{\"model\": \"bert\", \"text\": \"a b c\", \"layers\": [1], \"heads\": [0], \"format\": {\"precision\": 4}}");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s attention --model %s/bert 'a b c' --layers 1 --heads 0 --identifiability --precision 4",
             lensd_path(), tmpdir);
    json_t *cli = run_json(cmd);
    CHECK(cli && r.json, "CLI attention output parses");
    if (cli && r.json) {
        json_object_del(cli, "timing_ms");
        json_object_del(r.json, "timing_ms");
        CHECK(json_equal(cli, r.json), "lensd attention differs from POST /v1/attention");
    }
    json_decref(cli);
    http_resp_free(&r);

    static const bad_case cases[] = {
        {"/v1/attention", "{\"model\": \"bert\"}", 422, "invalid_request", "text"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": 5}", 422, "invalid_request", "text"},
        {"/v1/attention", "{\"model\": \"nope\", \"text\": \"a\"}", 404, "model_not_found", "model"},
        {"/v1/attention", "{\"text\": \"a\"}", 422, "invalid_request", "model"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"layers\": [0]}", 422, "invalid_request", "layers"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"layers\": [3]}", 422, "invalid_request", "layers"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"layers\": \"1\"}", 422, "invalid_request", "layers"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"layers\": []}", 422, "invalid_request", "layers"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"heads\": [2]}", 422, "invalid_request", "heads"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"heads\": [-1]}", 422, "invalid_request", "heads"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"heads\": [0.5]}", 422, "invalid_request", "heads"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"effective\": \"yes\"}", 422, "invalid_request", "effective"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"include_raw\": 1}", 422, "invalid_request", "include_raw"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"null\": []}", 422, "invalid_request", "null"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"identifiability\": 0}", 422, "invalid_request", "identifiability"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"format\": {\"encoding\": \"hex\"}}", 422, "invalid_request", "format.encoding"},
        {"/v1/attention", "{\"model\": \"gpt\", \"text\": \"a\", \"text_pair\": \"b\"}", 422, "invalid_request", "text_pair"},
        {"/v1/attention", "{\"model\": \"bert\", \"input_ids\": [999999]}", 422, "invalid_request", "input_ids"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": ", 400, "invalid_json", NULL},
    };
    run_bad_cases(s, cases, (int)(sizeof cases / sizeof *cases));
}

/* --------------------------------------------------------- decomposition */

static const char *decomp_texts =
    "\"texts\": [\"the cat sat on the mat and looked at the dog across the room\", "
    "\"a quick brown fox jumps over the lazy dog near the river bank\", "
    "\"stocks fell sharply on monday as investors worried about rates\", "
    "\"the central bank raised interest rates by a quarter point today\"]";

/* format: precision p is p significant digits of every share, base64 sends
 * pos_pca and ctx_pca.coords as tensors of the same values (docs/api-notes.md) */
static void test_decomposition_format(test_server *s, const char *win)
{
    const char *D = "/v1/decomposition";
    char body[1024];
    http_resp r9, r1, rb;
    const char *fmt[] = {"{\"precision\": 9}", "{\"precision\": 1}", "{\"encoding\": \"base64\", \"precision\": 9}"};
    http_resp *out[] = {&r9, &r1, &rb};
    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof body, "{\"model\": \"gpt\", \"windows\": %s, \"labels\": [0, 0, 1, 1], \"format\": %s}", win,
                 fmt[i]);
        http_post_json(s, out[i], D, body);
        CHECK(out[i]->status == 200, "decomposition format %s: %ld %.200s", fmt[i], out[i]->status, out[i]->body);
        if (out[i]->status == 200) check_schema(out[i], D, "POST");
    }
    if (r9.status == 200 && r1.status == 200 && rb.status == 200) {
        int digits_ok = 1, b64_ok = 1;
        for (size_t l = 0; l < json_array_size(get(r9.json, "layers")); l++) {
            const json_t *a = json_array_get(get(r9.json, "layers"), l), *b = json_array_get(get(r1.json, "layers"), l),
                         *c = json_array_get(get(rb.json, "layers"), l);
            const char *k[] = {"mean", "pos", "ctx", "resid"};
            for (int j = 0; j < 4; j++) {
                double v9 = num(get(get(a, "variance_share"), k[j])), v1 = num(get(get(b, "variance_share"), k[j]));
                char one[32];
                snprintf(one, sizeof one, "%.1g", v9);
                if (v1 != strtod(one, NULL)) digits_ok = 0;
            }
            /* base64 pos_pca [P][2] = the JSON pairs at 9 digits */
            const json_t *t = get(c, "pos_pca"), *pairs = get(a, "pos_pca");
            size_t P = json_array_size(pairs);
            const int shape_ok = json_integer_value(json_array_get(get(t, "shape"), 0)) == (long long)P;
            float *v = t && P && shape_ok ? b64_floats(t, P * 2) : NULL;
            for (size_t i = 0; v && i < P; i++)
                for (int j = 0; j < 2; j++)
                    if (fabs(v[i * 2 + j] - num(json_array_get(json_array_get(pairs, i), (size_t)j))) >
                        1e-7 * fabs(v[i * 2 + j]) + 1e-30)
                        b64_ok = 0;
            if (!v || !json_is_object(get(get(c, "ctx_pca"), "coords"))) b64_ok = 0;
            free(v);
        }
        CHECK(digits_ok, "format.precision 1: every variance share is the 9-digit share rounded to 1 significant digit");
        CHECK(b64_ok, "format base64: pos_pca a [P, 2] tensor of the 9-digit pairs, ctx_pca.coords a tensor");
    }
    http_resp_free(&r9), http_resp_free(&r1), http_resp_free(&rb);
}

/* causal: true runs BERT with a causal mask (docs/api-notes.md): the shares move */
static void test_decomposition_causal(test_server *s, const char *win)
{
    const char *D = "/v1/decomposition";
    char body[1024];
    http_resp bi, ca;
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"windows\": %s, \"layers\": [2]}", win);
    http_post_json(s, &bi, D, body);
    snprintf(body, sizeof body, "{\"model\": \"bert\", \"windows\": %s, \"layers\": [2], \"causal\": true}", win);
    http_post_json(s, &ca, D, body);
    CHECK(bi.status == 200 && ca.status == 200, "BERT decomposition, causal false / true: %ld %ld %.200s", bi.status,
          ca.status, ca.body);
    if (bi.status == 200 && ca.status == 200)
        CHECK(!json_equal(get(json_array_get(get(bi.json, "layers"), 0), "variance_share"),
                          get(json_array_get(get(ca.json, "layers"), 0), "variance_share")),
              "causal: true changes BERT's layer-2 variance shares");
    http_resp_free(&bi), http_resp_free(&ca);
}

/* definition / topics_self_pairs / reference_*: docs/reproducing.md */
static void test_decomposition_definitions(test_server *s)
{
    const char *D = "/v1/decomposition";
    const char *win = "[[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35], "
                      "[40, 41, 42, 43, 44, 45]]";
    char body[1024];
    http_resp pc, ld, ref;
    snprintf(body, sizeof body, "{\"model\": \"gpt\", \"windows\": %s, \"labels\": [0, 0, 1, 1], \"layers\": [1]}",
             win);
    http_post_json(s, &pc, D, body);
    snprintf(body, sizeof body,
             "{\"model\": \"gpt\", \"windows\": %s, \"labels\": [0, 0, 1, 1], \"layers\": [1], "
             "\"definition\": \"lensd\"}", win);
    http_post_json(s, &ld, D, body);
    /* the reference set = the windows themselves: pos and mean are the windows' own, every number the same */
    snprintf(body, sizeof body,
             "{\"model\": \"gpt\", \"windows\": %s, \"labels\": [0, 0, 1, 1], \"layers\": [1], "
             "\"reference_windows\": %s}", win, win);
    http_post_json(s, &ref, D, body);
    CHECK(pc.status == 200 && ld.status == 200 && ref.status == 200, "definitions: %ld %ld %ld %.200s", pc.status,
          ld.status, ref.status, ref.body);
    if (pc.status == 200 && ld.status == 200 && ref.status == 200) {
        check_schema(&pc, D, "POST"), check_schema(&ref, D, "POST");
        const json_t *a = json_array_get(get(pc.json, "layers"), 0), *b = json_array_get(get(ld.json, "layers"), 0),
                     *c = json_array_get(get(ref.json, "layers"), 0);
        CHECK(!strcmp(json_string_value(get(pc.json, "definition")), "paper-code") &&
                  json_is_true(get(pc.json, "topics_self_pairs")) && json_is_false(get(ld.json, "topics_self_pairs")) &&
                  json_is_null(get(pc.json, "reference_windows")) && ival(ref.json, "reference_windows") == 4,
              "definition echoes");
        /* 2 labels x 2 windows: lensd 2 pairs a < b; paper-code 2 x 2 ordered + 4 self = 8 */
        CHECK(ival(get(b, "topics"), "within_pairs") == 2 && ival(get(a, "topics"), "within_pairs") == 8,
              "within pairs %lld (lensd), %lld (paper-code)", ival(get(b, "topics"), "within_pairs"),
              ival(get(a, "topics"), "within_pairs"));
        const double wl = num(get(get(b, "topics"), "within")), wp = num(get(get(a, "topics"), "within"));
        CHECK(fabs(wp - (2 * 2 * wl + 4) / 8) < 2e-6, "paper-code within %.6f = (2 S + W) / (2 p + W) from lensd's %.6f",
              wp, wl);
        CHECK(num(get(get(a, "topics"), "between")) == num(get(get(b, "topics"), "between")), "between is the same");
        CHECK(get(a, "pos_screenot") && json_is_null(get(get(a, "pos_screenot"), "rank")),
              "P = 5: ScreeNOT with k = 20 is null");
        CHECK(json_equal(get(c, "relative_norm"), get(a, "relative_norm")) &&
                  json_equal(get(c, "topics"), get(a, "topics")) &&
                  num(get(c, "pos_stable_rank")) == num(get(a, "pos_stable_rank")),
              "a reference equal to the windows changes nothing");
    }
    http_resp_free(&pc), http_resp_free(&ld), http_resp_free(&ref);
    test_decomposition_format(s, win);
    test_decomposition_causal(s, win);
    const bad_case cases[] = {
#define W2 "{\"model\": \"gpt\", \"windows\": [[1, 2, 3], [4, 5, 6]], "
        {D, W2 "\"definition\": \"paper\"}", 422, "invalid_request", "definition"},
        {D, W2 "\"reference_windows\": [[1, 2], [3, 4]]}", 422, "invalid_request", "reference_windows"},
        {D, W2 "\"reference_windows\": [[1, 2, 3]]}", 422, "invalid_request", "reference_windows"},
        {D, W2 "\"topics_pca\": -1}", 422, "invalid_request", "topics_pca"},
        {D, W2 "\"screenot_k\": 0}", 422, "invalid_request", "screenot_k"},
        {D, W2 "\"reference_texts\": [\"a b\"], \"reference_windows\": [[1, 2, 3], [4, 5, 6]]}", 422, "invalid_request",
         "reference_windows"},
#undef W2
    };
    run_bad_cases(s, cases, (int)(sizeof cases / sizeof *cases));
}

static void test_decomposition(test_server *s)
{
    const char *D = "/v1/decomposition";
    char body[2048];
    http_resp r;
    snprintf(body, sizeof body,
             "{\"model\": \"bert\", %s, \"length\": 8, \"layers\": [2, 0], \"labels\": [\"a\", \"a\", \"b\", \"b\"]}",
             decomp_texts);
    http_post_json(s, &r, D, body);
    CHECK(r.status == 200, "decomposition: %ld %.300s", r.status, r.body);
    check_schema(&r, D, "POST");
    json_t *layers = get(r.json, "layers");
    CHECK(ival(r.json, "length") == 8 && ival(r.json, "positions") == 7 && ival(r.json, "first_position") == 1 &&
              ival(r.json, "windows") >= 2 && json_array_size(get(r.json, "labels")) == 2,
          "length 8 -> 7 positions from 1, labels [a, b]");
    /* labels are kept whole: two long names that differ only at the end stay two topics (they were cut to 127
     * bytes, which merged them and, cut inside a UTF-8 sequence, made the answer invalid JSON) */
    char la[2 * 100 + 2] = "", lb[sizeof la], body2[2048];
    for (int i = 0; i < 100; i++) strcat(la, "\xc3\xa9");
    strcpy(lb, la), strcat(la, "a"), strcat(lb, "b");
    snprintf(body2, sizeof body2,
             "{\"model\": \"bert\", %s, \"length\": 8, \"layers\": [2, 0], \"labels\": [\"%s\", \"%s\", \"%s\", \"%s\"]}",
             decomp_texts, la, la, lb, lb);
    http_resp r2;
    http_post_json(s, &r2, D, body2);
    const json_t *names = get(r2.json, "labels");
    json_t *topics = get(json_array_get(get(r.json, "layers"), 1), "topics"),
           *topics2 = get(json_array_get(get(r2.json, "layers"), 1), "topics");
    CHECK(r2.status == 200 && json_array_size(names) == 2 &&
              !strcmp(json_string_value(json_array_get(names, 0)) ?: "", la) &&
              !strcmp(json_string_value(json_array_get(names, 1)) ?: "", lb) && topics && json_equal(topics, topics2),
          "201-byte labels: two topics, named in full, the same topic figures as [a, b]: %ld", r2.status);
    http_resp_free(&r2);
    CHECK(json_array_size(layers) == 2 && ival(json_array_get(layers, 0), "layer") == 0 &&
              ival(json_array_get(layers, 1), "layer") == 2,
          "layers sorted [0, 2]");
    for (size_t i = 0; i < json_array_size(layers); i++) {
        json_t *L = json_array_get(layers, i), *vs = get(L, "variance_share");
        double sum = num(get(vs, "mean")) + num(get(vs, "pos")) + num(get(vs, "ctx")) + num(get(vs, "resid"));
        /* 4 shares each rounded to 6 decimals */
        CHECK(fabs(sum - 1) <= 2.5e-6, "layer %zu: variance shares sum to 1 (%.8f)", i, sum);
        CHECK(json_array_size(get(L, "pos_pca")) == 7 && json_array_size(json_array_get(get(L, "pos_pca"), 0)) == 2,
              "pos_pca is [P][2]");
        json_t *tp = get(L, "topics");
        CHECK(tp && ival(tp, "within_pairs") + ival(tp, "between_pairs") > 0, "labels give topics");
        double mx = num(get(get(L, "orthogonality"), "max_abs_cos"));
        CHECK(mx >= 0 && mx <= 1 + 1e-6, "max |cos(pos, ctx)| in [0, 1]");
    }
    json_t *sync_result = json_incref(r.json);
    http_resp_free(&r);

    /* windows of ids, first position kept */
    http_post_json(s, &r, D,
                   "{\"model\": \"gpt\", \"windows\": [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34]], "
                   "\"drop_first_position\": false, \"layers\": [1]}");
    CHECK(r.status == 200 && ival(r.json, "windows") == 3 && ival(r.json, "positions") == 5 &&
              ival(r.json, "first_position") == 0 && !get(json_array_get(get(r.json, "layers"), 0), "topics"),
          "windows input: %ld %.300s", r.status, r.body);
    check_schema(&r, D, "POST");
    http_resp_free(&r);

    /* the CLI prints the same JSON */
    char path[512], cmd[1024];
    snprintf(path, sizeof path, "%s/texts.txt", tmpdir);
    FILE *f = fopen(path, "w");
    fprintf(f, "the cat sat on the mat and looked at the dog across the room\n"
               "a quick brown fox jumps over the lazy dog near the river bank\n\n"
               "stocks fell sharply on monday as investors worried about rates\n"
               "the central bank raised interest rates by a quarter point today\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s decompose --model %s/bert --length 8 --layers 0,2 --labels a,a,b,b --texts-file %s",
             lensd_path(), tmpdir, path);
    json_t *cli = run_json(cmd);
    json_t *want = json_deep_copy(sync_result);
    CHECK(cli != NULL, "CLI decompose output parses");
    if (cli) {
        json_object_del(cli, "timing_ms");
        json_object_del(want, "timing_ms");
        json_object_set_new(cli, "model", json_string("bert"));
        CHECK(json_equal(cli, want), "lensd decompose differs from POST /v1/decomposition");
    }
    json_decref(cli);
    /* the definition flags reach the request: lensd's within-topic pairs exclude self-pairs */
    snprintf(cmd, sizeof cmd,
             "%s decompose --model %s/bert --length 8 --layers 0 --labels a,a,b,b --definition lensd --screenot-k 2 "
             "--texts-file %s", lensd_path(), tmpdir, path);
    cli = run_json(cmd);
    const json_t *tp = get(json_array_get(get(cli, "layers"), 0), "topics");
    CHECK(cli && !strcmp(json_string_value(get(cli, "definition")), "lensd") &&
              json_is_false(get(cli, "topics_self_pairs")) && ival(cli, "screenot_k") == 2 && tp &&
              ival(tp, "within_pairs") < ival(get(json_array_get(get(sync_result, "layers"), 0), "topics"), "within_pairs"),
          "lensd decompose --definition lensd --screenot-k 2");
    json_decref(cli);

    /* async: 202 with a job, then the same result */
    snprintf(body, sizeof body,
             "{\"model\": \"bert\", %s, \"length\": 8, \"layers\": [0, 2], \"labels\": [\"a\", \"a\", \"b\", \"b\"], "
             "\"async\": true}",
             decomp_texts);
    http_post_json(s, &r, D, body);
    CHECK(r.status == 202, "async decomposition: %ld %.300s", r.status, r.body);
    check_schema(&r, D, "POST");
    const char *id = json_string_value(get(r.json, "id"));
    const char *st = json_string_value(get(r.json, "state"));
    CHECK(id && st && (!strcmp(st, "queued") || !strcmp(st, "running")) &&
              !strcmp(json_string_value(get(r.json, "kind")), "decomposition"),
          "202 body is a queued decomposition job");
    json_t *job = id ? poll_job(s, id, NULL, 30000) : NULL;
    CHECK(job && !strcmp(json_string_value(get(job, "state")), "done") && num(get(job, "progress")) == 1 &&
              json_is_string(get(job, "started")) && json_is_string(get(job, "finished")) &&
              json_is_string(get(job, "expires")),
          "async job finishes done with progress 1 and times");
    if (job) {
        json_t *res = json_deep_copy(get(job, "result"));
        check_result_schema(res, "DecompositionResponse");
        json_object_del(res, "timing_ms");
        CHECK(json_equal(res, want), "the job's result equals the synchronous response");
        json_decref(res);
    }
    json_decref(job);
    http_resp_free(&r);

    /* POST /v1/jobs with the same params */
    snprintf(body, sizeof body,
             "{\"kind\": \"decomposition\", \"params\": {\"model\": \"bert\", %s, \"length\": 8, \"layers\": [0, 2], "
             "\"labels\": [\"a\", \"a\", \"b\", \"b\"]}}",
             decomp_texts);
    http_post_json(s, &r, "/v1/jobs", body);
    CHECK(r.status == 202, "POST /v1/jobs: %ld %.300s", r.status, r.body);
    check_schema(&r, "/v1/jobs", "POST");
    id = json_string_value(get(r.json, "id"));
    job = id ? poll_job(s, id, NULL, 30000) : NULL;
    if (job) {
        json_t *res = json_deep_copy(get(job, "result"));
        json_object_del(res, "timing_ms");
        CHECK(!strcmp(json_string_value(get(job, "state")), "done") && json_equal(res, want),
              "POST /v1/jobs decomposition gives the synchronous result");
        json_decref(res);
    } else {
        CHECK(0, "POST /v1/jobs decomposition did not finish");
    }
    json_decref(job);
    http_resp_free(&r);

    /* a job that fails at run time: one window only */
    http_post_json(s, &r, "/v1/jobs",
                   "{\"kind\": \"decomposition\", \"params\": {\"model\": \"bert\", \"texts\": [\"a b c d\"], \"length\": 4}}");
    id = json_string_value(get(r.json, "id"));
    job = r.status == 202 && id ? poll_job(s, id, NULL, 30000) : NULL;
    json_t *jerr = get(job, "error");
    CHECK(job && !strcmp(json_string_value(get(job, "state")), "failed") && jerr &&
              !strcmp(json_string_value(get(jerr, "code")), "invalid_request") &&
              !strcmp(json_string_value(get(jerr, "field")), "params.texts") && !get(job, "result"),
          "a job whose input gives 1 window fails with the typed error naming params.texts (got %s)",
          jerr ? json_string_value(get(jerr, "field")) : "-");
    json_decref(job);
    http_resp_free(&r);
    json_decref(want);
    json_decref(sync_result);

    /* unknown ids */
    http_get(s, &r, "/v1/jobs/0123456789abcdef");
    CHECK(r.status == 404 && err_code(&r) && !strcmp(err_code(&r), "job_not_found") && err_field(&r) &&
              !strcmp(err_field(&r), "id"),
          "GET unknown job -> 404 job_not_found: %ld", r.status);
    check_schema(&r, "/v1/jobs/{id}", "GET");
    http_resp_free(&r);
    http_do(s, &r, "DELETE", "/v1/jobs/nope", NULL, NULL, 0, NULL);
    CHECK(r.status == 404 && err_code(&r) && !strcmp(err_code(&r), "job_not_found"), "DELETE unknown job -> 404");
    check_schema(&r, "/v1/jobs/{id}", "DELETE");
    http_resp_free(&r);

    static const bad_case cases[] = {
        {"/v1/decomposition", "{\"model\": \"bert\", \"length\": 8}", 422, "invalid_request", "texts"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": \"abc\", \"length\": 8}", 422, "invalid_request", "texts"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [], \"length\": 8}", 422, "invalid_request", "texts"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [1], \"length\": 8}", 422, "invalid_request", "texts"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"]}", 422, "invalid_request", "length"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": \"8\"}", 422, "invalid_request", "length"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 2}", 422, "invalid_request", "length"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 0}", 422, "invalid_request", "length"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 1000}", 413, "too_many_tokens", "length"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a b c d e\"], \"length\": 4}", 422, "invalid_request", "texts"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"windows\": [[1, 2, 3], [1, 2]]}", 422, "invalid_request", "windows"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"windows\": [[1, 2, 3]]}", 422, "invalid_request", "windows"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"windows\": [[1, 2, 3], [1, 2, -4]]}", 422, "invalid_request", "windows"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"windows\": [1, 2]}", 422, "invalid_request", "windows"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"windows\": [[1, 2, 3], [4, 5, 6]], \"length\": 4}", 422, "invalid_request", "windows"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"windows\": [[1, 2, 3]], \"length\": 3}", 422, "invalid_request", "windows"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\", \"b\"], \"length\": 4, \"labels\": [\"x\"]}", 422, "invalid_request", "labels"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"labels\": [true]}", 422, "invalid_request", "labels"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"labels\": \"x\"}", 422, "invalid_request", "labels"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"layers\": [3]}", 422, "invalid_request", "layers"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"async\": \"yes\"}", 422, "invalid_request", "async"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"drop_first_position\": 1}", 422, "invalid_request", "drop_first_position"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"top_k\": 0}", 422, "invalid_request", "top_k"},
        {"/v1/decomposition", "{\"model\": \"nope\", \"texts\": [\"a\"], \"length\": 4}", 404, "model_not_found", "model"},
        {"/v1/jobs", "{}", 422, "invalid_request", "kind"},
        {"/v1/jobs", "{\"kind\": 5}", 422, "invalid_request", "kind"},
        {"/v1/jobs", "{\"kind\": \"nope\", \"params\": {}}", 422, "invalid_request", "kind"},
        {"/v1/jobs", "{\"kind\": \"decomposition\", \"params\": 3}", 422, "invalid_request", "params"},
        {"/v1/jobs", "{\"kind\": \"decomposition\"}", 422, "invalid_request", "params.model"},
        {"/v1/jobs", "{\"kind\": \"decomposition\", \"params\": {\"model\": \"bert\"}}", 422, "invalid_request", "params.texts"},
        {"/v1/jobs", "{\"kind\": \"decomposition\", \"params\": {\"model\": \"bert\", \"texts\": [\"a\"]}}", 422, "invalid_request", "params.length"},
        {"/v1/jobs", "{\"kind\": \"decomposition\", \"params\": {\"model\": \"nope\"}}", 404, "model_not_found", "params.model"},
        {"/v1/jobs", "{\"kind\": \"decomposition\", \"params\": {\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 900}}", 413, "too_many_tokens", "params.length"},
        {"/v1/jobs", "{\"kind\": \"decomposition\", \"params\": {\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"lenght\": 4}}", 422, "invalid_request", "params.lenght"},
        {"/v1/decomposition", "{\"model\": \"bert\", \"texts\": [\"a\"], \"length\": 4, \"layer\": [1]}", 422, "invalid_request", "layer"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"step\": 4}", 422, "invalid_request", "step"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"async\": 1}", 422, "invalid_request", "async"},
        {"/v1/attention", "{\"model\": \"bert\", \"text\": \"a\", \"identifiable\": true}", 422, "invalid_request", "identifiable"},
        {"/v1/jobs", "[]", 422, "invalid_request", NULL},
        {"/v1/jobs", "{\"kind\": ", 400, "invalid_json", NULL},
    };
    run_bad_cases(s, cases, (int)(sizeof cases / sizeof *cases));
}

/* ----------------------------------------------------------- attribution */

static void test_attribution(test_server *s)
{
    const char *AT = "/v1/attribution";
    http_resp r;
    http_post_json(s, &r, AT,
                   "{\"model\": \"bert\", \"text\": \"a fine movie, truly\", \"steps\": 8, \"tree\": {\"threshold\": 0.3}, "
                   "\"format\": {\"encoding\": \"base64\"}}");
    CHECK(r.status == 200, "attribution: %ld %.300s", r.status, r.body);
    check_schema(&r, AT, "POST");
    size_t T = json_array_size(get(r.json, "tokens"));
    json_t *layers = get(r.json, "layers"), *target = get(r.json, "target");
    CHECK(json_array_size(layers) == 2 && ival(r.json, "steps") == 8 &&
              !strcmp(json_string_value(get(r.json, "riemann")), "right") &&
              ival(target, "index") == ival(get(r.json, "predicted"), "index") && num(get(target, "prob")) > 0,
          "2 layers, steps 8, right Riemann sum, target = predicted by default");
    for (size_t l = 0; l < json_array_size(layers); l++) {
        json_t *L = json_array_get(layers, l), *heads = get(L, "heads");
        double total = 0;
        int ok = json_array_size(heads) == 2;
        for (size_t h = 0; ok && h < json_array_size(heads); h++) {
            float *a = b64_floats(get(json_array_get(heads, h), "attribution"), T * T);
            ok = a != NULL;
            if (!a) break;
            double mx = -INFINITY;
            for (size_t i = 0; i < T * T; i++) mx = fmax(mx, a[i]), total += a[i];
            double imp = num(get(json_array_get(heads, h), "importance"));
            /* importance = max_ij attribution, written with format.precision = 6 significant digits */
            CHECK(fabs(imp - mx) <= 0.5e-5 * fabs(mx) * (1 + 1e-6), "layer %zu head %zu: importance %g = max %g", l, h,
                  imp, mx);
            free(a);
        }
        CHECK(ok, "layer %zu: 2 heads of base64 [T][T] attributions", l);
        /* attr_sum is the float64 sum of the same float32 entries, written as a float32 with 6 significant digits */
        CHECK(fabs(total - num(get(L, "attr_sum"))) <= (0.5e-5 + 1e-6) * fabs(total), "layer %zu: attr_sum = sum of entries",
              l);
    }
    json_t *tree = get(r.json, "tree");
    long long root = ival(tree, "root");
    int tree_ok = tree && root >= 1 && root < (long long)T && ival(json_array_get(get(tree, "nodes"), 0), "token") == root &&
                  json_array_size(get(tree, "nodes")) == json_array_size(get(tree, "edges")) + 1 &&
                  fabs(num(get(tree, "threshold")) - 0.3) < 1e-9;
    for (size_t i = 0; tree_ok && i < json_array_size(get(tree, "edges")); i++) {
        json_t *e = json_array_get(get(tree, "edges"), i);
        tree_ok = ival(e, "from") >= 0 && ival(e, "from") < (long long)T && ival(e, "to") >= 0 &&
                  ival(e, "to") < (long long)T && num(get(e, "score")) >= 0.3 - 1e-6;
    }
    CHECK(tree_ok, "tree: root is a non-[CLS] token, one node per edge plus the root, scores >= threshold");
    /* nodes and edges name their tokens' texts: tokens[i].text of the indices they carry */
    json_t *toks = get(r.json, "tokens");
#define TOK_TEXT(i) json_string_value(get(json_array_get(toks, (size_t)(i)), "text"))
    int texts_ok = tree && json_array_size(get(tree, "nodes")) > 0;
    for (size_t i = 0; texts_ok && i < json_array_size(get(tree, "nodes")); i++) {
        json_t *n = json_array_get(get(tree, "nodes"), i);
        texts_ok = TOK_TEXT(ival(n, "token")) && !strcmp(json_string_value(get(n, "text")) ?: "", TOK_TEXT(ival(n, "token")));
    }
    for (size_t i = 0; texts_ok && i < json_array_size(get(tree, "edges")); i++) {
        json_t *e = json_array_get(get(tree, "edges"), i);
        texts_ok = !strcmp(json_string_value(get(e, "from_text")) ?: "", TOK_TEXT(ival(e, "from")) ?: "-") &&
                   !strcmp(json_string_value(get(e, "to_text")) ?: "", TOK_TEXT(ival(e, "to")) ?: "-");
    }
#undef TOK_TEXT
    CHECK(texts_ok, "tree: node text, edge from_text and to_text = tokens[index].text");
    /* GPT-2 (docs/api-notes.md): the target is the next token, named by its piece */
    http_resp g;
    http_post_json(s, &g, "/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a b c\", \"steps\": 4}");
    CHECK(g.status == 200, "GPT-2 attribution: %ld %.200s", g.status, g.body);
    if (g.status == 200) {
        check_schema(&g, "/v1/attribution", "POST");
        const json_t *tg = get(g.json, "target");
        CHECK(json_is_integer(get(tg, "index")) && json_is_string(get(tg, "label")) && !get(g.json, "tree") &&
                  json_array_size(get(g.json, "layers")) > 0,
              "GPT-2 attribution: a next-token target with its piece, layers, no tree");
    }
    http_resp_free(&g);

    /* format.precision is significant digits and applies to the scalars too (issue 16 item 7) */
    http_resp rp;
    http_post_json(s, &rp, AT,
                   "{\"model\": \"bert\", \"text\": \"a fine movie, truly\", \"steps\": 8, \"format\": {\"precision\": 3}}");
    int sig_ok = rp.status == 200, n_scalars = 0;
    for (size_t l = 0; sig_ok && l < json_array_size(get(rp.json, "layers")); l++) {
        json_t *L = json_array_get(get(rp.json, "layers"), l), *want_heads = get(json_array_get(layers, l), "heads");
        for (size_t h = 0; h < json_array_size(get(L, "heads")); h++) {
            double imp = num(get(json_array_get(get(L, "heads"), h), "importance"));
            double full = num(get(json_array_get(want_heads, h), "importance")); /* 6 digits, above */
            double scaled = imp / pow(10.0, floor(log10(fabs(imp))) - 2); /* 3 significant digits: an integer */
            sig_ok &= imp != 0 && fabs(scaled - round(scaled)) < 1e-6 && fabs(imp - full) <= 0.51e-2 * fabs(full);
            n_scalars++;
        }
    }
    CHECK(sig_ok && n_scalars == 4, "precision 3: every importance has 3 significant digits and is within 0.5e-2 "
                                    "relative of the 6-digit value (%d checked)", n_scalars);
    http_resp_free(&rp);

    /* async: true is a job of kind attribution with the same result (issue 16 item 7) */
    http_resp ra;
    http_post_json(s, &ra, AT,
                   "{\"model\": \"bert\", \"text\": \"a fine movie, truly\", \"steps\": 8, \"tree\": {\"threshold\": 0.3}, "
                   "\"format\": {\"encoding\": \"base64\"}, \"async\": true}");
    CHECK(ra.status == 202, "async attribution: %ld %.300s", ra.status, ra.body);
    check_schema(&ra, AT, "POST");
    const char *aid = json_string_value(get(ra.json, "id"));
    CHECK(aid && !strcmp(json_string_value(get(ra.json, "kind")), "attribution"), "202 body is an attribution job");
    json_t *ajob = aid ? poll_job(s, aid, NULL, 60000) : NULL;
    CHECK(ajob && !strcmp(json_string_value(get(ajob, "state")), "done"), "async attribution job is done");
    if (ajob) {
        json_t *res = json_deep_copy(get(ajob, "result")), *sync = json_deep_copy(r.json);
        json_object_del(res, "timing_ms");
        json_object_del(sync, "timing_ms");
        CHECK(json_equal(res, sync), "the attribution job's result equals the synchronous response");
        json_decref(res);
        json_decref(sync);
        json_decref(ajob);
    }
    http_resp_free(&ra);
    http_resp_free(&r);

    /* target by label name, selection, no matrices */
    http_post_json(s, &r, AT,
                   "{\"model\": \"bert\", \"text\": \"a fine movie\", \"steps\": 4, \"target\": \"positive\", \"layers\": [2], "
                   "\"heads\": [1], \"include_matrices\": false, \"riemann\": \"left\"}");
    CHECK(r.status == 200, "attribution selection: %ld %.300s", r.status, r.body);
    check_schema(&r, AT, "POST");
    layers = get(r.json, "layers");
    json_t *hd = json_array_get(get(json_array_get(layers, 0), "heads"), 0);
    CHECK(json_array_size(layers) == 1 && ival(json_array_get(layers, 0), "layer") == 2 && ival(hd, "head") == 1 &&
              !get(hd, "attribution") && !get(r.json, "tree") &&
              !strcmp(json_string_value(get(get(r.json, "target"), "label")), "positive") &&
              !strcmp(json_string_value(get(r.json, "riemann")), "left"),
          "target by label, layers [2], heads [1], no matrices, left sum");
    http_resp_free(&r);

    /* Gauss–Legendre: the default node count, and completeness (exact up to
     * float32 with 12 nodes, where a 3-step Riemann sum is visibly off) */
    http_post_json(s, &r, AT, "{\"model\": \"bert\", \"text\": \"a fine movie\", \"quadrature\": \"gauss\", "
                              "\"include_matrices\": false}");
    CHECK(r.status == 200 && !strcmp(json_string_value(get(r.json, "quadrature")), "gauss") &&
              ival(r.json, "steps") == LENS_ATTR_GAUSS_NODES,
          "gauss: %ld, default %d nodes: %.300s", r.status, LENS_ATTR_GAUSS_NODES, r.body);
    check_schema(&r, AT, "POST");
    http_resp_free(&r);
    double gap[2] = {0, 0};
    const char *rules[2] = {"\"quadrature\": \"gauss\", \"steps\": 12", "\"quadrature\": \"riemann\", \"steps\": 3"};
    for (int i = 0; i < 2; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\": \"bert\", \"text\": \"a fine movie\", %s, \"include_matrices\": false}",
                 rules[i]);
        http_post_json(s, &r, AT, body);
        CHECK(r.status == 200, "%s: %ld %.300s", rules[i], r.status, r.body);
        const double f = num(get(get(r.json, "target"), "prob"));
        for (size_t l = 0; l < json_array_size(get(r.json, "layers")); l++) {
            const json_t *L = json_array_get(get(r.json, "layers"), l);
            gap[i] = fmax(gap[i], fabs(num(get(L, "attr_sum")) - (f - num(get(L, "f_zero")))));
        }
        http_resp_free(&r);
    }
    CHECK(gap[0] < 1e-5 && gap[1] > 10 * gap[0], "completeness gap gauss-12 %.3g, riemann-3 %.3g", gap[0], gap[1]);

    /* the CLI prints the same JSON */
    http_post_json(s, &r, AT, "{\"model\": \"bert\", \"text\": \"a b c\", \"steps\": 3, \"target\": 1, \"tree\": true, \"format\": {\"precision\": 5}}");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s attribution --model %s/bert 'a b c' --steps 3 --target 1 --tree --precision 5",
             lensd_path(), tmpdir);
    json_t *cli = run_json(cmd);
    CHECK(cli && r.json, "CLI attribution output parses");
    if (cli && r.json) {
        json_object_del(cli, "timing_ms");
        json_object_del(r.json, "timing_ms");
        CHECK(json_equal(cli, r.json), "lensd attribution differs from POST /v1/attribution");
    }
    json_decref(cli);
    http_resp_free(&r);

    /* as a job */
    http_post_json(s, &r, "/v1/jobs",
                   "{\"kind\": \"attribution\", \"params\": {\"model\": \"bert\", \"text\": \"a fine movie\", \"steps\": 4}}");
    CHECK(r.status == 202, "attribution job: %ld %.200s", r.status, r.body);
    const char *id = json_string_value(get(r.json, "id"));
    json_t *job = id ? poll_job(s, id, NULL, 30000) : NULL;
    CHECK(job && !strcmp(json_string_value(get(job, "state")), "done"), "attribution job done");
    if (job) check_result_schema(get(job, "result"), "AttributionResponse");
    json_decref(job);
    http_resp_free(&r);

    /* over a dataset: a job with texts (the sharded kind, shard 0 of 1 merged) answers what the batch request does */
    const char *texts = "\"model\": \"bert\", \"texts\": [\"a fine movie\", 7, \"dull\"], \"steps\": 3";
    char body[512];
    snprintf(body, sizeof body, "{%s}", texts);
    http_post_json(s, &r, AT, body);
    CHECK(r.status == 200 && json_array_size(get(r.json, "results")) == 3, "attribution batch: %ld", r.status);
    snprintf(body, sizeof body, "{\"kind\": \"attribution\", \"params\": {%s}}", texts);
    http_resp rj;
    http_post_json(s, &rj, "/v1/jobs", body);
    CHECK(rj.status == 202, "attribution job over texts: %ld %.200s", rj.status, rj.body);
    id = json_string_value(get(rj.json, "id"));
    job = id ? poll_job(s, id, NULL, 30000) : NULL;
    CHECK(job && !strcmp(json_string_value(get(job, "state")), "done"), "attribution job over texts done");
    if (job && r.json) {
        json_t *res = get(job, "result");
        size_t i;
        json_t *item;
        json_array_foreach(get(res, "results"), i, item) json_object_del(item, "timing_ms");
        json_array_foreach(get(r.json, "results"), i, item) json_object_del(item, "timing_ms");
        json_t *bad = get(json_array_get(get(res, "results"), 1), "error");
        const char *field = json_string_value(get(bad, "field"));
        CHECK(field && !strcmp(field, "params.texts[1]"), "row 1's error in its slot names params.texts[1]: %s",
              field ? field : "(none)");
        if (bad) json_object_set_new(bad, "field", json_string("texts[1]")); /* a job's fields are under params. */
        CHECK(json_equal(res, r.json), "the job over texts equals the batch response");
    }
    json_decref(job);
    http_resp_free(&rj);
    http_resp_free(&r);

    static const bad_case cases[] = {
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a\", \"tree\": true}", 422, "invalid_request", "tree"},
        {"/v1/attribution", "{\"model\": \"gpt\", \"text\": \"a\", \"target\": -1}", 422, "invalid_request", "target"},
        {"/v1/attribution", "{\"model\": \"bert\"}", 422, "invalid_request", "text"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"steps\": 0}", 422, "invalid_request", "steps"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"steps\": 1001}", 422, "invalid_request", "steps"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"steps\": \"20\"}", 422, "invalid_request", "steps"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"riemann\": \"middle\"}", 422, "invalid_request", "riemann"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"riemann\": 1}", 422, "invalid_request", "riemann"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"quadrature\": \"simpson\"}", 422, "invalid_request", "quadrature"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"quadrature\": 2}", 422, "invalid_request", "quadrature"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"quadrature\": \"gauss\", \"riemann\": \"left\"}", 422, "invalid_request", "riemann"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"quadrature\": \"gauss\", \"steps\": 0}", 422, "invalid_request", "steps"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"target\": 2}", 422, "invalid_request", "target"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"target\": -1}", 422, "invalid_request", "target"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"target\": \"neutral\"}", 422, "invalid_request", "target"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"target\": [1]}", 422, "invalid_request", "target"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"tree\": 3}", 422, "invalid_request", "tree"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"tree\": {\"threshold\": 2}}", 422, "invalid_request", "tree.threshold"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"tree\": {\"threshold\": \"x\"}}", 422, "invalid_request", "tree.threshold"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"include_matrices\": \"no\"}", 422, "invalid_request", "include_matrices"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"layers\": [0]}", 422, "invalid_request", "layers"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"heads\": [9]}", 422, "invalid_request", "heads"},
        {"/v1/attribution", "{\"model\": \"bert\", \"text\": \"a\", \"format\": {\"precision\": 12}}", 422, "invalid_request", "format.precision"},
        {"/v1/attribution", "{\"model\": \"nope\", \"text\": \"a\"}", 404, "model_not_found", "model"},
        {"/v1/jobs", "{\"kind\": \"attribution\", \"params\": {\"model\": \"bert\", \"text\": \"a\", \"steps\": -3}}", 422, "invalid_request", "params.steps"},
    };
    run_bad_cases(s, cases, (int)(sizeof cases / sizeof *cases));
}

/* ------------------------------------- job lifecycle (server with limits) */

static json_t *submit_small_job(test_server *s, long *status)
{
    http_resp r;
    http_post_json(s, &r, "/v1/jobs",
                   "{\"kind\": \"decomposition\", \"params\": {\"windows\": [[10, 11, 12], [20, 21, 22]], \"layers\": [0]}}");
    *status = r.status;
    if (r.status == 429) {
        char ra[16];
        CHECK(http_header(&r, "Retry-After", ra, sizeof ra) == 0 && atoi(ra) >= 1, "429 has Retry-After");
        CHECK(err_code(&r) && !strcmp(err_code(&r), "too_many_jobs"), "429 code too_many_jobs");
    }
    check_schema(&r, "/v1/jobs", "POST");
    json_t *job = r.status == 202 ? json_incref(r.json) : NULL;
    http_resp_free(&r);
    return job;
}

static void test_job_lifecycle(void)
{
    char model[512];
    snprintf(model, sizeof model, "bert=%s/bert", tmpdir);
    /* each job first waits 1.5 s (cancellable), so states can be observed */
    const char *args[] = {"--model", model, "--max-jobs", "1", "--max-stored-jobs", "3", "--job-ttl", "1",
                          "--debug-delay-ms", "1500", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "jobs server did not start");
        return;
    }
    long st;
    json_t *a = submit_small_job(&s, &st), *b = submit_small_job(&s, &st);
    CHECK(a && b, "two jobs accepted");
    if (!a || !b) {
        json_decref(a), json_decref(b);
        server_terminate(&s);
        return;
    }
    char ida[64], idb[64], path[128];
    snprintf(ida, sizeof ida, "%s", json_string_value(get(a, "id")));
    snprintf(idb, sizeof idb, "%s", json_string_value(get(b, "id")));
    CHECK(strcmp(ida, idb) != 0, "job ids differ");
    json_t *ja = poll_job(&s, ida, "running", 5000);
    CHECK(ja != NULL, "job A runs (max-jobs 1)");
    json_decref(ja);
    http_resp r;
    snprintf(path, sizeof path, "/v1/jobs/%s", idb);
    http_get(&s, &r, path);
    CHECK(r.status == 200 && !strcmp(json_string_value(get(r.json, "state")), "queued") &&
              json_is_null(get(r.json, "started")),
          "job B waits queued behind A: %.200s", r.body);
    http_resp_free(&r);
    http_do(&s, &r, "DELETE", path, NULL, NULL, 0, NULL);
    CHECK(r.status == 200 && !strcmp(json_string_value(get(r.json, "state")), "cancelled") &&
              !strcmp(json_string_value(get(get(r.json, "error"), "code")), "cancelled"),
          "DELETE a queued job: cancelled at once: %.200s", r.body);
    check_schema(&r, "/v1/jobs/{id}", "DELETE");
    http_resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s", ida);
    http_do(&s, &r, "DELETE", path, NULL, NULL, 0, NULL);
    CHECK(r.status == 200, "DELETE a running job: %ld", r.status);
    http_resp_free(&r);
    ja = poll_job(&s, ida, NULL, 5000);
    CHECK(ja && !strcmp(json_string_value(get(ja, "state")), "cancelled") && !get(ja, "result"),
          "the running job ends cancelled");
    json_decref(ja);

    /* cap 3: A and B are finished, so C makes 3 and D, E each drop the finished
     * job that finished first (B, cancelled while queued, then A); with C, D, E
     * queued or running, F -> 429 */
    json_t *c = submit_small_job(&s, &st);
    CHECK(c != NULL, "job C accepted");
    json_t *d = submit_small_job(&s, &st);
    CHECK(d && st == 202, "a 4th job drops a finished one instead of 429 (got %ld)", st);
    snprintf(path, sizeof path, "/v1/jobs/%s", idb);
    http_get(&s, &r, path);
    CHECK(r.status == 404, "the job that finished first (B) made room: %ld", r.status);
    http_resp_free(&r);
    json_t *e = submit_small_job(&s, &st);
    CHECK(e && st == 202, "a 5th job drops the other finished one (got %ld)", st);
    json_t *f = submit_small_job(&s, &st);
    CHECK(!f && st == 429, "with 3 jobs queued or running a 4th -> 429 (got %ld)", st);
    json_decref(f);
    json_t *jc = c ? poll_job(&s, json_string_value(get(c, "id")), NULL, 15000) : NULL;
    CHECK(jc && !strcmp(json_string_value(get(jc, "state")), "done"), "job C runs after A and finishes done");
    if (jc) check_result_schema(get(jc, "result"), "DecompositionResponse");
    json_decref(jc);
    json_t *jd = d ? poll_job(&s, json_string_value(get(d, "id")), "running", 5000) : NULL;
    CHECK(jd != NULL, "job D runs");
    json_decref(jd);
    /* TTL 1 s: C expires (D, then E, hold the job thread meanwhile) */
    sleep_ms(1200);
    snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(get(c, "id")));
    http_get(&s, &r, path);
    CHECK(r.status == 404, "a finished job is gone after --job-ttl: %ld", r.status);
    http_resp_free(&r);

    http_get(&s, &r, "/metrics");
    CHECK(r.body && strstr(r.body, "lensd_jobs{state=\"done\"}") && strstr(r.body, "lensd_jobs{state=\"queued\"}"),
          "/metrics has lensd_jobs by state");
    http_resp_free(&r);
    http_get(&s, &r, "/v1/info");
    json_t *limits = get(r.json, "limits");
    CHECK(ival(limits, "max_jobs") == 1 && ival(limits, "max_stored_jobs") == 3 && num(get(limits, "job_ttl_s")) == 1,
          "/v1/info reports the job limits");
    check_schema(&r, "/v1/info", "GET");
    http_resp_free(&r);

    /* SIGTERM with a job running (D or E): it is cancelled and the process exits 0 */
    double t0 = (double)time(NULL);
    CHECK(server_terminate(&s) == 0, "lensd exits 0 on SIGTERM with a running job");
    CHECK((double)time(NULL) - t0 <= 10, "shutdown does not wait for jobs to finish on their own");
    json_decref(a), json_decref(b), json_decref(c), json_decref(d), json_decref(e);
}

/* ------------------------------- the job store shared by API keys (fair) */

/* POST one small job as key; its id into id ("" unless 202); the status, and
 * the error code into code. */
static long submit_as(test_server *s, const char *key, char *id, size_t size, char *code, size_t code_size)
{
    char auth[64];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *headers[] = {auth, NULL};
    const char *body = "{\"kind\": \"decomposition\", \"params\": {\"windows\": [[10, 11, 12], [20, 21, 22]], "
                       "\"layers\": [0]}}";
    http_resp r;
    http_do(s, &r, "POST", "/v1/jobs", "application/json", body, strlen(body), headers);
    check_schema(&r, "/v1/jobs", "POST");
    const char *v = json_string_value(get(r.json, "id"));
    snprintf(id, size, "%s", r.status == 202 && v ? v : "");
    snprintf(code, code_size, "%s", err_code(&r) ? err_code(&r) : "");
    long status = r.status;
    http_resp_free(&r);
    return status;
}

/* --max-stored-jobs 2 shared by 2 keys: each holds 1. Key A's running job
 * refuses A's next one (429), not key B's, although the store has room. */
static void test_job_share(void)
{
    char model[512], keys[512];
    snprintf(model, sizeof model, "bert=%s/bert", tmpdir);
    snprintf(keys, sizeof keys, "%s/keys", tmpdir);
    FILE *f = fopen(keys, "w");
    CHECK(f != NULL, "cannot write %s", keys);
    if (!f) return;
    fputs("key-a\nkey-b\n", f);
    fclose(f);
    const char *args[] = {"--model", model, "--api-key-file", keys, "--max-jobs", "1", "--max-stored-jobs", "2",
                          "--debug-delay-ms", "3000", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "job share server did not start");
        return;
    }
    char id_a[64], id_a2[64], id_b[64], code[64];
    CHECK(submit_as(&s, "key-a", id_a, sizeof id_a, code, sizeof code) == 202, "key A's job accepted");
    long st = submit_as(&s, "key-a", id_a2, sizeof id_a2, code, sizeof code);
    CHECK(st == 429 && !strcmp(code, "too_many_jobs"),
          "key A's second job, its share (1 of 2) queued or running -> 429 too_many_jobs: %ld %s", st, code);
    CHECK(submit_as(&s, "key-b", id_b, sizeof id_b, code, sizeof code) == 202,
          "key B's job accepted while key A is at its share");
    CHECK(server_terminate(&s) == 0, "lensd exits 0 on SIGTERM with jobs queued and running");
}

/* ------------------------------------------------------------------ main */

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi) return check_done("test_http_analyses");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lensd-analyses-XXXXXX");
    if (make_tiny_models(tmpdir)) return check_done("test_http_analyses");

    char bert[512], gpt[512];
    snprintf(bert, sizeof bert, "bert=%s/bert", tmpdir);
    snprintf(gpt, sizeof gpt, "gpt=%s/gpt", tmpdir);
    const char *args[] = {"--model", bert, "--model", gpt, "--max-tokens", "128", "--workers", "1", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "lensd serve did not become ready");
    } else {
        test_attention(&s);
        test_decomposition(&s);
        test_decomposition_definitions(&s);
        test_attribution(&s);
        CHECK(server_terminate(&s) == 0, "lensd exits 0 on SIGTERM");
    }

    test_job_lifecycle();
    test_job_share();

    remove_test_files(tmpdir);
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_analyses");
}
