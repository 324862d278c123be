#!/usr/bin/python3
"""context_mixing_reference.py - attention rollout, ALTI, GlobEnc and value
zeroing in float64, written from the authors' released code (not from
lensd), for tests/test_context_mixing.c.

  rollout        samiraabnar/attention_flow: compute_joint_attention(att_mat,
                 add_residual=True) on the head-averaged attention
  ALTI           mt-upc/transformer-contributions src/contributions.py
                 (get_contributions) and src/utils_contributions.py
                 (normalize_contributions 'min_sum' with the resultant's L1
                 norm), rolled out without a residual
  GlobEnc        mohsenfayyaz/GlobEnc src/modeling/modeling_bert.py
                 (BertNormOutput + BertLayer: norms[4], "N-Enc"), rolled out
                 by src/attention_rollout.py (pre_process leaves it raw)
  value zeroing  hmohebbi/ValueZeroing scoring/value_zeroing.py (cosine
                 distances, rows / their sum, compute_joint_attention res=False)
  DecompX        mohsenfayyaz/DecompX src/modeling_bert.py (BertLayer's
                 bias_decomposer "absdot", ln_decomposer, ffn_decomposer with
                 GeLU_ZO; aggregation None per layer and "vector" rolled out;
                 BertModel's pooler decomposer with tanh ZO and
                 BertForSequenceClassification's classifier decomposer),
                 post-norm encoders only

Pre-norm blocks (GPT-2, the Llama family) are not in those repositories;
the decomposition is ALTI+'s: the input norm acts on each source token alone,
so it stays inside v_j, and no LayerNorm sits on the residual sum
(docs/context-mixing.md). "lensd" differs from "paper-code" where the docs
say: ALTI divides by the LayerNorm's own sqrt(var + eps) (not torch.std) and
has no pairwise_distance eps (pre-norm blocks never have it); GlobEnc's rows are normalised before the
rollout; value zeroing compares with the block's output (before a final
norm) on the last layer; DecompX's rows are normalised, without the code's
1e-12 in the absdot weights and the ZO slopes (a bias orthogonal to every
vector split equally, act(z) / z exact).

Usage: /usr/bin/python3 tests/reference/context_mixing_reference.py REQUEST.json
REQUEST {"model": DIR, "ids": [...]} -> stdout {method: {definition:
{"contributions": [L][T][T], "rollout": [L][T][T]}}} for every method the
model's blocks define (DecompX on a classifier also "classifier": [T][K]).
The DecompX identities are asserted here too: the propagated vectors of
every layer sum to its hidden states, the classifier's to the logits."""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decoders_reference  # noqa: E402
import families_reference  # noqa: E402

torch.set_num_threads(2)


# ------------------------------------------------------------ one layer's parts

class Parts:
    """What the decompositions read of layer l, and the layer rerun with one token's values zeroed."""


def layer_parts(m, l, x, kind):
    """kind: "post" (BERT-like), "gpt2", "decoder" (Llama-like). Fills Parts from the model's weights."""
    P_ = Parts()
    P_.x = x
    p = m.p
    if kind == "decoder":
        b = f"model.layers.{l}."
        out, probs, V = m.block(l, x, torch.arange(x.shape[0]))
        P_.P, P_.V = probs, V                              # [NH][T][T], [NH][T][D] per query head
        P_.Wo = p(b + "self_attn.o_proj.weight")           # [C][NH*D]
        P_.bo = m.w.get(b + "self_attn.o_proj.bias")
        P_.post, P_.out = False, out
        return P_
    if kind == "gpt2":
        b = f"transformer.h.{l}."
        out, probs = m.block(l, x)
        P_.P, P_.V = probs, m.last_v
        P_.Wo, P_.bo = p(b + "attn.c_proj.weight").t(), p(b + "attn.c_proj.bias")  # Conv1D [in][out]
        P_.post, P_.out = False, out
        return P_
    if m.type == "distilbert":
        b = f"distilbert.transformer.layer.{l}."
        n = {"v": "attention.v_lin", "o": "attention.out_lin", "ln1": "sa_layer_norm", "f1": "ffn.lin1", "f2": "ffn.lin2",
             "ln2": "output_layer_norm"}
    else:
        b = f"{m.type}.encoder.layer.{l}."
        n = {"v": "attention.self.value", "o": "attention.output.dense", "ln1": "attention.output.LayerNorm", "f1": "intermediate.dense",
             "f2": "output.dense", "ln2": "output.LayerNorm"}
    out, probs = m.block(l, x)
    P_.P, P_.V = probs, m.last_v
    g = lambda k: (p(b + n[k] + ".weight"), p(b + n[k] + ".bias"))
    P_.Wo, P_.bo = g("o")
    P_.Wv, P_.bv = p(b + n["v"] + ".weight"), p(b + n["v"] + ".bias")
    P_.W1, P_.b1 = g("f1")
    P_.W2, P_.b2 = g("f2")
    P_.ln1, P_.ln2 = g("ln1"), g("ln2")
    ctx = (probs @ P_.V).transpose(0, 1).reshape(x.shape[0], -1)
    P_.pre_ln = x + families_reference.lin(ctx, *g("o"))                  # pre_ln_states
    a = families_reference.ln(P_.pre_ln, *P_.ln1, m.eps)
    P_.pre_act = families_reference.lin(a, *g("f1"))                      # pre_act_hidden_states
    P_.post_act = m.act(P_.pre_act)                                       # intermediate_output
    P_.pre_ln2 = a + families_reference.lin(P_.post_act, *g("f2"))        # pre_ln2_states
    P_.post, P_.out, P_.eps = True, out, m.eps
    return P_


