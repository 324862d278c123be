// test.mjs - the dashboard in Debian's headless chromium (puppeteer-core,
// no browser download) against live lensd servers on the demo models.
//
// Environment (set by tests/web/run.sh): LENSD_URL (plain server), KEY_URL and
// API_KEY (a server with --api-key-file), GATEWAY_URL (nginx with a path
// prefix in front of LENSD_URL), CHROMIUM, SHOTS (screenshot folder).
//
// Per view: zero console errors, and what it draws matches the API: token
// chips = /v1/tokenize's tokens, top-k list = top-k of /v1/forward's logits
// (and its top_k output when the server has it), head cells = layers x heads,
// heatmap cells = T x T, tree edges = the response's edges, spirals = layers,
// pruning curve points = the job result's fractions. Closes with
// "test_web: N passed, N failed, N skipped" like the C tests.
import puppeteer from 'puppeteer-core';
import { mkdirSync } from 'node:fs';

const { LENSD_URL, KEY_URL, API_KEY, GATEWAY_URL, CHROMIUM = '/usr/bin/chromium', SHOTS = 'build/web-shots' } = process.env;
let passed = 0, failed = 0, skipped = 0;
const shots = [];
function check(cond, what) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL ${what}`); }
}
function skip(what) { skipped++; console.log(`SKIP: ${what}`); }

async function post(base, path, body, key) {
  const headers = { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) };
  const res = await fetch(new URL(path, base), { method: 'POST', headers, body: JSON.stringify(body) });
  if (!res.ok) throw new Error(`${path}: ${res.status} ${await res.text()}`);
  return res.json();
}
async function get(base, path) { return (await fetch(new URL(path, base))).json(); }

function topIds(logits, k) {
  return logits.map((v, id) => ({ v, id })).sort((a, b) => b.v - a.v).slice(0, k).map(t => t.id);
}

const VIEWPORTS = [{ width: 1280, height: 800 }, { width: 390, height: 844, isMobile: true, hasTouch: true }];

const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
});
mkdirSync(SHOTS, { recursive: true });

// A page that records console errors, page errors and failed requests.
async function openPage(viewport, allowed = []) {
  const page = await browser.newPage();
  await page.setViewport(viewport);
  page.errors = [];
  page.on('console', msg => {
    if (msg.type() === 'error' && !allowed.some(re => re.test(msg.text()))) page.errors.push(`console: ${msg.text()}`);
  });
  page.on('pageerror', err => page.errors.push(`pageerror: ${err.message}`));
  page.on('requestfailed', req => page.errors.push(`requestfailed: ${req.url()} ${req.failure() && req.failure().errorText}`));
  return page;
}

async function waitReady(page, view) {
  await page.waitForSelector(`section.view[data-view="${view}"][data-ready="1"]`, { timeout: 60000 });
}

async function gotoView(page, base, model, view) {
  await page.goto(new URL(`?model=${model}#/${view}`, base).href, { waitUntil: 'domcontentloaded' });
  await waitReady(page, view);
  const err = await page.$$eval('section.view .error', els => els.map(e => e.textContent));
  check(err.length === 0, `${view}/${model}: no error box (${err.join('; ')})`);
  // plots and tables scroll inside their panels; the page itself never scrolls sideways
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `${view}/${model}: no page-wide horizontal scroll at ${page.viewport().width}px (${overflow}px)`);
}

async function shot(page, name) {
  const vp = page.viewport();
  const file = `${SHOTS}/${name}-${vp.width}x${vp.height}.png`;
  await page.screenshot({ path: file, fullPage: true });
  shots.push(file);
}

// One element (a panel) as its own screenshot, readable at full size.
async function shotOf(page, handle, name) {
  const vp = page.viewport();
  const file = `${SHOTS}/${name}-${vp.width}x${vp.height}.png`;
  await handle.screenshot({ path: file });
  shots.push(file);
}

function noErrors(page, what) {
  check(page.errors.length === 0, `${what}: zero console errors (${page.errors.join(' | ')})`);
  page.errors.length = 0;
}

// ------------------------------------------------------------------ views

const TEXT = 'a charming and often affecting journey .';
const models = (await get(LENSD_URL, 'v1/models')).models;
const modelInfo = id => models.find(m => m.id === id);
const modern = models.some(m => Array.isArray(m.analyses));
// top_k and logit_lens on /v1/forward (the served spec says so)
const specRes = modern ? await fetch(new URL('openapi.yaml', LENSD_URL)) : null;
const specText = specRes && specRes.ok ? await specRes.text() : '';
const predictionsApi = specText.includes('logit_lens:');
const eventsApi = specText.includes('/v1/jobs/{id}/events');
const DEMOS = ['demo-sst2', 'demo-mlm', 'demo-gpt2', 'demo-identifiable'];
check(DEMOS.every(modelInfo) && modelInfo('demo-moe') && models.length === 5, `the four demo models and demo-moe served (${models.map(m => m.id)})`);

async function textView(page, base) {
  await gotoView(page, base, 'demo-sst2', 'text');
  const tok = await post(LENSD_URL, 'v1/tokenize', { model: 'demo-sst2', text: TEXT });
  const chips = await page.$$eval('.tokens .chip', els => els.map(e => e.dataset.token));
  check(chips.length === tok.tokens.length && chips.length > 0, `token chips ${chips.length} = tokenize ${tok.tokens.length}`);
  const spans = await page.$$eval('.tok-span', els => els.map(e => e.textContent));
  const want = tok.tokens.filter(t => t.start !== null).map(t => TEXT.slice(t.start, t.end));
  check(JSON.stringify(spans) === JSON.stringify(want), `highlighted spans follow the offsets (${spans.length})`);
  const bars = await page.$$eval('svg.bars rect.bar', els => els.length);
  check(bars === modelInfo('demo-sst2').labels.length, `one probability bar per label (${bars})`);
  await shot(page, 'text-demo-sst2');
  // a text pair: its tokens are segment 1 and are marked in the second paragraph
  const pair = 'the second segment';
  await page.type('input[name=text_pair]', pair);
  await page.click('form.input-form button[type=submit]');
  await page.waitForFunction(() => document.querySelectorAll('.source-text').length === 2, { timeout: 20000 });
  const tp = await post(LENSD_URL, 'v1/tokenize', { model: 'demo-sst2', text: TEXT, text_pair: pair });
  const second = await page.$$eval('.source-text', els => [...els[1].querySelectorAll('.tok-span')].map(e => e.textContent));
  const wantSecond = tp.tokens.filter(t => t.segment === 1 && t.start !== null).map(t => pair.slice(t.start, t.end));
  check(second.length > 0 && JSON.stringify(second) === JSON.stringify(wantSecond), `pair tokens marked in the second text (${second})`);
  await page.$eval('input[name=text_pair]', e => { e.value = ''; });
  noErrors(page, 'text/demo-sst2');

  for (const model of ['demo-gpt2', 'demo-mlm']) {
    await gotoView(page, base, model, 'text');
    const text = await page.$eval('textarea[name=text]', e => e.value);
    const hasPair = (await page.$('input[name=text_pair]')) !== null;
    check(hasPair === (modelInfo(model).pairs === true), `${model}: pair field shown exactly when /v1/models says pairs (${hasPair})`);
    const t = await post(LENSD_URL, 'v1/tokenize', { model, text });
    const positions = model === 'demo-gpt2' ? [t.tokens.length - 1] : t.tokens.flatMap((x, i) => (x.text === '[MASK]' ? [i] : []));
    check(positions.length > 0, `${model}: positions to predict at`);
    const fwd = await post(LENSD_URL, 'v1/forward', { model, text, outputs: ['logits'], positions });
    const rows = Array.isArray(fwd.logits[0]) ? fwd.logits : [fwd.logits];
    for (const [p, pos] of positions.entries()) {
      const drawn = await page.$$eval(`ol.topk[data-position="${pos}"] li`, els => els.map(e => Number(e.dataset.id)));
      const want = topIds(rows[p], 10);
      check(drawn.length === 10 && JSON.stringify(drawn) === JSON.stringify(want),
        `${model} top-10 at ${pos} = /v1/forward logits' (${drawn} vs ${want})`);
      const probs = await page.$$eval(`ol.topk[data-position="${pos}"] li`, els => els.map(e => Number(e.dataset.prob)));
      check(probs.every((v, i) => i === 0 || v <= probs[i - 1] + 1e-9) && probs[0] > 0 && probs[0] <= 1, `${model} probabilities sorted in (0, 1]`);
    }
    if (predictionsApi) {
      const pred = await post(LENSD_URL, 'v1/forward', { model, text, outputs: ['top_k'], k: 10, positions, logit_lens: true });
      for (const entry of pred.top_k) {
        const drawn = await page.$$eval(`ol.topk[data-position="${entry.position}"] li`, els => els.map(e => Number(e.dataset.id)));
        check(JSON.stringify(drawn) === JSON.stringify(entry.predictions.map(p => p.id)), `${model} top-10 at ${entry.position} = /v1/forward top_k`);
      }
      const lens = pred.logit_lens[pred.logit_lens.length - 1];
      const rows = await page.$$eval('table.lens', (tables, n) => {
        const t = tables[n];
        return t ? [...t.querySelectorAll('tbody tr')].map(r => [...r.querySelectorAll('td')].map(td => Number(td.dataset.id))) : [];
      }, pred.logit_lens.length - 1);
      check(rows.length === lens.layers.length && rows.length > 0, `${model} logit lens: one row per layer (${rows.length} vs ${lens.layers.length})`);
      check(JSON.stringify(rows) === JSON.stringify(lens.layers.map(l => l.predictions.map(p => p.id))), `${model} logit lens cells = the response's ids`);
    } else {
      skip(`${model} top_k and logit lens: this server's spec has no logit_lens`);
    }
    await shot(page, `text-${model}`);
    noErrors(page, `text/${model}`);
  }
}

