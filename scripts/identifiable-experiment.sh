#!/usr/bin/env bash
# Standard vs identifiable encoder (Bhardwaj et al. 2021) on SST-2, same
# budget and seed: trains both with `lensd train classify`, then measures on
# the longest dev sentences (T >= 32 tokens) the fraction of heads whose value
# matrix V has full row rank (rank(V) = T, attention identifiable) with
# `lensd attention`. Usage: scripts/identifiable-experiment.sh LENSD OUTDIR
# [SEEDS] [EPOCHS]. Results are printed as a Markdown table row per model.
set -eu
lensd=$(realpath "$1")
out=$2
seeds=${3:-1}
epochs=${4:-1}
data=${LENSD_DATA:-$(dirname "$0")/../../shared/data}
vocab=${VOCAB:-$(dirname "$0")/../models/demo-sst2}
mkdir -p "$out"
common=(--train "$data/sst2/train_part_alps.tsv" --dev "$data/sst2/dev.tsv" --vocab "$vocab"
        --label-names negative,positive --layers 2 --hidden 128 --heads 4 --ff 512 --max-len 64
        --epochs "$epochs" --batch 32 --lr 1e-3)
for seed in $seeds; do
    "$lensd" train classify "${common[@]}" --seed "$seed" --out "$out/standard-s$seed" \
        2> "$out/standard-s$seed.log" > "$out/standard-s$seed.json"
    "$lensd" train classify "${common[@]}" --seed "$seed" --head-dim-key 8 --head-dim-value 64 \
        --out "$out/identifiable-s$seed" 2> "$out/identifiable-s$seed.log" > "$out/identifiable-s$seed.json"
done
# the 20 longest dev sentences
tail -n +2 "$data/sst2/dev.tsv" | cut -f1 | awk '{ print length($0) "\t" $0 }' | sort -rn | head -20 | cut -f2- \
    > "$out/long-sentences.txt"
python3 - "$lensd" "$out" "$seeds" <<'PY'
import json, subprocess, sys, statistics
lensd, out, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split()
sents = [l.rstrip("\n") for l in open(f"{out}/long-sentences.txt") if l.strip()]
print("| model | DK | DV | dev accuracy (seeds) | heads with rank(V) = T, T >= 32 | mean T |")
print("|---|---|---|---|---|---|")
for kind in ("standard", "identifiable"):
    accs, full, heads, lengths = [], 0, 0, []
    for s in seeds:
        d = f"{out}/{kind}-s{s}"
        accs.append(json.load(open(f"{d}.json"))["dev_accuracy"])
        for text in sents:
            p = subprocess.run([lensd, "attention", "--model", d, text, "--no-raw", "--no-effective"],
                               capture_output=True, text=True)
            if p.returncode: continue  # longer than the model's positions
            r = json.loads(p.stdout)
            T = len(r["tokens"])
            if T < 32: continue
            lengths.append(T)
            for layer in r["layers"]:
                for h in layer["heads"]:
                    heads += 1
                    full += h["rank"] == T
    cfg = json.load(open(f"{out}/{kind}-s{seeds[0]}/config.json"))
    dk = cfg.get("head_dim_key", cfg["hidden_size"] // cfg["num_attention_heads"])
    dv = cfg.get("head_dim_value", cfg["hidden_size"] // cfg["num_attention_heads"])
    acc = f"{statistics.mean(accs):.4f}" + (f" ± {statistics.stdev(accs):.4f}" if len(accs) > 1 else "")
    print(f"| {kind} | {dk} | {dv} | {acc} ({len(accs)}) | {full}/{heads} | {statistics.mean(lengths) if lengths else 0:.1f} |")
PY
