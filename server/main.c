/* main.c - the lensd command line: serve, tokenize, forward, info, mkmodel.
 *
 * Owns: argument parsing of the one-shot subcommands, signal handling and
 * the start-up / shutdown sequence of `serve`. tokenize and forward build
 * the same request JSON a client would POST and go through the same api/
 * prepare + run functions, so they print exactly what the HTTP API returns
 * (timing values aside). */
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "core/blas.h"
#include "core/mkmodel.h"
#include "server/config.h"
#include "server/http.h"
#include "server/log.h"
#include "server/registry.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lensd <command> [options]\n\n"
            "commands:\n"
            "  serve     serve the HTTP/JSON API (lensd serve --help)\n"
            "  tokenize  --model DIR TEXT [--pair TEXT]\n"
            "            print what POST /v1/tokenize returns\n"
            "  forward   --model DIR TEXT [--pair TEXT] [--input-ids 1,2,..]\n"
            "            [--outputs logits,hidden_states,attentions] [--layers 0,1,..]\n"
            "            [--heads 0,1,..] [--positions 0,1,..] [--precision N]\n"
            "            [--encoding json|base64]\n"
            "            print what POST /v1/forward returns\n"
            "  info      BLAS library, core and threads (GET /v1/info without server limits)\n"
            "  mkmodel   --arch bert|gpt2 --preset tiny|small|base [--task T] --seed N --out DIR\n"
            "            write a random-weight checkpoint in Hugging Face format\n"
            "  version   print the version\n");
}

/* ------------------------------------------------------------------ serve */

static int cmd_serve(int argc, char **argv)
{
    lensd_config cfg;
    int rc = lensd_config_parse(&cfg, argc, argv);
    if (rc) {
        lensd_config_free(&cfg);
        return rc > 0 ? 0 : 2;
    }
    /* Signals go to this thread only (sigwait below); every thread started
     * from here on inherits the mask. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    lens_blas_set_threads(cfg.threads_per_worker);
    server *srv = server_start(&cfg);
    if (!srv) {
        lensd_config_free(&cfg);
        return 1;
    }
    api_model *models = NULL;
    int n_models = 0;
    if (registry_load(&cfg, &models, &n_models)) {
        server_stop(srv);
        lensd_config_free(&cfg);
        return 1;
    }
    server_set_models(srv, models, n_models);

    int sig = 0;
    sigwait(&stop, &sig);
    log_msg("info", "received %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    int left = server_drain(srv, cfg.timeout + 5);
    if (left) log_msg("warn", "%d requests still in flight at exit", left);
    server_stop(srv);
    registry_free(models, n_models);
    log_msg("info", "stopped");
    lensd_config_free(&cfg);
    return 0;
}

/* ------------------------------------------------- tokenize and forward */

/* "1,2,3" -> [1,2,3]; NULL on a malformed list. */
static json_t *int_list(const char *s)
{
    json_t *arr = json_array();
    char *copy = strdup(s), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long long v = strtoll(tok, &end, 10);
        if (end == tok || *end) {
            json_decref(arr);
            arr = NULL;
            break;
        }
        json_array_append_new(arr, json_integer(v));
    }
    free(copy);
    return arr;
}

static json_t *str_list(const char *s)
{
    json_t *arr = json_array();
    char *copy = strdup(s), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        json_array_append_new(arr, json_string(tok));
    free(copy);
    return arr;
}

static const char *basename_of(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    static char name[256];
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(name, sizeof name, "%.*s", (int)(n - start), dir + start);
    return name;
}

