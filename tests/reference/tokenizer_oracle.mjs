// Run: mkdir -p /tmp/tokoracle && (cd /tmp/tokoracle && npm init -y && npm install --ignore-scripts @huggingface/transformers tokenizers@0.23.2) && node tests/reference/tokenizer_oracle.mjs
//
// Writes every tokenizer fixture: tokenizer_{bert,gpt2}.json here (ids from
// transformers.js) and, through tokenizer_json_oracle.mjs at the end,
// tokenizer_json_*.json (ids, offsets, type ids, special flags from HF's Rust
// `tokenizers`).
//
// tokenizer_oracle.mjs - writes tests/fixtures/tokenizer_{bert,gpt2}.json, the
// expected ids of Hugging Face's own tokenizers (transformers.js, the
// JavaScript port of `tokenizers`) for a fixed set of awkward strings.
//
// Env: ORACLE_DIR (default /tmp/tokoracle) holds node_modules and the
// tokenizer folders this script builds; LENS_SHARED (default ../shared next to
// the repo) holds vocab/bert-base-uncased and vocab/gpt2.
//
// Why it builds its own folders: bert-base-uncased/tokenizer.json ships with
// padding to 256 and truncation switched on, which would pad every fixture;
// gpt2 comes as encoder.json + vocab.bpe only, so its tokenizer.json is put
// together here the way the hub's gpt2/tokenizer.json is laid out.
// transformers.js does not report offsets, so the fixtures hold ids, tokens
// and token_type_ids; test_tokenizer.c checks offsets by their properties.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
const oracleDir = process.env.ORACLE_DIR ?? '/tmp/tokoracle';
const shared = process.env.LENS_SHARED ?? path.resolve(repo, '..', 'shared');
const require = createRequire(path.join(oracleDir, 'package.json'));
const { AutoTokenizer, env } = require('@huggingface/transformers');

env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.join(oracleDir, 'models');

function prepareBert() {
    const src = path.join(shared, 'vocab', 'bert-base-uncased');
    const dst = path.join(env.localModelPath, 'bert-base-uncased');
    fs.mkdirSync(dst, { recursive: true });
    const tj = JSON.parse(fs.readFileSync(path.join(src, 'tokenizer.json'), 'utf8'));
    tj.truncation = null;
    tj.padding = null;
    fs.writeFileSync(path.join(dst, 'tokenizer.json'), JSON.stringify(tj));
    fs.copyFileSync(path.join(src, 'tokenizer_config.json'), path.join(dst, 'tokenizer_config.json'));
    return 'bert-base-uncased';
}

function prepareGpt2() {
    const src = path.join(shared, 'vocab', 'gpt2');
    const dst = path.join(env.localModelPath, 'gpt2');
    fs.mkdirSync(dst, { recursive: true });
    const vocab = JSON.parse(fs.readFileSync(path.join(src, 'encoder.json'), 'utf8'));
    const merges = fs.readFileSync(path.join(src, 'vocab.bpe'), 'utf8')
        .split('\n').filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith('#version')));
    const tj = {
        version: '1.0', truncation: null, padding: null,
        added_tokens: [{ id: 50256, content: '<|endoftext|>', single_word: false, lstrip: false,
                         rstrip: false, normalized: true, special: true }],
        normalizer: null,
        pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
        post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
        model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
                 end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab, merges },
    };
    fs.writeFileSync(path.join(dst, 'tokenizer.json'), JSON.stringify(tj));
    fs.writeFileSync(path.join(dst, 'tokenizer_config.json'), JSON.stringify({
        tokenizer_class: 'GPT2Tokenizer', add_prefix_space: false, add_bos_token: false,
        bos_token: '<|endoftext|>', eos_token: '<|endoftext|>', unk_token: '<|endoftext|>',
        model_max_length: 1024,
    }));
    return 'gpt2';
}

