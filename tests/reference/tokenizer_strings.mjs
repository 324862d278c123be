// tokenizer_strings.mjs - the strings every tokenizer oracle encodes.
//   cases       the 200+ strings (and pairs) of the checked-in fixtures
//               tokenizer_json_{bert,gpt2,roberta}.json
//   extraCases  more for the npm tokenizer.json files (tokenizer_npm_oracle.mjs):
//               code, long digit runs, CJK, Thai, Arabic, Hindi, emoji ZWJ,
//               combining marks in NFD and NFC, runs of spaces / tabs / CRLF,
//               each family's special-token lookalikes, very long words
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
export const cases = [...base.map((t) => [t]), ...generated.map((t) => [t]), ...pairs];

const nfd = (s) => s.normalize('NFD'), nfc = (s) => s.normalize('NFC');
const marks = ['Héllo wörld naïve café', 'Ǻngström Å Å Å', 'Việt Nam tiếng Việt', 'ḍ̇ q̣̇ ṩ', 'ÅÉÎÕÜ ǅ ǈ',
    'אֳ שָׁלוֹם', 'ा क़ ख़ ड़ क्ष', 'ো ৌ ொ ோ ௌ', 'がぎぐげご パピプペポ', '각 힣 ᄀ ᅡ ᆨ'];
