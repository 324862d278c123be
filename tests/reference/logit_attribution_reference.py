#!/usr/bin/python3
"""logit_attribution_reference.py - direct logit attribution of a decoder in
float64, for tests/test_logit_attribution.c, with TransformerLens's
convention (the residual stream's pieces through the final norm with its
scale frozen at the full forward's value, dotted with the unembedding
direction W_U[target] - W_U[foil]).

Every piece is computed from the model's own blocks (families_reference.py
for GPT-2, decoders_reference.py for the Llama family and GPT-NeoX): the
head outputs ctx_h W_O^h at the position, the attention bias, and each
block's MLP output as block output - input - attention output (the block's
real output, the last one included: the final norm is applied after).

Usage: /usr/bin/python3 tests/reference/logit_attribution_reference.py REQUEST.json
REQUEST {"model": DIR, "ids": [...], "position": p, "target": id, "foil": id | null}
-> stdout {"logit", "embed", "bias", "heads": [L][NH], "mlps": [L]}."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decoders_reference  # noqa: E402
import families_reference  # noqa: E402

torch.set_num_threads(2)


def main():
    req = json.load(open(sys.argv[1]))
    d, p = req["model"], req["position"]
    model_type = json.load(open(d + "/config.json"))["model_type"]
    with torch.no_grad():
        if model_type in decoders_reference.FAMILIES:
            m = decoders_reference.Decoder(d)
            x = m.embed(req["ids"])
            pos = torch.arange(x.shape[0])
            run = lambda l, x: m.block(l, x, pos)
            if m.type == "gpt_neox":
                o_name = "gpt_neox.layers.{}.attention.dense"
                fw, fb = m.p("gpt_neox.final_layer_norm.weight"), m.p("gpt_neox.final_layer_norm.bias")
                W_U = m.p("embed_out.weight")
                rms, offset = False, False
            else:
                o_name = "model.layers.{}.self_attn.o_proj"
                fw, fb = m.p("model.norm.weight"), None
                W_U = m.p("model.embed_tokens.weight") if m.tied else m.p("lm_head.weight")
                rms, offset = True, m.gemma
            W_O = lambda l: m.p(o_name.format(l) + ".weight")  # [C][NH*D]
            b_O = lambda l: m.w.get(o_name.format(l) + ".bias")
        else:
            m = families_reference.Model(d)
            assert m.type == "gpt2", m.type
            x = m.embed(req["ids"])

            def run(l, x):
                out, P = m.block(l, x)
                return out, P, m.last_v

            W_O = lambda l: m.p(f"transformer.h.{l}.attn.c_proj.weight").t()  # Conv1D [in][out]
            b_O = lambda l: m.p(f"transformer.h.{l}.attn.c_proj.bias")
            fw, fb = m.p("transformer.ln_f.weight"), m.p("transformer.ln_f.bias")
            W_U = m.p("transformer.wte.weight")
            rms, offset = False, False
        eps = m.eps
        C = x.shape[1]
        u = W_U[req["target"]] - (W_U[req["foil"]] if req.get("foil") is not None else 0)
        pieces = {"embed": x[p].clone(), "bias": torch.zeros(C, dtype=x.dtype), "heads": [], "mlps": []}
        for l in range(m.L):
            out, P, V = run(l, x)  # P [NH][T][T], V [NH][T][D]
            NH, _, D = V.shape
            heads = [(P[h, p] @ V[h]) @ W_O(l)[:, h * D:(h + 1) * D].t() for h in range(NH)]
            attn = sum(heads) + (b_O(l) if b_O(l) is not None else 0)
            if b_O(l) is not None:
                pieces["bias"] = pieces["bias"] + b_O(l)
            pieces["heads"].append(heads)
            pieces["mlps"].append(out[p] - x[p] - attn)
            x = out
        xL = x[p]
        if rms:
            scale = 1 / torch.sqrt(xL.pow(2).mean() + eps)
            gain = (1 + fw) if offset else fw
            f = lambda v: gain * v * scale
        else:
            scale = 1 / torch.sqrt(xL.var(unbiased=False) + eps)
            f = lambda v: fw * (v - v.mean()) * scale
        final = f(xL) + (fb if fb is not None else 0)
        dot = lambda v: float(f(v) @ u)
        res = {"logit": float(final @ u), "embed": dot(pieces["embed"]),
               "bias": dot(pieces["bias"]) + (float(fb @ u) if fb is not None else 0.0),
               "heads": [[dot(o) for o in hs] for hs in pieces["heads"]], "mlps": [dot(v) for v in pieces["mlps"]]}
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
