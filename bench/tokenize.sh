#!/usr/bin/env bash
# Tokenizer throughput (issue 30): tokens/s of lensd (bench/tokenize.c) vs
# Hugging Face's Rust tokenizers through its Node binding
# (bench/peer/tokenize_hf.mjs) on the same 1 MB of mixed text
# (bench/peer/tokenize_text.mjs: WikiText-2 valid interleaved with code,
# CJK, Thai, Arabic, Hindi, emoji, combining marks, white-space runs), one
# call on the whole text, best of REPS after a warm-up, for the real
# tokenizer.json files of Llama 3, Gemma 3 and DeepSeek-V3 (the test set-up
# tests/reference/tokoracle.sh fetches them and the library). Both sides
# run one after the other in this one run, on one thread each; the ratio is
# taken on CPU time (the machine may be shared), wall time is printed too.
# Target: lensd >= 1.0x the Rust library's tokens/s on each file.
#   bench/tokenize.sh [BUILD] [TARGETS_FILE]     (make bench-tokenize; make bench runs it too)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TARGETS=${2:-}
REPS=${BENCH_TOK_REPS:-7}
export LENS_TOKORACLE=${LENS_TOKORACLE:-$PWD/build/tokoracle}
make -s BUILD="$BUILD" "$BUILD/bench/tokenize" || exit 1
tests/reference/tokoracle.sh || exit 1
[ -d "$LENS_TOKORACLE/node_modules/tokenizers" ] || { echo "bench tokenize: no HF tokenizers under $LENS_TOKORACLE (offline?)" >&2; exit 1; }
SHARED=${LENS_SHARED:-../shared}
text=$BUILD/bench/tok-mixed.txt
mkdir -p "$BUILD/bench"
node bench/peer/tokenize_text.mjs "$SHARED/data/wikitext2/valid.txt" "$text" || exit 1
res=$BUILD/bench/tokenize-results.jsonl
: >"$res"
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
echo "== tokenizer throughput: 1 MB mixed text, one thread each, best of $REPS; $cpu, $(nproc) cores; load:$(uptime | sed 's/.*load average://')"
for name in llama3 gemma3 deepseek_v3; do
  dir=$LENS_TOKORACLE/node_modules/@lenml/tokenizer-$name/models
  { printf '{"file": "%s", "run": ' "$name"; "$BUILD/bench/tokenize" --tokenizer "$dir" --text "$text" --reps "$REPS" | tr -d '\n'; echo '}'; } >>"$res" || exit 1
  { printf '{"file": "%s", "run": ' "$name"; node bench/peer/tokenize_hf.mjs "$dir/tokenizer.json" "$text" "$REPS" | tr -d '\n'; echo '}'; } >>"$res" || exit 1
done
python3 - "$res" "$TARGETS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["file"], {})[r["run"]["impl"]] = r["run"]
targets = open(sys.argv[2], "a") if sys.argv[2] else None
print(f"  {'file':<12} {'tokens':>8} {'lensd tok/s (cpu)':>18} {'HF tok/s (cpu)':>15} {'ratio':>6}   wall ms lensd / HF")
for f, d in by.items():
    l, h = d["lensd"], d["hf"]
    same = l["tokens"] == h["tokens"]
    ratio = l["tokens_per_s_cpu"] / h["tokens_per_s_cpu"]
    print(f"  {f:<12} {l['tokens']:>8} {l['tokens_per_s_cpu']:>18,.0f} {h['tokens_per_s_cpu']:>15,.0f} {ratio:>5.2f}x   "
          f"{l['wall_ms']:.0f} / {h['wall_ms']:.0f}{'' if same else '  TOKEN COUNTS DIFFER: ' + str(h['tokens'])}")
    text = f"{f}: lensd >= 1.0x HF tokenizers tokens/s, CPU time ({ratio:.2f}x)"
    ok = ratio >= 1.0 and same
    print(f"    {text:<70} {'PASS' if ok else 'MISS'}")
    if targets:
        targets.write(f"tokenize\t{text}\t{'PASS' if ok else 'MISS'}\n")
PY
