// The market page: prices per model and phase; for one instrument its
// book (depth), trades, price history and resting orders (cancel any);
// posting an ask for a provider; region electricity prices; provider
// cost profiles.

import { call, rows } from '../api.js';
import { depthChart, lineChart } from '../charts.js';
import {
  action, amount, badge, bps, card, datalist, dur, fill, flash, flashError, form, h, int, money, moneyText, num,
  placeholder, poll, shortId,
  redraw, table, time,
} from '../ui.js';

const REFRESH_MS = 5000;
let stop = () => {};

// Prices as chart values (units, floats: for drawing only) and labels.
const fmtPrice = (v) => moneyText(v.toFixed(10));
const pricesOf = (p) => [money(p.input), ' / ', money(p.output), ' / ', money(p.cached_input)];

function pricesTable(list, choose) {
  return table([
    { label: 'Model', cell: (m) => h('button', { type: 'button', class: 'link', onclick: () => choose(m.model) }, m.model) },
    { label: 'Input / output / cached (per M tokens)', cell: (m) => pricesOf(m.prices) },
    { label: 'Preemptible', cell: (m) => pricesOf(m.preemptible_prices) },
    { label: 'Demand', num: true, cell: (m) => `${num(m.demand_bps / 10000, 2)}×` },
    { label: 'Fee', num: true, cell: (m) => bps(m.fee_bps) },
    { label: 'Best bid', num: true, cell: (m) => money(m.spot.best_bid) },
    { label: 'Best ask', num: true, cell: (m) => money(m.spot.best_ask) },
    { label: 'Last trade', num: true, cell: (m) => money(m.spot.last_trade) },
  ], list, { rowAttrs: (m) => ({ 'data-model': m.model }), empty: 'No text model is served.' });
}

const levelColumns = [
  { label: 'Price', num: true, cell: (l) => money(l.price) },
  { label: 'Tok/s', num: true, cell: (l) => num(l.quantity) },
  { label: 'Orders', num: true, cell: (l) => num(l.orders) },
];

function bookView(spot) {
  const spread = spot.best_bid !== null && spot.best_bid !== undefined && spot.best_ask !== null && spot.best_ask !== undefined
    ? fmtPrice(Number(spot.best_ask) - Number(spot.best_bid)) : '–';
  return [
    h('p', { class: 'sub' }, 'Best bid ', money(spot.best_bid), ' · best ask ', money(spot.best_ask),
      ` · spread ${spread} · last trade `, money(spot.last_trade)),
    depthChart(spot.bids, spot.asks, fmtPrice),
    h('div', { class: 'split' },
      h('div', {}, h('h3', {}, 'Bids'), table(levelColumns, spot.bids, { empty: 'No bids.' })),
      h('div', {}, h('h3', {}, 'Asks'), table(levelColumns, spot.asks, { empty: 'No asks.' }))),
  ];
}

function historyView(points) {
  const pts = [...points].reverse();
  const line = (label, key) => ({ label, points: pts.map((p) => [p.at, Number(p[key])]) });
  return lineChart('Posted prices (per M tokens)',
    [line('output', 'output'), line('input', 'input'), line('cached', 'cached_input')], { fmt: fmtPrice, unit: 's' });
}

const tradesTable = (list) => table([
  { label: 'Time', cls: 'nw', cell: (t) => time(t.created_at) },
  { label: 'Price', num: true, cell: (t) => money(t.price) },
  { label: 'Tok/s', num: true, cell: (t) => num(t.quantity) },
  { label: 'Bid', cell: (t) => shortId(t.bid_id) },
  { label: 'Ask', cell: (t) => shortId(t.ask_id) },
], list, { empty: 'No trades yet.' });

function ordersTable(list, refresh) {
  return table([
    { label: 'Order', cell: (o) => [badge(o.side), ' ', shortId(o.id), o.interruptible ? ' preemptible' : ''] },
    { label: 'Account', cell: (o) => shortId(o.account_id) },
    { label: 'Price', num: true, cell: (o) => money(o.price) },
    { label: 'Tok/s left', num: true, cell: (o) => `${num(o.remaining)} of ${num(o.quantity)}` },
    { label: 'Expires', cls: 'nw', cell: (o) => h('span', { title: `${time(o.expires_at)}, priority ${o.priority}` },
      `in ${dur(o.expires_at - Date.now() / 1000)}`) },
    { label: '', cell: (o) => action('Cancel', async () => {
      await call('cancelOrder', { params: { id: o.id } });
      flash(`Order ${o.id} cancelled.`);
      await refresh();
    }, {
      confirm: `Cancel the ${o.side} ${o.id} of ${o.account_id}? Its remaining ${num(o.remaining)} tok/s leave the book.`,
      cls: 'danger',
      testid: 'cancel',
    }) },
  ], list, { rowAttrs: (o) => ({ 'data-order-id': o.id }), empty: 'No resting orders.' });
}

