#!/usr/bin/python3
"""attention_reference.py - effective attention and identifiability numbers in
PyTorch (float64), independent of core/analysis/attention.c, and the fixtures
tests/test_attention.c compares lensd against.

From the papers' definitions, by the most direct route (one SVD per causal
prefix, the key Jacobian built on all T*DK unknowns of dK):
  effective   BERT: A U_r U_r^T, U_r = left singular vectors of V (T x DV) with
              singular value > tol = s_max * eps_f32 * max(T, DV).
              GPT-2: row i = projection of A[i, :i+1] onto col(V[:i+1]), the rank
              of each prefix counted with the same absolute tol (from the full V).
  rank, null_dim = T - rank, rank([V, 1]) (tol with max(T, DV+1)).
  key-aware   J: dK (T x DK) -> dA, dA_i = (diag(a_i) - a_i a_i^T) dK q_i / sqrt(DK)
              (rows j <= i only for GPT-2), M(dA) = dA V;
              dim = rank(J) - rank(M J), tol = s_max * eps_f32 * max(rows, T*DK);
              computed when T*DK <= 1024 (as lensd); also the closed form
              sum_i |supp a_i| - rank([V_supp, 1]), valid when rank(Q) = T.
  stats       Pearson over all entries (GPT-2: entries j <= i), mass on special
              tokens (BERT [CLS]/[SEP]/[PAD], GPT-2 the first token) and on
              punctuation pieces (vocabulary piece without '##'/'Ġ' made only
              of Unicode P* characters): mean over rows of the sum over the set.
Q, A and V come from reference_forward.py's model (checked there against
golden.json), with Q recomputed from the layer input.

Also writes tests/fixtures/attention_synthetic.json: random small heads
(DV, DK < T) with A, V, Q and every number above, where the key-aware
dimension is not 0.

Writes tests/fixtures/attention_<model>.json: per example input_ids, T, and
per (layer, head) rank, null_dim, rank_v1, key_aware (or null), stats and the
row sums of the effective matrix; full effective matrices for two heads
(layer 1 head 0, layer 2 head 1).

Writes tests/fixtures/attention_causal_rows.json: causal heads whose prefix
V[:DV] is near-singular (sigma_min below tol while every Gram-Schmidt distance
is above it): a constructed one, and gpt2-tiny-wikitext on a 100-token
sequence (> DV = 64) where row DV - 1 of layer 2 head 0 moved by 1.4e-3 before
the rank of each prefix was certified. A, V (float32) and the per-row SVD
effective matrix, so the C test runs on the same inputs.

Writes tests/fixtures/attention_key_aware.json: rank(J), rank(M J) of two heads
of models/demo-identifiable at 125 tokens (1000 unknowns) from the explicit
matrices, with their A, V, Q (see key_aware_demo_cases).

Usage (repo root):  /usr/bin/python3 tests/reference/attention_reference.py [SHARED_DIR]"""
import json
import math
import os
import sys
import unicodedata

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as rf  # noqa: E402

torch.set_num_threads(1)
torch.set_grad_enabled(False)

EPS_F32 = float(np.finfo(np.float32).eps)
KEY_AWARE_MAX_UNKNOWNS = 1024
COMMAND = "python3 tests/reference/attention_reference.py ../shared"  # recorded in each fixture (make fixtures)
MODELS = ["bert-tiny-sst2", "gpt2-tiny-wikitext"]
FULL_HEADS = [(1, 0), (2, 1)]  # (layer 1-based, head) whose effective matrices are stored


def svd_rank(M, extra_n=0):
    """rank of M (float64) with tol = s_max * eps_f32 * max(rows, cols, extra_n)."""
    if M.numel() == 0:
        return 0
    s = torch.linalg.svdvals(M)
    tol = float(s[0]) * EPS_F32 * max(M.shape[0], M.shape[1], extra_n)
    return int((s > tol).sum())


def effective_full(A, V):
    T, DV = V.shape
    U, s, _ = torch.linalg.svd(V, full_matrices=False)
    tol = float(s[0]) * EPS_F32 * max(T, DV)
    r = int((s > tol).sum())
    Ur = U[:, :r]
    return A @ Ur @ Ur.T, r, tol


