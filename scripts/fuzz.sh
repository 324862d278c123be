#!/usr/bin/env bash
# Runs libFuzzer targets (make fuzz-build makes them) for a bounded time each
# and prints, per target, executions, seconds and crashes, then the house
# summary line "fuzz: N passed, N failed" (scripts/run-tests.sh sums it).
#   fuzz.sh [TARGET...]   default: every $FUZZ_BUILD/tests/fuzz/fuzz_* binary
# Environment: FUZZ_BUILD (build-fuzz), FUZZ_SECONDS per target (default 3),
# FUZZ_RUNS (optional cap on executions per target), FUZZ_CORPUS (a folder
# that keeps what the runs find, per target; default: a temporary one, so a
# CI run always starts from the seeds alone and takes the same time).
# Target fuzz_NAME starts from the seeds in tests/fuzz/corpus/NAME/ (a target
# without seeds fails) and FUZZ_CORPUS/NAME/;
# a crash, leak or sanitizer report fails the target and leaves the input in
# $FUZZ_BUILD/fuzz-crashes/ and the log in $FUZZ_BUILD/fuzz-logs/NAME.PID.log
# (per process: two campaigns may fuzz one target); a passing run's log
# becomes NAME.log.
set -u
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD:-build-fuzz}
seconds=${FUZZ_SECONDS:-3}
runs=${FUZZ_RUNS:-}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for t in "$build"/tests/fuzz/fuzz_*; do
    case "$t" in *.o | *.d) continue ;; esac
    [ -x "$t" ] && targets+=("$t")
  done
fi
passed=0 failed=0
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz targets in $build/tests/fuzz (make fuzz-build)"
  failed=1
fi
mkdir -p "$build/fuzz-crashes" "$build/fuzz-logs"
corpus=${FUZZ_CORPUS:-}
if [ -z "$corpus" ]; then
  corpus=$(mktemp -d "${TMPDIR:-/tmp}/lensd-fuzz-corpus-XXXXXX")
  trap 'rm -rf "$corpus"' EXIT
fi
for t in "${targets[@]}"; do
  [ -x "$t" ] || t="$build/tests/fuzz/$t"
  name=$(basename "$t")
  name=${name#fuzz_}
  seeds=tests/fuzz/corpus/$name
  log=$build/fuzz-logs/$name.$$.log
  if [ -z "$(ls -A "$seeds" 2>/dev/null)" ]; then
    echo "FAIL fuzz_$name: no seed corpus in $seeds"
    failed=$((failed + 1))
    continue
  fi
  mkdir -p "$corpus/$name"
  start=$(date +%s.%N)
  "$t" -max_total_time="$seconds" ${runs:+-runs=$runs} -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-crashes/$name-" "$corpus/$name" "$seeds" >"$log" 2>&1
  rc=$?
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -n 1)
  crashes=$(ls "$build/fuzz-crashes/$name-"* 2>/dev/null | wc -l)
  if [ "$rc" -eq 0 ] && [ -n "$execs" ] && [ "$execs" -gt 0 ]; then
    printf 'fuzz_%s: %s executions in %.1f s, 0 crashes\n' "$name" "$execs" "$secs"
    mv "$log" "$build/fuzz-logs/$name.log"
    passed=$((passed + 1))
  else
    printf 'FAIL fuzz_%s: rc %d after %s executions in %.1f s; %d saved crash inputs in %s; log %s\n' \
      "$name" "$rc" "${execs:-?}" "$secs" "$crashes" "$build/fuzz-crashes" "$log"
    grep -a -m 3 -E 'ERROR|fuzz invariant|runtime error' "$log" | sed 's/^/  /'
    failed=$((failed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
