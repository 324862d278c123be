/* gemma.c - the Gemma and Gemma 2 families (HF GemmaForCausalLM,
 * Gemma2ForCausalLM) on the shared decoder block (decoder.c).
 *
 * Both: RMSNorm gain 1 + w (GemmaRMSNorm), embeddings times sqrt(C) (HF's
 * normalizer, a tensor in the model dtype: float32 here), GeGLU with the
 * tanh GELU, tied LM head, head_dim (default 256).
 * Config keys: the common decoder keys (decoder.h) plus
 *   gemma    hidden_activation (default gelu_pytorch_tanh), attention_bias
 *   gemma2   + query_pre_attn_scalar (scores scaled by its -1/2 power),
 *            attn_logit_softcapping, final_logit_softcapping (null = off),
 *            sliding_window on even layers (HF: layer_idx % 2 == 0 is local),
 *            pre_feedforward_layernorm and post-norms after attention and MLP
 * Presets: gemma 1b = gemma-2b, 8b = gemma-7b; gemma2 1b = gemma-2-2b,
 * 8b = gemma-2-9b. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/model/decoder.h"

static int gemma_keys(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    json_t *hd = json_object_get(root, "head_dim");
    if (!hd || json_is_null(hd)) json_object_set_new(root, "head_dim", json_integer(256));
    if (lens_decoder_parse_keys(root, path, cfg, 1, err)) return -1;
    const char *act = lens_json_str(root, "hidden_activation") ? "hidden_activation" : "hidden_act";
    if (lens_decoder_parse_act(root, path, act, "gelu_pytorch_tanh", cfg, err)) return -1;
    cfg->qkv_bias = cfg->o_bias = json_is_true(json_object_get(root, "attention_bias"));
    cfg->norm_unit_offset = 1;
    cfg->emb_scale = (float)sqrt((double)cfg->d_model);
    return 0;
}

static int softcap(json_t *root, const char *path, const char *key, float fallback, float *out, lens_err *err)
{
    json_t *v = json_object_get(root, key);
    *out = !v ? fallback : json_is_null(v) ? 0.0f : (float)json_number_value(v);
    if (v && !json_is_null(v) && !(json_is_number(v) && *out > 0))
        return lens_fail(err, LENS_EFORMAT, "%s: %s must be a number > 0 or null", path, key);
    return 0;
}

static int gemma_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (gemma_keys(root, path, cfg, err)) return -1;
    return lens_config_task(root, path, cfg, err);
}

static int gemma2_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (gemma_keys(root, path, cfg, err) || lens_decoder_parse_window(root, path, cfg, err) ||
        softcap(root, path, "attn_logit_softcapping", 50.0f, &cfg->attn_softcap, err) ||
        softcap(root, path, "final_logit_softcapping", 30.0f, &cfg->final_softcap, err))
        return -1;
    json_t *q = json_object_get(root, "query_pre_attn_scalar");
    cfg->query_pre_attn_scalar = json_is_number(q) ? (float)json_number_value(q) : 256.0f;
    if (!(cfg->query_pre_attn_scalar > 0))
        return lens_fail(err, LENS_EFORMAT, "%s: query_pre_attn_scalar must be > 0", path);
    cfg->sliding_alternate = 1;
    cfg->post_norms = 1;
    return lens_config_task(root, path, cfg, err);
}

static int gemma_new_config(lens_config *c, const char *task, const char *arch, lens_err *err)
{
    if (lens_decoder_new_config(c, task, arch, err)) return -1;
    c->norm_unit_offset = 1, c->glu = LENS_GLU_GELU_TANH;
    return 0;
}

static int gemma1_new_config(lens_config *c, const char *task, lens_err *err)
{
    return gemma_new_config(c, task, "GemmaForCausalLM", err);
}

static int gemma2_new_config(lens_config *c, const char *task, lens_err *err)
{
    if (gemma_new_config(c, task, "Gemma2ForCausalLM", err)) return -1;
    c->attn_softcap = 50.0f, c->final_softcap = 30.0f, c->sliding_alternate = 1, c->post_norms = 1;
    return 0;
}

static void gemma_write_head(FILE *f, const lens_config *c, const char *model_type)
{
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"hidden_activation\": \"gelu_pytorch_tanh\",\n  \"hidden_act\": \"gelu_pytorch_tanh\",\n"
            "  \"attention_bias\": false,\n",
            c->architecture, model_type);
    lens_decoder_write_common(f, c);
}

static void gemma_write_config(FILE *f, const lens_config *c, int random_weights)
{
    gemma_write_head(f, c, "gemma");
    lens_write_task_tail(f, c, random_weights);
}

static void gemma2_write_config(FILE *f, const lens_config *c, int random_weights)
{
    gemma_write_head(f, c, "gemma2");
    fprintf(f,
            "  \"query_pre_attn_scalar\": %g,\n  \"attn_logit_softcapping\": %g,\n"
            "  \"final_logit_softcapping\": %g,\n  \"sliding_window\": %d,\n",
            (double)c->query_pre_attn_scalar, (double)c->attn_softcap, (double)c->final_softcap, c->sliding_window);
    lens_write_task_tail(f, c, random_weights);
}

/* micro: head_dim 16 over hidden 32 and one kv head (gemma-2b is MQA). */
static const lens_decoder_preset gemma_presets[] = {
    {"micro", 2, 32, 4, 1, 16, 64, 1000, 256, 0, 1},
    {"tiny", 2, 128, 4, 1, 32, 256, 1000, 256, 0, 1},
    {"1b", 18, 2048, 8, 1, 256, 16384, 256000, 8192, 0, 1},
    {"8b", 28, 3072, 16, 16, 256, 24576, 256000, 8192, 0, 1},
    {0}};

