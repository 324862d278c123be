/* main.c - the lensd command line: serve, the analysis commands, info, mkmodel.
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
#include "core/base/blas.h"
#include "core/base/heap.h"
#include "core/model/mkmodel.h"
#include "cli/job_cli.h"
#include "cli/train_cli.h"
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
            "  attention --model DIR TEXT [--pair TEXT] [--input-ids ..] [--layers 1,..] [--heads 0,..]\n"
            "            [--identifiability | --no-identifiability] [--no-effective] [--no-raw] [--null]\n"
            "            [--precision N] [--encoding json|base64]\n"
            "            print what POST /v1/attention returns (effective attention, identifiability)\n"
            "  decompose --model DIR --length T [--layers 0,..] [--labels a,b,..] [--texts-file FILE]\n"
            "            [--keep-first-position] [--top-k K] [--definition paper-code|lensd]\n"
            "            [--[no-]topics-self-pairs] [--topics-pca K] [--screenot-k K]\n"
            "            [--reference-texts-file FILE] [TEXT..]\n"
            "            print what POST /v1/decomposition returns (texts: the arguments and/or the\n"
            "            file's non-empty lines; labels: one per text)\n"
            "  attribution --model DIR TEXT [--pair TEXT] [--target predicted|LABEL|INDEX] [--steps 20]\n"
            "            [--riemann right|left] [--quadrature riemann|gauss] [--layers 1,..] [--heads 0,..] [--no-matrices]\n"
            "            [--tree] [--tree-threshold 0.4] [--precision N] [--encoding json|base64]\n"
            "            print what POST /v1/attribution returns (BERT sequence classifiers)\n"
            "  token-identity --model DIR TEXT [--layers 0,..] [--metric cosine|l2] [--top-k 5]\n"
            "            [--mapping identity|linear] [--vocabulary]\n"
            "            print what POST /v1/token-identity returns (token identifiability rankings)\n"
            "  token-identity-map --model DIR [--texts-file FILE] [--max-texts N] [--ridge R]\n"
            "            [--heldout-fraction F] [--metric cosine|l2] [--save] [TEXT..]\n"
            "            fit the linear maps of the job \"token-identity-map\" and print its result;\n"
            "            --save writes them next to the checkpoint (then --mapping linear uses them)\n"
            "  hidden-attribution --model DIR TEXT [--layers 0,..] [--method exact|estimate]\n"
            "            [--probes 16] [--seed 1] [--norms]\n"
            "            print what POST /v1/hidden-attribution returns (Jacobian norms)\n"
            "  context-mixing --model DIR TEXT --method rollout|alti|globenc|value-zeroing|decompx [--layers 1,..]\n"
            "            [--definition paper-code|lensd]\n"
            "            print what POST /v1/context-mixing returns (per-layer and rolled-out mixing)\n"
            "  logit-attribution --model DIR TEXT --target ID|TEXT [--foil ID|TEXT] [--position P]\n"
            "            print what POST /v1/logit-attribution returns (direct logit attribution)\n"
            "  info      BLAS library, core, threads and GEMM kernel (GET /v1/info without server limits)\n"
            "  mkmodel   ");
    lens_mkmodel_usage(f, "            "); /* the families and their presets, from the registry */
    fprintf(f,
            "            [--task T] --seed N --out DIR [--vocab DIR] [--dtype f32|bf16|f16]\n"
            "            [--max-shard-size SIZE]\n"
            "            write a random-weight checkpoint in Hugging Face format (--vocab: tokenizer files\n"
            "            from a vocabulary, e.g. ../shared/vocab/gpt2 for roberta, or a folder with\n"
            "            tokenizer.json, else generated; docs/families.md has the decoder presets; SIZE as\n"
            "            transformers' max_shard_size, e.g. 5GB or 2GiB: shards + model.safetensors.index.json)\n"
            "  job       run --kind K --params FILE --shard I/N --out PART | merge --out RESULT PART...\n"
            "            one shard of a dataset job, and the merge of every shard (`lensd job` lists the options)\n"
            "  train     classify|mlm|causal|vocab ...  train a classifier / masked LM / causal LM of any family\n"
            "            with that head (--init a checkpoint, or --arch a new model),\n"
            "            learn a WordPiece or byte-level BPE vocabulary\n"
            "            (`lensd train` alone lists the options)\n"
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

    /* Threading policy (core/base/pool.h): computation is threaded by one lens_pool
     * per worker / job thread; OpenBLAS (LAPACK in the analyses) stays
     * single-threaded so the two never compete for the same cores. */
    lens_blas_set_threads(1);
    server *srv = server_start(&cfg);
    if (!srv) {
        lensd_config_free(&cfg);
        return 1;
    }
    registry *models = registry_create(&cfg);
    if (!models) {
        server_stop(srv);
        lensd_config_free(&cfg);
        return 1;
    }
    server_set_registry(srv, models);

    int sig = 0;
    sigwait(&stop, &sig);
    log_msg("info", "received %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    int left = server_drain(srv, cfg.timeout + 5);
    if (left) log_msg("warn", "%d requests still in flight at exit", left);
    server_stop(srv);
    registry_free(models);
    log_msg("info", "stopped");
    lensd_config_free(&cfg);
    return 0;
}

/* ------------------------------------------------- tokenize and forward */

/* The one-shot analysis commands: each builds the request JSON of its route
 * from options (a table per command) and positional texts. */
typedef enum { OPT_INTS, OPT_STRS, OPT_STR, OPT_INT, OPT_NUM, OPT_TRUE, OPT_FALSE, OPT_PRECISION, OPT_ENCODING,
               OPT_LINES, OPT_STR_OR_INT } opt_type;

typedef struct {
    const char *flag; /* without "--" */
    const char *key;  /* request field; dotted "tree.threshold" for one level of nesting */
    opt_type type;
} cli_opt;

typedef struct {
    const char *name;
    const char *path;     /* the POST route it prints, or a job kind's name (job = 1) */
    const char *text_key; /* first positional argument; NULL: positionals append to list_key */
    const char *list_key;
    const cli_opt *opts;
    int job;              /* 1: runs the job kind `path` in the foreground and prints its result */
} cli_command;

static const cli_opt common_opts[] = {
    {"pair", "text_pair", OPT_STR}, {"input-ids", "input_ids", OPT_INTS}, {"precision", "format", OPT_PRECISION},
    {"encoding", "format", OPT_ENCODING}, {NULL, NULL, 0}};
static const cli_opt tokenize_opts[] = {{"pair", "text_pair", OPT_STR}, {NULL, NULL, 0}};
static const cli_opt forward_opts[] = {
    {"outputs", "outputs", OPT_STRS}, {"layers", "layers", OPT_INTS}, {"heads", "heads", OPT_INTS},
    {"positions", "positions", OPT_INTS}, {NULL, NULL, 0}};
static const cli_opt attention_opts[] = {
    {"layers", "layers", OPT_INTS}, {"heads", "heads", OPT_INTS},
    {"identifiability", "identifiability", OPT_TRUE}, {"no-identifiability", "identifiability", OPT_FALSE},
    {"no-effective", "effective", OPT_FALSE}, {"no-raw", "include_raw", OPT_FALSE}, {"null", "null", OPT_TRUE},
    {NULL, NULL, 0}};

static const cli_opt decompose_opts[] = {
    {"length", "length", OPT_INT}, {"layers", "layers", OPT_INTS}, {"labels", "labels", OPT_STRS},
    {"texts-file", "texts", OPT_LINES}, {"keep-first-position", "drop_first_position", OPT_FALSE},
    {"top-k", "top_k", OPT_INT}, {"definition", "definition", OPT_STR},
    {"topics-self-pairs", "topics_self_pairs", OPT_TRUE}, {"no-topics-self-pairs", "topics_self_pairs", OPT_FALSE},
    {"topics-pca", "topics_pca", OPT_INT}, {"screenot-k", "screenot_k", OPT_INT},
    {"reference-texts-file", "reference_texts", OPT_LINES}, {NULL, NULL, 0}};

static const cli_opt attribution_opts[] = {
    {"target", "target", OPT_STR_OR_INT}, {"steps", "steps", OPT_INT}, {"riemann", "riemann", OPT_STR},
    {"quadrature", "quadrature", OPT_STR}, {"layers", "layers", OPT_INTS}, {"heads", "heads", OPT_INTS}, {"no-matrices", "include_matrices", OPT_FALSE},
    {"tree", "tree", OPT_TRUE}, {"tree-threshold", "tree.threshold", OPT_NUM}, {NULL, NULL, 0}};

static const cli_opt token_identity_opts[] = {
    {"layers", "layers", OPT_INTS}, {"metric", "metric", OPT_STR}, {"top-k", "top_k", OPT_INT},
    {"mapping", "mapping", OPT_STR}, {"vocabulary", "vocabulary", OPT_TRUE}, {NULL, NULL, 0}};

static const cli_opt hidden_attribution_opts[] = {
    {"layers", "layers", OPT_INTS}, {"method", "method", OPT_STR}, {"probes", "probes", OPT_INT},
    {"seed", "seed", OPT_INT}, {"norms", "include_norms", OPT_TRUE}, {NULL, NULL, 0}};

static const cli_opt context_mixing_opts[] = {
    {"layers", "layers", OPT_INTS}, {"method", "method", OPT_STR}, {"definition", "definition", OPT_STR},
    {NULL, NULL, 0}};

static const cli_opt logit_attribution_opts[] = {
    {"target", "target", OPT_STR_OR_INT}, {"foil", "foil", OPT_STR_OR_INT}, {"position", "position", OPT_INT}, {NULL, NULL, 0}};

static const cli_opt token_identity_map_opts[] = {
    {"texts-file", "texts", OPT_LINES}, {"max-texts", "max_texts", OPT_INT}, {"ridge", "ridge", OPT_NUM},
    {"heldout-fraction", "heldout_fraction", OPT_NUM}, {"metric", "metric", OPT_STR}, {"save", "save", OPT_TRUE},
    {NULL, NULL, 0}};

static const cli_command commands[] = {
    {"tokenize", "/v1/tokenize", "text", NULL, tokenize_opts, 0},
    {"forward", "/v1/forward", "text", NULL, forward_opts, 0},
    {"attention", "/v1/attention", "text", NULL, attention_opts, 0},
    {"decompose", "/v1/decomposition", NULL, "texts", decompose_opts, 0},
    {"attribution", "/v1/attribution", "text", NULL, attribution_opts, 0},
    {"token-identity", "/v1/token-identity", "text", NULL, token_identity_opts, 0},
    {"hidden-attribution", "/v1/hidden-attribution", "text", NULL, hidden_attribution_opts, 0},
    {"context-mixing", "/v1/context-mixing", "text", NULL, context_mixing_opts, 0},
    {"logit-attribution", "/v1/logit-attribution", "text", NULL, logit_attribution_opts, 0},
    {"token-identity-map", "token-identity-map", NULL, "texts", token_identity_map_opts, 1},
};

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

/* Non-empty lines of a file as strings; NULL when it cannot be read. */
static json_t *file_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    json_t *arr = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n > 0) json_array_append_new(arr, json_stringn(line, (size_t)n));
    }
    free(line);
    fclose(f);
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

