/* registry.c - the resident models, loaded at start-up and at run time.
 *
 * Owns: the list of (name, folder) pairs from --model NAME=DIR and
 * --models-dir, their validation (names are [A-Za-z0-9._-]+ and unique, so
 * they can sit in a URL path), the api_model objects and their reference
 * counts, the folders that failed to load, and POST /v1/models / DELETE
 * /v1/models/{id}.
 *
 * Lifetime: the registry holds one reference to each resident model; every
 * request or job that names a model holds another (api_decode_model ->
 * model_acquire, dropped by api_call_free). DELETE unlinks the model so no
 * new request finds it and drops the registry's reference; whoever drops
 * the last one frees the weights, so a worker still computing on an
 * unloaded model never reads freed memory. One mutex guards the list and
 * every count; loading itself (seconds for a large checkpoint) runs outside
 * it, on a worker thread. */
#include "server/registry.h"

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/request.h"
#include "server/log.h"

typedef struct {
    char *id, *error;
} failed_model;

struct registry {
    pthread_mutex_t lock;
    api_model **models; /* resident, in load order */
    int n, cap;
    failed_model *failed;
    int n_failed;
    char *models_dir; /* realpath of --models-dir, or NULL: run-time loading is off */
};

/* valid_name's rule, as the messages state it */
#define NAME_RULE "1-128 characters of A-Z a-z 0-9 . _ -, other than \".\" and \"..\""

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

/* Does path (a realpath) lie inside root (a realpath)? */
static int inside(const char *root, const char *path)
{
    size_t n = strlen(root);
    return !strncmp(path, root, n) && path[n] == '/';
}

/* msg with every "root/" removed, into out: errors shown to clients name
 * folders relative to --models-dir, never the server's absolute paths. */
static void relative_message(char *out, size_t size, const char *msg, const char *root)
{
    size_t n = root ? strlen(root) : 0, used = 0;
    while (*msg && used + 1 < size) {
        if (n && !strncmp(msg, root, n) && msg[n] == '/') {
            msg += n + 1;
            continue;
        }
        out[used++] = *msg++;
    }
    out[used] = 0;
}

/* ------------------------------------------------------------ the lists */

/* Lock held. */
static api_model *find(registry *r, const char *name, size_t len)
{
    for (int i = 0; i < r->n; i++)
        if (strlen(r->models[i]->name) == len && !memcmp(r->models[i]->name, name, len)) return r->models[i];
    return NULL;
}

/* Lock held; forgets an earlier failure of the same id. */
static void forget_failure(registry *r, const char *id)
{
    for (int i = 0; i < r->n_failed; i++) {
        if (strcmp(r->failed[i].id, id)) continue;
        free(r->failed[i].id), free(r->failed[i].error);
        r->failed[i] = r->failed[--r->n_failed];
        return;
    }
}

static void record_failure(registry *r, const char *id, const char *error)
{
    pthread_mutex_lock(&r->lock);
    forget_failure(r, id);
    failed_model *grown = realloc(r->failed, (size_t)(r->n_failed + 1) * sizeof *grown);
    if (grown) {
        r->failed = grown;
        r->failed[r->n_failed].id = strdup(id);
        r->failed[r->n_failed].error = strdup(error);
        r->n_failed++;
    }
    pthread_mutex_unlock(&r->lock);
}

static void model_free(api_model *m)
{
    free(m->name);
    api_model_drop_maps(m);
    lens_model_free(m->model);
    free(m);
}

/* Lock held. Appends m (refs 1, the registry's); 0, or -1 when the id is taken. */
static int insert(registry *r, api_model *m)
{
    if (find(r, m->name, strlen(m->name))) return -1;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 8;
        api_model **grown = realloc(r->models, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        r->models = grown, r->cap = cap;
    }
    m->refs = 1;
    r->models[r->n++] = m;
    forget_failure(r, m->name);
    return 0;
}

/* ------------------------------------------------------------- loading */

/* Load folder dir as model name: the checkpoint, then its token-identity
 * maps (a bad maps file is a warning, not a failure). NULL with err set. */
