/* config.c - reading a Hugging Face config.json into lens_config.
 *
 * Supported model types: "bert" (BertModel, BertForSequenceClassification,
 * BertForMaskedLM) and "gpt2" (GPT2Model, GPT2LMHeadModel). The identifiable
 * encoder variant adds optional keys to a bert config: "head_dim_key",
 * "head_dim_value" (per-head key / value sizes) and "head_combination"
 * ("concat" | "sum" | "sum_adjacent"); see docs/identifiable-encoder.md. */
#include "core/model/model.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* An integer field that must be present (fallback < 0) or defaults. */
static int get_int(json_t *root, const char *path, const char *key, int fallback,
                   int min, int max, int *out, lens_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (fallback < 0) return lens_fail(err, LENS_EFORMAT, "%s: missing \"%s\"", path, key);
        *out = fallback;
        return 0;
    }
    if (!json_is_integer(v)) return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" = %lld is outside [%d, %d]", path, key,
                         (long long)x, min, max);
    *out = (int)x;
    return 0;
}

static int get_float(json_t *root, const char *path, const char *key, double fallback,
                     float *out, lens_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = (float)fallback;
        return 0;
    }
    if (!json_is_number(v)) return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" must be a number", path, key);
    double x = json_number_value(v);
    if (!(x > 0 && x < 1)) return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" = %g is outside (0, 1)", path, key, x);
    *out = (float)x;
    return 0;
}

