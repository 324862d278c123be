#!/usr/bin/env bash
# deploy/image-test.sh (make image-test, make image-test-arm64): builds the
# top-level Dockerfile and starts the image, with no Docker engine.
#
#   1. base image: debian:12-slim cannot be pulled here (no registry), so it is
#      made the way Debian's official image is: debootstrap --variant=minbase
#      bookworm from the apt mirror of this machine, the slim image's dpkg
#      excludes, committed into a private buildah store as
#      docker.io/library/debian:12-slim (cached in build/image-test/).
#   2. build: buildah bud --arch of the unchanged Dockerfile (vfs storage,
#      chroot isolation, layer cache, --pull=never, docker format so
#      HEALTHCHECK stays).
#   3. check the image config: architecture (and lensd's ELF machine),
#      non-root user, port, volume, healthcheck, entrypoint, every LENSD_*
#      variable.
#   4. run: buildah run the image's entrypoint as the image's user (10001) on
#      127.0.0.1:$IMAGE_TEST_PORT; wait for /readyz; GET /healthz, /v1/info
#      (gemm.kernel), /v1/models; POST /v1/forward and /v1/tokenize on the demo
#      models, the forward logits and attentions compared with this machine's
#      build/lensd on the same input; run the image's HEALTHCHECK command;
#      check /proc says uid 10001; SIGTERM and expect a clean drain (exit 0,
#      "stopped").
#
# IMAGE_TEST_ARCH=arm64 (make image-test-arm64) does all of it for linux/arm64
# on an x86-64 machine, under emulation: debootstrap --arch=arm64 --foreign
# and its second stage run in the chroot, and every arm64 binary (the
# Dockerfile's RUN steps, lensd itself) runs under Debian's
# qemu-aarch64-static, registered with binfmt_misc with the F (fix-binary)
# flag: the kernel opens the interpreter at registration, so it is found from
# inside buildah's chroot, where the host's /usr/libexec does not exist. Its
# own store, base image and tag (build/image-test-arm64/,
# localhost/lensd:image-test-arm64), so the host image's cache is untouched.
# Correctness only: emulated gcc makes the build take tens of minutes
# (docs/operations.md "arm64").
#
# Needs root (apt-get install buildah debootstrap, and qemu-user-static for
# arm64, when missing). Network: the Debian mirror only (debootstrap, and the
# Dockerfile's apt-get); all test traffic goes to 127.0.0.1. Re-runs reuse the
# base image and the layer cache.
# Environment: IMAGE_TEST_ARCH (this machine's dpkg architecture, or arm64),
# IMAGE_TEST_DIR (build/image-test, build/image-test-ARCH for another
# architecture), IMAGE_TEST_PORT (18080), IMAGE_TEST_LENSD (the host binary the
# forward pass is compared with; build/lensd), DEBIAN_MIRROR (from
# /etc/apt/sources.list*), IMAGE_TEST_OPT (the build argument OPT, i.e. the
# Makefile's OPT; default: the Dockerfile's), IMAGE_TEST_SOURCE (worktree or
# head, see below), IMAGE_TEST_KEEP=1 keeps the container.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
host_arch=$(dpkg --print-architecture)
arch=${IMAGE_TEST_ARCH:-$host_arch}
suffix=""
qemu=""
ready_s=60 # how long lensd may take to load the demo models and calibrate the cost model
if [ "$arch" != "$host_arch" ]; then
  case $arch in
    arm64) qemu=aarch64 ;;
    *) printf 'image-test: FAIL: IMAGE_TEST_ARCH=%s: this machine (%s) or arm64\n' "$arch" "$host_arch" >&2; exit 1 ;;
  esac
  suffix=-$arch
  ready_s=900
