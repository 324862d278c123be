// app.js - the dashboard shell: model picker, tabs, hash routing, and the
// context every view gets. Views live in views/*.js and export
// {id, title, needs, render(root, ctx)}; render resolves when the view has
// drawn, and the shell then marks the view root with data-ready="1" (the
// browser test waits for it).
import { api, ApiError, authHeaders } from './api.js';
import { el, installTips } from './plot.js';
import { setErrorBox } from './views/common.js';
import * as textView from './views/text.js';
import * as attentionView from './views/attention.js';
import * as attributionView from './views/attribution.js';
import * as identityView from './views/identity.js';
import * as decompositionView from './views/decomposition.js';
import * as jobsView from './views/jobs.js';
import * as mixingView from './views/mixing.js';
import * as logitView from './views/logit.js';
import * as patchingView from './views/patching.js';

const VIEWS = [textView, attentionView, attributionView, identityView, decompositionView, mixingView, logitView, patchingView, jobsView];

// What each analysis needs when the server does not list "analyses" per
// model (servers before /v1/capabilities), from the task alone: the
// dashboard never decides by model_type (tests/test_family_names.c fails on a
// family named under web/). Such a server refuses what it cannot run with a
// typed 422, which the view shows.
function localSupports(m, analysis) {
  const classifier = m.task === 'classification';
  switch (analysis) {
    case 'attribution': return classifier || m.task === 'causal-lm';
    case 'attribution_tree': case 'head_importance': case 'adversarial_triggers': return classifier;
    // objectives need a task head (docs/ablation.md, docs/patching.md)
    case 'ablation': case 'patching': return classifier || m.task === 'causal-lm';
    // added after per-model analyses: a server that does not name them has none
    case 'router': case 'logit_attribution': case 'context_mixing': return false;
    default: return true;
  }
}

const state = {
  models: [],
  model: null,
  capabilities: null, // GET /v1/capabilities, when the server has it
  text: 'a charming and often affecting journey .',
  pair: '',
  epoch: 0,
};

let specText = null; // promise of GET openapi.yaml's text

const ctx = {
  api,
  state,
  get model() { return state.model; },
  // The model's analyses decide for every analysis /v1/capabilities names;
  // the others (ablation, patching: not listed per model) go by the task.
  supports(analysis) {
    const m = state.model;
    if (!m) return false;
    const named = state.capabilities && Array.isArray(state.capabilities.analyses) &&
      state.capabilities.analyses.some(a => a.name === analysis);
    return Array.isArray(m.analyses) && named ? m.analyses.includes(analysis) : localSupports(m, analysis);
  },
  // newer servers: /v1/models lists analyses, and capabilities/jobs list/top_k exist
  get modern() { return state.capabilities !== null; },
  // Does the served openapi.yaml mention needle? Features that arrived after
  // /v1/capabilities (top_k and logit_lens, job event streams) are looked up
  // in the spec rather than probed, so the console never shows a 404 or 422.
  async specHas(needle) {
    if (!this.modern) return false;
    if (specText === null) {
      specText = fetch('openapi.yaml', { headers: authHeaders() }).then(r => (r.ok ? r.text() : '')).catch(() => '');
    }
    return (await specText).includes(needle);
  },
};

function errorBox(err) {
  const msg = err instanceof ApiError ? `${err.code}${err.field ? ` (${err.field})` : ''}: ${err.message}` : String(err);
  return el('div', { class: 'error', role: 'alert' }, msg);
}
ctx.errorBox = errorBox;
setErrorBox(errorBox);

function currentView() {
  const id = (location.hash.match(/^#\/?([\w-]+)/) || [])[1];
  return VIEWS.find(v => v.id === id) || VIEWS[0];
}

async function show() {
  const view = currentView();
  const epoch = ++state.epoch;
  document.querySelectorAll('#tabs a').forEach(a => a.setAttribute('aria-current', a.dataset.view === view.id ? 'page' : 'false'));
  const root = el('section', { class: 'view', 'data-view': view.id });
  document.getElementById('view').replaceChildren(root);
  const t0 = performance.now();
  try {
    await view.render(root, ctx);
  } catch (err) {
    root.append(errorBox(err));
  }
  if (epoch !== state.epoch) return;
  root.dataset.ms = String(Math.round(performance.now() - t0));
  // first view interactive: ms since navigation start (the browser test prints it)
  if (!document.body.dataset.firstReady) document.body.dataset.firstReady = String(Math.round(performance.now()));
  root.dataset.ready = '1';
}

function modelLine(m) {
  return `${m.architecture} · ${m.num_layers} layers × ${m.num_heads} heads · d ${m.hidden_size} · ${m.task}` +
    (m.labels ? ` · labels ${m.labels.join(', ')}` : '');
}

function pickModel(id) {
  state.model = state.models.find(m => m.id === id) || state.models[0] || null;
  document.getElementById('model-info').textContent = state.model ? modelLine(state.model) : '';
  const u = new URL(location.href);
  if (state.model) u.searchParams.set('model', state.model.id);
  history.replaceState(null, '', u);
}

async function start() {
  installTips(document.body);
  const tabs = document.getElementById('tabs');
  for (const v of VIEWS) tabs.append(el('a', { href: `#/${v.id}`, 'data-view': v.id, text: v.title }));
  try {
    const res = await api('v1/models');
    state.models = res.models || [];
    // /v1/models lists "analyses" on servers that also have /v1/capabilities;
    // asking only then keeps older servers free of 404s.
    if (state.models.some(m => Array.isArray(m.analyses))) state.capabilities = await api('v1/capabilities');
  } catch (err) {
    document.getElementById('view').replaceChildren(errorBox(err));
    return;
  }
  const select = document.getElementById('model');
  for (const m of state.models) select.append(el('option', { value: m.id, text: m.id }));
  const wanted = new URL(location.href).searchParams.get('model');
  pickModel(wanted && state.models.some(m => m.id === wanted) ? wanted : (state.models.find(m => m.id === 'demo-sst2') || state.models[0] || {}).id);
  if (state.model) select.value = state.model.id;
  select.addEventListener('change', () => { pickModel(select.value); show(); });
  window.addEventListener('hashchange', show);
  document.body.dataset.models = String(state.models.length);
  await show();
}

start();