/* lensd tokenize|forward: argv after the command name. */
static int cmd_request(int forward, int argc, char **argv)
{
    const char *dir = NULL;
    json_t *body = json_object(), *format = json_object();
    int bad = 0;
    for (int a = 0; a < argc && !bad; a++) {
        const char *arg = argv[a];
        const char *val = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strncmp(arg, "--", 2) && !val) {
            fprintf(stderr, "lensd: %s needs a value\n", arg);
            bad = 1;
            break;
        }
        if (!strcmp(arg, "--model")) dir = val, a++;
        else if (!strcmp(arg, "--pair")) json_object_set_new(body, "text_pair", json_string(val)), a++;
        else if (forward && !strcmp(arg, "--outputs")) json_object_set_new(body, "outputs", str_list(val)), a++;
        else if (forward && (!strcmp(arg, "--layers") || !strcmp(arg, "--heads") || !strcmp(arg, "--positions") ||
                             !strcmp(arg, "--input-ids"))) {
            json_t *list = int_list(val);
            if (!list) {
                fprintf(stderr, "lensd: %s wants a comma-separated list of integers\n", arg);
                bad = 1;
            } else {
                char key[32];
                snprintf(key, sizeof key, "%s", arg + 2);
                if (!strcmp(key, "input-ids")) strcpy(key, "input_ids");
                json_object_set_new(body, key, list);
            }
            a++;
        } else if (forward && !strcmp(arg, "--precision")) {
            json_object_set_new(format, "precision", json_integer(atoi(val)));
            a++;
        } else if (forward && !strcmp(arg, "--encoding")) {
            json_object_set_new(format, "encoding", json_string(val));
            a++;
        } else if (!strncmp(arg, "--", 2)) {
            fprintf(stderr, "lensd: unknown option %s\n", arg);
            bad = 1;
        } else if (!json_object_get(body, "text")) {
            json_object_set_new(body, "text", json_string(arg));
        } else {
            fprintf(stderr, "lensd: unexpected argument \"%s\"\n", arg);
            bad = 1;
        }
    }
    if (json_object_size(format)) json_object_set(body, "format", format);
    json_decref(format);
    if (!bad && !dir) {
        fprintf(stderr, "lensd: --model DIR is required\n");
        bad = 1;
    }
    if (bad) {
        json_decref(body);
        usage(stderr);
        return 2;
    }

    lens_err err = {0};
    lens_model *m = lens_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "lensd: %s\n", err.msg);
        json_decref(body);
        return 1;
    }
    api_model am = {.name = (char *)basename_of(dir), .model = m};
    api_ctx ctx = {.models = &am, .n_models = 1, .max_tokens = INT_MAX};
    api_call call;
    api_call_init(&call, &ctx, api_now());
    call.body = body;
    const api_route *route = NULL;
    for (int i = 0; i < api_n_routes; i++)
        if (!strcmp(api_routes[i].path, forward ? "/v1/forward" : "/v1/tokenize")) route = &api_routes[i];
    call.route = route;
    if (route->prepare(&call) == 0) route->run(&call);
    fwrite(call.out.buf, 1, call.out.len, stdout);
    fputc('\n', stdout);
    int status = call.status;
    api_call_free(&call);
    lens_model_free(m);
    return status == 200 ? 0 : 1;
}

/* ------------------------------------------------------------ info, mkmodel */

static int cmd_info(void)
{
    jw w;
    jw_init(&w);
    api_write_info(&w, NULL);
    fwrite(w.buf, 1, w.len, stdout);
    fputc('\n', stdout);
    jw_free(&w);
    return 0;
}

static int cmd_mkmodel(int argc, char **argv)
{
    const char *arch = NULL, *preset = NULL, *task = NULL, *out = NULL;
    unsigned long long seed = 1;
    for (int a = 0; a < argc; a++) {
        const char *val = a + 1 < argc ? argv[a + 1] : NULL;
        if (!val) {
            fprintf(stderr, "lensd mkmodel: %s needs a value\n", argv[a]);
            return 2;
        }
        if (!strcmp(argv[a], "--arch")) arch = val;
        else if (!strcmp(argv[a], "--preset")) preset = val;
        else if (!strcmp(argv[a], "--task")) task = val;
        else if (!strcmp(argv[a], "--seed")) seed = strtoull(val, NULL, 10);
        else if (!strcmp(argv[a], "--out")) out = val;
        else {
            fprintf(stderr, "lensd mkmodel: unknown option %s\n", argv[a]);
            return 2;
        }
        a++;
    }
    if (!arch || !preset || !out) {
        fprintf(stderr, "lensd mkmodel: --arch, --preset and --out are required (presets:");
        for (int i = 0; lens_mkmodel_presets[i]; i++) fprintf(stderr, " %s", lens_mkmodel_presets[i]);
        fprintf(stderr, ")\n");
        return 2;
    }
    lens_err err = {0};
    if (lens_mkmodel(arch, preset, task, seed, out, &err)) {
        fprintf(stderr, "lensd mkmodel: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_request(0, argc - 2, argv + 2);
    if (!strcmp(cmd, "forward")) return cmd_request(1, argc - 2, argv + 2);
    if (!strcmp(cmd, "info")) return cmd_info();
    if (!strcmp(cmd, "mkmodel")) return cmd_mkmodel(argc - 2, argv + 2);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("lensd %s\n", LENSD_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "lensd: unknown command \"%s\"\n", cmd);
    usage(stderr);
    return 2;
}
