// text.js - Text and tokens: tokens with their offsets highlighted in the
// text, predictions (class probabilities, or top-k next / masked tokens) and,
// on servers that have it, the logit lens per layer.
import { el, barChart, fmt, seqColor, colorLegend, heatmap } from '../plot.js';
import { textForm, into, pieceText, section, note, labels } from './common.js';

export const id = 'text';
export const title = 'Text and tokens';

// The text with each token's [start, end) range as a hoverable span.
function highlightedText(text, pair, tokens) {
  const block = (s, segment) => {
    const spans = [];
    let at = 0;
    tokens.forEach((t, i) => {
      if (t.start === null || t.segment !== segment) return;
      if (t.start > at) spans.push(document.createTextNode(s.slice(at, t.start)));
      spans.push(el('span', { class: `tok-span c${i % 2}`, 'data-token': i, 'data-tip': `token ${i}: ${t.text} [${t.start}, ${t.end})` },
        s.slice(t.start, t.end)));
      at = Math.max(at, t.end);
    });
    if (at < s.length) spans.push(document.createTextNode(s.slice(at)));
    return el('p', { class: 'source-text' }, spans);
  };
  return [block(text, 0), pair ? block(pair, 1) : null];
}

function tokenChips(tokens) {
  return el('ol', { class: 'tokens' }, tokens.map((t, i) => el('li', {
    class: `chip${t.special ? ' special' : ''} c${i % 2}`, 'data-token': i,
    'data-tip': `id ${t.id}${t.start === null ? ' (special)' : ` · chars [${t.start}, ${t.end})`} · segment ${t.segment}`,
  }, el('span', { class: 'idx', text: i }), pieceText(t.text))));
}

// Hovering a chip marks its span in the text and the other way round.
function linkHover(root) {
  root.addEventListener('mouseover', ev => {
    const t = ev.target.closest('[data-token]');
    root.querySelectorAll('.hot').forEach(e => e.classList.remove('hot'));
    if (t) root.querySelectorAll(`[data-token="${t.dataset.token}"]`).forEach(e => e.classList.add('hot'));
  });
}

// Positions to predict at: masked tokens for an MLM, the last token for a causal LM.
function predictPositions(model, tokens) {
  if (model.task === 'masked-lm') return tokens.flatMap((t, i) => (t.text === '[MASK]' ? [i] : []));
  if (model.task === 'causal-lm') return [tokens.length - 1];
  return [];
}

function softmaxTopK(row, k) {
  const max = Math.max(...row);
  const exps = row.map(v => Math.exp(v - max)), sum = exps.reduce((a, b) => a + b, 0);
  return exps.map((e, id) => ({ id, prob: e / sum })).sort((a, b) => b.prob - a.prob).slice(0, k);
}

// top_k of a /v1/forward response ([{position, predictions: [{id, token, prob}]}])
// as [{position, items: [{id, text, prob}]}].
export function readTopK(resp) {
  const list = resp.top_k;
  if (!Array.isArray(list)) return null;
  return list.map(entry => {
    const items = entry.predictions || [];
    return { position: entry.position, items: items.map(t => ({ id: t.id, text: t.token ?? t.text, prob: t.prob })) };
  });
}

// Older servers: logits at the positions, softmax and top-k here, pieces
// named through /v1/tokenize with input_ids.
async function topKFromLogits(ctx, input, positions, k) {
  const resp = await ctx.api('v1/forward', { ...input, outputs: ['logits'], positions });
  const rows = positions.length === 1 && !Array.isArray(resp.logits[0]) ? [resp.logits] : resp.logits;
  const tops = rows.map(row => softmaxTopK(row, k));
  const ids = tops.flat().map(t => t.id);
  const named = await ctx.api('v1/tokenize', { model: input.model, input_ids: ids });
  let n = 0;
  return tops.map((items, p) => ({ position: positions[p], items: items.map(t => ({ ...t, text: named.tokens[n++].text })) }));
}

// Bars are scaled to the list's largest probability (the first), so the
// top bar fills the row and the others compare with it; the numbers say
// the probabilities themselves.
function topKList(entry, tokens, where) {
  const top = Math.max(...entry.items.map(t => t.prob), 1e-12);
  return el('div', { class: 'topk-box' },
    el('h3', { text: `${where} token ${entry.position} “${pieceText(tokens[entry.position].text)}”` }),
    el('div', { class: 'axis-note', text: `bar length: probability relative to the top one (${fmt(top)})` }),
    el('ol', { class: 'topk', 'data-position': entry.position }, entry.items.map(t => el('li', { 'data-id': t.id, 'data-prob': t.prob },
      el('span', { class: 'bar', style: `width:${(100 * t.prob / top).toFixed(1)}%;background:${seqColor(0.3 + 0.6 * t.prob / top)}` }),
      el('span', { class: 'piece', text: pieceText(t.text) }), el('span', { class: 'prob', text: fmt(t.prob) })))));
}

