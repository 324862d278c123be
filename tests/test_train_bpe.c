/* test_train_bpe.c - the GPT-2 byte-level BPE vocabulary learner
 * (core/train/train_bpe.c, `lensd train vocab --bpe`).
 *
 * - On "hug hug hug pug pun bun hugs" the merges and their counts are the
 *   ones worked out by hand below, ties broken by the smaller id pair.
 * - The written vocab.json / merges.txt load with lens_tokenizer_load as a
 *   BPE tokenizer, which encodes with the learned merges, and tokenizing
 *   the training text (ASCII, UTF-8 up to 4-byte characters, digits,
 *   contractions, runs of spaces and newlines) gives back its bytes exactly
 *   when the pieces are mapped back through bytes_to_unicode.
 * - Learning twice, or from the same text added in two parts in the other
 *   order, writes byte-identical files. */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/io/tokenizer.h"
#include "core/train/train_bpe.h"

static char tmp_root[] = "/tmp/lens_test_train_bpe_XXXXXX";

static int learn(const char *const *parts, int n_parts, int vocab_size, int min_count, lens_bpe_vocab *v)
{
    lens_err err = {0};
    lens_bpe_trainer *tr = lens_bpe_trainer_new(&err);
    int rc = tr ? 0 : -1;
    for (int i = 0; i < n_parts && !rc; i++) rc = lens_bpe_trainer_add_text(tr, parts[i], strlen(parts[i]), &err);
    if (!rc) rc = lens_bpe_trainer_learn(tr, vocab_size, min_count, v, &err);
    if (rc) fprintf(stderr, "learn: %s\n", err.msg);
    lens_bpe_trainer_free(tr);
    return rc;
}

static char *slurp_path(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    *len = s ? fread(s, 1, (size_t)n, f) : 0;
    if (s) s[*len] = 0;
    fclose(f);
    return s;
}

static char *slurp(const char *dir, const char *name, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return slurp_path(path, len);
}

/* Inverse of GPT-2's bytes_to_unicode, written from its definition:
 * printable Latin-1 bytes are themselves, the others U+0100 + rank. */
static int unicode_to_byte(uint32_t cp)
{
    int rank = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (printable && cp == (uint32_t)b) return b;
        if (!printable && cp == 256u + (uint32_t)rank++) return b;
    }
    return -1;
}

