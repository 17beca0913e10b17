// The fleet page: connected workers (pause, resume, remove), models
// served as pipelines of workers, executor use and
// the last hour's busy timeline, spot-check records, and worker tokens
// (create with the secret shown once, clear a quarantine, revoke).

import { call, health, rows } from '../api.js';
import { busyStrip } from '../charts.js';
import {
  action, badge, bps, bytes, card, dur, fill, flash, form, h, moneyText, num, pct, placeholder, poll, redraw,
  secretBox, table, time,
} from '../ui.js';

const REFRESH_MS = 5000;
let stop = () => {};

const serverUrl = () => `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}`;
const connectHint = (token = 'swt-synor-...') => h('pre', { class: 'command' },
  `synor worker --server ${serverUrl()} --token ${token}`);
const small = (...c) => h('div', { class: 'sub' }, ...c);
const now = () => Date.now() / 1000;

function device(d) {
  const extra = [d.memory_bytes ? bytes(d.memory_bytes) : '', d.cores ? `${d.cores} cores` : '']
    .filter(Boolean).join(', ');
  return small(`${d.kind} ${d.name}${extra ? ` (${extra})` : ''}${d.usable === false ? ' — unusable' : ''}`);
}

function asks(w) {
  if (!w.asks.length) return [w.models.map((m) => m.name).join(', ') || '–', small('house prices')];
  return w.asks.map((a) => small(`${a.model}: in ${moneyText(a.input)} / out ${moneyText(a.output)}`
    + ` / cached ${moneyText(a.cached_input)}${a.preemptible ? ' (preemptible)' : ''}`));
}

function profile(p) {
  if (!p) return h('span', { class: 'quiet' }, 'not measured');
  return [small(`prefill ${num(p.prefill_tokens_per_s, 0)} tok/s`),
    small(`decode ${num(p.decode_step_ms_1, 1)} / ${num(p.decode_step_ms_4, 1)} ms`)];
}

function workerActions(w, refresh) {
  const paused = w.state === 'paused';
  const toggle = paused
    ? action('Resume', async () => {
      const r = await call('resumeWorker', { params: { id: w.id } });
      flash(`Worker ${w.name} takes work again (${r.state}).`);
      await refresh();
    }, { testid: 'resume' })
    : action('Pause', async () => {
      await call('pauseWorker', { params: { id: w.id } });
      flash(`Worker ${w.name} is paused: no new work; it stays connected until resumed.`);
      await refresh();
    }, { confirm: `Pause worker ${w.name}? It finishes its running work, then waits, connected, until resumed.`, testid: 'pause' });
  toggle.disabled = !paused && w.state !== 'active' && w.state !== 'calibrating';
  const remove = action('Remove', async () => {
    await call('drainWorker', { params: { id: w.id }, query: { now: true } });
    flash(`Worker ${w.name} was removed; its running work is replayed elsewhere.`);
    await refresh();
  }, { confirm: `Remove worker ${w.name} now? It is disconnected at once and its process exits.`, cls: 'danger', testid: 'remove' });
  return h('div', { class: 'actions' }, toggle, remove);
}

const WORKER_COLUMNS = (refresh) => [
  { label: 'Worker', cell: (w) => [h('strong', {}, w.name), small(h('code', {}, w.id)), small(w.remote)] },
  { label: 'Devices', cell: (w) => [...w.devices.map(device), small(`${w.threads} threads`)] },
  { label: 'Models and asks (per M tokens)', cell: asks },
  { label: 'Region', cell: (w) => w.region || '–' },
  { label: 'State', cell: (w) => badge(w.state) },
  { label: 'Standing', cell: (w) => [small(`reputation ${num(w.reputation_bps / 10000, 2)}×`), small(`uptime ${bps(w.uptime_bps)}`)] },
  { label: 'Profile', cell: (w) => profile(w.profile) },
  { label: 'Load', cell: (w) => [small(`${w.load.running} running, ${w.load.queued} queued`),
    small(`step ${num(w.load.step_ms, 1)} ms, rtt ${num(w.rtt_ms ?? 0, 1)} ms`)] },
  { label: 'Work', cell: (w) => [small(`${num(w.jobs_running)} running`),
    small(`${num(w.tokens_delivered)} tokens`), small(`${num(w.jobs_lost)} lost`)] },
  { label: 'Connected', cell: (w) => [small(dur(now() - w.connected_at)), small(`seen ${time(w.last_seen)}`)] },
  { label: '', cell: (w) => workerActions(w, refresh) },
];

