/* tokenizer_regex.c - the regexes of tokenizer.json through Oniguruma.
 *
 * Hugging Face's tokenizers compiles every Split / Replace / ByteLevel regex
 * with the `onig` crate, which is Oniguruma 6.9.8 (the release Debian 12
 * ships as libonig): the same engine here means the same matches, including
 * which code points \p{L}, \p{N} and \s take (Oniguruma's Unicode tables,
 * not utf8proc's). Patterns compile as the crate's Regex::new does: UTF-8,
 * the default (Ruby) syntax, no options.
 *
 * lens_regex_each walks the matches of a code-point range of a lens_text the
 * way the crate's find_iter does: left to right, each search starting where
 * the last match ended, an empty match right at the end of the previous
 * match skipped by one character. A compiled regex is read-only, so one is
 * shared by every thread tokenizing with it.
 *
 * One difference between the engines remains, in their tables: the onig
 * crate builds its own copy of Oniguruma whose Unicode data is version 15,
 * Debian's libonig 6.9.8 has version 14, so the ~4,500 code points
 * assigned in Unicode 15 (CJK Extension H such as U+31350, Kawi, Nag
 * Mundari, ...) are \p{Cn} here and letters there. So the matcher reads a
 * stand-in for each of them: a code point Oniguruma knows, of the same
 * general category (utf8proc's Unicode 15 data) and the same UTF-8 length,
 * so byte offsets do not move (found once per process, at first use). */
#include <oniguruma.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

struct lens_regex {
    regex_t *re;
};

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static int onig_ready;

#define N_CODE_POINTS 0x110000
/* code points utf8proc knows and Oniguruma's tables do not: bit set */
static uint8_t unknown_to_onig[N_CODE_POINTS / 8];
/* stand_in[category][UTF-8 length - 1]: a code point Oniguruma knows */
static uint32_t stand_in[UTF8PROC_CATEGORY_CO + 1][4];

static const char *const category_name[UTF8PROC_CATEGORY_CO + 1] = {
    "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
    "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co",
};

static int onig_ctype(const char *name)
{
    return ONIGENC_PROPERTY_NAME_TO_CTYPE(ONIG_ENCODING_UTF8, (OnigUChar *)name, (OnigUChar *)name + strlen(name));
}

static int utf8_len(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

static int is_unknown(uint32_t cp)
{
    return cp < N_CODE_POINTS && (unknown_to_onig[cp >> 3] >> (cp & 7) & 1);
}

/* The code points assigned in utf8proc's Unicode and not in Oniguruma's,
 * and a stand-in for each (category, length) among them. */
static void find_unknown(void)
{
    const int cn = onig_ctype("Cn");
    for (uint32_t cp = 0x80; cp < N_CODE_POINTS; cp++) {
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        if (c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_CS || c == UTF8PROC_CATEGORY_CO) continue;
        if (!ONIGENC_IS_CODE_CTYPE(ONIG_ENCODING_UTF8, cp, cn)) continue;
        unknown_to_onig[cp >> 3] |= (uint8_t)(1u << (cp & 7));
        int len = utf8_len(cp);
        if (stand_in[c][len - 1]) continue;
        const uint32_t lo[4] = { 0, 0x80, 0x800, 0x10000 }, hi[4] = { 0x80, 0x800, 0x10000, N_CODE_POINTS };
        const int want = onig_ctype(category_name[c]);
        for (uint32_t s = lo[len - 1]; s < hi[len - 1]; s++)
            if (s < 0xD800 || s > 0xDFFF)
                if (utf8proc_category((utf8proc_int32_t)s) == c && ONIGENC_IS_CODE_CTYPE(ONIG_ENCODING_UTF8, s, want)) {
                    stand_in[c][len - 1] = s;
                    break;
                }
    }
}

static void onig_start(void)
{
    OnigEncoding use[] = { ONIG_ENCODING_UTF8 };
    onig_ready = onig_initialize(use, 1) == ONIG_NORMAL;
    if (onig_ready) find_unknown();
}

lens_regex *lens_regex_compile(const char *pattern, char *msg, size_t msg_cap)
{
    pthread_once(&onig_once, onig_start);
    if (!onig_ready) {
        snprintf(msg, msg_cap, "Oniguruma could not start");
        return NULL;
    }
    lens_regex *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(msg, msg_cap, "out of memory");
        return NULL;
    }
    OnigErrorInfo info;
    const OnigUChar *p = (const OnigUChar *)pattern;
    int rc = onig_new(&r->re, p, p + strlen(pattern), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    if (rc != ONIG_NORMAL) {
        OnigUChar text[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(text, rc, &info);
        snprintf(msg, msg_cap, "%s", (const char *)text);
        free(r);
        return NULL;
    }
    return r;
}

void lens_regex_free(lens_regex *r)
{
    if (!r) return;
    onig_free(r->re);
    free(r);
}

/* The code point index of byte offset pos (a character boundary), searched
 * forward from *at in t->byte_off. */
static int cp_at(const lens_text *t, int *at, int pos)
{
    while (t->byte_off[*at] < pos) (*at)++;
    return *at;
}

/* The bytes of [a, b) with each code point Oniguruma does not know
 * replaced by its stand-in (same length); NULL when there is none. */
static char *with_stand_ins(const lens_text *t, int a, int b, int *failed)
{
    char *copy = NULL;
    for (int i = a; i < b; i++) {
        if (t->cp[i] < 0x80 || !is_unknown(t->cp[i])) continue;
        const int base = t->byte_off[a];
        if (!copy) {
            copy = malloc((size_t)(t->byte_off[b] - base) + 1);
            if (!copy) { *failed = 1; return NULL; }
            memcpy(copy, t->bytes + base, (size_t)(t->byte_off[b] - base));
        }
        uint32_t s = stand_in[utf8proc_category((utf8proc_int32_t)t->cp[i])][utf8_len(t->cp[i]) - 1];
        if (s) lens_utf8_put(s, copy + t->byte_off[i] - base);
    }
    return copy;
}

int lens_regex_each(const lens_regex *r, const lens_text *t, int a, int b, lens_match_fn found, void *ctx)
{
    int failed = 0;
    char *copy = with_stand_ins(t, a, b, &failed);
    if (failed) return -1;
    const OnigUChar *str = (const OnigUChar *)(copy ? copy : t->bytes + t->byte_off[a]);
    const int len = t->byte_off[b] - t->byte_off[a], base = t->byte_off[a];
    OnigRegion region;
    onig_region_init(&region);
    int from = 0, last_end = -1, at = a, rc = 0;
    while (from <= len && !rc) {
        int r_at = onig_search(r->re, str, str + len, str + from, str + len, &region, ONIG_OPTION_NONE);
        if (r_at < 0) {
            /* ONIG_MISMATCH ends the walk; anything else (a retry limit hit) is an error */
            if (r_at != ONIG_MISMATCH) rc = -1;
            break;
        }
        int s = region.beg[0], e = region.end[0];
        if (s == e && e == last_end) {
            /* the crate's rule: no empty match right after the previous one */
            if (from == len) break;
            from = t->byte_off[cp_at(t, &at, base + from) + 1] - base;
            continue;
        }
        from = last_end = e;
        int cs = cp_at(t, &at, base + s), ce = cs;
        ce = cp_at(t, &ce, base + e);
        rc = found(ctx, cs, ce);
        if (s == e && from == len) break;
    }
    onig_region_free(&region, 0);
    free(copy);
    return rc;
}
