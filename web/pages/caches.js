// The caches page: the response cache's tiers (sizes, hits, misses,
// evictions), flushing (all, or a scope and/or model), the semantic
// threshold, the bound on wrong answers per model with what it served,
// verified and estimates, and sharing a model's cache across tenants.

import { call, health } from '../api.js';
import {
  action, badge, bytes, card, datalist, dec, fill, flash, form, h, num, pct, placeholder, redraw, table,
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

function deltaForm(refresh) {
  return form({
    name: 'delta', submit: 'Set bound',
    fields: [
      { name: 'model', label: 'Model', list: 'cache-models', placeholder: 'the default' },
      { name: 'delta', label: 'Share of near matches that may be served wrong (0 turns it off)', type: 'number',
        min: 0, max: 0.99, step: 0.001, required: true, value: '0.01' },
    ],
    onSubmit: async (x) => {
      const body = { delta: dec(x.delta, 'Bound'), model: x.model || undefined };
      const set = await call('setThreshold', { body });
      flash(set.delta ? `Wrong answers bounded at ${pct(set.delta)} for ${set.model ?? 'the default'}.`
        : `The bound is off for ${set.model ?? 'the default'}.`);
      await refresh();
    },
  });
}

// A row per model under a bound: its delta, what it served and probed,
// how the compared probes came out, and the estimated error rate.
function boundedTable(s) {
  const delta = (m) => s.models?.[m]?.delta ?? s.delta;
  const rows = Object.entries(s.bounded ?? {}).map(([model, b]) => ({ model, ...b }));
  const t = s.learned_thresholds ?? {};
  const learned = t.count ? `${num(t.count)} learned thresholds, quartiles ${num(t.p25, 2)} / ${num(t.p50, 2)} / ${num(t.p75, 2)}.`
    : 'No threshold learned yet.';
  const j = s.learned_judge_cuts ?? {};
  const cuts = j.count ? ` ${num(j.count)} learned cuts on the judge's chance, quartiles ${num(j.p25, 2)} / ${num(j.p50, 2)} / ${num(j.p75, 2)}.`
    : '';
  return [table([
    { label: 'Model', cell: (b) => h('strong', {}, b.model) },
    { label: 'Bound', num: true, cell: (b) => (delta(b.model) ? pct(delta(b.model)) : 'off') },
    { label: 'Served', num: true, cell: (b) => num(b.served) },
    { label: 'Probed', num: true, cell: (b) => num(b.probed) },
    { label: 'Verified', num: true, cell: (b) => num(b.verified) },
    { label: 'Failed', num: true, cell: (b) => num(b.failed) },
    { label: 'Judged same / not', num: true, cell: (b) => `${num(b.judged_same)} / ${num(b.judged_different)}` },
    { label: 'Est. wrong (95%)', num: true,
      cell: (b) => `${pct(b.error_rate, 2)} [${pct(b.error_interval[0], 2)}, ${pct(b.error_interval[1], 2)}]` },
  ], rows, { rowAttrs: (b) => ({ 'data-bounded': b.model }), empty: 'No model has a bound on wrong answers yet.' }),
  h('p', { class: 'sub' }, learned + cuts)];
}

// A row per served text model (and per shared model no longer served),
// each with its current state and the button that flips it.
function sharedTable(d, refresh) {
  const shared = new Set(d.shared);
  const names = [...new Set([...d.served, ...d.shared])].sort((a, b) => a.localeCompare(b));
  return table([
    { label: 'Model', cell: (m) => h('strong', {}, m) },
    { label: 'Cache', cell: (m) => badge(shared.has(m) ? 'shared' : 'per tenant') },
    { label: '', cell: (m) => {
      const on = !shared.has(m);
      return action(on ? 'Share' : 'Make per tenant', async () => {
        const set = await call('setShared', { params: { model: m }, body: { shared: on } });
        flash(`The cache of ${set.model} is ${set.shared ? 'shared across tenants' : 'per tenant'}.`);
        await refresh();
      }, {
        confirm: on ? `Share the cache of ${m} across tenants? Answers cached from now on serve every tenant.` : null,
        testid: 'toggle-shared',
      });
    } },
  ], names, { rowAttrs: (m) => ({ 'data-model': m, 'data-shared': String(shared.has(m)) }), empty: 'No text model is served.' });
}

export async function render(main) {
  const stats = placeholder();
  const threshold = h('div');
  const bound = h('div');
  const bounded = placeholder();
  const shared = placeholder();
  const lists = h('div');
  // Errors are shown in the card (not thrown: the caller would flash them too).
  const refresh = async () => {
    let c;
    let hl;
    try {
      [c, hl] = await Promise.all([call('cacheStats'), health().catch(() => null)]);
    } catch (err) {
      fill(stats, h('p', { class: 'error-text' }, err.message));
      return;
    }
    const served = (hl?.models ?? []).filter((m) => m.kind === 'text').map((m) => m.id);
    fill(stats, sizes(c), tiersTable(c.tiers));
    if (!threshold.firstChild) fill(threshold, thresholdForm(c.semantic.threshold, refresh));
    if (!bound.firstChild) fill(bound, deltaForm(refresh));
    fill(bounded, ...boundedTable(c.semantic));
    redraw(shared, { served, shared: c.shared_models ?? [] }, (d) => sharedTable(d, refresh));
    redraw(lists, served, (d) => datalist('cache-models', d));
  };
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'Caches'),
      action('Flush all', () => flush({}, refresh), { cls: 'danger', testid: 'flush' })),
    lists,
    card('Response cache', stats),
    card('Flush', flushForm(refresh)),
    card('Semantic threshold', threshold),
    card('Bound on wrong answers', h('p', { class: 'sub' },
      'Near matches are served only as far as verification by the model has learned they may be; the rest are generated and compared.'),
    bound, bounded),
    card('Shared models', h('p', { class: 'sub' }, 'A shared model\'s answers are cached once for every tenant.'), shared));
  await refresh();
}
