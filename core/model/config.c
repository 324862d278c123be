/* config.c - a Hugging Face config.json to lens_config and back, through
 * the family's key tables (arch.h, lens_config_key).
 *
 * "model_type" picks the family; lens_config_load reads its key rows in
 * order (type, alias, default, range, refusals), runs its hook, then the
 * task from "architectures" (id2label for classifiers); lens_config_to_json
 * writes the same rows back through jansson. This file knows no family. */
#include "core/model/arch.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/nn/glu.h"

/* "gelu" is exact erf GELU in HF; the tanh forms are gelu_new & friends. */
const lens_key_choice lens_gelu_choices[] = {
    {"gelu", 0}, {"gelu_new", 1}, {"gelu_pytorch_tanh", 1}, {"gelu_fast", 1}, {NULL, 0}};
const lens_key_choice lens_glu_choices[] = {{"silu", LENS_GLU_SILU},
                                            {"swish", LENS_GLU_SILU},
                                            {"gelu_pytorch_tanh", LENS_GLU_GELU_TANH},
                                            {"gelu_new", LENS_GLU_GELU_TANH},
                                            {NULL, 0}};
const lens_key_choice lens_head_combination_choices[] = {
    {"concat", LENS_HEADS_CONCAT}, {"sum", LENS_HEADS_SUM}, {"sum_adjacent", LENS_HEADS_SUM_ADJACENT}, {NULL, 0}};

const lens_config_key lens_hf_size_keys[] = {
    LENS_KEY("hidden_size", LENS_KEY_INT, LENS_C(d_model), .min = 1, .max = 1 << 16, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("num_hidden_layers", LENS_KEY_INT, LENS_C(n_layers), .min = 1, .max = 1024, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("num_attention_heads", LENS_KEY_INT, LENS_C(n_heads), .min = 1, .max = 1024,
             .flags = LENS_KEY_REQUIRED),
    LENS_KEY("intermediate_size", LENS_KEY_INT, LENS_C(d_ff), .min = 1, .max = 1 << 20, .flags = LENS_KEY_REQUIRED),
    LENS_KEY("vocab_size", LENS_KEY_INT, LENS_C(vocab_size), .min = 1, .max = 1 << 24, .flags = LENS_KEY_REQUIRED),
    {0}};

/* A table ends with {0}; a constant row (key NULL) always names a field. */
static int key_end(const lens_config_key *k) { return !k->key && !k->field; }

/* Every key row of family f, its tables in order. */
#define FOR_EACH_KEY(f, k)                                                                                         \
    for (int table_ = 0; table_ < LENS_KEY_TABLES && (f)->keys[table_]; table_++)                                  \
        for (const lens_config_key *k = (f)->keys[table_]; !key_end(k); k++)

/* The key that sets a field (for messages about two keys), or the field's role. */
static const char *key_of(const lens_config *c, size_t field, const char *fallback)
{
    FOR_EACH_KEY(c->family, k)
        if (k->key && k->field == field) return k->key;
    return fallback;
}

static const lens_key_choice *find_choice(const lens_key_choice *ch, const char *name)
{
    for (; ch->name; ch++)
        if (!strcmp(ch->name, name)) return ch;
    return NULL;
}

/* k's default for c: a size of the rows before it may scale it. */
static int key_default(const lens_config *c, const char *path, const lens_config_key *k, double *out,
                       lens_err *err)
{
    *out = k->def;
    if (k->def_dim == LENS_D_NONE) return 0;
    if (k->def_dim == LENS_D_DH && c->n_heads > 0 && c->d_model % c->n_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: %s %d is not a multiple of %s %d", path,
                         key_of(c, LENS_C(d_model), "d_model"), c->d_model, key_of(c, LENS_C(n_heads), "n_heads"),
                         c->n_heads);
    *out = k->def * lens_dim_size(c, k->def_dim);
    return 0;
}

/* v as it reads in the file, for messages. */
static void value_text(const json_t *v, char *text, size_t n)
{
    if (json_is_string(v)) snprintf(text, n, "\"%.40s\"", json_string_value(v));
    else if (json_is_integer(v)) snprintf(text, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_number(v)) snprintf(text, n, "%g", json_number_value(v));
    else snprintf(text, n, "%s", json_is_true(v) ? "true" : json_is_false(v) ? "false" : "a non-scalar");
}

static int check_range(const lens_config *c, const char *path, const char *name, const lens_config_key *k,
                       const json_t *v, double x, lens_err *err)
{
    const double lo = k->min, hi = k->max + (k->max_dim ? lens_dim_size(c, k->max_dim) : 0);
    if (!(k->min < k->max) && !k->max_dim) return 0;
    const int open_lo = k->flags & LENS_KEY_OPEN_MIN, open_hi = k->flags & LENS_KEY_OPEN_MAX;
    if ((open_lo ? x > lo : x >= lo) && (open_hi ? x < hi : x <= hi)) return 0;
    char text[64];
    value_text(v, text, sizeof text);
    if (isinf(hi)) return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" = %s must be %s %g", path, name, text,
                                    open_lo ? ">" : ">=", lo);
    const int digits = k->type == LENS_KEY_INT ? 0 : 6; /* integers as integers */
    return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" = %s is outside %c%.*g, %.*g%c", path, name, text,
                     open_lo ? '(' : '[', digits ? digits : 15, lo, digits ? digits : 15, hi, open_hi ? ')' : ']');
}

