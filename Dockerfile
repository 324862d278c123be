# lensd container image: Debian 12 slim, multi-stage.
#
#   docker build -t lensd .                      (or: buildah bud -t lensd .)
#   docker run --rm -p 8080:8080 lensd           serves the demo models in /models
#   docker run --rm -p 8080:8080 -v /srv/models:/models:ro lensd
#   docker run --rm -p 8080:8080 -e LENSD_WORKERS=2 -e LENSD_MAX_TOKENS=256 lensd
#
# Every `lensd serve` flag is also an environment variable (LENSD_<FLAG>,
# listed below); the command line wins, so `docker run lensd --workers 2` works
# too (arguments are appended to `lensd serve`). make image-test builds this file
# with buildah, without a Docker engine (deploy/image-test.sh).
#
# Build arguments:
#   DEBIAN_IMAGE  base of both stages (default debian:12-slim)
#   OPT           compiler optimisation flags for the Makefile's OPT; empty
#                 (the default) picks them per architecture of the image being
#                 built (dpkg's, in the build stage). The Makefile's own
#                 default, -march=native, would tie the image to the build
#                 machine's CPU. amd64: -march=x86-64-v3 (AVX2/FMA, Haswell or
#                 later) keeps the vectorised GELU/softmax and runs on any
#                 server of the last decade; use "-O3 -march=x86-64-v2" for
#                 older hosts. arm64: -march=armv8-a (every arm64 CPU; NEON is
#                 part of it). OpenBLAS picks its own kernels at run time
#                 either way. Not TARGETARCH: `buildah bud --arch arm64` of
#                 Debian 12's buildah (1.28) and docker's classic builder
#                 leave it empty, which picked x86-64-v3 for an arm64 build.
ARG DEBIAN_IMAGE=debian:12-slim

