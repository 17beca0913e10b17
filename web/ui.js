// DOM helpers for every page: elements built with textContent only (API
// data is user-controlled: never innerHTML), tables, forms, formatting,
// the flash area, confirmations and polling.

const PROPS = new Set(['value', 'checked', 'disabled']);

/** An element: attrs (class, on<event> handlers, properties, attributes), then children. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (PROPS.has(k)) el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

/** Appends children: nodes, text (strings, numbers) or arrays of them. */
function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

const drawn = new WeakMap();

/** Fills el with draw(data) unless data is what it last drew (no flicker under a cursor). */
export function redraw(el, data, draw) {
  const text = JSON.stringify(data, (k, x) => (typeof x === 'bigint' ? x.toString() : x));
  if (drawn.get(el) === text) return;
  drawn.set(el, text);
  fill(el, draw(data));
}

/** A box showing `Loading…` until it is filled (attrs as for h). */
export const placeholder = (attrs = {}) => h('div', attrs, h('p', { class: 'quiet' }, 'Loading…'));

/**
 * Runs fn every ms milliseconds until the returned function is called.
 * A tick is skipped while the page is hidden or the last run is still
 * under way; a run's error is dropped (the next tick tries again; a lost
 * session signs the page out by itself).
 */
export function poll(fn, ms) {
  let running = false;
  const timer = setInterval(async () => {
    if (running || document.hidden) return;
    running = true;
    try {
      await fn();
    } catch {
      // Shown by the next run that succeeds, or by the sign-in view.
    } finally {
      running = false;
    }
  }, ms);
  return () => clearInterval(timer);
}

/** A titled card. */
export const card = (title, ...children) => h('section', { class: 'card' }, h('h2', {}, title), ...children);

/** A table: columns are {label, cell(row), num?, cls?}; rowAttrs(row) adds row attributes. */
export function table(columns, data, { rowAttrs, empty = 'None.' } = {}) {
  const cls = (c) => (c.num ? 'num' : c.cls);
  const head = h('tr', {}, columns.map((c) => h('th', { class: cls(c) }, c.label)));
  const body = data.length
    ? data.map((r) => h('tr', rowAttrs?.(r) ?? {},
      columns.map((c) => h('td', { class: cls(c) }, c.cell(r)))))
    : [h('tr', {}, h('td', { colspan: columns.length, class: 'quiet' }, empty))];
  return h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, head), h('tbody', {}, body)));
}

const nf = new Intl.NumberFormat('en-US');
const pad = (n) => String(n).padStart(2, '0');

