#!/usr/bin/python3
"""attribution_paper_code_reference.py - the released attattr selection rules
(Hao et al. 2021, YRdddream/attattr) on top of the float64 autograd
attribution of attribution_reference.py, for tests/test_paper_code.c.

Re-implemented from the released scripts (read, not copied):
  examples/prune_head_with_attr.py  head importance: for every example the
      attribution towards its GOLD label (pred_label=label_ids[0]), 20 points
      i/20, i = 0..19 (batch_size 20 x num_batch 1: the "left" Riemann sum),
      and attr_every_head_record[l * NH + h] += max_ij attr[h]; the pruning
      count at rate i/10 is int(rate * num_layer * num_head) (floor).
  examples/run_adver_connection.py  trigger patterns: target = the predicted
      class; per layer the head of the largest entry (argmax of the flattened
      [NH][T][T] // (T*T)); over layers the head whose max is strictly larger;
      that head's two largest entries (i, j) over all positions
      ([CLS], [SEP], i == j allowed); examples sorted by the sum of the two.
      Its defaults are 16 x 4 = 64 points; here 20 "left" points, as lensd's
      default step count, so one attribution serves both.

Examples: the three golden.json inputs of bert-tiny-sst2 and three more id
sequences ([CLS] ids [SEP], torch.Generator seed 5), with fixed gold labels
(some differ from the prediction, so the gold target matters).

Usage (repo root):  /usr/bin/python3 tests/reference/attribution_paper_code_reference.py [SHARED_DIR]
Writes tests/fixtures/attribution_paper_code.json."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attribution_reference import Classifier, attribution  # noqa: E402
from reference_forward import load  # noqa: E402

STEPS, RIEMANN = 20, "left"


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(repo), "shared")
    model_dir = os.path.join(shared, "models", "bert-tiny-sst2")
    base, cfg = load(model_dir)
    model = Classifier(base)
    with open(os.path.join(model_dir, "golden.json")) as f:
        golden = json.load(f)
    inputs = [g["input_ids"] for g in golden["examples"]]
    g = torch.Generator().manual_seed(5)
    for T in (9, 13, 16):
        inputs.append([101] + [int(x) for x in 2000 + torch.randint(20000, (T - 2,), generator=g)] + [102])
    L, NH = model.L, model.nh
    record = [0.0] * (L * NH)
    examples = []
    for n, ids in enumerate(inputs):
        T = len(ids)
        ins, attns, probs = model.run(torch.tensor(ids), torch.tensor([0] * T))
        pred = int(torch.argmax(probs))
        gold = pred if n % 2 else 1 - pred  # examples 0, 2, 4: gold != predicted
        for l in range(L):  # head importance towards the gold label
            attr, _ = attribution(model, ins, attns, l, gold, STEPS, RIEMANN)
            for h in range(NH):
                record[l * NH + h] += float(attr[h].max())
        best = None  # trigger head towards the predicted class
        for l in range(L):
            attr, _ = attribution(model, ins, attns, l, pred, STEPS, RIEMANN)
            head = int(torch.argmax(attr.reshape(-1))) // (T * T)
            if best is None or float(attr[head].max()) > float(best.max()):
                best = attr[head]
        flat = best.reshape(-1)
        order = torch.argsort(flat, descending=True)
        top = [(int(order[k]) // T, int(order[k]) % T) for k in range(2)]
        examples.append({"input_ids": ids, "gold": gold, "predicted": pred,
                         "max_combined_attr": [float(flat[order[0]]), float(flat[order[1]])],
                         "top1position": list(top[0]), "top2position": list(top[1])})
    pruned = [min(int(i / 10 * L * NH), L * NH) for i in range(11)]
    pruned_base = [min(int(i / 10 * 12 * 12), 144) for i in range(11)]  # BERT-base, the paper's model
    ranking = sorted(range(len(examples)), key=lambda e: sum(examples[e]["max_combined_attr"]), reverse=True)
    out = {"model": "bert-tiny-sst2", "steps": STEPS, "riemann": RIEMANN,
           "generated_by": "tests/reference/attribution_paper_code_reference.py (PyTorch %s, float64 autograd)"
                           % torch.__version__,
           "examples": examples, "head_importance_sum": record, "heads_pruned_floor": pruned,
           "heads_pruned_floor_12x12": pruned_base,
           "trigger_ranking": ranking}
    path = os.path.join(repo, "tests", "fixtures", "attribution_paper_code.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, repo)}: {len(examples)} examples, importance {[round(x, 5) for x in record]}, "
          f"pruned {pruned}, ranking {ranking}")


if __name__ == "__main__":
    main()
