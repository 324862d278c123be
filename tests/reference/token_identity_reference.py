#!/usr/bin/python3
"""token_identity_reference.py - token identifiability (Brunner et al. 2020,
sec. 4) in PyTorch float64, for tests/test_token_identity.c.

Hidden states come from reference_forward.py's models with the weights cast
to float64 (h^0 = embedding output, h^l = output of block l, GPT-2's last
with ln_f, as HF hidden_states). Nothing of lensd is used; token ids come from
the small tokenizers below (BERT WordPiece, GPT-2 byte-level BPE on ASCII
text) and are written into the fixture, so the C test reads ids, not text.

Ranking of a query q against candidates c_j with own candidate o
(key larger = nearer):
    cosine:  key_j = q·c_j / (‖q‖ ‖c_j‖)
    l2:      key_j = −‖q − c_j‖²
    rank     = 1 + #{j : key_j > key_o}          (ties count for the token)
    top-k    = candidates by key descending, own first on ties, then index
For every rank the fixture also stores "slack": the number of j ≠ o with
|key_j − key_o| <= eps (near-ties a float32 implementation may order either
way), that eps, and for the neighbours the keys of the best k+1, so the C
test can accept a swap of two neighbours whose keys are within eps. eps = 1e-5 (cosine) and
1e-5 · (‖q‖² + mean_j ‖c_j‖²) (l2); the C side computes in float32 from
float32 hidden states that differ from these by ~1e-6 relative.

Sections of tests/fixtures/token_identity_shared.json:
  rankings   bert-tiny-sst2 and gpt2-tiny-wikitext, a few sentences (one
             over 64 tokens), every layer, both metrics, identity mapping:
             ranks, slack, neighbors (top 5), neighbor keys (top 6)
  vocabulary bert-tiny-mlm: h^l (identity mapping) against the whole input
             embedding table with own = the token id, both metrics
  fit        bert-tiny-sst2, ridge maps fitted on the first 200 sentences of
             sst2/train_part_alps.tsv, held out on the next 50:
                 Xc = X − μx (X = h^l rows of all tokens, Y = h^0)
                 λ = ridge · trace(XcᵀXc) / C
                 W = (XcᵀXc + λI)⁻¹ Xcᵀ(Y − μy),  b = μy − μx W
             stored: ids, ridge, b, ‖W‖_F and every 8th row of W per layer,
             train / held-out hit counts with the map (cosine and l2) and
             held-out hits without it.

Usage (repo root): /usr/bin/python3 tests/reference/token_identity_reference.py [SHARED_DIR]"""
import json
import os
import re
import sys
import unicodedata

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as rf  # noqa: E402

torch.set_num_threads(2)
torch.set_grad_enabled(False)

TOP_K = 5
EPS = 1e-5
RIDGE = 1e-3
N_TRAIN, N_HELDOUT = 200, 50
W_ROW_STEP = 8


# ------------------------------------------------------------ tokenizers

class WordPiece:
    """BERT uncased: lowercase, strip accents, split on whitespace and
    punctuation, greedy longest-match WordPiece with '##' continuations."""

    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = {w.rstrip("\n"): i for i, w in enumerate(f)}

    @staticmethod
    def is_punct(ch):
        o = ord(ch)
        if 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126:
            return True
        return unicodedata.category(ch).startswith("P")

    def words(self, text):
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")
        out = []
        for w in text.split():
            cur = ""
            for ch in w:
                if self.is_punct(ch):
                    if cur:
                        out.append(cur)
                    out.append(ch)
                    cur = ""
                else:
                    cur += ch
            if cur:
                out.append(cur)
        return out

    def encode(self, text):
        ids = [self.vocab["[CLS]"]]
        for w in self.words(text):
            start, pieces = 0, []
            while start < len(w):
                end = len(w)
                while end > start:
                    sub = ("##" if start else "") + w[start:end]
                    if sub in self.vocab:
                        pieces.append(self.vocab[sub])
                        break
                    end -= 1
                if end == start:
                    pieces = [self.vocab["[UNK]"]]
                    break
                start = end
            ids += pieces
        return ids + [self.vocab["[SEP]"]]


