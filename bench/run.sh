#!/usr/bin/env bash
# Forward-pass benchmark: lensd vs PyTorch vs ONNX Runtime on one BERT-base
# checkpoint (see bench/README.md for what is measured and why).
#
#   bench/run.sh [BUILD/lensd]     (make bench)
#   BENCH_QUICK=1 bench/run.sh     only T=128 batch 1, where the targets are
#
# The lensd timings come from BUILD/bench/forward, which links the same
# libcore as BUILD/lensd; BUILD is the directory of the argument (default
# build). Raw results: BUILD/bench/forward-results.jsonl; the table is also
# written to BUILD/bench/forward-table.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

LENSD=${1:-build/lensd}
BUILD=$(dirname "$LENSD")
PY=/usr/bin/python3 # Debian's, which has python3-torch and numpy
DRIVER=$BUILD/bench/forward
MODELS=$BUILD/bench-models
MODEL=$MODELS/bert-base
ONNX=$MODELS/bert-base.onnx
OUT=$BUILD/bench
RESULTS=$OUT/forward-results.jsonl
SEED=42

log() { printf 'bench: %s\n' "$*" >&2; }

make -s BUILD="$BUILD" "$DRIVER"
mkdir -p "$MODELS" "$OUT"

# OpenBLAS picks its kernels while it initialises, from OPENBLAS_CORETYPE;
# set it before python starts so PyTorch (which calls OpenBLAS for its
# matmuls) gets the best core. lensd corrects itself in lens_blas_setup.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
  fi
fi

# One checkpoint for everyone; rebuilt only when missing.
if [ ! -s "$MODEL/model.safetensors" ] || [ ! -s "$MODEL/config.json" ]; then
  log "writing random BERT-base checkpoint to $MODEL"
  rm -rf "$MODEL"
  "$DRIVER" --mkmodel "$MODEL" --task encoder --seed "$SEED" >/dev/null
fi
if [ ! -s "$ONNX" ] || [ "$MODEL/model.safetensors" -nt "$ONNX" ]; then
  log "exporting $ONNX with torch.onnx.export"
  "$PY" bench/peer/export_onnx.py --model "$MODEL" --out "$ONNX" 2> >(grep -v -i warn >&2)
