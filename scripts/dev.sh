#!/usr/bin/env bash
# The two commands of README.md, for a fresh Debian 12 machine:
#   bash scripts/dev.sh run    install what is missing, build, start lensd on the demo models
#   bash scripts/dev.sh test   install what is missing, build, run the whole test suite,
#                              then the dashboard in headless chromium (make test-web)
# Missing Debian packages are installed when run as root; otherwise the exact
# apt-get line is printed.
set -eu
cd "$(dirname "$0")/.."
case "${1:-}" in
  run | test) ;;
  *) echo "usage: $0 run|test" >&2; exit 2 ;;
esac
if ! command -v make >/dev/null || ! command -v cc >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "run: sudo apt-get update && sudo apt-get install -y make build-essential" >&2
    exit 1
  fi
  apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q make build-essential >&2
fi
bash scripts/deps.sh "$([ "$1" = test ] && echo test || echo build)"
if [ "$1" = test ]; then
  make -j"$(nproc)" test
  exec make test-web
fi
exec make -j"$(nproc)" "$1"
