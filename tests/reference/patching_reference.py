#!/usr/bin/python3
"""patching_reference.py - activation patching of the residual stream in
float64, for tests/test_patching.c (docs/patching.md): the objective of the
corrupt sequence with row t of the clean run's residual stream at the input
of block l written over its own, for every (l, t), from the model's own
blocks (families_reference.py, BERT-like classifiers and GPT-2).

Usage: /usr/bin/python3 tests/reference/patching_reference.py REQUEST.json
REQUEST {"model": DIR, "ids": clean ids, "corrupt": [...] (as long), "target":
k, "kind": objective kind, "position": p (causal LM), "foil": k | null}
-> stdout {"clean", "corrupt", "value": [L][T]}."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ablation_reference  # noqa: E402  (objective)
import families_reference  # noqa: E402

torch.set_num_threads(2)


def main():
    req = json.load(open(sys.argv[1]))
    m = families_reference.Model(req["model"])
    lm = m.arch == "GPT2LMHeadModel"
    clean, corrupt = req["ids"], req["corrupt"]
    T = len(clean)
    F = lambda logits: ablation_reference.objective(logits[req.get("position", T - 1)] if lm else logits, req)
    with torch.no_grad():
        hidden, _ = m.layers(m.embed(clean))
        res = {"clean": F(m.head(hidden[-1])), "corrupt": F(m.head(m.layers(m.embed(corrupt))[0][-1]))}
        res["value"] = [[F(m.head(m.layers(m.embed(corrupt), patch=(l, t, hidden[l][t]))[0][-1])) for t in range(T)]
                        for l in range(m.L)]
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
