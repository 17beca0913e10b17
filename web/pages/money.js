// The money page: the ledger audit, accounts (create, top up, credit
// limit, provider penalties), the journal and usage records (filtered).

import { call, rows } from '../api.js';
import { lineChart } from '../charts.js';
import {
  action, amount, badge, card, datalist, fill, flash, form, h, int, money, moneyText, named, num, placeholder, shortId,
  table, time, values,
} from '../ui.js';

const KINDS = [['', 'any kind'], ['topup', 'topup'], ['usage', 'usage'], ['trade', 'trade'],
  ['penalty', 'penalty'], ['clawback', 'clawback']];

function auditView(a, rerun) {
  const again = action('Audit again', rerun);
  if (a.violations.length) {
    return h('div', { class: 'violations', 'data-testid': 'audit-violations', role: 'alert' },
      h('strong', {}, `The ledger fails its audit: ${a.violations.length} violation(s)`),
      h('ul', {}, a.violations.map((v) => h('li', {}, v))), again);
  }
  return h('p', { class: 'quiet', 'data-testid': 'audit-ok' },
    `Ledger balanced: ${num(a.transactions)} transactions, ${num(a.open_holds)} open holds. `, again);
}

function topUpForm(a, done) {
  return form({
    name: 'topup', cls: 'inline tight', submit: 'Top up',
    fields: [
      { name: 'amount', label: '', type: 'amount', required: true },
      { name: 'memo', label: '', placeholder: 'memo' },
    ],
    onSubmit: async (x, f) => {
      const moved = await call('topUp', { params: { id: a.id }, body: { amount: amount(x.amount, 'Amount'), memo: x.memo } });
      f.reset();
      flash(`Topped up ${a.name}: balance now ${moneyText(moved.account.balance)}.`);
      await done();
    },
  });
}

function accountsTable(list, v) {
  return table([
    { label: 'Name', cell: (a) => h('strong', {}, a.name) },
    { label: 'Account', cell: (a) => shortId(a.id) },
    { label: 'Kind', cell: (a) => badge(a.kind) },
    { label: 'Balance', num: true, cell: (a) => h('span', { 'data-testid': 'balance' }, money(a.balance)) },
    { label: 'Held', num: true, cell: (a) => money(a.held) },
    { label: 'Credit limit', num: true, cell: (a) => (a.unlimited ? 'unlimited' : money(a.credit_limit)) },
    { label: 'Created', cls: 'nw', cell: (a) => time(a.created_at) },
    { label: 'Top up', cell: (a) => (a.kind === 'user' || a.kind === 'provider' ? topUpForm(a, v.refresh) : '') },
    { label: '', cell: (a) => h('button', { type: 'button', class: 'secondary', onclick: () => manage(v, a) }, 'Manage') },
  ], list, { rowAttrs: (a) => ({ 'data-account-id': a.id }), empty: 'No accounts.' });
}

function closeManage(v) {
  v.managing = null;
  fill(v.manage);
}

// The Manage panel of account a; refresh() builds it again from the fresh
// account after every change.
function manage(v, a) {
  v.managing = a.id;
  const creditForm = form({
    name: 'credit-limit', submit: 'Set credit limit',
    fields: [{ name: 'credit_limit', label: 'Credit limit', type: 'amount', required: true, value: a.credit_limit }],
    onSubmit: async (x) => {
      await call('updateAccount', { params: { id: a.id }, body: { credit_limit: amount(x.credit_limit, 'Credit limit') } });
      flash(`Credit limit of ${a.name} set.`);
      await v.refresh();
    },
  });
  const penaltyForm = a.kind === 'provider' && form({
    name: 'penalty', submit: 'Apply penalty',
    fields: [
      { name: 'amount', label: 'Penalty', type: 'amount', required: true },
      { name: 'memo', label: 'Reason' },
    ],
    onSubmit: async (x, f) => {
      await call('penalty', { params: { id: a.id }, body: { amount: amount(x.amount, 'Penalty'), memo: x.memo } });
      f.reset();
      flash(`Penalty taken from ${a.name}.`);
      await v.refresh();
    },
  });
  fill(v.manage, h('div', { class: 'panel', 'data-account-id': a.id },
    h('h3', {}, `${a.name} `, h('code', {}, a.id)), creditForm, penaltyForm,
    h('button', { type: 'button', class: 'secondary', onclick: () => closeManage(v) }, 'Close')));
}

function createForm(v) {
  return form({
    name: 'create-account', submit: 'Create account',
    fields: [
      { name: 'name', label: 'Name', required: true },
      { name: 'kind', label: 'Kind', options: [['user', 'user'], ['provider', 'provider']] },
      { name: 'credit_limit', label: 'Credit limit (optional)', type: 'amount' },
    ],
    onSubmit: async (x, f) => {
      const a = await call('createAccount', { body: {
        name: x.name, kind: x.kind, credit_limit: amount(x.credit_limit, 'Credit limit') } });
      f.reset();
      flash(`Account ${a.name} created: ${a.id}.`);
      await v.refresh();
    },
  });
}

function entries(t, names) {
  return Object.entries(t.entries).map(([id, amount]) => h('div', { class: 'sub' },
    `${names.get(id) ?? id}: `, h('span', { class: String(amount).startsWith('-') ? 'neg' : 'pos' }, money(amount))));
}

