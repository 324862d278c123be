/* web.c - the dashboard's static files: GET / and GET /web/<file>.
 *
 * Owns: which folder is served (--web-dir, else the installed copy, else the
 * repository's web/ next to the binary), mapping a URL path to a file inside
 * it, and the response (content type, ETag, Cache-Control). The dashboard is
 * a client of the public API, so these files need no API key: the page has
 * to load before it can ask for one.
 *
 * Traversal: libmicrohttpd has already %-decoded the path. Any segment that
 * is empty, "." or ".." or starts with a dot is refused, and the file's
 * realpath must still lie inside the folder's realpath (symlinks out are
 * refused too). Only regular files are served. */
#include "server/web.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WEB_INSTALLED "/usr/share/lensd/web"

static int has_index(const char *dir)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/index.html", dir) >= (int)sizeof path) return 0;
    return access(path, R_OK) == 0;
}

char *web_resolve_dir(const char *flag, int disabled)
{
    if (disabled) return NULL;
    if (flag) return realpath(flag, NULL);
    if (has_index(WEB_INSTALLED)) return realpath(WEB_INSTALLED, NULL);
    /* a build tree: build/lensd -> ../web */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    strcpy(slash, "/../web");
    return has_index(exe) ? realpath(exe, NULL) : NULL;
}

int web_path(const char *path)
{
    return !strcmp(path, "/") || !strncmp(path, "/web/", 5);
}

int web_wants(const char *method, const char *path)
{
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) return 0;
    return web_path(path);
}

/* "/" -> "index.html", "/web/a/b.js" -> "a/b.js"; NULL when a segment is unsafe. */
static const char *relative_file(const char *path)
{
    if (!strcmp(path, "/")) return "index.html";
    const char *rel = path + 5;
    for (const char *seg = rel;;) {
        size_t n = strcspn(seg, "/");
        if (n == 0 || seg[0] == '.') return NULL;
        if (!seg[n]) break;
        seg += n + 1;
    }
    return strpbrk(rel, "\\") ? NULL : rel;
}

static const char *content_type(const char *file)
{
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".json", "application/json"}, {".svg", "image/svg+xml"}, {".png", "image/png"},
        {".ico", "image/x-icon"}, {".txt", "text/plain; charset=utf-8"}, {".md", "text/plain; charset=utf-8"},
    };
    const char *dot = strrchr(file, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof *types; i++)
        if (!strcmp(dot, types[i].ext)) return types[i].type;
    return "application/octet-stream";
}

static struct MHD_Response *text_response(const char *msg)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(msg), (void *)msg, MHD_RESPMEM_PERSISTENT);
    if (resp) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return resp;
}

struct MHD_Response *web_respond(const char *dir, const char *path, const char *if_none_match, int *status)
{
    const char *rel = dir ? relative_file(path) : NULL;
    char joined[PATH_MAX], *real = NULL;
    int fd = -1;
    struct stat st;
    if (rel && snprintf(joined, sizeof joined, "%s/%s", dir, rel) < (int)sizeof joined) real = realpath(joined, NULL);
    size_t dn = dir ? strlen(dir) : 0;
    if (real && !strncmp(real, dir, dn) && real[dn] == '/') fd = open(real, O_RDONLY | O_CLOEXEC);
    free(real);
    if (fd >= 0 && (fstat(fd, &st) || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        *status = 404;
        return text_response("{\"error\":{\"code\":\"not_found\",\"message\":\"no such dashboard file\",\"field\":null}}");
    }
    char etag[64];
    snprintf(etag, sizeof etag, "\"%llx-%llx\"", (unsigned long long)st.st_mtime, (unsigned long long)st.st_size);
    struct MHD_Response *resp;
    if (if_none_match && !strcmp(if_none_match, etag)) {
        close(fd);
        *status = 304;
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    } else {
        *status = 200;
        resp = MHD_create_response_from_fd((uint64_t)st.st_size, fd); /* owns fd */
        if (resp) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type(rel));
    }
    if (!resp) return NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
    /* revalidate every load: a new lensd may ship new files under the same names */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    /* the dashboard holds an API key: no other site may frame it (clickjacking) */
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    MHD_add_response_header(resp, "Content-Security-Policy", "frame-ancestors 'none'");
    return resp;
}