function askForm(v) {
  return form({
    name: 'post-ask',
    submit: 'Post ask',
    fields: [
      { name: 'instrument', label: 'Model', required: true, list: 'market-models' },
      { name: 'account_id', label: 'Provider account', required: true, list: 'market-providers', placeholder: 'provider:...' },
      { name: 'price', label: 'Price per M tokens', type: 'amount', required: true },
      { name: 'quantity', label: 'Tok/s', type: 'number', min: 1, required: true },
      { name: 'expires_in', label: 'Expires in (s, default 3600)', type: 'number', min: 1 },
      { name: 'interruptible', label: 'Preemptible', type: 'checkbox' },
    ],
    onSubmit: async (x) => {
      const placed = await call('postAsk', { body: {
        instrument: x.instrument, account_id: x.account_id, price: amount(x.price, 'Price'),
        quantity: int(x.quantity, 'Tok/s'), expires_in: int(x.expires_in, 'Expires in'),
        interruptible: x.interruptible,
      } });
      flash(`Ask ${placed.order.id} placed with ${placed.fills.length} fill(s).`);
      if (x.instrument === v.instrument) await refreshInstrument(v);
    },
  });
}

function regionsTable(regions, refresh) {
  const list = Object.entries(regions).sort(([a], [b]) => a.localeCompare(b));
  return table([
    { label: 'Region', cell: ([r]) => r },
    { label: 'Electricity (per kWh)', cell: ([r, p]) => form({
      name: 'region-price', cls: 'inline tight', submit: 'Set',
      fields: [{ name: 'price_per_kwh', label: '', type: 'amount', required: true, value: p }],
      onSubmit: async (x) => {
        await call('setRegion', { params: { region: r }, body: { price_per_kwh: amount(x.price_per_kwh, 'Price') } });
        flash(`Region ${r} set to ${x.price_per_kwh} per kWh.`);
        await refresh();
      },
    }) },
  ], list, { rowAttrs: ([r]) => ({ 'data-region': r }), empty: 'No regions.' });
}

function newRegionForm(refresh) {
  return form({
    name: 'add-region', submit: 'Add region',
    fields: [
      { name: 'region', label: 'Region', required: true },
      { name: 'price_per_kwh', label: 'Price per kWh', type: 'amount', required: true },
    ],
    onSubmit: async (x, f) => {
      await call('setRegion', { params: { region: x.region }, body: { price_per_kwh: amount(x.price_per_kwh, 'Price') } });
      f.reset();
      flash(`Region ${x.region} added.`);
      await refresh();
    },
  });
}

// CostProfile fields: name, form label, table heading.
const PROFILE_FIELDS = [
  ['region', 'Region', 'Region'], ['watts', 'Watts', 'W'], ['pue_milli', 'PUE ×1000', 'PUE‰'],
  ['depreciation_per_hour', 'Depreciation/h', 'Depr./h'], ['network_per_hour', 'Network/h', 'Net/h'],
  ['prefill_tokens_per_hour', 'Prefill tok/h', 'Prefill tok/h'], ['decode_tokens_per_hour', 'Decode tok/h', 'Decode tok/h'],
  ['cached_bps', 'Cached price (bps of input)', 'Cached bps'],
  ['preemptible_discount_bps', 'Preemptible discount (bps)', 'Preempt. bps'],
];

// Fields that are not whole numbers.
const FIELD_TYPE = { region: 'text', depreciation_per_hour: 'amount', network_per_hour: 'amount' };

function providerForm(p, refresh) {
  return form({
    name: 'provider-profile', submit: 'Save profile',
    fields: [
      { name: 'id', label: 'Provider account', required: true, value: p?.account_id ?? '', placeholder: 'provider:...' },
      ...PROFILE_FIELDS.map(([k, label]) => ({
        name: k, label, required: true, type: FIELD_TYPE[k] ?? 'number', list: k === 'region' ? 'market-regions' : null,
        value: p ? String(p.profile[k]) : '',
      })),
    ],
    onSubmit: async (x) => {
      const profile = { region: x.region };
      for (const [k, label] of PROFILE_FIELDS.slice(1)) {
        profile[k] = FIELD_TYPE[k] === 'amount' ? amount(x[k], label) : int(x[k], label);
      }
      await call('setProvider', { params: { id: x.id }, body: { profile } });
      flash(`Cost profile of ${x.id} saved.`);
      await refresh();
    },
  });
}

