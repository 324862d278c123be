// decomposition.js - Decomposition of hidden states into position, context
// and residual parts over windows of several texts: position vectors on
// their top two principal components per layer (the spirals), variance
// shares per layer, each window's context mean on the top two principal
// components coloured by topic, and how close context means of one topic are.
import { el, scatter, lineChart, CATEGORICAL } from '../plot.js';
import { into, section, note } from './common.js';

export const id = 'decomposition';
export const title = 'Decomposition';

const SAMPLE = [
  'film\ta charming and often affecting journey . the film is a sweet and moving story about love and loss , well acted and beautifully shot , with a score that stays with you long after the credits .',
  'film\tthe movie is too long and the plot makes no sense . the actors look bored and the jokes fall flat , so by the end you stop caring about any of the characters at all .',
  'market\tstocks fell sharply on monday as investors worried about rising prices and interest rates , and the bank said it would keep rates high for the rest of the year to slow the economy .',
  'market\toil prices rose for a third week as supply stayed tight , lifting energy shares while bond yields climbed and the dollar gained against most major currencies in early trading .',
];

// Renders a DecompositionResponse (also used by the Jobs view).
export function decompositionPlots(resp) {
  const layers = resp.layers.map(l => l.layer);
  const spirals = resp.layers.filter(l => Array.isArray(l.pos_pca)).map(l => scatter({
    title: `Layer ${l.layer}: position vectors on PC1/PC2 (${Math.round(100 * (l.pos_explained.k2 ?? 0))}% explained)`, xLabel: 'PC1', yLabel: 'PC2',
    points: l.pos_pca.map((p, i) => ({ x: p[0], y: p[1], label: `position ${i + resp.first_position}` })), path: true, colorBy: 'order', orderFrom: resp.first_position, width: 300, height: 280 }));
  const share = k => resp.layers.map(l => l.variance_share[k]);
  const shares = lineChart({ title: 'Variance shares per layer', xLabel: 'layer (0 = embeddings)', yLabel: 'share of variance', yDomain: [0, 1],
    series: ['mean', 'pos', 'ctx', 'resid'].map((k, i) => ({ name: { mean: 'global mean', pos: 'position', ctx: 'context', resid: 'residual' }[k], xs: layers, ys: share(k), color: CATEGORICAL[i] })) });
  const out = [section(`Position vectors (${resp.windows} windows of ${resp.length} tokens, ${resp.positions} positions)`, el('div', { class: 'row spirals' }, spirals)),
    section('Variance shares', shares)];
  const withCtx = resp.layers.filter(l => l.ctx_pca && l.ctx_pca.coords.length);
  if (withCtx.length) {
    const names = resp.labels || ['all windows'];
    const pct = (l, i) => `${Math.round(1000 * (l.ctx_pca.variance_share[i] ?? 0)) / 10}%`;
    const ctxPlots = withCtx.map(l => {
      const p = l.ctx_pca, two = p.variance_share.length > 1;
      return scatter({
        title: `Layer ${l.layer}: context means on their PC1/PC2`, groups: names, width: 300, height: 280,
        xLabel: `PC1 (${pct(l, 0)} of context variance)`, yLabel: two ? `PC2 (${pct(l, 1)})` : 'PC2 (none: 2 windows)',
        points: p.coords.map((c, i) => {
          const g = p.label ? p.label[i] : 0;
          return { x: c[0], y: two ? c[1] : 0, group: g, label: `window ${p.window[i]} · ${names[g]}` };
        }) });
    });
    out.push(section(`Context means coloured by topic (${resp.windows} windows${resp.labels ? '' : ', no labels sent'})`,
      el('div', { class: 'row ctx-means' }, ctxPlots),
      note('Each point is one window’s context mean (mean hidden state over its positions, minus the mean over windows), projected on the top two principal axes of the context means; axis titles give each axis’s share of the context means’ variance.')));
  }
  const withTopics = resp.layers.filter(l => l.topics);
  if (withTopics.length) {
    out.push(section(`Topic similarity of context means (${(resp.labels || []).join(', ')})`, lineChart({
      title: 'Cosine similarity of context means: same topic vs different topics', xLabel: 'layer', yLabel: 'mean cosine',
      series: [{ name: 'within a topic', xs: withTopics.map(l => l.layer), ys: withTopics.map(l => l.topics.within), color: CATEGORICAL[0] },
        { name: 'between topics', xs: withTopics.map(l => l.layer), ys: withTopics.map(l => l.topics.between), color: CATEGORICAL[1] }] })));
  }
  return out;
}

export async function render(root, ctx) {
  const out = el('div', { class: 'output' });
  const texts = el('textarea', { rows: 6, 'aria-label': 'texts', name: 'texts' });
  texts.value = SAMPLE.join('\n');
  const length = el('input', { type: 'number', min: 4, max: ctx.model.max_positions, value: 16, name: 'length', 'aria-label': 'window length' });
  const form = el('form', { class: 'input-form' }, el('label', { class: 'grow' }, 'texts, one per line as “topic<TAB>text” ', texts),
    el('label', {}, 'window ', length), el('button', { type: 'submit', text: 'Run' }));
  const run = () => into(out, async () => {
    const lines = texts.value.split('\n').map(s => s.trim()).filter(Boolean);
    const parsed = lines.map(s => (s.includes('\t') ? s.split('\t') : [null, s]));
    const body = { model: ctx.model.id, texts: parsed.map(p => p[1]), length: Number(length.value) };
    if (parsed.every(p => p[0])) body.labels = parsed.map(p => p[0]);
    return decompositionPlots(await ctx.api('v1/decomposition', body));
  });
  form.addEventListener('submit', ev => { ev.preventDefault(); run(); });
  root.append(form, out);
  await run();
}
