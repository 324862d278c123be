// attention.js - Attention: a layer × head grid of thumbnails, a focused
// head with raw and effective attention and their difference on one colour
// scale, the length bound (T > d_v) under which they can differ and a long
// example that crosses it, per-head rank, null dimension and
// identifiability bounds, special-token and punctuation mass raw vs
// effective.
import { el, heatmap, thumbnail, colorLegend, scatter, fmt } from '../plot.js';
import { textForm, into, labels, section, note, objectiveText, pieceText, objectiveControls } from './common.js';

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
        onclick: ev => onPick(layer, h, ev.currentTarget) }, thumbnail(h.raw, size, 0, 1));
      grid.append(cell);
    }
  }
  return el('figure', { class: 'plot' }, el('figcaption', { text: 'Raw attention of every head (rows: query token, columns: key token); click one to focus it' }),
    el('div', { class: 'scroll' }, grid), colorLegend(0, 1, false, 'attention weight'));
}

// Raw, effective and their difference on one diverging scale, ±(the
// largest |weight| of raw or effective): equal values get equal colours in
// every panel, and a zero difference is white.
function focused(resp, ctx, layer, h) {
  const lab = labels(resp.tokens);
  const diff = h.effective.map((row, i) => row.map((v, j) => v - h.raw[i][j]));
  const tip = name => (r, c, v) => `${name} ${lab[r]} → ${lab[c]}: ${fmt(v)}`;
  let m = 0;
  for (const row of h.raw.concat(h.effective)) for (const v of row) if (Number.isFinite(v)) m = Math.max(m, Math.abs(v));
  // cells shrink (18 px down to 8) so a text of up to 50 tokens shows whole, row d_v included
  const cell = Math.max(8, Math.min(18, Math.floor(400 / lab.length)));
  const dv = resp.identifiability.head_dim_value;
  // causal heads: from row d_v on a query sees more than d_v keys, so effective can differ there
  const markRow = ctx.model.causal === true && lab.length > dv ? { index: dv, label: `row ${dv} = d_v` } : undefined;
  const common = { rows: lab, cols: lab, xLabel: 'key token (attended to)', yLabel: 'query token', diverging: true, domain: [-(m || 1), m || 1], cell, markRow };
  const maxDiff = Math.max(0, ...diff.flat().filter(Number.isFinite).map(Math.abs));
  const idh = resp.identifiability.layers.find(l => l.layer === layer.layer).heads.find(x => x.head === h.head);
  return [
    el('div', { class: 'row' },
      heatmap({ ...common, title: `Raw attention A, layer ${layer.layer} head ${h.head}`, values: h.raw, valueLabel: 'weight', tip: tip('raw') }),
      heatmap({ ...common, title: 'Effective attention (null-space part of A removed)', values: h.effective, valueLabel: 'weight', tip: tip('effective') }),
      heatmap({ ...common, title: `Difference effective − raw (largest |difference| ${fmt(maxDiff)}, same scale)`, values: diff, valueLabel: 'difference', tip: tip('effective − raw') })),
    el('table', { class: 'stats' },
      el('tr', {}, ['rank of V', 'null dim', 'identifiable', 'rank V₁ (with bias)', 'stochastic null dim', 'key-aware dim (method)', 'pearson raw/eff']
        .map(t => el('th', { text: t }))),
      el('tr', {}, [h.rank, h.null_dim, h.identifiable ? 'yes' : 'no', idh.rank_v1, idh.stochastic_null_dim,
        `${idh.key_aware.dim ?? 'n/a'} (${idh.key_aware.method})`, fmt(h.stats.pearson)].map(v => el('td', { text: String(v) })))),
    note('Two different counts. identifiable (Brunner et al.): rank V = T, so V has no null space and no other attention matrix ' +
      'gives this head the same output; effective = raw. key-aware dim (Bhardwaj et al.): rank(J) − rank(M J), where J maps small ' +
      'moves of the keys to the changes of attention they cause and M multiplies a change by V; it counts the key-reachable ' +
      'changes that leave the output unchanged: at most T × null dim, so 0 when identifiable, and below that when the keys ' +
      'cannot reach every null-space change (docs/identifiability.md, sections 1 and 3).'),
  ];
}