async function attentionView(page, base) {
  const model = 'demo-identifiable', m = modelInfo(model);
  await gotoView(page, base, model, 'attention');
  const cells = await page.$$eval('.head-cell', els => els.map(e => `${e.dataset.layer}:${e.dataset.head}`));
  check(cells.length === m.num_layers * m.num_heads, `head cells ${cells.length} = layers x heads ${m.num_layers * m.num_heads}`);
  check(new Set(cells).size === cells.length, 'head cells are distinct (layer, head) pairs');
  const tok = await post(LENSD_URL, 'v1/tokenize', { model, text: TEXT });
  const T = tok.tokens.length;
  const maps = await page.$$eval('.focus svg.heatmap', els => els.map(s => s.querySelectorAll('rect.cell').length));
  check(maps.length === 3 && maps.every(n => n === T * T), `focused head: raw, effective, difference of T x T = ${T * T} cells (${maps})`);
  const last = cells[cells.length - 1];
  await page.click(`.head-cell[data-layer="${last.split(':')[0]}"][data-head="${last.split(':')[1]}"]`);
  const caption = await page.$eval('.focus figcaption', e => e.textContent);
  check(caption.includes(`layer ${last.split(':')[0]} head ${last.split(':')[1]}`), `clicking a head focuses it (${caption})`);
  const att = await post(LENSD_URL, 'v1/attention', { model, text: TEXT });
  const rank = await page.$eval('.focus table.stats tr:nth-child(2) td', e => Number(e.textContent));
  const lastHead = att.layers[att.layers.length - 1].heads[att.layers[0].heads.length - 1];
  check(rank === lastHead.rank, `focused head's rank = the response's (${rank} vs ${lastHead.rank})`);
  // colours encode the response: every raw cell's fill = viridis(weight), and the scales' fixed points
  const fills = await page.evaluate(async () => {
    const plot = await import(new URL('web/js/plot.js', document.baseURI).href);
    const cells = [...document.querySelectorAll('.focus svg.heatmap')][0].querySelectorAll('rect.cell');
    return { cells: [...cells].map(c => [Number(c.dataset.r), Number(c.dataset.c), c.getAttribute('fill')]),
      fixed: [plot.seqColor(0), plot.seqColor(1), plot.divColor(0), plot.divColor(-1), plot.divColor(1)] };
  });
  check(JSON.stringify(fills.fixed) === JSON.stringify(['rgb(68,1,84)', 'rgb(253,231,37)', 'rgb(247,247,247)', 'rgb(103,0,31)', 'rgb(5,48,97)']),
    `colour scales: viridis ends, diverging white at 0, red below, blue above (${fills.fixed})`);
  const wantFill = await page.evaluate(async (raw, eff) => {
    const plot = await import(new URL('web/js/plot.js', document.baseURI).href);
    const m = Math.max(...raw.flat().concat(eff.flat()).map(Math.abs));
    return raw.map(row => row.map(v => plot.divColor(v / m)));
  }, lastHead.raw, lastHead.effective);
  check(fills.cells.length > 0 && fills.cells.every(([r, c, f]) => f === wantFill[r][c]),
    'focused raw heatmap: each cell coloured by the response weight on the shared ±max scale');
  const table = await page.$$eval('table.heads tr[data-layer]', els => els.map(r => [...r.children].map(td => td.textContent)));
  const wantRows = att.layers.flatMap(l => l.heads.map(h => [String(l.layer), String(h.head), String(h.rank), String(h.null_dim)]));
  check(table.length === m.num_layers * m.num_heads && JSON.stringify(table.map(r => r.slice(0, 4))) === JSON.stringify(wantRows),
    `every-head table: layer, head, rank, null dim of all ${wantRows.length} heads = the response's`);
  const points = await page.$$eval('svg.scatter circle.point', els => els.length);
  check(points === 2 * m.num_layers * m.num_heads, `mass plot: 2 points per head (${points})`);
  // hovering a cell shows the token pair and the value
  const hovered = await page.$('.focus svg.heatmap rect.cell[data-r="1"][data-c="2"]');
  await hovered.evaluate(e => e.scrollIntoView({ block: 'center', inline: 'center' }));
  const box = await hovered.boundingBox();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
  const tip = await page.$eval('.tooltip', e => e.textContent);
  const want = `raw 1 ${tok.tokens[1].text} → 2 ${tok.tokens[2].text}`;
  check(tip.startsWith(want), `tooltip names the token pair and value ("${tip}")`);
  await shot(page, 'attention-demo-identifiable');
  noErrors(page, 'attention');
}

async function attributionView(page, base) {
  const model = 'demo-sst2', m = modelInfo(model);
  await gotoView(page, base, model, 'attribution');
  const resp = await post(LENSD_URL, 'v1/attribution', { model, text: TEXT, tree: true });
  const T = resp.tokens.length;
  const maps = await page.$$eval('.maps svg.heatmap', els => els.map(s => s.querySelectorAll('rect.cell').length));
  check(maps.length === m.num_layers && maps.every(n => n === T * T), `one T x T heatmap per layer (${maps})`);
  const edges = await page.$$eval('svg.tree line.edge', els => els.map(e => e.dataset.tip));
  check(edges.length === resp.tree.edges.length && edges.length > 0, `tree edges drawn ${edges.length} = response ${resp.tree.edges.length}`);
  const nodes = await page.$$eval('svg.tree circle.node', els => els.length);
  check(nodes === resp.tree.nodes.length, `tree nodes drawn ${nodes} = response ${resp.tree.nodes.length}`);
  const bars = await page.$$eval('svg.bars rect.bar', els => els.length);
  check(bars === m.num_layers * m.num_heads, `head importance: one bar per head (${bars})`);
  await shot(page, 'attribution-demo-sst2');
  noErrors(page, 'attribution');

  // GPT-2: next-token target, no tree
  await gotoView(page, base, 'demo-gpt2', 'attribution');
  const g = modelInfo('demo-gpt2');
  const gmaps = await page.$$eval('.maps svg.heatmap', els => els.length);
  check(gmaps === g.num_layers, `demo-gpt2: one heatmap per layer (${gmaps})`);
  check(await page.$$eval('svg.tree', els => els.length) === 0, 'demo-gpt2: no tree drawn');
  await shot(page, 'attribution-demo-gpt2');
  noErrors(page, 'attribution/demo-gpt2');
}

