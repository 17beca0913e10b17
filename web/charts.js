// Small SVG charts drawn by hand: line charts over time (clock ticks,
// min/max labels, dots for lone points, values on hover), an order book's
// depth as step areas, and busy strips (a row per executor).

import { h } from './ui.js';

const NS = 'http://www.w3.org/2000/svg';

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  }
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const svg = (w, hgt, ...children) => s('svg', { viewBox: `0 0 ${w} ${hgt}`, class: 'plot', role: 'img' }, ...children);
const label = (x, y, text, anchor = 'start') => s('text', { x, y, 'text-anchor': anchor, class: 'axis' }, text);

function extent(values, floor) {
  let lo = floor ?? Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v === null || v === undefined) continue;
    lo = Math.min(lo, v);
    hi = Math.max(hi, v);
  }
  if (hi === -Infinity) return null;
  return hi === lo ? [lo, lo + 1] : [lo, hi];
}

function linePath(points, x, y) {
  let d = '';
  let pen = 'M';
  for (const [t, v] of points) {
    if (v === null || v === undefined) { pen = 'M'; continue; }
    d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
    pen = 'L';
  }
  return d;
}

const pad2 = (n) => String(n).padStart(2, '0');

/** A time (ms) as HH:MM, or HH:MM:SS when `seconds`. */
function clock(ms, seconds) {
  const d = new Date(ms);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  return seconds ? `${hm}:${pad2(d.getSeconds())}` : hm;
}

/** Whether point i of `points` has no drawn neighbour (a line needs two). */
function lone(points, i) {
  const has = (j) => points[j] && points[j][1] !== null && points[j][1] !== undefined;
  return has(i) && !has(i - 1) && !has(i + 1);
}

/**
 * A line chart over time: series [{label, points: [[t, v|null]...]}]
 * share the axes (y from 0 unless floor is null); t is in `unit` (`ms` or
 * `s`), fmt formats the values. The time axis has clock ticks; a point
 * with no neighbour is drawn as a dot; hovering shows each series' value
 * at the nearest time.
 */
export function lineChart(title, series, { fmt = String, floor = 0, width = 400, height = 120, unit = 'ms' } = {}) {
  const scale = unit === 's' ? 1000 : 1;
  const all = series.map((sr) => ({ ...sr, points: sr.points.map(([t, v]) => [t * scale, v]) }));
  const pts = all.flatMap((sr) => sr.points);
  const tx = extent(pts.filter((p) => p[1] !== null && p[1] !== undefined).map((p) => p[0]));
  const ty = extent(pts.map((p) => p[1]), floor);
  const pad = { l: 4, r: 4, t: 12, b: 24 };
  const fig = h('figure', { class: 'chart' }, h('figcaption', {}, title));
  if (!tx || !ty) {
    fig.append(h('p', { class: 'quiet' }, 'No data yet.'));
    return fig;
  }
  // A lone time still gets a minute of axis around it.
  const [t0, t1] = tx[1] - tx[0] <= 1 ? [tx[0] - 30_000, tx[0] + 30_000] : tx;
  const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - ((v - ty[0]) / (ty[1] - ty[0])) * (height - pad.t - pad.b);
  const seconds = t1 - t0 < 10 * 60_000;
  const ticks = [0, 1, 2, 3].map((i) => {
    const t = t0 + ((t1 - t0) * i) / 3;
    return label(x(t), height - 4, clock(t, seconds), ['start', 'middle', 'middle', 'end'][i]);
  });
  const dots = all.flatMap((sr, k) => sr.points.map(([t, v], i) => (lone(sr.points, i)
    ? s('circle', { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, class: `dot s${k}` }) : null)).filter(Boolean));
  const guide = s('line', { x1: 0, x2: 0, y1: pad.t, y2: height - pad.b, class: 'guide', visibility: 'hidden' });
  const tip = s('text', { x: pad.l, y: pad.t - 3, class: 'axis hover', 'data-testid': 'chart-hover' }, '');
  const overlay = s('rect', { x: pad.l, y: pad.t, width: width - pad.l - pad.r, height: height - pad.t - pad.b, class: 'overlay' });
  const plot = svg(width, height,
    s('line', { x1: pad.l, x2: width - pad.r, y1: y(ty[1]), y2: y(ty[1]), class: 'grid' }),
    s('line', { x1: pad.l, x2: width - pad.r, y1: y(ty[0]), y2: y(ty[0]), class: 'grid' }),
    ...all.map((sr, i) => s('path', { d: linePath(sr.points, x, y), class: `line s${i}` })),
    ...dots,
    label(width - pad.r, pad.t - 3, `max ${fmt(ty[1])}`, 'end'),
    label(width - pad.r, height - pad.b - 2, `min ${fmt(ty[0])}`, 'end'),
    ...ticks, guide, tip, overlay);
  const times = [...new Set(pts.map((p) => p[0]))].sort((a, b) => a - b);
  const show = (t) => {
    const at = all.map((sr) => {
      const p = sr.points.find((q) => q[0] === t);
      return `${sr.label} ${p && p[1] !== null && p[1] !== undefined ? fmt(p[1]) : '–'}`;
    });
    guide.setAttribute('x1', x(t).toFixed(1));
    guide.setAttribute('x2', x(t).toFixed(1));
    guide.setAttribute('visibility', 'visible');
    tip.textContent = `${clock(t, true)} · ${at.join(' · ')}`;
  };
  overlay.addEventListener('mousemove', (ev) => {
    const box = plot.getBoundingClientRect();
    const at = t0 + ((((ev.clientX - box.left) / box.width) * width - pad.l) / (width - pad.l - pad.r)) * (t1 - t0);
    const t = times.reduce((best, c) => (Math.abs(c - at) < Math.abs(best - at) ? c : best), times[0]);
    show(t);
  });
  overlay.addEventListener('mouseleave', () => {
    guide.setAttribute('visibility', 'hidden');
    tip.textContent = '';
  });
  const legend = h('div', { class: 'legend' }, all.map((sr, i) => {
    const last = [...sr.points].reverse().find((p) => p[1] !== null && p[1] !== undefined);
    return h('span', { class: `key s${i}` }, `${sr.label} ${last ? fmt(last[1]) : '–'}`);
  }));
  fig.append(plot, legend);
  return fig;
}