def zeroed_output(m, l, x, kind, t):
    """The layer's output with token t's value vectors zeroed (customized_modeling_bert's zero_value_index)."""
    orig = m.attend

    def attend(q, k, v, *rest):
        v = v.clone()
        v[t] = 0  # value_layer[:, :, t] = 0 (all heads, bias included)
        return orig(q, k, v, *rest)

    m.attend = attend
    try:
        if kind == "decoder":
            return m.block(l, x, torch.arange(x.shape[0]))[0]
        return m.block(l, x)[0]
    finally:
        del m.attend


# ------------------------------------------------------------ methods

def compute_joint_attention(att_mat, add_residual):
    """attention_flow's compute_joint_attention (att_mat [L][T][T])."""
    if add_residual:
        aug = att_mat + torch.eye(att_mat.shape[1], dtype=att_mat.dtype)[None]
        aug = aug / aug.sum(-1)[..., None]
    else:
        aug = att_mat
    joint = torch.zeros_like(aug)
    joint[0] = aug[0]
    for i in range(1, aug.shape[0]):
        joint[i] = aug[i] @ joint[i - 1]
    return aug, joint


def residual_weighted(parts):
    """summed_weighted_layer + residual: [T][T][C], t_ij = sum_h P^h_ij v^h_j W_O^h + [i == j] x_i."""
    NH, T, D = parts.V.shape
    C = parts.Wo.shape[0]
    dense = parts.Wo.view(C, NH, D)
    transformed = torch.einsum("hsv,dhv->hsd", parts.V, dense)
    weighted = torch.einsum("hks,hsd->hksd", parts.P, transformed)
    residual = torch.einsum("sk,sd->skd", torch.eye(T, dtype=parts.x.dtype), parts.x)
    return weighted.sum(0) + residual


def l_transform(x, w_ln):
    """contributions.py: mean subtraction and the LayerNorm weight as one linear map."""
    C = w_ln.shape[0]
    mean_transf = torch.eye(C, dtype=w_ln.dtype) - torch.ones(C, C, dtype=w_ln.dtype) / C
    return torch.einsum("...e,ef,fg->...g", x, mean_transf, torch.diag(w_ln))


def alti_layer(parts, paper_code):
    rw = residual_weighted(parts)
    bo = parts.bo if parts.bo is not None else torch.zeros(rw.shape[-1], dtype=rw.dtype)
    if parts.post:
        w_ln, b_ln = parts.ln1
        tv = l_transform(rw, w_ln)
        attn_output = tv.sum(1)
        dense_bias_term = l_transform(bo, w_ln)
        if paper_code:
            coef = 1 / (parts.pre_ln + parts.eps).std(-1).view(-1, 1)  # torch.std: unbiased
        else:
            coef = 1 / torch.sqrt(parts.pre_ln.var(-1, unbiased=False) + parts.eps).view(-1, 1)
        resultant = (attn_output + dense_bias_term) * coef + b_ln
        tv_std = tv * coef.unsqueeze(-1)
    else:
        tv_std, resultant = rw, rw.sum(1) + bo
    if paper_code and parts.post:
        importance = -F.pairwise_distance(tv_std, resultant.unsqueeze(1), p=1)
    else:
        importance = -(tv_std - resultant.unsqueeze(1)).abs().sum(-1)
    # normalize_contributions(scaling='min_sum', resultant_norm=||resultant||_1)
    c = torch.clip(importance + resultant.abs().sum(-1).unsqueeze(1), min=0)
    return c / c.sum(-1, keepdim=True)


