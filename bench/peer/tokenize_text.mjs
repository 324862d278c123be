// tokenize_text.mjs - the 1 MB mixed text of the tokenizer benchmark:
// WikiText-2 valid (English prose, numbers, punctuation) interleaved with
// the oracle's awkward strings (tests/reference/tokenizer_strings.mjs: code,
// CJK, Thai, Arabic, Hindi, emoji ZWJ sequences, combining marks, runs of
// white space, special-token lookalikes, long words), cut at 1,000,000 bytes
// on a character boundary.
//   node bench/peer/tokenize_text.mjs WIKITEXT_VALID OUT
import fs from 'node:fs';
import { cases, extraCases } from '../../tests/reference/tokenizer_strings.mjs';

const [wiki, out] = process.argv.slice(2);
const prose = fs.readFileSync(wiki, 'utf8').split('\n');
const odd = [...cases, ...extraCases].map(([t]) => t);
let s = '', i = 0, j = 0;
while (Buffer.byteLength(s) < 1_000_000) {
    for (let k = 0; k < 6 && i < prose.length; k++) s += prose[i++] + '\n';
    s += odd[j++ % odd.length] + '\n';
    if (i >= prose.length) i = 0;
}
const buf = Buffer.from(s).subarray(0, 1_000_000);
fs.writeFileSync(out, Buffer.from(buf.toString('utf8').replace(/\uFFFD$/, '')));