// Effective attention can differ from raw only once the text is longer
// than the value dimension (Brunner et al.: T ≤ d_v leaves V without a null
// space); says where this text and model stand.
function lengthBound(resp, ctx, onLong) {
  const { seq_len: T, head_dim_value: dv } = resp.identifiability;
  const maxT = ctx.model.max_positions;
  const box = el('div', { class: 'bound', 'data-t': T, 'data-dv': dv });
  const where = T <= dv
    ? `This text is T = ${T} tokens ≤ d_v = ${dv}: V has no null space, so effective attention equals raw attention (difference 0, Pearson 1).`
    : `This text is T = ${T} tokens > d_v = ${dv}: V has a null space of up to T − d_v = ${T - dv} dimensions, so effective attention can differ from raw` +
      `${ctx.model.causal === true ? ` (causal: rows ${dv} onward, where a query sees more than d_v tokens)` : ''}.`;
  box.append(el('p', { text: `Effective attention can differ from raw attention only when the text is longer than the value dimension d_v. ${where}` }));
  if (maxT > dv) {
    box.append(el('button', { type: 'button', class: 'long-example', text: `long example (${Math.min(maxT, dv + 16)} tokens)`, onclick: onLong }));
  } else {
    box.append(el('p', { class: 'muted', text: `${ctx.model.id} takes at most ${maxT} tokens = d_v: its attention is identifiable at every length, so effective always equals raw.` }));
  }
  return box;
}

// A text of exactly n tokens for the model: a plain passage cut at its n-th
// token (offsets from /v1/tokenize; special tokens of the template count).
// Only its first n words are sent: each word is at least one token, and the
// whole passage is longer than the demo models' 128 positions.
const PASSAGE = ('the film opens on a quiet street where an old man feeds the birds every morning , and for a while nothing else happens . ' +
  'then a letter arrives , the kind that changes a life , and the story turns into a long journey across the country by train , ' +
  'by bus and finally on foot , with a dog that will not leave his side and a young woman who is running away from something she ' +
  'never names . the acting is warm , the music is simple and the camera stays close to their faces , so by the end you feel you have ' +
  'travelled with them and you are sorry to see them go . it is not a perfect film , but it is an honest and often moving one .');
