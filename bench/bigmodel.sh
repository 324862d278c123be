#!/usr/bin/env bash
# make bigmodel: big random checkpoints in BF16, sharded, served by lensd
# (issue 15: weights resident in their file dtype). Not part of make test
# or make bench: it writes gigabytes and takes minutes.
#
# For each ARCH:PRESET of BIGMODEL_MODELS (default llama:1b llama:8b, the
# Llama-3.2-1B and Llama-3.1-8B shapes with their real tensor names, 2.5 and
# 16 GB in BF16; gpt2:xl is GPT-2 XL's, 1.56 B): `lensd mkmodel --dtype bf16
# --max-shard-size 2GB`
# (kept for the next run), `lensd serve` with only that model, then POST
# /v1/forward and /v1/attention with 64 tokens, and prints the load time,
# each request's time (the forward twice: the first one faults the mapped
# weights in; a mixture-of-experts checkpoint also "outputs": ["router"]), the peak RSS (VmHWM of the server) against the
# checkpoint size + 1.5 GiB (PASS / MISS) and the free disk it needs first.
#
#   bench/bigmodel.sh [BUILD/lensd]
#   BIGMODEL_DIR=DIR       where the checkpoints go (default build/bigmodels)
#   BIGMODEL_MODELS="gpt2:xl llama:8b"
#   BIGMODEL_PORT=18931
# (awk prints with %.0f: mawk's %d stops at 2^31 - 1, i.e. 2047 MiB)
set -uo pipefail
cd "$(dirname "$0")/.."

LENSD=${1:-build/lensd}
DIR=${BIGMODEL_DIR:-build/bigmodels}
MODELS=${BIGMODEL_MODELS:-llama:1b llama:8b}
PORT=${BIGMODEL_PORT:-18931}
T=64
SLACK=$((3 << 29)) # 1.5 GiB
mkdir -p "$DIR"
status=0

log() { printf 'bigmodel: %s\n' "$*" >&2; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# 64 token ids inside any vocabulary (>= 1000)
IDS=$(seq 0 $((T - 1)) | awk '{ printf "%s%d", (NR > 1 ? "," : ""), 17 + ($1 * 131) % 900 }')

for spec in $MODELS; do
  arch=${spec%%:*} preset=${spec#*:}
  out=$DIR/$arch-$preset-bf16
  if [ ! -f "$out/config.json" ]; then
    free=$(df -B1 --output=avail "$DIR" | tail -1)
    log "$spec: writing $out ($((free >> 30)) GiB free on $(df --output=target "$DIR" | tail -1))"
    t0=$(now)
    if ! "$LENSD" mkmodel --arch "$arch" --preset "$preset" --seed 1 --dtype bf16 --max-shard-size 2GB \
      --out "$out.tmp"; then
      log "$spec: mkmodel failed"
      rm -rf "$out.tmp"
      status=1
      continue
    fi
    mv "$out.tmp" "$out"
    log "$spec: written in $(secs "$t0" "$(now)") s"
  fi
  ckpt=$(du -cb "$out"/*.safetensors | tail -1 | cut -f1)
  log "$spec: checkpoint $((ckpt >> 20)) MiB in $(ls "$out"/*.safetensors | wc -l) file(s)"
  # page cache: the load time counts reading the shards from disk only when they are not cached
  t0=$(now)
  "$LENSD" serve --listen "127.0.0.1:$PORT" --timeout 900 --model "big=$out" >"$DIR/serve-$arch-$preset.log" 2>&1 &
  pid=$!
  ready=
  for _ in $(seq 1 3000); do
    if curl -sf "http://127.0.0.1:$PORT/v1/models/big" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  load=$(secs "$t0" "$(now)")
  if [ -z "$ready" ]; then
    log "$spec: server did not come up (see $DIR/serve-$arch-$preset.log)"
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    status=1
    continue
  fi
  rss_loaded=$(awk '/VmRSS/ { printf "%.0f", $2 * 1024 }' "/proc/$pid/status")
  times=""
  # the first forward faults the weights in from the page cache (or disk): BF16
  # maps are not touched at load; the second one is the steady state
  # a mixture-of-experts checkpoint also answers the routing of every token
  eps="forward forward attention"
  grep -q '"num_experts"\|"num_local_experts"' "$out/config.json" && eps="$eps router"
  for ep in $eps; do
    [ "$ep" = forward ] && body="{\"model\":\"big\",\"input_ids\":[$IDS],\"outputs\":[\"logits\"],\"positions\":[$((T - 1))]}"
    [ "$ep" = attention ] && body="{\"model\":\"big\",\"input_ids\":[$IDS],\"layers\":[1]}"
    [ "$ep" = router ] && body="{\"model\":\"big\",\"input_ids\":[$IDS],\"outputs\":[\"router\"]}"
    code=$(curl -s -o "$DIR/$ep-$arch-$preset.json" -w '%{http_code} %{time_total}' -H 'Content-Type: application/json' \
      -d "$body" "http://127.0.0.1:$PORT/v1/${ep/router/forward}")
    log "$spec: /v1/${ep/router/forward (router)} T=$T: HTTP ${code% *} in ${code#* } s"
    [ "${code% *}" = 200 ] || { status=1; head -c 300 "$DIR/$ep-$arch-$preset.json" >&2; echo >&2; }
    times="$times $ep=${code#* }s"
  done
  hwm=$(awk '/VmHWM/ { printf "%.0f", $2 * 1024 }' "/proc/$pid/status")
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  verdict=PASS
  [ "$hwm" -le $((ckpt + SLACK)) ] || { verdict=MISS; status=1; }
  printf '%s: load %s s;%s; RSS after load %d MiB, peak %d MiB vs checkpoint %d MiB + 1536 MiB: %s\n' \
    "$spec" "$load" "$times" $((rss_loaded >> 20)) $((hwm >> 20)) $((ckpt >> 20)) "$verdict"
done
exit $status
