/* wordpiece.c - WordPiece (BERT): the model, the fused BERT path and the
 * vocab.txt loader.
 *
 * BERT's pipeline (HF BertNormalizer + BertPreTokenizer + WordPiece) runs
 * fused over raw text: normalise the range once (tokenizer_normalize.c),
 * split on ' ' and punctuation, then greedy longest-match-first with the
 * continuing-subword prefix ("##"); words over max_input_chars_per_word and
 * words with an unmatched rest are one [UNK] over the whole word. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

struct lens_wp_scratch {
    lens_norm_buf normal;
    char *word_utf8;
    int *word_off;
    int word_cap;
};

lens_wp_scratch *lens_wp_scratch_new(void)
{
    return calloc(1, sizeof(lens_wp_scratch));
}

void lens_wp_scratch_free(lens_wp_scratch *sc)
{
    if (!sc) return;
    lens_norm_buf_free(&sc->normal);
    free(sc->word_utf8);
    free(sc->word_off);
    free(sc);
}

/* One word w[0..n) -> pieces; offsets are k0 + [start, end) in the caller's
 * code-point space, mapped through al's alignments when al is not NULL. */
int lens_wp_word(const lens_tokenizer *tok, lens_wp_scratch *sc, const uint32_t *w, int n, int k0,
                 const lens_norm_buf *al, int segment, lens_tok_vec *out)
{
#define WP_START(k) (al ? al->os[k0 + (k)] : k0 + (k))
#define WP_END(k) (al ? al->oe[k0 + (k) - 1] : k0 + (k))
    if (n > tok->max_input_chars_per_word) return lens_tok_push(out, tok->unk_id, WP_START(0), WP_END(n), segment);
    if (n + 1 > sc->word_cap) {
        int cap = (n + 1) * 2;
        char *u = realloc(sc->word_utf8, (size_t)cap * 4);
        if (!u) return -1;
        sc->word_utf8 = u;
        int *o = realloc(sc->word_off, (size_t)cap * sizeof *o);
        if (!o) return -1;
        sc->word_off = o;
        sc->word_cap = cap;
    }
    int nb = 0;
    for (int i = 0; i < n; i++) {
        sc->word_off[i] = nb;
        nb += lens_utf8_put(w[i], sc->word_utf8 + nb);
    }
    sc->word_off[n] = nb;

    int first = out->n;
    int start = 0;
    while (start < n) {
        int end = n, id = -1;
        size_t plen = start > 0 ? (size_t)tok->wp_prefix_len : 0;
        while (end > start && sc->word_off[end] - sc->word_off[start] + (int)plen > tok->max_piece_len) end--;
        for (; end > start; end--) {
            id = lens_vocab_find2(tok, tok->wp_prefix, plen, sc->word_utf8 + sc->word_off[start],
                                  (size_t)(sc->word_off[end] - sc->word_off[start]));
            if (id >= 0) break;
        }
        if (id < 0) {
            /* Like HF: one unmatched rest makes the whole word [UNK]. */
            out->n = first;
            return lens_tok_push(out, tok->unk_id, WP_START(0), WP_END(n), segment);
        }
        if (lens_tok_push(out, id, WP_START(start), WP_END(end), segment) < 0) return -1;
        start = end;
    }
    return 0;
#undef WP_START
#undef WP_END
}

/* Code points [a, b) of t, free of added tokens -> WordPiece tokens, with
 * BertNormalizer (tok->norm[0]) and BertPreTokenizer fused. */
int lens_wp_bert_range(const lens_tokenizer *tok, lens_wp_scratch *sc, const lens_text *t, int a, int b,
                       int segment, lens_tok_vec *out)
{
    lens_norm_buf *nm = &sc->normal;
    if (lens_bert_normalize(&tok->norm[0], t, a, b, nm) < 0) return -1;
    int ws = -1; /* start of the current word in nm, -1 when none */
    for (int i = 0; i <= nm->n; i++) {
        uint32_t cp = i < nm->n ? nm->cp[i] : ' ';
        int space = lens_bert_is_whitespace(cp);
        int boundary = space || lens_bert_is_punct(cp);
        if (!boundary) {
            if (ws < 0) ws = i;
            continue;
        }
        if (ws >= 0 && lens_wp_word(tok, sc, nm->cp + ws, i - ws, ws, nm, segment, out) < 0) return -1;
        ws = -1;
        if (!space && lens_wp_word(tok, sc, nm->cp + i, 1, i, nm, segment, out) < 0) return -1;
    }
    return 0;
}

/* BertTokenizer's pipeline from its options, as tokenizer.json writes it. */
static void bert_pipeline(lens_tokenizer *tok, int lower, int strip, int chinese)
{
    tok->n_norm = 1;
    tok->norm[0] = (lens_norm){ .kind = NORM_BERT, .clean = 1, .chinese = (unsigned char)chinese,
                                .strip_accents = (unsigned char)strip, .lowercase = (unsigned char)lower,
                                .final_sigma = 1 };
    tok->n_pre = 1;
    tok->pre[0] = (lens_pre){ .kind = PRE_BERT };
    tok->bert_fast = 1;
}

