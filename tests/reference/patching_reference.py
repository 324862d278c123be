#!/usr/bin/python3
"""patching_reference.py - activation patching in float64, for
tests/test_patching.c (docs/patching.md): the objective of the corrupt
sequence with one activation of the clean run written over its own, from the
model's own blocks and hooks (families_reference.py, BERT-like classifiers
and GPT-2):

 - value [L][T]: row t of the residual stream at the input of block l;
 - heads [L][NH] / heads_pos [L][NH][T]: head h's context rows ctx_h = P_h v_h
   (before the output projection) of layer l, at every position / at t;
 - mlps [L] / mlps_pos [L][T]: what layer l's MLP adds to the residual stream,
   at every position / at t.

Usage: /usr/bin/python3 tests/reference/patching_reference.py REQUEST.json
REQUEST {"model": DIR, "ids": clean ids, "corrupt": [...] (as long), "target":
k, "kind": objective kind, "position": p (causal LM), "foil": k | null}
-> stdout {"clean", "corrupt", "value", "heads", "heads_pos", "mlps", "mlps_pos",
"attribution": {the same grids by attribution patching: (a_clean − a_corrupt) ·
∂F/∂a at the corrupt run by autograd, not normalised}}."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ablation_reference  # noqa: E402  (objective)
import families_reference  # noqa: E402

torch.set_num_threads(2)


def objective_tensor(z, req):
    """ablation_reference.objective as a differentiable tensor"""
    t, kind = req["target"], req.get("kind", "probability")
    if kind == "logit":
        return z[t]
    if kind == "logit_difference":
        return z[t] - z[req["foil"]]
    lp = torch.log_softmax(z, -1)[t]
    return lp if kind == "log_probability" else lp.exp()


def main():
    req = json.load(open(sys.argv[1]))
    m = families_reference.Model(req["model"])
    lm = m.arch == "GPT2LMHeadModel"
    clean, corrupt = req["ids"], req["corrupt"]
    T, L, NH = len(clean), m.L, m.NH
    F = lambda logits: ablation_reference.objective(logits[req.get("position", T - 1)] if lm else logits, req)
    F.lm, F.position = lm, req.get("position", T - 1)
    F.objective = lambda z: objective_tensor(z, req)
    run = lambda ids, patch=None: F(m.head(m.layers(m.embed(ids), patch=patch)[0][-1]))
    with torch.no_grad():
        rec = {"ctx": [None] * L, "mlp": [None] * L}  # the clean run's activations

        def record(key):
            def hook(l, y):
                rec[key][l] = y.clone()
                return y
            return hook
        m.ctx_hook, m.mlp_hook = record("ctx"), record("mlp")
        hidden, _ = m.layers(m.embed(clean))
        res = {"clean": F(m.head(hidden[-1]))}
        m.ctx_hook = m.mlp_hook = None
        res["corrupt"] = run(corrupt)
        res["value"] = [[run(corrupt, (l, t, hidden[l][t])) for t in range(T)] for l in range(L)]

        def patched(layer, head, rows):
            """the corrupt run with the clean head (head >= 0) or MLP (head < 0) of layer at rows"""
            def hook(key, h):
                def f(l, y):
                    if l != layer:
                        return y
                    y = y.clone()
                    D = y.shape[1] // NH if key == "ctx" else y.shape[1]
                    cols = slice(h * D, (h + 1) * D) if key == "ctx" else slice(0, D)
                    y[rows, cols] = rec[key][l][rows, cols]
                    return y
                return f
            if head >= 0:
                m.ctx_hook, m.mlp_hook = hook("ctx", head), None
            else:
                m.ctx_hook, m.mlp_hook = None, hook("mlp", 0)
            v = run(corrupt)
            m.ctx_hook = m.mlp_hook = None
            return v
        every = list(range(T))
        res["heads"] = [[patched(l, h, every) for h in range(NH)] for l in range(L)]
        res["heads_pos"] = [[[patched(l, h, [t]) for t in range(T)] for h in range(NH)] for l in range(L)]
        res["mlps"] = [patched(l, -1, every) for l in range(L)]
        res["mlps_pos"] = [[patched(l, -1, [t]) for t in range(T)] for l in range(L)]
    res["attribution"] = attribution(m, clean, corrupt, F, rec)
    json.dump(res, sys.stdout)


def attribution(m, clean, corrupt, F, rec):
    """attribution patching by autograd at the corrupt run: (a_clean − a_corrupt) · ∂F/∂a, summed over the
    patched rows (and the head's channels), for every grid: {"value", "heads", ..., "mlps_pos"} as above"""
    L, NH, T = m.L, m.NH, len(clean)
    with torch.no_grad():
        hidden_clean, _ = m.layers(m.embed(clean))
    act = {"ctx": [None] * L, "mlp": [None] * L}

    def keep(key):
        def hook(l, y):
            y.retain_grad()
            act[key][l] = y
            return y
        return hook
    m.ctx_hook, m.mlp_hook = keep("ctx"), keep("mlp")
    h0 = m.embed(corrupt).clone().requires_grad_(True)
    x, inputs = h0, []
    for l in range(L):  # as Model.layers, keeping each block's input
        x.retain_grad()
        inputs.append(x)
        x, _ = m.block(l, x)
    hL = x
    if m.type == "gpt2":
        hL = families_reference.ln(x, m.p("transformer.ln_f.weight"), m.p("transformer.ln_f.bias"), m.eps)
    m.ctx_hook = m.mlp_hook = None
    f = m.head(hL)
    obj = f[F.position] if F.lm else f
    value = F.objective(obj)
    value.backward()
    dot = lambda d, g: (d * g).sum(-1)  # [T]
    resid = [dot(hidden_clean[l] - inputs[l].detach(), inputs[l].grad).tolist() for l in range(L)]
    heads_pos, mlps_pos = [], []
    for l in range(L):
        d, g = rec["ctx"][l] - act["ctx"][l].detach(), act["ctx"][l].grad
        D = d.shape[1] // NH
        heads_pos.append([dot(d[:, h * D:(h + 1) * D], g[:, h * D:(h + 1) * D]).tolist() for h in range(NH)])
        mlps_pos.append(dot(rec["mlp"][l] - act["mlp"][l].detach(), act["mlp"][l].grad).tolist())
    return {"value": resid, "heads": [[sum(r) for r in hp] for hp in heads_pos], "heads_pos": heads_pos,
            "mlps": [sum(r) for r in mlps_pos], "mlps_pos": mlps_pos}


if __name__ == "__main__":
    main()