static api_model *load_one(const char *name, const char *dir, lens_err *err)
{
    double t0 = api_now();
    /* a folder of tokenizer files only (no config.json) serves /v1/tokenize */
    char config[PATH_MAX];
    snprintf(config, sizeof config, "%s/config.json", dir);
    lens_model *lm = access(config, F_OK) == 0 ? lens_model_load(dir, err) : lens_model_tokenizer_only(dir, err);
    if (!lm) return NULL;
    api_model *m = calloc(1, sizeof *m);
    if (!m || !(m->name = strdup(name))) {
        free(m);
        lens_model_free(lm);
        lens_fail(err, LENS_ENOMEM, "out of memory");
        return NULL;
    }
    m->model = lm;
    jw w;
    log_begin(&w, "info");
    jw_key(&w, "msg");
    jw_str(&w, "model loaded");
    jw_key(&w, "model");
    jw_str(&w, name);
    jw_key(&w, "dir");
    jw_str(&w, dir);
    jw_key(&w, "architecture");
    jw_str(&w, lm->cfg.architecture);
    jw_key(&w, "parameters");
    jw_int(&w, (long long)lm->n_params);
    jw_key(&w, "bytes");
    jw_int(&w, (long long)lens_weights_bytes(lm->weights));
    jw_key(&w, "ms");
    jw_float(&w, (api_now() - t0) * 1e3, 1);
    log_emit(&w);
    lens_err maps_err = {0};
    int maps = api_model_load_maps(m, &maps_err);
    if (maps < 0)
        log_msg("warn", "model %s: ignoring its token identity maps: %s", name, maps_err.msg);
    else if (maps > 0)
        log_msg("info", "model %s: token identity maps loaded (mapping \"linear\")", name);
    if (lm->cfg.random_weights)
        log_msg("warn", "model %s has RANDOM weights (made by lensd mkmodel): its outputs mean nothing", name);
    return m;
}

/* Start-up: load one (name, dir); a failure is logged and listed, not fatal. */
static void load_at_start(registry *r, const char *name, size_t name_len, const char *dir)
{
    char id[160];
    snprintf(id, sizeof id, "%.*s", (int)(name_len < 128 ? name_len : 128), name);
    if (!valid_name(name, name_len)) {
        log_msg("error", "model folder %s skipped: the name \"%s\" must be " NAME_RULE,
                dir, id);
        record_failure(r, id, "the name must be " NAME_RULE);
        return;
    }
    lens_err err = {0};
    api_model *m = load_one(id, dir, &err);
    if (!m) {
        log_msg("error", "model %s from %s skipped: %s", id, dir, err.msg);
        char shown[sizeof err.msg];
        relative_message(shown, sizeof shown, err.msg, r->models_dir);
        record_failure(r, id, shown);
        return;
    }
    pthread_mutex_lock(&r->lock);
    int dup = insert(r, m);
    pthread_mutex_unlock(&r->lock);
    if (dup) {
        log_msg("error", "model %s from %s skipped: another model already has that name", id, dir);
        record_failure(r, id, "another model already has that name");
        model_free(m);
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The subfolders of dir that hold a config.json, sorted; NULL-terminated. */
static char **checkpoint_folders(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char **names = calloc(1, sizeof *names);
    int n = 0;
    struct dirent *e;
    while (names && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX];
        int len = snprintf(path, sizeof path, "%s/%s/config.json", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path || access(path, R_OK)) continue;
        char **grown = realloc(names, (size_t)(n + 2) * sizeof *grown);
        if (!grown) break;
        names = grown;
        names[n++] = strdup(e->d_name);
        names[n] = NULL;
    }
    closedir(d);
    if (names) qsort(names, (size_t)n, sizeof *names, cmp_str);
    return names;
}

registry *registry_create(const lensd_config *cfg)
{
    registry *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->lock, NULL);
    for (int i = 0; i < cfg->n_models; i++) {
        const char *spec = cfg->models[i], *eq = strchr(spec, '=');
        if (!eq || !eq[1]) {
            log_msg("error", "--model wants NAME=DIR, got \"%s\"", spec);
            goto fail;
        }
        load_at_start(r, spec, (size_t)(eq - spec), eq + 1);
    }
    if (cfg->models_dir) {
        char real[PATH_MAX];
        char **names = realpath(cfg->models_dir, real) ? checkpoint_folders(real) : NULL;
        if (!names) {
            log_msg("error", "cannot open --models-dir %s", cfg->models_dir);
            goto fail;
        }
        r->models_dir = strdup(real);
        for (char **p = names; *p; p++) {
            char dir[PATH_MAX], resolved[PATH_MAX];
            int len = snprintf(dir, sizeof dir, "%s/%s", real, *p);
            /* the same containment as a run-time load: a symlink out of the folder is not served */
            if (len > 0 && (size_t)len < sizeof dir && realpath(dir, resolved) && !inside(real, resolved)) {
                log_msg("error", "model folder %s skipped: it resolves outside --models-dir", dir);
                record_failure(r, *p, "the folder resolves outside --models-dir");
            } else if (len > 0 && (size_t)len < sizeof dir) {
                load_at_start(r, *p, strlen(*p), dir);
            }
            free(*p);
        }
        free(names);
    }
    if (r->n == 0 && !r->models_dir) {
        log_msg("error", cfg->n_models ? "no model loaded (see the errors above)"
                                       : "no models: give --model NAME=DIR or --models-dir DIR");
        goto fail;
    }
    if (r->n_failed) log_msg("warn", "%d model folder(s) failed to load; GET /v1/models lists them", r->n_failed);
    return r;
fail:
    registry_free(r);
    return NULL;
}