async function textOfTokens(ctx, n) {
  const words = PASSAGE.split(' ').slice(0, n).join(' ');
  const tok = await ctx.api('v1/tokenize', { model: ctx.model.id, text: words });
  const special = tok.tokens.filter(t => t.start === null).length;
  const inText = tok.tokens.filter(t => t.start !== null);
  const keep = inText[Math.min(inText.length, n - special) - 1];
  return words.slice(0, keep.end);
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

// Ablation (docs/ablation.md): with "click heads to ablate" on, a click on
// a head cell adds it to (or takes it from) the ablated set and asks
// /v1/ablation how the objective (the predicted class or next token) moves.
function ablationPanel(ctx, input) {
  const toggle = el('input', { type: 'checkbox', name: 'ablate' });
  const mode = el('select', { name: 'ablation-mode', 'aria-label': 'ablation mode' }, ['zero', 'mean'].map(m => el('option', { value: m, text: m })));
  const result = el('div', { class: 'ablation-result' }, note('No head ablated.'));
  const objective = objectiveControls(ctx);
  const heads = new Map(); // "layer:head" -> [layer, head]
  let asked = 0;
  const run = async () => {
    const mine = ++asked;
    if (!heads.size) { result.replaceChildren(note('No head ablated.')); return; }
    const list = [...heads.values()].sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    result.replaceChildren(note('computing…'));
    // answers to earlier clicks that arrive late are dropped
    const obj = objective.value();
    const answer = ctx.api('v1/ablation', { ...input, heads: list, mode: mode.value, ...(obj ? { objective: obj } : {}) })
      .then(r => ({ r }), e => ({ e }));
    const { r: resp, e } = await answer;
    if (mine !== asked) return;
    await into(result, () => {
      if (e) throw e;
      const o = resp.objective;
      const who = t => pieceText(t.label ?? t.token ?? t.index ?? t.id);
      const rows = [['objective', objectiveText(o, resp.target)], ['predicted (clean run)', who(resp.predicted)],
        ['clean', fmt(o.clean)], ['ablated', fmt(o.ablated)], ['change', fmt(o.change)]];
      const out = [el('p', { text: `Ablated (${mode.value}): ${list.map(([l, h]) => `L${l} H${h}`).join(', ')}` }),
        el('table', { class: 'stats ablation', 'data-change': o.change }, rows.map(([k, v]) => el('tr', {}, el('th', { text: k }), el('td', { text: v }))))];
      if (resp.probs && ctx.model.labels) {
        out.push(el('table', { class: 'stats ablation-probs' }, el('tr', {}, ['label', 'clean p', 'ablated p'].map(t => el('th', { text: t }))),
          ctx.model.labels.map((name, i) => el('tr', {}, [name, fmt(resp.probs.clean[i]), fmt(resp.probs.ablated[i])].map(v => el('td', { text: v }))))));
      }
      return out;
    });
  };
  mode.onchange = run;
  objective.addEventListener('change', run);
  const panel = section('Ablation', el('div', { class: 'input-form' }, el('label', {}, toggle, ' click heads to ablate '),
    el('label', {}, 'mode ', mode), objective), result);
  // a click on a head cell: toggles it when ablating; false lets the click focus the head
  panel.toggleHead = (layer, head, cell) => {
    if (!toggle.checked) return false;
    const key = `${layer}:${head}`;
    if (heads.has(key)) heads.delete(key); else heads.set(key, [layer, head]);
    cell.dataset.ablated = String(heads.has(key));
    run();
    return true;
  };
  return panel;
}

export async function render(root, ctx) {
  const out = el('div', { class: 'output' });
  let form;
  const runLong = async () => {
    const n = Math.min(ctx.model.max_positions, ctx.model.head_dim_value + 16);
    form.querySelector('textarea[name=text]').value = await textOfTokens(ctx, n);
    await form.run();
  };
  form = textForm(ctx, input => into(out, async () => {
    const resp = await ctx.api('v1/attention', input);
    const focus = el('div', { class: 'focus' });
    const ablation = ctx.supports('ablation') && (await ctx.specHas('/v1/ablation:')) ? ablationPanel(ctx, input) : null;
    const pick = (layer, h, cell) => {
      if (ablation && cell && ablation.toggleHead(layer.layer, h.head, cell)) return;
      out.querySelectorAll('.head-cell').forEach(c => c.setAttribute('aria-pressed', String(c.dataset.layer == layer.layer && c.dataset.head == h.head)));
      focus.replaceChildren(...focused(resp, ctx, layer, h));
    };
    const grid = headGrid(resp, pick);
    const panels = [section(`Heads (${resp.layers.length} layers × ${resp.layers[0].heads.length} heads)`, grid), ablation,
      section('Focused head', lengthBound(resp, ctx, runLong), focus), section('Identifiability bounds', boundsTable(resp.identifiability)),
      section('Every head', headsTable(resp)),
      section('Special-token and punctuation mass', massPlot(resp), note('Points below the diagonal: effective attention gives less weight than raw attention.'))];
    pick(resp.layers[0], resp.layers[0].heads[0]);
    return panels;
  }));
  root.append(form, out);
  await form.run();
}