fi
work=${IMAGE_TEST_DIR:-$src/build/image-test$suffix}
port=${IMAGE_TEST_PORT:-18080}
image=localhost/lensd:image-test$suffix
base=docker.io/library/debian:12-slim
ref_lensd=${IMAGE_TEST_LENSD:-$src/build/lensd}
t0=$(date +%s)
step() { printf '== %s (%ds)\n' "$*" $(($(date +%s) - t0)); }
fail() { printf 'image-test: FAIL: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root (buildah with vfs storage and chroot isolation, debootstrap)"
[ -x "$ref_lensd" ] || fail "no $ref_lensd to compare the image's /v1/forward with (make all)"

# ------------------------------------------------------------------ tools
need=""
command -v buildah >/dev/null || need="$need buildah"
command -v debootstrap >/dev/null || need="$need debootstrap"
command -v curl >/dev/null || need="$need curl"
command -v python3 >/dev/null || need="$need python3"
[ -n "$qemu" ] && ! command -v "qemu-$qemu-static" >/dev/null && need="$need qemu-user-static"
if [ -n "$need" ]; then
  step "installing$need"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $need >/dev/null
fi

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(sed -n 's/^URIs:[[:space:]]*\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
fi

# The kernel runs the foreign architecture's binaries with qemu-user-static.
# F: the interpreter is opened now, not at each exec inside a chroot.
# qemu-user-binfmt's entry (the dynamic qemu, no F) is replaced.
binfmt_register() {
  local dir=/proc/sys/fs/binfmt_misc conf=/usr/lib/binfmt.d/qemu-$qemu.conf
  local entry=$dir/qemu-$qemu
  [ -e "$dir/register" ] || mount -t binfmt_misc binfmt_misc "$dir" ||
    fail "cannot mount binfmt_misc on $dir: no way to run $arch binaries here"
  if [ -e "$entry" ]; then
    grep -q '^enabled' "$entry" && grep -q '^flags: .*F' "$entry" && return 0
    echo -1 >"$entry"
  fi
  grep -q ':[A-Z]*F[A-Z]*$' "$conf" || fail "$conf has no F flag (qemu-user-static's has)"
  cat "$conf" >"$dir/register"
  grep -q '^flags: .*F' "$entry" || fail "binfmt_misc did not take $conf"
}
if [ -n "$qemu" ]; then
  binfmt_register
  echo "binfmt_misc: $(sed -n 's/^interpreter //p' "/proc/sys/fs/binfmt_misc/qemu-$qemu") for $arch binaries ($(grep '^flags' "/proc/sys/fs/binfmt_misc/qemu-$qemu"))"
fi

mkdir -p "$work"
B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot

# ------------------------------------------------------------ base image
tbase=$(date +%s)
if ! "${B[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  # The tree exists only until it is committed (or the script fails): under
  # build/ its etc/cron.d would match the Makefile's -include of
  # build/*/*/*/*.d and stop every make. --one-file-system: never into a /proc
  # the second stage left mounted.
  r=$work/rootfs
  trap 'rm -rf --one-file-system "$r"' EXIT
  rm -rf --one-file-system "$r"
  step "debootstrap bookworm (minbase, $arch) from $mirror"
  # another architecture: unpack here, configure in the chroot under qemu
  foreign=()
  [ -n "$qemu" ] && foreign=(--foreign)
  debootstrap --variant=minbase --arch="$arch" "${foreign[@]}" bookworm "$r" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; fail "debootstrap"; }
  if [ -n "$qemu" ]; then
    step "debootstrap --second-stage in the chroot (emulated $arch)"
    chroot "$r" /debootstrap/debootstrap --second-stage >>"$work/debootstrap.log" 2>&1 ||
      { tail -20 "$work/debootstrap.log" >&2; fail "debootstrap --second-stage"; }
  fi
  step "committing the base image as $base"
  # what debuerreotype does for the official slim image
  cat >"$r/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" >"$r/etc/apt/sources.list"
  rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb
  : >"$r/etc/resolv.conf"
  ctr=$("${B[@]}" from scratch)
  mnt=$("${B[@]}" mount "$ctr")
  tar -C "$r" --numeric-owner -cf - . | tar -C "$mnt" --numeric-owner -xpf -
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --os linux --arch "$arch" "$ctr"
  "${B[@]}" commit --quiet --rm "$ctr" "$base" >/dev/null
  rm -rf --one-file-system "$r"
  trap - EXIT
fi
base_s=$(($(date +%s) - tbase))

# ------------------------------------------------------------------ build
# IMAGE_TEST_SOURCE=worktree (default) builds the work tree as it is;
# =head builds the last commit (what a fresh clone builds) plus the work
# tree's Dockerfile, .dockerignore and deploy/, so the image can be tested
# while other files are being edited.
context=$src
if [ "${IMAGE_TEST_SOURCE:-worktree}" = head ]; then
  context=$work/context
  rm -rf "$context" && mkdir -p "$context"
  git -C "$src" archive HEAD | tar -C "$context" -xf -
  cp "$src/Dockerfile" "$src/.dockerignore" "$context/"
  rm -rf "$context/deploy" && cp -r "$src/deploy" "$context/deploy"
  echo "context: $(git -C "$src" log -1 --format='%h %s' | head -c 100) + Dockerfile, deploy/"
fi
step "buildah bud (log: $work/build.log)"
tb=$(date +%s)
build_args=()
[ -n "${IMAGE_TEST_OPT:-}" ] && build_args=(--build-arg "OPT=$IMAGE_TEST_OPT")
if ! "${B[@]}" bud --arch "$arch" --isolation chroot --layers --pull=never --format docker \
     --network host "${build_args[@]}" -f "$context/Dockerfile" -t "$image" "$context" >"$work/build.log" 2>&1; then
  tail -30 "$work/build.log" >&2
  fail "buildah bud"
fi
build_s=$(($(date +%s) - tb))
grep -E '^(STEP|COMMIT)|--> (Using cache|[0-9a-f]{12})' "$work/build.log" | tail -4 || true

# ----------------------------------------------------------- image config
step "image config"
cfg() { "${B[@]}" inspect --type image --format "$1" "$image"; }
image_arch=$(cfg '{{.OCIv1.Architecture}}')
user=$(cfg '{{.Docker.Config.User}}')
ports=$(cfg '{{.Docker.Config.ExposedPorts}}')
vols=$(cfg '{{.Docker.Config.Volumes}}')
entry=$(cfg '{{.Docker.Config.Entrypoint}}')
"${B[@]}" inspect --type image "$image" >"$work/inspect.json"
health=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Docker"]["config"].get("Healthcheck"))' "$work/inspect.json")
envs=$(cfg '{{range .Docker.Config.Env}}{{println .}}{{end}}')
size=$("${B[@]}" images --format '{{.Size}}' "$image" 2>/dev/null | head -1 || echo "?")
echo "arch=$image_arch user=$user ports=$ports volumes=$vols entrypoint=$entry size=$size"
[ "$image_arch" = "$arch" ] || fail "image architecture is '$image_arch', want $arch"
[ "${user%%:*}" = 10001 ] || fail "image user is '$user', want 10001"
case $ports in *8080*) ;; *) fail "8080 not exposed" ;; esac
case $vols in *"/models"*) ;; *) fail "/models is not a volume" ;; esac
[ "$entry" = "[/usr/local/bin/lensd serve]" ] || fail "entrypoint is $entry"
case $health in *healthz*) ;; *) fail "no HEALTHCHECK on /healthz" ;; esac
for flag in $(sed -n 's/^[[:space:]]*{"\([a-z-]*\)", "LENSD_.*/\1/p' "$context/server/config.c"); do
  case $flag in debug-*) continue ;; esac # testing hooks, not settings (as deploy/validate.sh)
  var=LENSD_$(echo "$flag" | tr 'a-z-' 'A-Z_')
  grep -q "^$var=" <<<"$envs" || fail "$var (--$flag) is not declared in the image"
