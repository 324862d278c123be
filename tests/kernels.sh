#!/usr/bin/env bash
# The fixture and analysis tests again under every other GEMM kernel this CPU
# runs (LENS_GEMM_KERNEL, core/base/gemm.h), at their own tolerances: the
# binaries run once under the default kernel as part of make test, and here
# under avx2 (AVX2-only CPUs), blas (OpenBLAS: ARM64 and every CPU without a
# lensd kernel) and portable (the oracle), whichever this CPU has besides.
#
#   BUILD=build tests/kernels.sh      (make test runs it)
#
# The portable kernel (the tests' oracle, which test_gemm checks every other
# kernel against) runs the quick binaries only, to keep make test's time:
# KERNELS_FULL=1 runs all of them under it too (test_families, test_attention
# and test_hidden_attribution: ~2 min more on 2 cores).
#
# Prints each run's summary line prefixed with its kernel and closes with
# "kernels: N passed, N failed, N skipped" for scripts/run-tests.sh. Kernels
# this CPU cannot run are skipped, and say so.
set -u
BUILD=${BUILD:-build}
TESTS="test_fixtures test_families test_attention test_attribution test_hidden_attribution test_decomposition
       test_token_identity test_dtype test_backward test_gemm"
info=$("$BUILD/lensd" info) || { echo "kernels: 0 passed, 1 failed, 0 skipped"; exit 1; }
default=$(sed -E 's/.*"gemm":\{"kernel":"([a-z0-9]+)".*/\1/' <<<"$info")
available=$(sed -E 's/.*"gemm":\{[^}]*"available":\[([^]]*)\].*/\1/; s/[",]/ /g' <<<"$info")
passed=0 failed=0 skipped=0
for k in avx2 blas portable; do
  [ "$k" = "$default" ] && continue
  if ! grep -qw "$k" <<<"$available"; then
    echo "SKIP: kernel $k: this CPU cannot run it"
    skipped=$((skipped + 1))
    continue
  fi
  for t in $TESTS; do
    if [ "$k" = portable ] && [ -z "${KERNELS_FULL:-}" ]; then
      case $t in test_families | test_attention | test_hidden_attribution) continue ;; esac
    fi
    out=$(LENS_GEMM_KERNEL=$k "$BUILD/tests/$t" 2>&1); rc=$?
    line=$(grep -E "^$t: [0-9]+ passed, [0-9]+ failed" <<<"$out" | tail -n 1)
    if [ -z "$line" ] || [ "$rc" -ne 0 ]; then
      printf '%s\n' "$out" | grep -E '^(FAIL|SKIP)' | head -n 20
      echo "kernel $k: $t broken or failed (rc=$rc): ${line:-no summary line}"
      failed=$((failed + 1))
      continue
    fi
    echo "kernel $k: $line"
    p=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")
    s=$(sed -nE 's/.* ([0-9]+) skipped.*/\1/p' <<<"$line")
    passed=$((passed + p)) skipped=$((skipped + ${s:-0}))
  done
done
echo "kernels: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
