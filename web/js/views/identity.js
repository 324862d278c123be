// identity.js - Token identity and hidden-token attribution: how well each
// layer's hidden vectors identify their input token (rank per layer), and
// how much of each input token is mixed into each hidden token (a heatmap
// per layer, chosen with a slider).
import { el, heatmap, lineChart, fmt, CATEGORICAL } from '../plot.js';
import { textForm, into, labels, section } from './common.js';

export const id = 'identity';
export const title = 'Token identity';

function identityPanels(resp, lab) {
  const layers = resp.layers.map(l => l.layer);
  const rates = lineChart({ title: `Identification rate per layer (${resp.metric}, ${resp.mapping} mapping)`, xLabel: 'layer (0 = embeddings)', yLabel: 'share identified',
    yDomain: [0, 1], series: [
      { name: 'all tokens', xs: layers, ys: resp.layers.map(l => l.rate), color: CATEGORICAL[0] },
      { name: 'excluding special tokens', xs: layers, ys: resp.layers.map(l => l.rate_excluding_special), color: CATEGORICAL[1], dash: '6 4' }] });
  const ranks = lab.map((_, i) => resp.layers.map(l => l.ranks[i]));
  const maxRank = Math.max(...ranks.flat());
  const rankMap = heatmap({ title: 'Rank of each token’s own input among the candidates (1 = identified)', rows: lab, cols: layers.map(l => `layer ${l}`),
    values: ranks, domain: [1, Math.max(2, maxRank)], xLabel: 'layer', yLabel: 'token', valueLabel: 'rank', cell: 28,
    tip: (r, c, v) => `${lab[r]} at layer ${layers[c]}: rank ${v}` });
  return [rates, rankMap];
}

function contributionPanel(resp, lab) {
  const box = el('div', { class: 'contrib' });
  const slider = el('input', { type: 'range', min: 0, max: resp.layers.length - 1, value: resp.layers.length - 1, 'aria-label': 'layer', name: 'layer' });
  const label = el('output', {});
  const draw = () => {
    const layer = resp.layers[Number(slider.value)];
    label.textContent = `layer ${layer.layer}`;
    box.replaceChildren(heatmap({ title: `Contribution of each input token (columns) to each hidden token (rows), layer ${layer.layer}`, rows: lab, cols: lab,
      values: layer.contributions, domain: [0, 1], xLabel: 'input token', yLabel: 'hidden token', valueLabel: 'contribution',
      tip: (r, c, v) => `hidden ${lab[r]} ← input ${lab[c]}: ${fmt(v)} (self rank of ${lab[r]}: ${layer.self_rank[r]})` }));
  };
  slider.addEventListener('input', draw);
  draw();
  return [el('label', { class: 'slider' }, 'layer ', slider, label), box];
}

export async function render(root, ctx) {
  const out = el('div', { class: 'output' });
  const form = textForm(ctx, input => into(out, async () => {
    const [ti, ha] = await Promise.all([ctx.api('v1/token-identity', input), ctx.api('v1/hidden-attribution', input)]);
    const lab = labels(ti.tokens);
    return [section('Token identity', el('div', { class: 'row' }, identityPanels(ti, lab))),
      section(`Hidden-token attribution (${ha.method})`, ...contributionPanel(ha, lab))];
  }));
  root.append(form, out);
  await form.run();
}
