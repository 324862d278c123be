#!/usr/bin/python3
"""attribution_reference.py - self-attention attribution (Hao et al., AAAI
2021) with PyTorch autograd on the shared classifier bert-tiny-sst2, and the
fixture tests/test_attribution.c compares lensd against.

For target class c with probability F = softmax(logits)[c] and layer l:

    Attr_l = A_l * (1/m) sum_k dF/dX |_{X = alpha_k A_l}     [NH][T][T]

X replaces layer l's attention probabilities in all heads at once (the layers
above compute their attention normally); "right": alpha_k = k/m, k = 1..m;
"left": k = 0..m-1 (attattr's released code); "gauss": GAUSS_NODES-point
Gauss-Legendre on [0, 1] from numpy's leggauss (independent of lensd's
Newton iteration), Attr_l = A_l * sum_k w_k dF/dX(alpha_k A_l). The m scaled copies are one
batch [m][NH][T][T] leaf tensor; autograd gives dF/dX for all of them from
sum_k F_k. Everything runs in float64 (weights converted), so the fixture is
the exact Riemann sum up to ~1e-12; lensd computes in float32.

Also written: F(A), F(0 A) per layer, head importance max_ij Attr, and the
attribution tree (attattr's examples/attribution_tree.py rules, any depth,
threshold 0.4; implemented here from the rules in docs/attribution.md,
independently of core/analysis/attribution.c).

The model reader and ops come from reference_forward.py (same directory).
Inputs: the token ids of the three golden.json examples (no tokenizer needed).

Usage (repo root):  /usr/bin/python3 tests/reference/attribution_reference.py [SHARED_DIR]
Writes tests/fixtures/attribution_sst2.json."""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_forward import gelu_erf, layer_norm, linear, load  # noqa: E402

torch.set_grad_enabled(True)  # reference_forward turns autograd off at import
torch.set_num_threads(1)
STEPS = 20
GAUSS_NODES = 6  # LENS_ATTR_GAUSS_NODES, lensd's default for quadrature "gauss"
THRESHOLD = 0.4


class Classifier:
    """BertForSequenceClassification in float64 with layer l's attention
    probabilities replaceable by a batch X [B][NH][T][T]."""

    def __init__(self, model):
        self.w = {k: v.double() for k, v in model.w.items()}
        self.p, self.L, self.nh, self.eps = model.p, model.L, model.nh, model.eps

    def g(self, l, n):
        p = self.p
        return self.w[f"{p}encoder.layer.{l}.{n}.weight"], self.w[f"{p}encoder.layer.{l}.{n}.bias"]

    def embed(self, ids, type_ids):
        w, p = self.w, self.p
        T = len(ids)
        x = (w[p + "embeddings.word_embeddings.weight"][ids] + w[p + "embeddings.position_embeddings.weight"][:T]
             + w[p + "embeddings.token_type_embeddings.weight"][type_ids])
        return layer_norm(x, w[p + "embeddings.LayerNorm.weight"], w[p + "embeddings.LayerNorm.bias"], self.eps)[None]

    def layer(self, l, x, probs=None):
        """x [B][T][C]; probs replaces softmax(q k^T / sqrt(dk)) when given. Returns (x', probs used)."""
        B, T, C = x.shape
        split = lambda t: t.view(B, T, self.nh, -1).permute(0, 2, 1, 3)
        v = split(linear(x, *self.g(l, "attention.self.value")))
        if probs is None:
            q = split(linear(x, *self.g(l, "attention.self.query")))
            k = split(linear(x, *self.g(l, "attention.self.key")))
            probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(B, T, -1)
        a = layer_norm(x + linear(ctx, *self.g(l, "attention.output.dense")), *self.g(l, "attention.output.LayerNorm"), self.eps)
        f = linear(gelu_erf(linear(a, *self.g(l, "intermediate.dense"))), *self.g(l, "output.dense"))
        return layer_norm(a + f, *self.g(l, "output.LayerNorm"), self.eps), probs

    def head(self, x):
        w, p = self.w, self.p
        pooled = torch.tanh(linear(x[:, 0], w[p + "pooler.dense.weight"], w[p + "pooler.dense.bias"]))
        return torch.softmax(linear(pooled, w["classifier.weight"], w["classifier.bias"]), dim=-1)

    def run(self, ids, type_ids):
        """Plain forward: the input of every layer, every layer's probabilities, class probabilities."""
        x = self.embed(ids, type_ids)
        inputs, attns = [], []
        for l in range(self.L):
            inputs.append(x)
            x, probs = self.layer(l, x)
            attns.append(probs[0])
        return inputs, attns, self.head(x)[0]

    def from_layer(self, l, x_l, X):
        """F's class probabilities with layer l's probabilities X [B][NH][T][T]."""
        x = x_l.expand(X.shape[0], -1, -1)
        x, _ = self.layer(l, x, X)
        for j in range(l + 1, self.L):
            x, _ = self.layer(j, x)
        return self.head(x)


def schedule(steps, rule):
    """alphas and weights of the quadrature rule (right / left Riemann, gauss)"""
    if rule == "gauss":
        x, w = np.polynomial.legendre.leggauss(steps)
        return torch.tensor((1 + x) / 2), torch.tensor(w / 2)
    ks = range(1, steps + 1) if rule == "right" else range(0, steps)
    return torch.tensor([k / steps for k in ks], dtype=torch.float64), torch.full((steps,), 1 / steps, dtype=torch.float64)