static int bad_choice(const char *path, const char *name, const lens_config_key *k, const json_t *v, lens_err *err)
{
    char text[64], names[256];
    size_t n = 0;
    names[0] = 0;
    for (const lens_key_choice *ch = k->choices; ch->name && n < sizeof names; ch++)
        n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", ch->name);
    value_text(v, text, sizeof text);
    return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" = %s is not supported (%s)", path, name, text, names);
}

/* The value of row k in root (its default when absent), checked. */
int lens_config_key_read(const json_t *root, const char *path, const lens_config *c, const lens_config_key *k,
                         double *out, lens_err *err)
{
    if (key_default(c, path, k, out, err)) return -1;
    if (!k->key) return 0; /* a family constant */
    const char *name = k->key;
    const json_t *v = json_object_get(root, k->key);
    if ((!v || json_is_null(v)) && k->alias) {
        const json_t *a = json_object_get(root, k->alias);
        if (a && !json_is_null(a)) v = a, name = k->alias;
    }
    if (!v || (json_is_null(v) && !(k->flags & LENS_KEY_NULL_OFF)))
        return k->flags & LENS_KEY_REQUIRED ? lens_fail(err, LENS_EFORMAT, "%s: missing \"%s\"", path, name) : 0;
    double x = 0;
    if (json_is_null(v)) { /* NULL_OFF */
        *out = 0;
        return 0;
    }
    switch (k->type) {
    case LENS_KEY_INT:
        if (!json_is_integer(v)) return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" must be an integer", path, name);
        x = (double)json_integer_value(v);
        break;
    case LENS_KEY_FLOAT:
    case LENS_KEY_DOUBLE:
        if (!json_is_number(v)) return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" must be a number", path, name);
        x = json_number_value(v);
        break;
    case LENS_KEY_BOOL:
        if (!json_is_boolean(v)) return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" must be true or false", path, name);
        x = json_is_true(v);
        break;
    case LENS_KEY_CHOICE: {
        const lens_key_choice *ch = json_is_string(v) ? find_choice(k->choices, json_string_value(v)) : NULL;
        if (!ch) return bad_choice(path, name, k, v, err);
        x = ch->value;
        break;
    }
    }
    if ((k->flags & LENS_KEY_ONLY_DEFAULT) && x != *out) {
        char text[64];
        value_text(v, text, sizeof text);
        return lens_fail(err, LENS_EFORMAT, "%s: \"%s\" = %s is not supported", path, name, text);
    }
    if (check_range(c, path, name, k, v, x, err)) return -1;
    *out = x;
    return 0;
}

static void store(lens_config *c, const lens_config_key *k, double x)
{
    if (k->field == LENS_KEY_CHECK_ONLY) return;
    char *at = (char *)c + k->field;
    if (k->type == LENS_KEY_FLOAT) *(float *)at = (float)x;
    else if (k->type == LENS_KEY_DOUBLE) *(double *)at = x;
    else *(int *)at = (int)x;
}

static double stored(const lens_config *c, const lens_config_key *k)
{
    const char *at = (const char *)c + k->field;
    if (k->type == LENS_KEY_FLOAT) return *(const float *)at;
    if (k->type == LENS_KEY_DOUBLE) return *(const double *)at;
    return *(const int *)at;
}

void lens_config_defaults(lens_config *c)
{
    FOR_EACH_KEY(c->family, k)
        if (k->def_dim == LENS_D_NONE) store(c, k, k->def);
}

