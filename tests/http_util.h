/* http_util.h - helpers for the HTTP integration tests (header-only, since
 * every tests/test_*.c links alone): start the real lensd binary on a free
 * port, talk to it with libcurl, and check responses against openapi.yaml
 * with a small reader for the block-YAML subset that file uses and a
 * validator for the schema keywords it uses ($ref, type, nullable,
 * required, properties, additionalProperties: false, items, enum, oneOf).
 * With LENSD_RESPONSE_LOG set, every response is also appended to that file
 * as a JSON line {method, path, status, content_type, body}, which
 * tests/openapi_validate.py checks with its own validator (make test). */
#ifndef LENS_TESTS_HTTP_UTIL_H
#define LENS_TESTS_HTTP_UTIL_H

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ server */

typedef struct {
    pid_t pid;
    int port;
    char log_path[512];
} test_server;

static const char *lensd_path(void)
{
    static char path[512];
    const char *build = getenv("BUILD");
    snprintf(path, sizeof path, "%s/lensd", build && *build ? build : "build");
    return path;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct {
    long status;
    char method[16];
    char path[512];
    char *body;
    size_t len;
    char headers[8192];
    size_t headers_len;
    json_t *json; /* parsed body, or NULL */
} http_resp;

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    http_resp *r = arg;
    size_t k = size * n;
    char *grown = realloc(r->body, r->len + k + 1);
    if (!grown) return 0;
    r->body = grown;
    memcpy(r->body + r->len, data, k);
    r->len += k;
    r->body[r->len] = 0;
    return k;
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    http_resp *r = arg;
    size_t k = size * n;
    if (r->headers_len + k < sizeof r->headers) {
        memcpy(r->headers + r->headers_len, data, k);
        r->headers_len += k;
        r->headers[r->headers_len] = 0;
    }
    return k;
}

static void http_resp_free(http_resp *r)
{
    free(r->body);
    if (r->json) json_decref(r->json);
    memset(r, 0, sizeof *r);
}

/* A prepared easy handle; the caller owns the returned header list via *hl. */
static CURL *http_easy(int port, http_resp *r, const char *method, const char *path, const char *ctype,
                       const char *body, size_t body_len, const char *const *headers, struct curl_slist **hl)
{
    memset(r, 0, sizeof *r);
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->path, sizeof r->path, "%s", path);
    CURL *c = curl_easy_init();
    char url[1024];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    struct curl_slist *list = curl_slist_append(NULL, "Expect:");
    char ct[256];
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)body_len);
    }
    if (ctype) snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
    else snprintf(ct, sizeof ct, "Content-Type:"); /* removes curl's default */
    list = curl_slist_append(list, ct);
    for (int i = 0; headers && headers[i]; i++) list = curl_slist_append(list, headers[i]);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
    *hl = list;
    return c;
}

static int http_header(const http_resp *r, const char *name, char *out, size_t out_size);

/* One JSON line per response for tests/openapi_validate.py (LENSD_RESPONSE_LOG). */
static void log_response(const http_resp *r)
{
    const char *path = getenv("LENSD_RESPONSE_LOG");
    if (!path || !*path || r->status == 0) return;
    char ct[256];
    http_header(r, "Content-Type", ct, sizeof ct);
    json_t *line = json_pack("{s:s, s:s, s:I, s:s, s:s%}", "method", r->method, "path", r->path, "status",
                             (json_int_t)r->status, "content_type", ct, "body", r->body ? r->body : "",
                             r->body ? r->len : 0);
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    FILE *f = text ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "%s\n", text); /* one fprintf per line: whole lines even with parallel writers */
        fclose(f);
    }
    free(text);
    json_decref(line);
}

static void http_finish(CURL *c, http_resp *r, struct curl_slist *hl)
{
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
    if (r->body) r->json = json_loadb(r->body, r->len, JSON_DECODE_ANY, NULL);
    log_response(r);
}

static int http_do_port(int port, http_resp *r, const char *method, const char *path, const char *ctype,
                        const char *body, size_t body_len, const char *const *headers)
{
    struct curl_slist *hl;
    CURL *c = http_easy(port, r, method, path, ctype, body, body_len, headers, &hl);
    CURLcode rc = curl_easy_perform(c);
    http_finish(c, r, hl);
    return rc == CURLE_OK ? 0 : -1;
}

