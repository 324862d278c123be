/* test_moe.c - the mixture-of-experts op (core/nn/moe.h) by its exact
 * identities, and the MoE families' load errors.
 *
 * Identities on random float32 maps (C = 12, F = 7, N = 9 rows):
 *   one expert, top 1             == the dense GLU MLP W_down (act(h W_gate) * h W_up)
 *                                    (the same GEMMs on the same rows: bit-exact)
 *   top-k = all E experts,
 *   no renormalisation            == sum_e softmax(h W_r)_e y_e, every expert on every row
 *                                    |diff| <= 1e-5 max|ref| (only the order of the sum differs)
 *   top-k = all, renormalised     == the same (the weights already sum to one), 1e-5
 *   the routes                    experts in order of probability, weights p / Z
 * Load errors, each a typed error naming the key or tensor, on micro
 * checkpoints (lens_mkmodel) with one config value changed:
 *   num_experts_per_tok above the experts, more than 128 experts, an
 *   mlp_only_layers index past the layers, clip_qkv set, a router whose
 *   shape disagrees with the config (num_local_experts 3 against 4 rows),
 *   and gpt-oss's MXFP4 quantization_config. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/model/model.h"
#include "core/model/mkmodel.h"
#include "core/nn/moe.h"

enum { C = 12, F = 7, N = 9, E = 5 };

static unsigned rng = 2463534242u;
static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return (float)(rng / 4294967296.0) * 2.0f - 1.0f;
}

static float *random_floats(size_t n)
{
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; x && i < n; i++) x[i] = uniform();
    return x;
}

static lens_linear random_map(int in, int out)
{
    return (lens_linear){.w = random_floats((size_t)in * out), .in = in, .out = out, .ld = in};
}

/* y[N][C] = W_down (act(h W_gate) * h W_up) of one expert on every row. */
static void dense_mlp(float *y, const float *h, const lens_moe_expert *ex, lens_glu act)
{
    float gate[N * F], up[N * F];
    lens_gemm_linear(gate, h, &ex->gate, N, NULL);
    lens_gemm_linear(up, h, &ex->up, N, NULL);
    lens_glu_forward(gate, gate, up, N, F, F, act);
    lens_gemm_linear(y, gate, &ex->down, N, NULL);
}

static void check_identities(void)
{
    lens_moe_expert experts[E];
    for (int e = 0; e < E; e++)
        experts[e] = (lens_moe_expert){.gate = random_map(C, F), .up = random_map(C, F), .down = random_map(F, C)};
    lens_linear router = random_map(C, E);
    float *h = random_floats((size_t)N * C), out[N * C], want[N * C], y[N * C];
    lens_moe one = {.router = &router, .experts = experts, .n_experts = 1, .top_k = 1, .ff = F, .act = LENS_GLU_SILU};
    lens_linear router1 = router;
    router1.out = 1;
    one.router = &router1;
    float *scratch = malloc(sizeof(float) * N * lens_moe_scratch_floats(&(lens_moe){.n_experts = E, .top_k = E, .ff = F}, C));
    lens_moe_forward(out, h, N, C, &one, NULL, NULL, scratch, NULL);
    dense_mlp(want, h, &experts[0], LENS_GLU_SILU);
    CHECK(check_close("one expert vs the dense MLP", out, want, (size_t)N * C, 0, 0) == 0,
          "a one-expert MoE differs from the dense MLP");

    for (int norm = 0; norm < 2; norm++) {
        lens_moe all = {.router = &router, .experts = experts, .n_experts = E, .top_k = E, .norm_topk = norm,
                        .ff = F, .act = LENS_GLU_GELU_TANH};
        float route[N * (2 * E + E)], logits[N * E];
        lens_moe_forward(out, h, N, C, &all, NULL, route, scratch, NULL);
        lens_gemm_linear(logits, h, &router, N, NULL);
        memset(want, 0, sizeof want);
        int misordered = 0;
        for (int n = 0; n < N; n++) {
            double top = logits[n * E], sum = 0, p[E];
            for (int e = 1; e < E; e++) top = fmax(top, logits[n * E + e]);
            for (int e = 0; e < E; e++) sum += p[e] = exp(logits[n * E + e] - top);
            for (int e = 0; e < E; e++) p[e] /= sum;
            for (int j = 0; j < E; j++) {
                const int e = (int)route[n * 3 * E + j];
                misordered += j > 0 && p[e] > p[(int)route[n * 3 * E + j - 1]];
                misordered += fabs(route[n * 3 * E + E + j] - p[e]) > 1e-6;
            }
            for (int e = 0; e < E; e++) {
                dense_mlp(y, h, &experts[e], LENS_GLU_GELU_TANH);
                for (int c = 0; c < C; c++) want[n * C + c] += (float)(p[e] * y[n * C + c]);
            }
        }
        CHECK(misordered == 0, "top-%d routes: %d experts out of order or weights off p", E, misordered);
        double m = 0;
        for (int i = 0; i < N * C; i++) m = fmax(m, fabs(want[i]));
        char what[96];
        snprintf(what, sizeof what, "top-k = all experts (%s) vs the softmax-weighted sum",
                 norm ? "renormalised" : "not renormalised");
        const double d = check_close(what, out, want, (size_t)N * C, 1e-5 * m, 0);
        printf("  %-62s max |diff| %.2e (max %.2e)\n", what, d, m);
    }
    for (int e = 0; e < E; e++)
        free((void *)experts[e].gate.w), free((void *)experts[e].up.w), free((void *)experts[e].down.w);
    free((void *)router.w), free(h), free(scratch);
}