// The house engine is an executor too: its text models' load from
// /health (each model's engine statistics, flattened into it), its busy
// share from the overview.
function houseTable(models, busy) {
  const engines = models.filter((m) => m.kind === 'text');
  return [small(`Busy ${busy === undefined ? '–' : pct(busy)} of the last 10 s (time in forward passes).`),
    table([
      { label: 'Model', cell: (m) => h('strong', {}, m.id) },
      { label: 'Running', num: true, cell: (m) => num(m.running) },
      { label: 'Waiting', num: true, cell: (m) => num(m.waiting) },
      { label: 'KV use', num: true, cell: (m) => pct(m.kv_cache_usage) },
      { label: 'KV blocks', num: true, cell: (m) => `${num(m.kv_blocks)} × ${num(m.block_size)}` },
      { label: 'Prefix hits', num: true, cell: (m) => `${num(m.prefix_cache_hits)} / ${num(m.prefix_cache_queries)}` },
    ], engines, { rowAttrs: (m) => ({ 'data-model': m.id }), empty: 'The house serves no text model.' })];
}

function workersTable(workers, refresh) {
  if (!workers.length) {
    return [h('p', {}, 'No workers are connected. A provider connects one with a worker token:'), connectHint()];
  }
  return table(WORKER_COLUMNS(refresh), workers, { rowAttrs: (w) => ({ 'data-worker-id': w.id }) });
}

const executorName = (e) => (e === 'house' ? 'house (built-in engine)' : e);

function utilizationTable(list) {
  return table([
    { label: 'Executor', cell: (u) => executorName(u.executor) },
    { label: 'Running', num: true, cell: (u) => num(u.running) },
    { label: 'Busy 1 min', num: true, cell: (u) => pct(u.busy_1m) },
    { label: 'Busy 5 min', num: true, cell: (u) => pct(u.busy_5m) },
    { label: 'Trend', num: true, cell: (u) => `${u.trend >= 0 ? '+' : ''}${pct(u.trend)}` },
    { label: 'KV transfer', num: true, cell: (u) => pct(u.transferring) },
  ], list, { rowAttrs: (u) => ({ 'data-executor': u.executor }), empty: 'No executor has run anything yet.' });
}

function timeline(history) {
  const names = [...new Set(history.flatMap((s) => s.executors.map((e) => e.executor)))];
  if (!names.length) return h('p', { class: 'quiet' }, 'No executor activity in the last hour.');
  return table([
    { label: 'Executor', cell: (n) => executorName(n) },
    { label: 'Busy over the last hour (darker: busier)', cell: (n) => busyStrip(history.map(
      (s) => s.executors.find((e) => e.executor === n)?.busy ?? null)) },
  ], names);
}

// Models served as pipelines of workers: each one's chains (a lane each,
// on workers of its own), stage by stage, with what the server measured
// of its steps.
function pipelinesTable(list) {
  const stage = (s) => small(`${s.first}–${s.end - 1}: `, h('code', {}, s.worker),
    ` step ${num(s.measured.step_ms, 1)} ms, ${num(s.measured.speed, 1)} layer-tokens/ms, ${num(s.measured.tokens)} tokens`);
  const chain = (c) => [
    h('strong', {}, `chain ${num(c.lane + 1)} (#${num(c.epoch)}): ${num(c.running)} running, ${num(c.waiting)} waiting`),
    ...c.stages.map(stage)];
  return table([
    { label: 'Model', cell: (p) => [h('strong', {}, p.model), small(`${num(p.layers)} layers, ${num(p.chains.length)} chains`)] },
    { label: 'Stages', cell: (p) => (p.chains.length
      ? p.chains.flatMap(chain)
      : h('span', { class: 'bad-text' }, 'no chain: the workers offering parts cannot hold every layer')) },
    { label: 'Offered by', cell: (p) => small(`${num(p.offered_by.length)} workers`) },
  ], list, { rowAttrs: (p) => ({ 'data-pipeline': p.model }), empty: 'No model is served as a pipeline (--pipeline-model).' });
}

function spotTable(list) {
  return table([
    { label: 'Worker', cell: (c) => h('code', {}, c.worker_id) },
    { label: 'Provider', cell: (c) => c.provider_id },
    { label: 'Checked', num: true, cell: (c) => num(c.checked) },
    { label: 'Passed', num: true, cell: (c) => num(c.passed) },
    { label: 'Failed', num: true, cell: (c) => (c.failed ? h('span', { class: 'bad-text' }, num(c.failed)) : '0') },
    { label: 'Last failure', cell: (c) => c.last_failure ?? '–' },
  ], list, { empty: 'No spot checks yet.' });
}

