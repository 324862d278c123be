"""PyTorch peer of the hidden-token-attribution benchmark (bench/hidden_attribution.c).

Computes the same thing as lens_hidden_attribution (exact) and
tests/reference/hidden_attribution_reference.py, with the model code of
tests/reference/reference_forward.py (imported, not copied): h^0 = the BERT
embedding output, f(h^0) = (h^1, ..., h^L) run from h^0 by the reference's
blocks_from, the full Jacobian of every layer w.r.t. h^0, then

    norm2[l][j][i] = sum_{c,c'} J_l[j,c,i,c']^2,   contrib = sqrt(norm2) / row sum.

Timed variants (float32, torch.set_num_threads(n), each median of --reps
after one warm-up (jacobian: one run, no warm-up); all layers' Jacobians in
one call, norms included):
    jacobian      torch.autograd.functional.jacobian(f, h0)                  reverse mode, one backward per output
                  element (T*C*L of them; the reference script's call)
    jacobian_vec  ... jacobian(f, h0, vectorize=True)                         reverse mode, vmapped cotangents
    jacrev        functorch.jacrev(f)(h0)                                     reverse mode, vmapped
    jacfwd        functorch.jacfwd(f)(h0)                                     forward mode, vmapped tangents
                  (= jacobian(..., vectorize=True, strategy="forward-mode"))
Each mode reports the contributions' max |diff| to --lensd (a float32 [L][T][T]
dump of bench/hidden_attribution.c); with --float64 also to an untimed float64
jacfwd (the rounding floor; about a minute more at bert-tiny T=32).

Estimate mode (--method estimate): P Rademacher probes per input token
i, ||J_{ji} v||^2 averaged, as lensd; T*P JVPs through the model by
functorch.vmap(functorch.jvp) in chunks of --chunk tangents.

  hta_torch.py --model DIR --T 32 --threads 1 [--reps 3] [--modes jacobian,jacobian_vec,jacrev,jacfwd] [--lensd FILE]
  hta_torch.py --model DIR --method estimate --T 64 --probes 16 --threads 1

Token ids: xorshift32 from --seed, id = x mod V, as the C driver. Prints one
JSON line per mode."""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch

REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference")
sys.path.insert(0, REF)
import reference_forward as rf  # noqa: E402
import hidden_attribution_reference as har  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_forward import xorshift32_ids  # noqa: E402

torch.set_grad_enabled(True)  # reference_forward turns autograd off at import

try:  # torch >= 2.0
    from torch.func import jacfwd, jacrev, jvp, vmap
except ImportError:  # torch 1.13 (Debian 12)
    from functorch import jacfwd, jacrev, jvp, vmap


def contributions(norm2):
    s = norm2.clamp_min(0).sqrt()
    return s / s.sum(dim=-1, keepdim=True)


def exact(model, h0, mode):
    """norm2 [L][T][T] of every layer by one Jacobian call for all layers."""
    f = lambda h: tuple(har.blocks_from(model, h)[1:])
    if mode == "jacobian":
        Js = torch.autograd.functional.jacobian(f, h0)
    elif mode == "jacobian_vec":
        Js = torch.autograd.functional.jacobian(f, h0, vectorize=True)
    elif mode == "jacobian_fwd":
        Js = torch.autograd.functional.jacobian(f, h0, vectorize=True, strategy="forward-mode")
    elif mode == "jacrev":
        Js = jacrev(f)(h0)
    elif mode == "jacfwd":
        Js = jacfwd(f)(h0)
    else:
        raise SystemExit(f"unknown mode {mode}")
    return torch.stack([(J.detach() ** 2).sum(dim=(1, 3)) for J in Js])  # J [T][C][T][C]


