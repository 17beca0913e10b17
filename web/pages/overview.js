// The overview page: live tiles (the current sample, every second over
// Server-Sent Events) and charts of the last hour (a point per 10 s).

import { call, eventData, openStream, rows, sessionEnded } from '../api.js';
import { lineChart } from '../charts.js';
import { card, fill, h, num, pct, placeholder, poll } from '../ui.js';
import { usageTable } from './money.js';

const HOUR_MS = 3600 * 1000;
const RETRY_MS = 5000;
const RECENT_MS = 5000;

const pair = (p, a, b) => (p ? `${num(p[a], 0)} / ${num(p[b], 0)} ms` : '–');

// name (data-testid stat-<name>), label, value, tone (warn/bad or none).
const TILES = [
  ['running', 'Running', (s) => num(s.running)],
  ['waiting', 'Waiting', (s) => num(s.waiting), (s) => (s.waiting > 0 ? 'warn' : '')],
  ['tps', 'Output tok/s', (s) => num(s.output_tokens_per_s, 1)],
  ['requests', 'Requests (total)', (s) => num(s.requests_total)],
  ['ttft', 'TTFT p50 / p99', (s) => pair(s.ttft_ms, 'p50', 'p99')],
  ['itl', 'ITL p50 / p99', (s) => pair(s.itl_ms, 'p50', 'p99')],
  ['kv', 'KV cache use', (s) => pct(s.kv_cache_usage), (s) => (s.kv_cache_usage > 0.9 ? 'warn' : '')],
  ['prefix', 'Prefix-cache hits', (s) => pct(s.prefix_cache_hit_rate)],
  ['cache', 'Response-cache hits', (s) => pct(s.response_cache_hit_rate)],
  ['errors', 'Errors 5xx / 4xx (10 s)', (s) => `${num(s.server_errors)} / ${num(s.client_errors)}`,
    (s) => (s.server_errors > 0 ? 'bad' : '')],
  ['workers', 'Workers', (s) => num(s.workers)],
];

const f1 = (v) => num(v, 1);
const f0 = (v) => num(v, 0);
const p0 = (v) => pct(v, 0);
const series = (hist, label, get) => ({ label, points: hist.map((s) => [s.t, get(s) ?? null]) });

function charts(hist) {
  return [
    lineChart('Output tokens/s', [series(hist, 'tok/s', (s) => s.output_tokens_per_s)], { fmt: f1 }),
    lineChart('Running and waiting', [
      series(hist, 'running', (s) => s.running), series(hist, 'waiting', (s) => s.waiting)], { fmt: f0 }),
    lineChart('TTFT (ms)', [
      series(hist, 'p50', (s) => s.ttft_ms?.p50), series(hist, 'p99', (s) => s.ttft_ms?.p99)], { fmt: f0 }),
    lineChart('KV cache use', [series(hist, 'KV', (s) => s.kv_cache_usage)], { fmt: p0 }),
    lineChart('Cache hit rates', [
      series(hist, 'prefix', (s) => s.prefix_cache_hit_rate),
      series(hist, 'response', (s) => s.response_cache_hit_rate)], { fmt: p0 }),
    lineChart('Errors per 10 s', [
      series(hist, '5xx', (s) => s.server_errors), series(hist, '4xx', (s) => s.client_errors)], { fmt: f0 }),
  ];
}

let active = null;

function buildView(main) {
  const values = {};
  const tiles = TILES.map(([name, label]) => {
    values[name] = h('div', { class: 'value', 'data-testid': `stat-${name}` }, '–');
    return h('div', { class: 'tile' }, h('div', { class: 'label' }, label), values[name]);
  });
  const live = h('span', { class: 'live', 'data-testid': 'live' }, 'connecting');
  const chartBox = h('div', { class: 'grid charts' });
  const recent = placeholder({ 'data-testid': 'recent-requests' });
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'Overview'), live),
    h('div', { class: 'grid tiles' }, tiles),
    card('The last hour', chartBox),
    card('Recent requests (every executor)', recent));
  return {
    values, live, chartBox, recent, history: [], streamed: false, stream: null, timer: null, closed: false,
    stopRecent: () => {},
  };
}

function showSample(view, s) {
  for (const [name, , value, tone] of TILES) {
    const el = view.values[name];
    el.textContent = value(s);
    el.parentElement.className = `tile ${tone?.(s) ?? ''}`.trim();
  }
}

function showHistory(view) {
  fill(view.chartBox, charts(view.history));
}

function setLive(view, text, on) {
  view.live.textContent = text;
  view.live.className = on ? 'live on' : 'live';
}

function takeOverview(view, o) {
  view.history = o.history ?? [];
  showSample(view, o.current);
  showHistory(view);
}

function takeSample(view, s) {
  showSample(view, s);
  // A point the history already has (it came with the overview) is not added twice.
  if (!s.point || (view.history.length && s.t <= view.history.at(-1).t)) return;
  view.history.push(s);
  const since = s.t - HOUR_MS;
  while (view.history.length && view.history[0].t < since) view.history.shift();
  showHistory(view);
}

// EventSource reconnects by itself after a network error; a refused
// stream (a 401, say) is closed for good: retry after a GET, which
// sends an ended session back to the sign-in view. The server says
// `ended` before it closes the stream of an expired or signed-out session.
function connect(view) {
  const es = openStream('overviewStream');
  view.stream = es;
  es.addEventListener('open', () => setLive(view, 'live', true));
  es.addEventListener('overview', (ev) => {
    view.streamed = true;
    takeOverview(view, eventData(ev));
  });
  es.addEventListener('sample', (ev) => takeSample(view, eventData(ev)));
  es.addEventListener('ended', () => ended(view, es));
  es.addEventListener('error', () => {
    if (es.readyState !== EventSource.CLOSED) {
      setLive(view, 'reconnecting', false);
      return;
    }
    setLive(view, 'offline', false);
    view.timer = setTimeout(() => retry(view), RETRY_MS);
  });
}

// The stream's session ended (expired, or signed out). The cookie may
// meanwhile hold another tab's newer session: then the GET succeeds and
// the stream is opened again; otherwise back to the sign-in view.
async function ended(view, es) {
  es.close();
  setLive(view, 'offline', false);
  try {
    takeOverview(view, await call('overview'));
  } catch {
    if (!view.closed) sessionEnded();
    return;
  }
  if (!view.closed) connect(view);
}

async function retry(view) {
  try {
    takeOverview(view, await call('overview'));
  } catch {
    if (!view.closed) view.timer = setTimeout(() => retry(view), RETRY_MS);
    return;
  }
  if (!view.closed) connect(view);
}

// The request log's last rows, names where the accounts and keys have them.
async function showRecent(view) {
  const [usage, accounts, keys] = await Promise.all([
    call('usage', { query: { limit: 10 } }), call('listAccounts'), call('listKeys')]);
  const names = new Map([...rows(accounts).map((a) => [a.id, a.name]), ...rows(keys).map((k) => [k.id, k.name])]);
  fill(view.recent, usageTable(rows(usage), names));
}

export async function render(main) {
  const view = buildView(main);
  active = view;
  view.stopRecent = poll(() => showRecent(view), RECENT_MS);
  showRecent(view).catch(() => {});
  connect(view);
  const first = await call('overview');
  if (!view.streamed) takeOverview(view, first);
}

export function dispose() {
  if (!active) return;
  active.closed = true;
  active.stopRecent();
  active.stream?.close();
  clearTimeout(active.timer);
  active = null;
}