static int http_do(const test_server *s, http_resp *r, const char *method, const char *path, const char *ctype,
                   const char *body, size_t body_len, const char *const *headers)
{
    return http_do_port(s->port, r, method, path, ctype, body, body_len, headers);
}

static int http_get(const test_server *s, http_resp *r, const char *path)
{
    return http_do(s, r, "GET", path, NULL, NULL, 0, NULL);
}

static int http_post_json(const test_server *s, http_resp *r, const char *path, const char *body)
{
    return http_do(s, r, "POST", path, "application/json", body, strlen(body), NULL);
}

static int http_header(const http_resp *r, const char *name, char *out, size_t out_size)
{
    size_t n = strlen(name);
    const char *p = r->headers;
    while (p && *p) {
        const char *eol = strstr(p, "\r\n");
        if (!eol) eol = p + strlen(p);
        if ((size_t)(eol - p) > n && !strncasecmp(p, name, n) && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ') v++;
            snprintf(out, out_size, "%.*s", (int)(eol - v), v);
            return 0;
        }
        p = *eol ? eol + 2 : eol;
    }
    if (out_size) out[0] = 0;
    return -1;
}

/* Forks lensd serve on a free port with args (stderr to s->log_path); does not wait. */
static int server_spawn(test_server *s, const char *const *args)
{
    static int counter;
    memset(s, 0, sizeof *s);
    s->port = free_port();
    snprintf(s->log_path, sizeof s->log_path, "/tmp/lensd-test-%d-%d.log", (int)getpid(), counter++);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
    const char *argv[64];
    int k = 0;
    argv[k++] = lensd_path();
    argv[k++] = "serve";
    argv[k++] = "--listen";
    argv[k++] = listen;
    int pinned = 0;
    for (int i = 0; args[i] && k < 60; i++) {
        pinned |= !strcmp(args[i], "--debug-gflops");
        argv[k++] = args[i];
    }
    /* The cost model's rate pinned unless the test pins its own: measured, it
     * depends on the build and the machine's load (an ASan build's calibration
     * GEMM is several times slower, and make test-asan's test_http_analyses got
     * 413s and timeouts that the normal build did not). 1000 GFLOP/s refuses
     * nothing these tests send; the cost-model tests pin 10 to see the 413. */
    if (!pinned) argv[k++] = "--debug-gflops", argv[k++] = "1000";
    argv[k] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    return 0;
}

/* server_spawn, then waits until /readyz answers 200 (-1 if lensd exits or 30 s pass). */
static int server_launch(test_server *s, const char *const *args)
{
    if (server_spawn(s, args)) return -1;
    const pid_t pid = s->pid;
    for (int i = 0; i < 600; i++) { /* 30 s: ASan builds load slowly */
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "lensd exited during start-up; log %s\n", s->log_path);
            s->pid = 0;
            return -1;
        }
        http_resp r;
        if (http_do_port(s->port, &r, "GET", "/readyz", NULL, NULL, 0, NULL) == 0 && r.status == 200) {
            http_resp_free(&r);
            return 0;
        }
        http_resp_free(&r);
        sleep_ms(50);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    s->pid = 0;
    return -1;
}