def estimate(model, h0, probes, chunk, seed):
    """norm2 [L][T][T] as the probe mean of ||J_{ji} v||^2, v in {+-1}^C on input token i."""
    T, C = h0.shape
    f = lambda h: torch.stack(har.blocks_from(model, h)[1:])  # [L][T][C]
    g = torch.Generator().manual_seed(seed)
    total = T * probes
    sums = None
    push = vmap(lambda v: jvp(f, (h0,), (v,))[1])
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        token = torch.arange(start, start + n) // probes
        v = torch.zeros(n, T, C, dtype=h0.dtype)
        v[torch.arange(n), token] = torch.randint(0, 2, (n, C), generator=g).to(h0.dtype) * 2 - 1
        with torch.no_grad():
            y = push(v)  # [n][L][T][C]
        sq = (y ** 2).sum(-1)  # [n][L][T]: ||J_{j,token} v||^2
        part = torch.zeros(y.shape[1], T, T, dtype=torch.float64)
        part.index_add_(2, token, sq.permute(1, 2, 0).double())  # [L][j][i]
        sums = part if sums is None else sums + part
    return (sums / probes).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--method", default="exact", choices=["exact", "estimate"])
    ap.add_argument("--modes", default="jacobian_vec,jacrev,jacfwd,jacobian")
    ap.add_argument("--probes", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--lensd", help="lensd contributions, float32 [L][T][T]")
    ap.add_argument("--float64", action="store_true", help="also compare with an untimed float64 jacfwd")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, cfg = rf.load(a.model)
    V = cfg["vocab_size"]
    ids = xorshift32_ids(a.seed, a.T, V)
    with torch.no_grad():
        h0 = rf.run_one(model, ids, [0] * a.T)["hidden_states"][0].contiguous()
    L = model.L
    lensd = None
    if a.lensd and os.path.exists(a.lensd):
        lensd = torch.from_numpy(np.fromfile(a.lensd, dtype=np.float32).reshape(L, a.T, a.T))
    common = {"T": a.T, "C": h0.shape[1], "L": L, "threads": a.threads, "model": a.model}

    if a.method == "estimate":
        t0 = time.perf_counter()
        norm2 = estimate(model, h0, a.probes, a.chunk, a.seed)
        ms = (time.perf_counter() - t0) * 1e3
        c = contributions(norm2)
        print(json.dumps({"impl": "pytorch", "method": "estimate", "mode": "vmap_jvp", **common, "probes": a.probes,
                          "tangents": a.T * a.probes, "reps": 1, "ms_median": round(ms, 1), "ms_min": round(ms, 1),
                          "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                          "last_layer_self_mean": float(c[-1].diagonal().mean())}), flush=True)
        return

    c64 = None
    if a.float64:  # rounding floor: float64 forward mode (untimed), weights cast up; ~1 min at bert-tiny T=32
        w32 = model.w
        model.w = {k: v.double() for k, v in w32.items()}
        c64 = contributions(exact(model, h0.double(), "jacfwd")).float()
        model.w = w32
    for mode in a.modes.split(","):
        # one warm-up run (vmap's batching rules, allocator) except for the plain jacobian,
        # a Python loop of backward passes whose first run costs what the others do
        warm = 0 if mode == "jacobian" else 1
        reps = 1 if mode == "jacobian" else a.reps
        times = []
        for r in range(warm + reps):
            t0 = time.perf_counter()
            norm2 = exact(model, h0, mode)
            c = contributions(norm2)
            if r >= warm:
                times.append((time.perf_counter() - t0) * 1e3)
        row = {"impl": "pytorch", "method": "exact", "mode": mode, **common, "tangents": a.T * h0.shape[1],
               "reps": reps, "ms_median": round(statistics.median(times), 1), "ms_min": round(min(times), 1),
               "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               "last_layer_self_mean": float(c[-1].diagonal().mean())}
        if c64 is not None:
            row["max_diff_float64"] = float((c - c64).abs().max())
        if lensd is not None:
            row["max_diff_lensd"] = float((c - lensd).abs().max())
            if c64 is not None:
                row["max_diff_lensd_float64"] = float((c64 - lensd).abs().max())
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