const extra = [
    // combining marks: as typed, NFD, NFC, and out of canonical order
    ...marks.map(nfd), ...marks.map(nfc), 'a\u0301\u0323 a\u0323\u0301 q\u0307\u0323 e\u0302\u0323\u0301',
    '\u1100\u1161\u11a8 \u1100\u1161 \u0b47\u0b3e \u0bc6\u0bbe', 'x\u0300\u0300\u0300\u0300\u0300\u0300 y',
    // NFKC / compatibility
    'ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３！', 'ligatures ﬁ ﬂ ﬀ ﬃ ﬄ ﬆ', 'ellipsis … and ‥ ･', 'Å angstrom K kelvin Ω ohm',
    '①②③ ⑴⑵ ⒈⒉ ㈠㈡ ㊀', '㍻ ㍼ ㎞ ㎡ ㏄ ℃ ℉ №', 'x⁰¹²³⁴ H₂O CO₂', 'ﾊﾝｶｸ ｶﾀｶﾅ ﾊﾟﾋﾟ', '\u3000ideographic\u3000space\u3000',
    'مَرْحَبًا بِكُمْ شَدَّة', 'ﷺ ﷻ ﻻ ﻼ', 'ﾟ゛ ゜',
    // code
    'fn main() {\n    let v: Vec<i32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
    'class Foo(Bar):\n    """Doc."""\n    def __init__(self, *args, **kw):\n        super().__init__(*args, **kw)\n',
    '<div class="a">\n  <span id=\'b\'>&amp; &lt;tag&gt;</span>\n</div>', '{"key": [1, 2.5e-3, null, true], "k2": {"n": "v"}}',
    'x <<= 2; y >>>= 3; z ??= w?.q ?? 0; a !== b && c || !d', '#!/bin/bash\nfor f in *.txt; do echo "$f"; done 2>&1 | tee log',
    '\t\tif (x) {\r\n\t\t\treturn;\r\n\t\t}\r\n', 'SELECT a.id, COUNT(*) FROM t a JOIN u b ON a.id=b.id GROUP BY 1;',
    'camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case-id', '0x1F 0b1010 0o777 1_000_000 3.14e+10',
    // digits
    '1234567890123456789012345678901234567890', '3141592653589793238462643383279502884197169399375105820974944592',
    '12 345 6789 00001 1.2.3.4 192.168.0.1', '٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ०१२३४५६७८९ ๐๑๒๓', 'a1b22c333d4444e55555', '-1 +2 3- 4+ 5%',
    // scripts
    '人工智能是计算机科学的一个分支，它企图了解智能的实质。', '東京都渋谷区で開催されたイベントに参加しました。', '한국어 문장을 토큰화합니다.',
    'ภาษาไทยเป็นภาษาที่ไม่มีการเว้นวรรคระหว่างคำ', 'สวัสดีครับ ขอบคุณมาก', 'اللغة العربية هي لغة سامية', 'هذا نص عربي للاختبار ١٢٣',
    'हिन्दी भारत की राजभाषा है।', 'क्षत्रिय ज्ञान श्री', 'ଓଡ଼ିଆ ગુજરાતી ਪੰਜਾਬੀ ಕನ್ನಡ മലയാളം සිංහල', 'ພາສາລາວ ភាសាខ្មែរ မြန်မာ',
    'ꦧꦱꦗꦮ 𐌰𐌱𐌲 𓀀𓀁 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕬𝖇𝖈', 'a\u{31350}b U+31350 and 𱍐 alone', '丂丄丅 𪜀 𫝀 𬺰 𮯠 𰀀',
    // emoji
    '👨‍👩‍👧‍👦👩‍❤️‍💋‍👨🏳️‍⚧️', '🧑🏻‍💻 🧑🏿‍🔬 🏃🏽‍♀️ 🤦🏼‍♂️', '🇩🇪🇫🇷🇺🇸🏴󠁧󠁢󠁳󠁣󠁴󠁿', '1️⃣ #️⃣ *️⃣ ©️ ®️ ™️', '😀😃😄😁😆😅🤣😂🙂🙃😉😊😇',
    'text👍🏽text 🙂🙂 x🧪y', '\u200d\u200c\ufe0f\ufe0e alone',
    // white space
    'a  b   c    d     e', '\t\t\t\tfour tabs', 'line\r\nline\r\n\r\nline', '  \t \r\n \t\n\n  x', ' '.repeat(33) + 'x',
    'x' + ' '.repeat(17), '\n'.repeat(9) + 'end', 'a\u00a0\u00a0b\u2009c\u202fd\u205fe', '\v\f vertical tab and form feed',
    'trailing\r', '\r\r\r', ' \n \n \n', 'mix \t\n\r\n \t x',
    // special-token lookalikes of each family
    '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>', '<|begin_of_text |> <|eot_id', '< |eot_id|>',
    '<|im_start|>system\nYou are<|im_end|>\n<|im_start|>assistant\n', '<|im_start |> <|im_end', '<|endoftext|><|endofprompt|>',
    '<start_of_turn>model\nok<end_of_turn>', '<start_of_turn >', '<bos><bos><eos>', '<start_of_image> <image_soft_token>',
    '<s>[INST] hi [/INST]</s>', '[INST][/INST]', '<s> [INST]', '<unk> <s> </s> <pad>',
    '<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>', '<｜User｜>q<｜Assistant｜>a', '<|begin▁of▁sentence|>',
    '<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>', '<|channel|> <|constrain|>',
    '<|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>', '<|reserved_special_token_0|> <|reserved_special_token_250|>',
    '▁▁lead ▁ and ▁▁▁ metaspace ▁x', '<0x41><0xE4><0x00> byte pieces', 'Ġhello Ċnewline ĉ',
    // very long words
    'Pneumonoultramicroscopicsilicovolcanoconiosis ' + 'Donaudampfschifffahrtsgesellschaftskapitän',
    'a'.repeat(300), 'ab'.repeat(200), '😀'.repeat(60), '中'.repeat(120), 'z'.repeat(64) + '1'.repeat(64) + '!'.repeat(64),
    'https://example.com/' + 'very-long-path-segment/'.repeat(12) + '?q=' + 'x'.repeat(50),
];
let seed2 = 777;
const rnd2 = (n) => { seed2 = (seed2 * 1103515245 + 12345) % 2147483648; return seed2 % n; };
const frags2 = [...frags, 'ภาษา', 'عربي', 'हिन्दी', '\r\n', '\t\t', '  \n', '999999', '0', '<|eot_id|>', '<|im_end|>',
    '<end_of_turn>', '[INST]', 'ｆｕｌｌ', 'ﬁ', 'a\u0301', '\u00e1', '𱍐', '👩‍💻', '(', ')', '::', '=>', 'x_y', 'CamelCase'];
for (let i = 0; i < 60; i++) {
    const k = 2 + rnd2(9);
    let s = '';
    for (let j = 0; j < k; j++) s += frags2[rnd2(frags2.length)] + (rnd2(3) === 0 ? '' : ' ');
    extra.push(s);
}
export const extraCases = extra.map((t) => [t]);
