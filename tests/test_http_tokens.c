/* test_http_tokens.c - which text a token came from, for every template,
 * and how /v1/models lists a folder holding only tokenizer files.
 *
 * Starts build/lensd with --models-dir holding random micro checkpoints of
 * BERT (segment embeddings: type ids 0 / 1) and RoBERTa (type ids all 0, as
 * Hugging Face), and --model with a folder of only BERT's tokenizer files,
 * and checks:
 *   - /v1/tokenize with text + text_pair: every token's text_index is 0 for
 *     the text's tokens, 1 for the pair's, null for the template's special
 *     tokens; start / end index into that text (the token's text equals
 *     the span, case-folded for the uncased vocabulary); segment stays the
 *     template's type id (RoBERTa 0 for both texts, BERT = text_index);
 *   - input_ids: text_index null;
 *   - /v1/models: the tokenizer-only folder has architecture, model_type and
 *     task null and no analyses, the checkpoints their family.
 * Every response is checked against openapi.yaml. */
#include <ctype.h>

#include "tests/check.h"
#include "tests/http_util.h"

static char tmpdir[] = "/tmp/lensd-tokens-XXXXXX";

static json_t *get(const json_t *o, const char *k) { return json_object_get(o, k); }

/* code points [start, end) of utf-8 s, lower-cased ASCII, into out */
static void span(const char *s, int start, int end, char *out, size_t n)
{
    size_t k = 0;
    for (int cp = 0; *s && k + 1 < n; s++) {
        if (((unsigned char)*s & 0xC0) != 0x80 && cp++ >= end) break;
        if (cp > start) out[k++] = (char)tolower((unsigned char)*s);
    }
    out[k] = 0;
}

static void check_pair(test_server *s, const char *model, int type_ids_follow_text)
{
    const char *text = "Hello world", *pair = "second piece";
    char body[256];
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"text\": \"%s\", \"text_pair\": \"%s\"}", model, text, pair);
    http_resp r;
    http_post_json(s, &r, "/v1/tokenize", body);
    CHECK(r.status == 200, "%s: /v1/tokenize pair -> %ld", model, r.status);
    check_schema(&r, "/v1/tokenize", "POST");
    const json_t *toks = get(r.json, "tokens");
    int n[2] = {0, 0}, specials = 0, spans = 0, order = 1, last = 0;
    for (size_t i = 0; i < json_array_size(toks); i++) {
        const json_t *t = json_array_get(toks, i), *ti = get(t, "text_index");
        const int special = json_is_true(get(t, "special")), seg = (int)json_integer_value(get(t, "segment"));
        if (json_is_null(ti)) {
            CHECK(special && json_is_null(get(t, "start")), "%s token %zu: text_index null, yet not a template token",
                  model, i);
            specials++;
            continue;
        }
        const int which = (int)json_integer_value(ti);
        CHECK(which == 0 || which == 1, "%s token %zu: text_index %d", model, i, which);
        if (which != 0 && which != 1) continue;
        n[which]++;
        order &= which >= last, last = which;
        CHECK(seg == (type_ids_follow_text ? which : 0), "%s token %zu: segment %d, text_index %d", model, i, seg,
              which);
        /* the span indexes the text text_index names: its characters spell the token */
        char got[64], piece[64];
        span(which ? pair : text, (int)json_integer_value(get(t, "start")), (int)json_integer_value(get(t, "end")), got,
             sizeof got);
        const char *p = json_string_value(get(t, "text")) ?: "";
        size_t k = 0;
        for (; *p && k + 1 < sizeof piece; p++)
            if (*p != '#' && strncmp(p, "\xc4\xa0", 2)) piece[k++] = (char)tolower((unsigned char)*p);
            else if (*p != '#') p++; /* byte-level BPE's space marker Ġ */
        piece[k] = 0;
        spans += !strcmp(got, piece);
    }
    CHECK(n[0] >= 2 && n[1] >= 2 && specials >= 2 && order, "%s: %d text tokens, %d pair tokens, %d template tokens",
          model, n[0], n[1], specials);
    CHECK(spans == n[0] + n[1], "%s: %d of %d spans spell their token in the text text_index names", model, spans,
          n[0] + n[1]);
    printf("%s: %d + %d tokens, %d template tokens, spans in their text: %d\n", model, n[0], n[1], specials, spans);
    http_resp_free(&r);

    snprintf(body, sizeof body, "{\"model\": \"%s\", \"input_ids\": [5, 6, 7]}", model);
    http_post_json(s, &r, "/v1/tokenize", body);
    int nulls = 0;
    for (size_t i = 0; i < json_array_size(get(r.json, "tokens")); i++)
        nulls += json_is_null(get(json_array_get(get(r.json, "tokens"), i), "text_index"));
    CHECK(r.status == 200 && nulls == 3, "%s: input_ids have text_index null (%d of 3)", model, nulls);
    check_schema(&r, "/v1/tokenize", "POST");
    http_resp_free(&r);
}