/* config.json of dir with key set to the JSON value (NULL: removed). */
static int set_key(const char *dir, const char *key, const char *value)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *v = value ? json_loads(value, JSON_DECODE_ANY, NULL) : NULL;
    const int bad = !root || (value && !v) || (v ? json_object_set_new(root, key, v) : json_object_del(root, key)) ||
                    json_dump_file(root, path, JSON_INDENT(2));
    json_decref(root);
    return bad ? -1 : 0;
}

static void check_load_errors(const char *tmp)
{
    static const struct {
        const char *arch, *key, *value, *needle;
    } bad[] = {
        {"mixtral", "num_experts_per_tok", "5", "\"num_experts_per_tok\" = 5 is outside [1, 4]"},
        {"olmoe", "num_experts_per_tok", "0", "\"num_experts_per_tok\" = 0 is outside [1, 8]"},
        {"qwen3_moe", "num_experts", "129", "\"num_experts\" = 129 is outside [1, 128]"},
        {"qwen3_moe", "mlp_only_layers", "[0, 7]", "\"mlp_only_layers\"[1] is not a layer index below 2"},
        {"qwen3_moe", "mlp_only_layers", "3", "\"mlp_only_layers\" must be a list of layer indices"},
        {"olmoe", "clip_qkv", "8.0", "\"clip_qkv\" = 8 is not supported"},
        {"mixtral", "num_local_experts", "3", "model.layers.0.block_sparse_moe.gate.weight"},
        {"olmoe", "num_experts", "7", "model.layers.0.mlp.gate.weight"},
        {"gpt_oss", "num_experts_per_tok", "5", "\"num_experts_per_tok\" = 5 is outside [1, 4]"},
        {"gpt_oss", "num_local_experts", "3", "model.layers.0.mlp.router.weight"},
        {"gpt_oss", "quantization_config", "{\"quant_method\": \"mxfp4\"}",
         "\"quantization_config\" (quant_method \"mxfp4\") is not supported"},
    };
    const int n = (int)(sizeof bad / sizeof bad[0]);
    for (int i = 0; i < n; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s-%d", tmp, bad[i].arch, i);
        lens_err err = {0};
        if (lens_mkmodel(bad[i].arch, "micro", "causal-lm", 1, dir, &err) || set_key(dir, bad[i].key, bad[i].value)) {
            CHECK(0, "%s: cannot write the checkpoint: %s", bad[i].arch, err.msg);
            continue;
        }
        lens_model *m = lens_model_load(dir, &err);
        CHECK(!m && err.code != 0 && strstr(err.msg, bad[i].needle), "%s %s = %s: want an error with '%s', got: %s",
              bad[i].arch, bad[i].key, bad[i].value, bad[i].needle, m ? "loaded" : err.msg);
        if (m) lens_model_free(m);
        else printf("  %s %s = %s: %s\n", bad[i].arch, bad[i].key, bad[i].value, err.msg);
    }
    /* the unchanged checkpoints load: the errors above are the changed value's */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s-%d", tmp, "olmoe", 1);
    CHECK(set_key(dir, "num_experts_per_tok", "8") == 0, "rewrite %s", dir);
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m && m->cfg.top_k == 8 && m->cfg.n_experts == 8, "olmoe with every expert routed loads: %s",
          m ? "wrong config" : err.msg);
    if (m) lens_model_free(m);
}

int main(void)
{
    char tmp[] = "/tmp/lens_test_moe_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    check_identities();
    check_load_errors(tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "remove %s", tmp);
    return check_done("test_moe");
}
