#!/usr/bin/python3
"""paper_code_reference.py - the released code's definitions of the
decomposition metrics (Song & Zhong 2023, JiajunSong629/uncover-hidden-geometry),
re-implemented independently in PyTorch float64 (torch.linalg; this
machine's python3 has torch but no numpy) for tests/test_paper_code.c.

What is re-implemented (read from the released code, not copied):
  src/utils/metrics.py  ranks_and_explained_ratios_and_relative_norm:
      rank     = ScreeNOT(pos, k = 20, strategy "i")            (screenNOT)
      stable   = sum s^2 / s_1^2                                 (stable_rank, k = 0)
      explained= sum_{i < rank} s_i / sum s_i                    (explained_ratio)
      relnorm  = |tile(pos)|_2 / |m - m.mean(0)|_2, m = tile(pos) + cvec + global_mean
                 (cvec = h - pos - global_mean, so m = h: the denominator is centred)
  src/utils/metrics.py  avg_similarity_within / _between (top-20 PCA of the
      context means, svd of the uncentred matrix) and their _NoPCA variants:
      mean |cos| over the mask kron(eye(B / 64), ones(64, 64)) == 1 (within,
      self-pairs included) or == 0 (between), blocks of equal size here.
  src/generate_decompositions_topics.py: pos and the global mean come from a
      separate (reference) run; cbasis = mean_t h[c, 1:] - global_mean.
  ScreeNOT: eladromanov/ScreeNOT adaptiveHardThresholding (pseudo-noise by
      imputation, threshold = root of Psi_gamma = -4 by bracketing and
      bisection to 1e-5), written here from the paper's formulas.

Windows: 4 topics x 8 windows (32 > 20, so the top-20 PCA is a real projection) (contiguous blocks, as the released mask
assumes) of T = 64 ids drawn from per-topic pools (torch.Generator seed 2023), and 24
reference windows from all pools. Position 0 dropped, P = 63.
Variants: "reference" (pos, mean from the reference windows) and "own" (from
the windows themselves). Plus ScreeNOT on 6 synthetic spiked matrices.

Usage (repo root):  /usr/bin/python3 tests/reference/paper_code_reference.py [SHARED_DIR]
writes tests/fixtures/paper_code_<model>.json and tests/fixtures/screenot.json."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as rf  # noqa: E402

torch.set_num_threads(1)
torch.set_grad_enabled(False)

MODELS = ["gpt2-tiny-wikitext", "bert-tiny-mlm"]
TOPICS, PER_TOPIC, T, POOL, N_REF = 4, 8, 64, 300, 24
SCREENOT_K = 20


# ---------------------------------------------------------------- ScreeNOT
def pseudo_noise(sv, k):
    z = torch.sort(sv.double()).values.clone()
    p = z.numel()
    assert 2 * k + 1 < p
    top, low = z[p - k - 1], z[p - 2 * k - 1]
    for l in range(1, k + 1):
        z[p - l] = top + (1 - ((l - 1) / k) ** (2 / 3)) / (2 ** (2 / 3) - 1) * (top - low)
    return z


def psi(y, z, gamma):
    phi = float(torch.mean(y / (y * y - z * z)))
    phid = float(torch.mean(-(y * y + z * z) / (y * y - z * z) ** 2))
    d = phi * (gamma * phi + (1 - gamma) / y)
    dd = phid * (gamma * phi + (1 - gamma) / y) + phi * (gamma * phid - (1 - gamma) / y ** 2)
    return y * dd / d


def screenot(sv, shape, k):
    z = pseudo_noise(sv, k)
    gamma = min(shape[0] / shape[1], shape[1] / shape[0])
    lo = float(z.max())
    hi = lo + 2.0
    while psi(hi, z, gamma) < -4:
        lo, hi = hi, 2 * hi
    mid = hi
    while hi - lo > 1e-5:
        mid = (hi + lo) / 2
        if psi(mid, z, gamma) < -4:
            lo = mid
        else:
            hi = mid
    return int((sv > mid).sum()), float(mid)


# ---------------------------------------------------------------- released metrics
def table1(pos, h, global_mean, k):
    """pos [P][C] (reference), h [W][P][C] the windows' hidden states."""
    W, P, C = h.shape
    s = torch.linalg.svdvals(pos)
    rank, thr = screenot(s, pos.shape, k)
    p_full = torch.cat([pos] * W)
    cvec = h.reshape(-1, C) - p_full - global_mean
    m = p_full + cvec + global_mean
    m_centered = m - m.mean(0)
    return {"screenot_rank": rank, "screenot_threshold": thr,
            "stable_rank": float((s ** 2).sum() / s[0] ** 2),
            "explained_screenot": float(s[:rank].sum() / s.sum()),
            "relative_norm_pos": float(torch.linalg.matrix_norm(p_full, 2) / torch.linalg.matrix_norm(m_centered, 2))}