// Each case is [text] or [text, text_pair]. Avoided on purpose because the
// HF implementations disagree among themselves (see the report in
// core/io/tokenizer.c): U+2028/U+2029/U+0085/U+FEFF as whitespace, astral CJK
// (U+20000..) glued to other letters.
const cases = [
    ['Hello world'],
    ['The capital of France is [MASK].'],
    ["it 's a charming and often [MASK] journey . "],
    ['He went to the [MASK] to buy some milk.', 'The shop was [MASK].'],
    ['He went to the store.', 'The shop was closed.'],
    ['Héllo wörld, naïve café résumé'],
    ['HELLO World ÀÉÎÕÜ Ünïcödé àçcèñts: ÅÆØ åæø ßþð'],
    ['我爱北京天安门, 北京欢迎你!'],
    ['日本語のテキストです。カタカナとひらがな'],
    ['한국어 텍스트입니다 서울'],
    ['emoji 😀😃 test 👍🏽 ok'],
    ['family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 end'],
    ['Emoji in word: hello😀world'],
    ['Wait... what?!?! (really) [sic] {braces} <angle> "quotes" ‘curly’ «guillemets»'],
    ['a'.repeat(150)],
    ['x'.repeat(100) + ' ' + 'y'.repeat(101)],
    ['very long unbroken: ' + 'abcdefghij'.repeat(11) + ' end'],
    ['A' + 'é'.repeat(120) + ' short'],
    ['tabs\tand\nnewlines\r\nand   spaces'],
    ['nbsp\u00a0here and ideographic\u3000space\u2003em'],
    ['control\u0000chars\u0007and\u200bzero\ufffdwidth\u00adsoft\u001bescape'],
    ["It's, they're, we've, I'm, you'll, he'd, IT'S, WE'LL, 'LL"],
    ["'s 't 're 've 'm 'll 'd alone"],
    ['’s curly apostrophe it’s'],
    ['Numbers: 3.14159, 1,000,000 and 2024-01-01; ½ ² ³ Ⅻ 123456789 12.5%'],
    ['Mixed: English, Русский, Ελληνικά, العربية, עברית, हिन्दी'],
    ['  leading and trailing spaces  '],
    [''],
    [' '],
    ['\n\n\n'],
    ['İstanbul ẞtraße'],
    ['ΟΔΟΣ ΣΊΣΥΦΟΣ σας ΣΑΣ'],
    ['ﬁnance ﬂower Ⅷ ㎏'],
    ["don't stop-believing!!!"],
    ['<|endoftext|>special in text<|endoftext|>'],
    ['[CLS] [SEP] [UNK] [PAD] literal[MASK]glued'],
    ['[mask] lower-case mask'],
    ['URL: https://example.com/path?q=1&r=2#frag'],
    ['email@example.com #hashtag @mention $100 %50 ^caret ~tilde'],
    ['Tab\tSeparated\tValues\t'],
    ['   multiple     spaces   between   '],
    ['def f(x):\n    return x**2  # comment\n'],
    ['Vietnamese: Tiếng Việt có dấu'],
    ['Thai: ภาษาไทย'],
    ['Combining: e\u0301 a\u0308 n\u0303'],
    ['CJK Ext B: 𠀀 𠀁 and 丁'],
    ['math ∑∫√∞ ≠ ≤ ≥ ± × ÷'],
    ['currency €100 £50 ¥1000 ₹20'],
    ['dashes – — ‐ and ellipsis …'],
    [' = Robert Boulter = \n \n Robert Boulter is an English film and television actor .'],
    ['Zero\u200dWidth\u200cJoiners'],
    ['Private use \ue000 char'],
    ['Naïve, over-long, and DULL — I wanted my money back!'],
    ['unflinchingly bleak and desperate '],
    ['Question?', 'Answer with ümlauts and 中文.'],
    ['x', '   '],
];

async function run(name, file, isBert) {
    const tok = await AutoTokenizer.from_pretrained(name);
    const out = [];
    for (const [text, pair] of cases) {
        const opts = { add_special_tokens: true, return_token_type_ids: true };
        if (pair !== undefined) opts.text_pair = pair;
        let ids;
        const enc = tok(text, opts);
        if (isBert || pair === undefined) {
            ids = Array.from(enc.input_ids.data, Number);
        } else {
            // transformers.js drops text_pair in GPT-2's ByteLevel
            // post-processor; Python's GPT2Tokenizer(Fast) returns A + B.
            const a = tok(text, { add_special_tokens: true }), b = tok(pair, { add_special_tokens: true });
            ids = [...Array.from(a.input_ids.data, Number), ...Array.from(b.input_ids.data, Number)];
        }
        const item = { text };
        if (pair !== undefined) item.text_pair = pair;
        item.input_ids = ids;
        item.tokens = ids.map((id) => tok._tokenizer.id_to_token(id));
        if (isBert) item.token_type_ids = Array.from(enc.token_type_ids.data, Number);
        out.push(item);
    }
    const doc = {
        command: 'ORACLE_DIR=/tmp/tokoracle node tests/reference/tokenizer_oracle.mjs',
        generated_by: 'tests/reference/tokenizer_oracle.mjs',
        oracle: '@huggingface/transformers ' + JSON.parse(fs.readFileSync(path.join(oracleDir, 'node_modules/@huggingface/transformers/package.json'), 'utf8')).version,
        vocab: isBert ? 'shared/vocab/bert-base-uncased' : 'shared/vocab/gpt2',
        cases: out,
    };
    fs.writeFileSync(path.join(repo, 'tests', 'fixtures', file), JSON.stringify(doc, null, 1) + '\n');
    console.log(`${file}: ${out.length} cases`);
}

await run(prepareBert(), 'tokenizer_bert.json', true);
await run(prepareGpt2(), 'tokenizer_gpt2.json', false);

// tokenizer.json fixtures: HF's Rust tokenizers (npm `tokenizers`) on 200+
// strings per tokenizer, ids and offsets; see that file.
await import('./tokenizer_json_oracle.mjs');
