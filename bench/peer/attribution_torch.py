"""PyTorch peer of the lensd attribution benchmark (bench/attribution.c).

A straightforward implementation of Hao et al.'s self-attention attribution
in the style of the released attattr code: for each layer l, one batched
forward of the m scaled copies through the whole BERT classifier (from the
embeddings) with layer l's attention probabilities replaced by a leaf tensor
X = alpha_k A_l [m, NH, T, T], then autograd for d F / d X:

    Attr_l = A_l * (1/m) sum_k dF/dX_k,   F = softmax(logits)[target]

float32, weights mmapped from model.safetensors, torch.set_num_threads(n).
The first plain forward (A_l of every layer and the predicted class) is timed
too. Token ids: xorshift32 from --seed, id = x mod V, as bench/attribution.c.

  attribution_torch.py --model DIR --T 64 --steps 20 --threads 2 [--reps 1]

prints one JSON line (ms_median, maxrss_kib, ...)."""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_forward import load_safetensors, xorshift32_ids  # noqa: E402


class Bert:
    def __init__(self, cfg, w):
        self.w = w
        self.p = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""
        self.L, self.nh, self.eps = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["layer_norm_eps"]

    def g(self, l, n):
        return self.w[f"{self.p}encoder.layer.{l}.{n}.weight"], self.w[f"{self.p}encoder.layer.{l}.{n}.bias"]

    def forward(self, ids, scale_layer=None, X=None):
        """ids [T]; with X [B, NH, T, T], layer scale_layer uses X as its probabilities
        for a batch of B copies. Returns class probabilities [B, K] and each layer's probs."""
        w, p = self.w, self.p
        T = ids.shape[0]
        B = 1 if X is None else X.shape[0]
        x = (w[p + "embeddings.word_embeddings.weight"][ids] + w[p + "embeddings.position_embeddings.weight"][:T]
             + w[p + "embeddings.token_type_embeddings.weight"][0])
        x = F.layer_norm(x, (x.shape[-1],), w[p + "embeddings.LayerNorm.weight"], w[p + "embeddings.LayerNorm.bias"],
                         self.eps)
        x = x[None].expand(B, T, -1)
        attns = []
        for l in range(self.L):
            split = lambda t: t.view(B, T, self.nh, -1).transpose(1, 2)
            v = split(F.linear(x, *self.g(l, "attention.self.value")))
            if l == scale_layer:
                probs = X
            else:
                q = split(F.linear(x, *self.g(l, "attention.self.query")))
                k = split(F.linear(x, *self.g(l, "attention.self.key")))
                probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
            attns.append(probs)
            ctx = (probs @ v).transpose(1, 2).reshape(B, T, -1)
            a = F.layer_norm(x + F.linear(ctx, *self.g(l, "attention.output.dense")), (x.shape[-1],),
                             *self.g(l, "attention.output.LayerNorm"), self.eps)
            f = F.linear(F.gelu(F.linear(a, *self.g(l, "intermediate.dense"))), *self.g(l, "output.dense"))
            x = F.layer_norm(a + f, (x.shape[-1],), *self.g(l, "output.LayerNorm"), self.eps)
        pooled = torch.tanh(F.linear(x[:, 0], w[p + "pooler.dense.weight"], w[p + "pooler.dense.bias"]))
        return torch.softmax(F.linear(pooled, w["classifier.weight"], w["classifier.bias"]), dim=-1), attns


def attribution_all_layers(model, ids, steps):
    with torch.no_grad():
        probs, attns = model.forward(ids)
    target = int(probs[0].argmax())
    alphas = torch.arange(1, steps + 1, dtype=torch.float32) / steps  # right Riemann sum
    out = []
    for l in range(model.L):
        A = attns[l][0]
        X = (alphas[:, None, None, None] * A[None]).requires_grad_(True)
        Fk = model.forward(ids, l, X)[0][:, target]
        (grad,) = torch.autograd.grad(Fk.sum(), X)
        out.append(A * grad.sum(0) / steps)
    return target, float(probs[0, target]), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="build/bench-models/bert-base-cls")
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    model = Bert(cfg, load_safetensors(os.path.join(a.model, "model.safetensors")))
    ids = torch.tensor(xorshift32_ids(a.seed, a.T, cfg["vocab_size"]), dtype=torch.int64)
    times = []
    for _ in range(a.reps):
        start = time.perf_counter()
        target, f_full, attrs = attribution_all_layers(model, ids, a.steps)
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"impl": "pytorch", "T": a.T, "steps": a.steps, "layers": model.L, "threads": a.threads,
                      "reps": a.reps, "ms_median": round(statistics.median(times), 1), "ms_min": round(min(times), 1),
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "target": target,
                      "f_full": round(f_full, 6), "attr_sum_layer1": float(attrs[0].sum()),
                      "torch": torch.__version__, "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
