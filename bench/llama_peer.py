#!/usr/bin/python3
"""llama_peer.py - the PyTorch peer of make bench's "llama-1b forward" section
(issue 15): a Llama checkpoint's forward in float32, written in plain torch
(no transformers), following the math of tests/reference/decoders_reference.py
(float64, per position) as a batched float32 torch.inference_mode pass:

  x0 = E[ids];  per layer  h = RMSNorm(x) w_in;  q, k, v = h W^T  [T][NH|NKV][D]
                q, k = RoPE (rotate_half; llama3 / linear rope_scaling);  k, v repeat_kv
                a = softmax(q k^T / sqrt(D) + causal mask) v W_o^T;  x = x + a
                x = x + W_down (silu(W_gate h') * W_up h'),  h' = RMSNorm(x) w_post
  final = RMSNorm(x_L) w_norm;  logits = final[T-1] (lm_head | E)^T

An OLMoE checkpoint (make bench's "olmoe" section) runs the same body with
OlmoeAttention's q_norm / k_norm over the whole q and k projections and
OlmoeSparseMoeBlock for the MLP: p = softmax(h W_router^T), the top
num_experts_per_tok (renormalised when norm_topk_prob), and a loop over the
experts as HF's does, each expert's tokens gathered, run and index_added.

The checkpoint (config.json + model.safetensors or a sharded
model.safetensors.index.json) is read tensor by tensor; BF16/F16 tensors are
widened ONCE to float32 at load, as PyTorch users run a BF16 checkpoint in
float32 on a CPU. The timed region is the body and the final norm (what
bench/forward.c times for lensd: lens_forward without logits); the last
position's logits are computed once after the timing, for the correctness check.

  llama_peer.py --model DIR [--T 128] [--threads 2] [--reps 3] [--warmup 1] [--seed 42]

prints one JSON line: ms_median of --reps runs after --warmup, load_ms,
maxrss_kib (peak RSS, ru_maxrss), the ids' seed and logits_last [V]. Token ids
are bench/forward.c's: xorshift32 from --seed, id = x mod V.
"""
import argparse
import json
import os
import resource
import statistics
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer"))
from torch_forward import xorshift32_ids  # noqa: E402  (the ids bench/forward.c draws)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from decoders_reference import inv_freq  # noqa: E402  (RoPE frequencies [D/2], llama3 / linear rope_scaling)

WIDTH = {"F32": 4, "F16": 2, "BF16": 2}


