#!/usr/bin/env bash
# make test-web: the dashboard in Debian's headless chromium against live
# lensd servers on the demo models in models/:
#   A  plain lensd (every view, 1280x800 and 390x844), with a random micro
#      OLMoE (lensd mkmodel) as demo-moe for the expert routing
#   B  lensd with --api-key-file (the page asks for the key after a 401) and
#      --debug-delay-ms 3000 (a job is still waiting when Cancel is clicked)
#   C  nginx in front of A under the path prefix /lensd/, with a config made
#      from deploy/compose/nginx.conf (same limits, logs and error pages;
#      upstream = A, a prefix location added, paths moved to a temp folder)
# Screenshots go to $BUILD/web-shots/. Needs chromium, nginx, node and npm
# (scripts/deps.sh web) and puppeteer-core from tests/web/package-lock.json.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
LENSD=$BUILD/lensd
tmp=$(mktemp -d /tmp/lensd-web-test-XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -f "$tmp/nginx.pid" ] && kill "$(cat "$tmp/nginx.pid")" 2>/dev/null || true
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

for m in demo-sst2 demo-mlm demo-gpt2 demo-identifiable; do
  if [ ! -f "models/$m/config.json" ]; then
    echo "SKIP: models/$m missing: the dashboard test needs the demo models"
    echo "test_web: 0 passed, 0 failed, 1 skipped"
    exit 0
  fi
done
(cd tests/web && npm ci --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
models="--model demo-sst2=models/demo-sst2 --model demo-mlm=models/demo-mlm --model demo-gpt2=models/demo-gpt2 --model demo-identifiable=models/demo-identifiable"
start_lensd() { # port, extra args...
  local port=$1; shift
  # shellcheck disable=SC2086
  "$LENSD" serve --listen "127.0.0.1:$port" --web-dir web $models "$@" 2>>"$tmp/lensd-$port.log" &
  pids+=($!)
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "lensd on $port did not become ready:" >&2; cat "$tmp/lensd-$port.log" >&2; return 1
}

# SST-2's TSVs for the Jobs view's dataset picker, when ../shared is there
data_args=()
[ -d ../shared/data/sst2 ] && data_args=(--data-dir ../shared/data/sst2)
# a mixture-of-experts model (random weights) for the text view's expert routing
"$LENSD" mkmodel --arch olmoe --preset micro --out "$tmp/demo-moe" >/dev/null
port_a=$(free_port); start_lensd "$port_a" "${data_args[@]}" --model "demo-moe=$tmp/demo-moe"
port_b=$(free_port); echo "web-test-key" >"$tmp/keys"; start_lensd "$port_b" --api-key-file "$tmp/keys" --debug-delay-ms 3000

port_c=$(free_port)
sed -e "s|^pid .*|pid $tmp/nginx.pid;|" \
    -e "s|^worker_processes .*|worker_processes 1;|" \
    -e "s|error_log /dev/stderr|error_log $tmp/nginx-error.log|" \
    -e "s|access_log /dev/stdout|access_log $tmp/nginx-access.log|" \
    -e "s|server lensd-1:8080|server 127.0.0.1:$port_a|" -e "/server lensd-2:8080/d" \
    -e "s|listen 8080;|listen 127.0.0.1:$port_c;|" -e "/listen \[::\]:8080;/d" \
    -e "s|^http {|http {\n    client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy;\n    fastcgi_temp_path $tmp/fcgi; uwsgi_temp_path $tmp/uwsgi; scgi_temp_path $tmp/scgi;|" \
    -e "s|^        location / {|        # test: the dashboard and API under a path prefix, with the same limits\n        location = /lensd { return 301 /lensd/; }\n        location = /lensd/ { proxy_pass http://lensd/; }\n        location /lensd/web/ { proxy_pass http://lensd/web/; }\n        location /lensd/ {\n            limit_req zone=lensd_per_client burst=20 nodelay;\n            limit_conn lensd_conn 32;\n            proxy_pass http://lensd/;\n        }\n\n        location / {|" \
    deploy/compose/nginx.conf >"$tmp/nginx.conf"
grep -q "127.0.0.1:$port_a" "$tmp/nginx.conf" && grep -q "location /lensd/" "$tmp/nginx.conf" || {
  echo "deriving the nginx test config from deploy/compose/nginx.conf failed" >&2; exit 1; }
nginx -e "$tmp/nginx-error.log" -c "$tmp/nginx.conf" -p "$tmp"
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port_c/lensd/healthz" >/dev/null && break; sleep 0.1; done

mkdir -p "$BUILD/web-shots"
LENSD_URL="http://127.0.0.1:$port_a/" KEY_URL="http://127.0.0.1:$port_b/" API_KEY=web-test-key \
GATEWAY_URL="http://127.0.0.1:$port_c/lensd/" SHOTS="$BUILD/web-shots" CHROMIUM=${CHROMIUM:-/usr/bin/chromium} \
  node tests/web/test.mjs
