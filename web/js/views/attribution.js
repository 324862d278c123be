// attribution.js - Attribution: per-layer heatmaps of the attribution
// scores (summed over heads, or one head), head importance, and the
// attribution tree drawn over the tokens.
import { el, heatmap, barChart, tokenTree, fmt } from '../plot.js';
import { textForm, into, labels, section, note, unsupported, pieceText, plural, objectiveControls, objectiveText } from './common.js';

export const id = 'attribution';
export const title = 'Attribution';

function layerHeatmaps(resp, head) {
  const lab = labels(resp.tokens);
  return resp.layers.map(layer => {
    const hs = head === 'sum' ? layer.heads : layer.heads.filter(h => String(h.head) === head);
    const T = lab.length;
    const sum = Array.from({ length: T }, (_, i) => Array.from({ length: T }, (_, j) => hs.reduce((a, h) => a + h.attribution[i][j], 0)));
    return heatmap({ title: `Layer ${layer.layer}: attribution ${head === 'sum' ? 'summed over heads' : `head ${head}`}`, rows: lab, cols: lab, values: sum,
      diverging: true, xLabel: 'key token', yLabel: 'query token', valueLabel: 'attribution',
      tip: (r, c, v) => `layer ${layer.layer}: ${lab[r]} → ${lab[c]}: ${v.toPrecision(4)}` });
  });
}

// With an objective the answer says F(A) and, per layer, the completeness:
// the attributions' sum against F(A) − F(0) of that layer.
function completeness(resp) {
  const o = resp.objective;
  return section(`Objective: ${objectiveText(o, resp.target)} = ${fmt(o.value)}`,
    el('table', { class: 'stats completeness' },
      el('tr', {}, ['layer', 'sum of attributions', 'F(A) − F(0)'].map(t => el('th', { text: t }))),
      resp.layers.map(l => el('tr', { 'data-layer': l.layer }, [l.layer, fmt(l.attr_sum), fmt(o.value - l.f_zero)].map(v => el('td', { text: String(v) }))))),
    note('Completeness: integrated gradients make each layer\'s sum equal F(A) − F(0) up to the quadrature error.'));
}

export async function render(root, ctx) {
  if (!ctx.supports('attribution')) { root.append(unsupported(ctx, 'attribution')); return; }
  const out = el('div', { class: 'output' });
  const headSel = el('select', { 'aria-label': 'head', name: 'head' }, el('option', { value: 'sum', text: 'sum over heads' }),
    Array.from({ length: ctx.model.num_heads }, (_, h) => el('option', { value: String(h), text: `head ${h}` })));
  const withTree = ctx.supports('attribution_tree');
  const objective = objectiveControls(ctx);
  const form = textForm(ctx, input => into(out, async () => {
    const obj = objective.value();
    const resp = await ctx.api('v1/attribution', { ...input, ...(withTree ? { tree: true } : {}), ...(obj ? { objective: obj } : {}) });
    const lab = labels(resp.tokens);
    const maps = el('div', { class: 'row maps' }, layerHeatmaps(resp, headSel.value));
    headSel.onchange = () => maps.replaceChildren(...layerHeatmaps(resp, headSel.value));
    const heads = resp.layers.flatMap(l => l.heads.map(h => ({ label: `layer ${l.layer} head ${h.head}`, v: h.importance })));
    const target = resp.target.label != null ? pieceText(resp.target.label)
      : (resp.tokens.length ? `next token id ${resp.target.index}` : resp.target.index);
    const rule = resp.quadrature === 'gauss' ? `${resp.steps} Gauss–Legendre nodes` : `${resp.steps} ${resp.riemann} Riemann steps`;
    const panels = [
      resp.objective ? completeness(resp) : null,
      section(`Attribution scores (target: ${target}, p = ${resp.target.prob ?? 'n/a'}; ${rule})`, maps),
      section('Head importance', barChart({ title: 'Head importance: max attribution of each head', labels: heads.map(h => h.label), values: heads.map(h => h.v),
        xLabel: 'importance', yLabel: 'head' })),
    ];
    if (resp.tree) panels.push(section(`Attribution tree (${plural(resp.tree.edges.length, 'edge')}, root “${pieceText(resp.tokens[resp.tree.root].text)}”)`,
      tokenTree({ title: 'Attribution tree: how information flows into the root token, layer by layer', tokens: lab, layers: resp.layers.length, tree: resp.tree,
        nodeText: n => pieceText(n.text ?? resp.tokens[n.token].text) })));
    else panels.push(note('No attribution tree: it is defined for BERT classifiers only.'));
    return panels;
  }), [el('label', {}, 'heatmaps ', headSel), objective]);
  root.append(form, out);
  await form.run();
}