def effective_causal(A, V):
    T, DV = V.shape
    s = torch.linalg.svdvals(V)
    tol = float(s[0]) * EPS_F32 * max(T, DV)
    r = int((s > tol).sum())
    E = torch.zeros_like(A)
    for i in range(T):
        U, si, _ = torch.linalg.svd(V[:i + 1], full_matrices=False)
        ri = int((si > tol).sum())
        Ur = U[:, :ri]
        E[i, :i + 1] = Ur @ (Ur.T @ A[i, :i + 1])
    return E, r, tol


def key_aware(A, V, Q, causal):
    T, DK = Q.shape
    DV = V.shape[1]
    out = {"unknowns": T * DK, "rank_q": svd_rank(Q)}
    # closed form (valid when rank(Q) = T)
    closed = 0
    for i in range(T):
        supp = [j for j in range(T) if A[i, j] > 0]
        Vs = torch.cat([V[supp], torch.ones(len(supp), 1, dtype=V.dtype)], 1)
        closed += len(supp) - svd_rank(Vs)
    out["closed_form"] = closed
    if T * DK > KEY_AWARE_MAX_UNKNOWNS:
        out["explicit"] = None
        return out
    n = T * DK
    # M(dA) = dA U_r, U_r the orthonormal basis of col(V) at V's own rank (the
    # kernel effective attention removes; with V itself M J's wider tolerance
    # would count directions M does not annihilate)
    U, s, _ = torch.linalg.svd(V, full_matrices=False)
    r = int((s > float(s[0]) * EPS_F32 * max(T, DV)).sum()) if s.numel() else 0
    Ur = U[:, :r] if r else torch.zeros(T, 1, dtype=V.dtype)
    rows_j, rows_mj = [], []
    for i in range(T):
        a = A[i]
        S = torch.diag(a) - torch.outer(a, a)  # [T][T]
        q = Q[i] / math.sqrt(DK)
        # dA_i[j] = sum_m S[j][m] sum_k dK[m][k] q[k]  ->  row (i,j) = kron(S[j], q)
        Ji = torch.kron(S, q[None, :])  # [T][T*DK]
        keys = i + 1 if causal else T
        rows_j.append(Ji[:keys])
        rows_mj.append(Ur.T @ Ji)  # [r][T*DK]
    J = torch.cat(rows_j)
    MJ = torch.cat(rows_mj)
    rj, rmj = svd_rank(J, n), svd_rank(MJ, n)
    out.update({"explicit": rj - rmj, "rank_j": rj, "rank_mj": rmj})
    return out


def pearson(x, y, causal):
    T = x.shape[0]
    keep = torch.tril(torch.ones(T, T, dtype=torch.bool)) if causal else torch.ones(T, T, dtype=torch.bool)
    a, b = x[keep], y[keep]
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum()) / den if den > 0 else None


def mass(M, mask):
    return float(M[:, mask].sum(1).mean())


def is_punct(piece):
    return len(piece) > 0 and all(unicodedata.category(ch).startswith("P") for ch in piece)


def token_masks(model_dir, is_bert, ids):
    if is_bert:
        with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
            vocab = [l.rstrip("\n") for l in f]
        pieces = [vocab[i] for i in ids]
        # BertTokenizer's special tokens (lensd: lens_tokenizer_is_special)
        special = [p in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]") for p in pieces]
        punct = [is_punct(p[2:] if p.startswith("##") else p) for p in pieces]
    else:
        with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
            inv = {v: k for k, v in json.load(f).items()}
        pieces = [inv[i] for i in ids]
        special = [t == 0 for t in range(len(ids))]
        punct = [is_punct(p[1:] if p.startswith("\u0120") else p) for p in pieces]
    return torch.tensor(special), torch.tensor(punct)


