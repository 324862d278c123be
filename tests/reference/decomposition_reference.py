#!/usr/bin/python3
"""decomposition_reference.py - the position / context / residual
decomposition (Song & Zhong 2023) computed directly from the full hidden-state
tensor with PyTorch, and the fixtures tests/test_decomposition.c compares
core/analysis/decomposition.c (which streams) against.

Nothing here streams or uses a Gram-matrix identity: for every layer the
whole tensor h [W][T][C] is kept (float64 from the float32 forward pass of
tests/reference/reference_forward.py), and
    mu = h.mean((0, 1)), pos = h.mean(0) - mu, ctx = h.mean(1) - mu,
    resid = h - mu - pos - ctx
over the kept positions (position 0 dropped unless drop_first is false).
Metrics, exactly as docs/decomposition.md defines them:
    share_x        sum |x|^2 / sum |h|^2 for x in (mu tiled, pos tiled, ctx tiled, resid)
    norm_x         matrix_norm(X, 2) / matrix_norm(H - mu, 2), X the tiled W*P x C matrix
    pos singular values (svdvals): stable rank sum s^2 / s_1^2; explained k2, k10 (sum s),
                   k2_sq, k10_sq (sum s^2); pca = U[:, :2] * S[:2], each column's largest
                   |entry| made positive
    smoothness     rows of pos normalised, G = P P^T, F = D G D^T (orthonormal DCT-II),
                   share of sum F^2 in the top-left ceil(P/10) square
    orthogonality  |cos(pos_t, ctx_c)| max and mean; principal angles (deg) between the
                   top-k right singular subspaces of pos and ctx, k = min(10, P-1, W-1, C)
    topics         mean |cos(ctx_a, ctx_b)| over pairs a < b with equal / different label

Windows: deterministic pseudo-random token ids (numpy RandomState(1234)); each
of 4 "topics" draws from its own pool of 300 ids, so context vectors have a
topic structure. Written to tests/fixtures/decomposition_<model>.json with both
drop_first true and false.

Usage (repo root):  /usr/bin/python3 tests/reference/decomposition_reference.py [SHARED_DIR]"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as rf  # noqa: E402

torch.set_num_threads(1)
torch.set_grad_enabled(False)

MODELS = ["gpt2-tiny-wikitext", "bert-tiny-mlm"]
W, T, TOPICS, POOL, TOP_K = 16, 32, 4, 300, 10


def make_windows(vocab_size, seed=1234):
    rng = np.random.RandomState(seed)
    lo = 1000  # clear of BERT's [PAD] / [unusedN] / [CLS] / [SEP] / [MASK] ids
    pool_ids = rng.choice(np.arange(lo, vocab_size), size=TOPICS * POOL, replace=False).reshape(TOPICS, POOL)
    labels = [w % TOPICS for w in range(W)]
    windows = [[int(x) for x in rng.choice(pool_ids[lab], size=T)] for lab in labels]
    return windows, labels


def top_right_vectors(x, k):
    return torch.linalg.svd(x, full_matrices=False)[2][:k]


def metrics(h, labels):
    """h: float64 [W][P][C] of one layer."""
    Wn, P, C = h.shape
    mu = h.mean((0, 1))
    pos = h.mean(0) - mu
    ctx = h.mean(1) - mu
    resid = h - mu - pos[None] - ctx[:, None]
    total = float((h ** 2).sum())
    tile = lambda x: x.reshape(-1, C)
    pos_t = pos[None].expand(Wn, P, C)
    ctx_t = ctx[:, None].expand(Wn, P, C)
    hc = tile(h - mu)
    op = lambda x: float(torch.linalg.matrix_norm(tile(x), ord=2))
    h_op = op(hc)
    s = torch.linalg.svdvals(pos)
    U, S, _ = torch.linalg.svd(pos, full_matrices=False)
    pca = U[:, :2] * S[:2]
    for j in range(2):
        if pca[int(pca[:, j].abs().argmax()), j] < 0:
            pca[:, j] = -pca[:, j]
    # context means on their top principal axes (ctx has zero mean over windows)
    Uc, Sc, _ = torch.linalg.svd(ctx, full_matrices=False)
    kc = min(3, Wn - 1, C)
    ctx_pca = Uc[:, :kc] * Sc[:kc]
    for j in range(kc):
        if ctx_pca[int(ctx_pca[:, j].abs().argmax()), j] < 0:
            ctx_pca[:, j] = -ctx_pca[:, j]
    pn = pos / pos.norm(dim=1, keepdim=True)
    G = pn @ pn.t()
    i = torch.arange(P, dtype=torch.float64)
    D = torch.cos(math.pi * i[:, None] * (2 * i[None, :] + 1) / (2 * P)) * math.sqrt(2.0 / P)
    D[0] = math.sqrt(1.0 / P)
    F = D @ G @ D.t()
    K = (P + 9) // 10
    cn = ctx / ctx.norm(dim=1, keepdim=True)
    cos_pc = (pn @ cn.t()).abs()
    k = min(TOP_K, P - 1, Wn - 1, C)
    ov = top_right_vectors(pos, k) @ top_right_vectors(ctx, k).t()
    angles = torch.rad2deg(torch.arccos(torch.linalg.svdvals(ov).clamp(max=1.0)))
    cc = (cn @ cn.t()).abs()
    lab = torch.tensor(labels)
    upper = torch.triu(torch.ones(Wn, Wn, dtype=torch.bool), 1)
    same = (lab[:, None] == lab[None, :]) & upper
    diff = (lab[:, None] != lab[None, :]) & upper
    return {
        "share_mean": Wn * P * float(mu @ mu) / total,
        "share_pos": float((pos_t ** 2).sum()) / total,
        "share_ctx": float((ctx_t ** 2).sum()) / total,
        "share_resid": float((resid ** 2).sum()) / total,
        "norm_pos": op(pos_t) / h_op,
        "norm_ctx": op(ctx_t) / h_op,
        "norm_resid": op(resid) / h_op,
        "pos_stable_rank": float((s ** 2).sum() / s[0] ** 2),
        "pos_explained_k2": float(s[:2].sum() / s.sum()),
        "pos_explained_k10": float(s[:10].sum() / s.sum()),
        "pos_explained_k2_sq": float((s[:2] ** 2).sum() / (s ** 2).sum()),
        "pos_explained_k10_sq": float((s[:10] ** 2).sum() / (s ** 2).sum()),
        "pos_pca": pca.tolist(),
        "ctx_pca": ctx_pca.tolist(),
        "ctx_pca_share": (Sc[:kc] ** 2 / (Sc ** 2).sum()).tolist(),
        "pos_smoothness": float((F[:K, :K] ** 2).sum() / (F ** 2).sum()),
        "max_abs_cos": float(cos_pc.max()),
        "mean_abs_cos": float(cos_pc.mean()),
        "principal_angles_deg": angles.tolist(),
        "topics_within": float(cc[same].mean()),
        "topics_between": float(cc[diff].mean()),
        "mean_norm": float(mu.norm()),
        "pos_norms": pos.norm(dim=1).tolist(),
        # identities of the direct decomposition, for the record
        "check_sum_of_shares": None,
    }


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(repo), "shared")
    for name in MODELS:
        model, cfg = rf.load(os.path.join(shared, "models", name))
        windows, labels = make_windows(cfg["vocab_size"])
        ids = torch.tensor(windows, dtype=torch.int64)
        out = model.forward(ids, torch.zeros_like(ids), torch.ones_like(ids))
        hidden = [x.double() for x in out["hidden_states"]]  # L+1 of [W][T][C]
        variants = []
        for drop_first in (True, False):
            first = 1 if drop_first else 0
            layers = []
            for l, h in enumerate(hidden):
                m = metrics(h[:, first:, :], labels)
                m["check_sum_of_shares"] = m["share_mean"] + m["share_pos"] + m["share_ctx"] + m["share_resid"]
                assert abs(m["check_sum_of_shares"] - 1) < 1e-9, m["check_sum_of_shares"]
                m["layer"] = l
                layers.append(m)
            variants.append({"drop_first_position": drop_first, "layers": layers})
        fixture = {
            "command": "python3 tests/reference/decomposition_reference.py ../shared",
            "model": name,
            "generated_by": "tests/reference/decomposition_reference.py (PyTorch %s, hidden states float32, "
                            "metrics float64, non-streaming)" % torch.__version__,
            "T": T, "top_k": TOP_K,
            "windows": windows, "labels": labels,
            "variants": variants,
        }
        path = os.path.join(repo, "tests", "fixtures", f"decomposition_{name}.json")
        with open(path, "w") as f:
            json.dump(fixture, f, separators=(",", ":"))
            f.write("\n")
        l_last = variants[0]["layers"][-1]
        print(f"{name}: wrote {os.path.relpath(path, repo)} ({os.path.getsize(path)} bytes); last layer: "
              f"shares mean {l_last['share_mean']:.3f} pos {l_last['share_pos']:.3f} ctx {l_last['share_ctx']:.3f} "
              f"resid {l_last['share_resid']:.3f}, norm_pos {l_last['norm_pos']:.3f}")


if __name__ == "__main__":
    main()
