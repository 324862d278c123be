#!/usr/bin/env bash
# Makes sure the Debian packages lensd needs are installed.
#   deps.sh build   compiler, libraries, test client (make, make run)
#   deps.sh test    + clang with libFuzzer and the sanitizer runtimes, python3
#                   and PyYAML for the Python client test and the OpenAPI validator,
#                   PyTorch and numpy for the reference comparisons (test_families,
#                   test_decoder_ops), zsh for the doc examples, node and npm for
#                   the tokenizer oracle (make test, make fuzz)
#   deps.sh bench   + PyTorch (python3-torch), wrk and node for the peers
#   deps.sh web     + chromium, nginx and node for make test-web
#   deps.sh arm64   + the aarch64 cross compiler, qemu-user and the arm64
#                   libraries (make test-arm64, scripts/test-arm64.sh); adds
#                   dpkg's arm64 architecture first. libonig-dev is not
#                   multi-arch co-installable, so only libonig5:arm64 comes
#                   (test-arm64.sh links it by a symlink)
# As root it installs what is missing with apt-get; otherwise it prints the
# exact apt-get line and fails.
set -eu
build_pkgs="build-essential pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev liblapacke-dev libutf8proc-dev libcurl4-openssl-dev libonig-dev"
# a NodeSource nodejs already ships npm and conflicts with Debian's npm package
node_pkgs="nodejs npm"
command -v node >/dev/null && command -v npm >/dev/null && node_pkgs=""
# Debian 12: libFuzzer and the ASan/UBSan/TSan runtimes for clang 14 are in libclang-rt-14-dev
test_pkgs="clang libclang-rt-14-dev python3 python3-yaml python3-torch python3-numpy zsh $node_pkgs"
bench_pkgs="python3-torch python3-numpy wrk $node_pkgs"
web_pkgs="chromium nginx $node_pkgs"
arm64_pkgs="crossbuild-essential-arm64 qemu-user libmicrohttpd-dev:arm64 libjansson-dev:arm64 libopenblas-dev:arm64 liblapacke-dev:arm64 libutf8proc-dev:arm64 libcurl4-openssl-dev:arm64 libonig5:arm64"
case "${1:-build}" in
  build) want=$build_pkgs ;;
  test) want="$build_pkgs $test_pkgs" ;;
  bench) want="$build_pkgs $bench_pkgs" ;;
  web) want="$build_pkgs $web_pkgs" ;;
  arm64) want="$build_pkgs $arm64_pkgs" ;;
  *) echo "usage: $0 build|test|bench|web|arm64" >&2; exit 2 ;;
esac
# installed for the architecture asked (name:arch), else this machine's (or
# for all): a foreign one does not count (libonig-dev is not multi-arch, so
# an arm64 copy would replace the native one and the build fail at -lonig)
missing=""
for p in $want; do
  arch=$(dpkg --print-architecture)
  case $p in *:*) arch=${p##*:} ;; esac
  dpkg-query -W -f='${Status} ${Architecture}\n' "$p" 2>/dev/null |
    grep -qE "^install ok installed ($arch|all)\$" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "lensd needs these Debian packages; run:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y$missing" >&2
  exit 1
fi
echo "installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
if [ "${1:-build}" = arm64 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
fi
apt-get update -q >&2
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing >&2