/* Every key row of the family in order, then the checks across keys. */
static int read_keys(const json_t *root, const char *path, lens_config *c, lens_err *err)
{
    FOR_EACH_KEY(c->family, k) {
        double x;
        if (lens_config_key_read(root, path, c, k, &x, err)) return -1;
        store(c, k, x);
    }
    if (c->n_kv_heads && c->n_heads % c->n_kv_heads)
        return lens_fail(err, LENS_EFORMAT, "%s: %s %d is not a multiple of %s %d", path,
                         key_of(c, LENS_C(n_heads), "n_heads"), c->n_heads,
                         key_of(c, LENS_C(n_kv_heads), "n_kv_heads"), c->n_kv_heads);
    return 0;
}

static int parse_labels(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    const json_t *id2label = json_object_get(root, "id2label");
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
        const json_t *v = id2label ? json_object_get(id2label, key) : NULL;
        if (id2label && !json_is_string(v))
            return lens_fail(err, LENS_EFORMAT, "%s: id2label must map \"0\"..\"%d\" to strings", path, n - 1);
        snprintf(name, sizeof name, "LABEL_%d", i);
        cfg->labels[i] = strdup(v ? json_string_value(v) : name);
        if (!cfg->labels[i]) return lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
    }
    return 0;
}

/* cfg->task from cfg->architecture via the family's task_archs (labels
 * read for classifiers). */
/* The object the family's keys are read from: root itself, or for a
 * multimodal wrapper (Gemma3ForConditionalGeneration, model_type "gemma3":
 * no family of its own) its "text_config", whose model_type names the
 * family (cfg->family set, cfg->text_tower = 1). HF writes a nested config
 * as its difference from the config class's defaults, so the family's
 * class_defaults fill what is absent. A new reference (NULL: out of
 * memory). */
static json_t *text_tower(json_t *root, lens_config *cfg)
{
    json_t *tower = json_object_get(root, "text_config");
    const char *type = json_string_value(json_object_get(tower, "model_type"));
    const lens_family *f = cfg->family || !type ? NULL : lens_family_find(type);
    if (!f) return json_incref(root);
    cfg->family = f;
    cfg->text_tower = 1;
    json_t *keys = json_deep_copy(tower);
    json_t *defaults = f->class_defaults ? json_loads(f->class_defaults, 0, NULL) : json_object();
    if (!keys || !defaults || json_object_update_missing(keys, defaults)) {
        json_decref(keys);
        keys = NULL;
    }
    json_decref(defaults);
    return keys;
}

/* The task from the architecture; a wrapper's text tower is its causal LM. */
static int config_task(const json_t *root, const char *path, lens_config *cfg, lens_err *err)
{
    if (cfg->text_tower) {
        if (!cfg->family->task_archs[LENS_TASK_CAUSAL_LM])
            return lens_fail(err, LENS_EFORMAT, "%s: the text tower of \"%s\" is a %s, which has no causal LM", path,
                             cfg->architecture, cfg->family->model_type);
        cfg->task = LENS_TASK_CAUSAL_LM;
        return 0;
    }
    for (lens_task t = LENS_TASK_ENCODER; t <= LENS_TASK_CAUSAL_LM; t++) {
        const char *name = cfg->family->task_archs[t];
        if (!name || strcmp(name, cfg->architecture)) continue;
        cfg->task = t;
        return t == LENS_TASK_CLASSIFICATION ? parse_labels(root, path, cfg, err) : 0;
    }
    return lens_fail(err, LENS_EFORMAT, "%s: unsupported architecture \"%s\"", path, cfg->architecture);
}

int lens_head_combination_parse(const char *name, int *combine)
{
    const lens_key_choice *ch = find_choice(lens_head_combination_choices, name);
    if (!ch) return -1;
    *combine = ch->value;
    return 0;
}