// Issue 35 item 1: raw, effective and difference on one scale, the length
// bound shown, and the long example (d_v + 16 = 48 tokens on demo-gpt2)
// where effective attention differs from row d_v on.
async function attentionLong(page, base) {
  const model = 'demo-gpt2', m = modelInfo(model), dv = m.head_dim_value;
  await gotoView(page, base, model, 'attention');
  const shortBound = await page.$eval('.bound', e => ({ t: Number(e.dataset.t), text: e.textContent }));
  check(shortBound.t <= dv && shortBound.text.includes(`≤ d_v = ${dv}`) && shortBound.text.includes('equals raw'),
    `short text: the view says T = ${shortBound.t} ≤ d_v = ${dv}, effective = raw ("${shortBound.text.slice(0, 120)}")`);
  const [answer] = await Promise.all([
    page.waitForResponse(r => r.url().endsWith('v1/attention') && r.request().method() === 'POST', { timeout: 60000 }),
    page.click('button.long-example')]);
  const resp = await answer.json();
  await page.waitForFunction(n => document.querySelector(`.bound[data-t="${n}"]`), { timeout: 30000 }, dv + 16);
  const T = resp.tokens.length;
  check(T === dv + 16 && T === 48, `long example: ${T} tokens = d_v ${dv} + 16 (48 on demo-gpt2)`);
  const bound = await page.$eval('.bound', e => e.textContent);
  check(bound.includes(`T = ${T} tokens > d_v = ${dv}`) && bound.includes(`rows ${dv} onward`), `the bound is shown: "${bound.slice(0, 160)}"`);
  const h = resp.layers[0].heads[0];
  const drawn = await page.evaluate(() => [...document.querySelectorAll('.focus svg.heatmap')].map(svg => ({
    fills: [...svg.querySelectorAll('rect.cell')].map(c => [Number(c.dataset.r), Number(c.dataset.c), c.getAttribute('fill')]),
    legend: [...svg.closest('figure').querySelectorAll('svg.legend text')].map(t => t.textContent) })));
  check(drawn.length === 3 && drawn.every(d => d.fills.length === T * T), `three T x T panels (${drawn.map(d => d.fills.length)})`);
  const legends = drawn.map(d => JSON.stringify(d.legend.slice(1)));
  check(legends[0] === legends[1] && legends[1] === legends[2], `one colour scale: the three legends read the same range (${legends})`);
  const at = (d, r, c) => d.fills[r * T + c][2];
  let equalPairs = 0, equalSame = true;
  for (let r = 0; r < T; r++) for (let c = 0; c < T; c++) {
    if (h.raw[r][c] === h.effective[r][c]) { equalPairs++; if (at(drawn[0], r, c) !== at(drawn[1], r, c)) equalSame = false; }
  }
  check(equalPairs > 0 && equalSame, `equal raw and effective values have equal colours (${equalPairs} equal cells)`);
  const white = 'rgb(247,247,247)';
  const offWhite = rows => drawn[2].fills.filter(([r, , f]) => rows(r) && f !== white).length;
  const above = offWhite(r => r < dv), below = offWhite(r => r >= dv);
  const maxDiffBelow = Math.max(...h.effective.slice(dv).flatMap((row, i) => row.map((v, j) => Math.abs(v - h.raw[dv + i][j]))));
  check(above === 0, `difference panel white in rows 0..${dv - 1}, where T ≤ d_v for each causal row (${above} coloured cells)`);
  check(below > 0 && maxDiffBelow > 0.01, `difference non-zero from row ${dv} on (${below} coloured cells, max |eff − raw| ${maxDiffBelow.toFixed(3)})`);
  const marks = await page.$$eval('.focus svg.heatmap text.mark-row-label', els => els.map(e => e.textContent));
  check(marks.length === 3 && marks.every(t => t === `row ${dv} = d_v`), `row d_v marked on the three panels (${marks})`);
  await shot(page, 'attention-demo-gpt2-48-tokens');
  const focusPanel = await page.evaluateHandle(() => document.querySelector('.focus').closest('section.panel'));
  await shotOf(page, focusPanel, 'attention-demo-gpt2-48-tokens-focused-head');
  noErrors(page, 'attention long example');
}

// Issue 35 item 7: above CANVAS_CELLS a heatmap draws its cells on one
// canvas and keeps hover; the build times of both drawings are printed.
async function canvasHeatmap(page, base) {
  await gotoView(page, base, 'demo-sst2', 'text');
  const r = await page.evaluate(async () => {
    const plot = await import(new URL('web/js/plot.js', document.baseURI).href);
    const make = T => Array.from({ length: T }, (_, i) => Array.from({ length: T }, (_, j) => ((i * 7 + j * 13) % 100) / 100));
    // build + first layout of one heatmap, drawn as the view chooses or forced (canvas true / false)
    const time = (T, canvas) => {
      const labels = Array.from({ length: T }, (_, i) => `t${i}`);
      const box = document.createElement('div');
      document.body.append(box);
      const t0 = performance.now();
      const fig = plot.heatmap({ title: 'probe', rows: labels, cols: labels, values: make(T), domain: [0, 1], canvas, cell: 6 });
      box.append(fig);
      box.getBoundingClientRect();
      const ms = performance.now() - t0;
      const kind = fig.querySelector('canvas.cells') ? 'canvas' : 'svg';
      box.remove();
      return { T, kind, ms: Math.round(ms) };
    };
    const chosen = [64, 128, 256, 512].map(T => time(T, undefined));
    const runs = chosen.concat([128, 256].map(T => time(T, false)), [64].map(T => time(T, true)));
    // hover on the canvas names the cell
    const labels = Array.from({ length: 130 }, (_, i) => `t${i}`);
    const fig = plot.heatmap({ title: 'hover', rows: labels, cols: labels, values: make(130), domain: [0, 1] });
    document.body.append(fig);
    const canvas = fig.querySelector('canvas.cells');
    const rect = canvas.getBoundingClientRect();
    canvas.dispatchEvent(new MouseEvent('mousemove', { clientX: rect.left + 6 * 5 + 3, clientY: rect.top + 6 * 7 + 3, bubbles: true }));
    const tip = canvas.dataset.tip;
    const rects = fig.querySelectorAll('rect.cell').length;
    fig.remove();
    return { runs, chosen, tip, rects, canvasCells: plot.CANVAS_CELLS };
  });
  console.log(`heatmap build + layout: ${r.runs.map(x => `T=${x.T} ${x.kind} ${x.ms} ms`).join(', ')}`);
  check(r.chosen[0].kind === 'svg' && r.chosen.slice(1).every(x => x.kind === 'canvas'), `SVG up to ${r.canvasCells} cells, canvas above (${r.chosen.map(x => x.kind)})`);
  check(r.rects === 0 && r.tip === 't7 → t5: 0.14', `a 130 x 130 heatmap has no <rect> cells and hover names the cell ("${r.tip}")`);
}

// Issue 35 item 3: what a reader sees on GPT-2 and in the charts.
async function readableLabels(page, base) {
  await gotoView(page, base, 'demo-gpt2', 'attribution');
  const heading = await page.$$eval('section.panel h2', els => els.map(e => e.textContent).find(t => t.startsWith('Attribution scores')));
  const text = await page.$eval('textarea[name=text]', e => e.value);
  const resp = await post(LENSD_URL, 'v1/attribution', { model: 'demo-gpt2', text });
  const readable = await page.evaluate(async s => (await import(new URL('web/js/views/common.js', document.baseURI).href)).pieceText(s), resp.target.label);
  check(!/[\u0100-\u0143]/.test(heading) && heading.includes(`target: ${readable},`),
    `GPT-2 target readable: "${heading}" (piece ${JSON.stringify(resp.target.label)})`);
  await gotoView(page, base, 'demo-gpt2', 'text');
  const pieces = await page.$$eval('ol.topk li .piece, table.lens .piece, .tokens .chip', els => els.map(e => e.textContent));
  check(pieces.length > 0 && pieces.every(p => !/[\u0100-\u0143]/.test(p)), `GPT-2 chips, top-10 and logit lens show no byte-level marks (${pieces.slice(0, 6)})`);
  const bars = await page.$$eval('ol.topk', ls => ls.map(l => [...l.querySelectorAll('.bar')].map(b => b.getBoundingClientRect().width / l.getBoundingClientRect().width)));
  check(bars.length > 0 && bars.every(b => b[0] > 0.95), `the top bar of each top-10 list fills its row (${bars.map(b => b[0].toFixed(2))})`);
  const lensCells = await page.$$eval('table.lens td', tds => tds.map(td => td.querySelector('.p') && td.querySelector('.p').textContent));
  check(lensCells.length > 0 && lensCells.every(t => t && Number(t) > 0 && Number(t) <= 1), `logit-lens cells print their probability (${lensCells.slice(0, 4)})`);

  await gotoView(page, base, 'demo-sst2', 'attribution');
  const tr = await post(LENSD_URL, 'v1/attribution', { model: 'demo-sst2', text: TEXT, tree: true });
  const treeHead = await page.$$eval('section.panel h2', els => els.map(e => e.textContent).find(t => t.startsWith('Attribution tree')));
  const n = tr.tree.edges.length;
  check(treeHead.startsWith(`Attribution tree (${n} edge${n === 1 ? '' : 's'},`), `tree heading counts "${treeHead}"`);
  const nodeTexts = await page.$$eval('svg.tree text.node-text', els => els.map(e => e.textContent));
  check(JSON.stringify(nodeTexts) === JSON.stringify(tr.tree.nodes.map(x => x.text)) && nodeTexts.length === tr.tree.nodes.length,
    `tree nodes written with the response's node texts (${nodeTexts})`);

  await gotoView(page, base, 'demo-gpt2', 'decomposition');
  const [answer] = await Promise.all([
    page.waitForResponse(r => r.url().endsWith('v1/decomposition') && r.request().method() === 'POST', { timeout: 60000 }),
    page.click('form.input-form button[type=submit]')]);
  const d = await answer.json();
  await page.waitForFunction(() => document.querySelectorAll('.spirals figure').length > 0, { timeout: 20000 });
  const legend = await page.$eval('.spirals figure svg.legend', s => [...s.querySelectorAll('text')].slice(1).map(t => t.textContent));
  const tips = await page.$$eval('.spirals figure:first-child circle.point', els => els.map(e => e.dataset.tip.split(':')[0]));
  check(JSON.stringify(legend) === JSON.stringify([String(d.first_position), String(d.first_position + d.positions - 1)]) &&
    tips[0] === `position ${d.first_position}` && tips[tips.length - 1] === `position ${d.first_position + d.positions - 1}`,
    `position legend ${legend} = the plotted positions ${tips[0]} … ${tips[tips.length - 1]}`);

  await gotoView(page, base, 'demo-gpt2', 'identity');
  const series = await page.$$eval('figure.chart-fig', figs => {
    const f = figs.find(x => x.querySelector('figcaption').textContent.startsWith('Identification rate'));
    return [...f.querySelectorAll('polyline.series')].map(p => ({ w: Number(p.getAttribute('stroke-width')), dash: p.getAttribute('stroke-dasharray'),
      pts: p.getAttribute('points'), color: p.getAttribute('stroke') }));
  });
  check(series.length === 2 && series[0].w > series[1].w + 2 && series[1].dash && series[0].color !== series[1].color,
    `both rate series visible when equal: "all tokens" ${series[0] && series[0].w}px under dashed "excluding special" ${series[1] && series[1].w}px (same points: ${series.length === 2 && series[0].pts === series[1].pts})`);
  await shot(page, 'identity-demo-gpt2');
  noErrors(page, 'readable labels');
}