function providersTable(list, edit) {
  return table([
    { label: 'Provider', cell: (p) => h('code', {}, p.account_id) },
    ...PROFILE_FIELDS.map(([k, , head]) => (k === 'region'
      ? { label: head, cell: (p) => p.profile.region }
      : { label: head, num: true, cell: (p) => (FIELD_TYPE[k] === 'amount' ? money(p.profile[k]) : num(p.profile[k])) })),
    { label: 'Reputation', num: true, cell: (p) => `${num(p.reputation_bps / 10000, 2)}×` },
    { label: 'Uptime', num: true, cell: (p) => bps(p.uptime_bps) },
    { label: '', cell: (p) => h('button', { type: 'button', class: 'secondary', onclick: () => edit(p) }, 'Edit') },
  ], list, { rowAttrs: (p) => ({ 'data-provider-id': p.account_id }), empty: 'No provider profiles.' });
}

// The 5 s refresh and choosing an instrument can overlap: each refresh
// takes a number, and the answers of an older one are dropped.
async function refreshInstrument(v) {
  const instrument = v.instrument;
  if (!instrument) return;
  const mine = ++v.instrumentRun;
  const q = { query: { instrument, limit: 50 } };
  const [book, trades, history, orders] = await Promise.all([
    call('marketBook', q), call('marketTrades', q),
    call('marketHistory', { query: { instrument, limit: 360 } }), call('listOrders', { query: { instrument } })]);
  if (mine !== v.instrumentRun || instrument !== v.instrument) return;
  redraw(v.book, book, bookView);
  redraw(v.trades, rows(trades), tradesTable);
  redraw(v.history, rows(history), historyView);
  redraw(v.orders, rows(orders), (d) => ordersTable(d, () => refreshInstrument(v)));
}

async function refreshPrices(v) {
  const mine = ++v.pricesRun;
  const list = rows(await call('marketPrices'));
  if (mine !== v.pricesRun) return;
  const models = list.map((m) => m.model);
  if (!v.instrument || !models.includes(v.instrument)) v.instrument = models[0] ?? null;
  redraw(v.prices, list, (d) => pricesTable(d, (m) => choose(v, m)));
  redraw(v.lists.models, models, (d) => datalist('market-models', d));
  redraw(v.picker, models, (d) => d.map((m) => h('option', { value: m }, m)));
  if (v.instrument) v.picker.value = v.instrument;
}

function choose(v, model) {
  v.instrument = model;
  v.picker.value = model;
  refreshInstrument(v).catch(flashError);
}

async function refreshSetup(v) {
  const [regions, providers, accounts] = await Promise.all([
    call('listRegions'), call('listProviders'), call('listAccounts')]);
  const again = () => refreshSetup(v);
  fill(v.regions, regionsTable(regions.regions, again), newRegionForm(again));
  const edit = (p) => fill(v.profileForm, providerForm(p, again));
  fill(v.providers, providersTable(rows(providers), edit));
  if (!v.profileForm.firstChild) edit(null);
  fill(v.lists.regions, datalist('market-regions', Object.keys(regions.regions)));
  fill(v.lists.providers, datalist('market-providers',
    rows(accounts).filter((a) => a.kind === 'provider').map((a) => a.id)));
}

function build(main) {
  const v = {
    instrument: null, instrumentRun: 0, pricesRun: 0,
    prices: placeholder(), book: placeholder(), trades: placeholder(), history: placeholder(), orders: placeholder(),
    regions: placeholder(), providers: placeholder(), profileForm: h('div'), picker: h('select', { name: 'instrument' }),
    lists: { models: h('div'), regions: h('div'), providers: h('div') },
  };
  v.picker.addEventListener('change', () => choose(v, v.picker.value));
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'Market'), h('label', { class: 'picker' }, 'Instrument ', v.picker)),
    v.lists.models, v.lists.regions, v.lists.providers,
    card('Prices', v.prices),
    h('div', { class: 'split' }, card('Order book', v.book), card('Price history', v.history)),
    h('div', { class: 'split' }, card('Resting orders', v.orders), card('Recent trades', v.trades)),
    card('Post an ask for a provider', askForm(v)),
    card('Regions', v.regions),
    card('Provider cost profiles', v.providers, h('h3', {}, 'Set a profile'), v.profileForm));
  return v;
}

async function refreshMarket(v) {
  await refreshPrices(v);
  await refreshInstrument(v);
}

export async function render(main) {
  const v = build(main);
  stop = poll(() => refreshMarket(v), REFRESH_MS);
  await Promise.all([refreshMarket(v), refreshSetup(v)]);
}

export function dispose() {
  stop();
  stop = () => {};
}
