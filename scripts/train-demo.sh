#!/usr/bin/env bash
# `make demo-models`: trains the shipped demo checkpoints with lensd itself
# (no pretrained weights can be downloaded), each with a MODEL_CARD.md that
# records data, recipe, the exact command and the measured metrics:
#   demo-mlm           BERT masked LM (L2 H128, 2 heads, FFN 512, 128 positions)
#                      on the SST-2 training sentences, own 8k WordPiece vocabulary
#   demo-sst2          BERT sentiment classifier fine-tuned from demo-mlm on SST-2
#   demo-identifiable  identifiable-encoder classifier (Bhardwaj et al. 2021:
#                      DK 8, DV 128 >= 128 positions) on SST-2, from scratch
#   demo-gpt2          GPT-2 causal LM on WikiText-2 test, own byte-level BPE
#                      vocabulary (needs `lensd train causal`)
# Usage: scripts/train-demo.sh LENSD [MODEL..]   (default: all four, in this
# order; demo-sst2 needs demo-mlm). Trainings run one at a time under
# `nice -n 5`; the optimizer state is removed afterwards. Not part of CI.
set -eu
lensd=$(realpath "$1")
shift
cd "$(dirname "$0")/.."
data=${LENSD_DATA:-../shared/data}
want=${*:-demo-mlm demo-sst2 demo-identifiable demo-gpt2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
today=$(date -u +%Y-%m-%d)

# "- epoch N: ..." lines of a train.log, for the cards
epochs_of() { grep -E '^epoch [0-9]+:' "$1" | sed 's/^/  - /'; }
size_of() { du -b "$1/model.safetensors" | awk '{ printf "%.1f MB", $1 / 1e6 }'; }
json_field() { sed -n "s/.*\"$2\": \\([0-9.e+-]*\\).*/\\1/p" "$1"; }
# train OUT CMD..: runs a training, keeps train.log / result.json, drops the optimizer state
train() {
    local out=$1
    shift
    mkdir -p "$out"
    local t0=$SECONDS
    nice -n 5 "$lensd" "$@" 2> "$out/train.log" > "$out/result.json"
    echo "$((SECONDS - t0))" > "$work/seconds"
    rm -f "$out/optimizer.safetensors"
}

# SST-2 training sentences: train_part_alps (60,614) + heldout_part_alps (6,735)
# = the 67,349 of GLUE SST-2 train, one header.
{ head -1 "$data/sst2/train_part_alps.tsv"; tail -n +2 "$data/sst2/train_part_alps.tsv";
  tail -n +2 "$data/sst2/heldout_part_alps.tsv"; } > "$work/sst2-train-all.tsv"
bert=(--layers 2 --hidden 128 --heads 2 --ff 512 --max-len 128)

for model in $want; do
case $model in
demo-mlm)
    out=models/demo-mlm
    rm -rf "$out"
    "$lensd" train vocab --out "$work/vocab" --size 8000 --min-count 2 \
        "$data/sst2/train_part_alps.tsv" "$data/sst2/heldout_part_alps.tsv"
    cmd=(train mlm --train "$work/sst2-train-all.tsv" --dev "$data/sst2/dev.tsv" --vocab "$work/vocab" --out "$out"
         "${bert[@]}" --epochs 8 --batch 32 --lr 1e-3 --warmup 0.06 --weight-decay 0.01 --clip 1.0 --seed 1)
    train "$out" "${cmd[@]}"
    loss=$(json_field "$out/result.json" dev_mlm_loss)
    cat > "$out/MODEL_CARD.md" <<CARD
# demo-mlm

