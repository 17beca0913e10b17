// The /provide page's engine worker: the engine (tab.js and tab_bg.wasm,
// the `tab` crate built for WebAssembly) and the model, in a worker of its
// own so that a long engine step never holds up the socket's worker
// (provide-worker.js, which keeps the heartbeat). It fetches the model's
// weights in ranges with the worker token, checks their SHA-256 and keeps
// them in Cache Storage (a returning tab starts without downloading);
// then it takes the server's messages as they are relayed, runs engine
// turns one per task, and hands back what to send, in order.
//
// The engine runs on the page's WebGPU adapter or on the CPU kernels
// (WebAssembly SIMD128): `auto` takes a hardware adapter where the browser
// can suspend WebAssembly (JSPI, which a step on the GPU needs to wait
// for its reads) and the CPU otherwise, a software adapter included
// (SwiftShader is slower than the CPU kernels: BENCHMARKS.md). A GPU
// turn is a promise; every call into the engine waits its turn in one
// queue, so nothing touches it while a step is suspended.

import init, { TabWorker, can_hold, last_panic, open_gpu } from '/provide/tab.js';

const KV_BYTES = 64 << 20;
const CHUNK = 8 << 20;
let tab = null;
// The GPU's turn: the engine's `synor_tab_turn`, wrapped to suspend.
let step = null;
let token = null;
let leaving = false;
let reported = 0;

const say = (state) => postMessage({ state });

function report(force = false) {
  const now = performance.now();
  if (tab && (force || now - reported > 250)) {
    reported = now;
    postMessage({ counts: JSON.parse(tab.counts()), status: tab.status() });
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
  const auth = { authorization: `Bearer ${token}` };
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

// Every call into the engine, one after another.
let chain = Promise.resolve();
function queue(f) {
  chain = chain.then(f).catch((e) => {
    // A panic traps ("unreachable"): its own message says more.
    const fatal = e instanceof WebAssembly.RuntimeError
      ? `the engine failed: ${last_panic() ?? e.message}` : e?.message ?? String(e);
    postMessage({ fatal });
  });
}

/** The adapter's description when the engine is to run on the GPU, ''
 * for the CPU; `want` is the page's choice (auto, webgpu, cpu). */
async function device(want) {
  if (want === 'cpu') return '';
  const without = (why) => {
    if (want === 'webgpu') throw new Error(`this tab cannot run on WebGPU: ${why}`);
    return '';
  };
  if (!navigator.gpu) return without('the browser has no WebGPU');
  if (typeof WebAssembly.promising !== 'function') {
    return without('the browser cannot suspend WebAssembly (JSPI), which a step on its GPU needs');
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return without('the browser gives this page no GPU adapter');
  if (adapter.info?.isFallbackAdapter && want !== 'webgpu') return '';
  await open_gpu();
  const i = adapter.info ?? {};
  return [i.vendor, i.architecture, i.description].filter(Boolean).join(' ') || 'adapter';
}

// Engine turns, one per task, so relayed messages come in between.
const channel = new MessageChannel();
let pumping = false;
channel.port1.onmessage = () => queue(async () => {
  pumping = false;
  if (!tab) return;
  let send;
  if (step) {
    const r = await step(tab.slot());
    if (r !== 0) throw new Error(`the engine's turn failed (${r})`);
    send = tab.take_sent();
  } else {
    send = tab.turn();
  }
  if (send.length) postMessage({ send });
  report();
  if (leaving && !tab.busy()) postMessage({ idle: true });
  kick();
});
function kick() {
  if (!pumping && tab?.busy()) {
    pumping = true;
    channel.port2.postMessage(0);
  }
}

async function load(c) {
  token = c.token;
  try {
    say('Loading the engine…');
    const wasm = await init();
    const gpu = await device(c.device ?? 'auto');
    if (!can_hold(2 * c.size + KV_BYTES)) {
      throw new Error(`this tab cannot hold ${c.model}: the browser gives it less memory than the model needs`);
    }
    const t0 = performance.now();
    const { data, cached } = await weights(c.model);
    say(`Loading ${c.model} (${cached ? 'kept in this browser' : 'downloaded'})…`);
    tab = new TabWorker(c.model, data, KV_BYTES, c.name, 'browser', navigator.userAgent, c.cores, gpu);
    step = gpu ? WebAssembly.promising(wasm.synor_tab_turn) : null;
    const on = gpu ? `WebGPU (${gpu})` : 'the CPU (WebAssembly SIMD)';
    postMessage({ loaded: { cached, bytes: cached ? 0 : data.length, ms: performance.now() - t0, on } });
    report(true);
  } catch (e) {
    postMessage({ fatal: e.message });
  }
}

onmessage = ({ data }) => {
  if (data.load) queue(() => load(data.load));
  queue(() => {
    if (!tab) return;
    if (data.register) {
      leaving = false;
      postMessage({ send: [tab.register()] });
    }
    if (data.receive) {
      const send = tab.receive(data.receive);
      if (send.length) postMessage({ send });
      kick();
    }
    if (data.leave) {
      leaving = true;
      postMessage({ send: [tab.leave()] });
      if (!tab.busy()) postMessage({ idle: true });
    }
    if (data.lost) {
      tab.lost();
      report(true);
    }
  });
};
