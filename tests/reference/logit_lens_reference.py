#!/usr/bin/python3
"""logit_lens_reference.py - the logit lens of the committed demo LMs from an
independent PyTorch forward pass, for tests/test_http_predictions.c.

The forward pass is reference_forward.py's (HF BertForMaskedLM /
GPT2LMHeadModel written from the Hugging Face definitions, nothing of
lensd). Each layer's hidden state h_l (0 = embedding output .. L, HF's
output_hidden_states) is read out as nostalgebraist's logit lens does:
  GPT-2:    logits_l = ln_f(h_l) wte^T   (h_L is already after ln_f: read as is)
  BERT MLM: logits_l = LN(gelu(W_t h_l + b_t)) E^T + bias   (the MLM head)
and softmax'd in float64. Written to tests/fixtures/logit_lens_demo.json: per
model, the input_ids (given to the server as input_ids, so no tokenizer is
involved), the positions read, and per position and layer the top-5 ids and
probabilities. The last layer's readout is also checked against the model's
own logits here (1e-5), so the fixture cannot silently read the wrong head.

Usage (repo root): /usr/bin/python3 tests/reference/logit_lens_reference.py"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_forward import gelu_erf, layer_norm, linear, load, run_one  # noqa: E402

TOP = 5
CASES = [
    # demo-gpt2 ids of "The film was a" and a few more; every position read
    ("demo-gpt2", [51, 257, 699, 316, 263, 1200, 84, 1730], None),
    # demo-mlm: [CLS] a charming [MASK] , full of [MASK] . [SEP]; the [MASK] positions (id 4)
    ("demo-mlm", [2, 6, 1229, 4, 52, 900, 102, 4, 50, 3], [3, 7]),
]


def readout(model, cfg, h, layer):
    w, p, eps = model.w, model.p, model.eps
    if cfg["model_type"] == "gpt2":
        t = h if layer == model.L else layer_norm(h, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
        return t @ w[p + "wte.weight"].t()
    t = gelu_erf(linear(h, w["cls.predictions.transform.dense.weight"], w["cls.predictions.transform.dense.bias"]))
    t = layer_norm(t, w["cls.predictions.transform.LayerNorm.weight"], w["cls.predictions.transform.LayerNorm.bias"], eps)
    return t @ w[p + "embeddings.word_embeddings.weight"].t() + w["cls.predictions.bias"]


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = {"generated_by": "tests/reference/logit_lens_reference.py", "top": TOP, "models": []}
    for name, ids, positions in CASES:
        model, cfg = load(os.path.join(root, "models", name))
        res = run_one(model, ids, [0] * len(ids))
        positions = positions if positions is not None else list(range(len(ids)))
        last = readout(model, cfg, res["hidden_states"][-1], model.L)
        diff = float((last - res["logits"]).abs().max())
        if diff > 1e-5:
            raise SystemExit(f"{name}: last-layer readout differs from the logits by {diff}")
        layers = []
        for l, h in enumerate(res["hidden_states"]):
            probs = torch.softmax(readout(model, cfg, h, l).double(), dim=-1)
            rows = []
            for t in positions:
                p, i = torch.topk(probs[t], TOP)
                rows.append({"ids": [int(x) for x in i], "probs": [float(x) for x in p]})
            layers.append(rows)
        out["models"].append({"model": name, "input_ids": ids, "positions": positions, "layers": layers})
        print(f"{name}: {len(layers)} layers x {len(positions)} positions; last layer vs logits {diff:.2g}")
    with open(os.path.join(root, "tests", "fixtures", "logit_lens_demo.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
