/* test_tables.c - the families' names and configs as data (core/model/arch.h).
 *
 *  - the generic tensor walker on a hand-written Phi-3-style table: a fused
 *    qkv_proj [(NH + 2 NKV) DK][C] and gate_up_proj [2F][C] are one row each
 *    and bind as views (q, k, v rows; gate then up), a Conv1D fused map
 *    binds column views (GPT-2's c_attn), "%d" is the layer index, rows
 *    and biases follow their conditions, and the summed-heads weight is
 *    [C][DV];
 *  - every family and task: config.json written through the key table
 *    (jansson, sorted) loads back into the same lens_config, and a config
 *    mkmodel writes loads again after lens_config_save;
 *  - hostile keys: a wrong type, a value out of range, a value whose math
 *    lensd does not do, an unknown activation and a missing key are each
 *    refused with a message naming the key (the family tables' own rows);
 *  - a multimodal wrapper's text tower: gemma-3-4b-it's config.json
 *    (Gemma3ForConditionalGeneration, a sparse text_config) reads as the
 *    4b text model over Gemma3TextConfig's defaults, and a gemma3_text
 *    checkpoint renamed into either wrapper layout (plus a vision tensor)
 *    gives the logits of the original bit for bit. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "family_cases.h"
#include "core/model/arch.h"
#include "core/io/safetensors.h"
#include "core/model/mkmodel.h"
#include "core/model/model.h"

/* ------------------------------------------------------------ tensor walker */

/* A visitor handing out consecutive slices of one float buffer and keeping
 * the descriptors it was shown. */
typedef struct {
    lens_param_visitor v; /* first member */
    float *buf;
    size_t used, cap;
    lens_param_desc seen[32];
    char names[32][96];
    const float *data[32];
    int n;
} recorder;

static const void *record(lens_param_visitor *v, const lens_param_desc *d)
{
    recorder *r = (recorder *)v;
    const size_t count = (size_t)d->shape[0] * (size_t)(d->ndim == 2 ? d->shape[1] : 1);
    if (r->n == 32 || r->used + count > r->cap) {
        v->failed = 1;
        return NULL;
    }
    snprintf(r->names[r->n], sizeof r->names[0], "%s", d->name);
    r->seen[r->n] = *d;
    r->data[r->n] = r->buf + r->used;
    r->n++;
    r->used += count;
    return r->buf + r->used - count;
}

static int find(const recorder *r, const char *name)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->names[i], name)) return i;
    return -1;
}

/* Phi-3's attention and MLP as its HF names have them. */
static const lens_tensor_row phi3_layer_rows[] = {
    LENS_ROW("self_attn.qkv_proj", 0, LENS_T_LINEAR_NB, LENS_D_QKV, LENS_D_C, .split = LENS_SPLIT_QKV),
    LENS_ROW("self_attn.q_norm", LENS_B(q_norm), LENS_T_RMSNORM, LENS_D_DK, LENS_D_NONE, .when = LENS_IF_QK_NORM),
    LENS_ROW("mlp.gate_up_proj", 0, LENS_T_LINEAR_NB, LENS_D_2F, LENS_D_C, .split = LENS_SPLIT_GATE_UP,
             .bias_if = LENS_IF_QKV_BIAS),
    {0}};
static const lens_tensor_row conv_rows[] = {
    LENS_ROW("c_attn", 0, LENS_T_CONV1D, LENS_D_QKV, LENS_D_C, .split = LENS_SPLIT_QKV), {0}};
static const lens_tensor_row summed_rows[] = {
    LENS_ROW("dense", LENS_B(attn_out), LENS_T_LINEAR, LENS_D_C, LENS_D_VO, .summed = 1), {0}};
static const lens_tensor_row head_rows[] = {
    LENS_ROW("lm_head", LENS_P(lm_head), LENS_T_LINEAR_NB, LENS_D_V, LENS_D_C, .when = LENS_IF_UNTIED_LM), {0}};

