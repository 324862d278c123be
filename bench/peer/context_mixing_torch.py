#!/usr/bin/python3
"""context_mixing_torch.py - the PyTorch counterpart of bench/context_mixing.c:
attention rollout, ALTI, GlobEnc, value zeroing and DecompX of one BERT
sequence as the authors' released code computes them, in float32.

  context_mixing_torch.py --model DIR [--T 128] [--threads 2] [--reps 3] [--vz-reps 1]
                          [--warmup 1] [--seed 42]
  context_mixing_torch.py --decompx FILE --model CLASSIFIER [--T 128] [--threads 2]
                          [--reps 1] [--seed 42]

The forward is bench/peer/torch_forward.py's BERT (the same model.safetensors,
the same xorshift32 token ids as the lensd driver) keeping what the methods
read; the methods are tests/reference/context_mixing_reference.py's functions
(written from samiraabnar/attention_flow, mt-upc/transformer-contributions,
mohsenfayyaz/GlobEnc: the [NH][T][T][C] per-head weighted vectors and the
LayerNorm as a C x C map, as the released code builds them), run here on
float32 tensors. Value zeroing follows hmohebbi/ValueZeroing: per layer,
the layer rerun once per token with that token's value vectors zeroed (T
layer passes, one at a time), cosine distances to the unchanged output.
Prints one JSON line with the medians (ms).

--decompx: DecompX on a BertForSequenceClassification checkpoint as
mohsenfayyaz/DecompX's src/modeling_bert.py computes what lensd serves, with
the reference's functions (written from that code: the [NH][T][T][C]
weighted vectors, the absdot biases, the frozen LayerNorms, GeLU_ZO,
ffn_decomposer's einsums over T² vectors) on float32 tensors: each layer's
own decomposition (aggregation None), the propagated one (aggregation
"vector"), then the pooler (tanh ZO) and classifier decomposers. The
forward is kept once for both, as lensd does. Timed --reps times after one
untimed forward; the last run's contributions [L][T][T], rollout [L][T][T]
and classifier [T][K] go to FILE as float32 (bench/context_mixing
--decompx's layout)."""
import argparse
import json
import math
import os
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))
from torch_forward import load_model, load_safetensors, xorshift32_ids  # noqa: E402
import context_mixing_reference as ref  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--T", type=int, default=128)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=3)
p.add_argument("--vz-reps", type=int, default=1)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--seed", type=int, default=42)
p.add_argument("--decompx", metavar="FILE")
a = p.parse_args()
torch.set_num_threads(a.threads)  # after the reference's import, which sets its own
torch.set_grad_enabled(False)


def attention(att, x, zero=None):
    """probs [NH][T][T], v [NH][T][DK] (bias included), the layer's LN1 input; v[:, zero] = 0 when given."""
    T = x.shape[0]
    heads = lambda t: t.view(T, att.NH, att.DK).transpose(0, 1)
    q, k, v = heads(att.query(x)), heads(att.key(x)), heads(att.value(x))
    if zero is not None:
        v = v.clone()
        v[:, zero] = 0  # customized_modeling_bert: value_layer[:, :, zero_value_index] = 0
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(att.DK), -1)
    return probs, v, x + att.dense((probs @ v).transpose(0, 1).reshape(T, -1))


def layer_out(layer, pre_ln):
    """The layer's output, LN2's input, the FFN's pre-activation and activation."""
    a_ = layer.attention.ln(pre_ln)
    pre_act = layer.intermediate(a_)
    post_act = F.gelu(pre_act)
    pre_ln2 = a_ + layer.output(post_act)
    return layer.ln(pre_ln2), pre_ln2, pre_act, post_act


def forward_parts(model, ids):
    """The forward keeping every layer's Parts (what the reference's methods read)."""
    T = ids.shape[0]
    x = model.ln(model.word(ids) + model.position(torch.arange(T)) + model.token_type.weight[0])
    layers = []
    for layer in model.layers:
        att = layer.attention
        probs, v, pre_ln = attention(att, x)
        out, pre_ln2, pre_act, post_act = layer_out(layer, pre_ln)
        parts = ref.Parts()
        parts.x, parts.P, parts.V, parts.out = x, probs, v, out
        parts.Wo, parts.bo = att.dense.weight, att.dense.bias
        parts.Wv, parts.bv = att.value.weight, att.value.bias
        parts.W1, parts.b1 = layer.intermediate.weight, layer.intermediate.bias
        parts.W2, parts.b2 = layer.output.weight, layer.output.bias
        parts.pre_act, parts.post_act = pre_act, post_act
        parts.ln1, parts.ln2 = (att.ln.weight, att.ln.bias), (layer.ln.weight, layer.ln.bias)
        parts.pre_ln, parts.pre_ln2, parts.post, parts.eps = pre_ln, pre_ln2, True, att.ln.eps
        layers.append(parts)
        x = out
    return layers