def queries(model, is_bert, hidden, l):
    """Q [T][NH*DK] of 1-based layer l from the layer input hidden[l-1]."""
    w, p = model.w, model.p
    x = hidden[l - 1]
    if is_bert:
        return rf.linear(x, w[f"{p}encoder.layer.{l - 1}.attention.self.query.weight"],
                         w[f"{p}encoder.layer.{l - 1}.attention.self.query.bias"])
    g = lambda n: (w[f"{p}h.{l - 1}.{n}.weight"], w[f"{p}h.{l - 1}.{n}.bias"])
    qkv = rf.conv1d(rf.layer_norm(x, *g("ln_1"), model.eps), *g("attn.c_attn"))
    return qkv[..., :qkv.shape[-1] // 3]


def analyze(model, is_bert, model_dir, name, ids):
    T = len(ids)
    out = rf.run_one(model, ids, [0] * T)
    nh = model.nh
    special, punct = token_masks(model_dir, is_bert, ids)
    heads, full = [], {}
    worst_identity = 0.0
    for l in range(1, model.L + 1):
        Qall = queries(model, is_bert, out["hidden_states"], l).double()
        V_all = out["values"][l - 1].double()
        DV = V_all.shape[1] // nh
        DK = Qall.shape[1] // nh
        for h in range(nh):
            A = out["attentions"][l - 1][h].double()
            V = V_all[:, h * DV:(h + 1) * DV]
            Q = Qall[:, h * DK:(h + 1) * DK]
            # the recomputed queries reproduce the attention probabilities
            K = (rf.linear(out["hidden_states"][l - 1], model.w[f"{model.p}encoder.layer.{l - 1}.attention.self.key.weight"],
                           model.w[f"{model.p}encoder.layer.{l - 1}.attention.self.key.bias"]) if is_bert else None)
            if K is not None:
                P = torch.softmax(Q @ K.double()[:, h * DK:(h + 1) * DK].T / math.sqrt(DK), -1)
                assert float((P - A).abs().max()) < 1e-5, "recomputed queries do not reproduce A"
            E, r, tol = (effective_causal if not is_bert else effective_full)(A, V)
            ident = float(torch.linalg.norm(E @ V - A @ V) / torch.linalg.norm(A @ V))
            worst_identity = max(worst_identity, ident)
            r1 = svd_rank(torch.cat([V, torch.ones(T, 1, dtype=V.dtype)], 1))
            ka = key_aware(A, V, Q, not is_bert)
            heads.append({"layer": l, "head": h, "rank": r, "null_dim": T - r, "identifiable": r == T,
                          "rank_v1": r1, "stochastic_null_dim": T - r1, "tol": tol,
                          "key_aware": ka,
                          "pearson": pearson(A, E, not is_bert),
                          "special_mass_raw": mass(A, special), "special_mass_effective": mass(E, special),
                          "punct_mass_raw": mass(A, punct), "punct_mass_effective": mass(E, punct),
                          "effective_row_sums": rf.F32(E.sum(1).float())})
            if (l, h) in FULL_HEADS:
                full[f"{l}.{h}"] = rf.F32(E.float())
    print(f"{name} T={T}: ranks {[x['rank'] for x in heads]}, rank_v1 {[x['rank_v1'] for x in heads]}, "
          f"key-aware {[x['key_aware'].get('explicit') for x in heads]} (closed form "
          f"{[x['key_aware']['closed_form'] for x in heads]}), max ||A_eff V - A V||/||A V|| {worst_identity:.2g}")
    return {"name": name, "input_ids": ids, "T": T, "special": [int(x) for x in special],
            "punct": [int(x) for x in punct], "heads": heads, "effective": full}


def example_ids(golden, is_bert):
    exs = [g["input_ids"] for g in golden["examples"]]
    if is_bert:
        short = next(e for e in exs if len(e) == 10)
        body = [t for e in exs for t in e[1:-1]]
        long_ids = [exs[0][0]] + (body * 8)[:98] + [exs[0][-1]]
    else:
        short = exs[1][:10]
        body = [t for e in exs for t in e]
        long_ids = (body * 4)[:100]
    return [("short", short), ("long", long_ids)]


def synthetic_cases():
    """Random heads with small DV / DK, so that the key-aware dimension is not
    trivially 0: A = softmax(Q K^T / sqrt(DK)) (causal for GPT-2-like cases),
    all matrices rounded to float32 first (the C test reads those values)."""
    rng = np.random.default_rng(4)
    cases = []
    for label, T, DK, DV, causal in [("wide_keys", 12, 16, 4, False), ("narrow_keys", 12, 3, 4, False),
                                     ("narrow_keys_causal", 12, 3, 4, True), ("dup_values", 20, 8, 6, False)]:
        Q = torch.tensor(rng.standard_normal((T, DK)), dtype=torch.float32)
        K = torch.tensor(rng.standard_normal((T, DK)), dtype=torch.float32)
        V = torch.tensor(rng.standard_normal((T, DV)), dtype=torch.float32)
        if label == "dup_values":
            V[:, 3] = V[:, 0]  # rank(V) = 5 < DV: a duplicated column
        S = (Q.double() @ K.double().T) / math.sqrt(DK)
        if causal:
            S = S.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        A = torch.softmax(S, -1).float()
        Ad, Vd, Qd = A.double(), V.double(), Q.double()
        E, r, tol = (effective_causal if causal else effective_full)(Ad, Vd)
        r1 = svd_rank(torch.cat([Vd, torch.ones(T, 1, dtype=torch.float64)], 1))
        ka = key_aware(Ad, Vd, Qd, causal)
        print(f"synthetic {label}: T {T} DK {DK} DV {DV} rank {r} rank_v1 {r1} key-aware {ka}")
        cases.append({"name": label, "T": T, "DK": DK, "DV": DV, "causal": causal,
                      "A": rf.F32(A), "V": rf.F32(V), "Q": rf.F32(Q), "rank": r, "rank_v1": r1,
                      "key_aware": ka, "effective": rf.F32(E.float())})
    return cases


def causal_rows_cases(shared):
    """Near-singular causal prefixes (see the module docstring), per-row SVD reference."""
    rng = np.random.default_rng(16)
    cases = []
    # constructed: T = 28, DV = 20; V[:20] = L W^T with L unit lower triangular, -1 below the
    # diagonal (one singular value ~2^-19, Gram-Schmidt distances all 1), W a random rotation;
    # rows 20.. random, which lift sigma_min of the prefix above tol again.
    T, DV = 28, 20
    L = torch.eye(DV, dtype=torch.float64) - torch.tril(torch.ones(DV, DV, dtype=torch.float64), -1)
    W, _ = torch.linalg.qr(torch.tensor(rng.standard_normal((DV, DV))))
    V = torch.cat([L @ W.T, torch.tensor(rng.standard_normal((T - DV, DV)))]).float()
    S = torch.tensor(rng.standard_normal((T, T))).masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)),
                                                              float("-inf"))
    A = torch.softmax(S, -1).float()
    cases.append(("constructed", A, V))
    # gpt2-tiny-wikitext: golden examples repeated, a 100-token window from offset 5
    model_dir = os.path.join(shared, "models", "gpt2-tiny-wikitext")
    model, _ = rf.load(model_dir)
    with open(os.path.join(model_dir, "golden.json")) as f:
        body = [t for e in json.load(f)["examples"] for t in e["input_ids"]]
    ids = (body * 10)[5:105]
    out = rf.run_one(model, ids, [0] * len(ids))
    for l in range(1, model.L + 1):
        V_all = out["values"][l - 1]
        DV = V_all.shape[1] // model.nh
        for h in range(model.nh):
            cases.append((f"gpt2-tiny-wikitext layer {l} head {h}", out["attentions"][l - 1][h].float(),
                          V_all[:, h * DV:(h + 1) * DV].float()))
    result = []
    for name, A, V in cases:
        E, r, tol = effective_causal(A.double(), V.double())  # from the float32 values the C test reads
        T, DV = V.shape
        smin = float(torch.linalg.svdvals(V[:DV].double())[-1]) if T >= DV else float("nan")
        print(f"causal rows {name}: T {T} DV {DV} rank {r} tol {tol:.3g} sigma_min(V[:DV]) {smin:.3g}")
        result.append({"name": name, "T": T, "DV": DV, "rank": r, "A": rf.F32(A), "V": rf.F32(V),
                       "effective": rf.F32(E.float())})
    return {"command": COMMAND,
            "generated_by": "tests/reference/attention_reference.py (PyTorch %s, float64, one SVD per prefix)"
            % torch.__version__, "gpt2_input_ids": ids, "cases": result}


