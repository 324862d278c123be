# lensd build. `make` builds build/libcore.a and build/lensd; `make test`
# runs every tests/test_*.c binary plus the HTTP integration tests;
# `make test-asan` does the same with AddressSanitizer + UBSan.
# Sources are found by wildcard: adding a file to a folder of core/ (base, nn,
# io, model, analysis, train), api/, server/ or cli/ needs no edit here.

BUILD ?= build
CC ?= cc
PKGS := libmicrohttpd jansson libutf8proc libcurl
OPT ?= -O3 -march=native
CFLAGS ?= $(OPT) -g
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -MMD -MP \
          -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread
LDLIBS := -ljansson -lutf8proc -llapacke -lopenblas -lm -lpthread
SERVER_LIBS := -lmicrohttpd
TEST_LIBS := -lcurl

CORE_SRC := $(wildcard core/*/*.c)
APP_SRC := $(wildcard api/*.c) $(wildcard server/*.c) $(filter-out cli/main.c,$(wildcard cli/*.c))
TEST_SRC := $(wildcard tests/test_*.c)

CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o)
APP_OBJ := $(APP_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

all: $(BUILD)/lensd $(BUILD)/libcore.a

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libcore.a: $(CORE_OBJ)
	$(AR) rcs $@ $^

$(BUILD)/libapp.a: $(APP_OBJ)
	$(AR) rcs $@ $^

$(BUILD)/lensd: $(BUILD)/cli/main.o $(BUILD)/libapp.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $^ $(SERVER_LIBS) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libapp.a $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $^ $(TEST_LIBS) $(SERVER_LIBS) $(LDLIBS)

# Debian packages the build, the tests and `make run` need (installs them
# when root, prints the apt-get line otherwise).
deps:
	@scripts/deps.sh build

test: deps
	$(MAKE) all $(TEST_BIN)
	@BUILD=$(BUILD) scripts/run-tests.sh $(TEST_BIN)

test-asan:
	$(MAKE) test BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"

# Serves the demo models trained by lensd and committed in models/ (see
# models/README.md); one that is not there is left out.
DEMO_MODELS := demo-sst2 demo-mlm demo-identifiable demo-gpt2
run: deps all
	$(BUILD)/lensd serve --listen $${LENSD_LISTEN:-127.0.0.1:8080} \
	    $(foreach m,$(DEMO_MODELS),$$([ -f models/$(m)/config.json ] && echo --model $(m)=models/$(m)))

bench: deps all $(BUILD)/bench/forward
	@scripts/deps.sh bench
	bench/run.sh $(BUILD)/lensd

clean:
	rm -rf build build-asan

.PHONY: all deps test test-asan run bench clean

# Regenerates tests/fixtures by running the command each fixture records
# (tests/reference scripts: PyTorch, node; needs ../shared; not in CI).
fixtures:
	scripts/fixtures.sh

.PHONY: fixtures

# Trains the demo models with lensd (45-60 minutes on 2 cores; not part of CI).
demo-models: all
	scripts/train-demo.sh $(BUILD)/lensd

.PHONY: demo-models
-include $(wildcard $(BUILD)/*/*.d $(BUILD)/*/*/*.d)

# Benchmark drivers: bench/NAME.c -> $(BUILD)/bench/NAME, linked with libcore.
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libcore.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# json_encode needs the JSON writer from libapp
$(BUILD)/bench/json_encode: $(BUILD)/bench/json_encode.o $(BUILD)/libapp.a $(BUILD)/libcore.a
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
image-test:
	deploy/image-test.sh

# Validates deploy/ (yamllint, kustomize, Kubernetes and Compose schemas, cross-checks, nginx -t).
validate-deploy:
	deploy/validate.sh

.PHONY: image-test validate-deploy

# Training throughput of the demo BERT classifier: lensd (bench/train.c) vs
# PyTorch (bench/peer/train_torch.py), tokens/s and peak RSS (bench/README.md).
bench-train: deps all $(BUILD)/bench/train
	@scripts/deps.sh bench
	bench/train.sh $(BUILD)/lensd

.PHONY: bench-train