class ByteBPE:
    """GPT-2 byte-level BPE; the pre-tokenizer pattern with \\p{L} / \\p{N}
    narrowed to ASCII (only ASCII text is encoded here)."""
    PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
            self.vocab = json.load(f)
        with open(os.path.join(model_dir, "merges.txt"), encoding="utf-8") as f:
            merges = [tuple(l.split()) for l in f.read().split("\n")[1:] if l.strip()]
        self.ranks = {m: i for i, m in enumerate(merges)}
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b), cs.append(256 + n)
                n += 1
        self.byte_char = {b: chr(c) for b, c in zip(bs, cs)}

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            r, i = min(pairs)
            if r == 1 << 30:
                break
            a, b = parts[i], parts[i + 1]
            merged, k = [], 0
            while k < len(parts):
                if k + 1 < len(parts) and parts[k] == a and parts[k + 1] == b:
                    merged.append(a + b)
                    k += 2
                else:
                    merged.append(parts[k])
                    k += 1
            parts = merged
        return parts

    def encode(self, text):
        assert text.isascii()
        ids = []
        for tok in self.PAT.findall(text):
            ids += [self.vocab[p] for p in self.bpe("".join(self.byte_char[b] for b in tok.encode("utf-8")))]
        return ids


# ------------------------------------------------------------ ranking

def keys(q, cand, metric):
    """[T][n_cand] keys, larger = nearer."""
    if metric == "cosine":
        return torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(cand, dim=1).t()
    return -((q[:, None, :] - cand[None, :, :]) ** 2).sum(-1)


def keys_blocked(q, cand, metric, block=4096):
    return torch.cat([keys(q, cand[j:j + block], metric) for j in range(0, cand.shape[0], block)], dim=1)


def r7(x):
    """7 significant digits: what a float32 comparison can use, half the JSON."""
    return float(f"{float(x):.7g}")


def rank_all(q, cand, own, metric):
    s = keys_blocked(q, cand, metric) if cand.shape[0] > 4096 else keys(q, cand, metric)
    scale = (q * q).sum(1) + (cand * cand).sum(1).mean()
    out = {"ranks": [], "slack": [], "eps": [], "neighbors": [], "neighbor_keys": []}
    for i in range(q.shape[0]):
        row, o = s[i], own[i]
        ko = row[o]
        eps = EPS if metric == "cosine" else EPS * float(scale[i])
        out["ranks"].append(int(1 + (row > ko).sum()))
        near = (row - ko).abs() <= eps
        out["slack"].append(int(near.sum()) - 1)
        out["eps"].append(r7(eps))
        top = torch.topk(row, min(TOP_K + 8, row.shape[0])).indices.tolist()
        # exact order: key descending, own first on ties, then index
        top.sort(key=lambda j: (-float(row[j]), j != o, j))
        out["neighbors"].append(top[:TOP_K])
        out["neighbor_keys"].append([r7(row[j]) for j in top[:TOP_K + 1]])
    return out


def hidden_states(model, ids):
    out = rf.run_one(model, ids, [0] * len(ids))
    return [h for h in out["hidden_states"]]


def load64(shared, name):
    model, cfg = rf.load(os.path.join(shared, "models", name))
    model.w = {k: v.double() for k, v in model.w.items()}
    return model, cfg


# ------------------------------------------------------------ sections

def read_tsv_texts(path, n, skip=0):
    texts = []
    with open(path, encoding="utf-8") as f:
        next(f)
        for line in f:
            t = line.split("\t")[0].strip()
            if t:
                texts.append(t)
            if len(texts) >= skip + n:
                break
    return texts[skip:]


def bert_sentences(shared, tok):
    dev = read_tsv_texts(os.path.join(shared, "data/sst2/dev.tsv"), 872)
    picked = dev[:2]
    # SST-2 sentences stay under 64 word pieces: join the two longest
    longest = sorted(dev, key=lambda t: -len(tok.encode(t)))[:2]
    long = " ".join(longest)
    assert len(tok.encode(long)) > 64
    return picked + [long]


def gpt2_sentences(shared, tok):
    with open(os.path.join(shared, "data/wikitext2/test.txt"), encoding="utf-8") as f:
        lines = [l.strip() for l in f if l.strip() and not l.strip().startswith("=") and l.isascii()]
    short = [l for l in lines if 8 <= len(tok.encode(l)) <= 30][:2]
    long = next(l for l in lines if 64 < len(tok.encode(l)) <= 120)
    return short + [long]


