#!/usr/bin/env bash
# Runs each test binary given, echoes its output, and closes with one line
# summing every binary's "name: N passed, N failed, N skipped" line, after
# every "SKIP: reason" line the binaries printed (each named by its binary),
# so a green run says what it did not check.
# A binary that crashes or exits non-zero without such a line counts as failed.
set -u
passed=0 failed=0 skipped=0 broken="" reasons=""
for t in "$@"; do
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out"
  why=$(printf '%s\n' "$out" | sed -nE "s|^SKIP: (.*)|  $(basename "$t"): \1|p")
  [ -n "$why" ] && reasons+="$why"$'\n'
  line=$(printf '%s\n' "$out" | grep -E '^[a-z_0-9-]+: [0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -z "$line" ]; then
    broken="$broken $(basename "$t")(rc=$rc)"; failed=$((failed + 1)); continue
  fi
  p=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")
  f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
  s=$(sed -nE 's/.* ([0-9]+) skipped.*/\1/p' <<<"$line")
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then broken="$broken $(basename "$t")(rc=$rc)"; failed=$((failed + 1)); fi
done
[ -n "$reasons" ] && printf 'skipped checks, each with its reason:\n%s' "$reasons"
[ -n "$broken" ] && echo "broken test binaries:$broken"
echo "total: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