static void test_fused_rows(void)
{
    static const lens_tensor_section phi3[] = {
        {"model.layers.%d.", 1, phi3_layer_rows}, {"", 0, head_rows}, {0}};
    const lens_family fake = {.model_type = "phi3-test", .tensors = phi3};
    const int C = 16, NH = 4, NKV = 2, DK = 4, F = 24;
    lens_config c = {.family = &fake, .task = LENS_TASK_CAUSAL_LM, .n_layers = 2, .n_heads = NH, .n_kv_heads = NKV,
                     .d_model = C, .d_head_k = DK, .d_head_v = DK, .d_ff = F, .vocab_size = 10,
                     .tie_word_embeddings = 1};
    lens_block blocks[2] = {0};
    lens_params p = {.blocks = blocks};
    static float buf[1 << 14];
    recorder r = {.v = {.tensor = record}, .buf = buf, .cap = sizeof buf / sizeof *buf};
    lens_walk_params(&c, &p, &r.v);
    CHECK(!r.v.failed && r.n == 4, "fused table: %d tensors walked (want 2 layers x qkv, gate_up)", r.n);
    const int qkv = find(&r, "model.layers.1.self_attn.qkv_proj.weight");
    const int gu = find(&r, "model.layers.1.mlp.gate_up_proj.weight");
    CHECK(qkv >= 0 && gu >= 0 && find(&r, "model.layers.0.self_attn.qkv_proj.weight") >= 0,
          "the layer index replaces %%d in the section prefix");
    if (qkv < 0 || gu < 0) return;
    CHECK(r.seen[qkv].shape[0] == (NH + 2 * NKV) * DK && r.seen[qkv].shape[1] == C, "qkv_proj [(NH+2NKV)DK][C]: [%lld][%lld]",
          (long long)r.seen[qkv].shape[0], (long long)r.seen[qkv].shape[1]);
    CHECK(r.seen[gu].shape[0] == 2 * F && r.seen[gu].shape[1] == C, "gate_up_proj [2F][C]");
    const lens_block *b = &blocks[1];
    const float *w = r.data[qkv];
    CHECK(b->q.w == w && b->k.w == w + (size_t)NH * DK * C && b->v.w == w + (size_t)(NH + NKV) * DK * C,
          "q, k, v are row blocks of qkv_proj");
    CHECK(b->q.out == NH * DK && b->k.out == NKV * DK && b->v.out == NKV * DK && b->q.in == C && b->k.ld == C &&
              !b->q.w_in_out && !b->q.b,
          "q, k, v views: out NH*DK, NKV*DK, NKV*DK, in C, row stride C, no bias");
    CHECK(b->gate.w == r.data[gu] && b->ff_in.w == r.data[gu] + (size_t)F * C && b->gate.out == F && b->ff_in.out == F,
          "gate then up: the two row halves of gate_up_proj (HF's chunk(2))");
    CHECK(!b->q_norm.w && !p.lm_head.w, "rows whose condition fails are not walked (qk_norm, tied head)");

    /* conditions on: q_norm, the conditional bias, the untied head */
    c.qk_norm = 1, c.qkv_bias = 1, c.tie_word_embeddings = 0, c.n_layers = 1;
    r.n = 0, r.used = 0;
    lens_walk_params(&c, &p, &r.v);
    const int gb = find(&r, "model.layers.0.mlp.gate_up_proj.bias");
    CHECK(find(&r, "model.layers.0.self_attn.q_norm.weight") >= 0 && gb >= 0 && find(&r, "lm_head.weight") >= 0 &&
              r.n == 5,
          "conditions on: q_norm, the gate_up bias (bias_if) and lm_head are walked (%d tensors)", r.n);
    if (gb >= 0) CHECK(blocks[0].gate.b == r.data[gb] && blocks[0].ff_in.b == r.data[gb] + F, "bias views follow the split");

    /* a Conv1D fused map: column blocks of [C][3C] (GPT-2's c_attn) */
    static const lens_tensor_section conv[] = {{"h.%d.", 1, conv_rows}, {0}};
    const lens_family conv_family = {.model_type = "conv-test", .tensors = conv};
    lens_config g = {.family = &conv_family, .n_layers = 1, .n_heads = 2, .d_model = 8, .d_head_k = 4, .d_head_v = 4};
    r.n = 0, r.used = 0;
    lens_walk_params(&g, &p, &r.v);
    const int ca = find(&r, "h.0.c_attn.weight"), cb = find(&r, "h.0.c_attn.bias");
    CHECK(ca >= 0 && cb >= 0 && r.seen[ca].shape[0] == 8 && r.seen[ca].shape[1] == 24, "c_attn stored [C][3C]");
    if (ca >= 0 && cb >= 0)
        CHECK(blocks[0].k.w == r.data[ca] + 8 && blocks[0].v.w == r.data[ca] + 16 && blocks[0].k.ld == 24 &&
                  blocks[0].k.w_in_out && blocks[0].v.b == r.data[cb] + 16,
              "Conv1D views: column blocks, row stride 3C, bias slices");

    /* summed heads: the output weight is [C][DV] in the file */
    static const lens_tensor_section summed[] = {{"", 1, summed_rows}, {0}};
    const lens_family summed_family = {.model_type = "summed-test", .tensors = summed};
    lens_config s = {.family = &summed_family, .n_layers = 1, .n_heads = 4, .d_model = 8, .d_head_k = 2,
                     .d_head_v = 3, .head_combination = LENS_HEADS_SUM};
    r.n = 0, r.used = 0;
    lens_walk_params(&s, &p, &r.v);
    CHECK(r.n == 2 && r.seen[0].summed && r.seen[0].shape[0] == 8 && r.seen[0].shape[1] == 3 &&
              blocks[0].attn_out.in == 12 && blocks[0].attn_out.ld == 3,
          "summed heads: weight [C][DV] marked summed, the map NH*DV -> C with row stride DV");
}