static const char *get_str(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* "gelu" is exact erf GELU in HF; the tanh forms are gelu_new & friends. */
static int parse_activation(const char *path, const char *act, int *gelu_tanh, lens_err *err)
{
    if (strcmp(act, "gelu") == 0) *gelu_tanh = 0;
    else if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_fast"))
        *gelu_tanh = 1;
    else return lens_fail(err, LENS_EFORMAT, "%s: unsupported activation \"%s\"", path, act);
    return 0;
}

static int parse_labels(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    json_t *id2label = json_object_get(root, "id2label");
    int n = (int)json_object_size(id2label);
    if (!json_is_object(id2label) || n == 0) {
        /* HF defaults to LABEL_0, LABEL_1 for classifiers without names */
        n = 2;
        id2label = NULL;
    }
    if (n > 100000) return lens_fail(err, LENS_EFORMAT, "%s: too many labels (%d)", path, n);
    cfg->labels = calloc((size_t)n, sizeof *cfg->labels);
    if (!cfg->labels) return lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
    cfg->n_labels = n;
    for (int i = 0; i < n; i++) {
        char key[32], name[32];
        snprintf(key, sizeof key, "%d", i);
        json_t *v = id2label ? json_object_get(id2label, key) : NULL;
        if (id2label && !json_is_string(v))
            return lens_fail(err, LENS_EFORMAT, "%s: id2label must map \"0\"..\"%d\" to strings", path, n - 1);
        snprintf(name, sizeof name, "LABEL_%d", i);
        cfg->labels[i] = strdup(v ? json_string_value(v) : name);
        if (!cfg->labels[i]) return lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
    }
    return 0;
}

int lens_head_combination_parse(const char *name, int *combine)
{
    static const char *const names[] = {"concat", "sum", "sum_adjacent"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) {
            *combine = i;
            return 0;
        }
    return -1;
}

const char *lens_head_combination_name(int combine)
{
    return combine == LENS_HEADS_SUM ? "sum" : combine == LENS_HEADS_SUM_ADJACENT ? "sum_adjacent" : "concat";
}

static int parse_bert(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    cfg->arch = LENS_ARCH_BERT;
    if (get_int(root, path, "hidden_size", -1, 1, 1 << 16, &cfg->d_model, err) ||
        get_int(root, path, "num_hidden_layers", -1, 1, 1024, &cfg->n_layers, err) ||
        get_int(root, path, "num_attention_heads", -1, 1, 1024, &cfg->n_heads, err) ||
        get_int(root, path, "intermediate_size", -1, 1, 1 << 20, &cfg->d_ff, err) ||
        get_int(root, path, "vocab_size", -1, 1, 1 << 24, &cfg->vocab_size, err) ||
        get_int(root, path, "max_position_embeddings", 512, 1, 1 << 20, &cfg->max_positions, err) ||
        get_int(root, path, "type_vocab_size", 2, 1, 1024, &cfg->type_vocab_size, err) ||
        get_float(root, path, "layer_norm_eps", 1e-12, &cfg->ln_eps, err))
        return -1;
    const char *act = get_str(root, "hidden_act");
    if (parse_activation(path, act ? act : "gelu", &cfg->gelu_tanh, err)) return -1;
    const char *pos = get_str(root, "position_embedding_type");
    if (pos && strcmp(pos, "absolute") != 0)
        return lens_fail(err, LENS_EFORMAT, "%s: unsupported position_embedding_type \"%s\"", path, pos);
    if (cfg->d_model % cfg->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d",
                         path, cfg->d_model, cfg->n_heads);
    int dh = cfg->d_model / cfg->n_heads;
    if (get_int(root, path, "head_dim_key", dh, 1, 1 << 16, &cfg->d_head_k, err) ||
        get_int(root, path, "head_dim_value", dh, 1, 1 << 16, &cfg->d_head_v, err))
        return -1;
    const char *scale = get_str(root, "attention_scale");
    if (scale && strcmp(scale, "DK") && strcmp(scale, "DV"))
        return lens_fail(err, LENS_EFORMAT, "%s: attention_scale \"%s\" is not DK or DV", path, scale);
    cfg->scale_by_dv = scale && !strcmp(scale, "DV");
    const char *combine = get_str(root, "head_combination");
    if (combine && lens_head_combination_parse(combine, &cfg->head_combination))
        return lens_fail(err, LENS_EFORMAT, "%s: head_combination \"%s\" is not one of concat, sum, sum_adjacent",
                         path, combine);

    if (!strcmp(cfg->architecture, "BertForSequenceClassification")) {
        cfg->task = LENS_TASK_CLASSIFICATION;
        return parse_labels(root, path, cfg, err);
    }
    if (!strcmp(cfg->architecture, "BertForMaskedLM")) cfg->task = LENS_TASK_MASKED_LM;
    else if (!strcmp(cfg->architecture, "BertModel")) cfg->task = LENS_TASK_ENCODER;
    else return lens_fail(err, LENS_EFORMAT, "%s: unsupported architecture \"%s\"", path, cfg->architecture);
    return 0;
}

static int parse_gpt2(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    cfg->arch = LENS_ARCH_GPT2;
    if (get_int(root, path, "n_embd", -1, 1, 1 << 16, &cfg->d_model, err) ||
        get_int(root, path, "n_layer", -1, 1, 1024, &cfg->n_layers, err) ||
        get_int(root, path, "n_head", -1, 1, 1024, &cfg->n_heads, err) ||
        get_int(root, path, "vocab_size", -1, 1, 1 << 24, &cfg->vocab_size, err) ||
        get_int(root, path, "n_positions", 1024, 1, 1 << 20, &cfg->max_positions, err) ||
        get_float(root, path, "layer_norm_epsilon", 1e-5, &cfg->ln_eps, err))
        return -1;
    if (get_int(root, path, "n_inner", 4 * cfg->d_model, 1, 1 << 20, &cfg->d_ff, err)) return -1;
    const char *act = get_str(root, "activation_function");
    if (parse_activation(path, act ? act : "gelu_new", &cfg->gelu_tanh, err)) return -1;
    if (cfg->d_model % cfg->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: n_embd %d is not a multiple of n_head %d", path,
                         cfg->d_model, cfg->n_heads);
    json_t *scale = json_object_get(root, "scale_attn_weights");
    json_t *by_layer = json_object_get(root, "scale_attn_by_inverse_layer_idx");
    json_t *reorder = json_object_get(root, "reorder_and_upcast_attn");
    if (json_is_false(scale) || json_is_true(by_layer) || json_is_true(reorder))
        return lens_fail(err, LENS_EFORMAT, "%s: non-default GPT-2 attention scaling is not supported", path);
    cfg->d_head_k = cfg->d_head_v = cfg->d_model / cfg->n_heads;
    cfg->type_vocab_size = 0;
    if (!strcmp(cfg->architecture, "GPT2LMHeadModel")) cfg->task = LENS_TASK_CAUSAL_LM;
    else if (!strcmp(cfg->architecture, "GPT2Model")) cfg->task = LENS_TASK_ENCODER;
    else return lens_fail(err, LENS_EFORMAT, "%s: unsupported architecture \"%s\"", path, cfg->architecture);
    return 0;
}

int lens_config_load(const char *path, lens_config *cfg, lens_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson leaves the text empty for some allocation failures */
        if (!jerr.text[0] || json_error_code(&jerr) == json_error_out_of_memory)
            return lens_fail(err, LENS_ENOMEM, "%s: out of memory reading it", path);
        if (jerr.line <= 0) return lens_fail(err, LENS_ENOENT, "%s: %s", path, jerr.text);
        return lens_fail(err, LENS_EFORMAT, "%s: %s (line %d)", path, jerr.text, jerr.line);
    }
    int rc = -1;
    if (!json_is_object(root)) {
        lens_fail(err, LENS_EFORMAT, "%s: not a JSON object", path);
        goto out;
    }
    const char *type = get_str(root, "model_type");
    if (!type) {
        lens_fail(err, LENS_EFORMAT, "%s: missing \"model_type\"", path);
        goto out;
    }
    json_t *archs = json_object_get(root, "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    const char *fallback = !strcmp(type, "gpt2") ? "GPT2LMHeadModel" : "BertModel";
    snprintf(cfg->architecture, sizeof cfg->architecture, "%s", arch ? arch : fallback);
    cfg->random_weights = json_is_true(json_object_get(root, "lensd_random_weights"));
    if (!strcmp(type, "bert")) rc = parse_bert(root, path, cfg, err);
    else if (!strcmp(type, "gpt2")) rc = parse_gpt2(root, path, cfg, err);
    else lens_fail(err, LENS_EFORMAT, "%s: unsupported model_type \"%s\" (bert, gpt2)", path, type);
    if (rc == 0) lens_config_set_attn_scale(cfg);
out:
    json_decref(root);
    if (rc) lens_config_free(cfg);
    return rc;
}

void lens_config_free(lens_config *cfg)
{
    for (int i = 0; i < cfg->n_labels; i++) free(cfg->labels[i]);
    free(cfg->labels);
    cfg->labels = NULL;
    cfg->n_labels = 0;
}

const char *lens_task_name(lens_task task)
{
    switch (task) {
    case LENS_TASK_ENCODER: return "encoder";
    case LENS_TASK_CLASSIFICATION: return "classification";
    case LENS_TASK_MASKED_LM: return "masked-lm";
    case LENS_TASK_CAUSAL_LM: return "causal-lm";
    }
    return "unknown";
}
