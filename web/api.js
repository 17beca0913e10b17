// The console's only door to the server: the admin endpoints it uses
// (ENDPOINTS, checked against openapi.json by a Rust test), `call`, the
// session (sign-in, resuming it, sign-out, the CSRF token), `/health` and
// the overview stream.

export const ENDPOINTS = Object.freeze({
  signIn: ['POST', '/console/session'],
  signOut: ['DELETE', '/console/session'],
  session: ['GET', '/console/session'],
  health: ['GET', '/health'],
  overview: ['GET', '/admin/overview'],
  overviewStream: ['GET', '/admin/overview/stream'],
  listWorkers: ['GET', '/admin/fleet'],
  utilization: ['GET', '/admin/fleet/utilization'],
  pipelines: ['GET', '/admin/pipelines'],
  drainWorker: ['DELETE', '/admin/fleet/{id}'],
  pauseWorker: ['POST', '/admin/fleet/{id}/pause'],
  resumeWorker: ['POST', '/admin/fleet/{id}/resume'],
  spotChecks: ['GET', '/admin/spotchecks'],
  listWorkerTokens: ['GET', '/admin/providers/tokens'],
  createProvider: ['POST', '/admin/providers'],
  revokeWorkerToken: ['DELETE', '/admin/providers/tokens/{id}'],
  clearQuarantine: ['DELETE', '/admin/providers/tokens/{id}/quarantine'],
  marketPrices: ['GET', '/admin/market/prices'],
  marketBook: ['GET', '/admin/market/book'],
  marketTrades: ['GET', '/admin/market/trades'],
  marketHistory: ['GET', '/admin/market/history'],
  listOrders: ['GET', '/admin/market/orders'],
  postAsk: ['POST', '/admin/market/orders'],
  cancelOrder: ['DELETE', '/admin/market/orders/{id}'],
  listRegions: ['GET', '/admin/market/regions'],
  setRegion: ['PUT', '/admin/market/regions/{region}'],
  listProviders: ['GET', '/admin/market/providers'],
  setProvider: ['PUT', '/admin/market/providers/{id}'],
  listAccounts: ['GET', '/admin/accounts'],
  createAccount: ['POST', '/admin/accounts'],
  updateAccount: ['PATCH', '/admin/accounts/{id}'],
  topUp: ['POST', '/admin/accounts/{id}/topup'],
  penalty: ['POST', '/admin/accounts/{id}/penalty'],
  journal: ['GET', '/admin/journal'],
  usage: ['GET', '/admin/usage'],
  spend: ['GET', '/admin/usage/spend'],
  audit: ['GET', '/admin/ledger/audit'],
  listKeys: ['GET', '/admin/keys'],
  createKey: ['POST', '/admin/keys'],
  revokeKey: ['DELETE', '/admin/keys/{id}'],
  cacheStats: ['GET', '/admin/cache'],
  flushCache: ['POST', '/admin/cache/flush'],
  setThreshold: ['PUT', '/admin/cache/threshold'],
  setShared: ['PUT', '/admin/cache/shared/{model}'],
  loadModel: ['POST', '/admin/models'],
  unloadModel: ['DELETE', '/admin/models/{name}'],
  modelFiles: ['GET', '/admin/models/files'],
});

const CSRF_KEY = 'synor.csrf';
let csrf = sessionStorage.getItem(CSRF_KEY);
let onSignedOut = () => {};

/** An error answer: the API's own message, with its HTTP status and code. */
export class ApiError extends Error {
  constructor(message, status, code, body) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.body = body; // the answer's JSON, when it had one
  }
}

/** Whether a session is held (its CSRF token is known). */
export const signedIn = () => Boolean(csrf);

/** Registers what to do when the session ends (401, or CSRF refused). */
export function whenSignedOut(fn) {
  onSignedOut = fn;
}

function keepCsrf(token) {
  csrf = token;
  if (token) sessionStorage.setItem(CSRF_KEY, token);
  else sessionStorage.removeItem(CSRF_KEY);
}

// Integers past 2^53 come back as BigInt (amounts are decimal strings).
function parse(text) {
  return JSON.parse(text, (key, v, ctx) =>
    typeof v === 'number' && !Number.isSafeInteger(v) && /^-?\d+$/.test(ctx?.source ?? '')
      ? BigInt(ctx.source) : v);
}

function stringify(body) {
  return JSON.stringify(body, (key, v) =>
    typeof v === 'bigint' ? (JSON.rawJSON ? JSON.rawJSON(v.toString()) : Number(v)) : v);
}