const char *lens_head_combination_name(int combine)
{
    for (const lens_key_choice *ch = lens_head_combination_choices; ch->name; ch++)
        if (ch->value == combine) return ch->name;
    return "concat";
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
    const char *type = json_string_value(json_object_get(root, "model_type"));
    if (!type) {
        lens_fail(err, LENS_EFORMAT, "%s: missing \"model_type\"", path);
        goto out;
    }
    json_t *archs = json_object_get(root, "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    cfg->family = lens_family_find(type);
    json_t *keys = text_tower(root, cfg);
    if (!cfg->family) {
        lens_fail(err, LENS_EFORMAT, "%s: unsupported model_type \"%s\" (%s)", path, type, lens_family_names());
        json_decref(keys); /* text_tower's reference to root */
        goto out;
    }
    if (!keys) {
        lens_fail(err, LENS_ENOMEM, "%s: out of memory reading it", path);
        goto out;
    }
    snprintf(cfg->architecture, sizeof cfg->architecture, "%s", arch ? arch : cfg->family->default_arch);
    cfg->random_weights = json_is_true(json_object_get(root, "lensd_random_weights"));
    const lens_family *f = cfg->family;
    rc = read_keys(keys, path, cfg, err) || (f->config_hook && f->config_hook(keys, path, cfg, err)) ||
                 config_task(root, path, cfg, err)
             ? -1
             : 0;
    json_decref(keys);
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

/* ---------------------------------------------------------------- writing */

json_t *lens_json_float(float f)
{
    char text[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, (double)f);
        if (strtof(text, NULL) == f) break;
    }
    return json_real(strtod(text, NULL));
}

static json_t *key_json(const lens_config_key *k, double x)
{
    if ((k->flags & LENS_KEY_NULL_OFF) && x == 0) return json_null();
    switch (k->type) {
    case LENS_KEY_INT: return json_integer((json_int_t)x);
    case LENS_KEY_FLOAT: return lens_json_float((float)x);
    case LENS_KEY_DOUBLE: return json_real(x);
    case LENS_KEY_BOOL: return json_boolean(x != 0);
    case LENS_KEY_CHOICE:
        for (const lens_key_choice *ch = k->choices; ch->name; ch++)
            if (ch->value == (int)x) return json_string(ch->name);
        return NULL;
    }
    return NULL;
}

/* "id2label": {"0": name, ...}, "label2id": {name: 0, ...} (LABEL_i when unnamed). */
static int set_labels(json_t *root, const lens_config *c)
{
    json_t *id2label = json_object(), *label2id = json_object();
    int bad = !id2label || !label2id;
    for (int i = 0; !bad && i < c->n_labels; i++) {
        char id[32], fallback[32];
        snprintf(id, sizeof id, "%d", i);
        snprintf(fallback, sizeof fallback, "LABEL_%d", i);
        const char *name = c->labels ? c->labels[i] : fallback;
        bad = json_object_set_new(id2label, id, json_string(name)) ||
              json_object_set_new(label2id, name, json_integer(i));
    }
    bad |= json_object_set(root, "id2label", id2label) | json_object_set(root, "label2id", label2id);
    json_decref(id2label), json_decref(label2id);
    return bad;
}

json_t *lens_config_to_json(const lens_config *c, int random_weights)
{
    const lens_family_writer *w = c->family->writer;
    json_t *root = w->config_constants ? json_loads(w->config_constants, 0, NULL) : json_object();
    int bad = !json_is_object(root);
    /* the task's class (a trainer may have changed the task of a loaded config) */
    const char *arch = c->family->task_archs[c->task] ? c->family->task_archs[c->task] : c->architecture;
    bad = bad || json_object_set_new(root, "architectures", json_pack("[s]", arch)) ||
          json_object_set_new(root, "model_type", json_string(c->family->model_type));
    FOR_EACH_KEY(c->family, k) {
        double def;
        if (bad || !k->key || key_default(c, "", k, &def, &(lens_err){0})) continue;
        const double x = k->field == LENS_KEY_CHECK_ONLY ? def : stored(c, k);
        if (!(k->flags & LENS_KEY_IF_CHANGED) || x != def) bad = json_object_set_new(root, k->key, key_json(k, x));
    }
    bad = bad || (w->config_extra && w->config_extra(root, c));
    if (!bad && random_weights) bad = json_object_set_new(root, "lensd_random_weights", json_true());
    if (!bad && c->task == LENS_TASK_CLASSIFICATION)
        bad = json_object_set_new(root, "problem_type", json_string("single_label_classification")) ||
              set_labels(root, c);
    else if (!bad) bad = json_object_set_new(root, "lensd_task", json_string(lens_task_name(c->task)));
    if (bad) json_decref(root);
    return bad ? NULL : root;
}

/* Nine significant digits: every float field round-trips, and the double
 * ones (rope_theta, rope_scaling factors) are short decimals in practice. */
int lens_config_save(const char *path, const lens_config *c, int random_weights, const char *torch_dtype,
                     lens_err *err)
{
    json_t *root = lens_config_to_json(c, random_weights);
    if (!root || (torch_dtype && json_object_set_new(root, "torch_dtype", json_string(torch_dtype)))) {
        json_decref(root);
        return lens_fail(err, LENS_ENOMEM, "%s: out of memory", path);
    }
    const int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(root);
    return rc ? lens_fail(err, LENS_EIO, "%s: write failed", path) : 0;
}
