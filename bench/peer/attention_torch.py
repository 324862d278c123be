#!/usr/bin/python3
"""attention_torch.py - the PyTorch counterpart of bench/attention.c: effective
attention for all heads of a BERT-base-shape model (L=12, NH=12, DV=64) with
one batched torch.linalg.svd over the 144 heads.

  attention_torch.py [--T 128,512] [--threads 1] [--reps 3] [--dtype float32|float64]

A [144][T][T] row-stochastic (softmax of random scores), V [144][T][64] random;
the SVD cost does not depend on the values. Per T prints one JSON line with
the median ms of: U, S = svd(V); r = #(S > S_max eps_f32 max(T, DV)); A U_r U_r^T
(U masked to its first r columns), as core/analysis/attention.c computes it."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--T", default="128,512")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--reps", type=int, default=3)
p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.set_grad_enabled(False)
dtype = getattr(torch, a.dtype)
H, DV = 144, 64
eps = torch.finfo(torch.float32).eps


def effective(A, V):
    U, S, _ = torch.linalg.svd(V, full_matrices=False)            # [H][T][k], [H][k]
    tol = S[:, :1] * eps * max(V.shape[1], V.shape[2])
    U = U * (S > tol).to(U.dtype)[:, None, :]                      # zero the null directions
    return (A @ U) @ U.transpose(1, 2), (S > tol).sum(1)


for T in [int(t) for t in a.T.split(",")]:
    g = torch.Generator().manual_seed(42)
    A = torch.softmax(torch.randn(H, T, T, generator=g), -1).to(dtype)
    V = torch.randn(H, T, DV, generator=g).to(dtype)
    effective(A, V)  # warm-up
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        E, r = effective(A, V)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    print(json.dumps({"impl": "torch", "bench": "attention", "T": T, "heads": H, "threads": a.threads,
                      "dtype": a.dtype, "reps": a.reps, "effective_ms": round(times[len(times) // 2], 2),
                      "rank_min": int(r.min()), "rank_max": int(r.max()), "torch": torch.__version__}))
