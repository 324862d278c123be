// jobs.js - Jobs: start the dataset analyses as async jobs, follow them
// with live progress bars (Server-Sent Events where the server has them,
// else polling), cancel them, and draw their results: the head pruning
// curve, the adversarial trigger table, decomposition plots, the
// faithfulness table and its deletion / insertion curves, the context-mixing
// shares per layer.
import { el, lineChart, barChart, fmt, CATEGORICAL } from '../plot.js';
import { sse } from '../api.js';
import { section, note, into } from './common.js';
import { decompositionPlots } from './decomposition.js';
import { jobPlots as mixingJobPlots, METHODS as MIXING_METHODS } from './mixing.js';

export const id = 'jobs';
export const title = 'Jobs';

const MINE = 'lensd.jobs'; // ids this tab started, for servers without GET /v1/jobs

// A few labelled sentences in the style of SST-2 (0 negative, 1 positive).
const ROWS = [
  ['a charming and often affecting journey .', 1], ['the acting is terrible and the plot is worse .', 0],
  ['one of the most moving films of the year .', 1], ['a dull , lifeless and forgettable mess .', 0],
  ['funny , warm and beautifully made .', 1], ['it is too long and never finds its story .', 0],
  ['a gorgeous , witty and tender film .', 1], ['the jokes fall flat and the characters are boring .', 0],
  ['an honest and touching portrait of a family .', 1], ['nothing in this movie works .', 0],
  ['smart , sharp and full of life .', 1], ['a tedious film with no heart .', 0],
].map(([text, label]) => ({ text, label }));

// data: '' for the built-in rows, else a TSV path under the server's --data-dir;
// mixing: {texts, methods} of the context-mixing fields (no methods: the server's default).
function paramsFor(kind, model, data, mixing) {
  const source = data ? { data, max_rows: 200 } : { rows: ROWS };
  if (kind === 'head-importance') return { model, ...source, seeds: 2, steps: 8 };
  if (kind === 'adversarial-triggers') return { model, ...source, steps: 8, top_k: 3 };
  if (kind === 'faithfulness') return { model, ...(data ? { data, max_rows: 40 } : { texts: ROWS.map(r => r.text) }), steps: 8 };
  if (kind === 'context-mixing') {
    return { model, ...(data ? { data, max_texts: 200 } : { texts: mixing.texts }), ...(mixing.methods.length ? { methods: mixing.methods } : {}) };
  }
  return { model, texts: ROWS.map(r => r.text), labels: ROWS.map(r => (r.label ? 'positive' : 'negative')), length: 8 };
}

function remember(id) {
  const ids = JSON.parse(sessionStorage.getItem(MINE) || '[]');
  sessionStorage.setItem(MINE, JSON.stringify([id, ...ids.filter(x => x !== id)].slice(0, 20)));
}

async function listJobs(ctx) {
  if (ctx.modern) {
    const res = await ctx.api('v1/jobs');
    return res.jobs || res;
  }
  const ids = JSON.parse(sessionStorage.getItem(MINE) || '[]');
  const jobs = [];
  for (const id of ids) {
    try { jobs.push(await ctx.api(`v1/jobs/${encodeURIComponent(id)}`)); } catch { /* expired */ }
  }
  return jobs;
}

const final = s => ['done', 'failed', 'cancelled'].includes(s);

function pruningCurve(r) {
  const xs = r.pruning.fraction;
  return lineChart({ title: `Accuracy as heads are pruned (baseline ${fmt(r.baseline_accuracy)}, ${r.n_examples} examples)`, xLabel: 'fraction of heads pruned',
    yLabel: 'accuracy', yDomain: [0, 1], series: [
      { name: 'by attribution (least important first)', xs, ys: r.pruning.attribution, color: CATEGORICAL[0] },
      { name: 'by attention', xs, ys: r.pruning.attention, color: CATEGORICAL[1] },
      { name: `random order (mean of ${r.pruning.seeds} seeds)`, xs, ys: r.pruning.random, color: CATEGORICAL[2] }] });
}

