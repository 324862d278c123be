#!/usr/bin/python3
"""families_reference.py - an independent float64 PyTorch reference for every
model family lensd reads (BERT, GPT-2, RoBERTa, DistilBERT), written from the
Hugging Face modeling code's math (modeling_bert.py, modeling_gpt2.py,
modeling_roberta.py, modeling_distilbert.py) and nothing of lensd. The
family table test (tests/test_families.c) runs it on random checkpoints
that `lensd mkmodel` writes and compares.

  BERT        x0 = LN(E_word[id] + E_pos[t] + E_type[s]); a = LN(x + Attn(x));
              x' = LN(a + W2 act(W1 a)); classifier W_c tanh(W_p x_L[0]);
              MLM LN(act(W_t x_L)) E_word^T + bias
  RoBERTa     (and XLM-RoBERTa, modeling_xlm_roberta.py: the same model, base_model_prefix
              "roberta") BERT under "roberta." with position ids padding_idx + cumsum(id != pad)
              (pad tokens at padding_idx); classifier.out_proj(tanh(classifier.dense(x_L[0])));
              lm_head: layer_norm(gelu(dense(x_L))) E_word^T + lm_head.bias
  DistilBERT  x0 = LN(E_word[id] + E_pos[t]) (no segments); blocks with q_lin ..
              out_lin, sa_layer_norm, ffn.lin1/lin2, output_layer_norm (post-LN);
              classifier(relu(pre_classifier(x_L[0]))); MLM vocab_layer_norm(act(
              vocab_transform(x_L))) E_word^T + vocab_projector.bias
  GPT-2       a = x + Attn(LN1(x)) (causal); x' = a + W2 gelu_new(W1 LN2(a));
              hidden L = ln_f(x_L); logits ln_f(x_L) wte^T
  ModernBERT  (modeling_modernbert.py) x0 = LN(E[id]) (LayerNorms without bias); a = x + Attn(LN_attn(x))
              (layer 0 without LN_attn) with qkv = Wqkv h viewed [3][NH][D], RoPE (rotate_half) at
              global_rope_theta on layers l % global_attn_every_n_layers == 0, else local_rope_theta with
              keys |i - j| <= local_attention // 2; x' = a + Wo (act(in) * gate), in | gate = chunk(Wi LN_mlp(a));
              hidden L = final_norm(x_L); head LN(act(dense(.))) on x_L[0] or the mean over tokens,
              then classifier, or E^T + decoder.bias (MLM)
  llama, mistral, qwen2, qwen3, gemma, gemma2, gpt_neox: decoders_reference.py

Analyses, from their papers' definitions:
  attribution  Hao et al. 2021: Attr_l = A_l * (1/m) sum_k dF/dA_l at alpha_k A_l,
               alpha_k = k/m (right Riemann), F = softmax(logits)[target] of the
               classifier, or of the next token at the last position (causal LM)
  effective    Brunner et al. 2020: A_h with each row projected on the column space of
               V_h (decoders: row i on that of V_0..i), pinv in float64
  hta          Brunner et al. 2020: ||d h^l_j / d h^0_i||_F^2 for every layer, by
               autograd Jacobians of the layers from h^0 (the embedding output)
  token identity  Brunner et al. 2020 sec. 4: rank of h^0_i among the sentence's h^0_j by
               cosine to h^l_i (1 = identified), and the margin min_j |cos_ij - cos_ii|
               (a rank is only defined up to float rounding when it is tiny)
  decomposition   Song & Zhong 2023: the mean / position / context / residual split of
               each layer's hidden states over windows (decomposition_reference.metrics,
               the direct non-streaming computation), position 0 dropped

Usage: families_reference.py REQUEST.json > RESULT.json, with REQUEST
{"model": DIR, "ids": [...], "steps": m, "target": k or -1, "hta": bool,
"attribution": bool, "windows": [[...]] (optional), "labels": [...]}. Output:
hidden [L+1][T][C], attentions and effective [L][NH][T][T], logits,
ti_rank / ti_margin [L+1][T], and attribution [L][NH][T][T] / target /
f_full, hta [L][T][T], decomposition [L+1] of metrics when asked. Needs only torch and numpy (no transformers / safetensors packages)."""
import json
import math
import struct
import sys

