// The /provide page's socket worker: this tab's connection to the fleet.
// It starts the engine worker (provide-engine.js), then speaks the fleet
// protocol on a WebSocket to the server that sent this page, relaying
// the server's messages to the engine and the engine's answers back in
// order. The token travels as the subprotocol `bearer.<token>` (a page
// cannot set Authorization on a WebSocket, and a URL would leak it). The
// heartbeat is sent from here, with the engine's latest load, so a long
// engine step in the other worker never makes the server think this tab
// is gone; a Web Worker's timers are not throttled like a hidden page's.

let cfg = null;
let engine = null;
let ws = null;
let serve = false;
let ready = false;
let finished = false;
let heartbeat = null;
let status = null;
let backoff = 1000;

const say = (state) => postMessage({ state });

function stopWith(why) {
  if (finished) return; // the first reason is the one to show
  finished = true;
  say(`Stopped: ${why}`);
  ws?.close(1000, 'stopped');
}

/** Why the server refuses this token, if it does (a refused handshake
 * hides its status from a page). */
async function refusal() {
  const r = await fetch('/v1/providers/earnings', { headers: { authorization: `Bearer ${cfg.token}` } }).catch(() => null);
  if (r?.status !== 401) return null;
  return (await r.json().catch(() => null))?.error?.message ?? 'the server refuses this worker token';
}

function connect() {
  if (ws || !serve || !ready || finished) return;
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  ws = new WebSocket(`${scheme}//${location.host}/v1/providers/connect`, ['synor.worker.v1', `bearer.${cfg.token}`]);
  ws.binaryType = 'arraybuffer';
  ws.onopen = () => { engine.postMessage({ register: true }); say('Registering…'); };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== 'string') return; // a tab takes no KV frames
    const msg = JSON.parse(ev.data);
    if (msg.type === 'welcome') {
      backoff = 1000;
      clearInterval(heartbeat);
      heartbeat = setInterval(() => { if (status) ws?.send(status); }, msg.heartbeat_ms);
      say(`Serving ${cfg.model} as worker ${msg.worker_id}`);
    } else if (msg.type === 'error') {
      say(`The server says: ${msg.message}`);
    }
    engine.postMessage({ receive: ev.data });
  };
  ws.onclose = async (ev) => {
    clearInterval(heartbeat);
    ws = null;
    engine.postMessage({ lost: true });
    if (finished) return;
    if (!serve) { say('Not serving now (outside the schedule)'); return; }
    const why = await refusal();
    if (why) { stopWith(why); return; }
    say(`Disconnected (${ev.reason || ev.code}); trying again in ${backoff / 1000} s`);
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 30000);
  };
}

function start(c) {
  cfg = c;
  engine = new Worker('/provide/provide-engine.js', { type: 'module' });
  engine.onerror = (e) => stopWith(`the engine failed: ${e.message}`);
  engine.onmessage = ({ data }) => {
    if (data.send && ws?.readyState === WebSocket.OPEN) data.send.forEach((m) => ws.send(m));
    if (data.status) status = data.status;
    if (data.loaded) {
      ready = true;
      if (serve) connect();
      else say('Ready; waiting for the schedule');
    }
    if (data.idle && !serve) ws?.close(1000, 'the schedule ended');
    if (data.fatal) stopWith(data.fatal);
    if (data.state || data.counts || data.loaded) postMessage(data);
  };
  engine.postMessage({ load: c });
}

onmessage = ({ data }) => {
  if (data.start) start(data.start);
  if ('serve' in data) {
    serve = data.serve;
    if (serve) connect();
    else if (ws) engine.postMessage({ leave: true });
    else if (ready) say('Ready; waiting for the schedule');
  }
  if (data.leave && ws) { engine.postMessage({ leave: true }); finished = true; }
};