// A 60-token text: cells keep their size and the heatmap scrolls in its box.
async function longSequence(page, base) {
  await gotoView(page, base, 'demo-sst2', 'identity');
  const long = Array.from({ length: 6 }, () => 'a charming and often affecting journey , funny').join(' ');
  await page.$eval('textarea[name=text]', (e, v) => { e.value = v; }, long);
  await page.click('form.input-form button[type=submit]');
  await page.waitForFunction(() => document.querySelectorAll('.contrib rect.cell').length > 2000, { timeout: 60000 });
  const T = (await post(LENSD_URL, 'v1/tokenize', { model: 'demo-sst2', text: long })).tokens.length;
  const info = await page.$eval('.contrib', box => {
    const cell = box.querySelector('rect.cell'), scroller = box.querySelector('.scroll');
    return { n: box.querySelectorAll('rect.cell').length, w: Number(cell.getAttribute('width')), sw: scroller.scrollWidth, cw: scroller.clientWidth,
      svgW: Number(box.querySelector('svg.heatmap').getAttribute('width')) };
  });
  check(info.n === T * T && T >= 50, `long text: ${T} tokens, ${info.n} cells`);
  check(info.w >= 17, `cells keep their size (${info.w}px)`);
  check(info.sw >= info.svgW && (info.svgW <= info.cw || info.sw > info.cw), `the whole heatmap is reachable: box scrolls when narrower (svg ${info.svgW}, box ${info.cw}, scroll ${info.sw})`);
  if (page.viewport().width < 600) check(info.sw > info.cw, `on a phone the heatmap scrolls inside its box (${info.sw} > ${info.cw})`);
  await shot(page, 'identity-long-text');
  noErrors(page, 'long sequence');
}

async function identityView(page, base) {
  const model = 'demo-sst2', m = modelInfo(model);
  await gotoView(page, base, model, 'identity');
  const T = (await post(LENSD_URL, 'v1/tokenize', { model, text: TEXT })).tokens.length;
  const ti = await post(LENSD_URL, 'v1/token-identity', { model, text: TEXT });
  const rankCells = await page.$$eval('svg.heatmap', els => els[0].querySelectorAll('rect.cell').length);
  check(rankCells === T * ti.layers.length, `rank map T x (L+1) = ${T * ti.layers.length} (${rankCells})`);
  const ratePoints = await page.$$eval('svg.chart:not(.bars) circle', els => els.length);
  check(ratePoints === 2 * ti.layers.length, `rate chart: 2 series x ${ti.layers.length} layers (${ratePoints})`);
  const contrib = () => page.$eval('.contrib figcaption', e => e.textContent);
  check((await contrib()).includes(`layer ${m.num_layers}`), 'contribution heatmap starts at the last layer');
  await page.$eval('input[name=layer]', e => { e.value = '0'; e.dispatchEvent(new Event('input')); });
  check((await contrib()).includes('layer 1'), 'the slider moves the heatmap to layer 1');
  const cells = await page.$$eval('.contrib rect.cell', els => els.length);
  check(cells === T * T, `contribution heatmap T x T (${cells})`);
  await shot(page, 'identity-demo-sst2');
  noErrors(page, 'identity');
}

async function decompositionView(page, base) {
  const model = 'demo-gpt2';
  await gotoView(page, base, model, 'decomposition');
  const spirals = await page.$$eval('.spirals svg.scatter', els => els.map(s => s.querySelectorAll('circle.point').length));
  const L = modelInfo(model).num_layers;
  check(spirals.length === L + 1, `one position plot per hidden layer 0..L (${spirals.length})`);
  check(spirals.every(n => n === 15), `each with the 15 kept positions of a 16-token window (${spirals})`);
  const topics = await page.$$eval('figcaption', els => els.some(e => e.textContent.startsWith('Cosine similarity of context means')));
  check(topics, 'topic similarity chart drawn');
  // the context means scatter against the response itself: Run again and take the answer the page drew
  const [answer] = await Promise.all([
    page.waitForResponse(r => r.url().endsWith('v1/decomposition') && r.request().method() === 'POST', { timeout: 60000 }),
    page.click('form.input-form button[type=submit]')]);
  const r = await answer.json();
  await page.waitForFunction(() => document.querySelectorAll('.ctx-means svg.scatter').length > 0, { timeout: 10000 });
  const ctx = await page.$$eval('.ctx-means figure', figs => figs.map(f => ({
    points: f.querySelectorAll('svg.scatter circle.point').length,
    legend: [...f.querySelectorAll('.legend-item')].map(e => e.textContent),
    axes: [...f.querySelectorAll('svg.scatter text.axis-title')].map(e => e.textContent),
    tips: [...f.querySelectorAll('svg.scatter circle.point')].map(e => e.dataset.tip) })));
  check(Array.isArray(r.labels) && r.labels.length === 2 && r.layers.every(l => l.ctx_pca && l.ctx_pca.coords.length === r.windows),
    `the response has 2 labels and ctx_pca for every layer's ${r.windows} windows`);
  check(ctx.length === r.layers.length, `one context-means scatter per layer (${ctx.length} of ${r.layers.length})`);
  check(ctx.every(c => c.points === r.windows), `each draws the response's ${r.windows} windows (${ctx.map(c => c.points)})`);
  check(ctx.every(c => JSON.stringify(c.legend) === JSON.stringify(r.labels)), `legend = the response's labels ${JSON.stringify(r.labels)} (${JSON.stringify(ctx[0] && ctx[0].legend)})`);
  const pct = v => `${Math.round(1000 * v) / 10}%`;
  check(ctx.every((c, i) => c.axes[0] === `PC1 (${pct(r.layers[i].ctx_pca.variance_share[0])} of context variance)` &&
    c.axes[1] === `PC2 (${pct(r.layers[i].ctx_pca.variance_share[1])})`), `axes carry the variance shares (${ctx[0] && ctx[0].axes})`);
  const p0 = r.layers[0].ctx_pca;
  check(ctx[0].tips.every((t, i) => t.startsWith(`window ${p0.window[i]} · ${r.labels[p0.label[i]]}:`)),
    `hover names each point's window and topic (${ctx[0].tips[0]})`);
  await shot(page, 'decomposition-demo-gpt2');
  noErrors(page, 'decomposition');
}

// Starts a job of kind from the jobs view; returns its id. Jobs of earlier
// runs are listed too: this follows the row of the new job.
async function startJob(page, kind) {
  const before = await page.$$eval('table.jobs tbody tr', els => els.map(e => e.dataset.job));
  await page.select('select[name=kind]', kind);
  await page.click('form.input-form button[type=submit]');
  await page.waitForFunction(b => [...document.querySelectorAll('table.jobs tbody tr')].some(e => !b.includes(e.dataset.job)), { timeout: 10000 }, before);
  return page.$$eval('table.jobs tbody tr', (els, b) => els.find(e => !b.includes(e.dataset.job)).dataset.job, before);
}

