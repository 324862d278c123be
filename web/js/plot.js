// plot.js - the dashboard's plots, plain SVG (and canvas for thumbnails and
// for the cells of heatmaps above CANVAS_CELLS).
//
// Every plot has a title, labelled axes and a legend. Colour scales:
// sequential values use viridis (perceptually uniform), signed values a
// diverging red-white-blue scale centred on 0 (ColorBrewer RdBu). Heatmaps
// keep a minimum cell size and scroll inside their box instead of shrinking
// long sequences; hovering a cell shows its row and column labels and value.

const SVG = 'http://www.w3.org/2000/svg';

// viridis sampled at 11 evenly spaced points (matplotlib's table)
const VIRIDIS = ['#440154', '#482475', '#414487', '#355f8d', '#2a788e', '#21918c', '#22a884', '#44bf70',
  '#7ad151', '#bddf26', '#fde725'];
// ColorBrewer RdBu, 11 classes, reversed so negative = red, positive = blue
const RDBU = ['#67001f', '#b2182b', '#d6604d', '#f4a582', '#fddbc7', '#f7f7f7', '#d1e5f0', '#92c5de',
  '#4393c3', '#2166ac', '#053061'];
// Okabe-Ito: categorical colours readable with colour-vision deficiencies
export const CATEGORICAL = ['#0072b2', '#e69f00', '#009e73', '#cc79a7', '#56b4e9', '#d55e00', '#f0e442', '#000000'];

function hex(c) { return [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16)); }
function lerpTable(table, t) {
  t = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (table.length - 1);
  const i = Math.min(table.length - 2, Math.floor(t)), f = t - i;
  const a = hex(table[i]), b = hex(table[i + 1]);
  return `rgb(${a.map((v, k) => Math.round(v + (b[k] - v) * f)).join(',')})`;
}

// t in [0, 1] -> viridis; t in [-1, 1] -> RdBu
export const seqColor = t => lerpTable(VIRIDIS, t);
export const divColor = t => lerpTable(RDBU, (t + 1) / 2);

export function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return 'n/a';
  if (typeof v !== 'number') return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return Number(v.toPrecision(4)).toString();
}

export function el(tag, attrs = {}, ...children) {
  const svg = ['svg', 'g', 'rect', 'line', 'text', 'path', 'circle', 'defs', 'linearGradient', 'stop', 'title',
    'polyline'].includes(tag);
  const e = svg ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// --------------------------------------------------------------- tooltip

let tip;
function tooltip() {
  if (!tip) {
    tip = el('div', { class: 'tooltip', role: 'status' });
    document.body.append(tip);
  }
  return tip;
}
export function showTip(ev, text) {
  const t = tooltip();
  t.textContent = text;
  t.style.display = 'block';
  const x = Math.min(ev.clientX + 12, window.innerWidth - t.offsetWidth - 4);
  t.style.left = `${Math.max(0, x)}px`;
  t.style.top = `${ev.clientY + 14}px`;
}
export function hideTip() { if (tip) tip.style.display = 'none'; }

// Hover on any element carrying data-tip (plot cells, bars, points, edges,
// tokens) shows it; installed once on the page by app.js.
export function installTips(root) {
  root.addEventListener('mousemove', ev => {
    const t = ev.target.closest('[data-tip]');
    if (t) showTip(ev, t.dataset.tip); else hideTip();
  });
  root.addEventListener('mouseleave', hideTip);
  return root;
}

// --------------------------------------------------------------- helpers

function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (lo === Infinity) return [0, 1];
  if (lo === hi) return [lo - 0.5, hi + 0.5];
  return [lo, hi];
}

function ticks(lo, hi, n = 5) {
  const step0 = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(step0 || 1));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= step0) || mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function figure(title, cls) {
  return el('figure', { class: `plot ${cls || ''}` }, el('figcaption', { text: title }));
}

// Colour legend: a gradient bar with its end (and centre) values.
export function colorLegend(lo, hi, diverging, label) {
  const w = 180, id = `g${Math.random().toString(36).slice(2)}`;
  const stops = [];
  for (let i = 0; i <= 10; i++) {
    const t = i / 10;
    stops.push(el('stop', { offset: `${t * 100}%`, 'stop-color': diverging ? divColor(2 * t - 1) : seqColor(t) }));
  }
  const x0 = 34; // room for a negative end label centred under the bar's start
  const svg = el('svg', { class: 'legend', width: w + 2 * x0, height: 44, role: 'img', 'aria-label': `colour scale ${label}` },
    el('defs', {}, el('linearGradient', { id }, stops)),
    el('text', { x: x0, y: 10, text: label || 'value', class: 'legend-label' }),
    el('rect', { x: x0, y: 14, width: w, height: 10, fill: `url(#${id})`, stroke: '#999' }),
    el('text', { x: x0, y: 38, 'text-anchor': 'middle', text: fmt(lo) }),
    el('text', { x: x0 + w, y: 38, 'text-anchor': 'middle', text: fmt(hi) }));
  if (diverging) svg.append(el('text', { x: x0 + w / 2, y: 38, 'text-anchor': 'middle', text: '0' }));
  return svg;
}

