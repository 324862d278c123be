#!/bin/sh
# Regenerates tests/fixtures: runs, once each, the command every fixture
# records in its "command" field (the PyTorch scripts in tests/reference
# against ../shared, and the tokenizer oracle, which needs the npm package
# @huggingface/transformers and npm tokenizers
# in $ORACLE_DIR). Slow and needs ../shared; not
# part of `make test` or CI. `git diff --stat tests/fixtures` shows what
# changed.
set -eu
cd "$(dirname "$0")/.."
# the recorded commands say python3: Debian's, which has python3-torch (not a pyenv shim)
PATH=/usr/bin:$PATH
[ -d ../shared/models ] || { echo "fixtures: ../shared/models is missing" >&2; exit 1; }
ORACLE_DIR=${ORACLE_DIR:-/tmp/tokoracle}
if [ ! -d "$ORACLE_DIR/node_modules/@huggingface/transformers" ] || [ ! -d "$ORACLE_DIR/node_modules/tokenizers" ]; then
    mkdir -p "$ORACLE_DIR"
    (cd "$ORACLE_DIR" && npm init -y >/dev/null && npm install --ignore-scripts @huggingface/transformers \
        tokenizers@0.23.2)
fi
python3 - <<'PY' | while IFS= read -r cmd; do
import glob, json
seen = []
for path in sorted(glob.glob("tests/fixtures/*.json")):
    with open(path) as f:
        cmd = json.load(f).get("command")
    if not cmd:
        raise SystemExit(f"{path} records no command")
    if cmd not in seen:
        seen.append(cmd)
print("\n".join(seen))
PY
    echo "fixtures: $cmd"
    sh -c "$cmd" </dev/null
done
git status --short tests/fixtures
