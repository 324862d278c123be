/* test_layers.c - includes run one way: down the layers, never in a cycle.
 *
 * lensd's code is layered by folder, lowest first:
 *   core/base (0) -> core/nn (1) -> core/io (2) -> core/model (3)
 *   -> core/analysis | core/train (4) -> api (5) -> server (6) -> cli (7)
 * A file may include its own layer or a lower one, never a higher one;
 * core/analysis and core/train are one layer but two sides: neither
 * includes the other. Among headers the include graph has no cycle (a cycle
 * inside one layer is allowed by the rule above but still couples the two
 * files both ways). Every #include "..." of every .c and .h under core/,
 * api/, server/ and cli/ is read (a name without a folder is resolved next to
 * the including file, as the compiler does first); each upward include and
 * each cycle is printed, one failed check each.
 * The parser, the rule and the cycle search are first run on inline sample
 * texts, so a scanner that finds nothing fails. Run from the repository root. */
#include <string.h>

#include "core/io/file.h"
#include "tests/check.h"
#include "tests/walk.h"

static const char *const ROOTS[] = {"core", "api", "server", "cli", NULL};

/* The layer of a repository path (-1: outside the layers) and, for layer 4,
 * its side (1 analysis, 2 train). */
static int layer_of(const char *path, int *side)
{
    static const struct {
        const char *prefix;
        int layer, side;
    } map[] = {
        {"core/base/", 0, 0},     {"core/nn/", 1, 0},    {"core/io/", 2, 0}, {"core/model/", 3, 0},
        {"core/analysis/", 4, 1}, {"core/train/", 4, 2}, {"api/", 5, 0},     {"server/", 6, 0},
        {"cli/", 7, 0},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strncmp(path, map[i].prefix, strlen(map[i].prefix))) {
            if (side) *side = map[i].side;
            return map[i].layer;
        }
    if (side) *side = 0;
    return -1;
}

/* May from include to? 1 yes, 0 no (upward, or across analysis / train). */
static int include_allowed(const char *from, const char *to)
{
    int fs, ts;
    const int fl = layer_of(from, &fs), tl = layer_of(to, &ts);
    if (fl < 0 || tl < 0) return 1;
    if (tl > fl) return 0;
    return !(tl == fl && fs != ts);
}

/* Calls fn(name, ctx) for each #include "name" of text (angle includes are
 * system headers and skipped). Returns how many it found. */
static int each_include(const char *text, void (*fn)(const char *name, void *ctx), void *ctx)
{
    int n = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p++ != '#') continue;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "include", 7)) continue;
        p += 7;
        while (*p == ' ' || *p == '\t') p++;
        if (*p++ != '"') continue;
        const char *end = strchr(p, '"');
        const char *eol = strchr(p, '\n');
        if (!end || (eol && end > eol) || end == p || end - p >= 512) continue;
        char name[512];
        memcpy(name, p, (size_t)(end - p));
        name[end - p] = 0;
        fn(name, ctx);
        n++;
    }
    return n;
}

/* ---- the repository's files and their include graph ---- */

#define MAX_FILES 1024
#define MAX_EDGES 8192
static char *files[MAX_FILES];
static int n_files;
static int edge_from[MAX_EDGES], edge_to[MAX_EDGES], n_edges;

static int file_index(const char *path)
{
    for (int i = 0; i < n_files; i++)
        if (!strcmp(files[i], path)) return i;
    return -1;
}

static int is_source(const char *name)
{
    size_t n = strlen(name);
    return n > 2 && name[n - 2] == '.' && (name[n - 1] == 'c' || name[n - 1] == 'h');
}

static void collect(const char *path, void *ctx)
{
    (void)ctx;
    const char *name = strrchr(path, '/');
    if (is_source(name ? name + 1 : path) && n_files < MAX_FILES) files[n_files++] = strdup(path);
}

/* The repository path of name as included from file from: a path from the
 * root as given, else the file next to from (the compiler's first look). */
static void resolve(char *out, size_t cap, const char *from, const char *name)
{
    for (int i = 0; ROOTS[i]; i++) {
        size_t n = strlen(ROOTS[i]);
        if (!strncmp(name, ROOTS[i], n) && name[n] == '/') {
            snprintf(out, cap, "%s", name);
            return;
        }
    }
    const char *slash = strrchr(from, '/');
    int dir_len = slash ? (int)(slash - from) : 0;
    snprintf(out, cap, "%.*s/%s", dir_len, from, name);
}

typedef struct {
    int from;
    int upward; /* violations found */
} scan_ctx;

static void on_include(const char *name, void *vctx)
{
    scan_ctx *c = vctx;
    const char *from = files[c->from];
    char to[1024];
    resolve(to, sizeof to, from, name);
    int ok = include_allowed(from, to);
    if (!ok) c->upward++;
    CHECK(ok, "%s includes \"%s\": a higher layer (or across analysis / train)", from, name);
    int t = file_index(to);
    if (t >= 0 && n_edges < MAX_EDGES) {
        edge_from[n_edges] = c->from;
        edge_to[n_edges] = t;
        n_edges++;
    }
}

/* ---- cycles among headers: depth-first search, gray = on the stack ---- */

static int is_header(int i) { return files[i][strlen(files[i]) - 1] == 'h'; }

