#!/usr/bin/python3
"""ablation_reference.py - head and MLP ablation in float64, for
tests/test_ablation.c (docs/ablation.md): the objective with and without
the ablation, on a BERT-like classifier or GPT-2, from the model's own
blocks (families_reference.py) with its hooks replacing

 - head h of layer l: its context rows ctx_h = P_h v_h at every position by
   zero, or by their mean over the reference rows of the clean run;
 - the MLP of layer l: what it adds to the residual stream (after its
   output projection and bias) by zero, or by its mean over the reference rows.

Usage: /usr/bin/python3 tests/reference/ablation_reference.py REQUEST.json
REQUEST {"model": DIR, "ids": [...], "heads": [[layer (1..L), head]..],
"mlps": [layer..], "mode": "zero" | "mean", "reference": [[ids..]..] (mean:
the rows; absent = ids), "target": k, "kind": objective kind, "position": p
(causal LM), "foil": k | null}
-> stdout {"clean", "ablated", "logits_clean": [K], "logits_ablated": [K]}."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families_reference  # noqa: E402

torch.set_num_threads(2)


def logits_of(m, ids):
    hidden, _ = m.layers(m.embed(ids))
    return m.head(hidden[-1])


def objective(z, req):
    t, kind = req["target"], req.get("kind", "probability")
    if kind == "logit":
        return float(z[t])
    if kind == "logit_difference":
        return float(z[t] - z[req["foil"]])
    lp = torch.log_softmax(z, -1)[t]
    return float(lp if kind == "log_probability" else lp.exp())


def main():
    req = json.load(open(sys.argv[1]))
    m = families_reference.Model(req["model"])
    lm = m.arch == "GPT2LMHeadModel"
    row = lambda z: z[req.get("position", len(req["ids"]) - 1)] if lm else z
    L = m.L
    heads = {(l - 1, h) for l, h in req.get("heads", [])}
    mlps = {l - 1 for l in req.get("mlps", [])}
    fill_ctx, fill_mlp = [None] * L, [None] * L
    with torch.no_grad():
        clean = row(logits_of(m, req["ids"]))
        if req.get("mode") == "mean":  # the clean run's sums over the reference rows
            sums = {"ctx": [0] * L, "mlp": [0] * L}
            rows = 0

            def record(key):
                def hook(l, y):
                    sums[key][l] = sums[key][l] + y.sum(0)
                    return y
                return hook
            m.ctx_hook, m.mlp_hook = record("ctx"), record("mlp")
            for ids in req.get("reference") or [req["ids"]]:
                logits_of(m, ids)
                rows += len(ids)
            fill_ctx = [s / rows for s in sums["ctx"]]
            fill_mlp = [s / rows for s in sums["mlp"]]

        def ctx_hook(l, ctx):
            ctx = ctx.clone()
            D = ctx.shape[1] // m.NH
            for h in range(m.NH):
                if (l, h) in heads:
                    cols = slice(h * D, (h + 1) * D)
                    ctx[:, cols] = 0 if fill_ctx[l] is None else fill_ctx[l][cols]
            return ctx

        def mlp_hook(l, y):
            if l not in mlps:
                return y
            return torch.zeros_like(y) if fill_mlp[l] is None else fill_mlp[l].expand_as(y).clone()
        m.ctx_hook, m.mlp_hook = ctx_hook, mlp_hook
        ablated = row(logits_of(m, req["ids"]))
    json.dump({"clean": objective(clean, req), "ablated": objective(ablated, req),
               "logits_clean": clean.tolist(), "logits_ablated": ablated.tolist()}, sys.stdout)


if __name__ == "__main__":
    main()
