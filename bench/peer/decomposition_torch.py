"""PyTorch peer of the decomposition benchmark (bench/decomposition.c).

The same computation on the same ids: W windows of T tokens (xorshift32 from
--seed, id = x mod V in window order), labels w % 4, position 0 dropped, all
L+1 hidden states of a BERT model (the plain-torch BertModel of
bench/peer/torch_forward.py on the same model.safetensors), batched
(--batch windows per forward), statistics streamed exactly like lensd so that
memory does not hold all hidden states:
    per layer: sum_c h [P][C], Gram sum h h^T [C][C] (float64), sum |h|^2,
               per-window means [W][C]
then the metrics of docs/decomposition.md with torch.linalg (eigvalsh for
operator norms, svd for pos / ctx spectra and subspaces).

  decomposition_torch.py --model DIR [--windows 256] [--T 128] [--threads 2] [--batch 8] [--seed 42]

prints one JSON line like bench/decomposition.c."""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_forward import load_model, xorshift32_ids  # noqa: E402

torch.set_grad_enabled(False)


def hidden_states(model, ids):
    """All L+1 hidden states [L+1][B][T][C] of torch_forward's Bert."""
    T = ids.shape[1]
    x = model.word(ids) + model.position(torch.arange(T)) + model.token_type.weight[0]
    x = model.ln(x)
    out = [x]
    for layer in model.layers:
        x = layer(x)
        out.append(x)
    return out


def metrics(acc, W, P, labels, top_k=10):
    C = acc["gram"].shape[0]
    N = W * P
    mu = acc["pos_sum"].sum(0) / N
    pos = acc["pos_sum"] / W - mu
    ctx = torch.cat(acc["ctx"]).double() - mu
    ss_total = acc["sumsq"]
    ss_pos, ss_ctx = W * float((pos ** 2).sum()), P * float((ctx ** 2).sum())
    hc = acc["gram"] - N * torch.outer(mu, mu)
    ctx_gram = ctx.t() @ ctx
    resid = hc - W * (pos.t() @ pos) - P * ctx_gram
    h_op = math.sqrt(float(torch.linalg.eigvalsh(hc)[-1]))
    U, s, Vh = torch.linalg.svd(pos, full_matrices=False)
    _, sc, Vc = torch.linalg.svd(ctx, full_matrices=False)
    pn, cn = F.normalize(pos, dim=1), F.normalize(ctx, dim=1)
    G = pn @ pn.t()
    i = torch.arange(P, dtype=torch.float64)
    D = torch.cos(math.pi * i[:, None] * (2 * i[None, :] + 1) / (2 * P)) * math.sqrt(2.0 / P)
    D[0] = math.sqrt(1.0 / P)
    Fq = D @ G @ D.t()
    K = (P + 9) // 10
    k = min(top_k, P - 1, W - 1, C)
    angles = torch.rad2deg(torch.arccos(torch.linalg.svdvals(Vh[:k] @ Vc[:k].t()).clamp(max=1)))
    cos_pc = (pn @ cn.t()).abs()
    cc = (cn @ cn.t()).abs()
    lab = torch.tensor(labels)
    upper = torch.triu(torch.ones(W, W, dtype=torch.bool), 1)
    same = (lab[:, None] == lab[None, :]) & upper
    return {
        "share_mean": N * float(mu @ mu) / ss_total, "share_pos": ss_pos / ss_total, "share_ctx": ss_ctx / ss_total,
        "share_resid": (ss_total - N * float(mu @ mu) - ss_pos - ss_ctx) / ss_total,
        "norm_pos": math.sqrt(W) * float(s[0]) / h_op, "norm_ctx": math.sqrt(P) * float(sc[0]) / h_op,
        "norm_resid": math.sqrt(max(float(torch.linalg.eigvalsh(resid)[-1]), 0)) / h_op,
        "pos_stable_rank": float((s ** 2).sum() / s[0] ** 2),
        "pos_explained_k2": float(s[:2].sum() / s.sum()), "pos_explained_k10": float(s[:10].sum() / s.sum()),
        "pos_pca": (U[:, :2] * s[:2]).tolist(),
        "pos_smoothness": float((Fq[:K, :K] ** 2).sum() / (Fq ** 2).sum()),
        "max_abs_cos": float(cos_pc.max()), "mean_abs_cos": float(cos_pc.mean()),
        "principal_angles_deg": angles.tolist(),
        "topics_within": float(cc[same].mean()), "topics_between": float(cc[~same & upper].mean()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t_load = time.perf_counter()
    model, cfg = load_model(a.model)
    t_load = time.perf_counter() - t_load
    W, T, P = a.windows, a.T, a.T - 1
    ids = torch.from_numpy(xorshift32_ids(a.seed, W * T, cfg["vocab_size"])).view(W, T)
    labels = [w % 4 for w in range(W)]
    L1, C = cfg["num_hidden_layers"] + 1, cfg["hidden_size"]
    t0 = time.perf_counter()
    accs = [{"pos_sum": torch.zeros(P, C, dtype=torch.float64), "gram": torch.zeros(C, C, dtype=torch.float64),
             "sumsq": 0.0, "ctx": []} for _ in range(L1)]
    for b0 in range(0, W, a.batch):
        for acc, h in zip(accs, hidden_states(model, ids[b0:b0 + a.batch])):
            h = h[:, 1:, :]  # [B][P][C], position 0 dropped
            flat = h.reshape(-1, C)
            acc["pos_sum"] += h.sum(0, dtype=torch.float64)
            acc["gram"] += (flat.t() @ flat).double()
            acc["sumsq"] += float((flat.double() ** 2).sum())
            acc["ctx"].append(h.mean(1))
    t_finish = time.perf_counter()
    results = [metrics(acc, W, P, labels) for acc in accs]
    t1 = time.perf_counter()
    last = results[-1]
    print(json.dumps({
        "impl": "pytorch", "torch": torch.__version__, "windows": W, "T": T, "threads": a.threads,
        "tokens": W * T, "seconds": round(t1 - t0, 2), "tokens_per_s": round(W * T / (t1 - t0), 1),
        "finish_seconds": round(t1 - t_finish, 2), "load_seconds": round(t_load, 2),
        "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "last_layer": {k: round(last[k], 6) for k in ("share_pos", "share_ctx", "norm_pos", "norm_ctx", "norm_resid",
                                                      "pos_stable_rank", "pos_smoothness", "mean_abs_cos",
                                                      "topics_within")}}))


if __name__ == "__main__":
    main()
