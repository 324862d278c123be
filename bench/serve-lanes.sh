#!/usr/bin/env bash
# bench/serve-lanes.sh [LENSD] - latency of POST /v1/forward while exact
# hidden attribution runs (issue 16 item 3: cost lanes).
#
# For --fast-workers 0 (one lane: forwards queue behind the analysis) and 1
# (the default fast lane), starts `lensd serve --workers 1` on
# models/demo-sst2, keeps one exact /v1/hidden-attribution of ~62 tokens
# running back to back, and runs wrk at concurrency 8 against /v1/forward
# for $DURATION seconds (default 30; wrk's timeout is 120 s so that waits
# behind an analysis are measured, not dropped): requests/s, p50/p99
# latency, errors, and the p99 ratio of the two configurations.
# Env: DURATION, TEXT (forward text).
set -euo pipefail
WRK_LUA=$(dirname "$0")/wrk-post.lua
LENSD=${1:-build/lensd}
DURATION=${DURATION:-30}
TEXT=${TEXT:-"it 's a charming and often affecting journey . "}
MODEL=${MODEL:-models/demo-sst2}
command -v wrk >/dev/null || { echo "bench/serve-lanes.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "bench/serve-lanes.sh: $MODEL is missing" >&2; exit 1; }

work=$(mktemp -d /tmp/lensd-bench-lanes-XXXXXX)
pid="" heavy=""
cleanup() {
  [ -n "$heavy" ] && kill "$heavy" 2>/dev/null && wait "$heavy" 2>/dev/null
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

python3 -c 'import json, sys; print(json.dumps({"text": sys.argv[1]}))' "$TEXT" >"$work/forward.json"
python3 -c 'import json; print(json.dumps({"text": "a charming film " * 20, "method": "exact", "layers": [2]}))' \
  >"$work/heavy.json"

declare -A P99
echo "model: $MODEL   lensd: $("$LENSD" version)   --workers 1   wrk c=8 for ${DURATION}s on /v1/forward during exact hidden attribution"
printf '%-14s %10s %12s %10s %10s %8s\n' fast-workers analyses requests/s p50_ms p99_ms errors
for fast in 0 1; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$LENSD" serve --listen "127.0.0.1:$port" --model "demo=$MODEL" --workers 1 --fast-workers "$fast" \
    --timeout 600 --queue 1024 2>"$work/lensd.log" &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  url="http://127.0.0.1:$port"
  : >"$work/heavy.count"
  ( while :; do
      curl -s -o /dev/null -w '%{http_code}\n' "$url/v1/hidden-attribution" -H 'Content-Type: application/json' \
        -d @"$work/heavy.json" >>"$work/heavy.count"
    done ) &
  heavy=$!
  # until the analysis holds the general worker
  for _ in $(seq 200); do
    curl -s "$url/metrics" | grep -q '^lensd_workers_busy [1-9]' && break
    sleep 0.05
  done
  read -r _ n rps p50 p99 errs < <(WRK_BODY=$work/forward.json wrk -t 4 -c 8 -d "${DURATION}s" --timeout 120s --latency -s "$WRK_LUA" \
      "$url/v1/forward" | grep '^RESULT')
  kill "$heavy" 2>/dev/null; wait "$heavy" 2>/dev/null || true; heavy=""
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  P99[$fast]=$p99
  printf '%-14s %10s %12s %10s %10s %8s\n' "$fast" "$(grep -c 200 "$work/heavy.count" || true)" "$rps" "$p50" "$p99" "$errs"
done
python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f"p99 of /v1/forward: one lane {a:.1f} ms, fast lane {b:.1f} ms ({a / b:.0f}x lower)")' \
  "${P99[0]}" "${P99[1]}"
