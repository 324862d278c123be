#!/usr/bin/python3
"""demo_models_reference.py - outputs of the committed demo models (models/demo-*)
from an independent PyTorch forward pass, for tests/test_demo_models.c.

The forward passes are reference_forward.py's (HF BertModel /
BertForSequenceClassification / BertForMaskedLM / GPT2LMHeadModel written from
the Hugging Face definitions; its attention splits q/k into DK and v into DV
per head, so the identifiable encoder's shapes work as they are). The input
ids come from the tokenizers written here from their definitions, for ASCII
text only: BERT BasicTokenizer (lower-case, split on whitespace and
punctuation) + greedy longest-match-first WordPiece; GPT-2's regex
pre-tokenizer, bytes_to_unicode and merges applied by rank. The test checks
that lensd's tokenizer gives the same ids.

Written to tests/fixtures/demo_models.json, per model: config facts, and per
example the text, input_ids and
  classifiers: logits [K], predicted label
  demo-mlm:    logits_first_8 [T][8], at each [MASK] its full logits row [V]
               and top-5 ids
  demo-gpt2:   logits_first_8 [T][8], last_logits [V], mean next-token
               negative log-likelihood and its perplexity exp(nll)

Usage (repo root): /usr/bin/python3 tests/reference/demo_models_reference.py
A model folder that is missing is an error (they are committed).
  ... demo_models_reference.py --dev-accuracy ../shared/data/sst2/dev.tsv
prints the PyTorch dev accuracy of demo-sst2 and demo-identifiable (the
WordPiece above with lower-casing and accent stripping for non-ASCII text)."""
import json
import math
import os
import re
import sys
import unicodedata

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as ref  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SENTIMENT = [  # (text, the label a sentiment model must give)
    ("a gorgeous , witty , seductive movie .", "positive"),
    ("the worst film of the year : boring , stupid and painfully unfunny .", "negative"),
    ("an enchanting , moving and beautifully acted masterpiece .", "positive"),
    ("it 's a dull , lifeless and tedious mess .", "negative"),
]
MLM_TEXTS = ["this movie is [MASK] .", "one of the [MASK] films of the year ."]
GPT2_PASSAGE = (" The closest relative of H. gammarus is the American lobster , Homarus americanus . "
                "The two species are very similar , and can be crossed artificially , although hybrids "
                "are unlikely to occur in the wild where their ranges do not overlap . \n")


# ------------------------------------------------------------ WordPiece

def wordpiece(vocab_path, text, ascii_only=True):
    vocab = {}
    with open(vocab_path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab[line.rstrip("\n")] = i
    if ascii_only:
        assert text.isascii()
    else:  # lower-case, strip accents (NFD, drop Mn), as BertTokenizer with do_lower_case
        text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
    ids = [vocab["[CLS]"]]
    for chunk in re.split(r"(\[MASK\])", text):
        if chunk == "[MASK]":
            ids.append(vocab["[MASK]"])
            continue
        for word in re.findall(r"\w+|[^\s\w]", chunk.lower()):
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                    end -= 1
                if end == start:
                    pieces = [vocab["[UNK]"]]
                    break
                pieces.append(vocab[("##" if start else "") + word[start:end]])
                start = end
            ids += pieces
    ids.append(vocab["[SEP]"])
    return ids


# ------------------------------------------------------------ GPT-2 BPE

def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def gpt2_bpe(model_dir, text):
    with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(model_dir, "merges.txt"), encoding="utf-8") as f:
        rows = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#version")]
    rank = {tuple(r.split(" ")): i for i, r in enumerate(rows)}
    assert text.isascii()
    pat = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
    b2u = bytes_to_unicode()
    ids = []
    for word in pat.findall(text):
        sym = [b2u[b] for b in word.encode("utf-8")]
        while len(sym) > 1:
            pairs = [(rank.get((sym[i], sym[i + 1]), math.inf), i) for i in range(len(sym) - 1)]
            r, i = min(pairs)
            if r == math.inf:
                break
            sym = sym[:i] + [sym[i] + sym[i + 1]] + sym[i + 2:]
        ids += [vocab[s] for s in sym]
    return ids


# ------------------------------------------------------------ models

def config_facts(cfg):
    keys = ["architectures", "model_type", "vocab_size", "max_position_embeddings", "n_positions",
            "num_hidden_layers", "n_layer", "num_attention_heads", "n_head", "hidden_size", "n_embd",
            "head_dim_key", "head_dim_value", "head_combination", "id2label"]
    return {k: cfg[k] for k in keys if k in cfg}


