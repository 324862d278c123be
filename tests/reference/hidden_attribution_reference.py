#!/usr/bin/python3
"""hidden_attribution_reference.py - hidden token attribution (Brunner et al.
2020) and token identifiability with PyTorch autograd, for
tests/test_hidden_attribution.c.

For the shared checkpoints, fixed token ids, h^0 = the embedding output
(reference_forward.py's hidden_states[0]) and f_l(h^0) = h^l (the blocks of
reference_forward.py's models run from h^0; GPT-2's last layer with ln_f):
    J = torch.autograd.functional.jacobian(f_l, h0)      # [T][C][T][C]
    norm2[j][i] = sum_{c,c'} J[j,c,i,c']^2                # ||dh^l_j/dh^0_i||_F^2
    contributions[j][i] = sqrt(norm2[j][i]) / sum_k sqrt(norm2[j][k])
in float64 (weights cast up). Token identity: for every layer, rank of h^0_i
among {h^0_k} by cosine similarity to h^l_i (1 = nearest), and L2.
Writes tests/fixtures/hidden_attribution_shared.json.

Usage (repo root): /usr/bin/python3 tests/reference/hidden_attribution_reference.py [SHARED_DIR]"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as rf  # noqa: E402

torch.set_num_threads(2)

# The last example of each model is longer than 64 tokens (80 and 79 ids: a
# made-up review, tokenized by lensd once and pasted here).
EXAMPLES = {
    "bert-tiny-sst2": [[101, 1996, 3185, 2001, 2307, 1998, 1045, 3866, 2009, 1012, 102],
                       [101, 2025, 2204, 1010, 2025, 2919, 102],
                       [101, 1996, 2143, 7480, 2007, 1037, 2146, 1998, 4251, 3496, 1999, 2029, 2498, 2172,
                        6433, 1010, 1998, 2664, 2011, 1996, 2051, 1996, 2466, 6561, 2049, 2690, 2930, 1996,
                        2472, 2038, 2328, 2107, 1037, 6176, 3861, 1997, 1996, 2155, 1010, 2037, 2235, 10311,
                        7368, 1998, 2037, 14205, 2293, 1010, 2008, 2296, 2101, 2735, 5683, 3687, 2738, 2084,
                        3140, 1010, 2130, 2043, 1996, 5896, 12671, 2006, 16507, 1010, 1998, 1996, 2345, 3496,
                        12237, 2007, 2017, 2146, 2044, 1996, 4597, 2272, 2039, 102]],
    "gpt2-tiny-wikitext": [[464, 3290, 373, 257, 1310, 286, 262, 995, 13, 383, 318, 257],
                           [40, 588, 340, 3621, 13],
                           [1169, 2646, 9808, 351, 257, 890, 290, 5897, 3715, 287, 543, 2147, 881, 4325, 837,
                            290, 1865, 416, 262, 640, 262, 1621, 12229, 663, 3504, 2665, 262, 3437, 468,
                            3170, 884, 257, 8161, 4286, 286, 262, 1641, 837, 511, 1402, 4630, 2120, 444, 290,
                            511, 24444, 1842, 837, 326, 790, 1568, 1210, 5300, 7366, 2138, 621, 4137, 837,
                            772, 618, 262, 4226, 39416, 319, 21083, 837, 290, 262, 2457, 3715, 14768, 351,
                            345, 890, 706, 262, 7588, 1282, 510]],
}


def blocks_from(model, h0):
    """h0 [T][C] float64 -> list of hidden states [L+1][T][C] (reference_forward's block math)."""
    w, p, eps = model.w, model.p, model.eps
    x = h0[None]
    T = h0.shape[0]
    hidden = [h0]
    if isinstance(model, rf.Bert):
        mask_add = torch.zeros(1, 1, T, dtype=h0.dtype)
        for l in range(model.L):
            g = lambda n: (w[f"{p}encoder.layer.{l}.{n}.weight"], w[f"{p}encoder.layer.{l}.{n}.bias"])
            q, k, v = (rf.linear(x, *g(f"attention.self.{n}")) for n in ("query", "key", "value"))
            ctx, _ = rf.attention(q, k, v, model.nh, mask_add)
            a = rf.layer_norm(x + rf.linear(ctx, *g("attention.output.dense")), *g("attention.output.LayerNorm"), eps)
            f = rf.linear(rf.gelu_erf(rf.linear(a, *g("intermediate.dense"))), *g("output.dense"))
            x = rf.layer_norm(a + f, *g("output.LayerNorm"), eps)
            hidden.append(x[0])
    else:
        C = h0.shape[1]
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))[None]
        mask_add = torch.where(allowed, torch.tensor(0.0, dtype=h0.dtype), torch.tensor(-1e30, dtype=h0.dtype))
        for l in range(model.L):
            g = lambda n: (w[f"{p}h.{l}.{n}.weight"], w[f"{p}h.{l}.{n}.bias"])
            qkv = rf.conv1d(rf.layer_norm(x, *g("ln_1"), eps), *g("attn.c_attn"))
            q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
            ctx, _ = rf.attention(q, k, v, model.nh, mask_add)
            a = x + rf.conv1d(ctx, *g("attn.c_proj"))
            x = a + rf.conv1d(rf.gelu_tanh(rf.conv1d(rf.layer_norm(a, *g("ln_2"), eps), *g("mlp.c_fc"))),
                              *g("mlp.c_proj"))
            hidden.append(x[0])
        hidden[-1] = rf.layer_norm(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)[0]
    return hidden


def ranks(hl, h0, metric):
    if metric == "cosine":
        s = torch.nn.functional.normalize(hl, dim=1) @ torch.nn.functional.normalize(h0, dim=1).t()
    else:
        s = -torch.cdist(hl, h0)
    own = s.diagonal()
    return [int(1 + (s[i] > own[i]).sum()) for i in range(hl.shape[0])]


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else "../shared"
    out = {"command": "python3 tests/reference/hidden_attribution_reference.py ../shared", "tolerance": 1e-4, "models": {}}
    for name, examples in EXAMPLES.items():
        model, cfg = rf.load(os.path.join(shared, "models", name))
        model.w = {k: v.double() for k, v in model.w.items()}
        rows = []
        for ids in examples:
            with torch.no_grad():
                h0 = rf.run_one(model, ids, [0] * len(ids))["hidden_states"][0]
            hidden = blocks_from(model, h0)
            layers = []
            for l in range(1, model.L + 1):
                J = torch.autograd.functional.jacobian(lambda h: blocks_from(model, h)[l], h0)  # [T][C][T][C]
                norm2 = (J ** 2).sum(dim=(1, 3))
                s = norm2.sqrt()
                contrib = s / s.sum(dim=1, keepdim=True)
                layers.append({"layer": l, "norm2": norm2.tolist(), "contributions": contrib.tolist(),
                               "rank_cosine": ranks(hidden[l].detach(), h0, "cosine"),
                               "rank_l2": ranks(hidden[l].detach(), h0, "l2")})
            rows.append({"input_ids": ids, "layers": layers})
        out["models"][name] = rows
    path = "tests/fixtures/hidden_attribution_shared.json"
    with open(path, "w") as f:
        json.dump(out, f)
    print("wrote", path)


if __name__ == "__main__":
    main()
