// tokenizer_encode.mjs - one case through Hugging Face's Rust `tokenizers`
// (npm `tokenizers`), as the fixtures record it: ids, character offsets,
// type ids, "special" (what lensd reports: HF's special_tokens_mask or'ed with
// the added tokens marked "special": true that were typed in the text, which
// HF gives mask 0; lensd decides by id) and "template" (HF's mask: the tokens
// a post-processor added, whose offsets HF gives as [0, 0]).
export async function encodeCase(t, addedSpecial, text, pair) {
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
    return item;
}

// The ids of the added tokens marked "special" in a tokenizer.json.
export function addedSpecialIds(json) {
    return new Set((json.added_tokens ?? []).filter((a) => a.special).map((a) => a.id));
}