static const cli_opt *find_opt(const cli_opt *opts, const char *flag)
{
    for (int i = 0; opts[i].flag; i++)
        if (!strcmp(opts[i].flag, flag)) return &opts[i];
    return NULL;
}

/* Sets key (or "outer.inner") of body to v (stolen). */
static void set_field(json_t *body, const char *key, json_t *v)
{
    const char *dot = strchr(key, '.');
    if (!dot) {
        json_object_set_new(body, key, v);
        return;
    }
    char outer[64];
    snprintf(outer, sizeof outer, "%.*s", (int)(dot - key), key);
    json_t *o = json_object_get(body, outer);
    if (!json_is_object(o)) {
        o = json_object();
        json_object_set_new(body, outer, o);
    }
    json_object_set_new(o, dot + 1, v);
}

/* Applies one option; returns 1 when it consumed val, 0 when not, -1 on error. */
static int apply_opt(json_t *body, const cli_opt *o, const char *arg, const char *val)
{
    if (o->type == OPT_TRUE || o->type == OPT_FALSE) {
        set_field(body, o->key, json_boolean(o->type == OPT_TRUE));
        return 0;
    }
    if (!val) {
        fprintf(stderr, "lensd: %s needs a value\n", arg);
        return -1;
    }
    json_t *v = NULL;
    char *end;
    switch (o->type) {
    case OPT_INTS:
        if (!(v = int_list(val))) fprintf(stderr, "lensd: %s wants a comma-separated list of integers\n", arg);
        break;
    case OPT_STRS: v = str_list(val); break;
    case OPT_STR: v = json_string(val); break;
    case OPT_STR_OR_INT: {
        long long x = strtoll(val, &end, 10);
        v = end != val && !*end ? json_integer(x) : json_string(val);
        break;
    }
    case OPT_LINES:
        if (!(v = file_lines(val))) fprintf(stderr, "lensd: %s: cannot read %s\n", arg, val);
        break;
    case OPT_INT: {
        long long x = strtoll(val, &end, 10);
        if (end == val || *end) fprintf(stderr, "lensd: %s wants an integer\n", arg);
        else v = json_integer(x);
        break;
    }
    case OPT_NUM: {
        double x = strtod(val, &end);
        if (end == val || *end) fprintf(stderr, "lensd: %s wants a number\n", arg);
        else v = json_real(x);
        break;
    }
    case OPT_PRECISION:
    case OPT_ENCODING: {
        json_t *format = json_object_get(body, "format");
        if (!format) {
            format = json_object();
            json_object_set_new(body, "format", format);
        }
        if (o->type == OPT_PRECISION) json_object_set_new(format, "precision", json_integer(atoi(val)));
        else json_object_set_new(format, "encoding", json_string(val));
        return 1;
    }
    default: break;
    }
    if (!v) return -1;
    set_field(body, o->key, v);
    return 1;
}

