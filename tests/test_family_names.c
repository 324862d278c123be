/* test_family_names.c - no code above core/model decides by a model's name.
 *
 * What a model supports reaches api/, server/ and the dashboard (web/) as
 * capabilities (lens_model_supports, ModelInfo's analyses / pairs / causal /
 * attribution_targets), never as "if the family is X". This test reads the
 * family registry (lens_families in core/model/arch.c: every model_type and
 * Hugging Face class of each task) and fails when a file under web/, api/ or
 * server/ names one as code does:
 *   - a quoted literal, exact case, between ' " or ` ("bert", 'gpt2',
 *     "RobertaForSequenceClassification"): what a comparison or a table
 *     keyed on a family needs;
 *   - a family object, lens_family_<model_type>.
 * Prose may mention a family (comments, a message saying "BERT's [CLS] A
 * [SEP] B [SEP]"): it selects nothing. A quoted literal in a comment counts
 * too, so a comment quotes a family in prose, not as a literal.
 * The scanner is first run on two sample texts, one that must be caught and
 * one that must pass, so a scanner that finds nothing fails.
 *
 * The lists of families kept outside the registry must equal it, so a
 * family added to lens_families and not to them fails here: openapi.yaml's
 * ModelInfo.model_type enum and docs/families.md's table of families (the
 * CLI help prints the registry itself, lens_mkmodel_usage).
 *
 * And a family's math is its forward only: a family file (a core/model
 * file defining a lens_family) states its block as a program (block.h) and
 * holds no derivative code, no identifier with _backward or _jvp outside
 * comments; the interpreter derives both. */
#include <string.h>

#include "core/io/file.h"
#include "core/model/arch.h"
#include "tests/check.h"
#include "tests/walk.h"

static const char *const SCANNED[] = {"web", "api", "server", NULL};

/* Is name in text as 'name', "name", `name` or lens_family_name? */
static int names_family(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; (p = strstr(p, name)); p++) {
        char before = p > text ? p[-1] : 0, after = p[n];
        if ((before == '"' || before == '\'' || before == '`') && after == before) return 1;
        if (p - text >= 12 && !strncmp(p - 12, "lens_family_", 12)) {
            char c = after;
            if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return 1;
        }
    }
    return 0;
}

/* The first registry name (model_type or HF class) text names, or NULL. */
static const char *first_family_name(const char *text)
{
    for (int i = 0; lens_families[i]; i++) {
        const lens_family *f = lens_families[i];
        if (names_family(text, f->model_type)) return f->model_type;
        for (size_t t = 0; t < sizeof f->task_archs / sizeof *f->task_archs; t++)
            if (f->task_archs[t] && names_family(text, f->task_archs[t])) return f->task_archs[t];
    }
    return NULL;
}

/* One file: one CHECK. */
static void check_file(const char *path, void *ctx)
{
    size_t len;
    char *text = lens_file_read(path, &len, &(lens_err){ 0 });
    const char *name = text ? first_family_name(text) : NULL;
    CHECK(text && !name, "%s names the model family \"%s\" (decide by capabilities: ModelInfo / lens_model_supports)",
          path, name ? name : "(unreadable)");
    free(text);
    (*(int *)ctx)++;
}

/* The first identifier of derivative code in text outside comments ("_backward", "_jvp"), or NULL. */
static const char *derivative_code(const char *text)
{
    static const char *const marks[] = {"_backward", "_jvp", NULL};
    for (const char *p = text; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            if (!end) return NULL;
            p = end + 1;
            continue;
        }
        if (p[0] == '/' && p[1] == '/') {
            while (p[1] && p[1] != '\n') p++;
            continue;
        }
        for (int i = 0; marks[i]; i++)
            if (!strncmp(p, marks[i], strlen(marks[i]))) return marks[i];
    }
    return NULL;
}

static void check_family_file(const char *path, void *ctx)
{
    size_t len;
    char *text = lens_file_read(path, &len, &(lens_err){ 0 });
    const size_t n = strlen(path);
    if (text && n > 2 && !strcmp(path + n - 2, ".c") && strstr(text, "const lens_family lens_family_")) {
        const char *mark = derivative_code(text);
        CHECK(!mark, "%s is a family file with derivative code (%s): state the block as a program (block.h)", path,
              mark);
        (*(int *)ctx)++;
    }
    free(text);
}

