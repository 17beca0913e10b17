// The provider's page (/console/provider): a provider signs in with one
// of its worker tokens and sees its balance, payable and pending funds,
// today's earnings, its work and spot checks, earnings over the last day,
// its connected workers and its payouts; it asks for a payout. The token
// lives in this module's memory only (never in storage or a URL) and goes
// as a bearer to the provider routes, which need no cookie and so no CSRF
// token.

import { lineChart } from './charts.js';
import {
  amount, badge, card, fill, flash, flashError, form, h, money, moneyText, num, placeholder, poll, shortId, table,
  time,
} from './ui.js';

const REFRESH_MS = 5000;
const $ = (id) => document.getElementById(id);
let token = null;
let stop = () => {};

/** A provider route with the token; the API's own message on an error. */
async function call(method, path, body) {
  const r = await fetch(path, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = await r.json().catch(() => null);
  if (!r.ok) {
    const e = new Error(data?.error?.message ?? `HTTP ${r.status}`);
    e.status = r.status;
    throw e;
  }
  return data;
}

const TILES = [
  ['balance', 'Balance', (e) => money(e.balance)],
  ['payable', 'Payable now', (e) => money(e.payable)],
  ['pending', 'Pending (clawable)', (e) => money(e.pending)],
  ['today', 'Earned today', (e) => money(e.earned_today)],
  ['jobs', 'Jobs done / lost', (e) => `${num(e.jobs_ok)} / ${num(e.jobs_lost)}`],
  ['checks', 'Spot checks passed / failed', (e) => `${num(e.checks.passed)} / ${num(e.checks.failed)}`],
  ['reputation', 'Reputation', (e) => `${num(e.reputation_bps / 10000, 2)}×`],
];

const tiles = (e) => h('div', { class: 'grid tiles' }, TILES.map(([name, label, value]) =>
  h('div', { class: 'tile' }, h('div', { class: 'label' }, label),
    h('div', { class: 'value', 'data-testid': `provider-${name}` }, value(e)))));

const workersTable = (list) => table([
  { label: 'Worker', cell: (w) => [h('strong', {}, w.name), ' ', shortId(w.id)] },
  { label: 'State', cell: (w) => badge(w.state) },
  { label: 'Running', num: true, cell: (w) => num(w.jobs_running) },
  { label: 'Tokens delivered', num: true, cell: (w) => num(w.tokens_delivered) },
  { label: 'Lost', num: true, cell: (w) => num(w.jobs_lost) },
], list, { rowAttrs: (w) => ({ 'data-worker-id': w.id }), empty: 'No worker connected: run synor worker with this token.' });

const payoutsTable = (list, account) => table([
  { label: 'Time', cls: 'nw', cell: (t) => time(t.created_at) },
  { label: 'Paid out', num: true, cell: (t) => money(String(t.entries[account] ?? '0').replace(/^-/, '')) },
  { label: 'Memo', cell: (t) => t.memo || '–' },
  { label: 'Transaction', cell: (t) => shortId(t.id) },
], list, { rowAttrs: (t) => ({ 'data-transaction-id': t.id }), empty: 'No payouts yet.' });

function earningsChart(buckets) {
  const points = buckets.map((b) => [b.at, Number(b.earned)]);
  return lineChart('Earned per hour, last 24 h', [{ label: 'earned', points }],
    { fmt: (v) => moneyText(v.toFixed(10)), unit: 's', width: 900, height: 150 });
}

function payoutForm(v) {
  return form({
    name: 'payout', submit: 'Pay out',
    fields: [
      { name: 'amount', label: 'Amount', type: 'amount', required: true },
      { name: 'memo', label: 'Where it goes (for the record)' },
    ],
    onSubmit: async (x, f) => {
      const done = await call('POST', '/v1/providers/payouts', { amount: amount(x.amount, 'Amount'), memo: x.memo });
      f.reset();
      flash(`Paid out ${moneyText(x.amount)}: balance now ${moneyText(done.account.balance)}.`);
      await refresh(v);
    },
  });
}

async function refresh(v) {
  const [e, history, payouts] = await Promise.all([
    call('GET', '/v1/providers/earnings'),
    call('GET', '/v1/providers/earnings/history?hours=24'),
    call('GET', '/v1/providers/payouts?limit=50'),
  ]);
  $('app-view').querySelector('[data-testid="provider-name"]').textContent = `${e.name} (${e.provider_id})`;
  fill(v.tiles, tiles(e));
  fill(v.chart, earningsChart(history.data));
  fill(v.workers, workersTable(e.workers));
  fill(v.payouts, payoutsTable(payouts.data, e.provider_id));
}

function build() {
  const v = { tiles: placeholder(), chart: placeholder(), workers: placeholder(), payouts: placeholder() };
  fill($('main'),
    h('div', { class: 'title' }, h('h1', {}, 'Your earnings')),
    v.tiles,
    card('Earnings over time', v.chart),
    card('Workers', v.workers),
    card('Payouts', h('p', { class: 'quiet' },
      'Earnings stay pending for the server\'s earnings window (a failed spot check can claw them back); then they are payable.'),
    payoutForm(v), v.payouts));
  return v;
}

async function signIn(ev) {
  ev.preventDefault();
  const input = ev.target.elements.token;
  token = input.value.trim();
  const err = document.querySelector('[data-testid="signin-error"]');
  try {
    const v = build();
    await refresh(v);
    input.value = '';
    err.hidden = true;
    $('signin-view').hidden = true;
    $('app-view').hidden = false;
    stop = poll(() => refresh(v), REFRESH_MS);
  } catch (e) {
    token = null;
    err.textContent = e.status === 401 ? 'That is not an active worker token.' : e.message;
    err.hidden = false;
  }
}

function signOut() {
  stop();
  token = null;
  $('app-view').hidden = true;
  $('signin-view').hidden = false;
}

$('signin').addEventListener('submit', (ev) => signIn(ev).catch(flashError));
$('signout').addEventListener('click', signOut);
