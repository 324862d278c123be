// common.js - pieces every view shares: the text form, token chips, notes.
import { el } from '../plot.js';

// Default inputs that suit each demo model's task.
export function defaultText(ctx) {
  const m = ctx.model;
  if (m.task === 'masked-lm') return 'a [MASK] and often affecting journey .';
  if (m.task === 'causal-lm') return 'The film was one of the best of the year , and the';
  return ctx.state.text;
}

// A text (+ pair for BERT) form; onRun({text, text_pair}) is called on
// submit and once at once. Returns the form element.
export function textForm(ctx, onRun, extra) {
  const m = ctx.model;
  const text = el('textarea', { name: 'text', rows: 2, 'aria-label': 'text' });
  text.value = ctx.state.textFor === m.id ? ctx.state.text : defaultText(ctx);
  const pair = el('input', { name: 'text_pair', placeholder: 'second segment (optional)', 'aria-label': 'text pair' });
  pair.value = ctx.state.pair || '';
  const form = el('form', { class: 'input-form' },
    el('label', { class: 'grow' }, 'text ', text),
    m.model_type === 'bert' ? el('label', { class: 'grow' }, 'pair ', pair) : null,
    extra || null,
    el('button', { type: 'submit', text: 'Run' }));
  const run = () => {
    ctx.state.text = text.value;
    ctx.state.textFor = m.id;
    ctx.state.pair = pair.value;
    const input = { model: m.id, text: text.value };
    if (m.model_type === 'bert' && pair.value.trim()) input.text_pair = pair.value;
    return onRun(input);
  };
  form.addEventListener('submit', ev => { ev.preventDefault(); run(); });
  form.run = run;
  return form;
}

// Byte-level BPE pieces read better with the space marker shown as such.
export function pieceText(s) {
  return String(s).replace(/[Ġ ]/g, '␣').replace(/[Ċ\n]/g, '⏎');
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

export function note(text) { return el('p', { class: 'note', text }); }

export function unsupported(ctx, analysis) {
  return el('p', { class: 'note unsupported', text: `${ctx.model.id} does not support ${analysis.replace(/_/g, ' ')}; pick another model.` });
}

export function section(title, ...children) {
  return el('section', { class: 'panel' }, el('h2', { text: title }), ...children);
}