import numpy as np
import torch

torch.set_num_threads(1)
DT = torch.float64


def read_safetensors(path):
    """name -> float64 tensor. Format: u64 LE header size, JSON header, F32 data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype="<f4", count=(end - begin) // 4, offset=begin)
        out[name] = torch.from_numpy(arr.astype(np.float64)).reshape(info["shape"])
    return out


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):  # HF "gelu_new"
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def act_fn(name):
    return gelu_tanh if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast") else gelu_erf


def ln(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def lin(x, w, b):  # nn.Linear, W [out][in]
    return x @ w.t() + b


class Model:
    """One family's forward on one sequence, with every layer's attention
    probabilities replaceable (scale[l] multiplies A_l) for attribution, and
    (BERT-like, GPT-2) hooks for ablation: ctx_hook(l, ctx [T][NH*D]) and
    mlp_hook(l, y [T][C]) return what replaces the heads' context rows and
    what the MLP adds to the residual stream."""

    ctx_hook = None
    mlp_hook = None
    layer = 0  # the block running (for the hooks)

    def __init__(self, d):
        self.cfg = json.load(open(d + "/config.json"))
        self.w = read_safetensors(d + "/model.safetensors")
        self.type = self.cfg["model_type"]
        if self.type == "xlm-roberta":  # XLMRobertaModel is RobertaModel, prefix "roberta."
            self.type = "roberta"
        self.arch = self.cfg["architectures"][0]
        c = self.cfg
        if self.type == "modernbert":
            self.L, self.NH, self.eps = c["num_hidden_layers"], c["num_attention_heads"], c.get("norm_eps", 1e-5)
            self.act = act_fn(c.get("hidden_activation", "gelu"))
            self.head_act = act_fn(c.get("classifier_activation", "gelu"))
            self.every = c.get("global_attn_every_n_layers", 1)
            self.window = c.get("local_attention", 128)
        elif self.type == "distilbert":
            self.L, self.NH, self.eps = c["n_layers"], c["n_heads"], 1e-12
            self.act = act_fn(c.get("activation", "gelu"))
        elif self.type == "gpt2":
            self.L, self.NH, self.eps = c["n_layer"], c["n_head"], c.get("layer_norm_epsilon", 1e-5)
            self.act = act_fn(c.get("activation_function", "gelu_new"))
        else:
            self.L, self.NH, self.eps = c["num_hidden_layers"], c["num_attention_heads"], c["layer_norm_eps"]
            self.act = act_fn(c.get("hidden_act", "gelu"))

    def p(self, name):
        return self.w[name]

    # -------------------------------------------------------- embeddings
    def embed(self, ids):
        T = len(ids)
        t = torch.tensor(ids)
        if self.type == "gpt2":
            return self.p("transformer.wte.weight")[t] + self.p("transformer.wpe.weight")[:T]
        if self.type == "modernbert":
            return ln(self.p("model.embeddings.tok_embeddings.weight")[t], self.p("model.embeddings.norm.weight"), None,
                      self.eps)
        if self.type == "distilbert":
            e = "distilbert.embeddings."
            x = self.p(e + "word_embeddings.weight")[t] + self.p(e + "position_embeddings.weight")[:T]
            return ln(x, self.p(e + "LayerNorm.weight"), self.p(e + "LayerNorm.bias"), 1e-12)
        e = self.type + ".embeddings."
        if self.type == "roberta":  # create_position_ids_from_input_ids
            pad = self.cfg.get("pad_token_id", 1)
            mask = (t != pad).long()
            pos = torch.cumsum(mask, 0) * mask + pad
        else:
            pos = torch.arange(T)
        x = (self.p(e + "word_embeddings.weight")[t] + self.p(e + "position_embeddings.weight")[pos] +
             self.p(e + "token_type_embeddings.weight")[torch.zeros(T, dtype=torch.long)])
        return ln(x, self.p(e + "LayerNorm.weight"), self.p(e + "LayerNorm.bias"), self.eps)

    # -------------------------------------------------------- blocks
    def attend(self, q, k, v, causal, scale):
        T = q.shape[0]
        split = lambda z: z.view(T, self.NH, -1).transpose(0, 1)  # [NH][T][D]
        qh, kh, vh = split(q), split(k), split(v)
        s = qh @ kh.transpose(-1, -2) / math.sqrt(qh.shape[-1])
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        P = torch.softmax(s, -1)
        self.last_v = vh.detach()  # [NH][T][DV], for effective attention
        if scale is not None:
            P = P * scale
        ctx = (P @ vh).transpose(0, 1).reshape(T, -1)
        return (self.ctx_hook(self.layer, ctx) if self.ctx_hook else ctx), P

    def mlp_out(self, y):
        return self.mlp_hook(self.layer, y) if self.mlp_hook else y

    def local(self, l):
        """ModernBertAttention: layer_id % global_attn_every_n_layers != 0 is local"""
        return self.type == "modernbert" and l % self.every != 0

    def modernbert_block(self, l, x, scale):
        import decoders_reference as dr  # rope, inv_freq (rotate_half)
        p, c, b = self.p, self.cfg, f"model.layers.{l}."
        T, C = x.shape
        D = C // self.NH
        h = x if l == 0 else ln(x, p(b + "attn_norm.weight"), None, self.eps)
        qkv = (h @ p(b + "attn.Wqkv.weight").t()).view(T, 3, self.NH, D)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [T][NH][D]
        theta = c.get("local_rope_theta", 10000.0) if self.local(l) else c.get("global_rope_theta", 160000.0)
        freqs, pos = dr.inv_freq(D, theta, None), torch.arange(T)
        q, k = dr.rope(q, pos, freqs), dr.rope(k, pos, freqs)
        qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        s = qh @ kh.transpose(-1, -2) / math.sqrt(D)
        if self.local(l):  # _update_attention_mask: window_mask = distance <= local_attention // 2
            i = torch.arange(T)
            s = s.masked_fill((i[:, None] - i[None, :]).abs() > self.window // 2, float("-inf"))
        P = torch.softmax(s, -1)
        self.last_v = vh.detach()
        Pu = P if scale is None else P * scale
        x = x + (Pu @ vh).transpose(0, 1).reshape(T, C) @ p(b + "attn.Wo.weight").t()
        inp, gate = (ln(x, p(b + "mlp_norm.weight"), None, self.eps) @ p(b + "mlp.Wi.weight").t()).chunk(2, dim=-1)
        return x + (self.act(inp) * gate) @ p(b + "mlp.Wo.weight").t(), P

    def block(self, l, x, scale=None):
        p = self.p
        self.layer = l
        if self.type == "modernbert":
            return self.modernbert_block(l, x, scale)
        if self.type == "gpt2":
            b = f"transformer.h.{l}."
            C = x.shape[1]
            h = ln(x, p(b + "ln_1.weight"), p(b + "ln_1.bias"), self.eps)
            qkv = h @ p(b + "attn.c_attn.weight") + p(b + "attn.c_attn.bias")
            ctx, P = self.attend(qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:], True, scale)
            a = x + ctx @ p(b + "attn.c_proj.weight") + p(b + "attn.c_proj.bias")
            h = ln(a, p(b + "ln_2.weight"), p(b + "ln_2.bias"), self.eps)
            f = self.act(h @ p(b + "mlp.c_fc.weight") + p(b + "mlp.c_fc.bias"))
            return a + self.mlp_out(f @ p(b + "mlp.c_proj.weight") + p(b + "mlp.c_proj.bias")), P
        if self.type == "distilbert":
            b = f"distilbert.transformer.layer.{l}."
            n = {"q": "attention.q_lin", "k": "attention.k_lin", "v": "attention.v_lin", "o": "attention.out_lin",
                 "ln1": "sa_layer_norm", "f1": "ffn.lin1", "f2": "ffn.lin2", "ln2": "output_layer_norm"}
        else:
            b = f"{self.type}.encoder.layer.{l}."
            n = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                 "o": "attention.output.dense", "ln1": "attention.output.LayerNorm", "f1": "intermediate.dense",
                 "f2": "output.dense", "ln2": "output.LayerNorm"}
        L_ = lambda key, z: lin(z, p(b + n[key] + ".weight"), p(b + n[key] + ".bias"))
        ctx, P = self.attend(L_("q", x), L_("k", x), L_("v", x), False, scale)
        a = ln(x + L_("o", ctx), p(b + n["ln1"] + ".weight"), p(b + n["ln1"] + ".bias"), self.eps)
        f = self.mlp_out(L_("f2", self.act(L_("f1", a))))
        return ln(a + f, p(b + n["ln2"] + ".weight"), p(b + n["ln2"] + ".bias"), self.eps), P

    def layers(self, h0, scales=None, patch=None):
        """patch (l, t, row): row t of block l's input replaced by row (activation patching)."""
        hidden, probs, x = [h0], [], h0
        self.values = []
        for l in range(self.L):
            if patch and patch[0] == l:
                x = x.clone()
                x[patch[1]] = patch[2]
            x, P = self.block(l, x, scales[l] if scales else None)
            probs.append(P)
            self.values.append(self.last_v)
            hidden.append(x)
        if self.type == "gpt2":
            hidden[-1] = ln(x, self.p("transformer.ln_f.weight"), self.p("transformer.ln_f.bias"), self.eps)
        if self.type == "modernbert":
            hidden[-1] = ln(x, self.p("model.final_norm.weight"), None, self.eps)
        return hidden, probs

    # -------------------------------------------------------- heads
    def head(self, hL):
        p, a = self.p, self.arch
        if self.type == "modernbert":  # ModernBertPredictionHead, then classifier or decoder
            head = lambda z: ln(self.head_act(z @ p("head.dense.weight").t()), p("head.norm.weight"), None, self.eps)
            if a.endswith("SequenceClassification"):
                pooled = hL.mean(0) if self.cfg.get("classifier_pooling") == "mean" else hL[0]
                return lin(head(pooled), p("classifier.weight"), p("classifier.bias"))
            if a.endswith("MaskedLM"):
                return head(hL) @ p("model.embeddings.tok_embeddings.weight").t() + p("decoder.bias")
            return None
        if a.endswith("SequenceClassification"):
            if self.type == "bert":
                pooled = torch.tanh(lin(hL[0], p("bert.pooler.dense.weight"), p("bert.pooler.dense.bias")))
                return lin(pooled, p("classifier.weight"), p("classifier.bias"))
            if self.type == "roberta":
                pooled = torch.tanh(lin(hL[0], p("classifier.dense.weight"), p("classifier.dense.bias")))
                return lin(pooled, p("classifier.out_proj.weight"), p("classifier.out_proj.bias"))
            pooled = torch.relu(lin(hL[0], p("pre_classifier.weight"), p("pre_classifier.bias")))
            return lin(pooled, p("classifier.weight"), p("classifier.bias"))
        if a.endswith("MaskedLM"):
            names = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                              "cls.predictions.bias", "bert."),
                     "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias", "roberta."),
                     "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias", "distilbert.")}
            d, lnn, bias, pre = names[self.type]
            act = gelu_erf if self.type == "roberta" else self.act  # RobertaLMHead calls gelu()
            t = ln(act(lin(hL, p(d + ".weight"), p(d + ".bias"))), p(lnn + ".weight"), p(lnn + ".bias"), self.eps)
            return t @ p(pre + "embeddings.word_embeddings.weight").t() + p(bias)
        if a == "GPT2LMHeadModel":
            return hL @ p("transformer.wte.weight").t()
        return None

    def objective_logits(self, logits):
        """The logits F is a softmax of: the classifier's, or the last position's next-token ones."""
        return logits[-1] if self.arch == "GPT2LMHeadModel" else logits