/** A number with thousands separators (digits: fixed decimals). */
export function num(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  if (digits === undefined || typeof n === 'bigint') return nf.format(n);
  return Number(n).toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

/** An amount as the API gives it (a decimal string of currency units)
 * for reading: thousands separators; a unit or more to at most 4
 * decimals, less than a unit to its significant digits. The exact
 * amount is the tooltip. */
export function money(units) {
  if (units === null || units === undefined) return '–';
  return h('span', { class: 'money', title: `${units} units` }, moneyText(units));
}

/** The text of `money`. */
export function moneyText(units) {
  const m = /^(-?)(\d+)(?:\.(\d+))?$/.exec(String(units));
  if (!m) return String(units);
  const [, sign, whole, frac = ''] = m;
  const shown = whole === '0' ? frac.replace(/0+$/, '') : frac.slice(0, 4).replace(/0+$/, '');
  return `${sign}${whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',')}.${shown.padEnd(2, '0')}`;
}

/** An id shown short (its head, the whole in a tooltip), so tables fit. */
export function shortId(id) {
  if (!id) return '–';
  return h('code', { title: id }, id.length > 16 ? `${id.slice(0, 14)}…` : id);
}

/** A name where there is one, with its id in a tooltip (the id alone where not). */
export function named(names, id) {
  const name = names?.get(id);
  return name ? h('span', { title: id, class: 'named' }, name) : shortId(id);
}

/** A fraction 0..1 as a percentage. */
export const pct = (x, digits = 1) => (x === null || x === undefined ? '–' : `${(x * 100).toFixed(digits)}%`);

/** Basis points as a percentage (10000 = 100%). */
export const bps = (b) => pct(Number(b) / 10000);

/** A unix time (seconds) as local date and time. */
export function time(t) {
  if (!t) return '–';
  const d = new Date(Number(t) * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A duration in seconds, short (`3h 12m`). */
export function dur(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** Byte counts in binary units. */
export function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** A state badge: good, warn, bad or muted by the state's name. */
export function badge(state) {
  const tone = {
    active: 'good', ok: 'good', finished: 'good', ready: 'good', bid: 'good',
    calibrating: 'warn', draining: 'warn', cut: 'warn', ask: 'warn', shared: 'warn',
    quarantined: 'bad', revoked: 'bad', failed: 'bad',
  }[state] ?? 'muted';
  return h('span', { class: `badge ${tone}` }, state);
}

const flashEl = () => document.getElementById('flash');
let flashTimer;

/** Shows a message in the flash area (kind `ok` or `error`). */
export function flash(text, kind = 'ok') {
  const el = flashEl();
  clearTimeout(flashTimer);
  el.textContent = text;
  el.className = kind;
  el.hidden = false;
  if (kind === 'ok') flashTimer = setTimeout(() => { el.hidden = true; }, 6000);
}

/** Shows an error (an ApiError's message verbatim). */
export const flashError = (err) => flash(err.message || String(err), 'error');

/** Hides the flash area. */
export function clearFlash() {
  clearTimeout(flashTimer);
  flashEl().hidden = true;
}

/** Runs an action from a button: disabled meanwhile, errors flashed. */
async function busy(button, fn) {
  button.disabled = true;
  try {
    await fn();
  } catch (err) {
    flashError(err);
  } finally {
    button.disabled = false;
  }
}

/** A button running an async action (confirm text optional). */
export function action(label, fn, { confirm, cls = 'secondary', testid } = {}) {
  const b = h('button', { type: 'button', class: cls, 'data-testid': testid }, label);
  b.addEventListener('click', () => {
    if (confirm && !window.confirm(confirm)) return;
    busy(b, fn);
  });
  return b;
}

function field(f) {
  const attrs = {
    name: f.name, type: f.type === 'amount' ? 'text' : f.type ?? 'text', required: f.required,
    placeholder: f.placeholder ?? (f.type === 'amount' ? '0.00' : undefined),
    inputmode: f.type === 'amount' ? 'decimal' : undefined,
    min: f.min, max: f.max, step: f.step, list: f.list, autocomplete: 'off',
    'aria-label': f.label ? null : f.placeholder ?? f.name,
  };
  let input;
  if (f.options) {
    input = h('select', { name: f.name }, f.options.map(([v, label]) => h('option', { value: v }, label)));
    input.value = f.value ?? f.options[0][0];
  } else if (f.type === 'checkbox') {
    input = h('input', { ...attrs, checked: Boolean(f.value) });
  } else {
    input = h('input', { ...attrs, value: f.value ?? '' });
  }
  return h('label', { class: f.type === 'checkbox' ? 'check' : null }, f.label, input);
}

/** The values of a form's named controls: strings trimmed, checkboxes as booleans. */
export function values(form) {
  const out = {};
  for (const el of form.elements) {
    if (!el.name) continue;
    out[el.name] = el.type === 'checkbox' ? el.checked : el.value.trim();
  }
  return out;
}

/** A form: fields, a submit label, and onSubmit(values, form) run with the button disabled. */
export function form({ name, fields, submit, onSubmit, cls = 'inline' }) {
  const button = h('button', { type: 'submit' }, submit);
  const f = h('form', { name, class: cls }, fields.map(field), button);
  f.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(button, () => onSubmit(values(f), f));
  });
  return f;
}

/** A whole number of a field ('' is undefined; past 2^53 a BigInt). */
export function int(text, label) {
  if (text === '' || text === undefined) return undefined;
  if (!/^-?\d+$/.test(text)) throw new Error(`${label}: a whole number is needed`);
  const n = Number(text);
  return Number.isSafeInteger(n) ? n : BigInt(text);
}

/** An amount of money typed in a field, as the API takes it: a decimal
 * string of units, up to 10 decimals ('' is undefined). */
export function amount(text, label) {
  if (text === '' || text === undefined) return undefined;
  if (!/^-?\d+(\.\d{1,10})?$/.test(text)) throw new Error(`${label}: an amount in units is needed, like 12.50`);
  return text;
}

/** A decimal number of a field ('' is undefined). */
export function dec(text, label) {
  if (text === '' || text === undefined) return undefined;
  const n = Number(text);
  if (!Number.isFinite(n)) throw new Error(`${label}: a number is needed`);
  return n;
}

// Copies the text of el; where the clipboard is refused (plain HTTP off
// localhost, an unfocused page) selects it for a manual copy instead.
async function copyText(el) {
  try {
    await navigator.clipboard.writeText(el.textContent);
    flash('Copied to the clipboard.');
  } catch {
    getSelection().selectAllChildren(el);
    flash('Selected: press Ctrl+C (or ⌘C) to copy it.');
  }
}

/** A secret shown once, with a copy button and a warning. */
export function secretBox(secret) {
  const code = h('code', { 'data-testid': 'new-secret' }, secret);
  return h('div', { class: 'secret' }, code,
    action('Copy', () => copyText(code), { testid: 'copy-secret' }),
    h('p', { class: 'quiet' }, 'Copy it now: it will not be shown again.'));
}

/** A datalist of values, for inputs' `list`. */
export const datalist = (id, items) => h('datalist', { id }, items.map((v) => h('option', { value: v })));
