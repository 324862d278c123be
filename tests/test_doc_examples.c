/* test_doc_examples.c - every curl example in README.md and the docs/ pages runs.
 *
 * Extracts the curl commands of the ```sh blocks (a command continues over
 * lines ending in a backslash and while a quote is open), starts lensd on
 * the demo models in models/, points each command at it (localhost:8080 ->
 * 127.0.0.1:PORT), runs it under bash and then under zsh (the shells users
 * paste into: zsh refuses an unquoted "?" that matches no file), and checks
 * a 2xx status and a JSON body (Prometheus text for /metrics). Fails when no
 * example is found, so a renamed block or file cannot turn it into a test of
 * nothing. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "tests/http_util.h"

#define MAX_EXAMPLES 128

typedef struct {
    char file[128];
    char *cmd;
} example;

static example examples[MAX_EXAMPLES];
static int n_examples;

static int quotes_open(const char *s)
{
    int single = 0, dbl = 0;
    for (; *s; s++) {
        if (*s == '\'' && !dbl) single = !single;
        else if (*s == '"' && !single) dbl = !dbl;
    }
    return single || dbl;
}

/* Drops a trailing "# comment" outside quotes. */
static void strip_comment(char *s)
{
    int single = 0, dbl = 0;
    for (char *p = s; *p; p++) {
        if (*p == '\'' && !dbl) single = !single;
        else if (*p == '"' && !single) dbl = !dbl;
        else if (*p == '#' && !single && !dbl && (p == s || p[-1] == ' ')) {
            *p = 0;
            break;
        }
    }
}

static void collect(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    int in_sh = 0;
    char *cmd = NULL;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "```", 3)) {
            in_sh = !in_sh && !strcmp(line, "```sh");
            continue;
        }
        if (!in_sh) continue;
        const char *t = line;
        while (*t == ' ') t++;
        if (!cmd && strncmp(t, "curl ", 5)) continue;
        size_t have = cmd ? strlen(cmd) : 0, add = strlen(t);
        cmd = realloc(cmd, have + add + 2);
        if (have) cmd[have++] = ' ';
        memcpy(cmd + have, t, add + 1);
        size_t n = strlen(cmd);
        if (n && cmd[n - 1] == '\\') {
            cmd[n - 1] = 0;
            continue;
        }
        if (quotes_open(cmd)) continue;
        strip_comment(cmd);
        if (n_examples < MAX_EXAMPLES) {
            snprintf(examples[n_examples].file, sizeof examples[n_examples].file, "%s", path);
            examples[n_examples++].cmd = cmd;
        } else {
            free(cmd);
        }
        cmd = NULL;
    }
    free(cmd);
    fclose(f);
}

/* cmd with localhost:8080 -> 127.0.0.1:port and JOB_ID -> job_id, writing
 * the body to out and printing the status. */
static char *runnable(const char *cmd, int port, const char *job_id, const char *out)
{
    size_t cap = strlen(cmd) + 512;
    char *s = malloc(cap), *d = s;
    for (const char *p = cmd; *p;) {
        if (!strncmp(p, "localhost:8080", 14)) {
            d += sprintf(d, "127.0.0.1:%d", port);
            p += 14;
        } else if (!strncmp(p, "JOB_ID", 6)) {
            d += sprintf(d, "%.60s", job_id);
            p += 6;
        } else {
            *d++ = *p++;
        }
    }
    sprintf(d, " -o %s -w '%%{http_code}'", out);
    return s;
}

/* Runs one example under shell (as a script file, as a user's paste would
 * run) and checks its status and body; 1 when it ran. */