done

# -------------------------------------------------------------------- run
ctr=$("${B[@]}" from --arch "$arch" --pull-never --name lensd-image-test-$$ "$image")
runner=""
cleanup() {
  [ -n "$runner" ] && kill "$runner" 2>/dev/null && wait "$runner" 2>/dev/null
  [ "${IMAGE_TEST_KEEP:-0}" = 1 ] || "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# the binary itself, not only the label: ELF e_machine (0x3e x86-64, 0xb7 aarch64)
mnt=$("${B[@]}" mount "$ctr")
machine=$(od -An -tx2 -j18 -N2 "$mnt/usr/local/bin/lensd" | tr -d ' ')
"${B[@]}" umount "$ctr" >/dev/null
case $arch:$machine in
  amd64:003e | arm64:00b7) echo "  /usr/local/bin/lensd: ELF machine 0x$machine ($arch)" ;;
  *) fail "/usr/local/bin/lensd has ELF machine 0x$machine, not $arch's" ;;
esac
log=$work/serve.log
step "starting the image's entrypoint on 127.0.0.1:$port as the image's user"
tstart=$(date +%s)
# buildah run uses the image's user, working directory and environment; the
# listen address is moved to loopback for the test.
"${B[@]}" run --isolation chroot --network host --env LENSD_LISTEN=127.0.0.1:$port "$ctr" -- \
  /usr/local/bin/lensd serve >"$log" 2>&1 &