/* ------------------------------------------------------------ config keys */

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* The lens_config fields a family's keys set, compared as one. */
static int same_config(const lens_config *a, const lens_config *b)
{
    int same = a->family == b->family && a->task == b->task && !strcmp(a->architecture, b->architecture) &&
               a->n_layers == b->n_layers && a->n_heads == b->n_heads && a->d_model == b->d_model &&
               a->d_ff == b->d_ff && a->d_head_k == b->d_head_k && a->d_head_v == b->d_head_v &&
               a->head_combination == b->head_combination && a->scale_by_dv == b->scale_by_dv &&
               a->attn_scale == b->attn_scale && a->vocab_size == b->vocab_size &&
               a->max_positions == b->max_positions && a->type_vocab_size == b->type_vocab_size &&
               a->ln_eps == b->ln_eps && a->gelu_tanh == b->gelu_tanh && a->head_relu == b->head_relu &&
               a->position_offset == b->position_offset && a->pad_token_id == b->pad_token_id &&
               a->n_labels == b->n_labels && a->random_weights == b->random_weights &&
               lens_kv_heads(a) == lens_kv_heads(b) && !memcmp(&a->rope, &b->rope, sizeof a->rope) &&
               a->norm_rms == b->norm_rms && a->norm_unit_offset == b->norm_unit_offset && a->glu == b->glu &&
               a->qkv_bias == b->qkv_bias && a->o_bias == b->o_bias && a->qk_norm == b->qk_norm &&
               a->post_norms == b->post_norms && a->parallel_residual == b->parallel_residual &&
               a->sliding_window == b->sliding_window && a->sliding_pattern == b->sliding_pattern &&
               a->sliding_pattern_offset == b->sliding_pattern_offset &&
               a->window_bidirectional == b->window_bidirectional &&
               !memcmp(&a->rope_local, &b->rope_local, sizeof a->rope_local) &&
               a->attn_softcap == b->attn_softcap && a->final_softcap == b->final_softcap &&
               a->query_pre_attn_scalar == b->query_pre_attn_scalar && a->emb_scale == b->emb_scale &&
               a->tie_word_embeddings == b->tie_word_embeddings;
    for (int i = 0; same && i < a->n_labels; i++) same = !strcmp(a->labels[i], b->labels[i]);
    return same;
}

