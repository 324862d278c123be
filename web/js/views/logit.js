// logit.js - Direct logit attribution (docs/logit-attribution.md): what
// every head (a layer x head grid), every MLP, the embedding and the biases
// write into one logit (or a logit difference) through the final norm at
// its frozen scale, and their sum against the logit.
import { el, heatmap, barChart, fmt } from '../plot.js';
import { textForm, into, section, note, unsupported, pieceText, objectiveControls } from './common.js';

export const id = 'logit-attribution';
export const title = 'Logit attribution';

function headGrid(resp) {
  const layers = [...new Set(resp.heads.map(h => h.layer))].sort((a, b) => a - b);
  const heads = [...new Set(resp.heads.map(h => h.head))].sort((a, b) => a - b);
  const values = layers.map(l => heads.map(h => {
    const x = resp.heads.find(t => t.layer === l && t.head === h);
    return x ? x.value : NaN;
  }));
  return heatmap({ title: 'Direct logit attribution of every head', rows: layers.map(l => `layer ${l}`), cols: heads.map(h => `head ${h}`),
    values, diverging: true, xLabel: 'head', yLabel: 'layer', valueLabel: 'logit contribution', cell: 28,
    tip: (r, c, v) => `layer ${layers[r]} head ${heads[c]}: ${fmt(v)}` });
}

export async function render(root, ctx) {
  if (!ctx.supports('logit_attribution')) { root.append(unsupported(ctx, 'logit_attribution')); return; }
  const out = el('div', { class: 'output' });
  const controls = objectiveControls(ctx, { kinds: false });
  const form = textForm(ctx, input => into(out, async () => {
    const pick = controls.value();
    // no target given: the predicted token against the runner-up, at the position asked
    if (pick.target === undefined) {
      const top = (await ctx.api('v1/forward', { ...input, outputs: ['top_k'], k: 2 })).top_k;
      const p = pick.position ?? -1;
      const entry = top[p < 0 ? top.length + p : p];
      if (!entry) throw new Error(`position ${p} is outside the ${top.length} tokens`);
      pick.target = entry.predictions[0].id;
      if (pick.foil === undefined) pick.foil = entry.predictions[1].id;
    }
    const resp = await ctx.api('v1/logit-attribution', { ...input, ...pick });
    const what = `${resp.foil ? 'logit difference' : 'logit'} of “${pieceText(resp.target.token)}”` +
      `${resp.foil ? ` − “${pieceText(resp.foil.token)}”` : ''} after token ${resp.position} “${pieceText(resp.tokens[resp.position].text)}”`;
    const parts = [['embedding', resp.embed], ...resp.mlps.map(m => [`MLP ${m.layer}`, m.value]), ['biases', resp.bias]];
    return [
      section(`Direct logit attribution: ${what}`,
        el('table', { class: 'stats dla-sum' },
          el('tr', {}, ['logit', 'sum of the terms'].map(t => el('th', { text: t }))),
          el('tr', {}, [resp.logit, resp.total].map(v => el('td', { text: fmt(v) })))),
        el('div', { class: 'row' }, headGrid(resp),
          barChart({ title: 'Embedding, MLPs and biases', labels: parts.map(p => p[0]), values: parts.map(p => p[1]),
            xLabel: 'logit contribution', yLabel: 'term', diverging: true })),
        note('Without a target the view takes the predicted next token and, as the foil, the runner-up. Each term is read through the final norm with its scale frozen at the full forward\'s value, so the terms sum to the ' +
          'logit; a term is not what the logit would be without that piece (the ablation in the Attention view answers that).')),
    ];
  }), controls);
  root.append(form, out);
  await form.run();
}