def rollout(model, ids):
    layers = forward_parts(model, ids)
    return ref.compute_joint_attention(torch.stack([q.P.mean(0) for q in layers]), True)


def decomposition(fn):
    def run(model, ids):
        layers = forward_parts(model, ids)
        return ref.compute_joint_attention(torch.stack([fn(q, True) for q in layers]), False)
    return run


def value_zeroing(model, ids):
    layers = forward_parts(model, ids)
    T, scores = ids.shape[0], []
    for layer, parts in zip(model.layers, layers):
        score = torch.zeros(T, T)
        for t in range(T):
            h = layer_out(layer, attention(layer.attention, parts.x, zero=t)[2])[0]
            score[:, t] = 1 - F.cosine_similarity(h, parts.out, dim=-1, eps=0)
        scores.append(score / score.sum(-1, keepdim=True))
    return ref.compute_joint_attention(torch.stack(scores), False)


def decompx(model, ids, head):
    """paper-code DecompX: the layers' own matrices, the propagated vectors' norms, the classifier's [T][K]."""
    layers = forward_parts(model, ids)
    own = torch.stack([torch.norm(ref.decompx_layer(q, None, True), dim=-1) for q in layers])
    vectors, rolled = None, []
    for q in layers:
        vectors = ref.decompx_layer(q, vectors, True)
        rolled.append(torch.norm(vectors, dim=-1))
    return own, torch.stack(rolled), ref.decompx_classifier(head, vectors, layers[-1].out, True)


def forward(model, ids):
    return model(ids[None])


def median_ms(fn, model, ids, reps, warmup):
    times = []
    for r in range(-warmup, reps):
        t0 = time.perf_counter()
        fn(model, ids)
        if r >= 0:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times) if times else -1


model, cfg = load_model(a.model)
T = min(a.T, cfg["max_position_embeddings"])
ids = torch.from_numpy(xorshift32_ids(a.seed, T, cfg["vocab_size"]))
if a.decompx:
    tensors = load_safetensors(os.path.join(a.model, "model.safetensors"))
    head = types.SimpleNamespace(type="bert", p=tensors.__getitem__)  # what ref.decompx_classifier reads
    forward(model, ids)  # pages the weights in
    fwd_ms = median_ms(forward, model, ids, max(a.reps, 3), 1)
    times = []
    for r in range(a.reps):
        t0 = time.perf_counter()
        out = decompx(model, ids, head)
        times.append((time.perf_counter() - t0) * 1e3)
    with open(a.decompx, "wb") as f:
        for t in out:
            f.write(t.contiguous().numpy().astype("float32").tobytes())
    ms = statistics.median(times)
    print(json.dumps({"impl": "torch", "method": "decompx", "T": T, "C": cfg["hidden_size"],
                      "L": cfg["num_hidden_layers"], "K": out[2].shape[1], "threads": a.threads, "reps": a.reps,
                      "forward_ms": round(fwd_ms, 2), "decompx_ms": round(ms, 2),
                      "decompx_x_forward": round(ms / fwd_ms, 1)}))
    sys.exit(0)
timed = {"forward": forward, "rollout": rollout, "alti": decomposition(ref.alti_layer),
         "globenc": decomposition(ref.globenc_layer)}
times = {k: [] for k in timed}
forward(model, ids)  # pages the weights in, whatever --warmup (one ALTI warm-up would take minutes)
for r in range(-a.warmup, a.reps):  # interleaved, as the lensd driver
    for k, fn in timed.items():
        t0 = time.perf_counter()
        fn(model, ids)
        if r >= 0:
            times[k].append((time.perf_counter() - t0) * 1e3)
med = {k: statistics.median(v) for k, v in times.items()}
vz = median_ms(value_zeroing, model, ids, a.vz_reps, 0) if a.vz_reps > 0 else -1
print(json.dumps({"impl": "torch", "T": T, "C": cfg["hidden_size"], "L": cfg["num_hidden_layers"],
                  "threads": a.threads, "reps": a.reps, "vz_reps": a.vz_reps,
                  **{f"{k}_ms": round(v, 2) for k, v in med.items()}, "value_zeroing_ms": round(vz, 2),
                  **{f"{k}_x_forward": round(med[k] / med["forward"], 3) for k in ("rollout", "alti", "globenc")}}))
