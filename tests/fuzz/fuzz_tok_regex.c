/* fuzz_tok_regex.c - the hand-written fast paths of the GPT-2, Llama-3 and
 * Qwen2 regexes (core/io/tokenizer_pretok.c) against Oniguruma, the engine
 * Hugging Face runs them with (core/io/tokenizer_regex.c).
 *
 * Input: text (invalid UTF-8 is skipped). For each of the three patterns,
 * the fast path's pre-tokens of the whole text must be exactly Oniguruma's
 * pieces with behaviour Isolated (the matches and the text between them),
 * or the target aborts printing the first difference. */
#include "tests/fuzz/fuzz.h"
#include "core/io/tokenizer_impl.h"

typedef struct {
    int ends[4096];
    int n, prev, overflow;
} cuts;

/* Isolated: a cut before and after every match. */
static int on_match(void *ctx, int s, int e)
{
    cuts *c = ctx;
    const int add[2] = { s, e };
    for (int k = 0; k < 2; k++) {
        if (add[k] == c->prev) continue;
        if (c->n == 4096) { c->overflow = 1; return 1; }
        c->ends[c->n++] = c->prev = add[k];
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static lens_regex *re[3];
    if (!re[0]) {
        char msg[128];
        for (int k = 0; k < 3; k++) {
            re[k] = lens_regex_compile(lens_fast_regex_pattern((lens_fast_regex)k), msg, sizeof msg);
            FUZZ_REQUIRE(re[k] != NULL, "pattern %d: %s", k, msg);
        }
    }
    size_t bad_at;
    if (size > 4096 || !lens_utf8_valid((const char *)data, size, &bad_at)) return 0;
    lens_text t;
    lens_err err = { 0 };
    if (lens_text_decode(&t, (const char *)data, size, "text", &err) < 0) return 0;
    for (int k = 0; k < 3 && t.n > 0; k++) {
        cuts c = { .n = 0, .prev = 0, .overflow = 0 };
        int rc = lens_regex_each(re[k], &t, 0, t.n, on_match, &c);
        if (c.overflow) continue;
        FUZZ_REQUIRE(rc == 0, "pattern %d: Oniguruma failed", k);
        if (c.prev != t.n) c.ends[c.n++] = t.n;
        int i = 0, at = 0;
        while (i < t.n) {
            int j = lens_fast_word_end((lens_fast_regex)k, t.cp, i, t.n);
            FUZZ_REQUIRE(j > i && at < c.n && j == c.ends[at],
                         "pattern %d: the fast path's pre-token [%d, %d), Oniguruma's ends at %d (code point U+%04X at %d)",
                         k, i, j, at < c.n ? c.ends[at] : -1, (unsigned)t.cp[i], i);
            i = j, at++;
        }
        FUZZ_REQUIRE(at == c.n, "pattern %d: %d pre-tokens, Oniguruma %d", k, at, c.n);
    }
    lens_text_free(&t);
    return 0;
}