/* config.json with member key set to value (JSON text; NULL removes it). */
static int write_variant(const char *from, const char *to, const char *key, const char *value)
{
    json_t *root = json_load_file(from, 0, NULL), *v = value ? json_loads(value, JSON_DECODE_ANY, NULL) : NULL;
    int rc = !root || (value && !v);
    if (!rc) rc = value ? json_object_set(root, key, v) : json_object_del(root, key);
    if (!rc) rc = json_dump_file(root, to, JSON_INDENT(2));
    json_decref(root), json_decref(v);
    return rc;
}

/* What each family refuses, by a key of its table. */
static const struct {
    const char *arch, *key, *value, *needle;
} hostile[] = {
    {"bert", "hidden_size", "\"big\"", "\"hidden_size\" must be an integer"},
    {"bert", "vocab_size", NULL, "missing \"vocab_size\""},
    {"bert", "position_embedding_type", "\"relative_key\"", "\"position_embedding_type\" = \"relative_key\""},
    {"bert", "hidden_act", "\"relu\"", "\"hidden_act\" = \"relu\" is not supported"},
    {"bert", "layer_norm_eps", "2", "\"layer_norm_eps\" = 2 is outside (0, 1)"},
    {"roberta", "pad_token_id", "5000", "\"pad_token_id\" = 5000 is outside [0, 999]"},
    {"distilbert", "n_heads", "3", "dim 16 is not a multiple of n_heads 3"},
    {"gpt2", "scale_attn_weights", "false", "\"scale_attn_weights\" = false is not supported"},
    {"gpt2", "reorder_and_upcast_attn", "true", "\"reorder_and_upcast_attn\" = true is not supported"},
    {"llama", "mlp_bias", "true", "\"mlp_bias\" = true is not supported"},
    {"llama", "num_key_value_heads", "3", "num_attention_heads 4 is not a multiple of num_key_value_heads 3"},
    {"llama", "num_key_value_heads", "8", "\"num_key_value_heads\" = 8 is outside [1, 4]"},
    {"llama", "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 2}", "rope_scaling type \"dynamic\""},
    {"llama", "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4, \"mscale\": 1}",
     "rope_scaling.mscale is not supported"},
    {"qwen2", "use_sliding_window", "true", "\"use_sliding_window\" = true is not supported"},
    {"gemma2", "attn_logit_softcapping", "0", "\"attn_logit_softcapping\" = 0 must be > 0"},
    {"gemma3_text", "layer_types", "[\"sliding_attention\", \"chunked_attention\", \"full_attention\"]",
     "\"layer_types\"[1] = \"chunked_attention\" is not supported"},
    {"gemma3_text", "layer_types", "[\"full_attention\", \"sliding_attention\", \"sliding_attention\"]",
     "\"layer_types\"[1] = \"sliding_attention\" breaks full attention every 1 layers"},
    {"gemma3_text", "layer_types", "[\"sliding_attention\"]", "\"layer_types\" must be a list of num_hidden_layers = 3"},
    {"gemma3_text", "use_bidirectional_attention", "true", "\"use_bidirectional_attention\" = true is not supported"},
    {"gemma3_text", "rope_parameters", "{}", "\"rope_parameters\" is not supported"},
    {"modernbert", "norm_bias", "true", "\"norm_bias\" = true is not supported"},
    {"modernbert", "mlp_bias", "true", "\"mlp_bias\" = true is not supported"},
    {"modernbert", "decoder_bias", "false", "\"decoder_bias\" = false is not supported"},
    {"modernbert", "classifier_pooling", "\"max\"", "\"classifier_pooling\" = \"max\" is not supported (cls, mean)"},
    {"modernbert", "hidden_size", "20", "head size 5 (hidden_size / num_attention_heads) must be even"},
    {"modernbert", "rope_parameters", "{}", "\"rope_parameters\" is not supported"},
    {"gpt_neox", "attention_bias", "false", "\"attention_bias\" = false is not supported"},
    {"gpt_neox", "rotary_pct", "1.5", "\"rotary_pct\" = 1.5 is outside [0, 1]"},
    {"mistral", "tie_word_embeddings", "\"yes\"", "\"tie_word_embeddings\" must be true or false"},
    {"phi3", "rope_scaling", "{\"type\": \"longrope\", \"short_factor\": [1], \"long_factor\": [1]}",
     "rope_scaling type \"longrope\""},
    {"phi3", "partial_rotary_factor", "0.2", "partial_rotary_factor 0.2 gives 1 rotary channels"},
    {"olmo2", "attention_bias", "1", "\"attention_bias\" must be true or false"},
    {"gpt_oss", "quantization_config", "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": []}",
     "\"quantization_config\" (quant_method \"mxfp4\") is not supported: lensd reads gpt-oss weights in BF16"},
    {"gpt_oss", "layer_types", "[\"full_attention\", \"sliding_attention\"]",
     "\"layer_types\"[1] = \"sliding_attention\" breaks full attention every 1 layers"},
    {"gpt_oss", "layer_types", "[\"sliding_attention\", \"chunked_attention\"]",
     "\"layer_types\"[1] = \"chunked_attention\" is not supported"},
    {"gpt_oss", "swiglu_limit", "10.0", "\"swiglu_limit\" = 10"},
    {"gpt_oss", "hidden_act", "\"gelu\"", "\"hidden_act\" = \"gelu\" is not supported"},
    {"gpt_oss", "rope_parameters", "{}", "\"rope_parameters\" is not supported"},
};