// A token is revoked (for good), quarantined (until an admin clears it:
// a check caught one of its workers) or active.
function tokenState(t) {
  if (t.revoked_at) return 'revoked';
  return t.quarantined_at ? 'quarantined' : 'active';
}

function tokensTable(list, refresh) {
  return table([
    { label: 'Name', cell: (t) => t.name },
    { label: 'Prefix', cell: (t) => h('code', {}, t.prefix) },
    { label: 'Provider account', cell: (t) => h('code', {}, t.account_id) },
    { label: 'Created', cls: 'nw', cell: (t) => time(t.created_at) },
    { label: 'State', cell: (t) => badge(tokenState(t)) },
    { label: 'Why', cell: (t) => (t.quarantined_at && !t.revoked_at ? t.quarantine_reason : '') },
    { label: '', cell: (t) => (t.revoked_at ? '' : h('span', {}, [
      t.quarantined_at ? action('Clear quarantine', async () => {
        await call('clearQuarantine', { params: { id: t.id } });
        flash(`Token ${t.name} may connect again.`);
        await refresh();
      }, { confirm: `Clear the quarantine of ${t.name}? Its workers may connect again and are calibrated afresh.`, testid: 'clear-quarantine' }) : '',
      action('Revoke', async () => {
        await call('revokeWorkerToken', { params: { id: t.id } });
        flash(`Token ${t.name} revoked.`);
        await refresh();
      }, { confirm: `Revoke worker token ${t.name}? Its live workers are closed and cannot reconnect.`, cls: 'danger', testid: 'revoke' }),
    ])) },
  ], list, { rowAttrs: (t) => ({ 'data-token-id': t.id }), empty: 'No worker tokens.' });
}

function tokenForm(created, refresh) {
  return form({
    name: 'create-provider',
    submit: 'Create token',
    fields: [
      { name: 'name', label: 'Name (a new provider, or the token\'s name)', required: true },
      { name: 'account_id', label: 'Existing provider account (optional)', placeholder: 'provider:...' },
    ],
    onSubmit: async (v, f) => {
      const t = await call('createProvider', { body: { name: v.name, account_id: v.account_id || undefined } });
      f.reset();
      fill(created, secretBox(t.token), h('p', {}, 'Its worker connects with:'), connectHint(t.token));
      flash(`Worker token ${t.name} created for ${t.account_id}.`);
      await refresh();
    },
  });
}

function build(main) {
  const v = {
    workers: placeholder(), house: placeholder({ 'data-testid': 'house' }), use: placeholder(),
    timeline: placeholder(), spot: placeholder(), tokens: placeholder(), created: h('div'),
    pipelines: placeholder(),
  };
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'Fleet')),
    card('Workers', v.workers),
    card('House engine', v.house),
    card('Pipelines', v.pipelines),
    card('Executors', v.use),
    card('Busy timeline', v.timeline),
    card('Spot checks', v.spot),
    card('Worker tokens', v.tokens, v.created));
  return v;
}

// One overview answer gives both the house's busy share and the timeline.
async function refreshFleet(v) {
  const [workers, use, spot, hl, overview, pipes] = await Promise.all([
    call('listWorkers'), call('utilization'), call('spotChecks'), health(), call('overview'),
    call('pipelines')]);
  redraw(v.pipelines, rows(pipes), pipelinesTable);
  redraw(v.workers, rows(workers), (d) => workersTable(d, () => refreshFleet(v)));
  const busy = overview.current.executors.find((e) => e.executor === 'house')?.busy;
  redraw(v.house, { models: hl.models ?? [], busy }, (d) => houseTable(d.models, d.busy));
  redraw(v.use, rows(use), utilizationTable);
  redraw(v.timeline, overview.history ?? [], timeline);
  redraw(v.spot, rows(spot), spotTable);
}

async function refreshTokens(v, tokenBox) {
  const list = rows(await call('listWorkerTokens'));
  fill(tokenBox, tokensTable(list, () => refreshTokens(v, tokenBox)));
}

export async function render(main) {
  const v = build(main);
  stop = poll(() => refreshFleet(v), REFRESH_MS);
  const tokenBox = h('div');
  fill(v.tokens, tokenBox, tokenForm(v.created, () => refreshTokens(v, tokenBox)));
  await Promise.all([refreshFleet(v), refreshTokens(v, tokenBox)]);
}

export function dispose() {
  stop();
  stop = () => {};
}