void registry_free(registry *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++) model_free(r->models[i]);
    for (int i = 0; i < r->n_failed; i++) free(r->failed[i].id), free(r->failed[i].error);
    free(r->models);
    free(r->failed);
    free(r->models_dir);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* ------------------------------------------------------- the api hooks */

static registry *of(const api_ctx *ctx) { return ctx->registry; }

static api_model *hook_acquire(const api_ctx *ctx, const char *name, size_t len, int *n_resident)
{
    registry *r = of(ctx);
    pthread_mutex_lock(&r->lock);
    api_model *m = name ? find(r, name, len) : r->n == 1 ? r->models[0] : NULL;
    if (m) m->refs++;
    if (n_resident) *n_resident = r->n;
    pthread_mutex_unlock(&r->lock);
    return m;
}

static void hook_release(const api_ctx *ctx, api_model *m)
{
    registry *r = of(ctx);
    pthread_mutex_lock(&r->lock);
    int last = --m->refs == 0;
    pthread_mutex_unlock(&r->lock);
    if (last) {
        log_msg("info", "model %s freed (unloaded, last request done)", m->name);
        model_free(m);
    }
}

static api_model **hook_acquire_all(const api_ctx *ctx, int *n)
{
    registry *r = of(ctx);
    pthread_mutex_lock(&r->lock);
    api_model **all = malloc((size_t)(r->n ? r->n : 1) * sizeof *all);
    *n = all ? r->n : 0;
    for (int i = 0; i < *n; i++) {
        all[i] = r->models[i];
        all[i]->refs++;
    }
    pthread_mutex_unlock(&r->lock);
    return all;
}

static void hook_write_failed(jw *w, const api_ctx *ctx)
{
    registry *r = of(ctx);
    jw_arr(w);
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->n_failed; i++) {
        jw_obj(w);
        jw_key(w, "id");
        jw_str(w, r->failed[i].id);
        jw_key(w, "error");
        jw_str(w, r->failed[i].error);
        jw_end(w);
    }
    pthread_mutex_unlock(&r->lock);
    jw_end(w);
}

/* path (relative to --models-dir, or absolute) resolved inside it, into out
 * (PATH_MAX bytes); 0 or -1 with a 422 naming "path". */
