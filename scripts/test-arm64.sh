#!/usr/bin/env bash
# scripts/test-arm64.sh (make test-arm64): builds lensd and the core unit
# tests for linux/arm64 with Debian's cross compiler on an x86-64 machine and
# runs them under qemu-user. Correctness only: emulation runs lensd some
# hundred times slower than a real arm64 core (docs/operations.md "arm64").
#
# On arm64 there is no lensd GEMM kernel (they are x86-64 only), so every
# matrix product goes to OpenBLAS (LENS_GEMM_KERNEL defaults to blas); the
# script checks `lensd info` says so before running the tests.
#
# The tests are pure-C ones that need no server and finish within about 2
# minutes each under emulation (ARM64_TESTS overrides the list). test_gemm
# and test_tokenizer are not among them yet: each ran past 5 minutes under
# qemu on a loaded 2-core EPYC (not profiled; test_tokenizer has throughput
# checks, test_gemm compares every kernel on many shapes). OpenBLAS runs one thread:
# its spinning threads on an emulated CPU turned a 15 s `lensd info` into more
# than 10 minutes on a loaded 2-core machine.
# Environment: BUILD_ARM64 (build-arm64), ARM64_TESTS, ARM64_OPT (-O2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_ARM64:-build-arm64}
tests=${ARM64_TESTS:-test_json_writer test_json_valid test_safetensors test_family_names test_backward test_blocks test_dtype}
scripts/deps.sh arm64

# libonig-dev has no arm64 copy beside the x86-64 one (not multi-arch), so
# the linker finds libonig.so.5:arm64 by a symlink; oniguruma.h is the same.
mkdir -p "$build/lib"
ln -sf /usr/lib/aarch64-linux-gnu/libonig.so.5 "$build/lib/libonig.so"
nice make -j"$(nproc)" BUILD="$build" CC=aarch64-linux-gnu-gcc MULTIARCH=aarch64-linux-gnu \
  OPT="${ARM64_OPT:--O2} -L$PWD/$build/lib" "$build/lensd" $(printf "$build/tests/%s " $tests)

export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu OPENBLAS_NUM_THREADS=1
info=$(qemu-aarch64 "$build/lensd" info)
printf '%s\n' "$info"
grep -q '"kernel":"blas"' <<<"$info" || { echo "test-arm64: FAIL: lensd info does not name the blas kernel" >&2; exit 1; }

# run-tests.sh runs each binary itself: each gets a wrapper of the same name
# that starts it under qemu-aarch64.
wrap="$build/qemu"
mkdir -p "$wrap"
for t in $tests; do
  printf '#!/bin/sh\nexec qemu-aarch64 %s "$@"\n' "$PWD/$build/tests/$t" >"$wrap/$t"
  chmod +x "$wrap/$t"
done
BUILD="$build" scripts/run-tests.sh $(printf "$wrap/%s " $tests)
