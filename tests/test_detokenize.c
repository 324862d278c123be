/* test_detokenize.c - lens_tokenizer_decode (ids -> text) on the real
 * bert-base-uncased and gpt2 vocabularies of ../shared.
 *
 * Byte-level BPE is lossless, so for every case of
 * tests/fixtures/tokenizer_gpt2.json (ids made by HF's tokenizer) the decoded
 * ids must equal the case's text byte for byte. WordPiece lowercases, strips
 * accents and drops spacing, so the check there is that tokenizing the
 * decoded text (without [CLS] and [SEP]) gives back the same ids (for every
 * case without [UNK], whose text is lost by definition), plus hand examples of "##" gluing, special
 * tokens and transformers' clean-up of spaces before punctuation, which
 * tokenizer_config.json's clean_up_tokenization_spaces switches. Both fixture lists
 * must hold at least 40 cases. Skips (and says so) without ../shared. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/io/tokenizer.h"
#include "tests/check.h"

static int *ids_of(const json_t *arr, int *n)
{
    *n = (int)json_array_size(arr);
    int *ids = malloc((size_t)(*n ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static json_t *fixture_cases(const char *path)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &jerr);
    CHECK(root != NULL, "%s:%d: %s", path, jerr.line, jerr.text);
    json_t *cases = json_incref(json_object_get(root, "cases"));
    json_decref(root);
    CHECK(json_array_size(cases) >= 40, "%s: %zu cases (want >= 40)", path, json_array_size(cases));
    return cases;
}

static void check_gpt2(const lens_tokenizer *tok)
{
    json_t *cases = fixture_cases("tests/fixtures/tokenizer_gpt2.json");
    size_t i, exact = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        if (json_object_get(c, "text_pair")) continue;
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t text_len = json_string_length(json_object_get(c, "text"));
        int n;
        int *ids = ids_of(json_object_get(c, "input_ids"), &n);
        char *got = NULL;
        size_t len = 0;
        lens_err err = {0};
        int rc = lens_tokenizer_decode(tok, ids, n, 0, &got, &len, &err);
        int ok = rc == 0 && len == text_len && !memcmp(got, text, len);
        CHECK(ok, "gpt2 case %zu: decode gave \"%.80s\" (%zu bytes), want \"%.80s\" (%zu) %s", i, got ? got : "", len,
              text, text_len, rc ? err.msg : "");
        exact += ok;
        free(got);
        free(ids);
    }
    printf("gpt2: %zu of %zu fixture cases decode to their exact text\n", exact, json_array_size(cases));
    json_decref(cases);
    /* a piece of a multi-byte character alone is invalid UTF-8: U+FFFD, as HF's errors="replace" */
    int id = lens_tokenizer_id(tok, "\xC3\xA2"); /* byte 0xE2, first byte of a 3-byte sequence */
    char *got = NULL;
    lens_err err = {0};
    CHECK(id >= 0 && lens_tokenizer_decode(tok, &id, 1, 0, &got, NULL, &err) == 0 && !strcmp(got, "\xEF\xBF\xBD"),
          "lone 0xE2 byte -> U+FFFD (got \"%s\")", got ? got : "");
    free(got);
    int bad = 1 << 20;
    CHECK(lens_tokenizer_decode(tok, &bad, 1, 0, &got, NULL, &err) == -1 && err.code == LENS_EINVAL,
          "an id outside the vocabulary fails with EINVAL");
}

static void check_bert(const lens_tokenizer *tok)
{
    json_t *cases = fixture_cases("tests/fixtures/tokenizer_bert.json");
    size_t i, round_trips = 0, with_unk = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        int n;
        int *ids = ids_of(json_object_get(c, "input_ids"), &n);
        int unk = 0;
        for (int k = 0; k < n; k++) unk |= ids[k] == 100;
        if (unk || json_object_get(c, "text_pair")) {
            with_unk += unk;
            free(ids);
            continue;
        }
        char *text = NULL;
        size_t len = 0;
        lens_err err = {0};
        lens_token *t = NULL;
        int m = 0;
        /* [CLS] and [SEP] left out (tokenize adds them back); [MASK] in the text stays */
        int ok = lens_tokenizer_decode(tok, ids + 1, n - 2, 0, &text, &len, &err) == 0 &&
                 lens_tokenize(tok, text, len, NULL, 0, &t, &m, &err) == 0 && m == n;
        for (int k = 0; ok && k < n; k++) ok = t[k].id == ids[k];
        CHECK(ok, "bert case %zu: tokenize(decode(ids)) != ids; decoded \"%.100s\"", i, text ? text : "");
        round_trips += ok;
        free(text);
        free(t);
        free(ids);
    }
    printf("bert: %zu fixture cases round-trip (%zu with [UNK] or a pair left out)\n", round_trips, with_unk);
    CHECK(round_trips >= 30, "at least 30 WordPiece round trips (%zu)", round_trips);
    json_decref(cases);

    const char *words[] = {"[CLS]", "the", "film", "##s", "isn", "'", "t", "great", ",", "is", "it", "?", "[SEP]"};
    int ids[13];
    for (int k = 0; k < 13; k++) ids[k] = lens_tokenizer_id(tok, words[k]);
    char *got = NULL;
    lens_err err = {0};
    /* the WordPiece decoder of its tokenizer.json cleans up each piece
     * alone, as the Rust library does (" ," glued, " ' t" kept); its
     * tokenizer_config.json says clean_up_tokenization_spaces, so the whole
     * text is cleaned up after, as transformers' decode does: "isn't" */
    CHECK(lens_tokenizer_decode(tok, ids, 13, 1, &got, NULL, &err) == 0 &&
              !strcmp(got, "the films isn't great, is it?"),
          "skip special: \"%s\"", got ? got : "");
    free(got);
    CHECK(lens_tokenizer_decode(tok, ids, 13, 0, &got, NULL, &err) == 0 &&
              !strcmp(got, "[CLS] the films isn't great, is it? [SEP]"),
          "keep special: \"%s\"", got ? got : "");
    free(got);
}

