/* unigram.c - the Unigram model of SentencePiece as Hugging Face's
 * tokenizers runs it (models/unigram/model.rs, encode_optimized).
 *
 * A pre-token (code points [a, b) of a decoded text) is cut into the pieces
 * whose scores (log probabilities) sum highest: Viterbi over code point
 * positions, where best[j] is the best score of a cut of [a, j):
 *   best[j] = max over pieces p = text[i, j) in the vocabulary of best[i] + score(p)
 * and where no piece is exactly the one character at i, [i, i + 1) may be
 * the unknown token at score min_score - 10 (HF's K_UNK_PENALTY). A later
 * candidate replaces the one held only when strictly better, so ties keep
 * the first found, as HF. The cut is read back from the end; consecutive
 * unknowns are fused into one (HF's fuse_unk, on for Unigram). A piece
 * string then not in the vocabulary becomes, with byte_fallback, its bytes
 * as <0xXX> pieces (all with the piece's span), else unk_id.
 * Pieces are looked up in the vocabulary hash for every byte length up to
 * the longest piece (HF walks a trie; the set found is the same). */
#include <stdlib.h>
#include <string.h>

#include "core/io/tokenizer_impl.h"

#define UNK_PENALTY 10.0

typedef struct {
    double score;
    int from, id; /* from -1: not reached yet */
} lattice_node;

/* The id of bytes [s, e) of t among the model's pieces, or -1. */
static int piece_id(const lens_tokenizer *tok, const lens_text *t, int s, int e)
{
    int id = lens_vocab_find2(tok, "", 0, t->bytes + t->byte_off[s], (size_t)(t->byte_off[e] - t->byte_off[s]));
    return id >= 0 && id < tok->n_model_pieces ? id : -1;
}

/* Fills best[0..n] (n = b - a) for [a, b). */
static void viterbi(const lens_tokenizer *tok, const lens_text *t, int a, int b, lattice_node *best)
{
    const int n = b - a;
    const double unk_score = tok->min_score - UNK_PENALTY;
    best[0] = (lattice_node){ 0.0, 0, -1 };
    for (int j = 1; j <= n; j++) best[j] = (lattice_node){ 0.0, -1, -1 };
    for (int i = 0; i < n; i++) {
        if (best[i].from < 0) continue;
        int single = 0;
        const int start_byte = t->byte_off[a + i];
        for (int j = i + 1; j <= n && t->byte_off[a + j] - start_byte <= tok->max_piece_len; j++) {
            int id = piece_id(tok, t, a + i, a + j);
            if (id < 0) continue;
            double cand = best[i].score + tok->score[id];
            if (best[j].from < 0 || cand > best[j].score) best[j] = (lattice_node){ cand, i, id };
            if (j == i + 1) single = 1;
        }
        if (!single) {
            double cand = best[i].score + unk_score;
            if (best[i + 1].from < 0 || cand > best[i + 1].score) best[i + 1] = (lattice_node){ cand, i, tok->unk_id };
        }
    }
}

/* One piece string [s, e) of t as tokens: its id, or its bytes with
 * byte_fallback, or unk_id. */
static int emit(const lens_tokenizer *tok, const lens_text *t, int s, int e, int segment, lens_tok_vec *out)
{
    int id = piece_id(tok, t, s, e);
    if (id >= 0) return lens_tok_push(out, id, s, e, segment);
    if (tok->byte_fallback) {
        int all = 1;
        for (int k = t->byte_off[s]; k < t->byte_off[e] && all; k++)
            all = tok->fallback_id[(unsigned char)t->bytes[k]] >= 0;
        if (all) {
            for (int k = t->byte_off[s]; k < t->byte_off[e]; k++)
                if (lens_tok_push(out, tok->fallback_id[(unsigned char)t->bytes[k]], s, e, segment) < 0) return -1;
            return 0;
        }
    }
    return lens_tok_push(out, tok->unk_id, s, e, segment);
}

int lens_unigram_word(const lens_tokenizer *tok, const lens_text *t, int a, int b, int segment, lens_tok_vec *out)
{
    const int n = b - a;
    if (n <= 0) return 0;
    lattice_node stack[128], *best = n < 128 ? stack : malloc((size_t)(n + 1) * sizeof *best);
    int stack_cut[128], *cut = n < 128 ? stack_cut : malloc((size_t)(n + 1) * sizeof *cut);
    int rc = -1;
    if (!best || !cut) goto done;
    viterbi(tok, t, a, b, best); /* every position is reached: unk_id exists (checked at load) */
    /* read back, fusing runs of unknowns: cut[] holds the piece starts, last first */
    int m = 0;
    for (int j = n; j > 0;) {
        int i = best[j].from;
        if (best[j].id == tok->unk_id)
            while (i > 0 && best[i].id == tok->unk_id) i = best[i].from;
        cut[m++] = i;
        j = i;
    }
    rc = 0;
    for (int k = m - 1, end; k >= 0 && !rc; k--) {
        end = k ? cut[k - 1] : n;
        rc = emit(tok, t, a + cut[k], a + end, segment, out);
    }
done:
    if (best != stack) free(best);
    if (cut != stack_cut) free(cut);
    return rc;
}