static void test_configs(const char *dir)
{
    char path[512], copy[512];
    snprintf(copy, sizeof copy, "%s/again.json", dir);
    for (int k = 0; k < N_FAMILY_CASES; k++) {
        char sub[400], what[96];
        snprintf(sub, sizeof sub, "%s/%s-%s", dir, family_cases[k].arch, family_cases[k].task);
        snprintf(what, sizeof what, "%s %s", family_cases[k].arch, family_cases[k].task);
        snprintf(path, sizeof path, "%s/config.json", sub);
        lens_err err = {0};
        lens_config a, b;
        if (lens_mkmodel(family_cases[k].arch, "micro", family_cases[k].task, 1, sub, &err) ||
            lens_config_load(path, &a, &err)) {
            CHECK(0, "%s: %s", what, err.msg);
            continue;
        }
        /* written back (no random-weights mark: the trainer's form) and read again */
        a.random_weights = 0;
        const int saved = lens_config_save(copy, &a, 0, NULL, &err) == 0 && lens_config_load(copy, &b, &err) == 0;
        CHECK(saved && same_config(&a, &b), "%s: config.json round trip: %s", what, saved ? "fields differ" : err.msg);
        if (saved) lens_config_free(&b);
        lens_config_free(&a);
    }
    for (size_t i = 0; i < sizeof hostile / sizeof *hostile; i++) {
        char sub[400];
        lens_err err = {0};
        lens_config c;
        const char *task = lens_family_find(hostile[i].arch)->task_archs[LENS_TASK_CLASSIFICATION] ? "classification"
                                                                                                     : "causal-lm";
        snprintf(sub, sizeof sub, "%s/%s-%s", dir, hostile[i].arch, task);
        snprintf(path, sizeof path, "%s/config.json", sub);
        int loaded = write_variant(path, copy, hostile[i].key, hostile[i].value) == 0 &&
                     lens_config_load(copy, &c, &err) == 0;
        CHECK(!loaded && err.code == LENS_EFORMAT && strstr(err.msg, hostile[i].needle) && strstr(err.msg, copy),
              "%s %s = %s: want an error with '%s', got: %s", hostile[i].arch, hostile[i].key,
              hostile[i].value ? hostile[i].value : "(absent)", hostile[i].needle, loaded ? "loaded" : err.msg);
        if (loaded) lens_config_free(&c);
    }
    CHECK(write_text(copy, "{\"model_type\": \"t5\"}") == 0, "write %s", copy);
    lens_config c;
    lens_err err = {0};
    CHECK(lens_config_load(copy, &c, &err) != 0 && strstr(err.msg, "unsupported model_type \"t5\""),
          "an unknown model_type is refused by name: %s", err.msg);
}

/* ------------------------------------------------------------ text towers */

