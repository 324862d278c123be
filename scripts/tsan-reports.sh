#!/usr/bin/env bash
# The last "test" of make test-tsan: ThreadSanitizer writes each process's
# reports (the test binaries' and the lensd servers they start) to
# $TSAN_REPORTS/race.<pid>; every report file is a failure. Prints the first
# report of each file and the house summary line.
set -u
dir=${TSAN_REPORTS:?TSAN_REPORTS is not set}
failed=0
for f in "$dir"/race.*; do
  [ -e "$f" ] || continue
  failed=$((failed + 1))
  echo "ThreadSanitizer report in $f ($(grep -c 'WARNING: ThreadSanitizer' "$f") warnings); the first:"
  sed -n '/WARNING: ThreadSanitizer/,/^SUMMARY/p' "$f" | head -n 60
done
echo "tsan: $((failed == 0)) passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
