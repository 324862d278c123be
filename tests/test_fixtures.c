/* test_fixtures.c - every fixture in tests/fixtures can fail its test.
 *
 * Each file must record the command that made it ("command"; `make
 * fixtures` runs them all) and hold its lists of cases non-empty. The table
 * below names, for every fixture file, the lists its reader takes with
 * fixture_list (tests/fixture.h); the test checks each list is there with
 * cases, then empties it and removes it and checks the reader's rule
 * rejects both - the property that makes the test_* readers fail instead of
 * passing on nothing (issue 16 item 8). A fixture file not in the table
 * fails too, so a new fixture comes with its lists named. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "tests/check.h"
#include "tests/fixture.h"

typedef struct {
    const char *file;
    const char *lists[4]; /* top-level lists of cases, NULL-terminated */
} fixture_lists;

static const fixture_lists table[] = {
    {"attention_bert-tiny-sst2.json", {"examples"}},
    {"attention_gpt2-tiny-wikitext.json", {"examples"}},
    {"attention_synthetic.json", {"cases"}},
    {"attribution_sst2.json", {"examples"}},
    {"decomposition_bert-tiny-mlm.json", {"windows", "labels", "variants"}},
    {"decomposition_gpt2-tiny-wikitext.json", {"windows", "labels", "variants"}},
    {"demo_models.json", {"models"}},
    {"forward_bert-tiny-mlm.json", {"examples"}},
    {"forward_bert-tiny-sst2.json", {"examples"}},
    {"forward_gpt2-tiny-wikitext.json", {"examples"}},
    {"hidden_attribution_shared.json", {"models"}},
    {"token_identity_shared.json", {"rankings", "vocabulary", "fit"}},
    {"tokenizer_bert.json", {"cases"}},
    {"tokenizer_gpt2.json", {"cases"}},
    {"attention_causal_rows.json", {"gpt2_input_ids", "cases"}},
    {"attention_key_aware.json", {"input_ids", "cases"}},
    {"attribution_paper_code.json", {"examples", "head_importance_sum", "heads_pruned_floor", "trigger_ranking"}},
    {"logit_lens_demo.json", {"models"}},
    {"paper_code_bert-tiny-mlm.json", {"windows", "labels", "reference_windows", "variants"}},
    {"paper_code_gpt2-tiny-wikitext.json", {"windows", "labels", "reference_windows", "variants"}},
    {"screenot.json", {"cases"}},
    {"tokenizer_json_bert.json", {"cases"}},
    {"tokenizer_json_gpt2.json", {"cases"}},
    {"tokenizer_json_roberta.json", {"cases"}},
};
#define N_TABLE (int)(sizeof table / sizeof *table)

static const fixture_lists *find(const char *file)
{
    for (int i = 0; i < N_TABLE; i++)
        if (!strcmp(table[i].file, file)) return &table[i];
    return NULL;
}

/* The list key of fx passes the reader's rule; emptied or removed, it fails. */
static int check_list(json_t *fx, const char *file, const char *key)
{
    char what[256];
    snprintf(what, sizeof what, "%s", file);
    if (!fixture_list(fx, key, what)) return 0;
    json_t *saved = json_incref(json_object_get(fx, key));
    json_object_set_new(fx, key, json_is_object(saved) ? json_object() : json_array());
    const char *emptied = fixture_cases_problem(json_object_get(fx, key));
    json_object_del(fx, key);
    const char *removed = fixture_cases_problem(json_object_get(fx, key));
    CHECK(emptied && !strcmp(emptied, "empty") && removed && !strcmp(removed, "missing"),
          "%s: the reader's rule accepts an emptied or removed \"%s\"", file, key);
    json_object_set_new(fx, key, saved);
    return 1;
}

int main(void)
{
    DIR *dir = opendir("tests/fixtures");
    CHECK(dir != NULL, "cannot open tests/fixtures (run from the repository root)");
    if (!dir) return check_done("test_fixtures");
    int files = 0, lists = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".json")) continue;
        files++;
        const fixture_lists *row = find(e->d_name);
        CHECK(row != NULL, "tests/fixtures/%s is not in test_fixtures.c's table: name its lists of cases", e->d_name);
        char path[512];
        snprintf(path, sizeof path, "tests/fixtures/%s", e->d_name);
        json_t *fx = fixture_load(path); /* also checks "command" */
        for (int k = 0; fx && row && k < 4 && row->lists[k]; k++) lists += check_list(fx, e->d_name, row->lists[k]);
        json_decref(fx);
    }
    closedir(dir);
    CHECK(files == N_TABLE, "%d fixture files for %d table rows", files, N_TABLE);
    CHECK(lists >= N_TABLE, "%d lists of cases checked", lists);
    printf("%d fixture files, %d lists of cases, each recording its command\n", files, lists);
    return check_done("test_fixtures");
}