BERT masked language model (BertForMaskedLM: post-LN, exact GELU, transform
dense + GELU + LayerNorm, decoder tied to the word embeddings), pre-trained by
lensd on the SST-2 training sentences; no pretrained weights. It is the parent
of models/demo-sst2 (\`lensd train classify --init models/demo-mlm\`).

- Architecture: 2 layers, hidden 128, 2 heads (64 per head), FFN 512, 128 positions,
  vocabulary 8000; $(size_of "$out") F32.
- Vocabulary: \`lensd train vocab --size 8000 --min-count 2\` on train_part_alps.tsv +
  heldout_part_alps.tsv (lower-cased WordPiece; the same vocab.txt as demo-sst2).
- Data: the 67,349 sentences and phrases of GLUE SST-2 train (ALPS split
  train_part_alps.tsv 60,614 + heldout_part_alps.tsv 6,735; text column only).
  Held out: the 872 GLUE SST-2 dev sentences (not in train).
- Objective: each step masks 15 % of the non-special tokens (80 % [MASK], 10 % a random
  id, 10 % unchanged; seeded per step); cross-entropy on the masked positions.
- Recipe: AdamW (β 0.9/0.999, ε 1e-8, weight decay 0.01, not on biases/LayerNorm),
  lr 1e-3, 6 % warm-up then linear decay, batch 32, 8 epochs (16,840 steps),
  gradient clipping 1.0, seed 1, no dropout. Training time: $(cat "$work/seconds") s
  (one core of a shared 2-core machine).
- Commands (scripts/train-demo.sh, \`make demo-models\`; sst2-train-all.tsv = one
  header + the rows of both train files):

      lensd train vocab --out vocab --size 8000 --min-count 2 \\
          $data/sst2/train_part_alps.tsv $data/sst2/heldout_part_alps.tsv
      lensd $(printf '%s ' "${cmd[@]}" | sed "s|$work/||g")

- Held-out masked-LM loss (dev sentences, fixed masking seed), per epoch:
$(epochs_of "$out/train.log")
- Final held-out masked-LM loss: $loss (perplexity $(awk "BEGIN { printf \"%.1f\", exp($loss) }")).
- Date: $today.
CARD
    echo "$out: held-out MLM loss $loss"
    ;;
demo-sst2)
    out=models/demo-sst2
    rm -rf "$out"
    cmd=(train classify --train "$data/sst2/train_part_alps.tsv" --dev "$data/sst2/dev.tsv"
         --init models/demo-mlm --out "$out" --label-names negative,positive
         --epochs 3 --batch 32 --lr 5e-4 --warmup 0.06 --weight-decay 0.01 --clip 1.0 --seed 1)
    train "$out" "${cmd[@]}"
    acc=$(json_field "$out/result.json" dev_accuracy)
    cat > "$out/MODEL_CARD.md" <<CARD
# demo-sst2

BERT sequence classifier (BertForSequenceClassification: post-LN, exact GELU,
tanh pooler, no dropout) for SST-2 sentiment, fine-tuned by lensd from its
masked-LM parent models/demo-mlm (encoder loaded; pooler and classifier new,
N(0, 0.02)); no pretrained weights from elsewhere.

- Parent: models/demo-mlm (see its MODEL_CARD.md: MLM on the SST-2 training sentences).
- Architecture: 2 layers, hidden 128, 2 heads (64 per head), FFN 512, 128 positions,
  vocabulary 8000 (demo-mlm's WordPiece); $(size_of "$out") F32.
- Data: SST-2 (GLUE) train, ALPS split train_part_alps.tsv (60,614 labelled sentences
  and phrases); evaluated on the GLUE dev set (872 sentences).
- Recipe: AdamW (β 0.9/0.999, weight decay 0.01, not on biases/LayerNorm), lr 5e-4,
  6 % warm-up then linear decay, batch 32, 3 epochs, gradient clipping 1.0, seed 1,
  no dropout. Training time: $(cat "$work/seconds") s (one core of a shared 2-core machine).
- Command (scripts/train-demo.sh, \`make demo-models\`, after demo-mlm):

      lensd ${cmd[*]}

- Dev accuracy per epoch:
$(epochs_of "$out/train.log")
- Final dev accuracy: $acc (the checkpoint is the one after the last epoch).
- Labels: 0 negative, 1 positive.
- Date: $today.
CARD
    echo "$out: dev accuracy $acc"
    ;;
demo-identifiable)
    out=models/demo-identifiable
    rm -rf "$out"
    cmd=(train classify --train "$data/sst2/train_part_alps.tsv" --dev "$data/sst2/dev.tsv"
         --vocab models/demo-mlm --out "$out" --label-names negative,positive
         --layers 2 --hidden 128 --heads 4 --ff 512 --max-len 128 --head-dim-key 8 --head-dim-value 128
         --epochs 2 --batch 32 --lr 1e-3 --warmup 0.06 --weight-decay 0.01 --clip 1.0 --seed 1)
    train "$out" "${cmd[@]}"
    acc=$(json_field "$out/result.json" dev_accuracy)
    rank=$(python3 scripts/rank-windows.py "$lensd" "$data/sst2/dev.tsv" "32 64 128" 20 "$out" |
           python3 -c 'import json,sys; r=json.load(sys.stdin)["lengths"]; print("; ".join("T = %s: %d / %d" % (t, v["full"], v["heads"]) for t, v in r.items()))')
    cat > "$out/MODEL_CARD.md" <<CARD
# demo-identifiable

The identifiable encoder of Bhardwaj et al. 2021 ("More Identifiable yet
Equally Performant Transformers for Text Classification") as an SST-2
sentiment classifier, trained from scratch by lensd: per-head key size DK = 8,
value size DV = 128 = the number of positions, so a head's value matrix V
[T][DV] can have full row rank for every input length and its attention
weights are identifiable (docs/identifiable-encoder.md).

- Architecture: BertForSequenceClassification with config keys head_dim_key 8,
  head_dim_value 128 (head_combination concat): 2 layers, hidden 128, 4 heads,
  FFN 512, 128 positions, vocabulary 8000 (demo-mlm's WordPiece); $(size_of "$out") F32.
  Shapes: attention.self.query/key [32][128], value [512][128],
  attention.output.dense [128][512]; scores scaled by 1/sqrt(8). Stock
  transformers.BertModel cannot load it (it assumes DK = DV = 32).
- Data: SST-2 (GLUE) train, ALPS split train_part_alps.tsv (60,614); dev = GLUE dev (872).
- Recipe: AdamW (β 0.9/0.999, weight decay 0.01, not on biases/LayerNorm), lr 1e-3,
  6 % warm-up then linear decay, batch 32, 2 epochs, clipping 1.0, seed 1, no dropout.
  Training time: $(cat "$work/seconds") s (one core of a shared 2-core machine).
- Command (scripts/train-demo.sh, \`make demo-models\`):

      lensd ${cmd[*]}

- Dev accuracy per epoch:
$(epochs_of "$out/train.log")
- Final dev accuracy: $acc.
- Identifiability: heads × windows with rank(V) = T, measured with \`lensd attention\`
  on 20 windows of exactly T tokens cut from the SST-2 dev sentences
  (scripts/rank-windows.py: dev sentences tokenized and concatenated in file order,
  window k = [CLS] + pieces[k(T-2), (k+1)(T-2)) + [SEP]); 8 heads per window:
  $rank.
- Labels: 0 negative, 1 positive.
- Date: $today.
CARD
    echo "$out: dev accuracy $acc; rank(V) = T: $rank"
    ;;
demo-gpt2)
    out=models/demo-gpt2
    rm -rf "$out"
    vocab_cmd=(train vocab --bpe --size 4000 --min-count 2 --out "$out" "$data/wikitext2/test.txt")
    "$lensd" "${vocab_cmd[@]}"
    cmd=(train causal --train "$data/wikitext2/test.txt" --dev "$data/wikitext2/valid.txt" --vocab "$out" --out "$out"
         --layers 2 --hidden 128 --heads 4 --ff 512 --max-len 128
         --epochs "${GPT2_EPOCHS:-8}" --batch 16 --lr 1e-3 --warmup 0.06 --weight-decay 0.01 --clip 1.0 --seed 1)
    train "$out" "${cmd[@]}"
    ppl=$(json_field "$out/result.json" dev_perplexity)
    loss=$(json_field "$out/result.json" dev_loss)
    cat > "$out/MODEL_CARD.md" <<CARD
# demo-gpt2

GPT-2 causal language model (GPT2LMHeadModel: pre-LN, gelu_new, learned
positions, lm_head tied to wte) trained by lensd from scratch on WikiText-2,
with its own byte-level BPE vocabulary; no pretrained weights.

- Architecture: 2 layers, n_embd 128, 4 heads (32 per head), FFN 512, 128 positions,
  vocabulary 4000; $(size_of "$out") F32.
- Vocabulary: \`lensd train vocab --bpe --size 4000 --min-count 2\` on WikiText-2 test.txt:
  GPT-2's pre-tokenizer and 256 byte symbols (bytes_to_unicode order) + $(($(wc -l < "$out/merges.txt") - 1)) merges
  learned by pair frequency, <|endoftext|> last (vocab.json + merges.txt, GPT2Tokenizer format).
- Data: WikiText-2 (raw tokens as distributed, with <unk>): **test.txt is the training
  text** (WikiText-2's train split is not available on this machine); valid.txt is the
  dev set. Both are cut into windows of 128 tokens ($(head -1 "$out/train.log" | sed 's/ dev / validation /; s/;.*//')).
- Recipe: AdamW (β 0.9/0.999, weight decay 0.01, not on biases/LayerNorm), lr 1e-3,
  6 % warm-up then linear decay, batch 16 windows of 128 tokens, ${GPT2_EPOCHS:-8} epochs,
  clipping 1.0, seed 1, no dropout. Training time: $(cat "$work/seconds") s including the
  validation passes (a 2-core machine shared with other jobs).
- Commands (scripts/train-demo.sh, \`make demo-models\`):

      lensd ${vocab_cmd[*]}
      lensd ${cmd[*]}

- Validation (valid.txt) per epoch:
$(epochs_of "$out/train.log")
- Final validation loss $loss nats/token, **perplexity $ppl** (per BPE token of this
  4000-entry vocabulary; not comparable with word-level WikiText-2 perplexities).
- Test: tests/test_demo_models.c compares lensd's perplexity on a 69-token valid.txt
  passage with the independent PyTorch reference (tests/reference/demo_models_reference.py).
- Date: $today.
CARD
    echo "$out: validation perplexity $ppl"
    ;;
*)
    echo "train-demo.sh: unknown model $model" >&2
    exit 2
    ;;
esac
done