/* lensd <analysis command>: argv after the command name. */
static int cmd_request(const cli_command *cmd, int argc, char **argv)
{
    const char *dir = NULL;
    json_t *body = json_object();
    int bad = 0;
    for (int a = 0; a < argc && !bad; a++) {
        const char *arg = argv[a];
        const char *val = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(arg, "--model")) {
            if (!val) {
                fprintf(stderr, "lensd: --model needs a value\n");
                bad = 1;
            }
            dir = val, a++;
        } else if (!strncmp(arg, "--", 2)) {
            const cli_opt *o = find_opt(cmd->opts, arg + 2);
            if (!o && cmd->text_key && cmd->opts != tokenize_opts) o = find_opt(common_opts, arg + 2);
            if (!o) {
                fprintf(stderr, "lensd %s: unknown option %s\n", cmd->name, arg);
                bad = 1;
                break;
            }
            int used = apply_opt(body, o, arg, val);
            if (used < 0) bad = 1;
            a += used > 0;
        } else if (cmd->text_key && !json_object_get(body, cmd->text_key)) {
            json_object_set_new(body, cmd->text_key, json_string(arg));
        } else if (cmd->list_key) {
            json_t *list = json_object_get(body, cmd->list_key);
            if (!json_is_array(list)) {
                list = json_array();
                json_object_set_new(body, cmd->list_key, list);
            }
            json_array_append_new(list, json_string(arg));
        } else {
            fprintf(stderr, "lensd: unexpected argument \"%s\"\n", arg);
            bad = 1;
        }
    }
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
    /* tokenize also takes a folder of tokenizer files only (no config.json) */
    char config[4096];
    snprintf(config, sizeof config, "%s/config.json", dir);
    int tok_only = cmd->opts == tokenize_opts && access(config, F_OK) != 0;
    lens_model *m = tok_only ? lens_model_tokenizer_only(dir, &err) : lens_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "lensd: %s\n", err.msg);
        json_decref(body);
        return 1;
    }
    api_model am = {.name = (char *)basename_of(dir), .model = m};
    if (api_model_load_maps(&am, &err) < 0) fprintf(stderr, "lensd: ignoring the token identity maps: %s\n", err.msg);
    api_ctx ctx = {.models = &am, .n_models = 1, .max_tokens = INT_MAX};
    api_call call;
    api_call_init(&call, &ctx, api_now());
    call.body = body;
    api_prepare_fn prepare = NULL;
    api_run_fn run = NULL;
    if (cmd->job) {
        const api_job_kind *kind = api_job_kind_find(cmd->path);
        prepare = kind->prepare, run = kind->run;
    } else {
        for (int i = 0; i < api_n_routes; i++)
            if (!strcmp(api_routes[i].path, cmd->path) && !strcmp(api_routes[i].method, "POST")) {
                call.route = &api_routes[i];
                prepare = call.route->prepare, run = call.route->run;
            }
    }
    lens_blas_set_threads(1); /* computation threads come from the pool (core/base/pool.h) */
    call.threads = lens_pool_create((int)sysconf(_SC_NPROCESSORS_ONLN));
    if (prepare(&call) == 0 && !call.answered) run(&call);
    lens_pool_free(call.threads);
    fwrite(call.out.buf, 1, call.out.len, stdout);
    fputc('\n', stdout);
    int status = call.status;
    api_call_free(&call);
    api_model_drop_maps(&am);
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
    const char *arch = NULL, *preset = NULL, *task = NULL, *out = NULL, *vocab = NULL;
    unsigned long long seed = 1;
    lens_mkmodel_out how = {LENS_DT_F32, 0};
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
        else if (!strcmp(argv[a], "--vocab")) vocab = val;
        else if (!strcmp(argv[a], "--dtype") && lens_dtype_parse(val, &how.dtype)) {
            fprintf(stderr, "lensd mkmodel: --dtype %s: expected f32, bf16 or f16\n", val);
            return 2;
        } else if (!strcmp(argv[a], "--max-shard-size") && (lens_parse_size(val, &how.max_shard_bytes) ||
                                                             !how.max_shard_bytes)) {
            fprintf(stderr, "lensd mkmodel: --max-shard-size %s: expected a size such as 5GB, 500MB or 2GiB\n", val);
            return 2;
        } else if (strcmp(argv[a], "--dtype") && strcmp(argv[a], "--max-shard-size")) {
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
    if (lens_mkmodel_write(arch, preset, task, seed, vocab, out, &how, &err)) {
        fprintf(stderr, "lensd mkmodel: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    lens_blas_setup(argv);
    lens_heap_setup();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 2, argv + 2);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(cmd, commands[i].name)) return cmd_request(&commands[i], argc - 2, argv + 2);
    if (!strcmp(cmd, "info")) return cmd_info();
    if (!strcmp(cmd, "mkmodel")) return cmd_mkmodel(argc - 2, argv + 2);
    if (!strcmp(cmd, "train")) return lensd_cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "job")) return lensd_cmd_job(argc - 2, argv + 2);
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
