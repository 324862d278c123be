#!/usr/bin/python3
"""decoders_reference.py - an independent float64 PyTorch reference for the
modern decoder families lensd reads (llama, mistral, qwen2, qwen3, gemma,
gemma2, gemma3_text, gpt_neox, phi3, olmo2, mixtral, qwen3_moe, olmoe, gpt_oss),
written from the math of Hugging Face's modeling files (modeling_llama.py,
modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py, modeling_gemma.py,
modeling_gemma2.py, modeling_gemma3.py, modeling_gpt_neox.py,
modeling_phi3.py, modeling_olmo2.py, modeling_mixtral.py,
modeling_qwen3_moe.py, modeling_olmoe.py, modeling_gpt_oss.py with
modeling_rope_utils.py's yarn) and nothing of lensd; the
transformers package is not imported.

  Llama-style  x0 = E[id] (Gemma: times sqrt(C));  per layer
               h = RMSNorm(x) (gain w, Gemma 1 + w);  q, k, v = h W^T (+ b)
               q, k = RMSNorm per head (Qwen3);  q, k = RoPE (rotate_half; llama3 scaling)
               k, v repeat_kv to NH heads;  s = q k^T * scale (Gemma 2: query_pre_attn_scalar^-1/2,
               then cap tanh(s / cap));  causal mask, sliding window (key j seen when i - j < W;
               Gemma 2 on even layers);  a = softmax(s) v W_o^T (+ b);  Gemma 2: post-norm
               x = x + a;  x = x + [post-norm] W_down (act(W_gate h') * W_up h'), h' = RMSNorm(x)
               hidden[L] = model.norm(x_L);  logits = hidden[L] (lm_head | E)^T (Gemma 2 final cap)
  Gemma 3      Gemma 2's block (soft-caps only when configured) with q_norm / k_norm
               (1 + w, per head) before RoPE; layer_types (default: layer l global when
               (l + 1) % sliding_window_pattern == 0, else sliding); sliding layers rotate at
               rope_local_base_freq (default RoPE), global ones at rope_theta with rope_scaling
  Phi-3        Llama with qkv_proj split q | k | v (query_pos = NH D, then NKV D each), gate_up_proj
               chunked gate | up, RoPE on the first int(D * partial_rotary_factor) channels, the
               sliding window on every layer
  OLMo-2       no norm before attention or the MLP: q = q_norm(x W_q) over all NH D channels, k
               likewise (NKV D), RoPE; x = x + post_attention_layernorm(Attn W_o);
               x = x + post_feedforward_layernorm(W_down (silu(x W_gate) * x W_up))
  MoE          Mixtral, Qwen3-MoE, OLMoE: on a sparse layer (Qwen3-MoE: not in mlp_only_layers and
               (l + 1) % decoder_sparse_step == 0; the others every layer) the MLP is
               p = softmax(h W_gate^T), the top num_experts_per_tok by value (torch.topk), weights
               renormalised over them (Mixtral always, else norm_topk_prob), and
               sum_j w_j W_down,e (act(h W_gate,e) * h W_up,e) looping over tokens and experts
               (Mixtral's experts: w1 gate, w3 up, w2 down); OLMoE's q_norm / k_norm over the whole
               projections as OLMo-2's, before RoPE; the routes go to the output ("router": per
               layer, null for a dense one, per token the chosen experts and their weights)
  gpt-oss      Llama-style with q/k/v/o biases; RoPE inv_freq by YaRN (channels below
               d(beta_fast) kept, above d(beta_slow) divided by factor, a linear ramp between,
               d(n) = R ln(O / (2 pi n)) / (2 ln theta); ends floored / ceiled when truncate) and
               cos, sin times 0.1 ln(factor) + 1; attention sinks: the logits [s_i, z_h] of a row
               softmaxed together and the sink's column dropped; layer_types (default: odd layers
               full, even ones the sliding window); MLP: router logits h W_r^T + b, the top
               num_experts_per_tok logits softmaxed, per chosen expert gate_up = h G_e + g_e
               (G_e [C][2F]), gate = gate_up[::2] clamped above at 7, up = gate_up[1::2] clamped to
               [-7, 7], (up + 1) * gate * sigmoid(1.702 gate) D_e + d_e
  GPT-NeoX     h = LN1(x); qkv per head [q_h | k_h | v_h]; RoPE on the first rotary_pct of
               each head;  parallel: x + Attn(LN1 x) + MLP(LN2 x), else sequential;
               final_layer_norm;  logits = hidden[L] embed_out^T
  effective    Brunner et al. 2020: row i of A_h projected on the column space of the
               values of the keys it attends, V_h[0..i] or in a sliding-window layer
               V_h[i-W+1..i] (V_h the values of the query head's kv group), pinv
  attribution  Hao et al. 2021, next-token objective at the last position, and
  hta          ||d h^l_j / d h^0_i||_F^2 by autograd Jacobians from h0: families_reference's
               functions on this Model (layers, head, objective_logits)

Usage: decoders_reference.py REQUEST.json > RESULT.json with REQUEST {"model": DIR,
"ids": [...], "steps", "target", "attribution", "hta"}; output hidden [L+1][T][C],
attentions / effective [L][NH][T][T], logits [T][V], attribution / hta when asked, token identity and decomposition (families_reference.answer). families_reference.py hands these families to main() here."""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from families_reference import answer, read_safetensors  # noqa: E402  (the shared answer: attribution, HTA, ...; F32 reader)