static int resolve_inside(api_call *c, const registry *r, const char *path, char *out)
{
    if (!r->models_dir)
        return api_fail(c, 422, "invalid_request", "path",
                        "loading models at run time needs the server to run with --models-dir");
    char joined[PATH_MAX];
    int len = path[0] == '/' ? snprintf(joined, sizeof joined, "%s", path)
                             : snprintf(joined, sizeof joined, "%s/%s", r->models_dir, path);
    if (len < 0 || (size_t)len >= sizeof joined || !realpath(joined, out))
        return api_fail(c, 422, "invalid_request", "path", "no folder \"%.200s\" under --models-dir", path);
    if (!inside(r->models_dir, out))
        return api_fail(c, 422, "invalid_request", "path",
                        "path \"%.200s\" resolves outside --models-dir (paths must stay inside it)", path);
    struct stat st;
    if (stat(out, &st) || !S_ISDIR(st.st_mode))
        return api_fail(c, 422, "invalid_request", "path", "\"%.200s\" is not a checkpoint folder", path);
    return 0;
}

static void hook_load(api_call *c, const char *id, const char *path)
{
    registry *r = of(c->ctx);
    char dir[PATH_MAX];
    if (!valid_name(id, strlen(id))) {
        api_fail(c, 422, "invalid_request", "id", "id must be " NAME_RULE);
        return;
    }
    if (resolve_inside(c, r, path, dir)) return;
    pthread_mutex_lock(&r->lock);
    int taken = find(r, id, strlen(id)) != NULL;
    pthread_mutex_unlock(&r->lock);
    if (taken) {
        api_fail(c, 409, "model_exists", "id", "a model named \"%s\" is already loaded (DELETE it first)", id);
        return;
    }
    lens_err err = {0};
    api_model *m = load_one(id, dir, &err);
    if (!m) {
        log_msg("error", "loading model %s from %s failed: %s", id, dir, err.msg);
        char shown[sizeof err.msg];
        relative_message(shown, sizeof shown, err.msg, r->models_dir);
        record_failure(r, id, shown); /* GET /v1/models lists it until a load of this id succeeds */
        api_fail(c, 422, "load_failed", "path", "cannot load \"%.200s\": %s", path, shown);
        return;
    }
    pthread_mutex_lock(&r->lock);
    int dup = insert(r, m); /* another POST with this id may have won the race */
    if (!dup) m->refs++;    /* the answer below reads it */
    pthread_mutex_unlock(&r->lock);
    if (dup) {
        model_free(m);
        api_fail(c, 409, "model_exists", "id", "a model named \"%s\" is already loaded (DELETE it first)", id);
        return;
    }
    c->model_ref = m;
    c->model_name = m->name;
    c->status = 201;
    api_write_model_info(&c->out, m);
}

static void hook_unload(api_call *c, const char *id)
{
    registry *r = of(c->ctx);
    pthread_mutex_lock(&r->lock);
    api_model *m = NULL;
    for (int i = 0; i < r->n; i++) {
        if (strcmp(r->models[i]->name, id)) continue;
        m = r->models[i];
        memmove(&r->models[i], &r->models[i + 1], (size_t)(r->n - i - 1) * sizeof *r->models);
        r->n--;
        break;
    }
    int in_use = m ? m->refs - 1 : 0;
    pthread_mutex_unlock(&r->lock);
    if (!m) {
        api_fail(c, 404, "model_not_found", "id", "no model named \"%.100s\" is loaded (see GET /v1/models)", id);
        return;
    }
    log_msg("info", "model %s unloaded (%d request(s) or job(s) still using it)", id, in_use);
    jw *w = &c->out;
    jw_obj(w);
    jw_key(w, "id");
    jw_str(w, id);
    jw_key(w, "unloaded");
    jw_bool(w, 1);
    jw_key(w, "in_use");
    jw_int(w, in_use);
    jw_end(w);
    hook_release(c->ctx, m); /* the registry's reference; the last user frees it */
}

void registry_install(registry *r, api_ctx *ctx)
{
    ctx->registry = r;
    ctx->model_acquire = hook_acquire;
    ctx->model_release = hook_release;
    ctx->models_acquire_all = hook_acquire_all;
    ctx->model_load = hook_load;
    ctx->model_unload = hook_unload;
    ctx->write_failed_models = hook_write_failed;
}
