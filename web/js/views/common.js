// common.js - pieces every view shares: the text form, token chips, notes.
import { el } from '../plot.js';

// Default inputs that suit each demo model's task.
export function defaultText(ctx) {
  const m = ctx.model;
  if (m.task === 'masked-lm') return 'a [MASK] and often affecting journey .';
  if (m.task === 'causal-lm') return 'The film was one of the best of the year , and the';
  return ctx.state.text;
}

// A text (+ pair when the model takes one: ModelInfo.pairs) form;
// onRun({text, text_pair}) is called on
// submit and once at once. Returns the form element.
export function textForm(ctx, onRun, extra) {
  const m = ctx.model;
  const text = el('textarea', { name: 'text', rows: 2, 'aria-label': 'text' });
  text.value = ctx.state.textFor === m.id ? ctx.state.text : defaultText(ctx);
  const pair = el('input', { name: 'text_pair', placeholder: 'second segment (optional)', 'aria-label': 'text pair' });
  pair.value = ctx.state.pair || '';
  const form = el('form', { class: 'input-form' },
    el('label', { class: 'grow' }, 'text ', text),
    m.pairs === true ? el('label', { class: 'grow' }, 'pair ', pair) : null,
    extra || null,
    el('button', { type: 'submit', text: 'Run' }));
  const run = () => {
    ctx.state.text = text.value;
    ctx.state.textFor = m.id;
    ctx.state.pair = pair.value;
    const input = { model: m.id, text: text.value };
    if (m.pairs === true && pair.value.trim()) input.text_pair = pair.value;
    return onRun(input);
  };
  form.addEventListener('submit', ev => { ev.preventDefault(); run(); });
  form.run = run;
  return form;
}

// GPT-2's byte-level alphabet: each byte is one printable character (the
// printable Latin-1 ones as themselves, the others moved to U+0100..U+0143,
// so a space is Ġ and a newline Ċ); the inverse map turns a piece back into
// its bytes.
const BYTE_OF = (() => {
  const map = new Map();
  let moved = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    map.set(String.fromCodePoint(printable ? b : 256 + moved++), b);
  }
  return map;
})();
const utf8 = new TextDecoder('utf-8', { fatal: true });

// A piece as a reader sees it: a byte-level BPE piece (one with a moved
// character such as Ġ, every character in the alphabet) becomes its UTF-8
// text (bytes that end inside a character are shown as <0xNN>); then a
// space shows as ␣ and a newline as ⏎. WordPiece and SentencePiece pieces
// keep their text.
export function pieceText(s) {
  s = String(s);
  const chars = [...s];
  if (chars.some(ch => ch.codePointAt(0) >= 256) && chars.every(ch => BYTE_OF.has(ch))) {
    const bytes = Uint8Array.from(chars, ch => BYTE_OF.get(ch));
    try { s = utf8.decode(bytes); } catch { s = [...bytes].map(b => (b < 0x80 ? String.fromCharCode(b) : `<0x${b.toString(16).toUpperCase()}>`)).join(''); }
  }
  return s.replace(/ /g, '␣').replace(/\n/g, '⏎');
}

export function labels(tokens) {
  return tokens.map((t, i) => `${i} ${pieceText(t.text)}`);
}

// Runs fn(output) with a fresh output box, showing errors in it; resolves when drawn.
export async function into(box, fn) {
  box.replaceChildren(el('p', { class: 'muted', text: 'computing…' }));
  try {
    const children = await fn();
    box.replaceChildren(...[children].flat().filter(Boolean));
  } catch (err) {
    box.replaceChildren(errorBoxFor(err));
  }
}

let errorBoxFor = err => el('div', { class: 'error', role: 'alert', text: String(err) });
export function setErrorBox(fn) { errorBoxFor = fn; }

// "1 edge", "2 edges"
export function plural(n, word) { return `${n} ${word}${n === 1 ? '' : 's'}`; }

export function note(text) { return el('p', { class: 'note', text }); }

export function unsupported(ctx, analysis) {
  return el('p', { class: 'note unsupported', text: `${ctx.model.id} does not support ${analysis.replace(/_/g, ' ')}; pick another model.` });
}

export function section(title, ...children) {
  return el('section', { class: 'panel' }, el('h2', { text: title }), ...children);
}

// A target / foil is a label name or a token text (kept as typed: GPT-2's
// " good" starts with a space), or an id / index when it is all digits.
function idOrText(s) {
  return /^\d+$/.test(s.trim()) ? Number(s.trim()) : s;
}

// Objective controls (docs/attribution.md "Objectives"): kind, position
// (causal LMs), target, foil. With kinds, the "default" kind sends no
// objective; without (logit attribution), target is required and the foil
// optional. value() -> {kind?, position?, target?, foil?} with the empty
// fields left out, or null for the default objective.
export function objectiveControls(ctx, { kinds = true, target = '', foil = '' } = {}) {
  const causal = ctx.model.task === 'causal-lm';
  const kind = el('select', { name: 'objective-kind', 'aria-label': 'objective kind' },
    ['default', 'probability', 'log_probability', 'logit', 'logit_difference'].map(k => el('option', { value: k, text: k.replace(/_/g, ' ') })));
  const position = el('input', { name: 'objective-position', type: 'number', size: 4, placeholder: 'last', 'aria-label': 'position' });
  const what = causal ? 'token id or text' : 'label or class index';
  const targetIn = el('input', { name: 'objective-target', size: 10, placeholder: kinds ? 'predicted' : what, 'aria-label': 'target' });
  const foilIn = el('input', { name: 'objective-foil', size: 10, placeholder: 'none', 'aria-label': 'foil' });
  targetIn.value = target;
  foilIn.value = foil;
  const box = el('span', { class: 'objective' },
    kinds ? el('label', {}, 'objective ', kind) : null,
    causal ? el('label', {}, ' position ', position) : null,
    el('label', { title: what }, ' target ', targetIn),
    el('label', { title: what }, ' foil ', foilIn));
  box.value = () => {
    if (kinds && kind.value === 'default') return null;
    const o = kinds ? { kind: kind.value } : {};
    if (causal && position.value.trim()) o.position = Number(position.value);
    if (targetIn.value.trim()) o.target = idOrText(targetIn.value);
    if (foilIn.value.trim()) o.foil = idOrText(foilIn.value);
    return o;
  };
  return box;
}

// An objective answer ({kind, position, foil?, ...}) in words.
export function objectiveText(o, target) {
  const t = target ? (target.label ?? target.token ?? target.index ?? target.id) : null;
  return `${o.kind.replace(/_/g, ' ')}${t !== null && t !== undefined ? ` of ${pieceText(t)}` : ''}` +
    `${o.foil !== undefined && o.foil !== null ? ` − ${pieceText(o.foil.label ?? o.foil.token ?? o.foil.index ?? o.foil.id ?? o.foil)}` : ''}` +
    `${Number.isInteger(o.position) ? ` at token ${o.position}` : ''}`;
}
