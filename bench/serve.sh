#!/usr/bin/env bash
# bench/serve.sh [LENSD] - HTTP throughput and latency of POST /v1/forward.
#
# Starts `lensd serve` with ../shared/models/bert-tiny-sst2 (or, without
# ../shared, a random tiny BERT from `lensd mkmodel`), runs wrk at
# concurrency 1, 8 and 32 for $DURATION seconds each (default 20), and
# reports requests/s, p50/p99 latency and errors (non-2xx + socket errors),
# plus the server's RSS before the first request and after at least 100k
# requests (extra rounds at concurrency 8 top the count up when needed).
# Env: DURATION, WORKERS (default: lensd's, 1), TEXT (request text).
set -euo pipefail
WRK_LUA=$(dirname "$0")/wrk-post.lua
LENSD=${1:-build/lensd}
DURATION=${DURATION:-20}
TEXT=${TEXT:-"it 's a charming and often affecting journey . "}
command -v wrk >/dev/null || { echo "bench/serve.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }

work=$(mktemp -d /tmp/lensd-bench-serve-XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

shared=${LENS_SHARED:-../shared}
if [ -f "$shared/models/bert-tiny-sst2/config.json" ]; then
  model="$shared/models/bert-tiny-sst2"
else
  model="$work/bert-tiny"
  "$LENSD" mkmodel --arch bert --preset tiny --seed 1 --out "$model"
fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
args=(serve --listen "127.0.0.1:$port" --model "bench=$model" --queue 1024)
[ -n "${WORKERS:-}" ] && args+=(--workers "$WORKERS")
"$LENSD" "${args[@]}" 2>"$work/lensd.log" &
pid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { echo "lensd did not become ready" >&2; cat "$work/lensd.log" >&2; exit 1; }

python3 -c 'import json, sys; print(json.dumps({"model": "bench", "text": sys.argv[1]}))' "$TEXT" >"$work/forward.json"

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
rss_before=$(rss_kb)
total=0
echo "model: $model   lensd: $("$LENSD" version)   workers: ${WORKERS:-1}   duration: ${DURATION}s per run"
printf '%-12s %12s %10s %10s %8s\n' concurrency requests/s p50_ms p99_ms errors
run() { # concurrency seconds -> prints a row
  local c=$1 d=$2 t
  t=$(( c < 4 ? c : 4 ))
  read -r _ n rps p50 p99 errs < <(WRK_BODY=$work/forward.json wrk -t "$t" -c "$c" -d "${d}s" --latency -s "$WRK_LUA" \
      "http://127.0.0.1:$port/v1/forward" | grep '^RESULT')
  total=$((total + n))
  printf '%-12s %12s %10s %10s %8s\n' "$c" "$rps" "$p50" "$p99" "$errs"
}
for c in 1 8 32; do run "$c" "$DURATION"; done
while [ "$total" -lt 100000 ]; do run 8 10; done
rss_after=$(rss_kb)
echo "requests: $total   RSS before: $((rss_before / 1024)) MiB   after: $((rss_after / 1024)) MiB"