static const lens_decoder_preset gemma2_presets[] = {
    {"micro", 2, 32, 4, 2, 16, 64, 1000, 256, 4, 1},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 16, 1},
    {"1b", 26, 2304, 8, 4, 256, 9216, 256000, 8192, 4096, 1},
    {"8b", 42, 3584, 16, 8, 256, 14336, 256000, 8192, 4096, 1},
    {0}};

static int gemma_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(gemma_presets, name, c)) return -1;
    c->emb_scale = (float)sqrt((double)c->d_model);
    return 0;
}

static int gemma2_preset(lens_config *c, const char *name)
{
    if (lens_decoder_apply_preset(gemma2_presets, name, c)) return -1;
    c->emb_scale = (float)sqrt((double)c->d_model);
    c->query_pre_attn_scalar = (float)c->d_head_k; /* gemma-2-2b / 9b: 256 = head_dim */
    if (!strcmp(name, "micro")) c->attn_softcap = 5.0f, c->final_softcap = 3.0f; /* caps the test scores reach */
    return 0;
}

#define GEMMA_FAMILY LENS_DECODER_FAMILY_FNS, .bpe_last = "<eos>", .preset_names = "micro, tiny, 1b, 8b"

const lens_family lens_family_gemma = {
    .model_type = "gemma",
    .default_arch = "GemmaForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "GemmaModel", [LENS_TASK_CAUSAL_LM] = "GemmaForCausalLM"},
    .parse_config = gemma_parse_config,
    .new_config = gemma1_new_config,
    .write_config = gemma_write_config,
    .preset = gemma_preset,
    GEMMA_FAMILY,
};

const lens_family lens_family_gemma2 = {
    .model_type = "gemma2",
    .default_arch = "Gemma2ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Gemma2Model", [LENS_TASK_CAUSAL_LM] = "Gemma2ForCausalLM"},
    .parse_config = gemma2_parse_config,
    .new_config = gemma2_new_config,
    .write_config = gemma2_write_config,
    .preset = gemma2_preset,
    GEMMA_FAMILY,
};