fi
if [ ! -d bench/peer/node_modules/onnxruntime-node ]; then
  log "installing onnxruntime-node into bench/peer/node_modules"
  (cd bench/peer && npm install --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
fi

# T batch reps warmup: about 5 s of timed work per implementation at one
# thread; T=512 batch 8 (~0.8 TFLOP a forward) gets the fewest.
if [ -n "${BENCH_QUICK:-}" ]; then
  CONFIGS="128 1 15 2"
else
  CONFIGS="32 1 15 2
128 1 15 2
512 1 5 1
32 8 7 1
128 8 5 1
512 8 3 1"
fi

: >"$RESULTS"
for threads in 1 2; do
  log "sgemm 2048 x 2048, $threads thread(s)"
  "$DRIVER" --sgemm --size 2048 --threads "$threads" --reps 20 >>"$RESULTS"
done

while read -r T batch reps warmup; do
  for threads in 1 2; do
    log "T=$T batch=$batch threads=$threads: lensd, pytorch, ort ($reps reps)"
    dump_lensd=() dump_torch=() dump_ort=()
    if [ "$T" = 128 ] && [ "$batch" = 1 ] && [ "$threads" = 1 ]; then
      dump_lensd=(--dump "$OUT/hidden-lensd.f32")
      dump_torch=(--dump "$OUT/hidden-pytorch.f32")
      dump_ort=(--dump "$OUT/hidden-ort.f32")
    fi
    common=(--T "$T" --batch "$batch" --threads "$threads" --reps "$reps" --warmup "$warmup" --seed "$SEED")
    "$DRIVER" --model "$MODEL" "${common[@]}" "${dump_lensd[@]}" >>"$RESULTS"
    # OpenBLAS runs PyTorch's matmuls on its own pthreads; PASSIVE stops idle
    # OpenMP workers from spinning on the cores those threads need (without
    # it PyTorch at 2 threads is ~1.8x slower than with it on 2 cores).
    OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE \
      "$PY" bench/peer/torch_forward.py --model "$MODEL" "${common[@]}" "${dump_torch[@]}" >>"$RESULTS"
    node bench/peer/ort_forward.mjs --model "$ONNX" "${common[@]}" "${dump_ort[@]}" >>"$RESULTS"
  done
done <<<"$CONFIGS"

"$PY" - "$RESULTS" "$MODEL" "$OUT" <<'EOF' | tee "$OUT/forward-table.txt"
import json, os, platform, sys
import numpy as np

results_path, model_dir, out = sys.argv[1:4]
rows = [json.loads(line) for line in open(results_path) if line.strip()]
sgemm = {r["threads"]: r for r in rows if r["impl"] == "sgemm"}
runs = {(r["impl"], r["T"], r["batch"], r["threads"]): r for r in rows if r["impl"] != "sgemm"}
ckpt = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
MiB = 2**20
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")

print(f"\nlensd forward benchmark: BERT-base (L12 H768 12 heads I3072 V30522), {cpu}, {os.cpu_count()} cores")
print(f"checkpoint {ckpt / MiB:.0f} MiB; OpenBLAS core {sgemm[1]['blas_core']}; times are medians after warm-up; "
      "GFLOP/s counts matmul FLOPs (2 N P_lin + 4 T^2 C L per sequence)")
for t, s in sorted(sgemm.items()):
    print(f"sgemm 2048^3, {t} thread(s): {s['gflops']:.1f} GFLOP/s (median; best {s['gflops_best']:.1f})")
print()
hdr = (f"{'T':>4} {'batch':>5} {'thr':>3} | {'lensd ms':>9} {'GF/s':>6} {'%sgemm':>6} | {'PyTorch':>9} {'GF/s':>6} |"
       f" {'ORT ms':>9} {'GF/s':>6} | {'lensd/PT':>8} {'lensd/ORT':>9}")
print(hdr)
print("-" * len(hdr))
configs = sorted({k[1:] for k in runs}, key=lambda c: (c[1], c[0], c[2]))
for T, B, th in configs:
    l, p, o = (runs.get((impl, T, B, th)) for impl in ("lensd", "pytorch", "ort"))
    ms = lambda r: f"{r['ms_median']:9.1f}" if r else f"{'-':>9}"
    gf = lambda r: f"{r['gflops']:6.1f}" if r else f"{'-':>6}"
    ratio = lambda r: f"{l['ms_median'] / r['ms_median']:.2f}" if l and r else "-"
    frac = f"{100 * l['gflops'] / sgemm[th]['gflops']:5.0f}%" if l and th in sgemm else f"{'-':>6}"
    print(f"{T:>4} {B:>5} {th:>3} | {ms(l)} {gf(l)} {frac} | {ms(p)} {gf(p)} | {ms(o)} {gf(o)} |"
          f" {ratio(p):>8} {ratio(o):>9}")

print(f"\npeak RSS at T=128 batch 1 (checkpoint {ckpt / MiB:.0f} MiB; target for lensd <= checkpoint + 64 MiB):")
for th in (1, 2):
    parts = []
    for impl in ("lensd", "pytorch", "ort"):
        r = runs.get((impl, 128, 1, th))
        if r:
            parts.append(f"{impl} {r['maxrss_kib'] / 1024:.0f} MiB ({(r['maxrss_kib'] * 1024 - ckpt) / MiB:+.0f})")
    print(f"  {th} thread(s): " + ", ".join(parts))

status = 0
dumps = {impl: os.path.join(out, f"hidden-{impl}.f32") for impl in ("lensd", "pytorch", "ort")}
if all(os.path.exists(p) for p in dumps.values()):
    h = {impl: np.fromfile(p, dtype=np.float32) for impl, p in dumps.items()}
    # float32 with different summation orders over 12 post-LN layers: ~1e-5
    # expected; 1e-3 would mean a different computation, not rounding.
    tol = 1e-3
    print("\ncorrectness (final hidden states, T=128 batch 1, same ids; tolerance 1e-3):")
    for peer in ("pytorch", "ort"):
        if h[peer].shape != h["lensd"].shape:
            print(f"  lensd vs {peer}: shapes differ {h['lensd'].shape} vs {h[peer].shape}  FAIL")
            status = 1
            continue
        d = float(np.abs(h["lensd"] - h[peer]).max())
        ok = d <= tol
        status |= not ok
        print(f"  max |lensd - {peer}| = {d:.3g}  {'OK' if ok else 'FAIL'}")

print("\ntargets at T=128 batch 1:")
for th in (1, 2):
    l, p, o = (runs.get((impl, 128, 1, th)) for impl in ("lensd", "pytorch", "ort"))
    if not l:
        continue
    checks = []
    if p:
        checks.append((f"lensd <= 0.8 x PyTorch ({l['ms_median']:.1f} vs {0.8 * p['ms_median']:.1f} ms)",
                       l["ms_median"] <= 0.8 * p["ms_median"]))
    if o:
        checks.append((f"lensd <= 1.0 x ORT     ({l['ms_median']:.1f} vs {o['ms_median']:.1f} ms)",
                       l["ms_median"] <= o["ms_median"]))
    if th in sgemm:
        f = l["gflops"] / sgemm[th]["gflops"]
        checks.append((f"lensd >= 70% of sgemm  ({100 * f:.0f}% of {sgemm[th]['gflops']:.1f} GFLOP/s)", f >= 0.70))
    rss = l["maxrss_kib"] * 1024
    checks.append((f"lensd RSS <= ckpt+64MiB ({rss / MiB:.0f} vs {(ckpt + 64 * MiB) / MiB:.0f} MiB)",
                   rss <= ckpt + 64 * MiB))
    for text, ok in checks:
        print(f"  {th} thread(s): {text:<58} {'PASS' if ok else 'MISS'}")
sys.exit(status)
EOF