def attribution(model, inputs, attns, l, target, steps, riemann):
    A = attns[l].detach()
    alphas, weights = schedule(steps, riemann)
    X = (alphas[:, None, None, None] * A[None]).requires_grad_(True)
    F = model.from_layer(l, inputs[l].detach(), X)[:, target]
    (grad,) = torch.autograd.grad(F.sum(), X)
    attr = A * (weights[:, None, None, None] * grad).sum(0)
    with torch.no_grad():
        f_zero = float(model.from_layer(l, inputs[l], torch.zeros_like(A)[None])[0, target])
    return attr, f_zero


def tree(attr_layers, threshold):
    """attattr's attribution_tree.py generalised to L layers (rules in docs/attribution.md).
    attr_layers: [L][NH][T][T]. Returns root, nodes [(token, layer)], edges [(layer, from, to, score)]."""
    att = np.array([a.sum(0) for a in attr_layers])  # [L][T][T], summed over heads
    L, T, _ = att.shape
    prop = att.copy()
    for l in range(L):
        scale = abs(prop[l][1:, :].max())
        prop[l] = prop[l] / scale if scale > 0 else 0 * prop[l]
    prop = prop * (prop > threshold)
    total = att.sum(0)
    total = total * (1 - np.identity(T)) * (total > 0)
    total[0] = 0
    order = np.argsort(total.sum(-1), kind="stable")[::-1]
    root = int(order[0] if order[0] != 0 else order[1])
    state = [-1] * T  # -1 absent, 0 in the tree without children below, 1 fixed
    state[root] = 0
    nodes, edges = [(root, L)], []
    if L >= 2:
        for j in range(T):
            if j != root and prop[L - 2][root][j] > threshold:
                state[j], state[root] = 0, 1
                edges.append((L - 1, root, j, float(prop[L - 2][root][j])))
                nodes.append((j, L - 1))
    for li in range(L - 3, -1, -1):
        for i in range(1, T):
            for j in range(T):
                if prop[li][i][j] < threshold or state[i] == -1:
                    continue
                if state[j] == 1 or (i, j) in [(e[1], e[2]) for e in edges]:
                    continue
                if state[i] == 0 and state[j] == 0:
                    continue
                if state[i] == 1 and state[j] == 0:
                    continue
                if state[i] == 0 and state[j] == -1:
                    state[i], state[j] = 1, 0
                if state[i] == 1 and state[j] == -1:
                    state[j] = 0
                edges.append((li + 1, i, j, float(prop[li][i][j])))
                nodes.append((j, li + 1))
    return {"root": root, "threshold": threshold, "nodes": [{"token": t, "layer": l} for t, l in nodes],
            "edges": [{"layer": l, "from": a, "to": b, "score": s} for l, a, b, s in edges]}


def rounded(a):  # 9 decimals: far below the 1e-3 relative tolerance, keeps the file small
    return np.round(np.asarray(a, dtype=np.float64), 9).tolist()


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(repo), "shared")
    model_dir = os.path.join(shared, "models", "bert-tiny-sst2")
    base, cfg = load(model_dir)
    model = Classifier(base)
    with open(os.path.join(model_dir, "golden.json")) as f:
        golden = json.load(f)
    examples = []
    for i, g in enumerate(golden["examples"]):
        ids = g["input_ids"]
        type_ids = g.get("token_type_ids") or [0] * len(ids)
        inputs, attns, probs = model.run(torch.tensor(ids), torch.tensor(type_ids))
        target = int(torch.argmax(probs))
        ex = {"name": f"golden{i}", "input_ids": ids, "token_type_ids": type_ids, "target": target,
              "f_full": float(probs[target]), "riemann": {}}
        for riemann in ("right", "left", "gauss"):
            layers = []
            attrs = []
            for l in range(model.L):
                steps = GAUSS_NODES if riemann == "gauss" else STEPS
                attr, f_zero = attribution(model, inputs, attns, l, target, steps, riemann)
                attrs.append(attr.numpy())
                layers.append({"layer": l + 1, "f_zero": f_zero, "attr_sum": float(attr.sum()),
                               "importance": rounded(attr.amax(dim=(1, 2))), "attribution": rounded(attr)})
            # the Riemann conventions under "riemann", the Gauss-Legendre rule as "gauss"
            got = {"layers": layers, "tree": tree(attrs, THRESHOLD)}
            (ex if riemann == "gauss" else ex["riemann"])[riemann] = got
            gap = sum(abs(x["attr_sum"] - (ex["f_full"] - x["f_zero"])) for x in layers)
            print(f"golden{i} {riemann}: target {target} F {ex['f_full']:.4f}, completeness gap (m={steps}) "
                  f"summed over layers {gap:.3g}, tree root {got['tree']['root']} edges {len(got['tree']['edges'])}")
        examples.append(ex)
    fixture = {"command": "python3 tests/reference/attribution_reference.py ../shared", "model": "bert-tiny-sst2", "steps": STEPS,
               "gauss_nodes": GAUSS_NODES, "threshold": THRESHOLD,
               "generated_by": "tests/reference/attribution_reference.py (PyTorch %s, float64 autograd)" % torch.__version__,
               "layout": "attribution [NH][T][T] per layer; row i = query token, column j = attended token",
               "examples": examples}
    path = os.path.join(repo, "tests", "fixtures", "attribution_sst2.json")
    with open(path, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, repo)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