function triggerTable(r) {
  return el('table', { class: 'stats triggers' },
    el('tr', {}, ['class', 'found', 'trigger tokens', 'relative positions', 'count', 'score'].map(t => el('th', { text: t }))),
    r.triggers.map(t => el('tr', {}, el('td', { text: t.label_name ?? t.label }), el('td', { text: t.found ? 'yes' : 'no' }),
      el('td', { text: (t.tokens || []).join(' ') }), el('td', { text: (t.positions || []).map(fmt).join(', ') }),
      el('td', { text: t.count ?? '' }), el('td', { text: t.score === undefined ? '' : fmt(t.score) }))));
}

function attackTable(r) {
  return el('table', { class: 'stats attack' },
    el('tr', {}, ['victims of class', 'n', 'trigger of class', 'accuracy before', 'accuracy after'].map(t => el('th', { text: t }))),
    r.attack.map(a => el('tr', {}, el('td', { text: a.label_name ?? a.label }), el('td', { text: a.n }),
      el('td', { text: a.trigger_from ?? 'none' }), el('td', { text: fmt(a.accuracy_before) }), el('td', { text: fmt(a.accuracy_after) }))));
}

const FAITH_COLUMNS = [['aopc_deletion', 'AOPC deletion ↑'], ['aopc_insertion', 'AOPC insertion ↑'],
  ['comprehensiveness', 'comprehensiveness ↑'], ['sufficiency', 'sufficiency ↓']];

// One row per method; the best value of each column (random aside) is marked.
function faithfulnessTable(r) {
  const best = FAITH_COLUMNS.map(([key], c) => {
    const vals = r.methods.filter(m => m.method !== 'random').map(m => m[key]);
    return vals.length ? (c === 3 ? Math.min(...vals) : Math.max(...vals)) : NaN;
  });
  return el('table', { class: 'stats faithfulness' },
    el('tr', {}, el('th', { text: 'method' }), FAITH_COLUMNS.map(([, t]) => el('th', { text: t }))),
    r.methods.map(m => el('tr', { 'data-method': m.method, class: m.method === 'random' ? 'baseline' : undefined },
      el('td', { text: m.method === 'random' ? `random (baseline, ${r.random_orderings} orderings)` : m.method }),
      FAITH_COLUMNS.map(([key], c) => el('td', { text: fmt(m[key]), class: m.method !== 'random' && m[key] === best[c] ? 'best' : undefined })))));
}

function faithfulnessCurve(r, key, title) {
  const series = r.methods.map((m, i) => ({ name: m.method, xs: r.fractions, ys: m[key],
    color: m.method === 'random' ? '#000000' : CATEGORICAL[i % 7], dash: m.method === 'random' || i > 7 ? '6 4' : undefined }));
  return lineChart({ title, xLabel: `fraction of ${r.unit === 'heads' ? 'heads' : 'tokens'}`, yLabel: `objective (${r.objective.kind})`, series, widthStep: 1 });
}

