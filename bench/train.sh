#!/usr/bin/env bash
# `make bench-train`: training throughput of the demo BERT classifier
# (models/demo-sst2's shape: L2, hidden 128, 2 heads, FFN 512, vocab 8000,
# 128 positions), batch 32, SST-2 training sentences tokenized with
# models/demo-sst2's vocabulary, AdamW lr 1e-3 / wd 0.01 / clip 1.0:
#   lensd    bench/train.c (lens_trainer_batch + lens_trainer_step, packed batches)
#   PyTorch  bench/peer/train_torch.py (same shape, init, optimizer and sequences; padded batches)
#   lensd    `lensd train classify --max-steps N` (the CLI loop with its lr schedule, as a cross-check)
# Target: lensd real tokens/s >= 1.0 x PyTorch's. Peak RSS of each.
#
#   bench/train.sh [BUILD/lensd]       (make bench-train)
#   BENCH_QUICK=1        100 steps instead of 300
#   THREADS=n            threads of every run (default 2)
set -uo pipefail
cd "$(dirname "$0")/.."

LENSD=${1:-build/lensd}
BUILD=$(dirname "$LENSD")
PY=/usr/bin/python3
OUT=$BUILD/bench
DATA=${LENSD_DATA:-../shared/data}/sst2/train_part_alps.tsv
VOCAB=models/demo-sst2
THREADS=${THREADS:-2}
STEPS=300 WARMUP=10
[ -n "${BENCH_QUICK:-}" ] && STEPS=100
RES=$OUT/train-results.jsonl

log() { printf 'bench-train: %s\n' "$*" >&2; }

make -s BUILD="$BUILD" "$LENSD" "$BUILD/bench/train" || exit 1
mkdir -p "$OUT"
if [ ! -s "$DATA" ]; then
  log "$DATA not found (set LENSD_DATA to the folder holding sst2/)"
  exit 1
fi
# as bench/run.sh: PyTorch's matmuls go through OpenBLAS, whose core is read at start-up
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
  fi
fi
echo "lensd training benchmark, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores"
echo "load before start:$(uptime | sed 's/.*load average/ load average/')"
: >"$RES"

log "lensd trainer API: $STEPS steps (+$WARMUP untimed) of 32, $THREADS threads"
"$BUILD/bench/train" --data "$DATA" --vocab "$VOCAB" --steps "$STEPS" --warmup "$WARMUP" --batch 32 \
  --max-len 128 --threads "$THREADS" --seed 1 --dump-batches "$OUT/train-batches.bin" >>"$RES" || exit 1

log "PyTorch: the same batches (padded), $THREADS threads"
OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE \
  "$PY" bench/peer/train_torch.py --batches "$OUT/train-batches.bin" --vocab 8000 --steps "$STEPS" \
  --warmup "$WARMUP" --threads "$THREADS" >>"$RES" || exit 1

log "lensd train classify --max-steps $((STEPS + WARMUP)) (CLI cross-check; tokenizes the whole file first)"
rm -rf "$OUT/train-cli"
/usr/bin/time -f '%M' -o "$OUT/train-cli.rss" "$LENSD" train classify --train "$DATA" --vocab "$VOCAB" \
  --out "$OUT/train-cli" --label-names negative,positive --layers 2 --hidden 128 --heads 2 --ff 512 \
  --max-len 128 --batch 32 --lr 1e-3 --warmup 0.06 --weight-decay 0.01 --clip 1.0 --seed 1 \
  --max-steps $((STEPS + WARMUP)) --threads "$THREADS" 2>"$OUT/train-cli.log" >"$OUT/train-cli.json" || exit 1
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); r["impl"] = "lensd-cli"; r["maxrss_kib"] = int(open(sys.argv[2]).read().split()[-1]); print(json.dumps(r))' \
  "$OUT/train-cli.json" "$OUT/train-cli.rss" >>"$RES" || exit 1

"$PY" - "$RES" "$(uptime | sed 's/.*load average: //')" <<'EOF' | tee "$OUT/train-table.txt"
import json, sys
rows = {r["impl"]: r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip())}
l, p, c = rows["lensd"], rows["pytorch"], rows.get("lensd-cli")
print(f"\n== training: BERT classifier L2 H128 2 heads FFN 512 V8000 ({l['params']} parameters), batch {l['batch']}, "
      f"{l['steps']} steps after {l['warmup']}, AdamW, {l['threads']} threads ==")
print(f"real tokens {l['real_tokens']}; PyTorch pads each batch to its longest sequence: {p['padded_tokens']} rows "
      f"computed ({p['padded_tokens'] / p['real_tokens']:.2f} x the real tokens); lensd packs (no padding)")
hdr = f"{'':<24} | {'real tok/s':>10} {'padded tok/s':>12} {'steps/s':>8} {'s':>6} | {'peak RSS MiB':>12} | {'loss first/last':>15}"
print(hdr); print("-" * len(hdr))
for name, r in (("lensd (trainer API)", l), ("PyTorch", p)):
    print(f"{name:<24} | {r['tokens_per_s']:10.0f} {r['padded_tokens_per_s']:12.0f} {r['steps_per_s']:8.2f} {r['seconds']:6.1f} | "
          f"{r['maxrss_kib'] / 1024:12.0f} | {r['loss_first']:.3f} / {r['loss_last']:.3f}")
if c:
    print(f"{'lensd train classify':<24} | {c['tokens_per_s']:10.0f} {'':>12} {'':>8} {'':>6} | {c['maxrss_kib'] / 1024:12.0f} | "
          f"{'':>7}{c['train_loss']:.3f} (CLI: {c['steps']} steps incl. warm-up, lr schedule, whole file tokenized)")
r = l["tokens_per_s"] / p["tokens_per_s"]
print(f"target: lensd real tokens/s >= 1.0 x PyTorch's ({l['tokens_per_s']:.0f} vs {p['tokens_per_s']:.0f}, {r:.2f}x)"
      f"  {'PASS' if r >= 1.0 else 'MISS'}")
print(f"load average at the end: {sys.argv[2]}")
EOF