/* google/gemma-3-4b-it's config.json as released (transformers 4.50). */
static const char gemma3_4b_it[] =
    "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"boi_token_index\": 255999,"
    " \"eoi_token_index\": 256000, \"eos_token_id\": [1, 106], \"image_token_index\": 262144,"
    " \"initializer_range\": 0.02, \"mm_tokens_per_image\": 256, \"model_type\": \"gemma3\","
    " \"text_config\": {\"hidden_size\": 2560, \"intermediate_size\": 10240, \"model_type\": \"gemma3_text\","
    " \"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"},"
    " \"sliding_window\": 1024}, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.50.0.dev0\","
    " \"vision_config\": {\"hidden_size\": 1152, \"image_size\": 896, \"intermediate_size\": 4304,"
    " \"model_type\": \"siglip_vision_model\", \"num_attention_heads\": 16, \"num_hidden_layers\": 27,"
    " \"patch_size\": 14, \"vision_use_head\": false}}";

/* dir/config.json: from's config as the text_config of a wrapper. */
static int write_wrapper_config(const char *from, const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *text = json_load_file(from, 0, NULL);
    json_t *root = json_pack("{s:[s], s:s, s:o?, s:{s:s, s:i}}", "architectures", "Gemma3ForConditionalGeneration",
                             "model_type", "gemma3", "text_config", text, "vision_config", "model_type",
                             "siglip_vision_model", "hidden_size", 8);
    int rc = !root || json_object_del(text, "architectures") || json_dump_file(root, path, JSON_INDENT(2));
    json_decref(root);
    return rc;
}

/* dir/model.safetensors: from's tensors under the wrapper's names (release:
 * "language_model." before every name; else after the base prefix
 * "model."), plus a vision tensor lensd must ignore. */