runner=$!
url=http://127.0.0.1:$port
ready=0
for _ in $(seq 1 $((ready_s * 5))); do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz" || true)" = 200 ]; then ready=1; break; fi
  kill -0 "$runner" 2>/dev/null || break
  sleep 0.2
done
[ "$ready" = 1 ] || { cat "$log" >&2; fail "/readyz never answered 200"; }
start_s=$(($(date +%s) - tstart))
echo "readyz 200 after $start_s s"

check() { # name expected-status method path [body]
  local name=$1 want=$2 method=$3 path=$4 body=${5:-} out code
  out=$work/resp-$name.json
  if [ -n "$body" ]; then
    code=$(curl -s -o "$out" -w '%{http_code}' -X "$method" -H 'Content-Type: application/json' \
      --data "$body" "$url$path")
  else
    code=$(curl -s -o "$out" -w '%{http_code}' -X "$method" "$url$path")
  fi
  [ "$code" = "$want" ] || { head -c 600 "$out" >&2; echo >&2; fail "$method $path: $code, want $want"; }
  printf '  %-34s %s  %s\n' "$method $path" "$code" "$(head -c 160 "$out" | tr -d '\n')"
}
check healthz 200 GET /healthz
check info 200 GET /v1/info
# no lensd GEMM kernel outside x86-64: every product is OpenBLAS's there
kernel=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gemm"]["kernel"])' "$work/resp-info.json")
[ "$arch" = amd64 ] || [ "$kernel" = blas ] || fail "/v1/info gemm.kernel is $kernel on $arch, want blas"
check models 200 GET /v1/models
grep -q '"demo-sst2"' "$work/resp-models.json" && grep -q '"demo-gpt2"' "$work/resp-models.json" ||
  fail "/v1/models does not list demo-sst2 and demo-gpt2 from /models"
check tokenize 200 POST /v1/tokenize '{"model":"demo-gpt2","text":"Hello, world"}'
check forward 200 POST /v1/forward \
  '{"model":"demo-sst2","text":"the image works","outputs":["logits","attentions"],"layers":[1]}'
grep -q '"logits"' "$work/resp-forward.json" && grep -q '"attentions"' "$work/resp-forward.json" ||
  fail "/v1/forward answer has no logits/attentions"
check metrics 200 GET /metrics
grep -q '^lensd_requests_total{method="POST",route="/v1/forward",status="200"} 1' "$work/resp-metrics.json" ||
  fail "/metrics did not count the forward request"

# The image's lensd (its -march, its OpenBLAS, on arm64 its NEON kernels under
# qemu) computes what this machine's does: same tokens, and logits and
# attentions within 1e-4 of the largest value (float32 sums in another order;
# the JSON's 6 or 9 significant digits are far below that).
step "the image's forward passes against $ref_lensd"
check forward-gpt2 200 POST /v1/forward \
  '{"model":"demo-gpt2","text":"The image runs lensd on another CPU.","outputs":["logits"],"format":{"precision":9}}'
"$ref_lensd" forward --model "$src/models/demo-sst2" --outputs logits,attentions --layers 1 "the image works" \
  >"$work/host-forward.json"