async function jobsView(page, base) {
  await gotoView(page, base, 'demo-sst2', 'jobs');
  const options = await page.$$eval('select[name=data] option', els => els.map(e => e.value).filter(Boolean));
  if (modern) {
    const caps = await get(LENSD_URL, 'v1/capabilities');
    const tsv = caps.data_files.filter(f => f.path.endsWith('.tsv')).map(f => f.path);
    if (!caps.data_dir) skip('dataset picker: the server has no --data-dir (../shared absent)');
    else check(tsv.length > 0 && JSON.stringify(options) === JSON.stringify(tsv), `dataset picker lists the data dir's TSV files (${options})`);
  } else check(options.length === 0, 'no dataset picker without /v1/capabilities');
  const id = await startJob(page, 'head-importance');
  await page.waitForFunction(() => [...document.querySelectorAll('figcaption')].some(f => f.textContent.startsWith('Accuracy as heads are pruned')), { timeout: 60000 });
  const job = await get(LENSD_URL, `v1/jobs/${id}`);
  check(job.state === 'done', `job ${id} done`);
  const progress = await page.$eval(`tr[data-job="${id}"] progress`, e => e.value);
  check(progress === 1, `progress bar full (${progress})`);
  const row = await page.$eval(`tr[data-job="${id}"]`, tr => ({ pct: tr.querySelector('.pct').textContent,
    created: tr.querySelector('.created').dataset.time, finished: tr.querySelector('.finished').dataset.time,
    shown: [tr.querySelector('.created').textContent, tr.querySelector('.finished').textContent] }));
  check(row.pct === '100%' && row.created === job.created && row.finished === job.finished && row.shown.every(t => t.length > 0),
    `jobs table: numeric progress and created / finished times (${row.pct}, ${row.shown})`);
  const series = await page.$$eval('svg.chart polyline.series', els => els.map(p => p.getAttribute('points').trim().split(' ').length));
  const n = job.result.pruning.fraction.length;
  check(series.length === 3 && series.every(k => k === n), `pruning curve: attribution, attention, random with ${n} points (${series})`);
  const streamed = await page.evaluate(() => performance.getEntriesByType('resource').some(e => e.name.includes('/events')));
  if (eventsApi) check(streamed, 'progress followed through /v1/jobs/{id}/events (SSE)');
  else check(!streamed, 'no event stream asked of a server without one (polling)');
  await shot(page, 'jobs-demo-sst2');

  const kindOptions = await page.$$eval('select[name=kind] option', els => els.map(e => e.value));
  if (modern) check(kindOptions.includes('faithfulness'), `faithfulness offered on demo-sst2 (${kindOptions})`);
  for (const kind of ['adversarial-triggers', 'decomposition', 'faithfulness'].filter(k => kindOptions.includes(k))) {
    const jid = await startJob(page, kind);
    await page.waitForFunction(j => document.querySelector(`tr[data-job="${j}"] .state`).textContent === 'done', { timeout: 60000 }, jid);
    const r = (await get(LENSD_URL, `v1/jobs/${jid}`)).result;
    if (kind === 'adversarial-triggers') {
      await page.waitForSelector('table.triggers', { timeout: 10000 });
      const rows = await page.$$eval('table.triggers tr', els => els.length - 1);
      const attack = await page.$$eval('table.attack tr', els => els.length - 1);
      check(rows === r.triggers.length && attack === r.attack.length, `trigger table ${rows}/${r.triggers.length}, attack table ${attack}/${r.attack.length}`);
    } else if (kind === 'faithfulness') {
      await page.waitForSelector('table.faithfulness', { timeout: 10000 });
      const rows = await page.$$eval('table.faithfulness tr[data-method]', els => els.map(e => [e.dataset.method, e.querySelectorAll('td').length]));
      check(rows.length === r.methods.length && rows.every(([m, n], i) => m === r.methods[i].method && n === 5) && rows[0][0] === 'random',
        `faithfulness table: ${rows.length} methods (random first) x 4 numbers (${rows.map(x => x[0])})`);
      const best = await page.$$eval('table.faithfulness td.best', els => els.length);
      check(best >= 4, `faithfulness table marks the best method of each column (${best} cells)`);
      const curves = await page.$$eval('figure', figs => figs.filter(f => /^(Deletion|Insertion):/.test(f.querySelector('figcaption')?.textContent || ''))
        .map(f => [...f.querySelectorAll('svg.chart polyline.series')].map(p => p.getAttribute('points').trim().split(' ').length)));
      const n = r.fractions.length;
      check(curves.length === 2 && curves.every(c => c.length === r.methods.length && c.every(k => k === n)),
        `deletion and insertion charts: ${r.methods.length} curves of ${n} points each (${JSON.stringify(curves)})`);
    } else {
      await page.waitForFunction(() => document.querySelectorAll('.spirals svg.scatter').length > 0, { timeout: 10000 });
      const spirals = await page.$$eval('.spirals svg.scatter', els => els.map(s => s.querySelectorAll('circle.point').length));
      check(spirals.length === r.layers.length && spirals.every(n => n === r.positions), `decomposition job: ${spirals.length} spirals of ${r.positions} positions`);
    }
    await shot(page, `jobs-${kind}`);
  }
  noErrors(page, 'jobs');
}

// ---------------------------------------------- issues 29, 31, 32: new views

// The request the page sends to path when act() runs, and the answer it got.
async function sent(page, path, act) {
  const [req] = await Promise.all([
    page.waitForRequest(r => r.url().endsWith(path) && r.method() === 'POST', { timeout: 60000 }), act()]);
  const res = await req.response() || await page.waitForResponse(r => r.request() === req, { timeout: 60000 });
  return { body: JSON.parse(req.postData()), status: res.status(), json: await res.json() };
}

// Run the form again and wait until the view has drawn the answer.
async function rerun(page, path) {
  return sent(page, path, () => page.click('form.input-form button[type=submit]'));
}

// Issue 29: the text view shows which experts fired per token, on MoE models only.
async function routerView(page, base) {
  await gotoView(page, base, 'demo-sst2', 'text');
  check(await page.$$eval('.router-layer', els => els.length) === 0, 'dense model: no expert routing panel');
  const model = 'demo-moe';
  check(modelInfo(model).analyses.includes('router') && !modelInfo('demo-gpt2').analyses.includes('router'),
    '/v1/models lists "router" for the MoE model only');
  await gotoView(page, base, model, 'text');
  const text = await page.$eval('textarea[name=text]', e => e.value);
  const r = await post(LENSD_URL, 'v1/forward', { model, text, outputs: ['router_probs'] });
  const T = r.tokens.length, E = r.router[0].probs[0].length;
  const drawn = await page.$$eval('.router-layer', els => els.map(e => ({ layer: Number(e.dataset.layer),
    cells: [...e.querySelectorAll('rect.cell')].map(c => [Number(c.dataset.r), Number(c.dataset.c), c.dataset.tip]) })));
  check(drawn.length === r.router.length && drawn.length > 0 && drawn.every((d, i) => d.layer === r.router[i].layer),
    `one routing map per MoE layer (${drawn.map(d => d.layer)})`);
  check(drawn.every(d => d.cells.length === T * E), `each map is tokens x experts = ${T} x ${E} (${drawn.map(d => d.cells.length)})`);
  const routed = drawn.every((d, i) => d.cells.every(([t, e, tip]) => {
    const k = r.router[i].experts[t].indexOf(e);
    return k < 0 ? tip.includes('not routed') : tip.includes(`gate ${Number(r.router[i].weights[t][k].toPrecision(4))}`);
  }));
  check(routed, 'the routed cells are the response\'s experts with their gate weights, the others "not routed"');
  await shot(page, 'text-demo-moe-routing');
  noErrors(page, 'router');
}