/* Prints each cycle found (once per back edge) and returns how many. */
static int find_cycles(int n, const int *from, const int *to, int edges, int (*node_ok)(int), const char *(*name)(int),
                       int quiet)
{
    int color[MAX_FILES] = {0}, stack[MAX_FILES], next[MAX_FILES], depth = 0, cycles = 0;
    for (int root = 0; root < n; root++) {
        if (color[root] || !node_ok(root)) continue;
        stack[depth] = root, next[depth] = 0, depth++, color[root] = 1;
        while (depth) {
            int u = stack[depth - 1], e = next[depth - 1]++;
            if (e >= edges) {
                color[u] = 2, depth--;
                continue;
            }
            if (from[e] != u || !node_ok(to[e])) continue;
            int v = to[e];
            if (color[v] == 1) {
                cycles++;
                if (quiet) continue;
                fprintf(stderr, "include cycle:");
                int k = depth - 1;
                while (stack[k] != v) k--;
                for (; k < depth; k++) fprintf(stderr, " %s ->", name(stack[k]));
                fprintf(stderr, " %s\n", name(v));
            } else if (!color[v]) {
                stack[depth] = v, next[depth] = 0, depth++, color[v] = 1;
            }
        }
    }
    return cycles;
}

static const char *file_name(int i) { return files[i]; }

/* ---- self-checks on inline samples ---- */

static void count_name(const char *name, void *ctx)
{
    char *seen = ctx;
    strcat(seen, name);
    strcat(seen, ";");
}

static int any_node(int i)
{
    (void)i;
    return 1;
}
static const char *sample_name(int i)
{
    static const char *const names[] = {"a.h", "b.h", "c.h", "d.h"};
    return names[i];
}

static void self_check(void)
{
    char seen[256] = "";
    const char *text = "/* x */\n#include <stdio.h>\n#include \"core/base/err.h\"\n"
                       "  #  include \"core/model/model.h\" /* why */\nint a; /* #include \"no.h\" */\n"
                       "#define X \"core/nn/ops.h\"\n#include \"json_writer.h\"";
    CHECK(each_include(text, count_name, seen) == 3 &&
              !strcmp(seen, "core/base/err.h;core/model/model.h;json_writer.h;"),
          "the parser finds the three quoted includes of the sample (got \"%s\")", seen);
    char path[256];
    resolve(path, sizeof path, "api/json_writer.c", "json_writer.h");
    CHECK(!strcmp(path, "api/json_writer.h"), "a bare name is resolved next to its includer (%s)", path);
    resolve(path, sizeof path, "api/json_writer.c", "core/base/err.h");
    CHECK(!strcmp(path, "core/base/err.h"), "a rooted name is kept (%s)", path);
    CHECK(!include_allowed("core/base/gemm.h", "core/model/model.h"), "base including model is caught");
    CHECK(!include_allowed("core/io/config.c", "core/model/arch.h"), "io including model is caught");
    CHECK(!include_allowed("core/analysis/x.c", "core/train/train.h"), "analysis including train is caught");
    CHECK(!include_allowed("server/http.c", "cli/cli.h"), "server including cli is caught");
    CHECK(include_allowed("core/model/model.h", "core/nn/rope.h") && include_allowed("cli/main.c", "api/api.h") &&
              include_allowed("core/train/a.c", "core/train/b.h") && include_allowed("core/nn/ops.c", "core/nn/ops.h"),
          "downward and same-folder includes pass");
    int cf[] = {0, 1, 2, 3}, ct[] = {1, 2, 0, 3}; /* a -> b -> c -> a, d -> d */
    CHECK(find_cycles(4, cf, ct, 4, any_node, sample_name, 1) == 2, "the sample's two cycles are found");
    int af[] = {0, 0, 1}, at[] = {1, 2, 2}; /* a -> b -> c, a -> c: no cycle */
    CHECK(find_cycles(3, af, at, 3, any_node, sample_name, 1) == 0, "a diamond is no cycle");
}

int main(void)
{
    self_check();
    for (int i = 0; ROOTS[i]; i++) walk_files(ROOTS[i], collect, NULL);
    CHECK(n_files > 50, "core/, api/, server/, cli/ hold the sources (%d files; run from the repository root)",
          n_files);
    int includes = 0, upward = 0;
    for (int i = 0; i < n_files; i++) {
        CHECK(layer_of(files[i], NULL) >= 0, "%s lies in a layer's folder", files[i]);
        char *text = lens_file_read(files[i], &(size_t){0}, &(lens_err){0});
        CHECK(text != NULL, "%s is readable", files[i]);
        if (!text) continue;
        scan_ctx c = {.from = i};
        includes += each_include(text, on_include, &c);
        upward += c.upward;
        free(text);
    }
    CHECK(includes > 200, "the sources include each other (%d includes read)", includes);
    int cycles = find_cycles(n_files, edge_from, edge_to, n_edges, is_header, file_name, 0);
    CHECK(cycles == 0, "no include cycle among headers (%d found, printed above)", cycles);
    printf("layers: %d files, %d includes, %d upward, %d cycles\n", n_files, includes, upward, cycles);
    for (int i = 0; i < n_files; i++) free(files[i]);
    return check_done("test_layers");
}