static int run_example(const example *ex, const char *shell, int port, const char *job_id, const char *script,
                       const char *out)
{
    char *cmd = runnable(ex->cmd, port, job_id, out);
    FILE *f = fopen(script, "w");
    if (f) {
        fprintf(f, "%s\n", cmd);
        fclose(f);
    }
    free(cmd);
    remove(out);
    char line[160];
    snprintf(line, sizeof line, "%s %s 2>&1", shell, script);
    FILE *p = f ? popen(line, "r") : NULL;
    char status[256] = "";
    if (p) {
        if (!fgets(status, sizeof status, p)) status[0] = 0;
        pclose(p);
    }
    status[strcspn(status, "\n")] = 0;
    json_error_t jerr;
    json_t *body = json_load_file(out, JSON_DECODE_ANY, &jerr);
    /* not JSON by design: Prometheus text, the YAML spec, a Server-Sent Events stream */
    int metrics = strstr(ex->cmd, "/metrics") || strstr(ex->cmd, "/openapi.yaml") || strstr(ex->cmd, "/events");
    int code = atoi(status);
    CHECK(code >= 200 && code < 300 && (body || metrics), "%s under %s: %.160s -> status %s, %s", ex->file, shell,
          ex->cmd, status, body || metrics ? "body ok" : jerr.text);
    json_decref(body);
    return p != NULL;
}

int main(void)
{
    collect("README.md");
    DIR *dir = opendir("docs");
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 3 || strcmp(e->d_name + n - 3, ".md")) continue;
        char path[512];
        snprintf(path, sizeof path, "docs/%s", e->d_name);
        collect(path);
    }
    if (dir) closedir(dir);
    (void)yaml_load_file; /* http_util.h: the OpenAPI reader is not needed here */
    CHECK(n_examples >= 12, "%d curl examples in ```sh blocks of README.md and docs/ (expected at least 12)",
          n_examples);
    const char *models[] = {"demo-sst2", "demo-mlm", "demo-identifiable", "demo-gpt2"};
    for (int i = 0; i < 4; i++) {
        char cfg[128];
        snprintf(cfg, sizeof cfg, "models/%s/config.json", models[i]);
        if (access(cfg, R_OK)) {
            SKIP("models/%s is absent: the %d curl examples are not run", models[i], n_examples);
            return check_done("test_doc_examples");
        }
    }
    /* --models-dir models: the demo models by folder name, and the folder
     * the README's POST /v1/models example loads a second copy from */
    const char *args[] = {"--models-dir", "models", "--timeout", "300", NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "lensd serve on the demo models did not start");
        return check_done("test_doc_examples");
    }
    /* a finished job for the examples that name JOB_ID */
    static const char job[] = "{\"kind\": \"decomposition\", \"params\": {\"model\": \"demo-sst2\", "
                              "\"windows\": [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007]]}}";
    http_resp jr;
    char job_id[64] = "none";
    if (http_do(&s, &jr, "POST", "/v1/jobs", "application/json", job, sizeof job - 1, NULL) == 0 && jr.body) {
        json_t *j = json_loads(jr.body, 0, NULL);
        if (json_string_value(json_object_get(j, "id")))
            snprintf(job_id, sizeof job_id, "%s", json_string_value(json_object_get(j, "id")));
        json_decref(j);
    }
    CHECK(strcmp(job_id, "none"), "POST /v1/jobs for the JOB_ID examples answered %ld", jr.status);
    http_resp_free(&jr);
    char out[64], script[64];
    snprintf(out, sizeof out, "/tmp/lensd-doc-example-%d.out", (int)getpid());
    snprintf(script, sizeof script, "/tmp/lensd-doc-example-%d.sh", (int)getpid());
    /* every example in one shell, then in the next: the load / unload pair
     * runs in order once per shell */
    const char *shells[] = {"bash", "zsh"};
    int ran = 0;
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n_examples; i++) ran += run_example(&examples[i], shells[k], s.port, job_id, script, out);
    }
    for (int i = 0; i < n_examples; i++) free(examples[i].cmd);
    remove(out);
    remove(script);
    printf("%d curl examples run against lensd on the demo models, under bash and zsh (%d runs)\n", n_examples, ran);
    CHECK(server_terminate(&s) == 0, "lensd exits 0");
    return check_done("test_doc_examples");
}