/* Does the list (names, n of them) hold exactly the registry's model_types? */
static void check_list(const char *what, char names[][32], int n)
{
    int n_families = 0;
    for (int i = 0; lens_families[i]; i++, n_families++) {
        int found = 0;
        for (int k = 0; k < n; k++) found |= !strcmp(names[k], lens_families[i]->model_type);
        CHECK(found, "%s does not list the family %s (lens_families)", what, lens_families[i]->model_type);
    }
    for (int k = 0; k < n; k++)
        CHECK(lens_family_find(names[k]) != NULL, "%s lists \"%s\", which is not in lens_families", what, names[k]);
    CHECK(n == n_families, "%s lists %d families, the registry %d", what, n, n_families);
}

/* openapi.yaml: the enum: [...] line after ModelInfo's "model_type:". */
static int openapi_names(const char *text, char names[][32], int max)
{
    int n = 0;
    const char *at = strstr(text, "\n        model_type:\n");
    const char *list = at ? strstr(at, "enum: [") : NULL;
    const char *end = list ? strchr(list, ']') : NULL;
    CHECK(end && !memchr(at + 1, '}', (size_t)(list - at)) && list - at < 200,
          "openapi.yaml: ModelInfo's model_type has an enum: [...] (the test reads it)");
    for (const char *p = list ? list + 7 : NULL; p && p < end && n < max; p += strspn(p, " ")) {
        const size_t w = strcspn(p, ",]");
        snprintf(names[n++], sizeof names[0], "%.*s", (int)w, p);
        p += w + 1;
    }
    return n;
}

/* docs/families.md: the first table's rows, "| `model_type` | ...". */
static int doc_names(const char *text, char names[][32], int max)
{
    int n = 0;
    const char *p = strstr(text, "\n| model_type |");
    CHECK(p != NULL, "docs/families.md has its table of families (| model_type | ...)");
    for (p = p ? strchr(p + 1, '\n') : NULL; p && p[1] == '|' && n < max; p = strchr(p + 1, '\n'))
        if (!strncmp(p + 1, "| `", 3)) snprintf(names[n++], sizeof names[0], "%.*s", (int)strcspn(p + 4, "`"), p + 4);
    return n;
}

/* The family list a file keeps (parse reads it) against the registry. */
static void check_file_list(const char *path, const char *what, int (*parse)(const char *, char[][32], int))
{
    size_t len;
    char *text = lens_file_read(path, &len, &(lens_err){0});
    char names[64][32];
    CHECK(text != NULL, "%s is readable (run from the repository root)", path);
    check_list(what, names, text ? parse(text, names, 64) : 0);
    free(text);
}

int main(void)
{
    int n_names = 0;
    for (int i = 0; lens_families[i]; i++) n_names++;
    CHECK(n_names >= 11, "the registry lists the families (%d)", n_names);
    CHECK(first_family_name("if (m.model_type === 'bert') show();") != NULL, "a quoted model_type is caught");
    CHECK(first_family_name("if (!strcmp(a, \"LlamaForCausalLM\")) x();") != NULL, "a quoted HF class is caught");
    CHECK(first_family_name("use(&lens_family_gpt2);") != NULL, "a family object is caught");
    CHECK(first_family_name("/* BERT's [CLS] A [SEP] B [SEP]; bert-base, gpt2 tokens */ berth(\"berta\");") == NULL,
          "prose and longer words pass");
    for (int i = 0; SCANNED[i]; i++) {
        int files = 0;
        walk_files(SCANNED[i], check_file, &files);
        CHECK(files > 0, "%s/ has files to scan (run from the repository root)", SCANNED[i]);
    }
    CHECK(derivative_code("void f(void) { lens_linear_backward(a); }") != NULL, "derivative code is caught");
    CHECK(derivative_code("/* backward and JVP: lens_x_jvp */ x(); // y_backward") == NULL, "comments pass");
    int family_files = 0;
    walk_files("core/model", check_family_file, &family_files);
    CHECK(family_files >= 8, "core/model has the family files (%d)", family_files);
    check_file_list("openapi.yaml", "openapi.yaml ModelInfo.model_type enum", openapi_names);
    check_file_list("docs/families.md", "docs/families.md's table of families", doc_names);
    return check_done("test_family_names");
}
