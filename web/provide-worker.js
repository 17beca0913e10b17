// The /provide page's Web Worker: this tab as a provider's worker. It
// loads the engine (tab.js and tab_bg.wasm, the `tab` crate built for
// WebAssembly), fetches the model's weights from the server in ranges
// with the worker token, checks their SHA-256 and keeps them in Cache
// Storage (a returning tab starts without downloading), then speaks the
// fleet protocol on a WebSocket to the server that sent this page: the
// token travels as the subprotocol `bearer.<token>` (a page cannot set
// Authorization on a WebSocket, and a URL would leak it). Engine turns
// run between socket messages; a heartbeat reports the load.

import init, { TabWorker, can_hold } from '/provide/tab.js';

const KV_BYTES = 64 << 20;
const CHUNK = 8 << 20;
let cfg = null;
let tab = null;
let ws = null;
let serve = false;
let heartbeat = null;
let backoff = 1000;
let finished = false;
let reported = 0;

const say = (state) => postMessage({ state });

function report(force = false) {
  const now = performance.now();
  if (tab && (force || now - reported > 250)) {
    reported = now;
    postMessage({ counts: JSON.parse(tab.counts()) });
  }
}

async function hex(data) {
  const d = new Uint8Array(await crypto.subtle.digest('SHA-256', data));
  return Array.from(d, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** The model's weights: from Cache Storage when this browser kept them
 * and they still match the server's SHA-256, else downloaded in ranges. */
async function weights(model) {
  const url = `/v1/providers/models/${encodeURIComponent(model)}/file`;
  const auth = { authorization: `Bearer ${cfg.token}` };
  const head = await fetch(url, { method: 'HEAD', headers: auth });
  if (!head.ok) throw new Error(`the server will not give this tab ${model} (HTTP ${head.status})`);
  const sha = head.headers.get('x-synor-sha256');
  const total = Number(head.headers.get('content-length'));
  const store = typeof caches === 'undefined' ? null : await caches.open('synor-weights');
  const key = `/provide/weights/${sha}`;
  const kept = await store?.match(key);
  if (kept) {
    const data = new Uint8Array(await kept.arrayBuffer());
    if (await hex(data) === sha) return { data, cached: true };
    await store.delete(key);
  }
  const data = new Uint8Array(total);
  for (let at = 0; at < total;) {
    const r = await fetch(url, { headers: { ...auth, range: `bytes=${at}-${Math.min(at + CHUNK, total) - 1}` } });
    if (r.status !== 206) throw new Error(`downloading ${model}: HTTP ${r.status}`);
    const part = new Uint8Array(await r.arrayBuffer());
    if (part.length === 0) throw new Error(`downloading ${model}: the server sent nothing`);
    data.set(part, at);
    at += part.length;
    say(`Downloading ${model}: ${Math.floor((100 * at) / total)}%`);
  }
  if (await hex(data) !== sha) throw new Error(`${model}'s file does not match its SHA-256`);
  await store?.put(key, new Response(data));
  return { data, cached: false };
}

// Engine turns, one per macrotask, so socket messages come in between.
const channel = new MessageChannel();
let pumping = false;
channel.port1.onmessage = () => {
  pumping = false;
  if (!tab) return;
  const out = tab.turn();
  if (ws?.readyState === WebSocket.OPEN) out.forEach((m) => ws.send(m));
  report();
  if (!serve && ws && !tab.busy()) ws.close(1000, 'the schedule ended');
  kick();
};
function kick() {
  if (!pumping && tab?.busy()) {
    pumping = true;
    channel.port2.postMessage(0);
  }
}

/** Why the server refuses this token, if it does (a closed handshake
 * hides the status from a page). */
async function refusal() {
  const r = await fetch('/v1/providers/earnings', { headers: { authorization: `Bearer ${cfg.token}` } }).catch(() => null);
  if (r?.status !== 401) return null;
  return (await r.json().catch(() => null))?.error?.message ?? 'the server refuses this worker token';
}

function connect() {
  if (ws || !serve || finished) return;
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  ws = new WebSocket(`${scheme}//${location.host}/v1/providers/connect`, ['synor.worker.v1', `bearer.${cfg.token}`]);
  ws.binaryType = 'arraybuffer';
  ws.onopen = () => { ws.send(tab.register()); say('Registering…'); };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== 'string') return; // a tab takes no KV frames
    const msg = JSON.parse(ev.data);
    if (msg.type === 'welcome') {
      backoff = 1000;
      heartbeat = setInterval(() => { ws?.send(tab.status()); report(true); }, msg.heartbeat_ms);
      say(`Serving ${cfg.model} as worker ${msg.worker_id}`);
    } else if (msg.type === 'error') {
      say(`The server says: ${msg.message}`);
    }
    try {
      tab.receive(ev.data).forEach((m) => ws.send(m));
    } catch (e) {
      ws.close(1002, 'unreadable message');
      say(`Stopped: ${e.message}`);
      finished = true;
    }
    kick();
  };
  ws.onclose = async (ev) => {
    clearInterval(heartbeat);
    ws = null;
    tab.lost();
    if (finished || !serve) { if (!finished) say('Not serving now (outside the schedule)'); return; }
    const why = await refusal();
    if (why) { finished = true; say(`Stopped: ${why}`); return; }
    say(`Disconnected (${ev.reason || ev.code}); trying again in ${backoff / 1000} s`);
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 30000);
  };
}

async function start(c) {
  cfg = c;
  try {
    say('Loading the engine…');
    await init();
    if (!can_hold(2 * c.size + KV_BYTES)) {
      throw new Error(`this tab cannot hold ${c.model}: the browser gives it less memory than the model needs`);
    }
    const t0 = performance.now();
    const { data, cached } = await weights(c.model);
    say(`Loading ${c.model} (${cached ? 'kept in this browser' : 'downloaded'})…`);
    tab = new TabWorker(c.model, data, KV_BYTES, c.name, 'browser', navigator.userAgent, c.cores);
    postMessage({ loaded: { cached, bytes: cached ? 0 : data.length, ms: performance.now() - t0 } });
    connect();
  } catch (e) {
    finished = true;
    say(`Stopped: ${e.message}`);
  }
}

onmessage = ({ data }) => {
  if (data.start) start(data.start);
  if ('serve' in data) {
    serve = data.serve;
    if (serve && tab) connect();
    if (!serve && ws) { ws.send(tab.leave()); if (!tab.busy()) ws.close(1000, 'the schedule ended'); }
  }
  if (data.leave && ws) { ws.send(tab.leave()); finished = true; }
};
