"""PyTorch peer of the lensd patching benchmark (bench/patching.c).

The activation-patching grid as a user's loop of hooked runs does it
(TransformerLens's patching utilities, nnsight, pyvene): one cached run of
the clean input, one run of the corrupt input, then one hooked forward of
the corrupt input per patched activation, every run from the embeddings
with the whole model's logits:

  resid (l, t): block l's input row t = the clean run's     (hook_resid_pre)
  heads (l, h): head h's output before c_proj = the clean's (hook_z), every position

GPT-2 (HF GPT2LMHeadModel) written out in plain torch, float32, weights
mmapped from model.safetensors, torch.set_num_threads(n):

  x = wte[ids] + wpe[0..T)
  per layer:  a = x + (causal softmax(q k^T / sqrt(D)) v) W_proj + b      (q, k, v = LN_1(x) W_attn + b)
              x = a + gelu_tanh(LN_2(a) W_fc + b) W_proj2 + b
  logits = LN_f(x) wte^T

F = the probability of the clean run's prediction at the last position.
Token ids: xorshift32 from --seed, id = x mod V, the corrupt token at T/2
replaced by (id + 1) mod V, as bench/patching.c.

  patching_torch.py --model DIR --T 32 --threads 2 [--dump FILE]

prints one JSON line (ms, process CPU ms, peak RSS, F_clean, F_corrupt); --dump writes the
patched F, float64 resid [L][T] then heads [L][NH]."""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_forward import load_safetensors, xorshift32_ids  # noqa: E402


class GPT2:
    def __init__(self, d):
        self.cfg = json.load(open(os.path.join(d, "config.json")))
        self.w = load_safetensors(os.path.join(d, "model.safetensors"))
        self.L, self.NH, self.eps = self.cfg["n_layer"], self.cfg["n_head"], self.cfg.get("layer_norm_epsilon", 1e-5)

    def p(self, l, name):
        return self.w[f"transformer.h.{l}.{name}"]

    def ln(self, x, l, name):
        return F.layer_norm(x, (x.shape[-1],), self.p(l, name + ".weight"), self.p(l, name + ".bias"), self.eps)

    def forward(self, ids, resid=None, z=None, cache=None):
        """logits [T][V] of ids; resid (l, t, row) writes row over block l's input row t; z (l, h, ctx)
        writes the head's columns of ctx [T][C] over layer l's; cache: {"resid": [], "z": []} filled."""
        w, T = self.w, len(ids)
        x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]
        C = x.shape[1]
        D = C // self.NH
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for l in range(self.L):
            if resid is not None and resid[0] == l:
                x = x.clone()
                x[resid[1]] = resid[2][resid[1]]
            if cache is not None:
                cache["resid"].append(x)
            qkv = torch.addmm(self.p(l, "attn.c_attn.bias"), self.ln(x, l, "ln_1"), self.p(l, "attn.c_attn.weight"))
            q, k, v = (t.view(T, self.NH, D).transpose(0, 1) for t in qkv.split(C, dim=1))
            s = (q @ k.transpose(1, 2)) / D ** 0.5
            ctx = (torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v).transpose(0, 1).reshape(T, C)
            if z is not None and z[0] == l:
                cols = slice(z[1] * D, (z[1] + 1) * D)
                ctx[:, cols] = z[2][:, cols]
            if cache is not None:
                cache["z"].append(ctx)
            a = x + torch.addmm(self.p(l, "attn.c_proj.bias"), ctx, self.p(l, "attn.c_proj.weight"))
            f = F.gelu(torch.addmm(self.p(l, "mlp.c_fc.bias"), self.ln(a, l, "ln_2"), self.p(l, "mlp.c_fc.weight")),
                       approximate="tanh")
            x = a + torch.addmm(self.p(l, "mlp.c_proj.bias"), f, self.p(l, "mlp.c_proj.weight"))
        x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], self.eps)
        return x @ w["transformer.wte.weight"].t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--dump")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = GPT2(a.model)
    V, T = m.cfg["vocab_size"], a.T
    clean = torch.from_numpy(xorshift32_ids(a.seed, T, V))
    corrupt = clean.clone()
    corrupt[T // 2] = (clean[T // 2] + 1) % V
    with torch.inference_mode():
        t0, c0 = time.perf_counter(), time.process_time()
        cache = {"resid": [], "z": []}
        z_clean = m.forward(clean, cache=cache)
        target = int(z_clean[-1].argmax())
        objective = lambda logits: float(torch.softmax(logits[-1].double(), -1)[target])
        f_clean, f_corrupt = objective(z_clean), objective(m.forward(corrupt))
        resid = [[objective(m.forward(corrupt, resid=(l, t, cache["resid"][l]))) for t in range(T)] for l in range(m.L)]
        heads = [[objective(m.forward(corrupt, z=(l, h, cache["z"][l]))) for h in range(m.NH)] for l in range(m.L)]
        ms, cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    if a.dump:
        np.concatenate([np.array(resid, dtype=np.float64).ravel(), np.array(heads, dtype=np.float64).ravel()]).tofile(a.dump)
    print(json.dumps({"impl": "pytorch", "T": T, "layers": m.L, "heads": m.NH, "runs": m.L * (T + m.NH),
                      "threads": a.threads, "reps": 1, "ms_median": round(ms, 1), "cpu_ms_median": round(cpu, 1),
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "target": target,
                      "f_clean": f_clean, "f_corrupt": f_corrupt}), flush=True)


if __name__ == "__main__":
    main()
