"""PyTorch peer of the training benchmark (bench/train.c).

The same model, batches and optimizer as the lensd driver, in plain torch:
a BertForSequenceClassification of the demo-sst2 shape written with
nn.Embedding / nn.Linear / nn.LayerNorm (post-LN, erf GELU, softmax
attention, tanh pooler on [CLS], no dropout), weights N(0, 0.02), biases 0,
LayerNorm 1 / 0; AdamW (lr 1e-3 constant, betas 0.9 / 0.999, eps 1e-8,
weight decay 0.01 on every tensor except biases and LayerNorm, as
lens_trainer_step), gradient clipping to global norm 1.0, mean cross-entropy.

Batches: read from the file bench/train.c --dump-batches wrote (int32: n_seqs,
batch, then per sequence length, label, ids), so both train on the same
sequences in the same order. PyTorch needs a rectangular batch: each batch is
right-padded to its longest sequence with id 0 and the padded keys get -10000
added to their attention scores (HF's extended mask); padded rows are
computed but do not reach the loss. tokens_per_s counts real tokens (as
lensd); padded_tokens_per_s counts the rows computed.

  train_torch.py --batches FILE [--vocab 8000] [--steps 300] [--warmup 10] [--threads 2]

torch.set_num_threads(n); prints one JSON line (tokens_per_s, maxrss_kib, ...)."""
import argparse
import json
import math
import resource
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, C, NH, FF):
        super().__init__()
        self.nh = NH
        self.query, self.key, self.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.attn_out, self.ln_attn = nn.Linear(C, C), nn.LayerNorm(C, eps=1e-12)
        self.ff_in, self.ff_out, self.ln_ff = nn.Linear(C, FF), nn.Linear(FF, C), nn.LayerNorm(C, eps=1e-12)

    def forward(self, x, mask_add):
        B, T, C = x.shape
        split = lambda t: t.view(B, T, self.nh, -1).transpose(1, 2)  # [B][NH][T][D]
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask_add  # mask_add [B][1][1][T]
        ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        a = self.ln_attn(x + self.attn_out(ctx))
        return self.ln_ff(a + self.ff_out(F.gelu(self.ff_in(a))))


class BertClassifier(nn.Module):
    def __init__(self, V, C, L, NH, FF, P, K):
        super().__init__()
        self.word, self.pos, self.token_type = nn.Embedding(V, C), nn.Embedding(P, C), nn.Embedding(2, C)
        self.ln_emb = nn.LayerNorm(C, eps=1e-12)
        self.layers = nn.ModuleList(Layer(C, NH, FF) for _ in range(L))
        self.pooler, self.classifier = nn.Linear(C, C), nn.Linear(C, K)
        for m in self.modules():  # as lens_trainer_new: N(0, 0.02), biases 0, LayerNorm 1 / 0
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, ids, mask):
        B, T = ids.shape
        x = self.ln_emb(self.word(ids) + self.pos.weight[:T][None] + self.token_type.weight[0])
        mask_add = ((1.0 - mask.float()) * -10000.0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask_add)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def read_batches(path):
    a = np.fromfile(path, dtype="<i4")
    n, B = int(a[0]), int(a[1])
    pos, seqs = 2, []
    for _ in range(n):
        length, label = int(a[pos]), int(a[pos + 1])
        seqs.append((a[pos + 2:pos + 2 + length], label))
        pos += 2 + length
    batches = []
    for s in range(0, n, B):
        chunk = seqs[s:s + B]
        T = max(len(ids) for ids, _ in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.int64)
        mask = torch.zeros(len(chunk), T, dtype=torch.int64)
        for k, (row, _) in enumerate(chunk):
            ids[k, :len(row)] = torch.from_numpy(row.astype(np.int64))
            mask[k, :len(row)] = 1
        labels = torch.tensor([y for _, y in chunk], dtype=torch.int64)
        batches.append((ids, mask, labels, int(mask.sum()), ids.numel()))
    return batches


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", required=True)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    batches = read_batches(a.batches)
    if len(batches) < a.warmup + a.steps:
        raise SystemExit(f"{a.batches}: {len(batches)} batches, need {a.warmup + a.steps}")
    model = BertClassifier(a.vocab, a.hidden, a.layers, a.heads, a.ff, a.max_len, 2)
    model.train()
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias") and "ln_" not in n]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "ln_" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    real = padded = 0
    t0 = time.perf_counter()
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            t0, real, padded = time.perf_counter(), 0, 0
        ids, mask, labels, n_real, n_padded = batches[s]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(ids, mask), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if s == 0:
            loss_first = float(loss)
        real += n_real
        padded += n_padded
    sec = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "steps": a.steps, "warmup": a.warmup, "batch": int(batches[0][0].shape[0]),
                      "threads": a.threads, "params": sum(p.numel() for p in model.parameters()),
                      "seconds": round(sec, 3), "real_tokens": real, "padded_tokens": padded,
                      "tokens_per_s": round(real / sec), "padded_tokens_per_s": round(padded / sec),
                      "steps_per_s": round(a.steps / sec, 2), "loss_first": round(loss_first, 4),
                      "loss_last": round(float(loss), 4),
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