// Issue 31 item 5: method picker, per-layer and rolled-out maps on one scale, raw attention beside.
async function mixingView(page, base) {
  const model = 'demo-gpt2', m = modelInfo(model);
  await gotoView(page, base, model, 'context-mixing');
  const { body, json: r } = await rerun(page, 'v1/context-mixing');
  await waitReady(page, 'context-mixing');
  await page.waitForSelector('.mixing-layer', { timeout: 20000 });
  check(body.method === 'rollout', `default method rollout (${body.method})`);
  const T = r.tokens.length;
  const layers = await page.$$eval('.mixing-layer', els => els.map(e => ({
    maps: [...e.querySelectorAll('svg.heatmap')].map(s => s.querySelectorAll('rect.cell').length),
    legends: [...e.querySelectorAll('svg.legend')].map(l => [...l.querySelectorAll('text')].slice(1).map(t => t.textContent).join(' ')) })));
  check(layers.length === m.num_layers && layers.every(l => l.maps.length === 3 && l.maps.every(n => n === T * T)),
    `per layer: contributions, rollout, raw attention, each T x T = ${T * T} (${JSON.stringify(layers.map(l => l.maps))})`);
  const scales = new Set(layers.flatMap(l => l.legends.slice(0, 2)));
  check(scales.size === 1, `every contributions and rollout map on one colour scale (${[...scales]})`);
  // colours: contributions[l][i][j] on viridis over [0, the largest value of all maps]
  const fills = await page.evaluate(async (resp) => {
    const plot = await import(new URL('web/js/plot.js', document.baseURI).href);
    const max = Math.max(...resp.layers.flatMap(l => l.contributions.flat().concat(l.rollout.flat())));
    const svg = document.querySelectorAll('.mixing-layer')[resp.layers.length - 1].querySelector('svg.heatmap');
    const last = resp.layers[resp.layers.length - 1];
    return [...svg.querySelectorAll('rect.cell')].every(c => c.getAttribute('fill') === plot.seqColor(last.contributions[c.dataset.r][c.dataset.c] / max));
  }, r);
  check(fills, 'contribution cells coloured by the response on the shared scale');
  const attn = await post(LENSD_URL, 'v1/forward', { model, text: body.text, outputs: ['attentions'] });
  const H = attn.attentions[0].heads.length;
  const want = attn.attentions[0].heads.reduce((a, h) => a + h.weights[T - 1][0], 0) / H;
  const tip = await page.evaluate(t => document.querySelectorAll('.mixing-layer')[0].querySelectorAll('svg.heatmap')[2]
    .querySelector(`rect.cell[data-r="${t - 1}"][data-c="0"]`).dataset.tip, T);
  check(tip.endsWith(want.toPrecision(4)), `raw attention beside = the mean over heads (${tip} vs ${want.toPrecision(4)})`);
  await shot(page, 'context-mixing-demo-gpt2');
  await page.select('select[name=method]', 'alti');
  const alti = await rerun(page, 'v1/context-mixing');
  check(alti.body.method === 'alti' && alti.status === 200, `the picker sends the method (${alti.body.method}: ${alti.status})`);
  await page.waitForFunction(() => document.querySelector('.mixing-layer figcaption').textContent.includes('alti'), { timeout: 20000 });
  // a method the server refuses: its error text is shown
  await page.select('select[name=method]', 'decompx');
  const dx = await rerun(page, 'v1/context-mixing');
  if (dx.status === 200) {
    await page.waitForFunction(() => document.querySelector('.mixing-layer figcaption').textContent.includes('decompx'), { timeout: 20000 });
    check(true, 'decompx answered 200 and is drawn');
  } else {
    await page.waitForSelector('.output .error', { timeout: 10000 });
    const shown = await page.$eval('.output .error', e => e.textContent);
    check(dx.status === 422 && shown.includes(dx.json.error.message), `decompx: the server's 422 text is shown ("${shown}")`);
    page.errors = page.errors.filter(e => !/status of 422/.test(e));
  }
  noErrors(page, 'context mixing');
}

// Issue 31 items 4-5: a context-mixing job started from the jobs view and its
// per-layer chart: one line per method, and for each statistic and matrix the
// controls pick, every point at the job result's value (read back through the
// drawn y axis) and naming it on hover.
async function mixingJobView(page, base) {
  const model = 'demo-sst2';
  await gotoView(page, base, model, 'jobs');
  const kinds = await page.$$eval('select[name=kind] option', els => els.map(e => e.value));
  if (!specText.includes('ContextMixingJobParams') || !modelInfo(model).analyses.includes('context_mixing')) {
    check(!kinds.includes('context-mixing'), `no context-mixing job offered where the server has none (${kinds})`);
    skip('context-mixing job: this server\'s spec has no ContextMixingJobParams');
    return;
  }
  check(kinds.includes('context-mixing'), `context-mixing offered on ${model} (${kinds})`);
  const shown = () => page.$$eval('textarea[name=texts], input[name=method]', els => els.map(e => e.offsetParent !== null));
  await page.select('select[name=kind]', 'head-importance');
  check((await shown()).every(v => !v), 'texts and methods fields hidden for another kind');
  await page.select('select[name=kind]', 'context-mixing');
  const fields = await shown();
  check(fields.length === 6 && fields.every(Boolean), `texts and five method boxes shown for context-mixing (${fields})`);
  const texts = await page.$eval('textarea[name=texts]', e => e.value.split('\n'));
  const started = await sent(page, 'v1/jobs', () => page.click('form.input-form button[type=submit]'));
  check(JSON.stringify(started.body) === JSON.stringify({ kind: 'context-mixing', params: { model, texts } }),
    `default job: the texts, no methods (the server's default) (${JSON.stringify(started.body).slice(0, 160)})`);
  const done = async id => {
    await page.waitForFunction(j => document.querySelector(`tr[data-job="${j}"] .state`)?.textContent === 'done', { timeout: 120000 }, id);
    const job = await get(LENSD_URL, `v1/jobs/${id}`);
    await page.waitForFunction(n => document.querySelector('.mixing-job-chart svg.chart') &&
      [...document.querySelectorAll('section.panel h2')].some(h => h.textContent.startsWith(`Context mixing over ${n} text`)), { timeout: 20000 }, job.result.n_texts);
    return job.result;
  };
  const r = await done(started.json.id);
  const heading = await page.$$eval('section.panel h2', els => els.map(e => e.textContent).find(t => t.startsWith('Context mixing over')));
  check(r.n_texts === texts.length && heading === `Context mixing over ${r.n_texts} texts (${r.n_tokens} tokens, ${r.definition})`,
    `the number of texts shown: "${heading}"`);
  const L = modelInfo(model).num_layers, names = r.methods.map(m => m.method);
  check(names.length >= 3 && !names.includes('value-zeroing') && r.methods.every(m => m.layers.length === L),
    `the default job has every method but value zeroing, each with ${L} layers (${names})`);
  // the drawn chart: each point's value read back from its y position through two labelled grid lines
  const read = () => page.evaluate(() => {
    const box = document.querySelector('.mixing-job-chart'), svg = box.querySelector('svg.chart');
    const grid = [...svg.querySelectorAll('line.grid')].map(g => Number(g.getAttribute('y1')));
    const ticks = [...svg.querySelectorAll('text.tick[text-anchor=end]')].map(t => Number(t.textContent));
    const n = grid.length - 1, at = y => ticks[0] + (y - grid[0]) * (ticks[n] - ticks[0]) / (grid[n] - grid[0]);
    return { key: box.dataset.key, caption: box.querySelector('figcaption').textContent, lines: svg.querySelectorAll('polyline.series').length,
      legend: [...box.querySelectorAll('.legend-item')].map(e => e.textContent),
      points: [...svg.querySelectorAll('circle')].map(c => ({ tip: c.dataset.tip, value: at(Number(c.getAttribute('cy'))) })) };
  });
  const fmts = vals => page.evaluate(async v => v.map((await import(new URL('web/js/plot.js', document.baseURI).href)).fmt), vals);
  const combos = [['self', ''], ['first', ''], ['first', '_rollout'], ['self', '_rollout']];
  const series = k => JSON.stringify(r.methods.map(m => m.layers.map(l => l[k])));
  check(new Set(combos.map(([s, m]) => series(s + m))).size === 4, 'the four statistics of the result differ (so each check below can fail)');
  for (const [stat, matrix] of combos) {
    await page.select('select[name=cm-stat]', stat);
    await page.select('select[name=cm-matrix]', matrix);
    const key = stat + matrix, d = await read();
    const want = r.methods.flatMap(m => m.layers.map(l => ({ method: m.method, layer: l.layer, value: l[key] })));
    const shownValues = await fmts(want.map(w => w.value));
    const bad = want.filter((w, i) => {
      const tip = `${w.method}: layer ${w.layer} → ${shownValues[i]}`;
      const p = d.points.filter(q => q.tip === tip);
      return p.length !== 1 || Math.abs(p[0].value - w.value) > 1e-6;
    });
    check(d.key === key && d.points.length === want.length && bad.length === 0,
      `${key}: ${want.length} points = every method x layer of the result, each at its value and naming it (${bad.slice(0, 3).map(b => `${b.method} ${b.layer}`)})`);
    check(d.lines === names.length && JSON.stringify(d.legend.map(t => t.trim())) === JSON.stringify(names),
      `${key}: one line per method, the legend naming them (${d.legend})`);
    check(d.caption.includes(stat === 'self' ? 'self share' : 'first-token share') && d.caption.includes(matrix ? 'rollout' : "layer's own"),
      `${key}: the title names the statistic and the matrix ("${d.caption}")`);
  }
  // hover on a point shows its method, layer and value
  const point = await page.$('.mixing-job-chart svg.chart circle');
  await point.evaluate(e => e.scrollIntoView({ block: 'center', inline: 'center' }));
  const pb = await point.boundingBox();
  await page.mouse.move(pb.x + pb.width / 2, pb.y + pb.height / 2);
  const tip = await page.$eval('.tooltip', e => e.textContent);
  // points of equal value overlap: the one under the mouse is the one named
  const under = await page.evaluate((x, y) => document.elementFromPoint(x, y).closest('[data-tip]')?.dataset.tip, pb.x + pb.width / 2, pb.y + pb.height / 2);
  check(tip === under && names.some(n => tip.startsWith(`${n}: layer 1 → `)), `hover shows the point's method, layer and value ("${tip}")`);
  await shotOf(page, await page.evaluateHandle(() => document.querySelector('.mixing-job-chart').closest('section.panel')), 'jobs-context-mixing');

  // the methods ticked and the texts typed are the job's params
  await page.$eval('textarea[name=texts]', e => { e.value = 'a fine film .\nboring .\n  \nthe plot is thin .'; });
  await page.click('input[name=method][value=rollout]');
  await page.click('input[name=method][value=globenc]');
  const two = await sent(page, 'v1/jobs', () => page.click('form.input-form button[type=submit]'));
  check(JSON.stringify(two.body.params) === JSON.stringify({ model, texts: ['a fine film .', 'boring .', 'the plot is thin .'], methods: ['rollout', 'globenc'] }),
    `ticked methods and typed texts sent (${JSON.stringify(two.body.params)})`);
  const r2 = await done(two.json.id);
  const legend = await page.$$eval('.mixing-job-chart .legend-item', els => els.map(e => e.textContent.trim()));
  check(r2.n_texts === 3 && JSON.stringify(legend) === '["rollout","globenc"]', `the second job draws its 2 methods over 3 texts (${legend})`);
  noErrors(page, 'context-mixing job');
}