def rankings(shared):
    out = {}
    for name in ("bert-tiny-sst2", "gpt2-tiny-wikitext"):
        model, cfg = load64(shared, name)
        mdir = os.path.join(shared, "models", name)
        if name.startswith("bert"):
            tok = WordPiece(os.path.join(mdir, "vocab.txt"))
            texts = bert_sentences(shared, tok)
        else:
            tok = ByteBPE(mdir)
            texts = gpt2_sentences(shared, tok)
        rows = []
        for text in texts:
            ids = tok.encode(text)
            hs = hidden_states(model, ids)
            T = len(ids)
            layers = []
            for l, h in enumerate(hs):
                layers.append({"layer": l, **{m: rank_all(h, hs[0], list(range(T)), m) for m in ("cosine", "l2")}})
            rows.append({"text": text, "input_ids": ids, "layers": layers})
            print(f"{name}: T={T} cosine rates "
                  + " ".join(f"{sum(r == 1 for r in y['cosine']['ranks']) / T:.3f}" for y in layers))
        out[name] = rows
    return out


def vocabulary(shared):
    name = "bert-tiny-mlm"
    model, cfg = load64(shared, name)
    tok = WordPiece(os.path.join(shared, "models", name, "vocab.txt"))
    emb = model.w[model.p + "embeddings.word_embeddings.weight"]
    texts = read_tsv_texts(os.path.join(shared, "data/sst2/dev.tsv"), 2, skip=2)
    rows = []
    for text in texts:
        ids = tok.encode(text)
        hs = hidden_states(model, ids)
        layers = [{"layer": l, **{m: rank_all(h, emb, ids, m) for m in ("cosine", "l2")}} for l, h in enumerate(hs)]
        rows.append({"text": text, "input_ids": ids, "layers": layers})
        print(f"{name} vocabulary: T={len(ids)} cosine ranks layer 0 {layers[0]['cosine']['ranks'][:8]}")
    return {name: rows}


def fit(shared):
    name = "bert-tiny-sst2"
    model, cfg = load64(shared, name)
    tok = WordPiece(os.path.join(shared, "models", name, "vocab.txt"))
    texts = read_tsv_texts(os.path.join(shared, "data/sst2/train_part_alps.tsv"), N_TRAIN + N_HELDOUT)
    ids = [tok.encode(t) for t in texts]
    hidden = [hidden_states(model, s) for s in ids]
    L1, C = len(hidden[0]), hidden[0][0].shape[1]
    train, held = hidden[:N_TRAIN], hidden[N_TRAIN:]
    layers = []
    for l in range(L1):
        X = torch.cat([h[l] for h in train])
        Y = torch.cat([h[0] for h in train])
        mx, my = X.mean(0), Y.mean(0)
        Xc, Yc = X - mx, Y - my
        A = Xc.t() @ Xc
        lam = RIDGE * torch.trace(A) / C
        W = torch.linalg.solve(A + lam * torch.eye(C, dtype=A.dtype), Xc.t() @ Yc)
        b = my - mx @ W
        entry = {"layer": l, "lambda": float(lam), "w_frobenius": float(W.norm()),
                 "w_rows": list(range(0, C, W_ROW_STEP)),
                 "w_sample": [[r7(v) for v in row] for row in W[::W_ROW_STEP].tolist()],
                 "b": [r7(v) for v in b.tolist()]}
        for metric in ("cosine", "l2"):
            def hits(seqs, mapped):
                n = 0
                for h in seqs:
                    q = h[l] @ W + b if mapped else h[l]
                    s = keys(q, h[0], metric)
                    own = s.diagonal()
                    n += int(((s > own[:, None]).sum(1) == 0).sum())
                return n
            entry[metric] = {"train_hits": hits(train, True), "heldout_hits": hits(held, True),
                             "identity_heldout_hits": hits(held, False)}
        layers.append(entry)
    n_train = sum(len(s) for s in ids[:N_TRAIN])
    n_held = sum(len(s) for s in ids[N_TRAIN:])
    print(f"fit {name}: {n_train} train tokens, {n_held} held-out; cosine train/held-out/identity hits "
          + "; ".join(f"l{e['layer']} {e['cosine']['train_hits']}/{e['cosine']['heldout_hits']}/"
                      f"{e['cosine']['identity_heldout_hits']}" for e in layers))
    return {"model": name, "ridge": RIDGE, "n_train": N_TRAIN, "n_heldout": N_HELDOUT,
            "train_tokens": n_train, "heldout_tokens": n_held, "input_ids": ids, "layers": layers}


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else "../shared"
    out = {"command": "python3 tests/reference/token_identity_reference.py ../shared", "top_k": TOP_K, "eps": EPS, "rankings": rankings(shared), "vocabulary": vocabulary(shared),
           "fit": fit(shared)}
    path = "tests/fixtures/token_identity_shared.json"
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