def key_aware_demo_cases(repo):
    """tests/fixtures/attention_key_aware.json: the key-aware ranks at the length of the
    issue (125 tokens) on models/demo-identifiable (DK 8, DV 128: 1000 unknowns), two
    heads, with the float32 A, V, Q the C test feeds to lensd's Gram/inertia method; the
    ranks here are torch.linalg.svdvals of the explicit J (15625 x 1000) and M J
    (16000 x 1000) in float64."""
    model_dir = os.path.join(repo, "models", "demo-identifiable")
    model, _ = rf.load(model_dir)
    T = 125
    ids = [2] + [500 + (7919 * t) % 7000 for t in range(1, T - 1)] + [3]
    out = rf.run_one(model, ids, [0] * T)
    cases = []
    for l, h in [(1, 1), (2, 0)]:
        Qall = queries(model, True, out["hidden_states"], l)
        V_all = out["values"][l - 1]
        DV, DK = V_all.shape[1] // model.nh, Qall.shape[1] // model.nh
        A = out["attentions"][l - 1][h].float()
        V = V_all[:, h * DV:(h + 1) * DV].float()
        Q = Qall[:, h * DK:(h + 1) * DK].float()
        ka = key_aware(A.double(), V.double(), Q.double(), False)
        print(f"key-aware demo-identifiable layer {l} head {h}: T {T} {ka}")
        cases.append({"name": f"demo-identifiable layer {l} head {h}", "T": T, "DK": DK, "DV": DV,
                      "A": rf.F32(A), "V": rf.F32(V), "Q": rf.F32(Q), "key_aware": ka})
    return {"command": COMMAND,
            "generated_by": "tests/reference/attention_reference.py (PyTorch %s, float64 svdvals of the explicit "
            "matrices)" % torch.__version__, "input_ids": ids, "cases": cases}


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(repo), "shared")
    for name in MODELS:
        model_dir = os.path.join(shared, "models", name)
        model, cfg = rf.load(model_dir)
        is_bert = cfg["model_type"] == "bert"
        with open(os.path.join(model_dir, "golden.json")) as f:
            golden = json.load(f)
        examples = [analyze(model, is_bert, model_dir, f"{name}/{label}", ids)
                    for label, ids in example_ids(golden, is_bert)]
        fixture = {"command": "python3 tests/reference/attention_reference.py ../shared", "model": name, "generated_by": "tests/reference/attention_reference.py (PyTorch %s, float64)"
                   % torch.__version__,
                   "eps_f32": EPS_F32, "key_aware_max_unknowns": KEY_AWARE_MAX_UNKNOWNS,
                   "full_heads": [f"{l}.{h}" for l, h in FULL_HEADS], "examples": examples}
        path = os.path.join(repo, "tests", "fixtures", f"attention_{name}.json")
        with open(path, "w") as f:
            f.write(rf.to_json(fixture) + "\n")
        print(f"{name}: wrote {os.path.relpath(path, repo)} ({os.path.getsize(path)} bytes)")
    path = os.path.join(repo, "tests", "fixtures", "attention_synthetic.json")
    with open(path, "w") as f:
        f.write(rf.to_json({"command": "python3 tests/reference/attention_reference.py ../shared", "generated_by": "tests/reference/attention_reference.py", "cases": synthetic_cases()}) + "\n")
    print(f"synthetic: wrote {os.path.relpath(path, repo)} ({os.path.getsize(path)} bytes)")
    path = os.path.join(repo, "tests", "fixtures", "attention_causal_rows.json")
    with open(path, "w") as f:
        f.write(rf.to_json(causal_rows_cases(shared)) + "\n")
    print(f"causal rows: wrote {os.path.relpath(path, repo)} ({os.path.getsize(path)} bytes)")
    path = os.path.join(repo, "tests", "fixtures", "attention_key_aware.json")
    with open(path, "w") as f:
        f.write(rf.to_json(key_aware_demo_cases(repo)) + "\n")
    print(f"key-aware: wrote {os.path.relpath(path, repo)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
