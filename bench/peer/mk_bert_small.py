"""mk_bert_small.py DIR - a random BERT at google/bert_uncased_L-4_H-512_A-8's
shapes (L4, C512, 8 heads, FF 2048) for the hta section's 128-token target.

DIR holds `lensd mkmodel --arch bert --preset small` output (tokenizer files,
config.json at L4 C256); this rewrites config.json's sizes and
model.safetensors with N(0, 0.02) weights (LayerNorm gains 1 + N(0, 0.02)),
seed 42. mkmodel has no preset at these shapes; the weights' values do not
matter for timing."""
import json
import struct
import sys

import torch

d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
cfg.update(hidden_size=512, num_attention_heads=8, intermediate_size=2048, num_hidden_layers=4)
json.dump(cfg, open(f"{d}/config.json", "w"), indent=2)
g = torch.Generator().manual_seed(42)
C, F, V, P = 512, 2048, cfg["vocab_size"], cfg["max_position_embeddings"]
tensors = {}


def normal(*shape):
    return torch.randn(*shape, generator=g) * 0.02


def layernorm(base):
    tensors[base + ".weight"] = 1 + normal(C)
    tensors[base + ".bias"] = normal(C)


tensors["bert.embeddings.word_embeddings.weight"] = normal(V, C)
tensors["bert.embeddings.position_embeddings.weight"] = normal(P, C)
tensors["bert.embeddings.token_type_embeddings.weight"] = normal(cfg["type_vocab_size"], C)
layernorm("bert.embeddings.LayerNorm")
for l in range(cfg["num_hidden_layers"]):
    b = f"bert.encoder.layer.{l}."
    for name, n_in, n_out in [("attention.self.query", C, C), ("attention.self.key", C, C),
                              ("attention.self.value", C, C), ("attention.output.dense", C, C),
                              ("intermediate.dense", C, F), ("output.dense", F, C)]:
        tensors[b + name + ".weight"] = normal(n_out, n_in)  # nn.Linear: [out][in]
        tensors[b + name + ".bias"] = normal(n_out)
    layernorm(b + "attention.output.LayerNorm")
    layernorm(b + "output.LayerNorm")
tensors["bert.pooler.dense.weight"] = normal(C, C)
tensors["bert.pooler.dense.bias"] = normal(C)
tensors["classifier.weight"] = normal(len(cfg["id2label"]), C)
tensors["classifier.bias"] = normal(len(cfg["id2label"]))

# safetensors: u64 header length, JSON header (name -> dtype, shape, byte range), the data
header, offset, blobs = {}, 0, []
for name, t in tensors.items():
    blob = t.float().contiguous().numpy().tobytes()
    header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
    offset += len(blob)
    blobs.append(blob)
head = json.dumps(header).encode()
head += b" " * ((8 - len(head) % 8) % 8)
with open(f"{d}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(head)))
    f.write(head)
    for blob in blobs:
        f.write(blob)
