#!/usr/bin/env python3
"""rank-windows.py - fraction of attention heads whose value matrix V has full
row rank (rank(V) = T, attention identifiable, Brunner et al. 2020) on inputs
of exactly T tokens, measured with `lensd attention`.

Inputs of exactly T tokens from real text: the texts of TEXTS (TSV, first
column, header skipped; or plain lines) are tokenized one by one with the
model's own tokenizer (`lensd tokenize`), [CLS]/[SEP] dropped, and the pieces
concatenated in file order; window k is [CLS] + pieces[k(T-2) : (k+1)(T-2)]
+ [SEP], given to `lensd attention --input-ids`. N windows per length.

Usage: scripts/rank-windows.py LENSD TEXTS "32 64 128" N MODEL_DIR..
Prints one JSON object per model: {"model", "lengths": {T: {"full", "heads"}}};
a length over the model's max_position_embeddings is left out."""
import json
import os
import subprocess
import sys


def texts_of(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.rstrip("\n")
            if "\t" in line:
                if i == 0 and line.split("\t")[-1] == "label":
                    continue
                line = line.split("\t")[0]
            if line.strip():
                out.append(line)
    return out


def tokenize(lensd, model, text):
    """Tokens of text; a text over the model's length is tokenized in two
    halves split at a space (WordPiece splits at white space first, so the
    pieces are the same)."""
    p = subprocess.run([lensd, "tokenize", "--model", model, text], capture_output=True, text=True)
    if p.returncode == 0:
        return json.loads(p.stdout)["tokens"]
    mid = text.find(" ", len(text) // 2)
    if "too_many_tokens" not in p.stdout + p.stderr or mid < 0:
        raise SystemExit(f"{model}: lensd tokenize failed: {p.stdout} {p.stderr}")
    return tokenize(lensd, model, text[:mid]) + tokenize(lensd, model, text[mid + 1:])


def pieces_of(lensd, model, texts):
    ids, cls, sep = [], None, None
    for t in texts:
        toks = tokenize(lensd, model, t)
        cls = cls if cls is not None else toks[0]["id"]
        sep = sep if sep is not None else toks[-1]["id"]
        ids += [tk["id"] for tk in toks if not tk["special"]]
    return ids, cls, sep


def main():
    lensd, texts_path, lengths, n = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split()], int(sys.argv[4])
    texts = texts_of(texts_path)
    # rank(V) only: --no-identifiability skips the key-aware dimension, whose
    # explicit SVDs cost O(T^2 (T DK)^2) (minutes per head at T 128, DK 8)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    cache = {}
    for model in sys.argv[5:]:
        cfg = json.load(open(f"{model}/config.json"))
        vocab = open(f"{model}/vocab.txt", encoding="utf-8").read()
        if vocab not in cache:
            cache[vocab] = pieces_of(lensd, model, texts)
        ids, cls, sep = cache[vocab]
        result = {"model": model, "lengths": {}}
        for T in lengths:
            if T > cfg["max_position_embeddings"]:
                continue
            full = heads = 0
            for k in range(n):
                window = ids[k * (T - 2):(k + 1) * (T - 2)]
                if len(window) < T - 2:
                    break
                seq = [cls] + window + [sep]
                p = subprocess.run([lensd, "attention", "--model", model, "--input-ids", ",".join(map(str, seq)),
                                    "--no-raw", "--no-effective", "--no-identifiability"],
                               capture_output=True, text=True, env=env)
                if p.returncode:
                    raise SystemExit(f"{model}: lensd attention failed: {p.stderr.strip()}")
                r = json.loads(p.stdout)
                assert len(r["tokens"]) == T
                for layer in r["layers"]:
                    for h in layer["heads"]:
                        heads += 1
                        full += h["rank"] == T
            result["lengths"][T] = {"full": full, "heads": heads}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
