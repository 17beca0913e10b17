// The keys page: API keys (create with the secret shown once, list,
// revoke).

import { call, rows } from '../api.js';
import {
  action, amount, badge, card, datalist, fill, flash, form, h, int, money, num, placeholder, secretBox, table,
  time,
} from '../ui.js';

const limit = (label, v) => `${label} ${v === null || v === undefined ? '∞' : num(v)}`;

function keysTable(list, names, refresh) {
  return table([
    { label: 'Name', cell: (k) => h('strong', { class: 'key-name' }, k.name) },
    { label: 'Prefix', cell: (k) => h('code', {}, k.prefix) },
    { label: 'Account', cell: (k) => [names.get(k.account_id) ?? '', ' ', h('code', {}, k.account_id)] },
    { label: 'Created', cls: 'nw', cell: (k) => time(k.created_at) },
    { label: 'Spent / budget', num: true, cell: (k) => [money(k.spent), ' / ',
      k.budget === null || k.budget === undefined ? '∞' : money(k.budget)] },
    { label: 'Limits', cell: (k) => [limit('rpm', k.limits.rpm), limit('tpm', k.limits.tpm),
      limit('concurrent', k.limits.max_concurrent)].join(' · ') },
    { label: 'State', cell: (k) => (k.revoked_at
      ? [badge('revoked'), h('div', { class: 'sub' }, time(k.revoked_at))] : badge('active')) },
    { label: '', cell: (k) => (k.revoked_at ? '' : action('Revoke', async () => {
      await call('revokeKey', { params: { id: k.id } });
      flash(`Key ${k.name} revoked.`);
      await refresh();
    }, { confirm: `Revoke key ${k.name}? Requests with it are refused from now on.`, cls: 'danger', testid: 'revoke' })) },
  ], list, { rowAttrs: (k) => ({ 'data-key-id': k.id, class: k.revoked_at ? 'revoked' : null }), empty: 'No keys yet.' });
}

function createForm(created, refresh) {
  return form({
    name: 'create-key', submit: 'Create key',
    fields: [
      { name: 'name', label: 'Name', required: true },
      { name: 'account_id', label: 'User account (default: a new one)', list: 'key-accounts', placeholder: 'user:...' },
      { name: 'budget', label: 'Budget', type: 'amount', placeholder: 'none' },
      { name: 'rpm_limit', label: 'Requests/min', type: 'number', min: 1, placeholder: '∞' },
      { name: 'tpm_limit', label: 'Tokens/min', type: 'number', min: 1, placeholder: '∞' },
      { name: 'max_concurrent', label: 'Concurrent', type: 'number', min: 1, placeholder: '∞' },
    ],
    onSubmit: async (x, f) => {
      const body = {
        name: x.name,
        account_id: x.account_id || undefined,
        budget: amount(x.budget, 'Budget'),
        rpm_limit: int(x.rpm_limit, 'Requests/min'),
        tpm_limit: int(x.tpm_limit, 'Tokens/min'),
        max_concurrent: int(x.max_concurrent, 'Concurrent'),
      };
      const key = await call('createKey', { body });
      f.reset();
      fill(created, h('p', {}, `Key ${key.name} created. Its secret:`), secretBox(key.key),
        h('p', { class: 'sub' }, 'Send it as Authorization: Bearer <key>.'));
      flash(`Key ${key.name} created.`);
      await refresh();
    },
  });
}

export async function render(main) {
  const list = placeholder();
  const created = h('div', { class: 'created' });
  const lists = h('div');
  const refresh = async () => {
    const [keys, accounts] = await Promise.all([call('listKeys'), call('listAccounts').catch(() => null)]);
    const users = rows(accounts).filter((a) => a.kind === 'user');
    fill(lists, datalist('key-accounts', users.map((a) => a.id)));
    fill(list, keysTable(rows(keys), new Map(users.map((a) => [a.id, a.name])), refresh));
  };
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'API keys')),
    lists,
    card('New key', createForm(created, refresh), created),
    card('Keys', list));
  await refresh();
}