static int write_wrapper_weights(const char *from, const char *dir, int release)
{
    char path[600];
    lens_safetensors st;
    lens_err err = {0};
    if (lens_st_open(from, &st, &err)) return -1;
    lens_st_out *out = calloc((size_t)st.n_tensors + 1, sizeof *out);
    char (*names)[300] = calloc((size_t)st.n_tensors, sizeof *names);
    static const float vision[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int rc = !out || !names;
    for (int i = 0; !rc && i < st.n_tensors; i++) {
        const lens_st_tensor *t = &st.tensors[i];
        if (release) snprintf(names[i], sizeof names[i], "language_model.%s", t->name);
        else if (!strncmp(t->name, "model.", 6)) snprintf(names[i], sizeof names[i], "model.language_model.%s", t->name + 6);
        else snprintf(names[i], sizeof names[i], "%s", t->name);
        out[i] = (lens_st_out){.name = names[i], .ndim = t->ndim, .data = t->data, .dtype = t->dtype};
        memcpy(out[i].shape, t->shape, sizeof t->shape);
        rc = t->dtype != LENS_DT_F32;
    }
    if (!rc) {
        out[st.n_tensors] = (lens_st_out){.name = "vision_tower.vision_model.post_layernorm.weight", .ndim = 1,
                                          .shape = {8}, .data = vision};
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = lens_st_write(path, out, st.n_tensors + 1, &err);
    }
    free(out), free(names);
    lens_st_close(&st);
    return rc;
}

/* Logits of a fixed 12-token input, [T][V] (malloc'd), or NULL. */
static float *tower_logits(const char *dir, int *n)
{
    static const int ids[12] = {2, 17, 5, 9, 33, 60, 12, 8, 41, 3, 27, 19};
    static const int len = 12;
    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    CHECK(m != NULL, "load %s: %s", dir, err.msg);
    if (!m) return NULL;
    CHECK(m->cfg.task == LENS_TASK_CAUSAL_LM, "%s: a causal LM", dir);
    lens_batch b = {.n_seqs = 1, .lengths = &len, .ids = ids};
    lens_forward_opts o = {.keep = LENS_KEEP_LOGITS};
    lens_activations a = {0};
    float *logits = NULL;
    if (lens_forward(m, &b, &o, &a, &err) == 0) {
        *n = len * m->cfg.vocab_size;
        logits = malloc((size_t)*n * sizeof *logits);
        if (logits) memcpy(logits, a.logits, (size_t)*n * sizeof *logits);
    } else CHECK(0, "forward %s: %s", dir, err.msg);
    lens_activations_free(&a);
    lens_model_free(m);
    return logits;
}

static void test_text_tower(const char *dir)
{
    char path[600], sub[300], from[300];
    lens_config c;
    lens_err err = {0};
    snprintf(path, sizeof path, "%s/gemma3-4b-it.json", dir);
    CHECK(write_text(path, gemma3_4b_it) == 0, "write %s", path);
    if (lens_config_load(path, &c, &err)) {
        CHECK(0, "gemma-3-4b-it config.json: %s", err.msg);
    } else {
        CHECK(c.family == lens_family_find("gemma3_text") && c.text_tower && c.task == LENS_TASK_CAUSAL_LM &&
                  !strcmp(c.architecture, "Gemma3ForConditionalGeneration"),
              "gemma-3-4b-it reads as its gemma3_text tower, a causal LM named by the wrapper");
        CHECK(c.n_layers == 34 && c.d_model == 2560 && c.d_ff == 10240 && c.sliding_window == 1024 &&
                  c.rope.type == LENS_ROPE_LINEAR && c.rope.factor == 8,
              "its text_config's own keys: L %d C %d F %d window %d", c.n_layers, c.d_model, c.d_ff,
              c.sliding_window);
        CHECK(c.n_heads == 8 && lens_kv_heads(&c) == 4 && c.d_head_k == 256 && c.vocab_size == 262208 &&
                  c.rope.theta == 1e6 && c.rope_local.theta == 1e4 && c.sliding_pattern == 6 &&
                  c.query_pre_attn_scalar == 256 && c.max_positions == 131072 && c.tie_word_embeddings &&
                  c.attn_softcap == 0 && c.final_softcap == 0,
              "Gemma3TextConfig's defaults fill the rest: NH %d NKV %d DK %d V %d theta %g/%g pattern %d",
              c.n_heads, lens_kv_heads(&c), c.d_head_k, c.vocab_size, c.rope.theta, c.rope_local.theta,
              c.sliding_pattern);
        lens_config_free(&c);
    }
    CHECK(write_text(path, "{\"model_type\": \"gemma3\", \"architectures\": [\"Gemma3ForConditionalGeneration\"],"
                           " \"text_config\": {\"model_type\": \"t5\"}}") == 0,
          "write %s", path);
    CHECK(lens_config_load(path, &c, &err) != 0 && strstr(err.msg, "unsupported model_type \"gemma3\""),
          "a wrapper whose tower is no family is refused: %s", err.msg);

    snprintf(from, sizeof from, "%s/g3", dir);
    if (lens_mkmodel("gemma3_text", "micro", "causal-lm", 7, from, &err)) {
        CHECK(0, "mkmodel gemma3_text: %s", err.msg);
        return;
    }
    int n = 0;
    float *want = tower_logits(from, &n);
    for (int release = 0; want && release < 2; release++) {
        snprintf(sub, sizeof sub, "%s/g3-wrapped-%d", dir, release);
        snprintf(path, sizeof path, "%s/config.json", from);
        char weights[600];
        snprintf(weights, sizeof weights, "%s/model.safetensors", from);
        int made = mkdir(sub, 0700) == 0 && write_wrapper_config(path, sub) == 0 &&
                   write_wrapper_weights(weights, sub, release) == 0;
        CHECK(made, "write %s", sub);
        int m = 0;
        float *got = made ? tower_logits(sub, &m) : NULL;
        CHECK(got && m == n && !memcmp(got, want, (size_t)n * sizeof *got),
              "the %s layout's text tower gives the gemma3_text logits bit for bit",
              release ? "release (language_model.model.*)" : "transformers >= 4.52 (model.language_model.*)");
        free(got);
    }
    free(want);
}

int main(void)
{
    family_cases_check();
    test_fused_rows();
    char dir[] = "/tmp/lensd-tables-XXXXXX", cmd[600];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return check_done("test_tables");
    }
    test_configs(dir);
    test_text_tower(dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_done("test_tables");
}