def similarity(cbasis, block, pca):
    B = cbasis.shape[0]
    mask = torch.kron(torch.eye(B // block, dtype=torch.float64), torch.ones(block, block, dtype=torch.float64))
    c = cbasis
    if pca:
        u, s, _ = torch.linalg.svd(c, full_matrices=False)
        c = u[:, :pca] @ torch.diag(s[:pca])
    c = c / torch.sqrt(torch.sum(c ** 2, dim=1, keepdim=True))
    cc = torch.abs(c @ c.T)
    return (float(torch.where(mask == 1, cc, torch.zeros_like(cc)).sum() / (mask == 1).sum()),
            float(torch.where(mask == 0, cc, torch.zeros_like(cc)).sum() / (mask == 0).sum()))


def windows_for(vocab_size):
    g = torch.Generator().manual_seed(2023)
    pools = (1000 + torch.randperm(vocab_size - 1000, generator=g)[:TOPICS * POOL]).reshape(TOPICS, POOL)
    labels = [t for t in range(TOPICS) for _ in range(PER_TOPIC)]
    pick = lambda pool: [int(pool[i]) for i in torch.randint(pool.numel(), (T,), generator=g)]
    windows = [pick(pools[lab]) for lab in labels]
    ref = [pick(pools.reshape(-1)) for _ in range(N_REF)]
    return windows, labels, ref


def hidden_states(model, windows):
    ids = torch.tensor(windows, dtype=torch.int64)
    out = model.forward(ids, torch.zeros_like(ids), torch.ones_like(ids))
    return [x.double()[:, 1:, :] for x in out["hidden_states"]]  # position 0 dropped


def synthetic_screenot():
    cases = []
    g = torch.Generator().manual_seed(11)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    for rows, cols, rank, k in [(63, 128, 3, 20), (63, 128, 8, 20), (100, 60, 5, 10), (200, 200, 4, 20),
                                (50, 400, 2, 5), (80, 90, 0, 10)]:
        # rank spikes of strength 4 + 2r (unit vectors) over noise of operator norm ~ 1 + sqrt(gamma)
        X = torch.zeros(rows, cols, dtype=torch.float64)
        for r in range(rank):
            u, v = randn(rows), randn(cols)
            X += (4.0 + 2 * r) * torch.outer(u / u.norm(), v / v.norm())
        Y = X + randn(rows, cols) / max(rows, cols) ** 0.5
        sv = torch.linalg.svdvals(Y)
        r, thr = screenot(sv, Y.shape, k)
        cases.append({"rows": rows, "cols": cols, "k": k, "planted_rank": rank, "sv": sv.tolist(),
                      "rank": r, "threshold": thr})
    return cases


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(repo), "shared")
    fx = os.path.join(repo, "tests", "fixtures")
    cases = synthetic_screenot()
    with open(os.path.join(fx, "screenot.json"), "w") as f:
        json.dump({"generated_by": "tests/reference/paper_code_reference.py (PyTorch %s, float64)" % torch.__version__,
                   "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print("screenot.json: ranks", [(c["planted_rank"], c["rank"]) for c in cases])
    for name in MODELS:
        model, cfg = rf.load(os.path.join(shared, "models", name))
        windows, labels, ref = windows_for(cfg["vocab_size"])
        hid, hid_ref = hidden_states(model, windows), hidden_states(model, ref)
        variants = []
        for variant in ("reference", "own"):
            layers = []
            for l in range(len(hid)):
                h, src = hid[l], (hid_ref[l] if variant == "reference" else hid[l])
                mean_by_b = src.mean(0)                 # [P][C] position means
                g = mean_by_b.mean(0, keepdims=True)    # global mean [1][C]
                pos = mean_by_b - g
                cbasis = h.mean(1) - g                  # [W][C]
                row = {"layer": l}
                row.update(table1(pos, h, g, SCREENOT_K))
                row["within_nopca"], row["between_nopca"] = similarity(cbasis, PER_TOPIC, 0)
                row["within_pca20"], row["between_pca20"] = similarity(cbasis, PER_TOPIC, 20)
                layers.append(row)
            variants.append({"variant": variant, "layers": layers})
        out = {"model": name,
               "generated_by": "tests/reference/paper_code_reference.py (PyTorch %s float64 on the float32 forward "
                               "of reference_forward.py)" % torch.__version__,
               "T": T, "screenot_k": SCREENOT_K, "windows": windows, "labels": labels, "reference_windows": ref,
               "variants": variants}
        path = os.path.join(fx, f"paper_code_{name}.json")
        with open(path, "w") as f:
            json.dump(out, f, separators=(",", ":"))
            f.write("\n")
        last = variants[0]["layers"][-1]
        print(f"{name}: {os.path.relpath(path, repo)}; last layer rank {last['screenot_rank']} "
              f"explained {last['explained_screenot']:.4f} relnorm {last['relative_norm_pos']:.4f} "
              f"within {last['within_nopca']:.4f} between {last['between_nopca']:.4f}")


if __name__ == "__main__":
    main()
