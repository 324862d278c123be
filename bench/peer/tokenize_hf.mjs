// tokenize_hf.mjs - the peer of bench/tokenize.c: HF's Rust tokenizers
// (npm `tokenizers`, the Node binding, from $LENS_TOKORACLE as the test
// set-up installs it) encoding the whole text in one call, with special
// tokens as lensd's text path adds them, best of --reps after one warm-up.
//   node bench/peer/tokenize_hf.mjs TOKENIZER.json TEXT [REPS]
// Prints one JSON line like bench/tokenize.c's. CPU time is the process's
// (every thread), comparable on a loaded machine.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [file, textPath, repsArg] = process.argv.slice(2);
const dir = process.env.LENS_TOKORACLE ?? 'build/tokoracle';
const { Tokenizer } = createRequire(path.resolve(dir, 'package.json'))('tokenizers');
const t = Tokenizer.fromFile(file);
const text = fs.readFileSync(textPath, 'utf8');
const reps = Number(repsArg ?? 7);
let bestWall = Infinity, bestCpu = Infinity, tokens = 0;
for (let r = 0; r <= reps; r++) {
    const w0 = process.hrtime.bigint(), c0 = process.cpuUsage();
    const e = await t.encode(text, null, { addSpecialTokens: true });
    const wall = Number(process.hrtime.bigint() - w0) / 1e6, cu = process.cpuUsage(c0);
    const cpu = (cu.user + cu.system) / 1e3;
    tokens = e.getIds().length;
    if (r === 0) continue;
    bestWall = Math.min(bestWall, wall);
    bestCpu = Math.min(bestCpu, cpu);
}
console.log(JSON.stringify({ impl: 'hf', bytes: Buffer.byteLength(text), tokens, wall_ms: bestWall, cpu_ms: bestCpu,
                             tokens_per_s_wall: Math.round(tokens / (bestWall / 1e3)),
                             tokens_per_s_cpu: Math.round(tokens / (bestCpu / 1e3)) }));
