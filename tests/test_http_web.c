/* test_http_web.c - the dashboard's static files (server/web.c) through a
 * real lensd: / and /web/<file> with their content types, ETag
 * revalidation, no API key needed for the page while /v1 keeps its key,
 * directory traversal refused (raw requests, so no client normalises the
 * dots away), --no-web / LENSD_NO_WEB, and the default folder (the
 * repository's web/ beside build/). */
#include <arpa/inet.h>
#include <sys/stat.h>

#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[256];

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

/* GET path sent byte for byte; returns the status, body copied to out. */
static int raw_get(int port, const char *path, char *out, size_t out_size)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char req[1024], buf[8192];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t k;
    while (got < sizeof buf - 1 && (k = read(fd, buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)k;
    close(fd);
    buf[got] = 0;
    int status = -1;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    const char *body = strstr(buf, "\r\n\r\n");
    snprintf(out, out_size, "%s", body ? body + 4 : "");
    return status;
}

static void test_files(test_server *s)
{
    static const struct {
        const char *path, *type, *body;
    } files[] = {
        {"/", "text/html; charset=utf-8", "<!doctype html><title>t</title>"},
        {"/web/app.js", "text/javascript; charset=utf-8", "export const x = 1;\n"},
        {"/web/style.css", "text/css; charset=utf-8", "body { margin: 0 }\n"},
        {"/web/sub/data.json", "application/json", "{\"a\": 1}\n"},
    };
    int n = (int)(sizeof files / sizeof *files);
    CHECK(n == 4, "four files in the table");
    for (int i = 0; i < n; i++) {
        http_resp r;
        http_get(s, &r, files[i].path);
        char ct[128], etag[128], cache[128];
        http_header(&r, "Content-Type", ct, sizeof ct);
        CHECK(r.status == 200 && r.body && !strcmp(r.body, files[i].body), "GET %s -> 200 with the file: %ld %s",
              files[i].path, r.status, r.body ? r.body : "");
        CHECK(!strcmp(ct, files[i].type), "GET %s content type \"%s\", want \"%s\"", files[i].path, ct,
              files[i].type);
        CHECK(http_header(&r, "ETag", etag, sizeof etag) == 0 && etag[0] == '"', "GET %s has an ETag",
              files[i].path);
        CHECK(http_header(&r, "Cache-Control", cache, sizeof cache) == 0 && !strcmp(cache, "no-cache"),
              "GET %s Cache-Control no-cache: \"%s\"", files[i].path, cache);
        http_resp_free(&r);
        char inm[200];
        snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
        const char *hdr[] = {inm, NULL};
        http_do(s, &r, "GET", files[i].path, NULL, NULL, 0, hdr);
        CHECK(r.status == 304 && r.len == 0, "GET %s with its ETag -> 304 empty: %ld", files[i].path, r.status);
        http_resp_free(&r);
    }
    http_resp r;
    http_do(s, &r, "HEAD", "/", NULL, NULL, 0, NULL);
    CHECK(r.status == 200 && r.len == 0, "HEAD / -> 200 without a body: %ld", r.status);
    http_resp_free(&r);
    http_get(s, &r, "/v1/models");
    CHECK(r.status == 401, "the API keeps its key while / is open: %ld", r.status);
    check_schema(&r, "/v1/models", "GET");
    http_resp_free(&r);
    http_do(s, &r, "POST", "/", "application/json", "{}", 2, NULL);
    char allow[64] = "";
    http_header(&r, "Allow", allow, sizeof allow);
    CHECK(r.status == 405 && err_code(&r) && !strcmp(err_code(&r), "method_not_allowed") && !strcmp(allow, "GET, HEAD"),
          "POST / -> 405 typed, Allow: GET, HEAD: %ld \"%s\"", r.status, allow);
    http_resp_free(&r);
}

static void test_traversal(test_server *s)
{
    static const char *bad[] = {
        "/web/../secret.txt", "/web/%2e%2e/secret.txt", "/web/..%2fsecret.txt", "/web/sub/../../secret.txt",
        "/web/.hidden",       "/web/link.txt",          "/web/sub",             "/web/",
        "/web//etc/passwd",   "/web/sub/",              "/web/missing.js",      "/web/..\\secret.txt",
        "/web/%2fetc/passwd", "/../secret.txt",
    };
    int n = (int)(sizeof bad / sizeof *bad);
    CHECK(n == 14, "fourteen bad paths in the table");
    for (int i = 0; i < n; i++) {
        char body[8192];
        int status = raw_get(s->port, bad[i], body, sizeof body);
        CHECK(status == 404 || status == 400, "GET %s refused: %d", bad[i], status);
        CHECK(!strstr(body, "TOP SECRET") && !strstr(body, "root:"), "GET %s leaks nothing", bad[i]);
    }
    char body[8192];
    CHECK(raw_get(s->port, "/web/sub/data.json", body, sizeof body) == 200 && strstr(body, "\"a\""),
          "the same raw client gets a good file");
}

/* Starts lensd with args (and env name=value when given); GET / status. */
static long root_status(const char *const *args, const char *env, char *body, size_t body_size)
{
    if (env) putenv((char *)env);
    test_server s;
    int rc = server_launch(&s, args);
    if (env) unsetenv("LENSD_NO_WEB");
    if (rc) return -1;
    http_resp r;
    http_get(&s, &r, "/");
    long status = r.status;
    if (body) snprintf(body, body_size, "%s", r.body ? r.body : "");
    http_resp_free(&r);
    server_terminate(&s);
    return status;
}

static void test_flags(const char *model_arg, const char *webdir)
{
    const char *off[] = {"--model", model_arg, "--web-dir", webdir, "--no-web", NULL};
    CHECK(root_status(off, NULL, NULL, 0) == 404, "--no-web: / is 404");
    const char *env_only[] = {"--model", model_arg, "--web-dir", webdir, NULL};
    CHECK(root_status(env_only, "LENSD_NO_WEB=1", NULL, 0) == 404, "LENSD_NO_WEB=1: / is 404");
    const char *on_again[] = {"--model", model_arg, "--web-dir", webdir, "--no-web=0", NULL};
    CHECK(root_status(on_again, NULL, NULL, 0) == 200, "--no-web=0: / is 200");

    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such-folder", tmpdir);
    const char *bad[] = {"--model", model_arg, "--web-dir", missing, NULL};
    CHECK(root_status(bad, NULL, NULL, 0) == -1, "--web-dir to a missing folder stops start-up");

    /* default: /usr/share/lensd/web when installed, else the repository's web/ */
    struct stat st;
    const char *want_dir = stat("/usr/share/lensd/web/index.html", &st) == 0 ? "/usr/share/lensd/web" : "web";
    char want_path[600];
    snprintf(want_path, sizeof want_path, "%s/index.html", want_dir);
    FILE *f = fopen(want_path, "r");
    if (!f) {
        SKIP("no %s: default web folder not checked", want_path);
        return;
    }
    static char want[65536], got[65536];
    size_t len = fread(want, 1, sizeof want - 1, f);
    want[len] = 0;
    fclose(f);
    const char *dflt[] = {"--model", model_arg, NULL};
    long status = root_status(dflt, NULL, got, sizeof got);
    CHECK(status == 200 && !strcmp(got, want), "default web folder %s served at /: %ld", want_dir, status);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi) return check_done("test_http_web");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lensd-web-XXXXXX");
    if (make_tiny_models(tmpdir)) return check_done("test_http_web");
    char webdir[600], sub[700], keyfile[600], model[600], link[700], outside[600];
    snprintf(webdir, sizeof webdir, "%s/web", tmpdir);
    snprintf(sub, sizeof sub, "%s/sub", webdir);
    mkdir(webdir, 0755);
    mkdir(sub, 0755);
    write_file(webdir, "index.html", "<!doctype html><title>t</title>");
    write_file(webdir, "app.js", "export const x = 1;\n");
    write_file(webdir, "style.css", "body { margin: 0 }\n");
    write_file(webdir, ".hidden", "TOP SECRET hidden\n");
    write_file(sub, "data.json", "{\"a\": 1}\n");
    write_file(tmpdir, "secret.txt", "TOP SECRET\n");
    snprintf(outside, sizeof outside, "%s/secret.txt", tmpdir);
    snprintf(link, sizeof link, "%s/link.txt", webdir);
    CHECK(symlink(outside, link) == 0, "symlink out of the web folder made");
    write_file(tmpdir, "keys", "web-key\n");
    snprintf(keyfile, sizeof keyfile, "%s/keys", tmpdir);
    snprintf(model, sizeof model, "bert=%s/bert", tmpdir);

    const char *args[] = {"--model", model, "--web-dir", webdir, "--api-key-file", keyfile, NULL};
    test_server s;
    if (server_launch(&s, args)) {
        CHECK(0, "lensd with --web-dir did not start");
    } else {
        test_files(&s);
        test_traversal(&s);
        CHECK(server_terminate(&s) == 0, "lensd exits 0 on SIGTERM");
    }
    test_flags(model, webdir);

    remove_test_files(tmpdir);
    json_decref(openapi);
    return check_done("test_http_web");
}