/* 1 when the server's log (its stderr) contains needle */
static inline int log_contains(const test_server *s, const char *needle)
{
    FILE *f = fopen(s->log_path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* Exit status after SIGTERM, or -1 (killed by a signal / did not exit in 30 s). */
static int server_wait_exit(test_server *s, int seconds)
{
    for (int i = 0; i < seconds * 20; i++) {
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        sleep_ms(50);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

static int server_terminate(test_server *s)
{
    if (!s->pid) return -1;
    kill(s->pid, SIGTERM);
    return server_wait_exit(s, 30);
}

/* ------------------------------------------------------------------ YAML */

typedef struct {
    int indent;
    char *text;
} yaml_line;

static json_t *yaml_scalar(const char *s)
{
    size_t n = strlen(s);
    if (n >= 2 && (s[0] == '"' || s[0] == '\'') && s[n - 1] == s[0]) {
        char *out = malloc(n), *d = out;
        for (size_t i = 1; i + 1 < n; i++) {
            if (s[0] == '"' && s[i] == '\\' && i + 2 < n) i++;
            *d++ = s[i];
        }
        *d = 0;
        json_t *v = json_string(out);
        free(out);
        return v;
    }
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        json_t *arr = json_array();
        char *copy = strndup(s + 1, n - 2), *save = NULL;
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            while (*tok == ' ') tok++;
            size_t k = strlen(tok);
            while (k && tok[k - 1] == ' ') tok[--k] = 0;
            if (k) json_array_append_new(arr, yaml_scalar(tok));
        }
        free(copy);
        return arr;
    }
    if (!strcmp(s, "true")) return json_true();
    if (!strcmp(s, "false")) return json_false();
    if (!strcmp(s, "null") || !strcmp(s, "~")) return json_null();
    char *end;
    long long v = strtoll(s, &end, 10);
    if (n && !*end && end != s) return json_integer(v);
    return json_string(s);
}

/* Split "key: value" (key may be quoted); returns 0 and sets key / value. */
static int yaml_split(char *text, char **key, char **value)
{
    char *colon;
    if (text[0] == '"' || text[0] == '\'') {
        char *close = strchr(text + 1, text[0]);
        if (!close || close[1] != ':') return -1;
        *close = 0;
        *key = text + 1;
        colon = close + 1;
    } else {
        colon = strstr(text, ": ");
        if (!colon) {
            size_t n = strlen(text);
            if (n && text[n - 1] == ':') colon = text + n - 1;
            else return -1;
        }
        *colon = 0;
        *key = text;
    }
    char *v = colon + 1;
    while (*v == ' ') v++;
    *value = v;
    return 0;
}

static json_t *yaml_block(yaml_line *l, int n, int *i, int indent);

static json_t *yaml_value_after_key(yaml_line *l, int n, int *i, int indent, char *value)
{
    if (!strcmp(value, ">") || !strcmp(value, "|")) {
        size_t cap = 256, len = 0;
        char *s = calloc(1, cap);
        while (*i < n && l[*i].indent > indent) {
            size_t k = strlen(l[*i].text);
            if (len + k + 2 > cap) s = realloc(s, cap = 2 * (len + k + 2));
            if (len) s[len++] = ' ';
            memcpy(s + len, l[*i].text, k + 1);
            len += k;
            (*i)++;
        }
        json_t *v = json_string(s);
        free(s);
        return v;
    }
    if (*value) return yaml_scalar(value);
    if (*i < n && l[*i].indent > indent) return yaml_block(l, n, i, l[*i].indent);
    return json_null();
}

static json_t *yaml_block(yaml_line *l, int n, int *i, int indent)
{
    if (*i < n && l[*i].text[0] == '-' && (l[*i].text[1] == ' ' || !l[*i].text[1])) {
        json_t *arr = json_array();
        while (*i < n && l[*i].indent == indent && l[*i].text[0] == '-') {
            char *item = l[*i].text + 1;
            while (*item == ' ') item++;
            char *k, *v, probe[1024];
            snprintf(probe, sizeof probe, "%s", item);
            if (!*item) {
                (*i)++;
                json_array_append_new(arr, yaml_block(l, n, i, l[*i].indent));
            } else if (item[0] != '"' && item[0] != '[' && !yaml_split(probe, &k, &v)) {
                /* "- key: value" starts a map whose keys sit at indent + 2 */
                l[*i].indent = indent + (int)(item - l[*i].text);
                l[*i].text = item;
                json_array_append_new(arr, yaml_block(l, n, i, l[*i].indent));
            } else {
                json_array_append_new(arr, yaml_scalar(item));
                (*i)++;
            }
        }
        return arr;
    }
    json_t *obj = json_object();
    while (*i < n && l[*i].indent == indent) {
        char *key, *value;
        if (yaml_split(l[*i].text, &key, &value)) {
            fprintf(stderr, "yaml: cannot read line \"%s\"\n", l[*i].text);
            (*i)++;
            continue;
        }
        (*i)++;
        json_object_set_new(obj, key, yaml_value_after_key(l, n, i, indent, value));
    }
    return obj;
}

static json_t *yaml_load_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    yaml_line *lines = NULL;
    int n = 0;
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\r\n")] = 0;
        int ind = 0;
        while (buf[ind] == ' ') ind++;
        if (!buf[ind] || buf[ind] == '#') continue;
        lines = realloc(lines, (size_t)(n + 1) * sizeof *lines);
        lines[n].indent = ind;
        lines[n].text = strdup(buf + ind);
        n++;
    }
    fclose(f);
    char **texts = malloc((size_t)(n ? n : 1) * sizeof *texts);
    for (int k = 0; k < n; k++) texts[k] = lines[k].text;
    int i = 0;
    json_t *root = n ? yaml_block(lines, n, &i, lines[0].indent) : NULL;
    for (int k = 0; k < n; k++) free(texts[k]);
    free(texts);
    free(lines);
    return root;
}