def read_tensors(path, out):
    """Adds name -> float32 tensor for every tensor of the safetensors file at
    path; each tensor's bytes are read alone and widened, so the file dtype
    never sits in memory beside the float32 copy."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dt = info["dtype"]
            if dt not in WIDTH:
                raise ValueError(f"{path}: {name} has dtype {dt}")
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            raw = bytearray(end - begin)
            f.readinto(raw)
            if dt == "F32":
                t = torch.frombuffer(raw, dtype=torch.float32).clone()
            elif dt == "F16":
                t = torch.frombuffer(raw, dtype=torch.float16).float()
            else:
                t = torch.frombuffer(raw, dtype=torch.bfloat16).float()
            out[name] = t.view(info["shape"])
            del raw


def load_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        for shard in sorted(set(json.load(open(index))["weight_map"].values())):
            read_tensors(os.path.join(d, shard), tensors)
    else:
        read_tensors(os.path.join(d, "model.safetensors"), tensors)
    return tensors


class Llama:
    def __init__(self, d):
        c = json.load(open(os.path.join(d, "config.json")))
        if c.get("model_type") not in ("llama", "olmoe"):
            raise ValueError(f"{d}: model_type {c.get('model_type')}, expected llama or olmoe")
        self.moe = c["model_type"] == "olmoe"
        self.K, self.norm_topk = c.get("num_experts_per_tok", 0), c.get("norm_topk_prob", False)
        self.L, self.NH, self.C = c["num_hidden_layers"], c["num_attention_heads"], c["hidden_size"]
        self.NKV = c.get("num_key_value_heads", self.NH)
        self.D = c.get("head_dim") or self.C // self.NH
        self.eps = c["rms_norm_eps"]
        self.V = c["vocab_size"]
        self.freqs = inv_freq(self.D, c.get("rope_theta", 10000.0), c.get("rope_scaling"))
        t0 = time.perf_counter()
        w = load_checkpoint(d)
        self.load_ms = (time.perf_counter() - t0) * 1e3
        self.w = w
        self.E = w["model.embed_tokens.weight"]
        self.head = w.get("lm_head.weight", self.E) if not c.get("tie_word_embeddings", False) else self.E
        self.layers = []
        for l in range(self.L):
            p = lambda n: w[f"model.layers.{l}.{n}.weight"]  # noqa: E731
            layer = {
                "in": p("input_layernorm"), "post": p("post_attention_layernorm"),
                # q, k, v in one [NH*D + 2 NKV*D][C] matrix: one matmul instead of three
                "qkv": torch.cat([p("self_attn.q_proj"), p("self_attn.k_proj"), p("self_attn.v_proj")]),
                "o": p("self_attn.o_proj"),
            }
            if self.moe:
                layer.update({"q_norm": p("self_attn.q_norm"), "k_norm": p("self_attn.k_norm"),
                              "router": p("mlp.gate"), "experts": []})
                for e in range(c["num_experts"]):
                    x = f"mlp.experts.{e}."
                    layer["experts"].append((torch.cat([p(x + "gate_proj"), p(x + "up_proj")]), p(x + "down_proj")))
                    for n in ("gate_proj", "up_proj"):
                        del w[f"model.layers.{l}.{x}{n}.weight"]
            else:
                layer.update({"gate_up": torch.cat([p("mlp.gate_proj"), p("mlp.up_proj")]), "down": p("mlp.down_proj")})
                for n in ("gate_proj", "up_proj"):
                    del w[f"model.layers.{l}.mlp.{n}.weight"]
            self.layers.append(layer)
            for n in ("q_proj", "k_proj", "v_proj"):
                del w[f"model.layers.{l}.self_attn.{n}.weight"]
        self.norm = w["model.norm.weight"]

    def rms(self, x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * g

    def sparse_moe(self, h, p):
        """OlmoeSparseMoeBlock: softmax router, top-k, experts looped as HF does"""
        probs = torch.softmax(h @ p["router"].t(), -1)
        weights, chosen = torch.topk(probs, self.K, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e, (gate_up, down) in enumerate(p["experts"]):
            rows, slot = torch.where(chosen == e)
            if rows.numel() == 0:
                continue
            gu = h[rows] @ gate_up.t()
            I = gu.shape[1] // 2
            y = (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ down.t()
            out.index_add_(0, rows, y * weights[rows, slot, None])
        return out

    def forward(self, ids):
        """ids [T] int64 -> final-normed hidden states [T][C]."""
        T, NH, NKV, D = ids.shape[0], self.NH, self.NKV, self.D
        ang = torch.arange(T, dtype=torch.float64)[:, None] * self.freqs[None, :]  # [T][D/2]
        cos = torch.cat([ang, ang], -1).cos().float()[None]  # [1][T][D]
        sin = torch.cat([ang, ang], -1).sin().float()[None]
        mask = torch.full((T, T), float("-inf")).triu(1)  # causal
        half = D // 2

        def rope(x):  # [H][T][D]
            return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

        x = self.E[ids]  # [T][C]
        for p in self.layers:
            h = self.rms(x, p["in"])
            qkv = h @ p["qkv"].t()  # [T][(NH + 2 NKV) D]
            q, k = qkv[:, :NH * D], qkv[:, NH * D:(NH + NKV) * D]
            if self.moe:  # OlmoeAttention: RMSNorms over the whole q and k projections
                q, k = self.rms(q, p["q_norm"]), self.rms(k, p["k_norm"])
            q = q.reshape(T, NH, D).transpose(0, 1)
            k = k.reshape(T, NKV, D).transpose(0, 1)
            v = qkv[:, (NH + NKV) * D:].view(T, NKV, D).transpose(0, 1)
            q, k = rope(q), rope(k)
            rep = NH // NKV  # repeat_kv
            k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            s = torch.baddbmm(mask.expand(NH, T, T), q, k.transpose(1, 2), alpha=D ** -0.5)
            a = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(T, NH * D)
            x = x + a @ p["o"].t()
            h = self.rms(x, p["post"])
            if self.moe:
                x = x + self.sparse_moe(h, p)
                continue
            gu = h @ p["gate_up"].t()
            I = gu.shape[1] // 2
            x = x + (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ p["down"].t()
        return self.rms(x, self.norm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with torch.inference_mode():
        m = Llama(a.model)
        ids = torch.from_numpy(xorshift32_ids(a.seed, a.T, m.V))
        times = []
        for r in range(a.warmup + a.reps):
            t0 = time.perf_counter()
            final = m.forward(ids)
            if r >= a.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        logits = final[-1] @ m.head.t()  # [V], outside the timing (lensd's timed forward has no head)
    print(json.dumps({
        "impl": "pytorch", "model": a.model, "T": a.T, "threads": a.threads, "reps": a.reps, "warmup": a.warmup,
        "seed": a.seed, "ms_median": round(statistics.median(times), 3), "ms_min": round(min(times), 3),
        "load_ms": round(m.load_ms, 1), "maxrss_kib": rss, "torch": torch.__version__,
        "logits_last": [float(v) for v in logits],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
