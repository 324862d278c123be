#!/usr/bin/env bash
# Attribution benchmark: lensd (bench/attribution.c) vs a straightforward
# PyTorch implementation (bench/peer/attribution_torch.py) on the same
# BERT-base-shape classifier, all 12 layers, m = 20, T = 64 and 128.
# Target: lensd <= 0.33 x PyTorch's time; peak RSS <= model + 512 MiB at T=64.
#   bench/attribution.sh [BUILD]      (BUILD defaults to build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${THREADS:-2}
MODEL=$BUILD/bench-models/bert-base-cls
make -s BUILD="$BUILD" "$BUILD/bench/attribution"
mkdir -p "$BUILD/bench-models"
"$BUILD/bench/attribution" --model "$MODEL" --T 8 --steps 1 --threads 1 >/dev/null # writes the checkpoint once
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
for T in ${BENCH_T:-64 128}; do
  lensd=$("$BUILD/bench/attribution" --model "$MODEL" --T "$T" --steps 20 --threads "$THREADS")
  torch=$(/usr/bin/python3 bench/peer/attribution_torch.py --model "$MODEL" --T "$T" --steps 20 --threads "$THREADS")
  echo "$lensd"
  echo "$torch"
  /usr/bin/python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
r = a["ms_median"] / b["ms_median"]
print(f"T={a[\"T\"]}: lensd {a[\"ms_median\"]/1e3:.1f} s, {a[\"maxrss_kib\"]/1024:.0f} MiB peak | "
      f"PyTorch {b[\"ms_median\"]/1e3:.1f} s, {b[\"maxrss_kib\"]/1024:.0f} MiB peak | ratio {r:.2f} "
      f"({\"PASS\" if r <= 0.33 else \"MISS\"} <= 0.33); model {a[\"model_mib\"]:.0f} MiB; "
      f"layer-1 attr sum lensd {a[\"attr_sum_layer1\"]:.6g} torch {b[\"attr_sum_layer1\"]:.6g}")
' "$lensd" "$torch"
done
