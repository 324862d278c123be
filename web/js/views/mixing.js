// mixing.js - Context mixing (docs/context-mixing.md): per layer, how much
// of input token j is in position i by one method (rollout, ALTI, GlobEnc,
// value zeroing, DecompX), the layer's own matrix and the rollout up to it
// on one colour scale, with the raw attention (averaged over heads) beside;
// and the jobs view's chart of the context-mixing job's per-layer shares.
import { el, heatmap, lineChart, CATEGORICAL } from '../plot.js';
import { textForm, into, labels, section, note, unsupported, plural } from './common.js';

export const id = 'context-mixing';
export const title = 'Context mixing';

export const METHODS = ['rollout', 'alti', 'globenc', 'value-zeroing', 'decompx'];

// [layer] -> T x T mean over heads of /v1/forward's attentions
function headMeans(attentions) {
  const byLayer = new Map();
  for (const layer of attentions) {
    const H = layer.heads.length;
    byLayer.set(layer.layer, layer.heads[0].weights.map((row, i) => row.map((_, j) =>
      layer.heads.reduce((a, h) => a + h.weights[i][j], 0) / H)));
  }
  return byLayer;
}

// The largest value of every matrix drawn on the shared scale (at least a
// tiny positive number, so an all-zero answer still has a scale).
function maxOf(matrices) {
  let m = 1e-12;
  for (const mat of matrices) for (const row of mat) for (const v of row) if (Number.isFinite(v)) m = Math.max(m, v);
  return m;
}

function layerRow(resp, attn, lab, domain, layer) {
  const tip = name => (r, c, v) => `layer ${layer.layer} ${name}: ${lab[r]} ← ${lab[c]}: ${v.toPrecision(4)}`;
  const common = { rows: lab, cols: lab, xLabel: 'input token j', yLabel: 'position i', domain };
  const mean = attn.get(layer.layer);
  return el('div', { class: 'row mixing-layer', 'data-layer': layer.layer },
    heatmap({ ...common, title: `Layer ${layer.layer}: ${resp.method} contributions`, values: layer.contributions,
      valueLabel: 'contribution', tip: tip('contribution') }),
    layer.rollout ? heatmap({ ...common, title: `Layers 1..${layer.layer} rolled out`, values: layer.rollout,
      valueLabel: 'contribution (same scale)', tip: tip('rollout') }) : null,
    mean ? heatmap({ ...common, title: `Layer ${layer.layer}: raw attention, mean over heads`, values: mean, domain: [0, 1],
      valueLabel: 'attention weight', tip: tip('attention') }) : null);
}

export async function render(root, ctx) {
  if (!ctx.supports('context_mixing')) { root.append(unsupported(ctx, 'context_mixing')); return; }
  const out = el('div', { class: 'output' });
  const method = el('select', { name: 'method', 'aria-label': 'method' }, METHODS.map(m => el('option', { value: m, text: m })));
  const definition = el('select', { name: 'definition', 'aria-label': 'definition' },
    ['paper-code', 'lensd'].map(d => el('option', { value: d, text: d })));
  const form = textForm(ctx, input => into(out, async () => {
    const [resp, fwd] = await Promise.all([
      ctx.api('v1/context-mixing', { ...input, method: method.value, definition: definition.value }),
      ctx.api('v1/forward', { ...input, outputs: ['attentions'] })]);
    const lab = labels(resp.tokens);
    const domain = [0, maxOf(resp.layers.flatMap(l => [l.contributions, l.rollout || []]))];
    const attn = headMeans(fwd.attentions);
    return [
      section(`Context mixing by ${resp.method} (${resp.definition}): ${resp.layers.length} layers`,
        note('Row i, column j: how much of input token j is in position i after the layer. The layer\'s own matrix and the ' +
          'rollout share one colour scale (0 to the largest value of either); the raw attention, averaged over heads, has its own (0 to 1).'),
        el('div', { class: 'mixing' }, resp.layers.map(layer => layerRow(resp, attn, lab, domain, layer)))),
    ];
  }), [el('label', {}, 'method ', method), el('label', {}, 'definition ', definition)]);
  root.append(form, out);
  await form.run();
}

// The context-mixing job's result (docs/context-mixing.md "Over a dataset"),
// the ALTI paper's per-layer plot: x = layer, y = a mean row share, one line
// per method; the controls pick the share (own token, first token) and the
// matrix (the layer's own, the rollout up to it): the field `${stat}${matrix}`.
const STATS = [['self', 'self share'], ['first', 'first-token share']];
const MATRICES = [['', "layer's own matrix"], ['_rollout', 'rollout up to the layer']];

export function jobPlots(r) {
  const pick = (name, label, options) => el('select', { name, 'aria-label': label }, options.map(([v, t]) => el('option', { value: v, text: t })));
  const stat = pick('cm-stat', 'statistic', STATS), matrix = pick('cm-matrix', 'matrix', MATRICES);
  const box = el('div', { class: 'mixing-job-chart' });
  const draw = () => {
    const key = stat.value + matrix.value, what = STATS.find(([v]) => v === stat.value)[1];
    const ys = r.methods.flatMap(m => m.layers.map(l => l[key])).filter(Number.isFinite);
    // shares: 0 to 1, wider only when a method's signed rows (DecompX) leave it
    const yDomain = [Math.min(0, ...ys), Math.max(1, ...ys)];
    const series = r.methods.map((m, i) => ({ name: m.method, xs: m.layers.map(l => l.layer), ys: m.layers.map(l => l[key]),
      color: CATEGORICAL[(METHODS.includes(m.method) ? METHODS.indexOf(m.method) : i) % CATEGORICAL.length] }));
    box.dataset.key = key;
    box.replaceChildren(lineChart({ title: `Mean ${what} per layer, of the ${MATRICES.find(([v]) => v === matrix.value)[1]}`,
      xLabel: 'layer', yLabel: what, yDomain, series, widthStep: 1.5 }));
  };
  stat.addEventListener('change', draw);
  matrix.addEventListener('change', draw);
  draw();
  return [section(`Context mixing over ${plural(r.n_texts, 'text')} (${plural(r.n_tokens, 'token')}, ${r.definition})`,
    el('div', { class: 'input-form chart-controls' }, el('label', {}, 'statistic ', stat), el('label', {}, 'of the ', matrix)), box,
    note('Each point: over every token i of every text, the mean share of row i (divided by its sum) on token i itself ' +
      '(self: M_ii) or on the first token (first: M_i0, [CLS] on BERT, the attention sink of decoders), in the layer\'s ' +
      'own matrix or in the rollout up to the layer (docs/context-mixing.md "Over a dataset").'))];
}
