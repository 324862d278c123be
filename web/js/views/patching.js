// patching.js - Activation patching (docs/patching.md): a clean and a
// corrupted input of the same token length; each grid the answer carries
// (resid [L][T], heads [L][H], mlps [L]; exact, or approximated with
// "method": "attribution") as a heatmap of the normalised effect
// (patched − corrupt) / (clean − corrupt): 0 restores nothing, 1 restores
// the clean objective.
import { el, heatmap, fmt } from '../plot.js';
import { into, labels, section, note, unsupported, objectiveControls, objectiveText } from './common.js';

export const id = 'patching';
export const title = 'Patching';

// A clean / corrupt pair of equal token length for each task's demo model.
function defaultPair(ctx) {
  if (ctx.model.task === 'causal-lm') return ['The film was good , and the', 'The film was bad , and the'];
  return ['a charming , funny film', 'a dull , boring film'];
}

const GRIDS = [
  { key: 'resid', name: 'Residual stream', rows: L => Array.from({ length: L }, (_, l) => (l ? `layer ${l + 1} input` : 'embedding')),
    cols: resp => labels(resp.tokens), xLabel: 'position', yLabel: 'layer' },
  { key: 'heads', name: 'Attention heads', rows: L => Array.from({ length: L }, (_, l) => `layer ${l + 1}`),
    cols: (resp, g) => g[0].map((_, h) => `head ${h}`), xLabel: 'head', yLabel: 'layer' },
  { key: 'mlps', name: 'MLPs', rows: () => ['MLP'], cols: (resp, g) => g.map((_, l) => `layer ${l + 1}`), xLabel: 'layer', yLabel: '' },
];

// The grids of one answer (or of its nested "attribution" object), one
// heatmap each; null effects (clean = corrupt) are grey.
function grids(resp, src, how) {
  // a grid of numbers (or nulls): [L][T], [L][H] or [L]; a per-position head grid ([L][H][T]) is not drawn
  const flat = g => (g.key === 'mlps' ? src.mlps : src[g.key].flat()).every(v => v === null || typeof v === 'number');
  return GRIDS.filter(g => Array.isArray(src[g.key]) && src[g.key].length && flat(g)).map(g => {
    const raw = src[g.key], values = g.key === 'mlps' ? [raw] : raw;
    const num = values.map(row => row.map(v => (v === null ? NaN : v)));
    const rows = g.rows(values.length), cols = g.cols(resp, raw);
    return el('div', { class: 'patch-grid', 'data-grid': g.key, 'data-method': how },
      heatmap({ title: `${g.name} (${how})`, rows, cols, values: num, diverging: true, xLabel: g.xLabel, yLabel: g.yLabel,
        valueLabel: 'normalised effect', cell: g.key === 'resid' ? 18 : 28, tip: (r, c, v) => `${rows[r]}, ${cols[c]}: ${fmt(v)}` }));
  });
}

export async function render(root, ctx) {
  if (!ctx.supports('patching') || !(await ctx.specHas('/v1/patching:'))) { root.append(unsupported(ctx, 'patching')); return; }
  const out = el('div', { class: 'output' });
  const [c0, k0] = defaultPair(ctx);
  const clean = el('textarea', { name: 'clean', rows: 2, 'aria-label': 'clean' });
  const corrupt = el('textarea', { name: 'corrupt', rows: 2, 'aria-label': 'corrupt' });
  clean.value = c0;
  corrupt.value = k0;
  const targets = ['resid', 'heads', 'mlps'].map(t => el('label', {}, el('input', { type: 'checkbox', name: 'target', value: t, checked: t === 'resid' }), ` ${t} `));
  const method = el('select', { name: 'method', 'aria-label': 'method' }, ['exact', 'attribution'].map(m => el('option', { value: m, text: m })));
  const objective = objectiveControls(ctx);
  const form = el('form', { class: 'input-form' },
    el('label', { class: 'grow' }, 'clean ', clean), el('label', { class: 'grow' }, 'corrupt ', corrupt),
    el('span', {}, 'grids ', targets), el('label', {}, 'method ', method), objective,
    el('button', { type: 'submit', text: 'Run' }));
  form.run = () => into(out, async () => {
    const body = { model: ctx.model.id, clean: clean.value, corrupt: corrupt.value };
    const chosen = targets.map(l => l.querySelector('input')).filter(i => i.checked).map(i => i.value);
    // the defaults (resid, exact) are not sent, so a server without the others still answers
    if (chosen.length && !(chosen.length === 1 && chosen[0] === 'resid')) body.targets = chosen;
    if (method.value !== 'exact') body.method = method.value;
    const obj = objective.value();
    if (obj) body.objective = obj;
    const resp = await ctx.api('v1/patching', body);
    const o = resp.objective;
    const drawn = grids(resp, resp, resp.method || method.value);
    if (resp.attribution && typeof resp.attribution === 'object') drawn.push(...grids(resp, resp.attribution, 'attribution'));
    return [section(`Patching clean into corrupt: ${objectiveText(o, resp.target)}: clean ${fmt(o.clean)}, corrupt ${fmt(o.corrupt)}`,
      note('Each cell: the corrupt run with that piece of the clean run patched in, as (patched − corrupt) / (clean − corrupt): ' +
        '1 restores the clean objective, 0 nothing; grey where clean = corrupt leaves nothing to normalise.'),
      el('div', { class: 'row patch-grids' }, drawn))];
  });
  form.addEventListener('submit', ev => { ev.preventDefault(); form.run(); });
  root.append(form, out);
  await form.run();
}