/* Bytes of a vocabulary piece ("Ġhug" -> " hug"); -1 if not byte-level. */
static int piece_bytes(const char *piece, char *out)
{
    const unsigned char *s = (const unsigned char *)piece;
    int n = 0;
    while (*s) {
        uint32_t cp = *s < 0x80 ? *s : (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
        s += *s < 0x80 ? 1 : 2;
        int b = unicode_to_byte(cp);
        if (b < 0) return -1;
        out[n++] = (char)b;
    }
    return n;
}

static void check_hand_counts(void)
{
    /* Words: "hug" x1, " hug" x2, " pug", " pun", " bun", " hugs" x1.
     * 1. (u,g): hug 1 + hug 2 + pug 1 + hugs 1 = 5
     * 2. (h,ug): 1 + 2 + 1 = 4
     * 3. (Ġ,hug): 2 + 1 = 3
     * 4. (u,n) = 2 and (Ġ,p) = 2 tie: id(u) = 84 < id(Ġ) = 220, so (u,n)
     * 5. (Ġ,p) = 2; every other pair occurs once, under min_count 2. */
    const char *text = "hug hug hug pug pun bun hugs";
    static const char *const want_piece[] = {"ug", "hug", " hug", "un", " p"};
    static const long want_count[] = {5, 4, 3, 2, 2};
    lens_bpe_vocab v;
    if (learn(&text, 1, 1000, 2, &v)) {
        CHECK(0, "hand corpus: learn failed");
        return;
    }
    CHECK(v.n_merges == 5 && v.n_pieces == 256 + 5 + 1, "hand corpus: %d merges, %d pieces (want 5, 262)",
          v.n_merges, v.n_pieces);
    CHECK(v.piece_len[84] == 1 && v.piece[84][0] == 'u' && v.piece_len[220] == 1 && v.piece[220][0] == ' ',
          "byte ids: 84 is '%s', 220 is '%s' (want u and space, GPT-2's order)", v.piece[84], v.piece[220]);
    for (int m = 0; m < v.n_merges && m < 5; m++) {
        const char *got = v.piece[v.merge[m][2]];
        CHECK(!strcmp(got, want_piece[m]) && v.merge_count[m] == want_count[m] && v.merge[m][2] == 256 + m,
              "merge %d: \"%s\" (id %d) count %ld, want \"%s\" (id %d) count %ld", m, got, v.merge[m][2],
              v.merge_count[m], want_piece[m], 256 + m, want_count[m]);
    }
    CHECK(!strcmp(v.piece[v.n_pieces - 1], "<|endoftext|>"), "last piece \"%s\"", v.piece[v.n_pieces - 1]);
    lens_bpe_vocab_free(&v);

    /* The size bounds the merges: 259 = 256 bytes + 2 merges + <|endoftext|>. */
    if (learn(&text, 1, 259, 1, &v) == 0) {
        CHECK(v.n_merges == 2 && v.n_pieces == 259 && !strcmp(v.piece[257], "hug"),
              "size 259: %d merges, %d pieces", v.n_merges, v.n_pieces);
        lens_bpe_vocab_free(&v);
    }

    /* Saved and loaded: the tokenizer applies the merges by rank. */
    char dir[256];
    snprintf(dir, sizeof dir, "%s/hug", tmp_root);
    lens_err err = {0};
    if (learn(&text, 1, 1000, 2, &v) || lens_bpe_vocab_save(&v, dir, &err)) {
        CHECK(0, "hand corpus: save: %s", err.msg);
        return;
    }
    lens_bpe_vocab_free(&v);
    lens_tokenizer *tok = lens_tokenizer_load(dir, &err);
    CHECK(tok != NULL, "load %s: %s", dir, err.msg);
    if (!tok) return;
    CHECK(lens_tokenizer_kind(tok) == LENS_TOK_BPE && lens_tokenizer_vocab_size(tok) == 262,
          "kind %d, vocab size %d", lens_tokenizer_kind(tok), lens_tokenizer_vocab_size(tok));
    CHECK(lens_tokenizer_id(tok, "Ġhug") == 258 && lens_tokenizer_id(tok, "<|endoftext|>") == 261,
          "ids: Ġhug %d, <|endoftext|> %d", lens_tokenizer_id(tok, "Ġhug"), lens_tokenizer_id(tok, "<|endoftext|>"));
    static const int want_ids[] = {257, 258, 260, 259, 220, 65, 259, 261};
    const char *probe = "hug hug pun bun<|endoftext|>";
    lens_token *t = NULL;
    int n = 0;
    CHECK(!lens_tokenize(tok, probe, strlen(probe), NULL, 0, &t, &n, &err), "tokenize: %s", err.msg);
    int same = n == 8;
    for (int i = 0; same && i < n; i++) same = t[i].id == want_ids[i];
    CHECK(same, "\"%s\": %d tokens, first ids %d %d %d %d (want 257 258 260 259 220 65 259 261)", probe, n,
          n > 0 ? t[0].id : -1, n > 1 ? t[1].id : -1, n > 2 ? t[2].id : -1, n > 3 ? t[3].id : -1);
    free(t);
    lens_tokenizer_free(tok);
}

/* Tokenize text with the vocabulary in dir and map the pieces back to bytes. */
static void check_round_trip(const char *dir, const char *text, size_t len, const char *what)
{
    lens_err err = {0};
    lens_tokenizer *tok = lens_tokenizer_load(dir, &err);
    CHECK(tok != NULL, "%s: load: %s", what, err.msg);
    if (!tok) return;
    lens_token *t = NULL;
    int n = 0;
    CHECK(!lens_tokenize(tok, text, len, NULL, 0, &t, &n, &err), "%s: tokenize: %s", what, err.msg);
    char *back = malloc(len + 64), piece[1024];
    size_t pos = 0;
    int ok = back != NULL;
    for (int i = 0; ok && i < n; i++) {
        const char *p = lens_tokenizer_piece(tok, t[i].id);
        int k = p && strlen(p) < sizeof piece / 2 ? piece_bytes(p, piece) : -1;
        ok = k >= 0 && pos + (size_t)k <= len;
        if (ok) memcpy(back + pos, piece, (size_t)k), pos += (size_t)k;
    }
    size_t first_diff = 0;
    while (first_diff < pos && first_diff < len && back[first_diff] == text[first_diff]) first_diff++;
    CHECK(ok && pos == len && first_diff == len, "%s: round trip gives %zu bytes of %zu, first difference at %zu",
          what, pos, len, first_diff);
    /* and the vocabulary compresses: fewer tokens than bytes */
    CHECK(n > 0 && (size_t)n < len, "%s: %d tokens for %zu bytes", what, n, len);
    free(back);
    free(t);
    lens_tokenizer_free(tok);
}

static const char *const corpus_lines[] = {
    "The quick brown fox jumps over the lazy dog.\n",
    "It's 2026; they're saying we'll see 3.14159 and 1,000,000 more.\n",
    "  Two   spaces,\ttabs\tand trailing   \n",
    "Café naïve résumé — “quoted” ‘single’ 日本語のテキスト 🙂🚀 Ωmega\n",
    "the the the theory thermal there their the they\n",
    " = Valkyria Chronicles III = \n",
    "\n",
    "lower lowest newer wider low low low\n",
};

static void check_files_and_determinism(void)
{
    char text[4096] = "";
    int n_lines = (int)(sizeof corpus_lines / sizeof *corpus_lines);
    for (int i = 0; i < n_lines; i++) strcat(text, corpus_lines[i]);
    /* the same text in two parts, second part first (split after a "\n"
     * followed by a letter, so the pre-tokens are the same) */
    char head[4096] = "", tail[4096] = "";
    for (int i = 0; i < n_lines; i++) strcat(i < 4 ? head : tail, corpus_lines[i]);
    const char *whole[1] = {text}, *swapped[2] = {tail, head};

    char dir_a[256], dir_b[256], dir_c[256];
    snprintf(dir_a, sizeof dir_a, "%s/a", tmp_root);
    snprintf(dir_b, sizeof dir_b, "%s/b", tmp_root);
    snprintf(dir_c, sizeof dir_c, "%s/c", tmp_root);
    const char *dirs[3] = {dir_a, dir_b, dir_c};
    for (int r = 0; r < 3; r++) {
        lens_bpe_vocab v;
        lens_err err = {0};
        if (learn(r < 2 ? whole : swapped, r < 2 ? 1 : 2, 400, 1, &v) || lens_bpe_vocab_save(&v, dirs[r], &err)) {
            CHECK(0, "run %d: %s", r, err.msg);
            return;
        }
        CHECK(v.n_merges > 50, "run %d: only %d merges", r, v.n_merges);
        lens_bpe_vocab_free(&v);
    }
    static const char *const files[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
    for (int f = 0; f < 3; f++) {
        size_t na = 0, nb = 0, nc = 0;
        char *a = slurp(dir_a, files[f], &na), *b = slurp(dir_b, files[f], &nb), *c = slurp(dir_c, files[f], &nc);
        CHECK(a && b && c && na > 0 && na == nb && na == nc && !memcmp(a, b, na) && !memcmp(a, c, na),
              "%s differs between runs (%zu, %zu, %zu bytes)", files[f], na, nb, nc);
        free(a), free(b), free(c);
    }
    check_round_trip(dir_a, text, strlen(text), "toy corpus");
    const char *unseen = "Zebras' quiz: 42 — völlig neu 🦓\n\n\t end";
    check_round_trip(dir_a, unseen, strlen(unseen), "unseen text");
}

/* A real corpus when the shared data is there: WikiText-2 valid, 5000 merges. */
static void check_wikitext(void)
{
    const char *shared = check_shared_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/data/wikitext2/valid.txt", shared ? shared : ".");
    struct stat st;
    if (!shared || stat(path, &st)) {
        SKIP("no %s", path);
        return;
    }
    char dir[256];
    snprintf(dir, sizeof dir, "%s/wiki", tmp_root);
    lens_err err = {0};
    const char *paths[1] = {path};
    CHECK(!lens_train_bpe(paths, 1, 5000, 2, dir, &err), "train %s: %s", path, err.msg);
    size_t len = 0;
    char *text = slurp_path(path, &len);
    CHECK(text != NULL, "read %s", path);
    if (text) check_round_trip(dir, text, len, "WikiText-2 valid");
    free(text);
}

int main(void)
{
    if (!mkdtemp(tmp_root)) return 1;
    check_hand_counts();
    check_files_and_determinism();
    check_wikitext();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp_root);
    return check_done("test_train_bpe");
}
