#!/usr/bin/env bash
# Standard vs identifiable encoders (Bhardwaj et al. 2021), same budget and
# seeds: trains each variant with `lensd train classify`, then measures with
# `lensd attention` the fraction of heads whose value matrix V has full row
# rank (rank(V) = T, attention identifiable) on inputs of exactly T tokens
# (scripts/rank-windows.py: 20 windows cut from the dev texts per length).
#
# Usage: scripts/identifiable-experiment.sh LENSD OUTDIR [SEEDS] [EPOCHS]
# Environment (defaults in brackets):
#   DATASET   sst2 | agnews [sst2]. sst2: train_part_alps.tsv, GLUE dev, the
#             vocabulary of models/demo-sst2 (VOCAB). agnews: the 10,001
#             articles of train-subset.tsv shuffled with a fixed random source,
#             first 9,000 train, last 1,001 dev, an 8k vocabulary learned on
#             the train part.
#   VARIANTS  [standard identifiable sum]
#               standard      DK = DV = 32 (C 128 / 4 heads)
#               identifiable  DK 8, DV = MAX_LEN, heads concatenated
#               sum           DK 8, DV = MAX_LEN, head outputs summed
#                             (head_combination "sum", the paper's addition)
#   MAX_LEN   positions of the models, also the identifiable DV [128]
#   LENGTHS   input lengths T for the rank count [32 64 128]
# Every model: L2, hidden 128, 4 heads, FFN 512, batch 32, AdamW lr 1e-3 (6 %
# warm-up, linear decay), weight decay 0.01, clip 1.0, no dropout. Results:
# one Markdown table row per variant (dev accuracy mean ± std over the seeds,
# heads with rank(V) = T per length, pooled over the seeds); the per-run
# numbers stay in OUTDIR (*.json, *.log, rank.jsonl).
set -eu
lensd=$(realpath "$1")
out=$2
seeds=${3:-1}
epochs=${4:-1}
here=$(cd "$(dirname "$0")" && pwd)
data=${LENSD_DATA:-$here/../../shared/data}
dataset=${DATASET:-sst2}
variants=${VARIANTS:-standard identifiable sum}
max_len=${MAX_LEN:-128}
lengths=${LENGTHS:-32 64 128}
mkdir -p "$out"
case $dataset in
sst2)
    train_tsv=$data/sst2/train_part_alps.tsv
    dev_tsv=$data/sst2/dev.tsv
    vocab=${VOCAB:-$here/../models/demo-sst2}
    labels=(--label-names negative,positive)
    ;;
agnews)
    # no header; the same order on every machine (shuf with a constant random source)
    shuf --random-source=<(yes) "$data/agnews/train-subset.tsv" > "$out/agnews-shuffled.tsv"
    head -n 9000 "$out/agnews-shuffled.tsv" > "$out/agnews-train.tsv"
    tail -n +9001 "$out/agnews-shuffled.tsv" > "$out/agnews-dev.tsv"
    train_tsv=$out/agnews-train.tsv
    dev_tsv=$out/agnews-dev.tsv
    vocab=$out/agnews-vocab
    [ -f "$vocab/vocab.txt" ] || "$lensd" train vocab --out "$vocab" --size 8000 "$train_tsv"
    labels=()
    ;;
*)
    echo "DATASET is sst2 or agnews" >&2
    exit 2
    ;;
esac
common=(--train "$train_tsv" --dev "$dev_tsv" --vocab "$vocab" ${labels[@]+"${labels[@]}"}
        --layers 2 --hidden 128 --heads 4 --ff 512 --max-len "$max_len"
        --epochs "$epochs" --batch 32 --lr 1e-3)
for seed in $seeds; do
    for kind in $variants; do
        case $kind in
        standard) extra=() ;;
        identifiable) extra=(--head-dim-key 8 --head-dim-value "$max_len") ;;
        sum) extra=(--head-dim-key 8 --head-dim-value "$max_len" --head-combination sum) ;;
        *) echo "unknown variant $kind" >&2; exit 2 ;;
        esac
        d=$out/$kind-s$seed
        [ -f "$d.json" ] && continue # already trained (rerun to add seeds or variants)
        t0=$SECONDS
        nice -n 5 "$lensd" train classify "${common[@]}" ${extra[@]+"${extra[@]}"} --seed "$seed" --out "$d" \
            2> "$d.log" > "$d.json.tmp"
        mv "$d.json.tmp" "$d.json"
        rm -f "$d/optimizer.safetensors"
        echo "$kind seed $seed: $(cat "$d.json") ($((SECONDS - t0)) s)" >&2
    done
done
models=()
for kind in $variants; do for seed in $seeds; do models+=("$out/$kind-s$seed"); done; done
python3 "$here/rank-windows.py" "$lensd" "$dev_tsv" "$lengths" 20 "${models[@]}" > "$out/rank.jsonl"
python3 - "$out" "$seeds" "$variants" "$lengths" <<'PY'
import json, sys, statistics
out, seeds, variants, lengths = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
rank = {}
for line in open(f"{out}/rank.jsonl"):
    r = json.loads(line)
    rank[r["model"]] = r["lengths"]
print("| model | DK | DV | dev accuracy, mean ± std (seeds " + ", ".join(seeds) + ") | "
      + " | ".join(f"rank(V) = T, T = {T}" for T in lengths) + " |")
print("|---|---|---|---|" + "---|" * len(lengths))
for kind in variants:
    accs, full, heads = [], {T: 0 for T in lengths}, {T: 0 for T in lengths}
    for s in seeds:
        d = f"{out}/{kind}-s{s}"
        accs.append(json.load(open(f"{d}.json"))["dev_accuracy"])
        for T in lengths:
            r = rank[d].get(T)
            if r:
                full[T] += r["full"]
                heads[T] += r["heads"]
    cfg = json.load(open(f"{out}/{kind}-s{seeds[0]}/config.json"))
    dk = cfg.get("head_dim_key", cfg["hidden_size"] // cfg["num_attention_heads"])
    dv = cfg.get("head_dim_value", cfg["hidden_size"] // cfg["num_attention_heads"])
    acc = f"{statistics.mean(accs):.4f}" + (f" ± {statistics.stdev(accs):.4f}" if len(accs) > 1 else "")
    acc += " (" + ", ".join(f"{a:.4f}" for a in accs) + ")"
    name = kind + (" (sum)" if cfg.get("head_combination", "concat") != "concat" and kind != "sum" else "")
    cells = " | ".join(f"{full[T]} / {heads[T]}" if heads[T] else "–" for T in lengths)
    print(f"| {name} | {dk} | {dv} | {acc} | {cells} |")
PY