// logit_lens: [{position, layers: [{layer, predictions}]}]; drawn as a
// layer × rank table coloured by probability.
function logitLensTable(lens, tokens, where) {
  const k = Math.max(...lens.layers.map(l => l.predictions.length));
  // colour up to the largest probability in the table, so low-confidence layers still differ
  const top = Math.max(...lens.layers.flatMap(l => l.predictions.map(p => p.prob)), 1e-6);
  const rows = lens.layers.map(l => el('tr', { 'data-layer': l.layer }, el('th', { text: l.layer === 0 ? 'embeddings' : `layer ${l.layer}` }),
    l.predictions.map(t => el('td', { style: `background:${seqColor(t.prob / top)};color:${t.prob / top > 0.6 ? '#000' : '#fff'}`,
      'data-id': t.id, 'data-tip': `layer ${l.layer}, ${where} token ${lens.position}: ${pieceText(t.token)} p=${fmt(t.prob)}` },
      el('span', { class: 'piece', text: pieceText(t.token) }), el('span', { class: 'p', text: fmt(t.prob) })))));
  return el('figure', { class: 'plot' },
    el('figcaption', { text: `Logit lens ${where} token ${lens.position} “${pieceText(tokens[lens.position].text)}”: each layer's hidden state read through the final norm and LM head` }),
    el('div', { class: 'axis-note', text: 'rows: layer · columns: rank (1 = most probable)' }),
    el('div', { class: 'scroll' }, el('table', { class: 'lens' },
      el('thead', {}, el('tr', {}, el('th', { text: 'layer \\ rank' }), Array.from({ length: k }, (_, r) => el('th', { text: r + 1 })))),
      el('tbody', {}, rows))),
    colorLegend(0, top, false, 'probability'));
}

async function predictions(ctx, input, tokens) {
  const m = ctx.model;
  if (m.task === 'classification') {
    const resp = await ctx.api('v1/forward', { ...input, outputs: ['logits'] });
    return section('Prediction', barChart({ title: `Class probabilities (predicted: ${resp.label})`, labels: m.labels || resp.probs.map((_, i) => `class ${i}`),
      values: resp.probs, xLabel: 'probability', yLabel: 'class', domain: [0, 1], highlight: resp.label_id }));
  }
  const positions = predictPositions(m, tokens);
  if (!positions.length) return section('Predictions', note('Put [MASK] in the text to see the masked-LM predictions.'));
  const k = 10;
  let tops, lens = null;
  if (await ctx.specHas('logit_lens:')) {
    const resp = await ctx.api('v1/forward', { ...input, outputs: ['top_k'], k, positions, logit_lens: true });
    tops = readTopK(resp);
    lens = resp.logit_lens || null;
  }
  if (!tops) tops = await topKFromLogits(ctx, input, positions, k);
  const where = m.task === 'masked-lm' ? 'at' : 'after';
  const out = [section(`Top-${k} predictions`, el('div', { class: 'row' }, tops.map(e => topKList(e, tokens, where))))];
  if (Array.isArray(lens) && lens.length) out.push(section('Logit lens', el('div', { class: 'row' }, lens.map(l => logitLensTable(l, tokens, where)))));
  else out.push(note('Logit lens: this server does not offer "logit_lens" on /v1/forward.'));
  return out;
}

// Mixture-of-experts models ("router" among the model's analyses): per MoE
// layer a token x expert map of the gate weights of the experts each token
// was routed to (0 elsewhere), the router probability of every expert in
// the hover.
async function routing(ctx, input) {
  const resp = await ctx.api('v1/forward', { ...input, outputs: ['router_probs'] });
  const lab = labels(resp.tokens);
  const top = Math.max(1e-12, ...resp.router.flatMap(l => l.weights.flat()));
  const maps = resp.router.map(layer => {
    const E = layer.probs[0].length;
    const gate = layer.experts.map((chosen, t) => Array.from({ length: E }, (_, e) => {
      const k = chosen.indexOf(e);
      return k < 0 ? 0 : layer.weights[t][k];
    }));
    const experts = Array.from({ length: E }, (_, e) => `expert ${e}`);
    return el('div', { class: 'router-layer', 'data-layer': layer.layer }, heatmap({
      title: `Layer ${layer.layer}: experts fired per token`, rows: lab, cols: experts, values: gate, domain: [0, top],
      xLabel: 'expert', yLabel: 'token', valueLabel: 'gate weight (0: not routed)',
      tip: (r, c, v) => `layer ${layer.layer}, ${lab[r]} → expert ${c}: ${v ? `gate ${fmt(v)}, rank ${layer.experts[r].indexOf(c) + 1}` : 'not routed'}` +
        ` · router p ${fmt(layer.probs[r][c])}` }));
  });
  const K = resp.router.length ? resp.router[0].experts[0].length : 0;
  return section(`Expert routing (${resp.router.length} mixture-of-experts layers, ${K} experts per token)`,
    note('Each token runs through the experts its router picks; a cell is the gate weight of that expert in the token\'s MLP ' +
      'output. One colour scale for every layer.'),
    el('div', { class: 'row routing' }, maps));
}

export async function render(root, ctx) {
  const out = el('div', { class: 'output' });
  const form = textForm(ctx, input => into(out, async () => {
    const tok = await ctx.api('v1/tokenize', input);
    const tokensPanel = section(`Tokens (${tok.tokens.length})`, ...highlightedText(input.text, input.text_pair, tok.tokens), tokenChips(tok.tokens));
    linkHover(tokensPanel);
    return [tokensPanel, await predictions(ctx, input, tok.tokens), ctx.supports('router') ? await routing(ctx, input) : null].flat();
  }));
  root.append(form, out);
  await form.run();
}