def globenc_layer(parts, paper_code):
    rw = residual_weighted(parts)
    if parts.post:
        mean = parts.pre_ln.mean(-1, keepdim=True)
        var = (parts.pre_ln - mean).pow(2).mean(-1, keepdim=True).unsqueeze(1)
        normalized = (rw - rw.mean(-1, keepdim=True)) / (var + parts.eps) ** 0.5
        post_ln = torch.einsum("skd,d->skd", normalized, parts.ln1[0])
        mean2 = parts.pre_ln2.mean(-1, keepdim=True)
        var2 = (parts.pre_ln2 - mean2).pow(2).mean(-1, keepdim=True).unsqueeze(1)
        normalized2 = (post_ln - post_ln.mean(-1, keepdim=True)) / (var2 + parts.eps) ** 0.5
        n = torch.norm(torch.einsum("skd,d->skd", normalized2, parts.ln2[0]), dim=-1)
    else:
        n = torch.norm(rw, dim=-1)
    return n if paper_code else n / n.sum(-1, keepdim=True)


def value_zeroing_layer(m, l, parts, kind):
    T = parts.x.shape[0]
    ref = parts.out  # the block's output (hidden_states[l + 1] before any final norm)
    score = torch.zeros(T, T, dtype=parts.x.dtype)
    for t in range(T):
        h = zeroed_output(m, l, parts.x, kind, t)
        score[:, t] = 1 - F.cosine_similarity(h, ref, dim=-1, eps=0)
    return score / score.sum(-1, keepdim=True)


# ------------------------------------------------------------ DecompX

def bias_decomposer(bias, av, paper_code):
    """BertLayer.bias_decomposer "absdot": av [..][T][D] (sources on dim -2) + each source's share of bias."""
    weights = torch.abs(torch.einsum("...kd,d->...k", av, bias))
    total = weights.sum(-1, keepdim=True)
    if paper_code:
        weights = weights / (total + 1e-12)
    else:
        weights = torch.where(total > 0, weights / total.clamp(min=1e-300), torch.full_like(weights, 1 / av.shape[-2]))
    return av + torch.einsum("...k,d->...kd", weights, bias)


def ln_decomposer(av, pre_ln_states, ln_wb, eps, paper_code):
    """BertLayer.ln_decomposer: the statistics of the real pre-LN states, each vector centred, the bias by absdot."""
    gamma, beta = ln_wb
    mean = pre_ln_states.mean(-1, keepdim=True)
    var = (pre_ln_states - mean).pow(2).mean(-1, keepdim=True).unsqueeze(1)
    normalized = (av - av.mean(-1, keepdim=True)) / (var + eps) ** 0.5
    return bias_decomposer(beta, torch.einsum("skd,d->skd", normalized, gamma), paper_code)


def zo(post, pre, paper_code, limit0):
    """The zero-origin slope act(z) / z (gelu_zo_decomposition, tanh_zo_decomposition)."""
    if paper_code:
        return post / (pre + 1e-12)
    return torch.where(pre != 0, post / torch.where(pre != 0, pre, torch.ones_like(pre)), torch.full_like(pre, limit0))


def decompx_layer(parts, av, paper_code):
    """BertLayer.forward with a decompx_config: av None is the first layer (and aggregation None), else the
    propagated vectors [T][T][C] of the layer input (aggregation "vector")."""
    NH, T, D = parts.V.shape
    C = parts.Wo.shape[0]
    headmixing = parts.Wo.view(C, NH, D)
    if av is None:
        transformed = torch.einsum("hsv,dhv->hsd", parts.V, headmixing)
        summed = torch.einsum("hks,hsd->hksd", parts.P, transformed).sum(0)
        residual = torch.einsum("sk,sd->skd", torch.eye(T, dtype=parts.x.dtype), parts.x)
        rw = summed + residual
        accumulated_bias = parts.bo
    else:
        decomposed = torch.einsum("ijd,vd->ijv", av, parts.Wv).view(T, T, NH, D).permute(2, 0, 1, 3)
        transformed = torch.einsum("hsqv,dhv->hsqd", decomposed, headmixing)
        summed = torch.einsum("hks,hsqd->hkqd", parts.P, transformed).sum(0)
        rw = summed + av
        accumulated_bias = parts.Wo @ parts.bv + parts.bo
    rw = bias_decomposer(accumulated_bias, rw, paper_code)
    post_ln = ln_decomposer(rw, parts.pre_ln, parts.ln1, parts.eps, paper_code)
    # ffn_decomposer, approximation_type "GeLU_ZO"
    first = bias_decomposer(parts.b1, torch.einsum("ld,skd->skl", parts.W1, post_ln), paper_code)
    first = first * zo(parts.post_act, parts.pre_act, paper_code, 0.5).unsqueeze(1)
    second = bias_decomposer(parts.b2, torch.einsum("skl,dl->skd", first, parts.W2), paper_code)
    return ln_decomposer(post_ln + second, parts.pre_ln2, parts.ln2, parts.eps, paper_code)