export function resultPanels(job) {
  const r = job.result;
  if (!r) return [note(job.error ? `${job.error.code}: ${job.error.message}` : `no result (${job.state})`)];
  if (job.kind === 'head-importance') {
    return [section('Pruning curve', pruningCurve(r)),
      section('Head importance over the dataset', barChart({ title: 'Mean max attribution per head', labels: r.heads.map(h => `layer ${h.layer} head ${h.head}`),
        values: r.heads.map(h => h.attribution), xLabel: 'mean max attribution', yLabel: 'head' }))];
  }
  if (job.kind === 'adversarial-triggers') {
    return [section(`Triggers (${r.sources} source rows, top ${r.top_k} pairs each)`, triggerTable(r)),
      section(`Attack: accuracy ${fmt(r.accuracy_before)} → ${fmt(r.accuracy_after)} on ${r.victims} victims`, attackTable(r))];
  }
  if (job.kind === 'decomposition') return decompositionPlots(r);
  if (job.kind === 'context-mixing') return mixingJobPlots(r);
  if (job.kind === 'faithfulness') {
    const units = r.unit === 'heads' ? 'heads' : 'tokens';
    const how = r.unit === 'heads' ? 'Heads are zero-ablated (attention and output zero)' : 'Tokens are deleted from the sequence, special tokens never';
    return [section(`Faithfulness over ${r.n_examples} rows (full input ${fmt(r.full)}, every ${units.slice(0, -1)} removed ${fmt(r.empty)})`, faithfulnessTable(r),
      note(`${how}; AOPC and comprehensiveness: higher means the top-scored ${units} matter more, sufficiency: lower means they suffice (docs/faithfulness.md).`)),
    section('Deletion and insertion curves',
      faithfulnessCurve(r, 'deletion_curve', `Deletion: the objective with the top ${units} removed`),
      faithfulnessCurve(r, 'insertion_curve', `Insertion: the objective with only the top ${units} kept`))];
  }
  return [el('pre', { class: 'json', text: JSON.stringify(r, null, 1).slice(0, 4000) })];
}

// An RFC 3339 time as the reader's local date and time (seconds), '' for none.
function when(t) {
  if (!t) return '';
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? String(t) : d.toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' });
}
const percent = p => `${Math.round(100 * (p || 0))}%`;

function jobRow(ctx, job, onShow) {
  const bar = el('progress', { max: 1, value: job.progress || 0, 'aria-label': `progress of ${job.id}` });
  const pct = el('span', { class: 'pct', text: percent(job.progress) });
  const created = el('td', { class: 'created', text: when(job.created), 'data-time': job.created || '' });
  const finished = el('td', { class: 'finished', text: when(job.finished), 'data-time': job.finished || '' });
  const stateCell = el('td', { class: 'state', text: job.state });
  const cancel = el('button', { type: 'button', class: 'cancel', text: 'Cancel', disabled: final(job.state) || undefined,
    onclick: async () => { await ctx.api(`v1/jobs/${encodeURIComponent(job.id)}`, undefined, 'DELETE').catch(() => {}); } });
  const show = el('button', { type: 'button', class: 'show', text: 'Result', disabled: job.state !== 'done' || undefined, onclick: () => onShow(job.id) });
  const row = el('tr', { 'data-job': job.id }, el('td', { text: job.id }), el('td', { text: job.kind }), el('td', { text: job.model || '' }),
    stateCell, el('td', { class: 'progress' }, bar, ' ', pct), created, finished, el('td', {}, cancel, ' ', show));
  row.update = j => {
    Object.assign(job, j);
    bar.value = job.progress || 0;
    pct.textContent = percent(job.progress);
    finished.textContent = when(job.finished);
    finished.dataset.time = job.finished || '';
    stateCell.textContent = job.state;
    cancel.disabled = final(job.state);
    show.disabled = job.state !== 'done';
  };
  return row;
}

// Follows one job until it is final: SSE on servers with /v1/jobs/{id}/events, else polling.
async function follow(ctx, row, id, alive) {
  if (await ctx.specHas('/v1/jobs/{id}/events')) {
    try {
      const ctl = new AbortController();
      await sse(`v1/jobs/${encodeURIComponent(id)}/events`, ({ data }) => {
        if (!alive()) ctl.abort();
        if (data && typeof data === 'object') row.update(data.job || data);
      }, ctl.signal);
      if (final(row.querySelector('.state').textContent)) return;
    } catch { /* fall back to polling */ }
  }
  while (alive()) {
    const job = await ctx.api(`v1/jobs/${encodeURIComponent(id)}`);
    row.update(job);
    if (final(job.state)) return;
    await new Promise(r => setTimeout(r, 400));
  }
}

