/* qwen.c - the Qwen2 and Qwen3 families (HF Qwen2ForCausalLM,
 * Qwen3ForCausalLM) on the shared decoder block (decoder.c).
 *
 * Config keys: the common decoder keys (decoder.h) plus
 *   qwen2  hidden_act (silu); q/k/v always have biases, o_proj none;
 *          use_sliding_window (only false is supported: Qwen2.5 ships it off)
 *   qwen3  hidden_act, attention_bias (q/k/v/o, default false), per-head
 *          RMSNorm self_attn.q_norm / k_norm on q and k before RoPE,
 *          head_dim (Qwen3Config's default 128 when absent), use_sliding_window
 * Presets: qwen2 1b = Qwen2.5-1.5B, 8b = Qwen2.5-7B; qwen3 1b = Qwen3-1.7B,
 * 8b = Qwen3-8B. */
#include <jansson.h>
#include <string.h>

#include "core/model/decoder.h"

static int no_sliding(json_t *root, const char *path, lens_err *err)
{
    if (json_is_true(json_object_get(root, "use_sliding_window")))
        return lens_fail(err, LENS_EFORMAT, "%s: use_sliding_window true is not supported for Qwen", path);
    return 0;
}

static int qwen2_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (lens_decoder_parse_keys(root, path, cfg, 0, err) ||
        lens_decoder_parse_act(root, path, "hidden_act", "silu", cfg, err) || no_sliding(root, path, err))
        return -1;
    cfg->qkv_bias = 1;
    return lens_config_task(root, path, cfg, err);
}

static int qwen3_parse_config(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    json_t *hd = json_object_get(root, "head_dim");
    if (!hd || json_is_null(hd)) json_object_set_new(root, "head_dim", json_integer(128));
    if (lens_decoder_parse_keys(root, path, cfg, 0, err) ||
        lens_decoder_parse_act(root, path, "hidden_act", "silu", cfg, err) || no_sliding(root, path, err))
        return -1;
    cfg->qkv_bias = cfg->o_bias = json_is_true(json_object_get(root, "attention_bias"));
    cfg->qk_norm = 1;
    return lens_config_task(root, path, cfg, err);
}

static int qwen_new_config(lens_config *c, const char *task, const char *arch, lens_err *err)
{
    if (lens_decoder_new_config(c, task, arch, err)) return -1;
    c->rope.theta = 1000000.0;
    return 0;
}

static int qwen2_new_config(lens_config *c, const char *task, lens_err *err)
{
    if (qwen_new_config(c, task, "Qwen2ForCausalLM", err)) return -1;
    c->qkv_bias = 1;
    return 0;
}

static int qwen3_new_config(lens_config *c, const char *task, lens_err *err)
{
    if (qwen_new_config(c, task, "Qwen3ForCausalLM", err)) return -1;
    c->qk_norm = 1;
    return 0;
}

static void qwen_write_config(FILE *f, const lens_config *c, int random_weights, const char *model_type)
{
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"hidden_act\": \"silu\",\n"
            "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n",
            c->architecture, model_type);
    if (c->qk_norm) fprintf(f, "  \"attention_bias\": %s,\n", c->o_bias ? "true" : "false");
    lens_decoder_write_common(f, c);
    lens_write_task_tail(f, c, random_weights);
}

static void qwen2_write_config(FILE *f, const lens_config *c, int random_weights)
{
    qwen_write_config(f, c, random_weights, "qwen2");
}

static void qwen3_write_config(FILE *f, const lens_config *c, int random_weights)
{
    qwen_write_config(f, c, random_weights, "qwen3");
}

static const lens_decoder_preset qwen2_presets[] = {
    {"micro", 2, 32, 4, 2, 8, 64, 1000, 256, 0, 1},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 0, 1},
    {"1b", 28, 1536, 12, 2, 128, 8960, 151936, 32768, 0, 1},
    {"8b", 28, 3584, 28, 4, 128, 18944, 152064, 32768, 0, 0},
    {0}};

/* head_dim 16 with hidden 32 / 4 heads: NH * DK = 64 != C, as Qwen3's 128 x 32 != 4096 */
static const lens_decoder_preset qwen3_presets[] = {
    {"micro", 2, 32, 4, 2, 16, 64, 1000, 256, 0, 1},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 0, 1},
    {"1b", 28, 2048, 16, 8, 128, 6144, 151936, 40960, 0, 1},
    {"8b", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 0, 0},
    {0}};

static int qwen2_preset(lens_config *c, const char *name) { return lens_decoder_apply_preset(qwen2_presets, name, c); }
static int qwen3_preset(lens_config *c, const char *name) { return lens_decoder_apply_preset(qwen3_presets, name, c); }

#define QWEN_FAMILY LENS_DECODER_FAMILY_FNS, .bpe_last = "<|endoftext|>", .preset_names = "micro, tiny, 1b, 8b"

const lens_family lens_family_qwen2 = {
    .model_type = "qwen2",
    .default_arch = "Qwen2ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Qwen2Model", [LENS_TASK_CAUSAL_LM] = "Qwen2ForCausalLM"},
    .parse_config = qwen2_parse_config,
    .new_config = qwen2_new_config,
    .write_config = qwen2_write_config,
    .preset = qwen2_preset,
    QWEN_FAMILY,
};

const lens_family lens_family_qwen3 = {
    .model_type = "qwen3",
    .default_arch = "Qwen3ForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Qwen3Model", [LENS_TASK_CAUSAL_LM] = "Qwen3ForCausalLM"},
    .parse_config = qwen3_parse_config,
    .new_config = qwen3_new_config,
    .write_config = qwen3_write_config,
    .preset = qwen3_preset,
    QWEN_FAMILY,
};