function cumulate(levels) {
  let sum = 0;
  return levels.map((l) => [Number(l.price), (sum += Number(l.quantity))]);
}

// A step area: from the best level outwards, each cumulative depth held
// until the next level's price (the last one until `end`).
function stepArea(levels, end, x, y, base) {
  if (!levels.length) return '';
  const pts = [[levels[0][0], 0]];
  levels.forEach(([p, q], i) => pts.push([p, q], [levels[i + 1]?.[0] ?? end, q]));
  pts.push([end, 0]);
  return `M${pts.map(([p, q]) => `${x(p).toFixed(1)},${q ? y(q).toFixed(1) : base}`).join('L')}Z`;
}

/** Order-book depth: bids cumulated down from the best bid, asks up from the best ask. */
export function depthChart(bids, asks, fmt = String, { width = 600, height = 150 } = {}) {
  const b = cumulate([...bids].sort((m, n) => Number(n.price) - Number(m.price)));
  const a = cumulate([...asks].sort((m, n) => Number(m.price) - Number(n.price)));
  const all = [...b, ...a];
  if (!all.length) return h('p', { class: 'quiet' }, 'The book is empty.');
  const [p0, p1] = extent(all.map((p) => p[0]));
  const margin = (p1 - p0) * 0.08;
  const [lo, hi] = [p0 - margin, p1 + margin];
  const qMax = Math.max(...all.map((p) => p[1]));
  const pad = { l: 4, r: 4, t: 14, b: 14 };
  const base = height - pad.b;
  const x = (p) => pad.l + ((p - lo) / (hi - lo)) * (width - pad.l - pad.r);
  const y = (q) => base - (q / qMax) * (height - pad.t - pad.b);
  return svg(width, height,
    s('path', { d: stepArea(b, lo, x, y, base), class: 'bid' }),
    s('path', { d: stepArea(a, hi, x, y, base), class: 'ask' }),
    label(pad.l, height - 2, fmt(p0)),
    label(width - pad.r, height - 2, fmt(p1), 'end'),
    label(pad.l, pad.t - 4, `depth ${qMax.toLocaleString('en-US')} tok/s`));
}

/** A strip of cells shaded by a share 0..1 (null: no data). */
export function busyStrip(values, { width = 600, height = 14 } = {}) {
  const w = width / Math.max(values.length, 1);
  return svg(width, height, ...values.map((v, i) => s('rect', {
    x: (i * w).toFixed(2), y: 0, width: Math.max(w, 0.5).toFixed(2), height,
    class: v === null ? 'cell none' : 'cell', 'fill-opacity': v === null ? null : Math.max(0.06, v).toFixed(2),
  })));
}
