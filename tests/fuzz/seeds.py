#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<name>/ (small valid and
near-valid inputs for each fuzz target). Re-run: python3 tests/fuzz/seeds.py
(from the repository root); files a crash left there (crash-*) are kept."""
import json, os, struct

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(name, i, data):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None, pad=True):
    header, blob = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if meta is not None:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
st = [
    safetensors({"x": ("F32", [2, 3], f32(1, 2, 3, 4, 5, 6)), "y": ("F32", [4], f32(-1, 0, 1, 2))}, {"format": "pt"}),
    safetensors({"h": ("F16", [2, 2], struct.pack("<4e", 1, -2, 0.5, 65504))}),
    safetensors({"b": ("BF16", [3], b"\x80\x3f\x00\xc0\x00\x00"), "s": ("F32", [], f32(7))}),
    safetensors({"z": ("F32", [0, 4], b"")}),
    safetensors({"u": ("F32", [1], f32(1))}, pad=False)[:-1],
    safetensors({"m": ("F32", [1], b"\x00" * 4)})[:8] + b"{}",
]
for i, d in enumerate(st):
    put("safetensors", i, d)

fuzz_shard = safetensors({"f": ("F16", [2], struct.pack("<2e", 1, 2)), "g": ("F32", [1, 1], f32(3))})
idx = [
    {"metadata": {"total_size": 40}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors"}},
    {"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "f": "fuzz.safetensors", "g": "fuzz.safetensors"}},
    {"weight_map": {"x": "../a.safetensors"}},
    {"weight_map": {"f": "fuzz.safetensors", "x": "fuzz.safetensors"}},
]
for i, d in enumerate(idx):
    put("st_index", i, json.dumps(d).encode() + b"\0" + fuzz_shard)

bert = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_act": "gelu",
        "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32,
        "max_position_embeddings": 64, "type_vocab_size": 2, "vocab_size": 1000, "layer_norm_eps": 1e-12,
        "id2label": {"0": "negative", "1": "positive"}, "label2id": {"negative": 0, "positive": 1}}
mlm = dict(bert, architectures=["BertForMaskedLM"])
del mlm["id2label"], mlm["label2id"]
ident = dict(mlm, head_dim_key=4, head_dim_value=16, head_combination="sum")
gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 64, "vocab_size": 1000, "layer_norm_epsilon": 1e-5}
for i, d in enumerate([bert, mlm, ident, gpt2, dict(mlm, hidden_size=15), dict(mlm, vocab_size=999)]):
    put("config", i, json.dumps(d))

vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nmovie\nwas\ngreat\n##s\n##ing\nh\n##e\n##l\n##o\n,\n!\né\n"
wp = [
    vocab + "\0" + '{"do_lower_case": true}' + "\0\0" + "The movies were GREAT, hello! [MASK] héllo",
    vocab + "\0" + '{"do_lower_case": false, "tokenize_chinese_chars": true, "strip_accents": true}' + "\0"
    + '{"unk_token": "[UNK]", "mask_token": {"content": "[MASK]"}}' + "\0" + "Héllo 中文 movies" + "\0" + "second",
    vocab + "\0\0\0" + "x" * 120 + " the\tmovie\u00a0was",
]
for i, d in enumerate(wp):
    put("tok_wordpiece", i, d)

sym = lambda b: chr(b) if (33 <= b <= 126 or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF) else None
v = {}
n = 0
for b in range(256):
    c = sym(b)
    if c is None:
        c = chr(256 + n)
        n += 1
    v[c] = len(v)
v.update({"\u0120h": len(v), "he": len(v) + 1, "ll": len(v) + 2, "llo": len(v) + 3, "<|endoftext|>": len(v) + 4})
merges = "#version: 0.2\n\u0120 h\nh e\nl l\nll o\n"
bpe = [
    json.dumps(v) + "\0" + merges + "\0\0" + "hello world's 123 <|endoftext|>  héllo\n\n",
    json.dumps(v) + "\0" + merges + "\0" + '{"add_prefix_space": true}' + "\0" + "hello" + "\0" + "pair text",
    json.dumps({"a": 0, "b": 1}) + "\0" + "#version: 0.2\na b\n" + "\0\0" + "ab ba",
]
for i, d in enumerate(bpe):
    put("tok_bpe", i, d)

B, G, M = "bert", "gpt2", "mlm"
req = {
    "req_tokenize": [{"model": B, "text": "Hello, wörld!", "text_pair": "again"}, {"model": G, "text": "hello world"},
                     {"model": M, "text": "ab", "text_pair": "cd"}],
    "req_forward": [
        {"model": B, "text": "a charming film", "outputs": ["logits", "attentions"], "layers": [1], "heads": [0]},
        {"model": G, "text": "Hello world", "outputs": ["logits"], "positions": [1], "format": {"encoding": "base64"}},
        {"model": M, "input_ids": [2, 5, 6, 3], "outputs": ["hidden_states"], "format": {"precision": 2}},
    ],
    "req_attention": [
        {"model": B, "text": "the movie was great", "layers": [1], "heads": [0]},
        {"model": G, "text": "hello there world", "identifiability": True, "include_raw": True},
        {"model": M, "text": "ab cd", "identifiability": True, "key_aware": True, "key_aware_max_unknowns": 100},
    ],
    "req_attribution": [
        {"model": B, "text": "a charming film", "steps": 4, "layers": [1], "tree": True, "threshold": 0.4},
        {"model": G, "text": "hello world", "steps": 2, "target": 5, "include_matrices": True, "riemann": "left"},
        {"model": B, "text": "a charming film", "steps": 3, "quadrature": "gauss", "include_matrices": False},
        {"model": G, "text": "hello world", "steps": 2, "objective": {"kind": "logit_difference", "position": -2, "target": 5, "foil": 7}},
    ],
    "req_token_identity": [
        {"model": B, "text": "the movie was great", "layers": [1, 2], "metric": "cosine", "top_k": 3},
        {"model": G, "text": "hello world", "mapping": "identity", "vocabulary": True},
    ],
    "req_hidden_attribution": [
        {"model": B, "text": "the movie", "method": "exact", "layers": [1], "include_norms": True},
        {"model": G, "text": "hello world", "method": "estimate", "probes": 4, "seed": 3},
    ],
    "req_context_mixing": [
        {"model": B, "text": "the movie", "method": "alti", "layers": [1], "definition": "lensd"},
        {"model": G, "text": "hello world", "method": "value-zeroing"},
        {"model": B, "texts": ["a b", "c"], "method": "globenc"},
    ],
    "req_logit_attribution": [
        {"model": G, "text": "hello world again", "target": 5, "foil": 7},
        {"model": G, "input_ids": [5, 6, 7, 8], "target": "a", "position": -2},
    ],
    "req_decomposition": [
        {"model": G, "texts": ["hello world again and again", "the movie was great"], "length": 4, "top_k": 2},
        {"model": M, "windows": [[5, 6, 7, 8], [8, 7, 6, 5]], "layers": [0, 2], "drop_first_position": True},
    ],
    "req_jobs": [
        {"kind": "decomposition", "params": {"model": G, "texts": ["hello world again"], "length": 3}},
        {"kind": "attribution", "params": {"model": B, "text": "a film", "steps": 2}},
        {"kind": "head-importance", "params": {"model": B, "rows": [{"text": "good", "label": 1}, {"text": "bad", "label": 0}], "steps": 2}},
        {"kind": "adversarial-triggers", "params": {"model": B, "rows": [{"text": "good film", "label": 1}, {"text": "bad film", "label": 0}], "top_k": 2}},
        {"kind": "token-identity-map", "params": {"model": M, "texts": ["the movie", "was great"], "save": False}},
        {"kind": "hidden-attribution", "params": {"model": G, "text": "hi there", "method": "exact"}},
        {"kind": "nope"},
    ],
}
for name, bodies in req.items():
    for i, b in enumerate(bodies):
        put(name, i, json.dumps(b, ensure_ascii=False))
