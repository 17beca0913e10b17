// The /provide page: a provider pastes a worker token, picks a model the
// server serves and when to serve, and this tab becomes a worker. The
// model runs in a Web Worker (provide-worker.js: the engine in
// WebAssembly, the fleet protocol over the page's own WebSocket); this
// page keeps the schedule (open, between two times, while charging) and
// shows the tab's jobs and speed and, from the server that pays, its
// checks and earnings. The token lives in this module's and the
// worker's memory only: never in storage, a cookie or a URL.

import { bytes, h, money, num } from '/console/ui.js';

const $ = (id) => document.getElementById(id);
const form = $('setup');
const REFRESH_MS = 3000;
let token = null;
let worker = null;
let timers = [];
let battery = null;
let last = { counts: null, earnings: null, state: '', loaded: null };

/** A provider route with the token; the API's own message on an error. */
async function call(path) {
  const r = await fetch(path, { headers: { authorization: `Bearer ${token}` } });
  const data = await r.json().catch(() => null);
  if (!r.ok) throw new Error(data?.error?.message ?? `HTTP ${r.status}`);
  return data;
}

function setupError(text) {
  const p = document.querySelector('[data-testid="setup-error"]');
  p.textContent = text;
  p.hidden = !text;
}

async function listModels() {
  token = form.token.value.trim();
  setupError('');
  try {
    const list = await call('/v1/providers/models');
    const select = form.model;
    select.replaceChildren(...list.data.map((m) => h('option', { value: m.id, 'data-bytes': m.bytes },
      `${m.id} (${bytes(m.bytes)})`)));
    select.disabled = list.data.length === 0;
    form.querySelector('[data-testid="start"]').disabled = list.data.length === 0;
    if (list.data.length === 0) setupError('This server serves no model a tab can fetch.');
  } catch (e) {
    setupError(e.message);
  }
}

/** Whether the schedule lets this tab serve now. */
function wanted() {
  const when = form.when.value;
  if (when === 'charging') return battery ? battery.charging : false;
  if (when === 'hours') {
    const mins = (t) => { const [a, b] = t.split(':').map(Number); return a * 60 + b; };
    const now = new Date();
    const m = now.getHours() * 60 + now.getMinutes();
    const [from, until] = [mins(form.from.value || '00:00'), mins(form.until.value || '00:00')];
    return from <= until ? m >= from && m < until : m >= from || m < until;
  }
  return true;
}

const TILES = [
  ['jobs', 'Jobs run here', () => num(last.counts?.jobs ?? 0)],
  ['tokens', 'Tokens generated', () => num(last.counts?.tokens ?? 0)],
  ['speed', 'Tokens a second (busy)', () => {
    const c = last.counts;
    return c && c.busy_ms > 0 ? num(c.tokens / (c.busy_ms / 1000), 2) : '–';
  }],
  ['checks', 'Spot checks passed / failed', () => (last.earnings
    ? `${num(last.earnings.checks.passed)} / ${num(last.earnings.checks.failed)}` : '–')],
  ['today', 'Earned today', () => (last.earnings ? money(last.earnings.earned_today) : '–')],
  ['balance', 'Balance', () => (last.earnings ? money(last.earnings.balance) : '–')],
];

function draw() {
  $('tiles').replaceChildren(...TILES.map(([name, label, value]) => h('div', { class: 'tile' },
    h('div', { class: 'label' }, label), h('div', { class: 'value', 'data-testid': `tab-${name}` }, value()))));
  document.querySelector('[data-testid="state"]').textContent = last.state;
  const l = last.loaded;
  const loaded = document.querySelector('[data-testid="loaded"]');
  loaded.textContent = l ? `Model ready in ${num(l.ms / 1000, 1)} s on ${l.on}: ${l.cached ? 'kept in this browser'
    : `${bytes(l.bytes)} downloaded`}` : '';
  loaded.dataset.cached = l ? String(l.cached) : '';
  loaded.dataset.on = l?.on ?? '';
}

function start(ev) {
  ev.preventDefault();
  const model = form.model.value;
  const size = Number(form.model.selectedOptions[0]?.dataset.bytes ?? 0);
  worker = new Worker('/provide/provide-worker.js', { type: 'module' });
  worker.onmessage = ({ data }) => {
    if (data.counts) last.counts = data.counts;
    if (data.state) last.state = data.state;
    if (data.loaded) last.loaded = data.loaded;
    draw();
  };
  worker.onerror = (e) => { last.state = `The worker failed: ${e.message}`; draw(); };
  worker.postMessage({
    start: {
      token, model, size, device: form.device.value, name: form.name.value || 'browser tab',
      cores: navigator.hardwareConcurrency || 1,
    },
  });
  $('setup-view').hidden = true;
  $('serve-view').hidden = false;
  document.querySelector('[data-testid="serving-model"]').textContent = model;
  const schedule = () => worker?.postMessage({ serve: wanted() });
  schedule();
  const earnings = async () => {
    try { last.earnings = await call('/v1/providers/earnings'); draw(); } catch { /* shown on the next try */ }
  };
  earnings();
  timers = [setInterval(schedule, 30000), setInterval(earnings, REFRESH_MS)];
  battery?.addEventListener('chargingchange', schedule);
  form.addEventListener('change', schedule);
}

function stop() {
  timers.forEach(clearInterval);
  worker?.postMessage({ leave: true });
  setTimeout(() => { worker?.terminate(); worker = null; }, 500);
  token = null;
  form.token.value = '';
  $('serve-view').hidden = true;
  $('setup-view').hidden = false;
}

$('list-models').addEventListener('click', listModels);
form.addEventListener('submit', start);
$('stop').addEventListener('click', stop);
// Closing the tab: say so, so the server replays this tab's jobs at once.
window.addEventListener('pagehide', () => worker?.postMessage({ leave: true }));
if (navigator.getBattery) {
  navigator.getBattery().then((b) => { battery = b; }).catch(() => {});
} else {
  $('battery-note').textContent = '(this browser does not say whether it is charging)';
  document.querySelector('[data-testid="when-charging"]').disabled = true;
}
