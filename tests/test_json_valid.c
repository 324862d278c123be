/* test_json_valid.c - tests/fuzz/json_valid.h, the allocation-free JSON
 * recogniser the request fuzzers check 200 bodies with: a table of texts
 * with their expected verdicts, then a differential run against jansson
 * (json_loadb, flags 0, the check it replaces) on documents mutated byte by
 * byte from real lensd-shaped answers. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tests/check.h"
#include "tests/fuzz/json_valid.h"

static const struct {
    const char *text;
    int valid;
} cases[] = {
    {"{}", 1}, {"[]", 1}, {" \t\r\n[ ] \n", 1}, {"0", 1}, {"-0", 1}, {"-0.5e+10", 1}, {"1E5", 1},
    {"123456789", 1}, {"\"\"", 1}, {"true", 1}, {"false", 1}, {"null", 1},
    {"{\"a\": [1, 2.5, -3e-7, \"x\", null, true, {\"b\": {}}]}", 1},
    {"\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", 1}, {"\"\\u00e9 \\uD83D\\uDE00\"", 1},
    {"\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"", 1},
    {"", 0}, {" ", 0}, {"{", 0}, {"[1,]", 0}, {"[,1]", 0}, {"{\"a\" 1}", 0}, {"{\"a\": 1,}", 0}, {"{a: 1}", 0},
    {"[1 2]", 0}, {"01", 0}, {"-", 0}, {"1.", 0}, {".5", 0}, {"1e", 0}, {"+1", 0}, {"NaN", 0}, {"Infinity", 0},
    {"tru", 0}, {"nul", 0}, {"\"abc", 0}, {"\"a\nb\"", 0}, {"\"\\x\"", 0}, {"\"\\u12\"", 0}, {"\"\\u0000\"", 0},
    {"\"\\uD800\"", 0}, {"\"\\uDC00\"", 0}, {"\"\\uD800\\u0041\"", 0}, {"\"\xc3\"", 0}, {"\"\xc0\xaf\"", 0},
    {"\"\xed\xa0\x80\"", 0}, {"\"\xf4\x90\x80\x80\"", 0}, {"\"\xff\"", 0}, {"[] []", 0}, {"{} x", 0},
    {"{\"a\": 1}}", 0}, {"9223372036854775807", 1}, {"-9223372036854775808", 1}, {"9223372036854775808", 0},
    {"1e308", 1}, {"1e309", 0}, {"-2e308", 0}, {"1e-400", 1}, {"0.000001e305", 1},
};

/* lensd-shaped answers the mutations start from */
static const char *const docs[] = {
    "{\"model\": \"bert\", \"tokens\": [{\"id\": 101, \"text\": \"[CLS]\", \"start\": 0, \"end\": 0}], "
    "\"hidden_states\": [[[0.125, -1.5e-05, 3.25], [2, -0, 1e+30]]], \"timing_ms\": 1.25}",
    "{\"error\": {\"code\": \"invalid_request\", \"message\": \"caf\xc3\xa9 \\u00e9 \\\"quoted\\\"\", \"field\": null}}",
    "[true, false, null, \"\\uD83D\\uDE00\", {\"a\": [], \"b\": {}}, -12.5E3]",
};

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

int main(void)
{
    const int n = (int)(sizeof cases / sizeof cases[0]);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        const int got = json_valid(cases[i].text, strlen(cases[i].text));
        CHECK(got == cases[i].valid, "json_valid(%s) = %d, want %d", cases[i].text, got, cases[i].valid);
        checked++;
    }
    CHECK(checked == 59 && n == 59, "%d table cases, want 59", checked);

    /* nesting: 2048 levels are one text, 2049 are refused (jansson's limit) */
    static char deep[2 * 2049 + 1];
    for (int levels = 2048; levels <= 2049; levels++) {
        memset(deep, '[', (size_t)levels), memset(deep + levels, ']', (size_t)levels);
        json_t *j = json_loadb(deep, 2 * (size_t)levels, 0, NULL);
        CHECK(json_valid(deep, 2 * (size_t)levels) == (j != NULL) && (j != NULL) == (levels == 2048),
              "%d nested arrays: json_valid %d, jansson %d", levels, json_valid(deep, 2 * (size_t)levels), j != NULL);
        json_decref(j);
    }

    /* differential: every document mutated 20000 times (1-3 bytes replaced, inserted or deleted, from
     * the document's own bytes and a few that matter), same verdict as jansson */
    static const char alphabet[] = "{}[]:,\"\\ u0123456789.eE+-tfnalrsDdcC\xc3\xa9\xed\xf0\x80\xbf\x01\n";
    int agree = 0, valid_seen = 0, invalid_seen = 0, runs = 0;
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
        const size_t len = strlen(docs[d]);
        char buf[512];
        for (int r = 0; r < 20000; r++, runs++) {
            size_t m = len;
            memcpy(buf, docs[d], len);
            for (int k = (int)(next() % 3); k >= 0; k--) {
                const size_t at = m ? next() % m : 0;
                const char c = next() % 2 ? alphabet[next() % (sizeof alphabet - 1)] : docs[d][next() % len];
                switch (next() % 3) {
                case 0: if (m) buf[at] = c; break;
                case 1: if (m + 1 < sizeof buf) memmove(buf + at + 1, buf + at, m - at), buf[at] = c, m++; break;
                default: if (m) memmove(buf + at, buf + at + 1, m - at - 1), m--; break;
                }
            }
            json_t *j = json_loadb(buf, m, 0, NULL);
            const int mine = json_valid(buf, m), theirs = j != NULL;
            json_decref(j);
            if (mine == theirs) agree++;
            else CHECK(0, "json_valid %d, jansson %d on: %.*s", mine, theirs, (int)m, buf);
            valid_seen += theirs, invalid_seen += !theirs;
        }
    }
    CHECK(agree == runs, "%d of %d mutated documents judged as jansson judges them", agree, runs);
    CHECK(valid_seen > 1000 && invalid_seen > 1000, "the mutations reach both verdicts: %d valid, %d invalid",
          valid_seen, invalid_seen);
    printf("  %d table cases; %d mutated documents, %d valid and %d invalid for jansson, %d agree\n", checked, runs,
           valid_seen, invalid_seen, agree);
    return check_done("test_json_valid");
}
