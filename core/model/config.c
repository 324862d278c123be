/* config.c - reading a Hugging Face config.json into lens_config.
 *
 * "model_type" picks the family (core/model/arch.h), whose parse_config
 * reads its own keys with the helpers here (lens_json_*, activations,
 * id2label); this file knows no family. */
#include "core/model/arch.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* An integer field that must be present (fallback < 0) or defaults. */
int lens_json_int(json_t *root, const char *path, const char *key, int fallback,
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

int lens_json_eps(json_t *root, const char *path, const char *key, double fallback,
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

const char *lens_json_str(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* "gelu" is exact erf GELU in HF; the tanh forms are gelu_new & friends. */
int lens_parse_activation(const char *path, const char *act, int *gelu_tanh, lens_err *err)
{
    if (strcmp(act, "gelu") == 0) *gelu_tanh = 0;
    else if (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_fast"))
        *gelu_tanh = 1;
    else return lens_fail(err, LENS_EFORMAT, "%s: unsupported activation \"%s\"", path, act);
    return 0;
}

int lens_parse_labels(json_t *root, const char *path, lens_config *cfg, lens_err *err)
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

int lens_config_task(json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    for (lens_task t = LENS_TASK_ENCODER; t <= LENS_TASK_CAUSAL_LM; t++) {
        const char *name = cfg->family->task_archs[t];
        if (!name || strcmp(name, cfg->architecture)) continue;
        cfg->task = t;
        return t == LENS_TASK_CLASSIFICATION ? lens_parse_labels(root, path, cfg, err) : 0;
    }
    return lens_fail(err, LENS_EFORMAT, "%s: unsupported architecture \"%s\"", path, cfg->architecture);
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
    const char *type = lens_json_str(root, "model_type");
    if (!type) {
        lens_fail(err, LENS_EFORMAT, "%s: missing \"model_type\"", path);
        goto out;
    }
    json_t *archs = json_object_get(root, "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    cfg->family = lens_family_find(type);
    if (!cfg->family) {
        lens_fail(err, LENS_EFORMAT, "%s: unsupported model_type \"%s\" (%s)", path, type, lens_family_names());
        goto out;
    }
    snprintf(cfg->architecture, sizeof cfg->architecture, "%s", arch ? arch : cfg->family->default_arch);
    cfg->random_weights = json_is_true(json_object_get(root, "lensd_random_weights"));
    rc = cfg->family->parse_config(root, path, cfg, err);
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

int lens_task_parse(const char *name, lens_task *task)
{
    for (lens_task t = LENS_TASK_ENCODER; t <= LENS_TASK_CAUSAL_LM; t++)
        if (!strcmp(name, lens_task_name(t))) {
            *task = t;
            return 0;
        }
    return -1;
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

static void put_json_string(FILE *f, const char *s)
{
    json_t *str = json_string(s);
    char *text = str ? json_dumps(str, JSON_ENCODE_ANY) : NULL;
    fputs(text ? text : "\"\"", f);
    free(text);
    json_decref(str);
}

/* "id2label": {...}, "label2id": {...} of a classifier (LABEL_i when unnamed). */
void lens_write_labels(FILE *f, const lens_config *c)
{
    for (int pass = 0; pass < 2; pass++) {
        fprintf(f, pass ? "  \"label2id\": {" : "  \"id2label\": {");
        for (int i = 0; i < c->n_labels; i++) {
            char fallback[32];
            snprintf(fallback, sizeof fallback, "LABEL_%d", i);
            const char *name = c->labels ? c->labels[i] : fallback;
            fputs(i ? ", " : "", f);
            if (pass) put_json_string(f, name), fprintf(f, ": %d", i);
            else fprintf(f, "\"%d\": ", i), put_json_string(f, name);
        }
        fprintf(f, "}");
        fprintf(f, pass ? "\n" : ",\n");
    }
}

/* The end of a config.json: the random-weights mark, then id2label /
 * label2id of a classifier or lensd's task name. */
void lens_write_task_tail(FILE *f, const lens_config *c, int random_weights)
{
    if (random_weights) fprintf(f, "  \"lensd_random_weights\": true,\n");
    if (c->task == LENS_TASK_CLASSIFICATION) {
        fprintf(f, "  \"problem_type\": \"single_label_classification\",\n");
        lens_write_labels(f, c);
        fprintf(f, "}\n");
    } else {
        fprintf(f, "  \"lensd_task\": \"%s\"\n}\n", lens_task_name(c->task));
    }
}