torch.set_num_threads(1)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt_neox", "phi3", "olmo2",
            "mixtral", "qwen3_moe", "olmoe", "gpt_oss")


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


ACTS = {"silu": torch.nn.functional.silu, "gelu_pytorch_tanh": gelu_tanh, "gelu_new": gelu_tanh, "gelu": gelu_erf}


def rms(x, w, eps, unit_offset):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + w) if unit_offset else w)


def inv_freq(dim, base, scaling):
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if not scaling:
        return f
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return f / scaling["factor"]
    if kind == "llama3":  # _compute_llama3_parameters
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        out = torch.where(wavelen > old / low, f / factor, f)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return torch.where(medium, smoothed, out)
    if kind == "yarn":  # _compute_yarn_parameters: interpolate the slow channels, extrapolate the fast
        factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
        edge = lambda n: dim * math.log(old / (n * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = edge(scaling.get("beta_fast", 32)), edge(scaling.get("beta_slow", 1))
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        hi = hi + 0.001 if lo == hi else hi
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        return f / factor * ramp + f * (1 - ramp)
    return f


def rope_scale(scaling):
    """cos and sin times yarn's attention factor (HF attention_scaling), else 1"""
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    return scaling.get("attention_factor") or (0.1 * math.log(scaling["factor"]) + 1.0)


def rope(x, pos, freqs, mscale=1.0):
    """x [T][H][D]: the first R = 2 len(freqs) channels rotate (rotate_half), the rest pass."""
    R = 2 * freqs.shape[0]
    ang = pos[:, None].double() * freqs[None, :]  # [T][R/2]
    emb = torch.cat([ang, ang], -1)[:, None, :]  # [T][1][R]
    cos, sin = emb.cos() * mscale, emb.sin() * mscale
    xr, xp = x[..., :R], x[..., R:]
    rot = torch.cat([-xr[..., R // 2:], xr[..., :R // 2]], -1)
    return torch.cat([xr * cos + rot * sin, xp], -1)


class Decoder:
    def __init__(self, d):
        self.cfg = c = json.load(open(d + "/config.json"))
        self.w = read_safetensors(d + "/model.safetensors")
        self.type = c["model_type"]
        self.L, self.NH, self.C = c["num_hidden_layers"], c["num_attention_heads"], c["hidden_size"]
        if self.type == "gpt_neox":
            self.NKV, self.D = self.NH, self.C // self.NH
            self.R = int(self.D * c.get("rotary_pct", 0.25))
            self.freqs = inv_freq(self.R, c.get("rotary_emb_base", c.get("rope_theta", 10000.0)), None)
            self.eps = c.get("layer_norm_eps", 1e-5)
            self.act = ACTS[c.get("hidden_act", "gelu")]
            self.scale = 1.0 / math.sqrt(self.D)
            return
        self.NKV = c.get("num_key_value_heads", self.NH)
        self.D = c.get("head_dim") or self.C // self.NH
        rotary = int(self.D * c.get("partial_rotary_factor", 1.0)) if self.type == "phi3" else self.D
        scaling = c.get("rope_scaling")
        if self.type == "gpt_oss" and "rope_scaling" not in c:  # GptOssConfig's default
            scaling = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                       "original_max_position_embeddings": 4096}
        self.freqs = inv_freq(rotary, c.get("rope_theta", 10000.0), scaling)
        self.mscale = rope_scale(scaling)
        self.eps = c["rms_norm_eps"]
        self.gemma = self.type in ("gemma", "gemma2", "gemma3_text")
        self.sandwich = self.type in ("gemma2", "gemma3_text")  # post-attention / pre- and post-feedforward norms
        self.act = ACTS[c.get("hidden_activation") or c.get("hidden_act", "silu")] if self.gemma else ACTS[c["hidden_act"]]
        q = c.get("query_pre_attn_scalar") if self.sandwich else None
        self.scale = (q if q else self.D) ** -0.5
        self.window = c.get("sliding_window") if self.type in ("mistral", "gemma2", "gemma3_text", "phi3", "mixtral",
                                                               "gpt_oss") else None
        self.attn_cap = c.get("attn_logit_softcapping") if self.sandwich else None
        self.final_cap = c.get("final_logit_softcapping") if self.sandwich else None
        self.tied = c.get("tie_word_embeddings", self.gemma)
        if self.type == "gemma3_text":  # Gemma3TextModel: rotary_emb (global), rotary_emb_local (sliding)
            pattern = c.get("sliding_window_pattern", 6)
            self.layer_types = c.get("layer_types") or [
                "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(self.L)]
            self.local_freqs = inv_freq(self.D, c.get("rope_local_base_freq", 10000.0), None)
        if self.type == "gpt_oss":  # GptOssConfig: layer_types, sliding on even layers by default
            self.layer_types = c.get("layer_types") or [
                "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(self.L)]
        self.experts = c.get("num_local_experts" if self.type in ("mixtral", "gpt_oss") else "num_experts", 0) \
            if self.type in ("mixtral", "qwen3_moe", "olmoe", "gpt_oss") else 0
        self.routes = []

    def sparse(self, l):
        """Qwen3MoeDecoderLayer's choice; Mixtral and OLMoE: every layer"""
        if not self.experts:
            return False
        if self.type != "qwen3_moe":
            return True
        return l not in (self.cfg.get("mlp_only_layers") or []) and (l + 1) % self.cfg.get("decoder_sparse_step", 1) == 0

    def gpt_oss_moe(self, l, h):
        """GptOssMLP: top-k of the router logits softmaxed, stacked experts with interleaved gate / up"""
        b = f"model.layers.{l}.mlp."
        z = self.lin(h, b + "router")
        top, idx = torch.topk(z, self.cfg["num_experts_per_tok"], dim=-1)
        w = torch.softmax(top, -1)
        G, g = self.p(b + "experts.gate_up_proj"), self.p(b + "experts.gate_up_proj_bias")
        D, d = self.p(b + "experts.down_proj"), self.p(b + "experts.down_proj_bias")
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(idx.shape[1]):
                e = int(idx[t, j])
                gate_up = h[t] @ G[e] + g[e]
                gate, up = gate_up[::2].clamp(max=7.0), gate_up[1::2].clamp(-7.0, 7.0)
                out[t] += w[t, j] * (((up + 1) * gate * torch.sigmoid(1.702 * gate)) @ D[e] + d[e])
        self.routes.append({"experts": idx.tolist(), "weights": w.tolist(), "probs": torch.softmax(z, -1).tolist()})
        return out

    def moe(self, l, h):
        """the sparse MoE block: softmax router, top-k, optional renormalisation, experts token by token"""
        c = self.cfg
        if self.type == "gpt_oss":
            return self.gpt_oss_moe(l, h)
        b = f"model.layers.{l}." + ("block_sparse_moe." if self.type == "mixtral" else "mlp.")
        names = ("w1", "w3", "w2") if self.type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        p = torch.softmax(self.lin(h, b + "gate"), -1)
        w, idx = torch.topk(p, c["num_experts_per_tok"], dim=-1)
        if self.type == "mixtral" or c.get("norm_topk_prob", False):
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(idx.shape[1]):
                e = f"{b}experts.{int(idx[t, j])}."
                gate, up, down = (e + n for n in names)
                out[t] += w[t, j] * self.lin(self.act(self.lin(h[t], gate)) * self.lin(h[t], up), down)
        self.routes.append({"experts": idx.tolist(), "weights": w.tolist(), "probs": p.tolist()})
        return out

    def p(self, name):
        return self.w[name]

    def lin(self, x, name, bias=None):
        y = x @ self.p(name + ".weight").t()
        key = name + ".bias"
        return y + self.p(key) if (bias is not False and key in self.w) else y

    def layer_window(self, layer):
        """the sliding window of a layer (HF: every Mistral layer, Gemma 2's even ones, Gemma 3's
        sliding_attention ones) or None"""
        window = getattr(self, "window", None)
        if self.type in ("gemma3_text", "gpt_oss"):
            return window if window and self.layer_types[layer] == "sliding_attention" else None
        return window if window and (self.type != "gemma2" or layer % 2 == 0) else None

    def layer_freqs(self, layer):
        if self.type == "gemma3_text" and self.layer_types[layer] == "sliding_attention":
            return self.local_freqs
        return self.freqs

    def attend(self, q, k, v, layer, scale=None):
        """q [T][NH][D], k, v [T][NKV][D] -> ctx [T][NH*D], P [NH][T][T], V per query head."""
        T = q.shape[0]
        rep = self.NH // self.NKV
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # repeat_kv
        qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        s = qh @ kh.transpose(-1, -2) * self.scale
        if getattr(self, "attn_cap", None):
            s = torch.tanh(s / self.attn_cap) * self.attn_cap
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        masked = j > i
        window = self.layer_window(layer)
        if window:
            masked = masked | (i - j >= window)
        s = s.masked_fill(masked, float("-inf"))
        if self.type == "gpt_oss":  # eager_attention_forward: the sink logit joins each row, then is dropped
            z = self.p(f"model.layers.{layer}.self_attn.sinks").view(-1, 1, 1).expand(-1, T, 1)
            P = torch.softmax(torch.cat([s, z], -1), -1)[..., :-1]
        else:
            P = torch.softmax(s, -1)
        Pu = P if scale is None else P * scale  # attribution: alpha A
        return (Pu @ vh).transpose(0, 1).reshape(T, -1), P, vh

    def block(self, l, x, pos, scale=None):
        if self.type == "gpt_neox":
            return self.neox_block(l, x, pos, scale)
        if self.type == "olmo2":
            return self.olmo2_block(l, x, pos, scale)
        b = f"model.layers.{l}."
        T = x.shape[0]
        off = self.gemma
        h = rms(x, self.p(b + "input_layernorm.weight"), self.eps, off)
        if self.type == "phi3":  # Phi3Attention: qkv[..., :query_pos], then NKV D for k, the rest v
            qkv = self.lin(h, b + "self_attn.qkv_proj")
            nq, nk = self.NH * self.D, self.NKV * self.D
            q, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
        else:
            q, k, v = (self.lin(h, b + "self_attn." + n + "_proj") for n in "qkv")
        q, k, v = q.reshape(T, self.NH, self.D), k.reshape(T, self.NKV, self.D), v.reshape(T, self.NKV, self.D)
        if self.type in ("qwen3", "qwen3_moe", "gemma3_text"):  # per head; Gemma3RMSNorm's gain is 1 + w
            q = rms(q, self.p(b + "self_attn.q_norm.weight"), self.eps, off)
            k = rms(k, self.p(b + "self_attn.k_norm.weight"), self.eps, off)
        if self.type == "olmoe":  # OlmoeAttention: the norms over the whole projections
            q = rms(q.reshape(T, -1), self.p(b + "self_attn.q_norm.weight"), self.eps, False).view(T, self.NH, self.D)
            k = rms(k.reshape(T, -1), self.p(b + "self_attn.k_norm.weight"), self.eps, False).view(T, self.NKV, self.D)
        freqs = self.layer_freqs(l)
        q, k = rope(q, pos, freqs, self.mscale), rope(k, pos, freqs, self.mscale)
        ctx, P, V = self.attend(q, k, v, l, scale)
        o = self.lin(ctx, b + "self_attn.o_proj")
        if self.sandwich:
            o = rms(o, self.p(b + "post_attention_layernorm.weight"), self.eps, True)
            h = rms(x + o, self.p(b + "pre_feedforward_layernorm.weight"), self.eps, True)
        else:
            h = rms(x + o, self.p(b + "post_attention_layernorm.weight"), self.eps, off)
        x = x + o
        if self.type == "phi3":  # Phi3MLP: gate, up = gate_up_proj(h).chunk(2)
            gate, up = self.lin(h, b + "mlp.gate_up_proj").chunk(2, dim=-1)
            f = self.lin(self.act(gate) * up, b + "mlp.down_proj")
        elif self.sparse(l):
            f = self.moe(l, h)
        else:
            if self.experts:
                self.routes.append(None)
            f = self.lin(self.act(self.lin(h, b + "mlp.gate_proj")) * self.lin(h, b + "mlp.up_proj"), b + "mlp.down_proj")
        if self.sandwich:
            f = rms(f, self.p(b + "post_feedforward_layernorm.weight"), self.eps, True)
        return x + f, P, V

    def olmo2_block(self, l, x, pos, scale=None):
        """Olmo2DecoderLayer: post-norms only, q_norm / k_norm over the whole projections."""
        b = f"model.layers.{l}."
        T = x.shape[0]
        q = rms(self.lin(x, b + "self_attn.q_proj"), self.p(b + "self_attn.q_norm.weight"), self.eps, False)
        k = rms(self.lin(x, b + "self_attn.k_proj"), self.p(b + "self_attn.k_norm.weight"), self.eps, False)
        v = self.lin(x, b + "self_attn.v_proj")
        q, k, v = q.view(T, self.NH, self.D), k.view(T, self.NKV, self.D), v.view(T, self.NKV, self.D)
        q, k = rope(q, pos, self.freqs), rope(k, pos, self.freqs)
        ctx, P, V = self.attend(q, k, v, l, scale)
        x = x + rms(self.lin(ctx, b + "self_attn.o_proj"), self.p(b + "post_attention_layernorm.weight"), self.eps, False)
        f = self.lin(self.act(self.lin(x, b + "mlp.gate_proj")) * self.lin(x, b + "mlp.up_proj"), b + "mlp.down_proj")
        return x + rms(f, self.p(b + "post_feedforward_layernorm.weight"), self.eps, False), P, V

    def neox_block(self, l, x, pos, scale=None):
        b = f"gpt_neox.layers.{l}."
        T, D = x.shape[0], self.D
        ln = lambda z, n: torch.nn.functional.layer_norm(z, (self.C,), self.p(b + n + ".weight"),
                                                         self.p(b + n + ".bias"), self.eps)
        qkv = self.lin(ln(x, "input_layernorm"), b + "attention.query_key_value").view(T, self.NH, 3 * D)
        q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]
        q, k = rope(q, pos, self.freqs), rope(k, pos, self.freqs)
        ctx, P, V = self.attend(q, k, v, l, scale)
        a = self.lin(ctx, b + "attention.dense")
        mlp = lambda z: self.lin(self.act(self.lin(z, b + "mlp.dense_h_to_4h")), b + "mlp.dense_4h_to_h")
        if self.cfg.get("use_parallel_residual", True):
            return x + a + mlp(ln(x, "post_attention_layernorm")), P, V
        x = x + a
        return x + mlp(ln(x, "post_attention_layernorm")), P, V

    def embed(self, ids):
        t = torch.tensor(ids)
        if self.type == "gpt_neox":
            return self.p("gpt_neox.embed_in.weight")[t]
        x = self.p("model.embed_tokens.weight")[t]
        if self.gemma:
            x = x * torch.tensor(self.C ** 0.5, dtype=torch.float32).double()  # normalizer in the model dtype
        return x

    def layers(self, x, scales=None):
        """hidden [L+1] (the last after the final norm) and probabilities from
        h0 = x; the values per query head go to self.values (families_reference's
        Model interface, so its attribution and hta run on decoders too)."""
        pos = torch.arange(x.shape[0])
        hidden, probs, self.values, self.routes = [x], [], [], []
        for l in range(self.L):
            x, P, V = self.block(l, x, pos, scales[l] if scales else None)
            hidden.append(x)
            probs.append(P)
            self.values.append(V)
        if self.type == "gpt_neox":
            hidden[-1] = torch.nn.functional.layer_norm(x, (self.C,), self.p("gpt_neox.final_layer_norm.weight"),
                                                        self.p("gpt_neox.final_layer_norm.bias"), self.eps)
        else:
            hidden[-1] = rms(x, self.p("model.norm.weight"), self.eps, self.gemma)
        return hidden, probs

    def head(self, hL):
        if self.type == "gpt_neox":
            w = self.p("embed_out.weight")
        else:
            w = self.p("model.embed_tokens.weight") if self.tied else self.p("lm_head.weight")
        logits = hL @ w.t()
        if getattr(self, "final_cap", None):
            logits = torch.tanh(logits / self.final_cap) * self.final_cap
        return logits

    def objective_logits(self, logits):
        return logits[-1]  # next token after the last position


def effective(probs, values, windows):
    out = []
    for A, V, W in zip(probs, values, windows):  # [NH][T][T], [NH][T][D], sliding window or None
        E = torch.zeros_like(A)
        for h in range(A.shape[0]):
            for i in range(A.shape[1]):
                lo = max(0, i - W + 1) if W else 0  # the keys row i attends
                Vi = V[h, lo:i + 1]
                E[h, i, lo:i + 1] = A[h, i, lo:i + 1] @ (Vi @ torch.linalg.pinv(Vi))
        out.append(E.tolist())
    return out


def main():
    req = json.load(open(sys.argv[1]))
    m = Decoder(req["model"])
    h0 = m.embed(req["ids"])
    with torch.no_grad():
        hidden, probs = m.layers(h0)
        routes = m.routes  # the answer's attribution runs the layers again
        logits = m.head(hidden[-1])
    res = answer(req, m, h0, hidden, probs, logits, effective(probs, m.values, [m.layer_window(l) for l in range(m.L)]))
    if getattr(m, "experts", 0):
        res["router"] = routes
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
