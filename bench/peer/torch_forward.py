"""PyTorch peer of the lensd forward benchmark (see bench/README.md).

HF BertModel written out in plain torch (the `transformers` package is not
installed), loading the same model.safetensors as lensd through a tiny
safetensors reader, and timing the same computation on the same token ids:

  x = LN(tok_emb[ids] + pos_emb[0..T) + type_emb[0])
  per layer:  a = LN(x + (softmax(q k^T / sqrt(DK)) v) W_O + b_O)
              x = LN(a + GELU_erf(a W_1 + b_1) W_2 + b_2)

Shapes: B sequences, T tokens, C channels, NH heads, DK = C / NH.

  torch_forward.py --model DIR --T 128 --batch 1 --threads 2 --reps R
                   [--warmup W] [--seed 42] [--dump FILE]

prints one JSON line like bench/forward.c. Token ids: xorshift32 from --seed,
id = x mod V, drawn in packed order (sequence 0 first), as in forward.c.
"""
import argparse
import json
import math
import mmap
import os
import resource
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}


def load_safetensors(path):
    """name -> torch tensor backed by a private (copy-on-write) mmap of path,
    so the weights are read once from the page cache and never copied."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, not supported here")
        begin, end = info["data_offsets"]
        arr = np.frombuffer(mm, dtype=dtype, count=(end - begin) // np.dtype(dtype).itemsize,
                            offset=base + begin).reshape(info["shape"])
        tensors[name] = torch.from_numpy(arr).float()
    return tensors


class SelfAttention(nn.Module):
    def __init__(self, C, NH, eps, device):
        super().__init__()
        self.NH, self.DK = NH, C // NH
        self.query = nn.Linear(C, C, device=device)
        self.key = nn.Linear(C, C, device=device)
        self.value = nn.Linear(C, C, device=device)
        self.dense = nn.Linear(C, C, device=device)
        self.ln = nn.LayerNorm(C, eps=eps, device=device)

    def heads(self, x):  # [B, T, C] -> [B, NH, T, DK]
        B, T, _ = x.shape
        return x.view(B, T, self.NH, self.DK).permute(0, 2, 1, 3)

    def forward(self, x):  # x [B, T, C]
        B, T, C = x.shape
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.DK)  # [B, NH, T, T]
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(B, T, C)
        return self.ln(x + self.dense(ctx))


class Layer(nn.Module):
    def __init__(self, C, NH, I, eps, device):
        super().__init__()
        self.attention = SelfAttention(C, NH, eps, device)
        self.intermediate = nn.Linear(C, I, device=device)
        self.output = nn.Linear(I, C, device=device)
        self.ln = nn.LayerNorm(C, eps=eps, device=device)

    def forward(self, x):
        a = self.attention(x)
        return self.ln(a + self.output(F.gelu(self.intermediate(a))))


class Bert(nn.Module):
    """HF BertModel without pooler, no padding (all-ones attention mask),
    segment ids all 0: returns last_hidden_state [B, T, C]."""

    def __init__(self, cfg, device=None):
        super().__init__()
        C, eps = cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12)
        self.word = nn.Embedding(cfg["vocab_size"], C, device=device)
        self.position = nn.Embedding(cfg["max_position_embeddings"], C, device=device)
        self.token_type = nn.Embedding(cfg.get("type_vocab_size", 2), C, device=device)
        self.ln = nn.LayerNorm(C, eps=eps, device=device)
        self.layers = nn.ModuleList(
            Layer(C, cfg["num_attention_heads"], cfg["intermediate_size"], eps, device)
            for _ in range(cfg["num_hidden_layers"]))

    def forward(self, ids):  # ids [B, T] int64
        T = ids.shape[1]
        pos = torch.arange(T, device=ids.device)
        x = self.word(ids) + self.position(pos) + self.token_type.weight[0]
        x = self.ln(x)
        for layer in self.layers:
            x = layer(x)
        return x


def hf_names(L):
    """Our parameter name -> HF BertModel tensor name (without "bert.")."""
    names = {
        "word.weight": "embeddings.word_embeddings.weight",
        "position.weight": "embeddings.position_embeddings.weight",
        "token_type.weight": "embeddings.token_type_embeddings.weight",
        "ln.weight": "embeddings.LayerNorm.weight",
        "ln.bias": "embeddings.LayerNorm.bias",
    }
    parts = {
        "attention.query": "attention.self.query", "attention.key": "attention.self.key",
        "attention.value": "attention.self.value", "attention.dense": "attention.output.dense",
        "attention.ln": "attention.output.LayerNorm", "intermediate": "intermediate.dense",
        "output": "output.dense", "ln": "output.LayerNorm",
    }
    for l in range(L):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                names[f"layers.{l}.{ours}.{p}"] = f"encoder.layer.{l}.{theirs}.{p}"
    return names


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act {cfg['hidden_act']}: only exact-erf gelu is implemented")
    tensors = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    prefix = "bert." if any(k.startswith("bert.") for k in tensors) else ""
    model = Bert(cfg, device="meta")  # no memory, no random init
    # Bind every parameter to a view of the mmap: nothing is copied.
    for ours, theirs in hf_names(cfg["num_hidden_layers"]).items():
        module_path, _, attr = ours.rpartition(".")
        module = model.get_submodule(module_path)
        t = tensors[prefix + theirs]
        if tuple(t.shape) != tuple(getattr(module, attr).shape):
            raise ValueError(f"{theirs}: shape {tuple(t.shape)}, expected {tuple(getattr(module, attr).shape)}")
        setattr(module, attr, nn.Parameter(t, requires_grad=False))
    model.eval()
    return model, cfg


def xorshift32_ids(seed, count, vocab):
    x = seed or 1
    ids = np.empty(count, dtype=np.int64)
    for i in range(count):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        ids[i] = x % vocab
    return ids


def gflop_per_forward(cfg, T, B):
    C, L, I = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    p_lin = L * (4 * C * C + 2 * C * I)
    return (2 * B * T * p_lin + 4 * T * T * C * L * B) * 1e-9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--dump")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model, cfg = load_model(a.model)
    load_ms = (time.perf_counter() - t0) * 1e3
    ids = torch.from_numpy(xorshift32_ids(a.seed, a.T * a.batch, cfg["vocab_size"])).view(a.batch, a.T)

    times = []
    with torch.inference_mode():
        for r in range(a.warmup + a.reps):
            start = time.perf_counter()
            hidden = model(ids)
            ms = (time.perf_counter() - start) * 1e3
            if r >= a.warmup:
                times.append(ms)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        if a.dump:
            hidden.reshape(-1).numpy().astype(np.float32).tofile(a.dump)
    med = statistics.median(times)
    gflop = gflop_per_forward(cfg, a.T, a.batch)
    print(json.dumps({
        "impl": "pytorch", "T": a.T, "batch": a.batch, "threads": a.threads, "reps": a.reps,
        "warmup": a.warmup, "ms_median": round(med, 3), "ms_min": round(min(times), 3),
        "ms_max": round(max(times), 3), "gflop": round(gflop, 4), "gflops": round(gflop / (med * 1e-3), 2),
        "load_ms": round(load_ms, 1), "maxrss_kib": rss, "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
