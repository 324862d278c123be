// tokenizer_spm.mjs - a SentencePiece Unigram model (.model, protobuf) into
// the tokenizer.json transformers' converters (convert_slow_tokenizer.py)
// write for it:
//   albert  AlbertConverter: normalizer Sequence [Replace `` and '' by ",
//           NFKD, StripAccents, Lowercase, Precompiled (the model's
//           charsmap), Replace regex " {2,}" by " "], Metaspace (prepend
//           always), Unigram (pieces and scores, the scores of pieces that
//           are not numbers with commas lowered by 100 as AlbertConverter
//           does), [CLS] A [SEP] (B [SEP]).
//   t5      T5Converter (SpmConverter's defaults, as XLM-R's and T5's
//           files): normalizer Sequence [Precompiled, Replace regex " {2,}"
//           by " "], Metaspace (prepend always), Unigram, A </s> (B </s>).
// Only the protobuf fields needed: ModelProto.pieces (1: piece 1, score 2,
// type 3), trainer_spec.unk_id (2.40), normalizer_spec.precompiled_charsmap (3.2).

function* fields(buf) {
    let i = 0;
    const varint = () => {
        let v = 0n, shift = 0n;
        for (;;) {
            const b = buf[i++];
            v |= BigInt(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
            shift += 7n;
        }
    };
    while (i < buf.length) {
        const key = Number(varint()), no = key >> 3, wire = key & 7;
        if (wire === 0) yield [no, Number(varint())];
        else if (wire === 2) { const n = Number(varint()); yield [no, buf.subarray(i, i + n)]; i += n; }
        else if (wire === 5) { yield [no, buf.readFloatLE(i)]; i += 4; }
        else if (wire === 1) { yield [no, buf.readDoubleLE(i)]; i += 8; }
        else throw new Error(`protobuf wire type ${wire}`);
    }
}

export function spmTokenizerJson(model, style) {
    const pieces = [];
    let unkId = 0, charsmap = null;
    for (const [no, v] of fields(model)) {
        if (no === 1) {
            const p = { piece: '', score: 0, type: 1 };
            for (const [k, x] of fields(v)) {
                if (k === 1) p.piece = Buffer.from(x).toString('utf8');
                else if (k === 2) p.score = x;
                else if (k === 3) p.type = x;
            }
            pieces.push(p);
        } else if (no === 2) {
            for (const [k, x] of fields(v)) if (k === 40) unkId = x;
        } else if (no === 3) {
            for (const [k, x] of fields(v)) if (k === 2) charsmap = Buffer.from(x);
        }
    }
    const numberComma = (s) => s.length < 2 || s.at(-1) !== ',' || !/\d/.test(s.at(-2));
    const albert = style === 'albert';
    const vocab = pieces.map((p) => [p.piece, !albert || numberComma(p.piece) ? p.score : p.score - 100]);
    const id = (s) => pieces.findIndex((p) => p.piece === s);
    const special = (s) => ({ id: id(s), content: s, single_word: false, lstrip: false, rstrip: false,
                              normalized: false, special: true });
    const precompiled = [{ type: 'Precompiled', precompiled_charsmap: charsmap.toString('base64') },
                         { type: 'Replace', pattern: { Regex: ' {2,}' }, content: ' ' }];
    const eos = { type: 'TemplateProcessing',
        single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
        pair: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } },
               { Sequence: { id: 'B', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
        special_tokens: { '</s>': { id: '</s>', ids: [id('</s>')], tokens: ['</s>'] } } };
    return {
        version: '1.0', truncation: null, padding: null,
        added_tokens: (albert ? ['<pad>', '<unk>', '[CLS]', '[SEP]', '[MASK]'] : ['<pad>', '<unk>', '<s>', '</s>'])
            .filter((s) => id(s) >= 0).map(special),
        normalizer: { type: 'Sequence', normalizers: albert ? [
            { type: 'Replace', pattern: { String: '``' }, content: '"' },
            { type: 'Replace', pattern: { String: "''" }, content: '"' },
            { type: 'NFKD' }, { type: 'StripAccents' }, { type: 'Lowercase' }, ...precompiled] : precompiled },
        pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true },
        post_processor: !albert ? eos : { type: 'TemplateProcessing',
            single: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                     { SpecialToken: { id: '[SEP]', type_id: 0 } }],
            pair: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                   { SpecialToken: { id: '[SEP]', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } },
                   { SpecialToken: { id: '[SEP]', type_id: 1 } }],
            special_tokens: { '[CLS]': { id: '[CLS]', ids: [id('[CLS]')], tokens: ['[CLS]'] },
                              '[SEP]': { id: '[SEP]', ids: [id('[SEP]')], tokens: ['[SEP]'] } } },
        decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true },
        model: { type: 'Unigram', unk_id: unkId, vocab, byte_fallback: false },
    };
}
