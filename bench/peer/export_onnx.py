"""Exports the PyTorch peer's BertModel (torch_forward.py, same weights) to
ONNX for the ONNX Runtime peer.

  export_onnx.py --model DIR --out FILE.onnx

Input "input_ids" int64 [batch, T], output "last_hidden_state" float32
[batch, T, C]; batch and T are dynamic axes. Segment ids are all 0 and there
is no attention mask (no padding), as in the timed lensd and PyTorch runs.
The file is written next to a temporary and renamed, so an interrupted export
never leaves a truncated model behind.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_forward import load_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--opset", type=int, default=14)
    a = ap.parse_args()
    model, _ = load_model(a.model)
    ids = torch.zeros(1, 8, dtype=torch.int64)
    tmp = a.out + ".tmp"
    with torch.no_grad():
        torch.onnx.export(model, (ids,), tmp, input_names=["input_ids"], output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "T"}, "last_hidden_state": {0: "batch", 1: "T"}},
                          opset_version=a.opset, do_constant_folding=True)
    os.replace(tmp, a.out)
    print(f"export_onnx: wrote {a.out} ({os.path.getsize(a.out) / 2**20:.0f} MiB, opset {a.opset})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
