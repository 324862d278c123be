/* registry.c - loading the resident models at start-up.
 *
 * Owns: the list of (name, folder) pairs from --model NAME=DIR and
 * --models-dir, their validation (names are [A-Za-z0-9._-]+ and unique, so
 * they can sit in a URL path), and the lens_model objects, which are loaded
 * once and then shared read-only by every worker until exit. */
#include "server/registry.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/request.h"
#include "server/log.h"

static int valid_name(const char *s, size_t n)
{
    if (n == 0 || n > 128) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return !(n <= 2 && s[0] == '.' && (n == 1 || s[1] == '.'));
}

typedef struct {
    char *name, *dir;
} model_spec;

static int add(model_spec **specs, int *n, const char *name, size_t name_len, const char *dir)
{
    if (!valid_name(name, name_len)) {
        log_msg("error", "model name \"%.*s\" must be 1-128 characters of A-Z a-z 0-9 . _ -", (int)name_len, name);
        return -1;
    }
    for (int i = 0; i < *n; i++) {
        if (strlen((*specs)[i].name) == name_len && !strncmp((*specs)[i].name, name, name_len)) {
            log_msg("error", "two models are named \"%.*s\"", (int)name_len, name);
            return -1;
        }
    }
    model_spec *grown = realloc(*specs, (size_t)(*n + 1) * sizeof *grown);
    if (!grown) return -1;
    *specs = grown;
    grown[*n].name = strndup(name, name_len);
    grown[*n].dir = strdup(dir);
    (*n)++;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void specs_free(model_spec *specs, int n)
{
    for (int i = 0; i < n; i++) free(specs[i].name), free(specs[i].dir);
    free(specs);
}

/* The (name, folder) pairs of --model and --models-dir, in that order. */
static int collect(const lensd_config *cfg, model_spec **out, int *n_out)
{
    model_spec *specs = NULL;
    int n = 0;
    for (int i = 0; i < cfg->n_models; i++) {
        const char *spec = cfg->models[i], *eq = strchr(spec, '=');
        if (!eq || !eq[1]) {
            log_msg("error", "--model wants NAME=DIR, got \"%s\"", spec);
            goto fail;
        }
        if (add(&specs, &n, spec, (size_t)(eq - spec), eq + 1)) goto fail;
    }
    if (cfg->models_dir) {
        DIR *d = opendir(cfg->models_dir);
        if (!d) {
            log_msg("error", "cannot open --models-dir %s", cfg->models_dir);
            goto fail;
        }
        char **names = NULL;
        int n_names = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s/config.json", cfg->models_dir, e->d_name);
            if (access(path, R_OK)) continue;
            char **grown = realloc(names, (size_t)(n_names + 1) * sizeof *grown);
            if (!grown) break;
            names = grown;
            names[n_names++] = strdup(e->d_name);
        }
        closedir(d);
        if (names) qsort(names, (size_t)n_names, sizeof *names, cmp_str);
        int bad = 0;
        for (int i = 0; i < n_names; i++) {
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/%s", cfg->models_dir, names[i]);
            if (!bad && add(&specs, &n, names[i], strlen(names[i]), dir)) bad = 1;
            free(names[i]);
        }
        free(names);
        if (bad) goto fail;
    }
    if (n == 0) {
        log_msg("error", "no models: give --model NAME=DIR or --models-dir DIR");
        goto fail;
    }
    *out = specs, *n_out = n;
    return 0;
fail:
    specs_free(specs, n);
    return -1;
}

int registry_load(const lensd_config *cfg, api_model **out, int *n_out)
{
    model_spec *specs;
    int n;
    if (collect(cfg, &specs, &n)) return -1;
    api_model *models = calloc((size_t)n, sizeof *models);
    if (!models) {
        specs_free(specs, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        double t0 = api_now();
        lens_err err = {0};
        /* a folder of tokenizer files only (no config.json) serves /v1/tokenize */
        char config[4096];
        snprintf(config, sizeof config, "%s/config.json", specs[i].dir);
        lens_model *m = access(config, F_OK) == 0 ? lens_model_load(specs[i].dir, &err)
                                                  : lens_model_tokenizer_only(specs[i].dir, &err);
        if (!m) {
            log_msg("error", "loading model %s from %s failed: %s", specs[i].name, specs[i].dir, err.msg);
            registry_free(models, i);
            specs_free(specs, n);
            return -1;
        }
        models[i].name = strdup(specs[i].name);
        models[i].model = m;
        jw w;
        log_begin(&w, "info");
        jw_key(&w, "msg");
        jw_str(&w, "model loaded");
        jw_key(&w, "model");
        jw_str(&w, specs[i].name);
        jw_key(&w, "dir");
        jw_str(&w, specs[i].dir);
        jw_key(&w, "architecture");
        jw_str(&w, m->cfg.architecture);
        jw_key(&w, "parameters");
        jw_int(&w, (long long)m->n_params);
        jw_key(&w, "bytes");
        jw_int(&w, (long long)lens_weights_bytes(m->weights));
        jw_key(&w, "ms");
        jw_float(&w, (api_now() - t0) * 1e3, 1);
        log_emit(&w);
        int maps = api_model_load_maps(&models[i], &err);
        if (maps < 0)
            log_msg("warning", "model %s: ignoring its token identity maps: %s", specs[i].name, err.msg);
        else if (maps > 0)
            log_msg("info", "model %s: token identity maps loaded (mapping \"linear\")", specs[i].name);
        if (m->cfg.random_weights)
            log_msg("warning", "model %s has RANDOM weights (made by lensd mkmodel): its outputs mean nothing",
                    specs[i].name);
    }
    specs_free(specs, n);
    *out = models;
    *n_out = n;
    return 0;
}

void registry_free(api_model *models, int n)
{
    for (int i = 0; i < n; i++) {
        free(models[i].name);
        api_model_drop_maps(&models[i]);
        lens_model_free(models[i].model);
    }
    free(models);
}
