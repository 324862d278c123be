/* qwen3_moe.c - the Qwen3-MoE family (HF Qwen3MoeForCausalLM): Qwen3's
 * attention (per-head q_norm / k_norm) on the shared decoder block
 * (decoder.c), whose MLP is a mixture of experts (core/nn/moe.h: router
 * mlp.gate, experts mlp.experts.N.{gate,up,down}_proj, moe_intermediate_size
 * wide) on the layers Qwen3MoeDecoderLayer makes sparse:
 *   l not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0
 * and the dense mlp.{gate,up,down}_proj (intermediate_size) on the others.
 * The chosen weights are renormalised when norm_topk_prob. Qwen3-MoE has no
 * shared experts (Qwen2-MoE's shared_expert is not in Qwen3MoeConfig).
 * Presets: 30b-a3b = Qwen3-30B-A3B. */
#include <jansson.h>
#include <string.h>

#include "core/model/decoder.h"

static const lens_config_key qwen3_moe_keys[] = {
    LENS_DECODER_HEAD_DIM(.def = 1, .def_dim = LENS_D_DH), LENS_DECODER_SILU, LENS_DECODER_TIE(0),
    LENS_DECODER_ATTENTION_BIAS,
    LENS_KEY("use_sliding_window", LENS_KEY_BOOL, LENS_KEY_CHECK_ONLY, .flags = LENS_KEY_ONLY_DEFAULT),
    LENS_KEY(NULL, LENS_KEY_INT, LENS_C(qk_norm), .def = 1), LENS_DECODER_EXPERTS("num_experts", 128),
    LENS_DECODER_NORM_TOPK,
    LENS_KEY("moe_intermediate_size", LENS_KEY_INT, LENS_C(d_ff_expert), .def = 768, .min = 1, .max = 1 << 20),
    LENS_KEY("decoder_sparse_step", LENS_KEY_INT, LENS_C(moe_step), .def = 1, .min = 1, .max = 1 << 20),
    {0}};

/* mlp_only_layers: null or a list of layer indices. */
static int qwen3_moe_config_hook(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    const json_t *list = json_object_get(root, "mlp_only_layers");
    if (list && !json_is_null(list) && !json_is_array(list))
        return lens_fail(err, LENS_EFORMAT, "%s: \"mlp_only_layers\" must be a list of layer indices", path);
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v)
    {
        const json_int_t l = json_is_integer(v) ? json_integer_value(v) : -1;
        if (l < 0 || l >= cfg->n_layers || l >= LENS_MOE_MAX_LAYERS)
            return lens_fail(err, LENS_EFORMAT, "%s: \"mlp_only_layers\"[%zu] is not a layer index below %d", path, i,
                             cfg->n_layers < LENS_MOE_MAX_LAYERS ? cfg->n_layers : LENS_MOE_MAX_LAYERS);
        cfg->mlp_only[l / 8] |= (unsigned char)(1u << (l % 8));
    }
    return lens_decoder_config_hook(root, path, cfg, err);
}

static int qwen3_moe_config_extra(json_t *root, const lens_config *c)
{
    json_t *list = json_array();
    for (int l = 0; list && l < c->n_layers && l < LENS_MOE_MAX_LAYERS; l++)
        if (c->mlp_only[l / 8] >> (l % 8) & 1) json_array_append_new(list, json_integer(l));
    return !list || json_object_set_new(root, "mlp_only_layers", list) || lens_decoder_config_extra(root, c);
}

static const lens_tensor_row qwen3_moe_router_rows[] = {
    LENS_ROW("mlp.gate", LENS_B(router), LENS_T_LINEAR_NB, LENS_D_E, LENS_D_C, .when = LENS_IF_MOE), {0}};

static const lens_tensor_row qwen3_moe_expert_rows[] = {
    LENS_ROW("gate_proj", offsetof(lens_moe_expert, gate), LENS_T_LINEAR_NB, LENS_D_FE, LENS_D_C,
             .when = LENS_IF_MOE),
    LENS_ROW("up_proj", offsetof(lens_moe_expert, up), LENS_T_LINEAR_NB, LENS_D_FE, LENS_D_C, .when = LENS_IF_MOE),
    LENS_ROW("down_proj", offsetof(lens_moe_expert, down), LENS_T_LINEAR_NB, LENS_D_C, LENS_D_FE,
             .when = LENS_IF_MOE),
    {0}};

static const lens_tensor_section qwen3_moe_tensors[] = {
    {"", 0, lens_decoder_embedding_rows},
    {"model.layers.%d.", 1, lens_decoder_layer_rows},
    {"model.layers.%d.", 1, qwen3_moe_router_rows},
    {"model.layers.%d.mlp.experts.%d.", LENS_PER_EXPERT, qwen3_moe_expert_rows},
    {"", 0, lens_decoder_final_rows},
    {0}};

static void qwen3_moe_new_config(lens_config *c) { c->rope.theta = 1000000.0; }

/* micro / tiny: tests, layer 0 dense (mlp_only_layers [0]), layer 1 sparse */
static const lens_decoder_preset qwen3_moe_presets[] = {
    {"micro", 2, 32, 4, 2, 16, 64, 1000, 256, 0, 0},
    {"tiny", 2, 128, 4, 2, 32, 256, 1000, 256, 0, 0},
    {"30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 0, 0},
    {0}};

static const lens_moe_preset qwen3_moe_moe[] = {
    {"micro", 4, 2, 16}, {"tiny", 8, 2, 64}, {"30b-a3b", 128, 8, 768}, {0}};

static int qwen3_moe_preset(lens_config *c, const char *name)
{
    if (lens_moe_apply_preset(qwen3_moe_presets, qwen3_moe_moe, name, c)) return -1;
    c->norm_topk = 1;
    if (strcmp(name, "30b-a3b")) c->mlp_only[0] = 1; /* layer 0 */
    return 0;
}

const lens_family lens_family_qwen3_moe = {
    .model_type = "qwen3_moe",
    .default_arch = "Qwen3MoeForCausalLM",
    .task_archs = {[LENS_TASK_ENCODER] = "Qwen3MoeModel", [LENS_TASK_CAUSAL_LM] = "Qwen3MoeForCausalLM"},
    .keys = {lens_hf_size_keys, lens_decoder_keys, qwen3_moe_keys},
    .base_prefix = "model.",
    .caps = LENS_CAP_CAUSAL | LENS_CAP_PRE_NORM | LENS_CAP_BYTE_BPE,
    .config_hook = qwen3_moe_config_hook,
    .tensors = qwen3_moe_tensors,
    .block = lens_decoder_block,
    .writer = &(const lens_family_writer){.new_config = qwen3_moe_new_config, .preset = qwen3_moe_preset,
                                          .preset_names = "micro, tiny, 30b-a3b", .default_task = LENS_TASK_CAUSAL_LM,
                                          .config_constants = "{\"attention_dropout\": 0.0}",
                                          .config_extra = qwen3_moe_config_extra, .bpe_last = "<|endoftext|>"},
};