def attribution(m, h0, steps, target):
    with torch.no_grad():
        hidden, probs = m.layers(h0)
        z = m.objective_logits(m.head(hidden[-1]))
    if target < 0:
        target = int(torch.argmax(z))
    f_full = float(torch.softmax(z, -1)[target])
    out = []
    for l in range(m.L):
        A = probs[l].detach()
        g = torch.zeros_like(A)
        for k in range(1, steps + 1):
            scale = torch.full_like(A, k / steps).requires_grad_(True)
            scales = [None] * m.L
            scales[l] = scale
            hid, _ = m.layers(h0, scales)
            F = torch.softmax(m.objective_logits(m.head(hid[-1])), -1)[target]
            (gs,) = torch.autograd.grad(F, scale)
            g += gs  # dF/dscale = A * dF/dX at X = alpha_k A
        out.append((g / steps).tolist())  # A * (1/m) sum_k dF/dX
    return out, target, f_full


def effective(m, probs):
    """Brunner et al. 2020: each row of A minus its component in the left null
    space of V, i.e. a_i projected on the column space of V (decoders: of the
    prefix V_0..i, the values row i can reach)."""
    out = []
    for l in range(m.L):
        A, V = probs[l], m.values[l]
        E = torch.zeros_like(A)
        for h in range(m.NH):
            T = A.shape[-1]
            for i in range(T):
                lo, n = 0, i + 1 if m.type == "gpt2" else T
                if m.local(l):  # ModernBERT's local layers: the keys |i - j| <= W // 2
                    lo, n = max(0, i - m.window // 2), min(T, i + m.window // 2 + 1)
                Vi = V[h, lo:n]
                P = Vi @ torch.linalg.pinv(Vi)  # projection on range(V_lo..n-1)
                E[h, i, lo:n] = A[h, i, lo:n] @ P
        out.append(E.tolist())
    return out


def hta(m, h0):
    T, C = h0.shape
    out = []
    for l in range(1, m.L + 1):
        J = torch.autograd.functional.jacobian(lambda z: m.layers(z)[0][l], h0)  # [T][C][T][C]
        out.append((J ** 2).sum(dim=(1, 3)).tolist())  # [j][i] = ||d h^l_j / d h^0_i||_F^2
    return out


def token_identity(hidden):
    h0 = hidden[0] / hidden[0].norm(dim=1, keepdim=True)
    ranks, margins = [], []
    for h in hidden:
        cos = (h / h.norm(dim=1, keepdim=True)) @ h0.t()  # [i][j] = cos(h^l_i, h^0_j)
        own = cos.diagonal()
        ranks.append((1 + (cos > own[:, None]).sum(1)).tolist())
        gap = (cos - own[:, None]).abs() + torch.eye(len(own), dtype=DT) * 1e9
        margins.append(gap.min(1).values.tolist())
    return ranks, margins


def decomposition(m, windows, labels):
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import decomposition_reference as dr
    with torch.no_grad():
        per = [m.layers(m.embed(w))[0] for w in windows]  # W of [L+1] x [T][C]
    out = []
    for l in range(m.L + 1):
        h = torch.stack([hw[l] for hw in per])  # [W][T][C]
        out.append(dr.metrics(h[:, 1:, :], labels))
    return out


def main():
    req = json.load(open(sys.argv[1]))
    with open(req["model"] + "/config.json") as f:
        model_type = json.load(f)["model_type"]
    import decoders_reference  # the modern decoders' reference (RoPE, RMSNorm, GQA, ...)
    if model_type in decoders_reference.FAMILIES:
        decoders_reference.main()
        return
    m = Model(req["model"])
    h0 = m.embed(req["ids"])
    with torch.no_grad():
        hidden, probs = m.layers(h0)
        logits = m.head(hidden[-1])
    json.dump(answer(req, m, h0, hidden, probs, logits, effective(m, probs)), sys.stdout)


def answer(req, m, h0, hidden, probs, logits, effective):
    """The reference's JSON for request req (every family: decoders_reference.py too)."""
    res = {"hidden": [h.tolist() for h in hidden], "attentions": [P.tolist() for P in probs],
           "logits": None if logits is None else logits.tolist(), "effective": effective}
    if req.get("attribution"):
        res["attribution"], res["target"], res["f_full"] = attribution(m, h0, req["steps"], req.get("target", -1))
    if req.get("hta"):
        res["hta"] = hta(m, h0)
    res["ti_rank"], res["ti_margin"] = token_identity(hidden)
    if req.get("windows"):
        res["decomposition"] = decomposition(m, req["windows"], req["labels"])
    return res


if __name__ == "__main__":
    main()