/* ------------------------------------------------------------ validation */

static const json_t *schema_resolve(const json_t *doc, const json_t *schema)
{
    for (int depth = 0; depth < 16 && schema; depth++) {
        const char *ref = json_string_value(json_object_get(schema, "$ref"));
        if (!ref) return schema;
        const char *prefix = "#/components/schemas/";
        if (strncmp(ref, prefix, strlen(prefix))) return NULL;
        schema = json_object_get(json_object_get(json_object_get(doc, "components"), "schemas"), ref + strlen(prefix));
    }
    return schema;
}

static int type_matches(const char *type, const json_t *v)
{
    if (!strcmp(type, "string")) return json_is_string(v);
    if (!strcmp(type, "integer")) return json_is_integer(v);
    if (!strcmp(type, "number")) return json_is_number(v);
    if (!strcmp(type, "boolean")) return json_is_boolean(v);
    if (!strcmp(type, "array")) return json_is_array(v);
    if (!strcmp(type, "object")) return json_is_object(v);
    return 0;
}

static int schema_check(const json_t *doc, const json_t *schema, const json_t *v, const char *where, char *err,
                        size_t err_size)
{
    schema = schema_resolve(doc, schema);
    if (!schema) return snprintf(err, err_size, "%s: unresolvable $ref", where), -1;
    if (json_is_null(v) && json_is_true(json_object_get(schema, "nullable"))) return 0;
    const json_t *one_of = json_object_get(schema, "oneOf");
    if (one_of) {
        size_t i;
        const json_t *alt;
        json_array_foreach(one_of, i, alt) {
            char ignored[256];
            if (!schema_check(doc, alt, v, where, ignored, sizeof ignored)) return 0;
        }
        return snprintf(err, err_size, "%s: matches no oneOf alternative", where), -1;
    }
    const char *type = json_string_value(json_object_get(schema, "type"));
    if (type && !type_matches(type, v)) return snprintf(err, err_size, "%s: expected %s", where, type), -1;
    const json_t *en = json_object_get(schema, "enum");
    if (en) {
        size_t i;
        const json_t *e;
        int found = 0;
        json_array_foreach(en, i, e) found |= json_equal((json_t *)e, (json_t *)v);
        if (!found) return snprintf(err, err_size, "%s: value not in enum", where), -1;
    }
    if (json_is_object(v)) {
        const json_t *req = json_object_get(schema, "required");
        size_t i;
        const json_t *name;
        json_array_foreach(req, i, name) {
            if (!json_object_get(v, json_string_value(name)))
                return snprintf(err, err_size, "%s: missing required \"%s\"", where, json_string_value(name)), -1;
        }
        const json_t *props = json_object_get(schema, "properties");
        const char *key;
        const json_t *sub;
        if (json_is_false(json_object_get(schema, "additionalProperties"))) {
            json_object_foreach((json_t *)v, key, sub) {
                if (!json_object_get(props, key))
                    return snprintf(err, err_size, "%s: \"%s\" is not in the schema (additionalProperties: false)", where,
                                    key),
                           -1;
            }
        }
        json_object_foreach((json_t *)props, key, sub) {
            const json_t *field = json_object_get(v, key);
            if (!field) continue;
            char w[256];
            snprintf(w, sizeof w, "%s.%s", where, key);
            if (schema_check(doc, sub, field, w, err, err_size)) return -1;
        }
    }
    if (json_is_array(v)) {
        const json_t *items = json_object_get(schema, "items");
        size_t i;
        const json_t *e;
        if (items) json_array_foreach(v, i, e) {
                char w[256];
                snprintf(w, sizeof w, "%s[%zu]", where, i);
                if (schema_check(doc, items, e, w, err, err_size)) return -1;
            }
    }
    return 0;
}

