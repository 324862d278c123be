// attention.js - Attention: a layer × head grid of thumbnails, a focused
// head with raw and effective attention and their difference, per-head rank,
// null dimension and identifiability bounds, special-token and punctuation
// mass raw vs effective.
import { el, heatmap, thumbnail, colorLegend, scatter, fmt } from '../plot.js';
import { textForm, into, labels, section, note } from './common.js';

export const id = 'attention';
export const title = 'Attention';

function headGrid(resp, onPick) {
  const size = 64;
  const grid = el('div', { class: 'head-grid', role: 'grid', style: `grid-template-columns: 64px repeat(${resp.layers[0].heads.length}, ${size + 8}px)` });
  grid.append(el('div', { class: 'grid-corner', text: 'layer \\ head' }));
  resp.layers[0].heads.forEach(h => grid.append(el('div', { class: 'grid-col', text: `head ${h.head}` })));
  for (const layer of resp.layers) {
    grid.append(el('div', { class: 'grid-row', text: `layer ${layer.layer}` }));
    for (const h of layer.heads) {
      const cell = el('button', { class: 'head-cell', type: 'button', 'data-layer': layer.layer, 'data-head': h.head,
        'data-tip': `layer ${layer.layer} head ${h.head}: rank ${h.rank}, null dim ${h.null_dim}${h.identifiable ? ', identifiable' : ''}`,
        onclick: () => onPick(layer, h) }, thumbnail(h.raw, size, 0, 1));
      grid.append(cell);
    }
  }
  return el('figure', { class: 'plot' }, el('figcaption', { text: 'Raw attention of every head (rows: query token, columns: key token); click one to focus it' }),
    el('div', { class: 'scroll' }, grid), colorLegend(0, 1, false, 'attention weight'));
}

function focused(resp, layer, h) {
  const lab = labels(resp.tokens);
  const diff = h.effective.map((row, i) => row.map((v, j) => v - h.raw[i][j]));
  const tip = name => (r, c, v) => `${name} ${lab[r]} → ${lab[c]}: ${fmt(v)}`;
  const common = { rows: lab, cols: lab, xLabel: 'key token (attended to)', yLabel: 'query token' };
  const idh = resp.identifiability.layers.find(l => l.layer === layer.layer).heads.find(x => x.head === h.head);
  return [
    el('div', { class: 'row' },
      heatmap({ ...common, title: `Raw attention A, layer ${layer.layer} head ${h.head}`, values: h.raw, domain: [0, 1], valueLabel: 'weight', tip: tip('raw') }),
      heatmap({ ...common, title: 'Effective attention (null-space part of A removed)', values: h.effective, diverging: true, valueLabel: 'weight', tip: tip('effective') }),
      heatmap({ ...common, title: 'Difference effective − raw', values: diff, diverging: true, valueLabel: 'difference', tip: tip('effective − raw') })),
    el('table', { class: 'stats' },
      el('tr', {}, ['rank of V', 'null dim', 'identifiable', 'rank V₁ (with bias)', 'stochastic null dim', 'key-aware dim (method)', 'pearson raw/eff']
        .map(t => el('th', { text: t }))),
      el('tr', {}, [h.rank, h.null_dim, h.identifiable ? 'yes' : 'no', idh.rank_v1, idh.stochastic_null_dim,
        `${idh.key_aware.dim ?? 'n/a'} (${idh.key_aware.method})`, fmt(h.stats.pearson)].map(v => el('td', { text: String(v) })))),
  ];
}

function massPlot(resp) {
  const pts = [];
  for (const layer of resp.layers) for (const h of layer.heads) {
    pts.push({ x: h.stats.special_mass_raw, y: h.stats.special_mass_effective, group: 0, label: `L${layer.layer} H${h.head} special tokens` });
    pts.push({ x: h.stats.punct_mass_raw, y: h.stats.punct_mass_effective, group: 1, label: `L${layer.layer} H${h.head} punctuation` });
  }
  return scatter({ title: 'Attention mass on special tokens and punctuation, raw (x) vs effective (y), one point per head', xLabel: 'raw mass',
    yLabel: 'effective mass', points: pts, groups: ['special tokens', 'punctuation'] });
}

// Every head at once: the numbers behind the grid, sortable by eye.
function headsTable(resp) {
  const idl = l => resp.identifiability.layers.find(x => x.layer === l);
  return el('div', { class: 'scroll' }, el('table', { class: 'stats heads' },
    el('tr', {}, ['layer', 'head', 'rank V', 'null dim', 'identifiable', 'key-aware dim', 'special raw', 'special eff.', 'punct. raw', 'punct. eff.']
      .map(t => el('th', { text: t }))),
    resp.layers.flatMap(layer => layer.heads.map(h => {
      const k = idl(layer.layer).heads.find(x => x.head === h.head).key_aware;
      return el('tr', { 'data-layer': layer.layer, 'data-head': h.head }, [layer.layer, h.head, h.rank, h.null_dim, h.identifiable ? 'yes' : 'no',
        k.dim ?? 'n/a', fmt(h.stats.special_mass_raw), fmt(h.stats.special_mass_effective), fmt(h.stats.punct_mass_raw),
        fmt(h.stats.punct_mass_effective)].map(v => el('td', { text: String(v) })));
    }))));
}

function boundsTable(idf) {
  const rows = [['sequence length T', idf.seq_len], ['head dim (value) d_v', idf.head_dim_value], ['head dim (key) d_k', idf.head_dim_key],
    ['Brunner et al. bound (T ≤ d_v identifiable)', idf.brunner_bound], ['identifiable by length', idf.length_identifiable ? 'yes' : 'no'],
    ['key-aware max unknowns', idf.key_aware_max_unknowns]];
  return el('table', { class: 'stats' }, rows.map(([k, v]) => el('tr', {}, el('th', { text: k }), el('td', { text: String(v) }))));
}

export async function render(root, ctx) {
  const out = el('div', { class: 'output' });
  const form = textForm(ctx, input => into(out, async () => {
    const resp = await ctx.api('v1/attention', input);
    const focus = el('div', { class: 'focus' });
    const pick = (layer, h) => {
      out.querySelectorAll('.head-cell').forEach(c => c.setAttribute('aria-pressed', String(c.dataset.layer == layer.layer && c.dataset.head == h.head)));
      focus.replaceChildren(...focused(resp, layer, h));
    };
    const grid = headGrid(resp, pick);
    const panels = [section(`Heads (${resp.layers.length} layers × ${resp.layers[0].heads.length} heads)`, grid),
      section('Focused head', focus), section('Identifiability bounds', boundsTable(resp.identifiability)),
      section('Every head', headsTable(resp)),
      section('Special-token and punctuation mass', massPlot(resp), note('Points below the diagonal: effective attention gives less weight than raw attention.'))];
    pick(resp.layers[0], resp.layers[0].heads[0]);
    return panels;
  }));
  root.append(form, out);
  await form.run();
}