const journalTable = (list, names) => table([
  { label: 'Time', cls: 'nw', cell: (t) => time(t.created_at) },
  { label: 'Kind', cell: (t) => t.kind },
  { label: 'Memo', cell: (t) => t.memo },
  { label: 'Request', cell: (t) => (t.ref ? h('code', {}, t.ref) : '–') },
  { label: 'Entries', cell: (t) => entries(t, names) },
], list, { rowAttrs: (t) => ({ 'data-transaction-id': t.id }), empty: 'No transactions.' });

/** The request log: recent requests with their outcome, model, executor,
 * tokens and cost (names where there are names). */
export const usageTable = (list, names) => table([
  { label: 'Time', cls: 'nw', cell: (u) => time(u.created_at) },
  { label: 'Request', cell: (u) => shortId(u.request_id) },
  { label: 'Outcome', cell: (u) => badge(u.outcome) },
  { label: 'Model', cell: (u) => u.model },
  { label: 'Key', cell: (u) => (u.key_id ? named(names, u.key_id) : '–') },
  { label: 'Tokens in (cached) / out', num: true,
    cell: (u) => `${num(u.prompt_tokens)} (${num(u.cached_tokens)}) / ${num(u.completion_tokens)}` },
  { label: 'Cost', num: true, cell: (u) => h('span', { 'data-testid': 'cost' }, money(u.cost)) },
  { label: 'Provider (paid)', cell: (u) => [named(names, u.provider_id), ' ', money(u.provider_amount)] },
  { label: 'Fee', num: true, cell: (u) => money(u.fee) },
  { label: 'Executor', cell: (u) => (u.prefill_by || u.decode_by
    ? (u.prefill_by === u.decode_by ? u.decode_by : `${u.prefill_by || '–'} → ${u.decode_by || '–'}`) : 'cache') },
], list, { rowAttrs: (u) => ({ 'data-request-id': u.request_id }), empty: 'No usage records.' });

/** Spend per hour over the last day, as a chart. */
function spendChart(buckets, title) {
  const points = buckets.map((b) => [b.at, Number(b.cost)]);
  return lineChart(title, [{ label: 'spent', points }],
    { fmt: (v) => moneyText(v.toFixed(10)), unit: 's', width: 900, height: 150 });
}

async function loadJournal(v, x) {
  const query = { account: x.account, kind: x.kind, limit: int(x.limit, 'Rows') };
  fill(v.journal, journalTable(rows(await call('journal', { query })), v.names));
}

async function loadUsage(v, x) {
  const query = { account: x.account, key: x.key, limit: int(x.limit, 'Rows') };
  const spendQuery = { account: x.account, key: x.key, hours: 24 };
  const [usage, spend] = await Promise.all([call('usage', { query }), call('spend', { query: spendQuery })]);
  const who = [x.account && (v.names.get(x.account) ?? x.account), x.key].filter(Boolean).join(', ');
  fill(v.usage, spendChart(rows(spend), `Spend per hour, last 24 h${who ? ` (${who})` : ' (all accounts)'}`),
    usageTable(rows(usage), v.names));
}

function build(main) {
  const v = {
    audit: placeholder(), accounts: placeholder(), manage: h('div'), managing: null,
    journal: placeholder(), usage: placeholder(), lists: h('div'), names: new Map(),
  };
  const limit = { name: 'limit', label: 'Rows', type: 'number', min: 1, max: 1000, value: '50' };
  const account = { name: 'account', label: 'Account', list: 'money-accounts', placeholder: 'any' };
  v.journalFilter = form({
    name: 'journal-filter', submit: 'Show',
    fields: [account, { name: 'kind', label: 'Kind', options: KINDS }, limit],
    onSubmit: (x) => loadJournal(v, x),
  });
  v.usageFilter = form({
    name: 'usage-filter', submit: 'Show',
    fields: [account, { name: 'key', label: 'Key id', placeholder: 'any' }, limit],
    onSubmit: (x) => loadUsage(v, x),
  });
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'Money')),
    v.audit, v.lists,
    card('Accounts', v.accounts, v.manage, h('h3', {}, 'New account'), createForm(v)),
    card('Journal', v.journalFilter, v.journal),
    card('Requests and spend', v.usageFilter, v.usage));
  return v;
}

// Everything a change can move: the audit, the accounts (and the open
// Manage panel), the journal and the usage records.
async function refresh(v) {
  const [audit, accounts, keys] = await Promise.all([call('audit'), call('listAccounts'), call('listKeys')]);
  const list = rows(accounts);
  v.names = new Map([...list.map((a) => [a.id, a.name]), ...rows(keys).map((k) => [k.id, k.name])]);
  fill(v.audit, auditView(audit, () => refresh(v)));
  fill(v.accounts, accountsTable(list, v));
  fill(v.lists, datalist('money-accounts', list.map((a) => a.id)));
  if (v.managing) {
    const fresh = list.find((a) => a.id === v.managing);
    if (fresh) manage(v, fresh);
    else closeManage(v);
  }
  await Promise.all([loadJournal(v, values(v.journalFilter)), loadUsage(v, values(v.usageFilter))]);
}

export async function render(main) {
  const v = build(main);
  v.refresh = () => refresh(v);
  await refresh(v);
}