/** The URL of an endpoint, its path params filled and query added. */
function url(name, { params = {}, query = {} } = {}) {
  const entry = ENDPOINTS[name];
  if (!entry) throw new Error(`unknown endpoint ${name}`);
  const path = entry[1].replace(/\{(\w+)\}/g, (_, p) => {
    if (params[p] === undefined) throw new Error(`${name}: missing ${p}`);
    return encodeURIComponent(params[p]);
  });
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const qs = q.toString();
  return qs ? `${path}?${qs}` : path;
}

async function errorOf(resp) {
  let body = null;
  try {
    body = parse(await resp.text());
  } catch {
    // Not JSON (a proxy's page): the status says it.
  }
  const detail = body?.error ?? {};
  const message = detail.message || `${resp.status} ${resp.statusText || 'error'}`;
  return new ApiError(message, resp.status, detail.code ?? null, body);
}

function sessionLost(err) {
  return err.status === 401 || err.code === 'csrf_token_missing';
}

async function request(name, opts) {
  const method = ENDPOINTS[name][0];
  const headers = { accept: 'application/json' };
  if (opts.body !== undefined) headers['content-type'] = 'application/json';
  if (method !== 'GET' && csrf) headers['x-csrf-token'] = csrf;
  const resp = await fetch(url(name, opts), {
    method,
    headers,
    credentials: 'same-origin',
    body: opts.body === undefined ? undefined : stringify(opts.body),
  });
  if (!resp.ok) throw await errorOf(resp);
  const text = await resp.text();
  return text ? parse(text) : null;
}

let refreshing = null; // the CSRF re-fetch under way, shared by concurrent requests

// The CSRF token of the cookie's live session (another tab may have
// signed in and replaced the cookie); null when there is none.
function refreshCsrf() {
  refreshing ??= request('session', {})
    .then((s) => { keepCsrf(s?.csrf ?? null); return csrf; }, () => null)
    .finally(() => { refreshing = null; });
  return refreshing;
}

// guarded: a lost session signs the page out. retry: a refused CSRF token
// is re-fetched once and the request sent again with it.
async function send(name, opts, { guarded = true, retry = true } = {}) {
  try {
    return await request(name, opts);
  } catch (err) {
    if (retry && err.code === 'csrf_token_missing' && await refreshCsrf()) {
      return send(name, opts, { guarded, retry: false });
    }
    if (guarded && err instanceof ApiError && sessionLost(err)) {
      keepCsrf(null);
      onSignedOut(err);
    }
    throw err;
  }
}

/** Calls an endpoint by name; throws ApiError on a non-2xx answer. */
export function call(name, opts = {}) {
  return send(name, opts);
}

/** Opens a console session with the admin token (kept nowhere). */
export async function signIn(token) {
  const session = await send('signIn', { body: { token } }, { guarded: false, retry: false });
  keepCsrf(session.csrf);
  return session;
}

/**
 * Whether a session is held: the tab's CSRF token, or else the one of the
 * cookie's live session (a new tab). False when there is none (401).
 */
export async function resume() {
  if (csrf) return true;
  try {
    keepCsrf((await request('session', {})).csrf);
  } catch (err) {
    if (err.status === 401) return false;
    throw err;
  }
  return signedIn();
}

/**
 * Closes the session; the local token is dropped whatever the answer. A
 * session already gone (401, or no live one to take a CSRF token from)
 * counts as signed out.
 */
export async function signOut() {
  try {
    await send('signOut', {}, { guarded: false });
  } catch (err) {
    if (!sessionLost(err)) throw err;
  } finally {
    keepCsrf(null);
  }
}

/** Ends the session on the page (the server said it ended). */
export function sessionEnded() {
  keepCsrf(null);
  onSignedOut(null);
}

/** `GET /health`: its 503 while the server drains carries the same body. */
export async function health() {
  try {
    return await call('health');
  } catch (err) {
    if (err.status === 503 && err.body?.models) return err.body;
    throw err;
  }
}

/** The items of a list answer (`{"object":"list","data":[...]}`). */
export const rows = (answer) => answer?.data ?? [];

/** Server-sent events of a GET endpoint (the session cookie authenticates). */
export function openStream(name, opts) {
  return new EventSource(url(name, opts));
}

/** Parses an event's JSON data like an answer. */
export const eventData = (ev) => parse(ev.data);
