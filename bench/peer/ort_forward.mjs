// ONNX Runtime peer of the lensd forward benchmark (see bench/README.md).
//
//   node ort_forward.mjs --model FILE.onnx --T 128 --batch 1 --threads 2 --reps R
//                        [--warmup W] [--seed 42] [--vocab 30522] [--dump FILE]
//
// Runs the model export_onnx.py wrote (same weights as lensd) with
// onnxruntime-node on the CPU: intra_op_num_threads = --threads, one
// inter-op thread, sequential execution, all graph optimisations. Input is
// one [batch, T] int64 tensor, no padding. Token ids: xorshift32 from --seed,
// id = x mod V in packed order, exactly as bench/forward.c draws them.
// Prints one JSON line like forward.c.
import { writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import ort from 'onnxruntime-node';

const { values: a } = parseArgs({
  options: {
    model: { type: 'string' },
    T: { type: 'string', default: '128' },
    batch: { type: 'string', default: '1' },
    threads: { type: 'string', default: '1' },
    reps: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '1' },
    seed: { type: 'string', default: '42' },
    vocab: { type: 'string', default: '30522' },
    layers: { type: 'string', default: '12' },
    hidden: { type: 'string', default: '768' },
    ff: { type: 'string', default: '3072' },
    dump: { type: 'string' },
  },
});
if (!a.model) {
  console.error('usage: node ort_forward.mjs --model FILE.onnx [--T 128] [--batch 1] [--threads 1] [--reps 5]');
  process.exit(2);
}
const T = +a.T, B = +a.batch, threads = +a.threads, reps = +a.reps, warmup = +a.warmup, V = +a.vocab;

function xorshift32Ids(seed, count, vocab) {
  let x = seed >>> 0 || 1;
  const ids = new BigInt64Array(count);
  for (let i = 0; i < count; i++) {
    x = (x ^ (x << 13)) >>> 0;
    x = (x ^ (x >>> 17)) >>> 0;
    x = (x ^ (x << 5)) >>> 0;
    ids[i] = BigInt(x % vocab);
  }
  return ids;
}

const t0 = performance.now();
const session = await ort.InferenceSession.create(a.model, {
  intraOpNumThreads: threads,
  interOpNumThreads: 1,
  executionMode: 'sequential',
  graphOptimizationLevel: 'all',
});
const loadMs = performance.now() - t0;
const feeds = { input_ids: new ort.Tensor('int64', xorshift32Ids(+a.seed, B * T, V), [B, T]) };

const times = [], cpuTimes = []; // wall ms; process CPU ms (user + system, every thread), as bench/forward.c
let hidden;
for (let r = 0; r < warmup + reps; r++) {
  const start = performance.now(), cpuStart = process.cpuUsage();
  const out = await session.run(feeds);
  const ms = performance.now() - start, cpu = process.cpuUsage(cpuStart);
  hidden = out.last_hidden_state;
  if (r >= warmup) times.push(ms), cpuTimes.push((cpu.user + cpu.system) / 1000);
}
const maxrssKib = process.resourceUsage().maxRSS; // KiB
if (a.dump) writeFileSync(a.dump, Buffer.from(hidden.data.buffer, hidden.data.byteOffset, hidden.data.byteLength));

const medianOf = (v) => {
  v.sort((x, y) => x - y);
  const k = v.length;
  return k % 2 ? v[(k - 1) / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
};
const median = medianOf(times), n = times.length;
const C = +a.hidden, L = +a.layers, I = +a.ff;
const pLin = L * (4 * C * C + 2 * C * I);
const gflop = (2 * B * T * pLin + 4 * T * T * C * L * B) * 1e-9;
const round = (x, d) => Math.round(x * 10 ** d) / 10 ** d;
console.log(JSON.stringify({
  impl: 'ort', T, batch: B, threads, reps, warmup,
  ms_median: round(median, 3), ms_min: round(times[0], 3), ms_max: round(times[n - 1], 3),
  gflop: round(gflop, 4), gflops: round(gflop / (median * 1e-3), 2), cpu_ms_median: round(medianOf(cpuTimes), 3),
  load_ms: round(loadMs, 1), maxrss_kib: maxrssKib, ort: ort.env.versions?.common ?? '',
}));
await session.release?.();
