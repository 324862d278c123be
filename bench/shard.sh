#!/usr/bin/env bash
# make bench-shard (bench/shard.sh build/lensd): a head-importance job over
# ROWS (64) SST-2 dev rows on BERT-base-shaped random weights (lensd mkmodel
# --preset base), STEPS (20) attribution steps, all 12 layers:
#   one process with --threads 2, against
#   2 shard processes at once with --threads 1 each (lensd job run --shard I/2)
#   plus the merge (pruning curve: forward passes over every row);
# both results must be equal (timing aside). Prints wall times, the ratio
# and the merge's share. Needs ../shared/data/sst2/dev.tsv (LENS_SHARED).
set -euo pipefail
lensd=$(realpath "${1:-build/lensd}")
rows=${ROWS:-64} steps=${STEPS:-20}
shared=${LENS_SHARED:-../shared}
data="$shared/data/sst2/dev.tsv"
[ -f "$data" ] || { echo "bench-shard: $data not found (LENS_SHARED)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "bench-shard: load average $(cut -d' ' -f1-3 /proc/loadavg) at start, $(nproc) cores"
"$lensd" mkmodel --arch bert --preset base --task classification --seed 1 --out "$work/bert-base" >/dev/null
mkdir -p "$work/data" && cp "$data" "$work/data/dev.tsv"
printf '{"data": "dev.tsv", "max_rows": %d, "steps": %d}\n' "$rows" "$steps" >"$work/params.json"
now() { date +%s.%N; }
run() { "$lensd" job run --model "$work/bert-base" --data-dir "$work/data" --kind head-importance \
          --params "$work/params.json" "$@" 2>/dev/null; }
merge() { "$lensd" job merge --model "$work/bert-base" --data-dir "$work/data" --threads "$1" --out "$2" \
            "${@:3}" 2>/dev/null; }

t0=$(now)
run --shard 0/1 --threads 2 --out "$work/one.lpart"
t1=$(now)
merge 2 "$work/one.json" "$work/one.lpart"
t2=$(now)
run --shard 0/2 --threads 1 --out "$work/two-0.lpart" &
a=$!
run --shard 1/2 --threads 1 --out "$work/two-1.lpart" &
b=$!
wait $a && wait $b
t3=$(now)
merge 2 "$work/two.json" "$work/two-0.lpart" "$work/two-1.lpart"
t4=$(now)
same=$(python3 - "$work/one.json" "$work/two.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b): r.pop("timing_ms", None)
print("identical" if a == b else "DIFFERENT")
PY
)
awk -v r="$rows" -v s="$steps" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v t3="$t3" -v t4="$t4" -v same="$same" 'BEGIN {
  one = t2 - t0; two = t4 - t2
  printf "head-importance, %d rows, m = %d, BERT-base shape\n", r, s
  printf "  1 process, 2 threads:     %7.1f s (examples %.1f s, merge %.1f s)\n", one, t1 - t0, t2 - t1
  printf "  2 shards x 1 thread:      %7.1f s (shards %.1f s, merge %.1f s = %.1f%%)\n", two, t3 - t2, t4 - t3, 100 * (t4 - t3) / two
  printf "  ratio 2 shards / 1 process: %.2f; results %s\n", two / one, same
}'
[ "$same" = identical ]
