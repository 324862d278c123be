#!/usr/bin/env bash
# `make demo-models`: trains the shipped demo checkpoints with lensd itself
# (no pretrained weights can be downloaded). models/demo-sst2: a BERT
# sentiment classifier (L2 H128, 2 heads, own 8k WordPiece vocabulary learned
# from the SST-2 training sentences), 3 epochs on SST-2, a few minutes on
# 2 cores. The optimizer state is removed afterwards; MODEL_CARD.md records
# the recipe and the dev accuracy. Not part of CI.
set -eu
lensd=$1
cd "$(dirname "$0")/.."
data=${LENSD_DATA:-../shared/data}
out=models/demo-sst2
mkdir -p "$out"
"$lensd" train vocab --out "$out" --size 8000 --min-count 2 \
    "$data/sst2/train_part_alps.tsv" "$data/sst2/heldout_part_alps.tsv"
"$lensd" train classify --train "$data/sst2/train_part_alps.tsv" --dev "$data/sst2/dev.tsv" \
    --vocab "$out" --out "$out" --label-names negative,positive \
    --layers 2 --hidden 128 --heads 2 --ff 512 --max-len 128 \
    --epochs 3 --batch 32 --lr 1e-3 --warmup 0.06 --weight-decay 0.01 --clip 1.0 --seed 1 \
    2> "$out/train.log" | tee "$out/result.json"
rm -f "$out/optimizer.safetensors"
acc=$(sed -n 's/.*"dev_accuracy": \([0-9.]*\).*/\1/p' "$out/result.json")
cat > "$out/MODEL_CARD.md" <<CARD
# demo-sst2

BERT sequence classifier (BertForSequenceClassification, post-LN, GELU), trained
from scratch by lensd; no pretrained weights.

- Architecture: 2 layers, hidden 128, 2 heads (64 per head), FFN 512, 128 positions, vocab 8000.
- Vocabulary: \`lensd train vocab --size 8000 --min-count 2\` on the SST-2 training
  sentences (train_part_alps.tsv + heldout_part_alps.tsv), lower-cased WordPiece.
- Data: SST-2 (GLUE) train (60,614 sentences, ALPS split); evaluated on the GLUE dev set (872).
- Recipe: AdamW (β 0.9/0.999, weight decay 0.01, not on biases/LayerNorm), lr 1e-3,
  6% warm-up then linear decay, batch 32, 3 epochs, gradient clipping 1.0, seed 1, no dropout.
- Command: scripts/train-demo.sh (\`make demo-models\`).
- Dev accuracy: $acc (see train.log for the per-epoch numbers).
- Labels: 0 negative, 1 positive.
CARD
echo "$out: dev accuracy $acc"