"$ref_lensd" forward --model "$src/models/demo-gpt2" --outputs logits --precision 9 \
  "The image runs lensd on another CPU." >"$work/host-forward-gpt2.json"
compare() { # image-answer host-answer key..
  python3 - "$@" <<'EOF'
import json, sys

def numbers(v, out):
    if isinstance(v, list):
        for x in v: numbers(x, out)
    elif isinstance(v, dict):
        for k in sorted(v): numbers(v[k], out)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        out.append(float(v))
    return out

image, host = (json.load(open(p)) for p in sys.argv[1:3])
if image["tokens"] != host["tokens"]:
    sys.exit(f"tokens differ: image {image['tokens']}, host {host['tokens']}")
for key in sys.argv[3:]:
    a, b = numbers(image.get(key), []), numbers(host.get(key), [])
    if not b or len(a) != len(b):
        sys.exit(f"{key}: {len(a)} values in the image's answer, {len(b)} in the host's")
    scale = max(abs(x) for x in b) or 1.0
    err = max(abs(x - y) for x, y in zip(a, b)) / scale
    print(f"  {image['model']} {key}: {len(b)} values, max |image - host| / max |host| = {err:.1e}")
    if err > 1e-4:
        sys.exit(f"{image['model']} {key} differs by {err:.1e} of its largest value, want <= 1e-4")
EOF
}
compare "$work/resp-forward.json" "$work/host-forward.json" logits attentions || fail "demo-sst2 forward differs from $ref_lensd"
compare "$work/resp-forward-gpt2.json" "$work/host-forward-gpt2.json" logits || fail "demo-gpt2 forward differs from $ref_lensd"

# the process runs as uid 10001 (found by its listening socket's inode)
pid=""
inode=$(awk -v p="$(printf ':%04X' "$port")" '$2 ~ p"$" && $4 == "0A" {print $10; exit}' /proc/net/tcp)
if [ -n "$inode" ]; then
  for fd in /proc/[0-9]*/fd/*; do
    [ "$(readlink "$fd" 2>/dev/null)" = "socket:[$inode]" ] && { pid=${fd#/proc/}; pid=${pid%%/*}; break; }
  done
fi
[ -n "$pid" ] || fail "cannot find the lensd process"
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
echo "  lensd pid $pid runs as uid $uid ($(tr '\0' ' ' <"/proc/$pid/cmdline"))"
[ "$uid" = 10001 ] || fail "lensd runs as uid $uid"
echo "  BLAS: $(grep -o '"core":"[^"]*","core_source":"[^"]*"' "$work/resp-info.json" || echo '?')"

# the image's own HEALTHCHECK command, run inside the container
if true; then
  python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["Docker"]["config"]["Healthcheck"]["Test"]
sys.stdout.write("".join(a + "\0" for a in t[1:]))' "$work/inspect.json" >"$work/healthcheck.argv"
  mapfile -d '' -t hcargv <"$work/healthcheck.argv"
  if "${B[@]}" run --isolation chroot --network host --env LENSD_LISTEN=127.0.0.1:$port "$ctr" -- "${hcargv[@]}"; then
    echo "  HEALTHCHECK command: healthy"
  else
    fail "the image's HEALTHCHECK command failed"
  fi
fi

# graceful shutdown: SIGTERM -> drain -> exit 0
step "SIGTERM"
kill -TERM "$pid"
rc=0
wait "$runner" || rc=$?
runner=""
grep -q '"msg":"stopped"' "$log" || { tail -5 "$log" >&2; fail "no clean stop after SIGTERM"; }
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM"
echo "  exit 0 after SIGTERM; log lines: $(wc -l <"$log") (JSON, e.g. $(grep -m1 '"route":"/v1/forward"' "$log" | head -c 200))"

# vfs keeps a full copy per layer: drop images of earlier builds (the layer
# cache of this one stays). rm -rf build/image-test frees everything.
"${B[@]}" rmi --prune >/dev/null 2>&1 || true
total=$(($(date +%s) - t0))
echo "image-test: OK ($image, $arch: base image ${base_s}s, build ${build_s}s, start ${start_s}s, total ${total}s)"