// ---------------------------------------------------------------- heatmap

// Above this many cells (T = 100) a heatmap's cells are one <canvas> under
// the SVG labels, not one <rect> each; hover still names the cell. Measured
// by make test-web (build + first layout, headless chromium, 6 px cells,
// 2-core EPYC shared with other builds): SVG 220 ms at T = 128 and 1.8 s at
// T = 256, canvas 86 ms and 171 ms, 1.2 s at T = 512 (262,144 cells, where
// SVG would be ~7 s and 262,144 DOM nodes); at T = 64 both are under 70 ms.
export const CANVAS_CELLS = 10000;

// opts: rows, cols (labels), values[r][c], title, xLabel, yLabel, diverging,
// domain [lo, hi] (default: data extent, symmetric when diverging), cell
// (px, default 18; 6 on a canvas), valueLabel, tip(r, c, v) -> text,
// canvas (true / false: force the drawing; default by CANVAS_CELLS),
// markRow {index, label}: a dashed rule above that row, labelled.
export function heatmap(opts) {
  const { rows, cols, values } = opts;
  const onCanvas = opts.canvas ?? rows.length * cols.length > CANVAS_CELLS;
  const cell = opts.cell || (onCanvas ? 6 : 18);
  let [lo, hi] = opts.domain || extent(values.flat());
  if (opts.diverging && !opts.domain) { const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1; lo = -m; hi = m; }
  const color = v => !Number.isFinite(v) ? '#ccc'
    : opts.diverging ? divColor(v / Math.max(Math.abs(lo), Math.abs(hi))) : seqColor((v - lo) / (hi - lo));
  const tipOf = (r, c) => (opts.tip ? opts.tip(r, c, values[r][c]) : `${rows[r]} → ${cols[c]}: ${fmt(values[r][c])}`);
  // small canvas cells: every k-th label, so labels never overlap
  const every = Math.ceil(12 / cell);
  const labelW = Math.min(120, 8 + 7 * Math.max(...rows.map(r => String(r).length), 1));
  const labelH = Math.min(110, 8 + 6 * Math.max(...cols.map(c => String(c).length), 1));
  const left = labelW + 22, top = labelH + 8;
  const W = left + cols.length * cell + Math.max(labelH * 0.6, opts.markRow ? 90 : 0), H = top + rows.length * cell + 8;
  const svg = el('svg', { class: 'heatmap', width: W, height: H, role: 'img', 'aria-label': opts.title });
  svg.append(el('text', { class: 'axis-title', x: 10, y: top + rows.length * cell / 2, 'text-anchor': 'middle',
    transform: `rotate(-90 10 ${top + rows.length * cell / 2})`, text: opts.yLabel || '' }));
  let canvas = null;
  if (onCanvas) canvas = cellCanvas(values, cell, color, tipOf, left, top);
  else {
    const cellsG = el('g', { class: 'cells' });
    values.forEach((row, r) => row.forEach((v, c) => {
      cellsG.append(el('rect', { class: 'cell', x: left + c * cell, y: top + r * cell, width: cell - 1, height: cell - 1,
        fill: color(v), 'data-tip': tipOf(r, c), 'data-r': r, 'data-c': c }));
    }));
    svg.append(cellsG);
  }
  if (opts.markRow && opts.markRow.index < rows.length) {
    const y = top + opts.markRow.index * cell - 0.5, x2 = left + cols.length * cell;
    svg.append(el('line', { class: 'mark-row', x1: left - 2, x2, y1: y, y2: y, stroke: '#d55e00', 'stroke-width': 1.5, 'stroke-dasharray': '4 3' }));
    svg.append(el('text', { class: 'mark-row-label', x: x2 + 4, y: y + 4, text: opts.markRow.label }));
  }
  rows.forEach((label, r) => r % every === 0 && svg.append(el('text', { class: 'tick', x: left - 4, y: top + r * cell + Math.max(cell, 10) * 0.7,
    'text-anchor': 'end', text: label })));
  cols.forEach((label, c) => {
    if (c % every) return;
    const x = left + c * cell + Math.max(cell, 10) * 0.65, y = top - 4;
    svg.append(el('text', { class: 'tick', x, y, transform: `rotate(-60 ${x} ${y})`, text: label }));
  });
  const fig = figure(opts.title, 'heatmap-fig');
  fig.append(el('div', { class: 'axis-note', text: `x: ${opts.xLabel || ''} · y: ${opts.yLabel || ''}` }));
  fig.append(el('div', { class: 'scroll' }, canvas ? el('div', { class: 'canvas-heatmap', style: `position:relative;width:${W}px;height:${H}px` }, svg, canvas) : svg));
  fig.append(colorLegend(lo, hi, opts.diverging, opts.valueLabel));
  return fig;
}