/* bert-base-uncased's tokenizer.json in a folder of its own with `config`
 * as tokenizer_config.json (NULL: none); the tokenizer, or NULL with err. */
static lens_tokenizer *load_with_config(const char *shared, const char *config, lens_err *err)
{
    char src[1024], dir[] = "/tmp/lensd-detok-XXXXXX", path[64];
    snprintf(src, sizeof src, "%s/vocab/bert-base-uncased/tokenizer.json", shared);
    if (!mkdtemp(dir)) return NULL;
    json_t *tj = json_load_file(src, 0, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int ok = tj && !json_dump_file(tj, path, JSON_COMPACT);
    json_decref(tj);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = config ? fopen(path, "w") : NULL;
    if (f) fputs(config, f), fclose(f);
    lens_tokenizer *tok = ok ? lens_tokenizer_load(dir, err) : NULL;
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
    return tok;
}

/* clean_up_tokenization_spaces decides the whole-text clean-up: absent or
 * false, the Rust decoder's text as it is; not a boolean, a load error. */
static void check_clean_up_key(const char *shared)
{
    const char *words[] = {"isn", "'", "t", "it", "?"};
    const struct { const char *config, *want; } cases[] = {
        {NULL, "isn ' t it?"},
        {"{\"clean_up_tokenization_spaces\": false}", "isn ' t it?"},
        {"{\"clean_up_tokenization_spaces\": true}", "isn't it?"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        lens_err err = {0};
        lens_tokenizer *tok = load_with_config(shared, cases[c].config, &err);
        CHECK(tok != NULL, "load with config %s: %s", cases[c].config ? cases[c].config : "(none)", err.msg);
        if (!tok) continue;
        int ids[5];
        for (int k = 0; k < 5; k++) ids[k] = lens_tokenizer_id(tok, words[k]);
        char *got = NULL;
        CHECK(lens_tokenizer_decode(tok, ids, 5, 1, &got, NULL, &err) == 0 && !strcmp(got, cases[c].want),
              "config %s: \"%s\", want \"%s\"", cases[c].config ? cases[c].config : "(none)", got ? got : "",
              cases[c].want);
        free(got);
        lens_tokenizer_free(tok);
    }
    lens_err err = {0};
    lens_tokenizer *bad = load_with_config(shared, "{\"clean_up_tokenization_spaces\": \"yes\"}", &err);
    CHECK(!bad && err.code == LENS_EFORMAT && strstr(err.msg, "clean_up_tokenization_spaces is not a boolean"),
          "a non-boolean clean_up_tokenization_spaces is a load error naming it: %s", err.msg);
    lens_tokenizer_free(bad);
}

int main(void)
{
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared (or $LENS_SHARED) absent: no real vocabularies to decode with");
        return check_done("test_detokenize");
    }
    char dir[1024];
    lens_err err = {0};
    snprintf(dir, sizeof dir, "%s/vocab/gpt2", shared);
    lens_tokenizer *gpt2 = lens_tokenizer_load(dir, &err);
    CHECK(gpt2 != NULL, "load %s: %s", dir, err.msg);
    snprintf(dir, sizeof dir, "%s/vocab/bert-base-uncased", shared);
    lens_tokenizer *bert = lens_tokenizer_load(dir, &err);
    CHECK(bert != NULL, "load %s: %s", dir, err.msg);
    if (gpt2) check_gpt2(gpt2);
    if (bert) check_bert(bert);
    check_clean_up_key(shared);
    lens_tokenizer_free(gpt2);
    lens_tokenizer_free(bert);
    return check_done("test_detokenize");
}