def classifier(name):
    d = os.path.join(REPO, "models", name)
    model, cfg = ref.load(d)
    examples = []
    for text, want in SENTIMENT:
        ids = wordpiece(os.path.join(d, "vocab.txt"), text)
        out = ref.run_one(model, ids, [0] * len(ids))
        label = cfg["id2label"][str(int(torch.argmax(out["logits"])))]
        print(f"{name}: {text!r}: {label} (want {want}) logits {out['logits'].tolist()}")
        examples.append({"text": text, "want_label": want, "input_ids": ids, "logits": ref.F32(out["logits"]),
                         "predicted_label": label})
    return {"config": config_facts(cfg), "examples": examples}


def mlm():
    d = os.path.join(REPO, "models", "demo-mlm")
    model, cfg = ref.load(d)
    vocab = [l.rstrip("\n") for l in open(os.path.join(d, "vocab.txt"), encoding="utf-8")]
    examples = []
    for text in MLM_TEXTS:
        ids = wordpiece(os.path.join(d, "vocab.txt"), text)
        out = ref.run_one(model, ids, [0] * len(ids))
        logits = out["logits"]
        masks = [t for t, i in enumerate(ids) if vocab[i] == "[MASK]"]
        top5 = [torch.topk(logits[t], 5).indices.tolist() for t in masks]
        print(f"demo-mlm: {text!r}: top 5 at [MASK]: {[[vocab[i] for i in row] for row in top5]}")
        examples.append({"text": text, "input_ids": ids, "logits_first_8": ref.F32(logits[:, :8]),
                         "mask_positions": masks, "mask_logits": [ref.F32(logits[t]) for t in masks],
                         "mask_top5_ids": top5, "mask_top5_tokens": [[vocab[i] for i in row] for row in top5]})
    return {"config": config_facts(cfg), "examples": examples}


def gpt2():
    d = os.path.join(REPO, "models", "demo-gpt2")
    model, cfg = ref.load(d)
    ids = gpt2_bpe(d, GPT2_PASSAGE)
    out = ref.run_one(model, ids, [0] * len(ids))
    logits = out["logits"].double()
    nll = float(-torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None]).mean())
    print(f"demo-gpt2: passage of {len(ids)} tokens: next-token nll {nll:.4f}, perplexity {math.exp(nll):.2f}")
    return {"config": config_facts(cfg),
            "examples": [{"text": GPT2_PASSAGE, "input_ids": ids, "logits_first_8": ref.F32(out["logits"][:, :8]),
                          "last_logits": ref.F32(out["logits"][-1]), "nll": nll, "perplexity": math.exp(nll)}]}


def dev_accuracy(name, tsv):
    """Accuracy of a committed classifier on a TSV (text, label; header), one sentence at a time."""
    d = os.path.join(REPO, "models", name)
    model, cfg = ref.load(d)
    right = n = 0
    with open(tsv, encoding="utf-8") as f:
        for i, line in enumerate(f):
            text, label = line.rstrip("\n").rsplit("\t", 1)
            if i == 0 and label == "label":
                continue
            ids = wordpiece(os.path.join(d, "vocab.txt"), text, ascii_only=False)
            ids = ids[:cfg["max_position_embeddings"] - 1] + ids[-1:] if len(ids) > cfg["max_position_embeddings"] else ids
            out = ref.run_one(model, ids, [0] * len(ids))
            right += int(torch.argmax(out["logits"])) == int(label)
            n += 1
    print(f"{name}: accuracy {right / n:.4f} ({right} / {n}) on {tsv}")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--dev-accuracy":
        for name in ("demo-sst2", "demo-identifiable"):
            dev_accuracy(name, sys.argv[2])
        return
    fixture = {
        "command": "python3 tests/reference/demo_models_reference.py",
        "generated_by": "tests/reference/demo_models_reference.py (PyTorch %s, float32, eval)" % torch.__version__,
        "models": {"demo-sst2": classifier("demo-sst2"), "demo-identifiable": classifier("demo-identifiable"),
                   "demo-mlm": mlm(), "demo-gpt2": gpt2()},
    }
    path = os.path.join(REPO, "tests", "fixtures", "demo_models.json")
    with open(path, "w") as f:
        f.write(ref.to_json(fixture) + "\n")
    print(f"wrote {os.path.relpath(path, REPO)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