// The cells of a large heatmap as one canvas at (left, top) over the SVG;
// the pointer's cell is its data-tip (installTips shows it).
function cellCanvas(values, cell, color, tipOf, left, top) {
  const n = values.length, m = values[0] ? values[0].length : 0;
  const c = el('canvas', { class: 'cells', width: m * cell, height: n * cell, 'data-rows': n, 'data-cols': m,
    style: `position:absolute;left:${left}px;top:${top}px` });
  const ctx = c.getContext('2d');
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) {
    ctx.fillStyle = color(values[i][j]);
    ctx.fillRect(j * cell, i * cell, cell - 1, cell - 1);
  }
  c.addEventListener('mousemove', ev => {
    const r = Math.floor(ev.offsetY / cell), col = Math.floor(ev.offsetX / cell);
    if (r >= 0 && r < n && col >= 0 && col < m) c.dataset.tip = tipOf(r, col);
    else delete c.dataset.tip;
  });
  return c;
}

// A small matrix on a canvas (head grid thumbnails): no axes, the grid
// around it carries them.
export function thumbnail(values, size, lo, hi) {
  const n = values.length, m = values[0] ? values[0].length : 0;
  const c = el('canvas', { width: size, height: size, class: 'thumb' });
  const ctx = c.getContext('2d');
  const cw = size / Math.max(m, 1), ch = size / Math.max(n, 1);
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) {
    ctx.fillStyle = seqColor((values[i][j] - lo) / (hi - lo || 1));
    ctx.fillRect(j * cw, i * ch, Math.ceil(cw), Math.ceil(ch));
  }
  return c;
}

// ----------------------------------------------------------------- charts

function axes(svg, box, xs, ys, xLabel, yLabel, xTickLabels) {
  const { l, t, w, h } = box;
  svg.append(el('line', { class: 'axis', x1: l, y1: t + h, x2: l + w, y2: t + h }));
  svg.append(el('line', { class: 'axis', x1: l, y1: t, x2: l, y2: t + h }));
  for (const v of ys.ticks) {
    const y = ys.map(v);
    svg.append(el('line', { class: 'grid', x1: l, x2: l + w, y1: y, y2: y }));
    svg.append(el('text', { class: 'tick', x: l - 4, y: y + 4, 'text-anchor': 'end', text: fmt(v) }));
  }
  (xTickLabels || xs.ticks.map(v => [v, fmt(v)])).forEach(([v, label]) => {
    svg.append(el('text', { class: 'tick', x: xs.map(v), y: t + h + 14, 'text-anchor': 'middle', text: label }));
  });
  svg.append(el('text', { class: 'axis-title', x: l + w / 2, y: t + h + 32, 'text-anchor': 'middle', text: xLabel }));
  svg.append(el('text', { class: 'axis-title', x: 12, y: t + h / 2, 'text-anchor': 'middle',
    transform: `rotate(-90 12 ${t + h / 2})`, text: yLabel }));
}

function scale(lo, hi, a, b) {
  return { ticks: ticks(lo, hi), map: v => a + (v - lo) / (hi - lo || 1) * (b - a) };
}

function legend(items) {
  return el('div', { class: 'legend-row' }, items.map(({ name, color, shape }) =>
    el('span', { class: 'legend-item' }, el('span', { class: `swatch ${shape || ''}`, style: `background:${color}` }), name)));
}