# ----------------------------------------------------------------- build
FROM ${DEBIAN_IMAGE} AS build
ARG OPT=""
WORKDIR /src
# The build packages come from the same list `make deps` uses; this layer is
# cached until scripts/deps.sh changes.
COPY scripts/deps.sh scripts/deps.sh
RUN scripts/deps.sh build && rm -rf /var/lib/apt/lists/*
COPY . .
# Same Makefile as everywhere else; the demo models are the trained ones
# committed in models/ (models/README.md). `lensd info` runs OpenBLAS on one
# thread: under qemu-user (an arm64 image built on x86) its spinning threads
# make the cost-model calibration take many minutes.
RUN if [ -z "$OPT" ]; then case "$(dpkg --print-architecture)" in \
      arm64) OPT="-O3 -march=armv8-a" ;; \
      *) OPT="-O3 -march=x86-64-v3" ;; \
    esac; fi \
 && make -j"$(nproc)" all OPT="$OPT" \
 && test -f web/index.html \
 && build/lensd version && OPENBLAS_NUM_THREADS=1 build/lensd info

# --------------------------------------------------------------- runtime
FROM ${DEBIAN_IMAGE} AS runtime
# Runtime libraries only (no compiler, no -dev packages, no curl).
# libopenblas0-pthread provides libopenblas.so.0 and the libblas/liblapack
# alternatives that liblapacke uses.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libmicrohttpd12 libjansson4 libutf8proc2 libonig5 libopenblas0-pthread liblapacke \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && groupadd --system --gid 10001 lensd \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin lensd
COPY --from=build /src/build/lensd /usr/local/bin/lensd
COPY --from=build /src/models/ /models/
# a second copy outside the volume, for init containers that fill a mounted /models
COPY --from=build /src/models/ /usr/share/lensd/models/
# the dashboard served at / (lensd's default --web-dir when present)
COPY --from=build /src/web/ /usr/share/lensd/web/
COPY --from=build /src/openapi.yaml /usr/share/lensd/openapi.yaml

# Every serve flag as an environment variable. An empty value means "not
# set" (lensd ignores empty variables), so the built-in default applies.
#   LENSD_LISTEN              --listen HOST:PORT          (0.0.0.0:8080 here)
#   LENSD_MODEL               --model NAME=DIR,...        (comma-separated)
#   LENSD_MODELS_DIR          --models-dir DIR            (/models here)
#   LENSD_WORKERS             --workers N                 (1)
#   LENSD_THREADS_PER_WORKER  --threads-per-worker N      (0 = cores / workers;
#                             set it to the CPU limit / workers in Kubernetes:
#                             lensd counts the host's online cores, not the quota)
#   LENSD_QUEUE               --queue N                   (64)
#   LENSD_MAX_TOKENS          --max-tokens N              (512)
#   LENSD_MAX_BODY            --max-body BYTES            (1MiB)
#   LENSD_TIMEOUT             --timeout SECONDS           (30; drain waits timeout + 5 s)
#   LENSD_API_KEY_FILE        --api-key-file FILE         (one key per line)
#   LENSD_CORS_ORIGIN         --cors-origin LIST          (origins or *)
#   LENSD_MAX_CONNECTIONS     --max-connections N         (16384; lowered to ulimit -n - 256)
#   LENSD_MAX_CONNECTIONS_PER_IP --max-connections-per-ip N (0 = no limit)
#   LENSD_HEADER_TIMEOUT      --header-timeout SECONDS    (10)
#   LENSD_BODY_TIMEOUT        --body-timeout SECONDS      (20)
#   LENSD_IDLE_TIMEOUT        --idle-timeout SECONDS      (60)
#   LENSD_MAX_JOBS            --max-jobs N                (1; async jobs computed at once)
#   LENSD_MAX_STORED_JOBS     --max-stored-jobs N         (100)
#   LENSD_JOB_TTL             --job-ttl SECONDS           (3600)
#   LENSD_DATA_DIR            --data-dir DIR              (unset: jobs read no files)
#   LENSD_WEB_DIR             --web-dir DIR               (/usr/share/lensd/web: the dashboard at /)
#   LENSD_NO_WEB              --no-web                    (1: no dashboard)
#   LENSD_FAST_WORKERS        --fast-workers N            (1; tokenize/forward only)
#   LENSD_FAST_THREADS        --fast-threads N            (1)
#   LENSD_MAX_BATCH_ITEMS     --max-batch-items N         (64)
#   LENSD_MAX_BATCH_TOKENS    --max-batch-tokens N        (16384)
#   LENSD_SSE_KEEPALIVE       --sse-keepalive SECONDS     (15)
#   LENSD_OPENAPI             --openapi FILE              (/usr/share/lensd/openapi.yaml)
#   OPENBLAS_CORETYPE         force the BLAS kernels; lensd sets it itself and
#                             re-executes when OpenBLAS misdetects the CPU
ENV LENSD_LISTEN=0.0.0.0:8080 \
    LENSD_MODELS_DIR=/models \
    LENSD_MODEL="" \
    LENSD_WORKERS="" \
    LENSD_THREADS_PER_WORKER="" \
    LENSD_QUEUE="" \
    LENSD_MAX_TOKENS="" \
    LENSD_MAX_BODY="" \
    LENSD_TIMEOUT="" \
    LENSD_API_KEY_FILE="" \
    LENSD_CORS_ORIGIN="" \
    LENSD_MAX_CONNECTIONS="" \
    LENSD_MAX_CONNECTIONS_PER_IP="" \
    LENSD_HEADER_TIMEOUT="" \
    LENSD_BODY_TIMEOUT="" \
    LENSD_IDLE_TIMEOUT="" \
    LENSD_MAX_JOBS="" \
    LENSD_MAX_STORED_JOBS="" \
    LENSD_JOB_TTL="" \
    LENSD_DATA_DIR="" \
    LENSD_WEB_DIR="" \
    LENSD_NO_WEB="" \
    LENSD_FAST_WORKERS="" \
    LENSD_FAST_THREADS="" \
    LENSD_MAX_BATCH_ITEMS="" \
    LENSD_MAX_BATCH_TOKENS="" \
    LENSD_SSE_KEEPALIVE="" \
    LENSD_OPENAPI=""

# Checkpoints are mmap'd read-only: mount yours here (read-only is fine).
# The image ships the four trained demo models in it.
VOLUME ["/models"]
USER 10001:10001
WORKDIR /
EXPOSE 8080
STOPSIGNAL SIGTERM
# No curl in the image: bash's /dev/tcp sends one GET /healthz to the port of
# LENSD_LISTEN and wants a 200 status line.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["bash", "-c", "p=${LENSD_LISTEN##*:}; exec 3<>/dev/tcp/127.0.0.1/${p:-8080} && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && read -r _ code _ <&3 && [ \"$code\" = 200 ]"]
ENTRYPOINT ["/usr/local/bin/lensd", "serve"]
CMD []