// Issue 31 item 5: the objective controls change the attribution request.
async function attributionObjective(page, base) {
  const model = 'demo-gpt2', m = modelInfo(model);
  await gotoView(page, base, model, 'attribution');
  await page.select('select[name=objective-kind]', 'logit_difference');
  await page.type('input[name=objective-position]', '1');
  await page.type('input[name=objective-target]', ' good');
  await page.type('input[name=objective-foil]', ' bad');
  const { body, json: r } = await rerun(page, 'v1/attribution');
  check(JSON.stringify(body.objective) === JSON.stringify({ kind: 'logit_difference', position: 1, target: ' good', foil: ' bad' }),
    `objective sent as typed (${JSON.stringify(body.objective)})`);
  await page.waitForSelector('table.completeness', { timeout: 30000 });
  const rows = await page.$$eval('table.completeness tr[data-layer]', els => els.map(e => [...e.children].map(td => td.textContent)));
  const fmt4 = v => String(Number(v.toPrecision(4)));
  check(rows.length === m.num_layers && rows.every((row, i) => row[1] === fmt4(r.layers[i].attr_sum) && row[2] === fmt4(r.objective.value - r.layers[i].f_zero)),
    `completeness per layer: attributions' sum vs F(A) − F(0) from the response (${JSON.stringify(rows)})`);
  const head = await page.$$eval('section.panel h2', els => els.map(e => e.textContent).find(t => t.startsWith('Objective')));
  check(head.includes('logit difference of ␣good − ␣bad at token 1') && head.endsWith(`= ${fmt4(r.objective.value)}`), `objective heading "${head}"`);
  await shot(page, 'attribution-objective-demo-gpt2');
  noErrors(page, 'attribution objective');
}

// Issue 31 item 5: the head x layer grid of direct logit attribution.
async function logitView(page, base) {
  const model = 'demo-gpt2', m = modelInfo(model);
  await gotoView(page, base, 'demo-sst2', 'logit-attribution');
  check(await page.$$eval('.unsupported', els => els.length) === 1, 'encoder classifier: logit attribution not offered');
  await gotoView(page, base, model, 'logit-attribution');
  const { body, json: r } = await rerun(page, 'v1/logit-attribution');
  await waitReady(page, 'logit-attribution');
  await page.waitForSelector('svg.heatmap rect.cell', { timeout: 20000 });
  const top = await post(LENSD_URL, 'v1/forward', { model, text: body.text, outputs: ['top_k'], k: 2 });
  const last = top.top_k[top.top_k.length - 1].predictions;
  check(body.target === last[0].id && body.foil === last[1].id, `default: predicted token vs runner-up (${body.target}, ${body.foil})`);
  const cells = await page.$$eval('svg.heatmap rect.cell', els => els.map(e => [Number(e.dataset.r), Number(e.dataset.c), e.dataset.tip]));
  check(cells.length === m.num_layers * m.num_heads, `grid layers x heads = ${m.num_layers * m.num_heads} (${cells.length})`);
  const ok = cells.every(([l, h, tip]) => {
    const x = r.heads.find(t => t.layer === l + 1 && t.head === h);
    return x && tip === `layer ${l + 1} head ${h}: ${Number(x.value.toPrecision(4))}`;
  });
  check(ok, 'each cell is its head\'s term in the response');
  const bars = await page.$$eval('svg.bars rect.bar', els => els.length);
  check(bars === r.mlps.length + 2, `embedding, ${r.mlps.length} MLPs and biases as bars (${bars})`);
  await page.$eval('input[name=objective-target]', e => { e.value = ''; });
  await page.type('input[name=objective-target]', ' good');
  await page.$eval('input[name=objective-foil]', e => { e.value = ''; });
  await page.type('input[name=objective-position]', '-2');
  const typed = await rerun(page, 'v1/logit-attribution');
  check(typed.body.target === ' good' && typed.body.foil === undefined && typed.body.position === -2 && typed.status === 200,
    `the controls change the request (${JSON.stringify({ t: typed.body.target, f: typed.body.foil, p: typed.body.position })})`);
  await page.waitForFunction(() => [...document.querySelectorAll('section.panel h2')].some(h => h.textContent.startsWith('Direct logit attribution: logit of')), { timeout: 20000 });
  await shot(page, 'logit-attribution-demo-gpt2');
  noErrors(page, 'logit attribution');
}

// Issue 32 item 4: clicking heads on the attention grid ablates them.
async function ablationToggle(page, base) {
  const model = 'demo-sst2';
  await gotoView(page, base, model, 'attention');
  await page.click('input[name=ablate]');
  const a = await sent(page, 'v1/ablation', () => page.click('.head-cell[data-layer="1"][data-head="0"]'));
  check(JSON.stringify(a.body.heads) === '[[1,0]]' && a.body.mode === 'zero', `a click ablates that head (${JSON.stringify(a.body.heads)})`);
  const b = await sent(page, 'v1/ablation', () => page.click('.head-cell[data-layer="2"][data-head="1"]'));
  check(JSON.stringify(b.body.heads) === '[[1,0],[2,1]]', `a second click adds a head (${JSON.stringify(b.body.heads)})`);
  await page.waitForFunction(c => document.querySelector(`table.ablation[data-change="${c}"]`), { timeout: 20000 }, b.json.objective.change);
  const direct = await post(LENSD_URL, 'v1/ablation', { model, text: TEXT, heads: [[1, 0], [2, 1]] });
  const shown = await page.$$eval('table.ablation tr', els => Object.fromEntries(els.map(e => [e.children[0].textContent, e.children[1].textContent])));
  const fmt4 = v => String(Number(v.toPrecision(4)));
  check(shown.clean === fmt4(direct.objective.clean) && shown.ablated === fmt4(direct.objective.ablated),
    `clean ${shown.clean} / ablated ${shown.ablated} = /v1/ablation's`);
  const probs = await page.$$eval('table.ablation-probs tr', els => els.length - 1);
  check(probs === modelInfo(model).labels.length, `class probabilities clean vs ablated (${probs} rows)`);
  const o = await sent(page, 'v1/ablation', () => page.select('select[name=objective-kind]', 'logit'));
  check(JSON.stringify(o.body.objective) === '{"kind":"logit"}' && o.status === 200 && JSON.stringify(o.body.heads) === '[[1,0],[2,1]]',
    `the objective controls change the ablation request (${JSON.stringify(o.body.objective)})`);
  await page.waitForFunction(c => document.querySelector(`table.ablation[data-change="${c}"]`), { timeout: 20000 }, o.json.objective.change);
  const marked = await page.$$eval('.head-cell[data-ablated="true"]', els => els.length);
  check(marked === 2, `ablated heads marked on the grid (${marked})`);
  const c = await sent(page, 'v1/ablation', () => page.click('.head-cell[data-layer="1"][data-head="0"]'));
  check(JSON.stringify(c.body.heads) === '[[2,1]]', `clicking an ablated head restores it (${JSON.stringify(c.body.heads)})`);
  await page.click('input[name=ablate]');
  await page.click('.head-cell[data-layer="1"][data-head="1"]');
  const caption = await page.$eval('.focus figcaption', e => e.textContent);
  check(caption.includes('layer 1 head 1'), 'with the toggle off a click focuses the head again');
  await shot(page, 'attention-ablation-demo-sst2');
  noErrors(page, 'ablation toggle');
}