// series: [{name, xs, ys, color, dash?}]; yDomain optional. Each later
// series is drawn narrower (by widthStep px) than the one before, so a series
// that lies on another (equal values) leaves the wider one showing around it.
export function lineChart({ title, xLabel, yLabel, series, yDomain, xTickLabels, width = 520, height = 260, widthStep = 3 }) {
  const box = { l: 56, t: 10, w: width - 72, h: height - 56 };
  const [x0, x1] = extent(series.flatMap(s => s.xs));
  const [y0, y1] = yDomain || extent(series.flatMap(s => s.ys));
  const xs = scale(x0, x1, box.l, box.l + box.w), ys = scale(y0, y1, box.t + box.h, box.t);
  // layers and counts: no ticks between integers
  if (series.every(s => s.xs.every(Number.isInteger))) xs.ticks = xs.ticks.filter(Number.isInteger);
  // scales down to narrow screens (viewBox), never up
  const svg = el('svg', { class: 'chart', viewBox: `0 0 ${width} ${height}`, width, height, style: `width:100%;max-width:${width}px;height:auto`,
    role: 'img', 'aria-label': title });
  axes(svg, box, xs, ys, xLabel, yLabel, xTickLabels && xTickLabels.map((lab, i) => [i, lab]));
  series.forEach((s, k) => {
    const pts = s.xs.map((x, i) => [x, s.ys[i]]).filter(([, y]) => Number.isFinite(y));
    const wide = series.length - 1 - k; // 0 for the last series
    svg.append(el('polyline', { class: 'series', fill: 'none', stroke: s.color, 'stroke-width': 2 + widthStep * wide,
      'stroke-dasharray': s.dash, points: pts.map(([x, y]) => `${xs.map(x)},${ys.map(y)}`).join(' ') }));
    for (const [x, y] of pts) svg.append(el('circle', { cx: xs.map(x), cy: ys.map(y), r: 3.5 + (2 * widthStep / 3) * wide, fill: s.color,
      'data-tip': `${s.name}: ${xLabel} ${xTickLabels ? xTickLabels[x] : fmt(x)} → ${fmt(y)}` }));
  });
  const fig = figure(title, 'chart-fig');
  fig.append(el('div', { class: 'scroll' }, svg), legend(series));
  return fig;
}

// Horizontal bars: labels[i], values[i] (signed values use the diverging colours).
export function barChart({ title, labels, values, xLabel, yLabel, diverging, domain, highlight }) {
  const barH = 20, labelW = Math.min(160, 12 + 7 * Math.max(...labels.map(s => String(s).length), 1));
  const width = labelW + 360, height = 46 + labels.length * barH;
  let [lo, hi] = domain || extent(values.concat([0]));
  if (diverging) { const m = Math.max(Math.abs(lo), Math.abs(hi)); lo = -m; hi = m; }
  const box = { l: labelW, t: 6, w: width - labelW - 80, h: labels.length * barH };
  const xs = scale(lo, hi, box.l, box.l + box.w);
  const svg = el('svg', { class: 'chart bars', viewBox: `0 0 ${width} ${height}`, width, height,
    style: `width:100%;max-width:${width}px;height:auto`, role: 'img', 'aria-label': title });
  svg.append(el('line', { class: 'axis', x1: xs.map(0), x2: xs.map(0), y1: box.t, y2: box.t + box.h }));
  labels.forEach((label, i) => {
    const v = values[i], x0 = xs.map(Math.min(0, v)), x1 = xs.map(Math.max(0, v));
    const fill = diverging ? divColor(v / (hi || 1)) : seqColor(0.25 + 0.6 * (v - lo) / (hi - lo || 1));
    const y = box.t + i * barH;
    svg.append(el('rect', { class: 'bar', x: x0, y: y + 2, width: Math.max(1, x1 - x0), height: barH - 4, fill,
      stroke: highlight === i ? '#000' : 'none', 'data-tip': `${label}: ${fmt(v)}` }));
    svg.append(el('text', { class: 'tick', x: box.l - 6, y: y + barH * 0.7, 'text-anchor': 'end', text: label }));
    svg.append(el('text', { class: 'tick value', x: x1 + 4, y: y + barH * 0.7, text: fmt(v) }));
  });
  for (const v of xs.ticks) svg.append(el('text', { class: 'tick', x: xs.map(v), y: box.t + box.h + 14,
    'text-anchor': 'middle', text: fmt(v) }));
  svg.append(el('text', { class: 'axis-title', x: box.l + box.w / 2, y: box.t + box.h + 32, 'text-anchor': 'middle',
    text: xLabel }));
  const fig = figure(title, 'chart-fig');
  fig.append(el('div', { class: 'axis-note', text: `y: ${yLabel}` }), el('div', { class: 'scroll' }, svg),
    colorLegend(lo, hi, diverging, xLabel));
  return fig;
}