export async function render(root, ctx) {
  const m = ctx.model;
  const kinds = ['head-importance', 'adversarial-triggers', 'decomposition'].filter(k => ctx.supports(k.replace(/-/g, '_')));
  // faithfulness is no analysis of its own: any model with an objective, on servers whose spec has the kind
  if (['classification', 'causal-lm'].includes(m.task) && await ctx.specHas('FaithfulnessParams')) kinds.push('faithfulness');
  if (ctx.supports('context_mixing') && await ctx.specHas('ContextMixingJobParams')) kinds.push('context-mixing');
  const kindSel = el('select', { name: 'kind', 'aria-label': 'job kind' }, kinds.map(k => el('option', { value: k, text: k })));
  // TSV files the server offers under --data-dir (GET /v1/capabilities), for the dataset kinds
  const files = ((ctx.state.capabilities || {}).data_files || []).filter(f => f.path.endsWith('.tsv'));
  const dataSel = el('select', { name: 'data', 'aria-label': 'dataset' }, el('option', { value: '', text: `${ROWS.length} built-in labelled sentences` }),
    files.map(f => el('option', { value: f.path, text: `${f.path} (first 200 rows)` })));
  // context-mixing: the methods (none ticked: the server's default) and the texts, when no dataset is picked
  const methods = MIXING_METHODS.map(k => el('label', {}, el('input', { type: 'checkbox', name: 'method', value: k }), ` ${k} `));
  const texts = el('textarea', { name: 'texts', rows: 4, 'aria-label': 'texts, one per line' });
  texts.value = ROWS.map(r => r.text).join('\n');
  const methodsBox = el('span', { title: 'none ticked: every method the model defines but value zeroing' }, 'methods ', methods);
  const textsBox = el('label', { class: 'grow' }, 'texts (one per line) ', texts);
  const mixingFields = () => ({ texts: texts.value.split('\n').map(t => t.trim()).filter(Boolean),
    methods: methods.map(l => l.querySelector('input')).filter(i => i.checked).map(i => i.value) });
  const showFields = () => {
    const mixing = kindSel.value === 'context-mixing';
    methodsBox.hidden = !mixing;
    textsBox.hidden = !mixing || dataSel.value !== '';
    dataSel.options[0].text = mixing ? 'the texts below' : `${ROWS.length} built-in labelled sentences`;
  };
  kindSel.addEventListener('change', showFields);
  dataSel.addEventListener('change', showFields);
  const body = el('tbody', {});
  const result = el('div', { class: 'output' });
  const alive = () => root.isConnected;
  const onShow = id => into(result, async () => resultPanels(await ctx.api(`v1/jobs/${encodeURIComponent(id)}`)));
  const add = job => {
    const row = jobRow(ctx, job, onShow);
    body.prepend(row);
    if (!final(job.state)) follow(ctx, row, job.id, alive).then(() => { if (row.querySelector('.state').textContent === 'done' && root.dataset.autoshow === job.id) onShow(job.id); });
    return row;
  };
  const form = el('form', { class: 'input-form' }, el('label', {}, 'job ', kindSel), el('label', {}, `on ${m.id} with `, dataSel),
    methodsBox, textsBox, el('button', { type: 'submit', text: 'Start job' }));
  showFields();
  form.addEventListener('submit', async ev => {
    ev.preventDefault();
    try {
      const data = kindSel.value === 'decomposition' ? '' : dataSel.value;
      const job = await ctx.api('v1/jobs', { kind: kindSel.value, params: paramsFor(kindSel.value, m.id, data, mixingFields()) });
      remember(job.id);
      root.dataset.autoshow = job.id;
      add(job);
    } catch (err) {
      result.replaceChildren(ctx.errorBox(err));
    }
  });
  const table = el('table', { class: 'jobs' }, el('thead', {}, el('tr', {}, ['id', 'kind', 'model', 'state', 'progress', 'created', 'finished', ''].map(t => el('th', { text: t })))), body);
  root.append(kinds.length ? form : note(`${m.id} supports none of the job kinds drawn here.`),
    section('Jobs', el('div', { class: 'scroll' }, table), ctx.modern ? null : note('This server has no jobs list: showing the jobs started from this tab.')), result);
  const jobs = await listJobs(ctx);
  for (const job of jobs.slice().reverse()) add(job);
}