static int schema_validate(const json_t *doc, const json_t *schema, const json_t *v, char *err, size_t err_size)
{
    return schema_check(doc, schema, v, "$", err, err_size);
}

static const json_t *openapi_response_schema(const json_t *doc, const char *path, const char *method, long status)
{
    char code[8], m[16];
    snprintf(code, sizeof code, "%ld", status);
    snprintf(m, sizeof m, "%s", method);
    for (char *p = m; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    const json_t *op = json_object_get(json_object_get(json_object_get(doc, "paths"), path), m);
    const json_t *resp = json_object_get(json_object_get(op, "responses"), code);
    return json_object_get(json_object_get(json_object_get(resp, "content"), "application/json"), "schema");
}

/* ---- helpers the HTTP test binaries share ---- */

/* openapi.yaml parsed by the test's main (openapi_load); check_schema uses it. */
static json_t *openapi __attribute__((unused));

/* Validate a JSON response against openapi.yaml for (route pattern, method). */
/* 0 when r's body matches openapi.yaml's schema for its status, else -1 and why in msg. */
static inline int schema_problem(const http_resp *r, const char *route, const char *method, char *msg, size_t n)
{
    const json_t *schema = openapi_response_schema(openapi, route, method, r->status);
    char err[512];
    if (!schema)
        snprintf(msg, n, "openapi.yaml documents no JSON response %ld for %s %s", r->status, method, route);
    else if (!r->json)
        snprintf(msg, n, "%s %s: body is not JSON: %.200s", method, route, r->body ? r->body : "(empty)");
    else if (schema_validate(openapi, schema, r->json, err, sizeof err))
        snprintf(msg, n, "%s %s -> %ld does not match openapi.yaml: %s", method, route, r->status, err);
    else
        return 0;
    return -1;
}

static inline void check_schema(const http_resp *r, const char *route, const char *method)
{
    const json_t *schema = openapi_response_schema(openapi, route, method, r->status);
    CHECK(schema != NULL, "openapi.yaml documents no JSON response %ld for %s %s", r->status, method, route);
    if (!schema) return;
    CHECK(r->json != NULL, "%s %s: body is not JSON: %.200s", method, route, r->body ? r->body : "(empty)");
    if (!r->json) return;
    char msg[1024];
    CHECK(schema_problem(r, route, method, msg, sizeof msg) == 0, "%s", msg);
}

static inline const char *err_code(const http_resp *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}

static inline const char *err_field(const http_resp *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), "field"));
}