// points: [{x, y, label, group}], groups: [names] coloured in order;
// path: join the points in order (position vectors along the sequence);
// colorBy 'order': coloured by index, the legend reading orderFrom (the
// first point's position, default 0) to orderFrom + points - 1.
export function scatter({ title, xLabel, yLabel, points, groups, path, colorBy, orderFrom = 0, width = 360, height = 320 }) {
  const box = { l: 56, t: 10, w: width - 72, h: height - 56 };
  const xs = scale(...extent(points.map(p => p.x)), box.l, box.l + box.w);
  const ys = scale(...extent(points.map(p => p.y)), box.t + box.h, box.t);
  const svg = el('svg', { class: 'chart scatter', width, height, role: 'img', 'aria-label': title });
  axes(svg, box, xs, ys, xLabel, yLabel);
  if (path) svg.append(el('polyline', { fill: 'none', stroke: '#bbb', points: points.map(p => `${xs.map(p.x)},${ys.map(p.y)}`).join(' ') }));
  points.forEach((p, i) => {
    const fill = colorBy === 'order' ? seqColor(i / Math.max(1, points.length - 1)) : CATEGORICAL[(p.group || 0) % CATEGORICAL.length];
    svg.append(el('circle', { class: 'point', cx: xs.map(p.x), cy: ys.map(p.y), r: 4, fill, stroke: '#333', 'stroke-width': 0.5,
      'data-tip': `${p.label}: (${fmt(p.x)}, ${fmt(p.y)})` }));
  });
  const fig = figure(title, 'chart-fig');
  fig.append(el('div', { class: 'scroll' }, svg));
  if (colorBy === 'order') fig.append(colorLegend(orderFrom, orderFrom + points.length - 1, false, 'position'));
  else fig.append(legend((groups || []).map((name, i) => ({ name, color: CATEGORICAL[i % CATEGORICAL.length] }))));
  return fig;
}

// The attribution tree over the tokens: a column per token, a row per node
// layer (top = layer L, the root). A node's layer is the layer of the edge
// that added it; an edge of layer l joins its parent node to the token it
// adds at layer l. One <line class="edge"> per response edge.
// tokens: the column labels; nodeText(node) -> the text written by each node.
export function tokenTree({ title, tokens, layers, tree, nodeText }) {
  const colW = 64, rowH = 56, left = 70, top = 20;
  const width = left + tokens.length * colW + 10, height = top + layers * rowH + 40;
  const X = t => left + t * colW + colW / 2, Y = l => top + (layers - l) * rowH + rowH / 2;
  const nodeLayer = new Map(tree.nodes.map(n => [n.token, n.layer]));
  const svg = el('svg', { class: 'chart tree', width, height, role: 'img', 'aria-label': title });
  for (let l = 1; l <= layers; l++) svg.append(el('text', { class: 'tick', x: left - 8, y: Y(l) + 4, 'text-anchor': 'end',
    text: `layer ${l}` }));
  tokens.forEach((t, i) => {
    svg.append(el('line', { class: 'grid', x1: X(i), x2: X(i), y1: Y(layers), y2: Y(1) }));
    svg.append(el('text', { class: 'tick', x: X(i), y: Y(1) + 30, 'text-anchor': 'middle', text: t }));
  });
  const maxScore = Math.max(...tree.edges.map(e => Math.abs(e.score || 0)), 1e-12);
  for (const e of tree.edges) {
    const w = Math.abs(e.score || 0) / maxScore;
    svg.append(el('line', { class: 'edge', x1: X(e.from), y1: Y(nodeLayer.get(e.from) ?? layers), x2: X(e.to), y2: Y(e.layer),
      stroke: seqColor(0.2 + 0.6 * w), 'stroke-width': 1.5 + 4 * w,
      'data-tip': `layer ${e.layer}: ${tokens[e.from]} → ${tokens[e.to]}: ${fmt(e.score)}` }));
  }
  for (const n of tree.nodes) {
    svg.append(el('circle', { class: 'node', cx: X(n.token), cy: Y(n.layer), r: 7,
      fill: n.token === tree.root ? '#d55e00' : '#0072b2', stroke: '#fff',
      'data-tip': `${tokens[n.token]} (node at layer ${n.layer})` }));
    svg.append(el('text', { class: 'node-text', x: X(n.token), y: Y(n.layer) - 11, 'text-anchor': 'middle', 'data-token': n.token,
      text: nodeText(n) }));
  }
  const fig = figure(title, 'chart-fig');
  fig.append(el('div', { class: 'scroll' }, svg),
    legend([{ name: 'root', color: '#d55e00' }, { name: 'token in the tree', color: '#0072b2' },
      { name: `edge: normalised attribution > ${fmt(tree.threshold)} (width, colour = score)`, color: seqColor(0.6) }]));
  return fig;
}