def decompx_classifier(m, vectors, hL, paper_code):
    """BertModel.ffn_decomposer (pooler, tanh ZO) and BertForSequenceClassification.ffn_decomposer on the first
    row's vectors [T][C]; RoBERTa's classifier.dense / out_proj alike; DistilBERT's ReLU pre_classifier by its ZO
    slope (lensd's extension)."""
    names = {"bert": ("bert.pooler.dense", "classifier", 1.0), "roberta": ("classifier.dense", "classifier.out_proj", 1.0),
             "distilbert": ("pre_classifier", "classifier", 0.0)}
    pool, cls, limit0 = names[m.type]
    Wp, bp = m.p(pool + ".weight"), m.p(pool + ".bias")
    pre = families_reference.lin(hL[0], Wp, bp)
    post = torch.relu(pre) if m.type == "distilbert" else torch.tanh(pre)
    pooled = bias_decomposer(bp, torch.einsum("ld,sd->sl", Wp, vectors[0]), paper_code)
    pooled = pooled * zo(post, pre, paper_code, limit0)
    Wc, bc = m.p(cls + ".weight"), m.p(cls + ".bias")
    return bias_decomposer(bc, torch.einsum("ld,kd->kl", Wc, pooled), paper_code)


def decompx(m, layers, hidden, paper_code):
    """{contributions, rollout[, classifier]}: per layer the norms with aggregation None and "vector"."""
    local, rolled, av = [], [], None
    for l, parts in enumerate(layers):
        local.append(torch.norm(decompx_layer(parts, None, paper_code), dim=-1))
        av = decompx_layer(parts, av, paper_code)
        err = (av.sum(1) - hidden[l + 1]).abs().max().item()
        assert err < 1e-9 * hidden[l + 1].abs().max().item() + 1e-9, f"layer {l + 1}: vectors sum off by {err}"
        rolled.append(torch.norm(av, dim=-1))
    local, rolled = torch.stack(local), torch.stack(rolled)
    if not paper_code:
        local, rolled = local / local.sum(-1, keepdim=True), rolled / rolled.sum(-1, keepdim=True)
    out = {"contributions": local.tolist(), "rollout": rolled.tolist()}
    if m.arch.endswith("SequenceClassification"):
        c = decompx_classifier(m, av, hidden[-1], paper_code)
        logits = m.head(hidden[-1])
        err = (c.sum(0) - logits).abs().max().item()
        assert err < 1e-9 * logits.abs().max().item() + 1e-9, f"classifier contributions sum off by {err}"
        out["classifier"] = c.tolist()
    return out


# ------------------------------------------------------------ driver

def main():
    req = json.load(open(sys.argv[1]))
    d = req["model"]
    model_type = json.load(open(d + "/config.json"))["model_type"]
    if model_type in decoders_reference.FAMILIES:
        m, kind = decoders_reference.Decoder(d), "decoder"
        h0 = m.embed(req["ids"])
    else:
        m = families_reference.Model(d)
        kind = "gpt2" if m.type == "gpt2" else "post"
        h0 = m.embed(req["ids"])
    out = {}
    with torch.no_grad():
        x, layers = h0, []
        for l in range(m.L):
            parts = layer_parts(m, l, x, kind)
            layers.append(parts)
            x = parts.out
        att = torch.stack([p.P.mean(0) for p in layers])
        aug, joint = compute_joint_attention(att, True)
        both = {"contributions": aug.tolist(), "rollout": joint.tolist()}
        out["rollout"] = {"paper-code": both, "lensd": both}
        vz = torch.stack([value_zeroing_layer(m, l, p, kind) for l, p in enumerate(layers)])
        both = {"contributions": vz.tolist(), "rollout": compute_joint_attention(vz, False)[1].tolist()}
        out["value-zeroing"] = {"paper-code": both, "lensd": both}
        for name, fn in (("alti", alti_layer), ("globenc", globenc_layer)):
            out[name] = {}
            for definition in ("paper-code", "lensd"):
                c = torch.stack([fn(p, definition == "paper-code") for p in layers])
                out[name][definition] = {"contributions": c.tolist(),
                                         "rollout": compute_joint_attention(c, False)[1].tolist()}
        if kind == "post":
            hidden = [h0] + [p.out for p in layers]
            out["decompx"] = {d: decompx(m, layers, hidden, d == "paper-code") for d in ("paper-code", "lensd")}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