static inline int run_cmd(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Run a command and parse its standard output as JSON (NULL if it is not). */
static inline json_t *run_json(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    json_t *v = json_loadf(p, 0, NULL);
    pclose(p);
    return v;
}

/* -------------------------------------------------------- bad-input matrix */

typedef struct {
    const char *path, *body;
    long status;
    const char *code, *field; /* field NULL: must be null */
} bad_case;

/* POST each case; the answer must have its status, error code and field,
 * match openapi.yaml, and /healthz must still answer afterwards. */
static inline void run_bad_cases(test_server *s, const bad_case *cases, int n)
{
    for (int i = 0; i < n; i++) {
        const bad_case *c = &cases[i];
        http_resp r;
        int rc = http_post_json(s, &r, c->path, c->body);
        const char *code = err_code(&r), *field = err_field(&r);
        int field_ok = c->field ? (field && !strcmp(field, c->field))
                                : (r.json && json_is_null(json_object_get(json_object_get(r.json, "error"), "field")));
        CHECK(rc == 0 && r.status == c->status && code && !strcmp(code, c->code) && field_ok,
              "%s %.80s: got %ld %s (field %s), want %ld %s (field %s)", c->path, c->body, r.status,
              code ? code : "-", field ? field : "null", c->status, c->code, c->field ? c->field : "null");
        check_schema(&r, c->path, "POST");
        http_resp_free(&r);
        http_get(s, &r, "/healthz");
        CHECK(r.status == 200, "/healthz after %s %.60s: %ld", c->path, c->body, r.status);
        http_resp_free(&r);
    }
}

/* ------------------------------------------------------------- jobs */

static inline int job_is_final(const char *state)
{
    return state && (!strcmp(state, "done") || !strcmp(state, "failed") || !strcmp(state, "cancelled"));
}

/* GET /v1/jobs/{id} until its state is final (or want, if given); returns the job (caller decrefs). */
static inline json_t *poll_job(test_server *s, const char *id, const char *want, int timeout_ms)
{
    char path[128], problem[1024] = "";
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *job = NULL;
    int polls = 0;
    /* every poll's answer is checked against openapi.yaml, and counted as one check: how many polls a job
     * takes depends on the machine */
    for (int waited = 0; waited <= timeout_ms; waited += 50) {
        http_resp r;
        http_get(s, &r, path);
        polls++;
        char msg[1024];
        if (!*problem && schema_problem(&r, "/v1/jobs/{id}", "GET", msg, sizeof msg))
            snprintf(problem, sizeof problem, "poll %d: %.900s", polls, msg);
        const char *state = json_string_value(json_object_get(r.json, "state"));
        const int stop = r.status != 200 || (want ? (state && !strcmp(state, want)) : job_is_final(state));
        if (stop && r.status == 200) job = json_incref(r.json);
        http_resp_free(&r);
        if (stop) break;
        sleep_ms(50);
    }
    CHECK(!*problem, "GET %s: %s", path, problem);
    return job;
}

static inline void check_result_schema(const json_t *result, const char *schema_name)
{
    const json_t *schema = json_object_get(json_object_get(json_object_get(openapi, "components"), "schemas"), schema_name);
    char err[512];
    CHECK(schema && result && schema_validate(openapi, schema, result, err, sizeof err) == 0,
          "job result does not match %s: %s", schema_name, result ? err : "no result");
}

/* POST /v1/jobs body, then poll_job until final; the job (caller decrefs) or NULL. */
static inline json_t *run_job(test_server *s, const char *body, int timeout_ms)
{
    http_resp r;
    http_post_json(s, &r, "/v1/jobs", body);
    CHECK(r.status == 202, "POST /v1/jobs %.80s: %ld %.300s", body, r.status, r.body);
    check_schema(&r, "/v1/jobs", "POST");
    char ctype[64] = "";
    CHECK(http_header(&r, "Content-Type", ctype, sizeof ctype) == 0 && strstr(ctype, "application/json"),
          "POST /v1/jobs answers JSON (%s)", ctype);
    const char *id = json_string_value(json_object_get(r.json, "id"));
    json_t *job = id ? poll_job(s, id, NULL, timeout_ms) : NULL;
    http_resp_free(&r);
    return job;
}

/* A temporary folder (dir, from template like "/tmp/lensd-http-XXXXXX")
 * holding random tiny checkpoints made by `lensd mkmodel`: dir/bert
 * (BERT classifier) and dir/gpt (GPT-2). 0 on success; a failed CHECK and -1
 * otherwise. */
static inline int make_tiny_models(char *dir)
{
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return -1;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s mkmodel --arch bert --preset tiny --seed 1 --out %s/bert", lensd_path(), dir);
    int rc1 = run_cmd(cmd);
    snprintf(cmd, sizeof cmd, "%s mkmodel --arch gpt2 --preset tiny --seed 1 --out %s/gpt", lensd_path(), dir);
    int rc2 = run_cmd(cmd);
    CHECK(rc1 == 0 && rc2 == 0, "lensd mkmodel failed (%d, %d)", rc1, rc2);
    return rc1 || rc2 ? -1 : 0;
}

/* Remove dir, and this process's server logs unless a check failed (they
 * are what a failure is read from). */
static inline void remove_test_files(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    run_cmd(cmd);
    if (!check_failed) {
        snprintf(cmd, sizeof cmd, "rm -f /tmp/lensd-test-%d-*.log", (int)getpid());
        run_cmd(cmd);
    }
}

#endif