static void check_listing(test_server *s)
{
    http_resp r;
    http_get(s, &r, "/v1/models");
    CHECK(r.status == 200, "GET /v1/models -> %ld", r.status);
    check_schema(&r, "/v1/models", "GET");
    const json_t *models = get(r.json, "models");
    int seen = 0;
    for (size_t i = 0; i < json_array_size(models); i++) {
        const json_t *m = json_array_get(models, i);
        const char *id = json_string_value(get(m, "id")) ?: "";
        if (!strcmp(id, "tokonly")) {
            CHECK(json_is_null(get(m, "model_type")) && json_is_null(get(m, "architecture")) &&
                      json_is_null(get(m, "task")) && json_array_size(get(m, "analyses")) == 0,
                  "tokenizer-only folder: model_type, architecture, task null, no analyses");
            seen++;
        } else {
            const char *type = json_string_value(get(m, "model_type")) ?: "";
            const int bert_copy = !strcmp(id, "notok") || !strcmp(id, "enc");
            CHECK(!strcmp(type, bert_copy ? "bert" : id), "%s listed as model_type %s", id, type);
            seen++;
        }
    }
    CHECK(seen == 5 && json_array_size(models) == 5, "5 models listed (%zu)", json_array_size(models));
    http_resp_free(&r);
    http_get(s, &r, "/v1/models/tokonly");
    CHECK(r.status == 200 && json_is_null(get(r.json, "model_type")), "GET /v1/models/tokonly -> %ld", r.status);
    check_schema(&r, "/v1/models/{id}", "GET");
    http_resp_free(&r);
}

/* A checkpoint without tokenizer files serves input_ids and refuses text
 * (field text); a tokenizer-only folder refuses every analysis (field model);
 * a bare encoder answers hidden_states by default and refuses logits. */
static void check_missing_parts(test_server *s)
{
    static const bad_case cases[] = {
        {"/v1/forward", "{\"model\": \"notok\", \"text\": \"a b\"}", 422, "invalid_request", "text"},
        {"/v1/forward", "{\"model\": \"tokonly\", \"text\": \"a b\"}", 422, "invalid_request", "model"},
        {"/v1/attention", "{\"model\": \"tokonly\", \"text\": \"a b\"}", 422, "invalid_request", "model"},
        {"/v1/forward", "{\"model\": \"enc\", \"text\": \"a b\", \"outputs\": [\"logits\"]}", 422, "invalid_request", "outputs"},
    };
    run_bad_cases(s, cases, (int)(sizeof cases / sizeof *cases));
    http_resp r;
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"notok\", \"input_ids\": [5, 6, 7]}");
    CHECK(r.status == 200 && json_array_size(get(r.json, "tokens")) == 3, "notok: input_ids answer 200 (%ld %.200s)",
          r.status, r.body);
    check_schema(&r, "/v1/forward", "POST");
    http_resp_free(&r);
    /* a bare encoder has no logits: its default output is hidden_states */
    http_post_json(s, &r, "/v1/forward", "{\"model\": \"enc\", \"text\": \"a b\"}");
    CHECK(r.status == 200 && json_array_size(get(r.json, "hidden_states")) > 0 && !get(r.json, "logits"),
          "bare encoder: hidden_states by default, no logits (%ld %.200s)", r.status, r.body);
    check_schema(&r, "/v1/forward", "POST");
    http_resp_free(&r);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    signal(SIGPIPE, SIG_IGN);
    openapi = yaml_load_file("openapi.yaml");
    CHECK(openapi != NULL, "cannot read openapi.yaml (run from the repository root)");
    if (!openapi || !mkdtemp(tmpdir)) return check_done("test_http_tokens");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %1$s/tokonly %1$s/notok %1$s/models && "
             "%2$s mkmodel --arch bert --preset micro --seed 1 --out %1$s/models/bert >/dev/null && "
             "%2$s mkmodel --arch roberta --preset micro --seed 1 --out %1$s/models/roberta >/dev/null && "
             "cp %1$s/models/bert/vocab.txt %1$s/models/bert/tokenizer_config.json %1$s/tokonly/ && "
             "cp %1$s/models/bert/config.json %1$s/models/bert/model.safetensors %1$s/notok/ && "
             "%2$s mkmodel --arch bert --preset micro --task encoder --seed 1 --out %1$s/enc >/dev/null",
             tmpdir, lensd_path());
    int rc = system(cmd);
    CHECK(rc == 0, "test folders: %s", cmd);
    if (rc == 0) {
        char models_dir[600], tokonly[700], notok[700], enc[700];
        snprintf(models_dir, sizeof models_dir, "%s/models", tmpdir);
        snprintf(tokonly, sizeof tokonly, "tokonly=%s/tokonly", tmpdir); /* --models-dir takes config.json folders */
        snprintf(notok, sizeof notok, "notok=%s/notok", tmpdir);
        snprintf(enc, sizeof enc, "enc=%s/enc", tmpdir);
        const char *args[] = {"--models-dir", models_dir, "--model", tokonly, "--model", notok, "--model", enc, NULL};
        test_server s;
        CHECK(server_launch(&s, args) == 0, "lensd starts");
        if (s.pid) {
            check_listing(&s);
            check_pair(&s, "bert", 1);
            check_pair(&s, "roberta", 0);
            check_pair(&s, "tokonly", 1);
            check_missing_parts(&s);
            CHECK(server_terminate(&s) == 0, "clean exit");
        }
    }
    remove_test_files(tmpdir);
    json_decref(openapi);
    curl_global_cleanup();
    return check_done("test_http_tokens");
}
