#!/usr/bin/python3
"""reference_forward.py - an independent PyTorch forward pass for the shared
checkpoints, and the fixtures tests/test_models.c compares lensd against.

Implements, from the Hugging Face definitions and nothing of lensd:
  BertModel                       x0 = LN(E_word[id] + E_pos[t] + E_type[tt])
                                  a  = LN(x + Attn(x)); x' = LN(a + W2 gelu(W1 a))
                                  (post-LN, exact erf GELU, scale 1/sqrt(DK),
                                  padded keys get -10000 added to their scores)
  BertForSequenceClassification   logits = W_c tanh(W_p x_L[0] + b_p) + b_c
  BertForMaskedLM                 logits = LN(gelu(W_t x_L + b_t)) E_word^T + bias
  GPT2LMHeadModel                 a = x + Attn(LN1(x)); x' = a + W2 gelu_new(W1 LN2(a))
                                  (pre-LN, causal, Conv1D weights [in][out],
                                  c_attn = [W_q | W_k | W_v], logits = ln_f(x_L) wte^T)

Before writing anything it checks itself against each model's golden.json
(outputs written by the training code with PyTorch) and stops if the largest
difference is over 1e-4. It then checks that one padded batch (BERT: -10000
on padded keys; GPT-2: right padding) gives what one sequence at a time gives
(1e-5), and writes tests/fixtures/forward_<model>.json with, per example,
input_ids, token_type_ids, hidden_states [L+1][T][C] (HF output_hidden_states:
0 = embedding output, k = output of block k, GPT-2's last entry after ln_f),
attentions [L][NH][T][T], values [L][T][NH*DV] (x W_V + b_V before the split
into heads), pooled [C] and logits [K] for the classifier, and for the LM
models logits_first_8 [T][8] plus last_logits [V] (full row of the last
position).

Usage (repo root):  /usr/bin/python3 tests/reference/reference_forward.py [SHARED_DIR]
Needs only torch and numpy (no transformers / safetensors packages)."""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

torch.set_num_threads(1)
torch.set_grad_enabled(False)

MODELS = ["bert-tiny-sst2", "bert-tiny-mlm", "gpt2-tiny-wikitext"]
GOLDEN_TOL = 1e-4  # the bar the issue sets for lensd vs PyTorch
BATCH_TOL = 1e-5   # padded batch vs one at a time: same arithmetic up to GEMM blocking


# ------------------------------------------------------------ safetensors