static int template_bert(lens_tokenizer *tok, int cls, int sep)
{
    tok->single = malloc(3 * sizeof *tok->single);
    tok->pair = malloc(5 * sizeof *tok->pair);
    if (!tok->single || !tok->pair) return -1;
    tok->single[0] = (lens_tmpl_item){ cls, 0, 0 };
    tok->single[1] = (lens_tmpl_item){ -1, 0, 0 };
    tok->single[2] = (lens_tmpl_item){ sep, 0, 0 };
    memcpy(tok->pair, tok->single, 3 * sizeof *tok->pair);
    tok->pair[3] = (lens_tmpl_item){ -1, 1, 1 };
    tok->pair[4] = (lens_tmpl_item){ sep, 0, 1 };
    tok->n_single = 3;
    tok->n_pair = 5;
    tok->has_template = 1;
    return 0;
}

/* vocab.txt + tokenizer_config.json / special_tokens_map.json, as
 * BertTokenizer(Fast) reads them. */
int lens_load_wordpiece(lens_tokenizer *tok, const char *dir, lens_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    size_t len;
    char *data = lens_file_read(path, &len, err);
    if (!data) return -1;
    size_t bad;
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += data[i] == '\n';
    if (len && data[len - 1] != '\n') lines++;
    int rc = -1;
    if (lines == 0) { lens_fail(err, LENS_EFORMAT, "%s: empty vocabulary", path); goto done; }
    if (lines > LENS_TOK_MAX_ID) { lens_fail(err, LENS_EFORMAT, "%s: %d lines, over %d", path, lines, LENS_TOK_MAX_ID); goto done; }
    if (lens_vocab_alloc(tok, lines, err) < 0) goto done;
    char *p = data;
    for (int line = 0; line < lines; line++) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(data + len - p);
        /* Rust's WordPiece loader trims trailing white space (and so \r). */
        while (n && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (n == 0) { lens_fail(err, LENS_EFORMAT, "%s:%d: empty token", path, line + 1); goto done; }
        if (memchr(p, 0, n)) { lens_fail(err, LENS_EFORMAT, "%s:%d: NUL byte in token", path, line + 1); goto done; }
        if (!lens_utf8_valid(p, n, &bad)) {
            lens_fail(err, LENS_EFORMAT, "%s:%d: not valid UTF-8 at column %zu", path, line + 1, bad + 1);
            goto done;
        }
        if (lens_piece_set(tok, line, p, n, err) < 0) goto done;
        p = nl ? nl + 1 : data + len;
    }
    if (lens_vocab_build_index(tok, err) < 0) goto done;

    json_t *config = NULL, *map = NULL;
    if (lens_tok_json_optional(dir, "tokenizer_config.json", &config, err) < 0) goto done;
    if (lens_tok_json_optional(dir, "special_tokens_map.json", &map, err) < 0) { json_decref(config); goto done; }
    int lower = 1, chinese = 1, strip = -1; /* strip null: follow do_lower_case */
    tok->max_input_chars_per_word = 100;
    const char *unk = "[UNK]", *cls = "[CLS]", *sep = "[SEP]";
    if (config) {
        const json_t *v;
        if ((v = json_object_get(config, "do_lower_case")) && json_is_boolean(v)) lower = json_is_true(v);
        if ((v = json_object_get(config, "strip_accents")) && json_is_boolean(v)) strip = json_is_true(v);
        if ((v = json_object_get(config, "tokenize_chinese_chars")) && json_is_boolean(v)) chinese = json_is_true(v);
        if ((v = json_object_get(config, "max_input_chars_per_word")) && json_is_number(v) && json_number_value(v) >= 1)
            tok->max_input_chars_per_word = json_number_value(v) < INT_MAX ? (int)json_number_value(v) : INT_MAX;
    }
    bert_pipeline(tok, lower, strip < 0 ? lower : strip, chinese);
    tok->wp_prefix = strdup("##");
    tok->wp_prefix_len = 2;
    const json_t *src[2] = { config, map };
    for (int s = 0; s < 2; s++) {
        if (!src[s]) continue;
        const char *v;
        if ((v = lens_tok_json_text(json_object_get(src[s], "unk_token")))) unk = v;
        if ((v = lens_tok_json_text(json_object_get(src[s], "cls_token")))) cls = v;
        if ((v = lens_tok_json_text(json_object_get(src[s], "sep_token")))) sep = v;
    }
    tok->unk_id = lens_vocab_find2(tok, "", 0, unk, strlen(unk));
    int cls_id = lens_vocab_find2(tok, "", 0, cls, strlen(cls));
    int sep_id = lens_vocab_find2(tok, "", 0, sep, strlen(sep));
    const char *missing = tok->unk_id < 0 ? unk : cls_id < 0 ? cls : sep_id < 0 ? sep : NULL;
    if (missing) {
        lens_fail(err, LENS_EFORMAT, "%s: special token \"%s\" is not in the vocabulary", path, missing);
    } else if (!tok->wp_prefix || template_bert(tok, cls_id, sep_id) < 0) {
        lens_fail(err, LENS_ENOMEM, "out of memory");
    } else {
        /* BertTokenizer's defaults are special tokens even without a config. */
        static const char *const defaults[] = { "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]" };
        rc = 0;
        for (int k = 0; k < 5 && rc == 0; k++)
            rc = lens_added_add(tok, defaults[k], -1, 1, 0, 0, 0) < 0 ? lens_fail(err, LENS_ENOMEM, "out of memory") : 0;
        if (rc == 0 && lens_added_add(tok, unk, -1, 1, 0, 0, 0) < 0) rc = lens_fail(err, LENS_ENOMEM, "out of memory");
        if (rc == 0) rc = lens_added_from_json(tok, config, err);
        if (rc == 0) rc = lens_added_from_json(tok, map, err);
    }
    json_decref(config);
    json_decref(map);
done:
    free(data);
    return rc;
}