// Issue 32 item 4: clean / corrupt inputs and every grid the answer has as a heatmap.
async function patchingView(page, base) {
  for (const model of ['demo-sst2', 'demo-gpt2']) {
    const m = modelInfo(model);
    await gotoView(page, base, model, 'patching');
    const { body, json: r } = await rerun(page, 'v1/patching');
    await page.waitForSelector('.patch-grid[data-grid="resid"] rect.cell', { timeout: 30000 });
    check(body.targets === undefined && body.method === undefined, `${model}: default request asks for the residual grid, exact`);
    const T = r.tokens.length;
    const cells = await page.$$eval('.patch-grid[data-grid="resid"] rect.cell', els => els.map(e => [Number(e.dataset.r), Number(e.dataset.c), e.dataset.tip]));
    check(cells.length === m.num_layers * T, `${model}: residual grid L x T = ${m.num_layers} x ${T} (${cells.length})`);
    const want = await page.evaluate(async g => {
      const plot = await import(new URL('web/js/plot.js', document.baseURI).href);
      return g.map(row => row.map(v => plot.fmt(v)));
    }, r.resid);
    const bad = cells.filter(([l, t, tip]) => !tip.endsWith(`: ${want[l][t]}`));
    check(bad.length === 0, `${model}: each cell is the response's normalised effect, null as n/a (${bad.slice(0, 3).map(b => b[2])})`);
    await shot(page, `patching-${model}`);
    noErrors(page, `patching/${model}`);
  }
  // asking for the head and MLP grids: drawn when the server has them, else its error text
  await page.click('input[name=target][value=heads]');
  await page.click('input[name=target][value=mlps]');
  const g = await rerun(page, 'v1/patching');
  check(JSON.stringify(g.body.targets) === '["resid","heads","mlps"]', `the grid checkboxes set targets (${JSON.stringify(g.body.targets)})`);
  if (g.status === 200) {
    const m = modelInfo('demo-gpt2');
    await page.waitForSelector('.patch-grid[data-grid="heads"]', { timeout: 30000 });
    const heads = await page.$$eval('.patch-grid[data-grid="heads"] rect.cell', els => els.length);
    const mlps = await page.$$eval('.patch-grid[data-grid="mlps"] rect.cell', els => els.length);
    check(heads === m.num_layers * m.num_heads && mlps === m.num_layers, `head grid L x H (${heads}), MLP row L (${mlps})`);
  } else {
    await page.waitForSelector('.output .error', { timeout: 10000 });
    const shown = await page.$eval('.output .error', e => e.textContent);
    check(g.status === 422 && shown.includes(g.json.error.message), `heads / mlps refused: the server's text shown ("${shown}")`);
    page.errors = page.errors.filter(e => !/status of 422/.test(e));
  }
  await page.select('select[name=method]', 'attribution');
  await page.click('input[name=target][value=heads]');
  await page.click('input[name=target][value=mlps]');
  const at = await rerun(page, 'v1/patching');
  check(at.body.method === 'attribution', 'the method picker sends "method": "attribution"');
  if (at.status === 200) {
    await page.waitForSelector('.patch-grid[data-method="attribution"] rect.cell', { timeout: 30000 });
    check(true, 'attribution patching grid drawn');
  } else {
    await page.waitForSelector('.output .error', { timeout: 10000 });
    page.errors = page.errors.filter(e => !/status of 422/.test(e));
    check(at.status === 422, `attribution patching refused with a shown 422 (${at.status})`);
  }
  noErrors(page, 'patching grids');
}

// ------------------------------------------------------------------- runs

const views = [textView, attentionView, attentionLong, attributionView, readableLabels, identityView, decompositionView, jobsView,
  longSequence, canvasHeatmap, routerView, mixingView, mixingJobView, attributionObjective, logitView, ablationToggle, patchingView]
  .filter(v => !process.env.ONLY || process.env.ONLY.split(',').includes(v.name));
for (const vp of VIEWPORTS) {
  const page = await openPage(vp);
  const t0 = Date.now();
  await page.goto(new URL('?model=demo-sst2#/text', LENSD_URL).href, { waitUntil: 'domcontentloaded' });
  await waitReady(page, 'text');
  const ms = Number(await page.$eval('body', b => b.dataset.firstReady));
  console.log(`first view interactive (${vp.width}x${vp.height}): ${ms} ms after navigation start (${Date.now() - t0} ms wall, target < 1000)`);
  check(ms > 0, 'first-view time measured');
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `no page-wide horizontal scroll at ${vp.width}px (${overflow}px)`);
  for (const view of views) {
    try { await view(page, LENSD_URL); } catch (err) { check(false, `${view.name} at ${vp.width}: ${err.message}`); }
  }
  await page.close();
}

// the API key: 401 -> dialog -> key -> models load
if (KEY_URL) {
  const page = await openPage(VIEWPORTS[0], [/status of 401/]);
  await page.goto(new URL('#/attention', KEY_URL).href, { waitUntil: 'domcontentloaded' });
  await page.waitForSelector('#key-dialog[open]', { timeout: 10000 });
  await shot(page, 'api-key-dialog');
  await page.type('#key-dialog input', API_KEY);
  await page.click('#key-ok');
  await waitReady(page, 'attention');
  const cells = await page.$$eval('.head-cell', els => els.length);
  check(cells > 0, `after the key the attention view draws (${cells} head cells)`);
  // cancel: this server delays every job by 3 s (--debug-delay-ms), so it is still queued or waiting
  await page.evaluate(() => { location.hash = '#/jobs'; });
  await waitReady(page, 'jobs');
  await page.select('select[name=kind]', 'head-importance');
  await page.click('form.input-form button[type=submit]');
  await page.waitForSelector('table.jobs tbody tr button.cancel:not([disabled])', { timeout: 10000 });
  const id = await page.$eval('table.jobs tbody tr', e => e.dataset.job);
  await page.click(`tr[data-job="${id}"] button.cancel`);
  await page.waitForFunction(j => document.querySelector(`tr[data-job="${j}"] .state`).textContent === 'cancelled', { timeout: 15000 }, id);
  const job = await (await fetch(new URL(`v1/jobs/${id}`, KEY_URL), { headers: { Authorization: `Bearer ${API_KEY}` } })).json();
  check(job.state === 'cancelled', `Cancel cancels the job on the server (${job.state})`);
  await shot(page, 'jobs-cancelled');
  noErrors(page, 'API key flow and cancel');
  await page.close();
} else skip('API key flow: no KEY_URL');

// behind the nginx gateway under a path prefix
if (GATEWAY_URL) {
  for (const vp of VIEWPORTS) {
    const page = await openPage(vp);
    await page.goto(new URL('?model=demo-identifiable#/attention', GATEWAY_URL).href, { waitUntil: 'domcontentloaded' });
    await waitReady(page, 'attention');
    const m = modelInfo('demo-identifiable');
    const cells = await page.$$eval('.head-cell', els => els.length);
    check(cells === m.num_layers * m.num_heads, `gateway ${vp.width}px: head cells ${cells} = ${m.num_layers * m.num_heads}`);
    const urls = await page.evaluate(() => performance.getEntriesByType('resource').map(e => new URL(e.name).pathname));
    const prefix = new URL(GATEWAY_URL).pathname;
    check(urls.length > 5 && urls.every(u => u.startsWith(prefix)), `every request stays under ${prefix} (${urls.filter(u => !u.startsWith(prefix))})`);
    await shot(page, 'gateway-attention');
    noErrors(page, `gateway ${vp.width}px`);
    await page.close();
  }
} else skip('gateway: no GATEWAY_URL');

await browser.close();
console.log(`screenshots (${shots.length}):\n  ${shots.join('\n  ')}`);
console.log(`test_web: ${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(failed ? 1 : 0);