def read_safetensors(path):
    """name -> float32 tensor. Format: u64 LE header size, JSON header, data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: {name}: dtype {info['dtype']} not handled (F32 only)")
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if end - begin != 4 * int(np.prod(shape, dtype=np.int64)):
            raise SystemExit(f"{path}: {name}: byte size {end - begin} does not match shape {shape}")
        arr = np.frombuffer(data, dtype="<f4", count=(end - begin) // 4, offset=begin)
        out[name] = torch.from_numpy(arr.copy()).reshape(shape)
    return out


# ------------------------------------------------------------ ops

def layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):  # HF "gelu_new"
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def linear(x, W, b):
    """nn.Linear: W [out][in]."""
    return x @ W.t() + b


def conv1d(x, W, b):
    """GPT-2 Conv1D: W [in][out]."""
    return x @ W + b


def attention(q, k, v, nh, mask_add):
    """q, k, v [B][T][NH*D]; mask_add [B][1|T][T] additive. Returns context [B][T][NH*DV], probs [B][NH][T][T]."""
    B, T, _ = q.shape
    split = lambda t: t.view(B, T, nh, -1).permute(0, 2, 1, 3)  # [B][NH][T][D]
    qh, kh, vh = split(q), split(k), split(v)
    scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(qh.shape[-1])
    scores = scores + mask_add[:, None, :, :]
    probs = torch.softmax(scores, dim=-1)
    ctx = (probs @ vh).permute(0, 2, 1, 3).reshape(B, T, -1)
    return ctx, probs


# ------------------------------------------------------------ models

class Bert:
    def __init__(self, cfg, w):
        self.cfg, self.w = cfg, w
        self.arch = cfg["architectures"][0]
        self.L = cfg["num_hidden_layers"]
        self.nh = cfg["num_attention_heads"]
        self.eps = cfg["layer_norm_eps"]
        assert cfg.get("hidden_act", "gelu") == "gelu", cfg.get("hidden_act")
        assert cfg.get("position_embedding_type", "absolute") == "absolute"
        p = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""
        self.p = p
        need = [p + "embeddings." + n for n in ("word_embeddings.weight", "position_embeddings.weight",
                                                 "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")]
        for l in range(self.L):
            for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                      "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"):
                need += [f"{p}encoder.layer.{l}.{n}.weight", f"{p}encoder.layer.{l}.{n}.bias"]
        if self.arch == "BertForSequenceClassification":
            need += [p + "pooler.dense.weight", p + "pooler.dense.bias", "classifier.weight", "classifier.bias"]
        elif self.arch == "BertForMaskedLM":
            need += ["cls.predictions.bias"] + [f"cls.predictions.transform.{n}.{s}" for n in ("dense", "LayerNorm")
                                                for s in ("weight", "bias")]
        check_names(w, need)

    def forward(self, ids, type_ids, mask):
        """ids, type_ids, mask: [B][T] int64 (mask 1 = real token)."""
        w, p, eps = self.w, self.p, self.eps
        B, T = ids.shape
        pos = torch.arange(T)
        x = (w[p + "embeddings.word_embeddings.weight"][ids] + w[p + "embeddings.position_embeddings.weight"][pos][None]
             + w[p + "embeddings.token_type_embeddings.weight"][type_ids])
        x = layer_norm(x, w[p + "embeddings.LayerNorm.weight"], w[p + "embeddings.LayerNorm.bias"], eps)
        mask_add = ((1.0 - mask.float()) * -10000.0)[:, None, :]  # [B][1][T], HF extended mask
        hidden, attns, values = [x], [], []
        for l in range(self.L):
            g = lambda n: (w[f"{p}encoder.layer.{l}.{n}.weight"], w[f"{p}encoder.layer.{l}.{n}.bias"])
            q = linear(x, *g("attention.self.query"))
            k = linear(x, *g("attention.self.key"))
            v = linear(x, *g("attention.self.value"))
            ctx, probs = attention(q, k, v, self.nh, mask_add)
            a = layer_norm(x + linear(ctx, *g("attention.output.dense")), *g("attention.output.LayerNorm"), eps)
            f = linear(gelu_erf(linear(a, *g("intermediate.dense"))), *g("output.dense"))
            x = layer_norm(a + f, *g("output.LayerNorm"), eps)
            hidden.append(x), attns.append(probs), values.append(v)
        out = {"hidden_states": hidden, "attentions": attns, "values": values}
        if self.arch == "BertForSequenceClassification":
            pooled = torch.tanh(linear(x[:, 0], w[p + "pooler.dense.weight"], w[p + "pooler.dense.bias"]))
            out["pooled"] = pooled
            out["logits"] = linear(pooled, w["classifier.weight"], w["classifier.bias"])
        elif self.arch == "BertForMaskedLM":
            t = gelu_erf(linear(x, w["cls.predictions.transform.dense.weight"], w["cls.predictions.transform.dense.bias"]))
            t = layer_norm(t, w["cls.predictions.transform.LayerNorm.weight"], w["cls.predictions.transform.LayerNorm.bias"], eps)
            out["logits"] = t @ w[p + "embeddings.word_embeddings.weight"].t() + w["cls.predictions.bias"]
        return out


class GPT2:
    def __init__(self, cfg, w):
        self.cfg, self.w = cfg, w
        self.L = cfg["n_layer"]
        self.nh = cfg["n_head"]
        self.eps = cfg["layer_norm_epsilon"]
        assert cfg.get("activation_function", "gelu_new") == "gelu_new", cfg.get("activation_function")
        assert cfg.get("scale_attn_weights", True) and not cfg.get("scale_attn_by_inverse_layer_idx", False)
        assert not cfg.get("reorder_and_upcast_attn", False)
        p = "transformer." if "transformer.wte.weight" in w else ""
        self.p = p
        need = [p + "wte.weight", p + "wpe.weight", p + "ln_f.weight", p + "ln_f.bias"]
        for l in range(self.L):
            for n in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
                need += [f"{p}h.{l}.{n}.weight", f"{p}h.{l}.{n}.bias"]
        check_names(w, need)

    def forward(self, ids, type_ids, mask):
        """ids, mask: [B][T] (right padding); type_ids unused."""
        w, p, eps = self.w, self.p, self.eps
        B, T = ids.shape
        C = w[p + "wte.weight"].shape[1]
        x = w[p + "wte.weight"][ids] + w[p + "wpe.weight"][torch.arange(T)][None]
        neg = torch.finfo(torch.float32).min
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))[None] & mask.bool()[:, None, :]  # [B][T][T]
        mask_add = torch.where(allowed, torch.tensor(0.0), torch.tensor(neg))
        hidden, attns, values = [x], [], []
        for l in range(self.L):
            g = lambda n: (w[f"{p}h.{l}.{n}.weight"], w[f"{p}h.{l}.{n}.bias"])
            qkv = conv1d(layer_norm(x, *g("ln_1"), eps), *g("attn.c_attn"))
            q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
            ctx, probs = attention(q, k, v, self.nh, mask_add)
            # masked entries: exp(min - max) underflows to exactly 0, as causality requires
            a = x + conv1d(ctx, *g("attn.c_proj"))
            x = a + conv1d(gelu_tanh(conv1d(layer_norm(a, *g("ln_2"), eps), *g("mlp.c_fc"))), *g("mlp.c_proj"))
            hidden.append(x), attns.append(probs), values.append(v.contiguous())
        hidden[-1] = layer_norm(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
        logits = hidden[-1] @ w[p + "wte.weight"].t()
        return {"hidden_states": hidden, "attentions": attns, "values": values, "logits": logits}


def check_names(w, need):
    missing = [n for n in need if n not in w]
    if missing:
        raise SystemExit(f"missing tensors: {missing[:5]}")
    extra = [n for n in w if n not in need]
    if extra:
        raise SystemExit(f"unexpected tensors: {extra[:5]}")


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    return (GPT2 if cfg["model_type"] == "gpt2" else Bert)(cfg, w), cfg


def run_one(model, ids, type_ids):
    t_ids = torch.tensor([ids], dtype=torch.int64)
    t_tt = torch.tensor([type_ids], dtype=torch.int64)
    out = model.forward(t_ids, t_tt, torch.ones_like(t_ids))
    return {k: ([t[0] for t in v] if isinstance(v, list) else v[0]) for k, v in out.items()}


# ------------------------------------------------------------ golden check

def maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def check_golden(name, golden, outs):
    """Largest |ours - golden| over every output golden.json records."""
    worst = {}
    def note(what, d):
        worst[what] = max(worst.get(what, 0.0), d)
    for ex, out in zip(golden["examples"], outs):
        note("last_hidden_state", maxdiff(out["hidden_states"][-1].numpy(), ex["last_hidden_state"]))
        logits = out["logits"].double()
        if "pooled_output" in ex:
            note("pooled_output", maxdiff(out["pooled"].numpy(), ex["pooled_output"]))
            note("logits", maxdiff(logits.numpy(), ex["logits"]))
            note("probabilities", maxdiff(torch.softmax(logits, -1).numpy(), ex["probabilities"]))
            assert int(torch.argmax(logits)) == ex["predicted_label_id"], f"{name}: predicted label differs"
        if "per_position" in ex:
            pp = ex["per_position"]
            note("logits_first_8_ids", maxdiff(logits[:, :8].numpy(), pp["logits_first_8_ids"]))
            note("max_logit", maxdiff(logits.max(-1).values.numpy(), pp["max_logit"]))
            note("logsumexp", maxdiff(torch.logsumexp(logits, -1).numpy(), pp["logsumexp"]))
            assert logits.argmax(-1).tolist() == pp["argmax_id"], f"{name}: argmax differs"
            ids = ex["input_ids"]
            if "logit_of_input_id" in pp:
                note("logit_of_input_id", maxdiff([logits[t, i] for t, i in enumerate(ids)], pp["logit_of_input_id"]))
            if "logit_of_next_input_id" in pp:
                note("logit_of_next_input_id",
                     maxdiff([logits[t, ids[t + 1]] for t in range(len(ids) - 1)], pp["logit_of_next_input_id"]))
        if "last_position_logits_full" in ex:
            note("last_position_logits_full", maxdiff(logits[-1].numpy(), ex["last_position_logits_full"]))
        if "mask_logits_full" in ex:
            for pos, row in zip(ex["mask_positions"], ex["mask_logits_full"]):
                note("mask_logits_full", maxdiff(logits[pos].numpy(), row))
    total = max(worst.values())
    print(f"{name}: reference vs golden.json max |diff| {total:.3g} "
          + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
    if not total <= GOLDEN_TOL:
        raise SystemExit(f"{name}: reference disagrees with golden.json by {total:.3g} > {GOLDEN_TOL}")
    return total


# ------------------------------------------------------------ batch check

def check_batch(name, model, examples, outs):
    """All examples in one right-padded batch must give the single-sequence results."""
    T = max(len(e["input_ids"]) for e in examples)
    pad = lambda v: v + [0] * (T - len(v))
    ids = torch.tensor([pad(e["input_ids"]) for e in examples], dtype=torch.int64)
    tt = torch.tensor([pad(e["token_type_ids"]) for e in examples], dtype=torch.int64)
    mask = torch.tensor([pad([1] * len(e["input_ids"])) for e in examples], dtype=torch.int64)
    batch = model.forward(ids, tt, mask)
    worst = 0.0
    for s, (e, out) in enumerate(zip(examples, outs)):
        n = len(e["input_ids"])
        for l, h in enumerate(out["hidden_states"]):
            worst = max(worst, maxdiff(batch["hidden_states"][l][s, :n], h))
        for l, a in enumerate(out["attentions"]):
            worst = max(worst, maxdiff(batch["attentions"][l][s, :, :n, :n], a))
            padded = batch["attentions"][l][s, :, :n, n:]
            assert padded.numel() == 0 or float(padded.abs().max()) < 1e-30, "padded key got weight"
        for l, v in enumerate(out["values"]):
            worst = max(worst, maxdiff(batch["values"][l][s, :n], v))
        if "pooled" in out:
            worst = max(worst, maxdiff(batch["pooled"][s], out["pooled"]))
            worst = max(worst, maxdiff(batch["logits"][s], out["logits"]))
        elif "logits" in out:
            worst = max(worst, maxdiff(batch["logits"][s, :n], out["logits"]))
    print(f"{name}: padded batch of {len(examples)} vs one at a time: max |diff| {worst:.3g}")
    if not worst <= BATCH_TOL:
        raise SystemExit(f"{name}: padded batch differs from single sequences by {worst:.3g} > {BATCH_TOL}")


# ------------------------------------------------------------ fixtures

class F32:
    """A float32 array written as shortest round-trip decimals."""
    def __init__(self, t):
        self.a = np.asarray(t.detach().numpy() if isinstance(t, torch.Tensor) else t, dtype=np.float32)


def to_json(o):
    if isinstance(o, F32):
        return nested(o.a)
    if isinstance(o, dict):
        return "{" + ", ".join(json.dumps(k) + ": " + to_json(v) for k, v in o.items()) + "}"
    if isinstance(o, list):
        return "[" + ", ".join(to_json(v) for v in o) + "]"
    return json.dumps(o)


def nested(a):
    if a.ndim == 0:
        s = str(np.float32(a))  # numpy 1.24: shortest string that round-trips the float32
        assert np.isfinite(a) and np.float32(float(s)) == a
        return s
    if a.ndim == 1:
        return "[" + ",".join(nested(x) for x in a) + "]"
    return "[" + ",\n".join(nested(x) for x in a) + "]"


def fixture_example(label, e, out, is_lm):
    ex = {"name": label, "input_ids": e["input_ids"], "token_type_ids": e["token_type_ids"],
          "hidden_states": F32(torch.stack(out["hidden_states"])),
          "attentions": F32(torch.stack(out["attentions"])),
          "values": F32(torch.stack(out["values"]))}
    if "pooled" in out:
        ex["pooled"] = F32(out["pooled"])
        ex["logits"] = F32(out["logits"])
    elif is_lm:
        ex["logits_first_8"] = F32(out["logits"][:, :8])
        ex["last_logits"] = F32(out["logits"][-1])
    return ex


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(repo), "shared")
    out_dir = os.path.join(repo, "tests", "fixtures")
    os.makedirs(out_dir, exist_ok=True)
    for name in MODELS:
        model_dir = os.path.join(shared, "models", name)
        model, cfg = load(model_dir)
        with open(os.path.join(model_dir, "golden.json")) as f:
            golden = json.load(f)
        is_bert = cfg["model_type"] == "bert"
        examples = []
        for i, g in enumerate(golden["examples"]):
            ids = g["input_ids"]
            examples.append({"name": f"golden{i}", "input_ids": ids,
                             "token_type_ids": g.get("token_type_ids") or [0] * len(ids)})
        outs = [run_one(model, e["input_ids"], e["token_type_ids"]) for e in examples]
        check_golden(name, golden, outs)
        if is_bert:
            # [CLS] a [SEP] b [SEP] from the first two golden inputs, segment 1 on "b [SEP]"
            a, b = examples[0]["input_ids"][1:-1], examples[1]["input_ids"][1:-1]
            cls, sep = examples[0]["input_ids"][0], examples[0]["input_ids"][-1]
            ids = [cls] + a + [sep] + b + [sep]
            pair = {"name": "pair", "input_ids": ids, "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1)}
            examples.append(pair)
            outs.append(run_one(model, pair["input_ids"], pair["token_type_ids"]))
        check_batch(name, model, examples, outs)
        is_lm = cfg["architectures"][0] in ("BertForMaskedLM", "GPT2LMHeadModel")
        fixture = {
            "command": "python3 tests/reference/reference_forward.py ../shared",
            "model": name,
            "architecture": cfg["architectures"][0],
            "generated_by": "tests/reference/reference_forward.py (PyTorch %s, float32, eval)" % torch.__version__,
            "layout": "hidden_states [L+1][T][C]; attentions [L][NH][T][T]; values [L][T][NH*DV]; "
                      "logits [K] (classifier) or logits_first_8 [T][8] + last_logits [V] (LM)",
            "n_layers": model.L, "n_heads": model.nh,
            "examples": [fixture_example(e["name"], e, o, is_lm) for e, o in zip(examples, outs)],
        }
        path = os.path.join(out_dir, f"forward_{name}.json")
        with open(path, "w") as f:
            f.write(to_json(fixture) + "\n")
        print(f"{name}: wrote {os.path.relpath(path, repo)} ({os.path.getsize(path)} bytes, {len(examples)} examples)")


if __name__ == "__main__":
    main()
