// The caches page: the response cache's tiers (sizes, hits, misses,
// evictions), flushing (all, or a scope and/or model), the semantic
// threshold, and sharing a model's cache across tenants.

import { call } from '../api.js';
import {
  action, bytes, card, datalist, dec, fill, flash, form, h, num, pct, table,
} from '../ui.js';

function removedText(r) {
  const total = r.l1 + r.l2 + r.l3 + r.semantic;
  return `Flushed ${num(total)} entries (l1 ${num(r.l1)}, l2 ${num(r.l2)}, l3 ${num(r.l3)}, semantic ${num(r.semantic)}).`;
}

function sizes(c) {
  const tile = (label, value, sub) => h('div', { class: 'tile' },
    h('div', { class: 'label' }, label), h('div', { class: 'value' }, value), h('div', { class: 'sub' }, sub));
  return h('div', { class: 'grid tiles' },
    tile('L1 (memory)', num(c.l1.entries), bytes(c.l1.bytes)),
    tile('L2 (disk)', num(c.l2.entries), bytes(c.l2.bytes)),
    tile('Semantic index', num(c.semantic.entries), `threshold ${num(c.semantic.threshold, 2)}`));
}

const tiersTable = (tiers) => table([
  { label: 'Tier', cell: (t) => t.tier },
  { label: 'Hits', num: true, cell: (t) => num(t.hits) },
  { label: 'Misses', num: true, cell: (t) => num(t.misses) },
  { label: 'Hit rate', num: true, cell: (t) => (t.hits + t.misses ? pct(t.hits / (t.hits + t.misses)) : '–') },
  { label: 'Evictions', num: true, cell: (t) => num(t.evictions) },
  { label: 'Mean lookup', num: true, cell: (t) => `${num(t.mean_lookup_us)} µs` },
], tiers, { rowAttrs: (t) => ({ 'data-tier': t.tier }) });

async function flush(body, refresh) {
  const answer = await call('flushCache', { body });
  flash(removedText(answer.removed));
  await refresh();
}

function flushForm(refresh) {
  return form({
    name: 'flush', submit: 'Flush matching',
    fields: [
      { name: 'scope', label: 'Scope (account id or shared)', placeholder: 'any' },
      { name: 'model', label: 'Model', list: 'cache-models', placeholder: 'any' },
    ],
    onSubmit: (x) => flush({ scope: x.scope || undefined, model: x.model || undefined }, refresh),
  });
}

function thresholdForm(current, refresh) {
  return form({
    name: 'threshold', submit: 'Set threshold',
    fields: [{ name: 'threshold', label: 'Cosine similarity a semantic hit needs (0-1)', type: 'number',
      min: 0, max: 1, step: 0.01, required: true, value: String(current) }],
    onSubmit: async (x) => {
      const set = await call('setThreshold', { body: { threshold: dec(x.threshold, 'Threshold') } });
      flash(`Semantic threshold set to ${set.threshold}.`);
      await refresh();
    },
  });
}

function sharedForm() {
  return form({
    name: 'shared', submit: 'Apply',
    fields: [
      { name: 'model', label: 'Model', list: 'cache-models', required: true },
      { name: 'shared', label: 'Shared across tenants', type: 'checkbox' },
    ],
    onSubmit: async (x) => {
      const set = await call('setShared', { params: { model: x.model }, body: { shared: x.shared } });
      flash(`The cache of ${set.model} is ${set.shared ? 'shared across tenants' : 'per tenant'}.`);
    },
  });
}

export async function render(main) {
  const stats = h('div', {}, h('p', { class: 'quiet' }, 'Loading…'));
  const settings = h('div');
  const lists = h('div');
  const refresh = async () => {
    let c;
    try {
      c = await call('cacheStats');
    } catch (err) {
      fill(stats, h('p', { class: 'error-text' }, err.message));
      fill(settings);
      throw err;
    }
    fill(stats, sizes(c), tiersTable(c.tiers));
    if (!settings.firstChild) {
      fill(settings, card('Semantic threshold', thresholdForm(c.semantic.threshold, refresh)),
        card('Shared models', h('p', { class: 'sub' }, 'A shared model\'s answers are cached once for every tenant.'), sharedForm()));
    }
  };
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'Caches'),
      action('Flush all', () => flush({}, refresh), { cls: 'danger', testid: 'flush' })),
    lists,
    card('Response cache', stats),
    card('Flush', flushForm(refresh)),
    settings);
  call('health').then((hl) => fill(lists, datalist('cache-models', hl.models.map((m) => m.id))), () => {});
  await refresh();
}
