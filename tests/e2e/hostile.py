"""A hostile provider, for the end-to-end tests only (never shipped).

`Hostile` is a WebSocket proxy that sits between a real `synor worker` and
the gateway (`/v1/providers/connect`): the worker is pointed at the proxy
(`--server ws://127.0.0.1:P`), the proxy opens the same path on the real
server with the worker's request headers (its `Authorization: Bearer`
token), and relays frames both ways, close codes and reasons included (an
HTTP refusal of the upgrade, such as a 401, is relayed too). The worker
opens one socket only: control messages (JSON text) and KV frames (binary)
share it, in both directions.

On the way, a tamper policy may rewrite what the worker says, to play the
provider that lies about its counts, pads its output or forges its KV:

* `tamper.to_worker(msg) -> [msg, ...]`: each JSON message of the server;
* `tamper.from_worker(msg) -> [msg, ...]`: each JSON message of the worker
  (`[]` drops it, several add messages);
* `tamper.frame(bytes) -> bytes | None`: each binary frame of the worker.

Binary frames from the server pass unchanged. A message that comes back
equal to what arrived goes on as the original bytes.

Tampering is switched at run time with `hostile.armed = True / False`, so a
worker can calibrate honestly before the test arms the proxy. A job (or a
prefill transfer) is armed when its assignment passes while the proxy is
armed; the policies below act on armed jobs only, until those end, and
leave everything else as it was.
"""

import asyncio
import hashlib
import json
import os
import random
import struct
import threading
import zlib

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Response

# Request headers that belong to one hop (the proxy makes its own).
HOP_HEADERS = {
    "host", "upgrade", "connection", "content-length", "transfer-encoding",
    "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
    "sec-websocket-protocol", "sec-websocket-accept",
}
KV_HEADER = 40
SOCKET_OPTIONS = dict(max_size=None, compression=None, ping_interval=None, open_timeout=30)


class Honest:
    """Passes everything; the base of the policies. It notes which jobs
    (`assign`, `embed`) and prefill transfers (`prefill`) were assigned
    while the proxy was armed; `hits` counts the messages a policy
    changed."""

    def __init__(self):
        self.hostile = None  # set by Hostile
        self.jobs = set()
        self.transfers = set()
        self.hits = 0

    @property
    def armed(self):
        return self.hostile is not None and self.hostile.armed

    def to_worker(self, msg):
        if self.armed:
            if msg.get("type") in ("assign", "embed"):
                self.jobs.add(msg["job"])
            elif msg.get("type") == "prefill":
                self.transfers.add(msg["transfer"])
        return [msg]

    def from_worker(self, msg):
        return [msg]

    def frame(self, b):
        return b

    def _job(self, msg, *types):
        """Whether `msg` is one of `types` for an armed job."""
        return msg.get("type") in types and msg.get("job") in self.jobs


class ExtraTokens(Honest):
    """Before an armed job's `done`: `n` more tokens than it generated
    (its own ids, cycled), and `done.completion_tokens` raised to match."""

    def __init__(self, n=200):
        super().__init__()
        self.n = n
        self.produced = {}  # (job, attempt) -> tokens sent so far
        self.logprobs = {}  # job -> whether it asked for logprobs

    def to_worker(self, msg):
        if self.armed and msg.get("type") == "assign":
            self.logprobs[msg["job"]] = msg.get("params", {}).get("logprobs") is not None
        return super().to_worker(msg)

    def from_worker(self, msg):
        key = (msg.get("job"), msg.get("attempt"))
        if self._job(msg, "tokens"):
            self.produced.setdefault(key, []).extend(msg["tokens"])
        elif self._job(msg, "done"):
            own = self.produced.pop(key, [])
            if own:
                extra = [dict(own[i % len(own)]) for i in range(self.n)]
            else:
                lp = -1.0 if self.logprobs.get(msg["job"]) else None
                extra = [{"id": 100 + i, "logprob": lp, "top": []} for i in range(self.n)]
            self.hits += 1
            tokens = {"type": "tokens", "v": msg.get("v", 1), "job": msg["job"],
                      "attempt": msg["attempt"], "tokens": extra}
            return [tokens, dict(msg, completion_tokens=msg["completion_tokens"] + self.n)]
        return [msg]


class Later:
    """A message a policy sends at `at` (the proxy loop's clock) instead of
    now; what comes meanwhile goes on."""

    def __init__(self, at, msg):
        self.at, self.msg = at, msg


class Trickle(Honest):
    """An armed job's tokens one at a time, `gap` seconds apart (each gap
    inside the server's progress timeout), its `done` after the last; the
    worker's statuses flow as usual."""

    def __init__(self, gap=4.0):
        super().__init__()
        self.gap = gap
        self.cursor = {}  # job -> when its last token goes

    def from_worker(self, msg):
        if not (self._job(msg, "tokens") or self._job(msg, "done")):
            return [msg]
        self.hits += 1
        now = asyncio.get_running_loop().time()  # the hooks run in the proxy's loop
        job = msg["job"]
        out = []
        singles = ([dict(msg, tokens=[t]) for t in msg["tokens"]]
                   if msg["type"] == "tokens" else [msg])
        for m in singles:
            at = max(now, self.cursor.get(job, now)) + (self.gap if m["type"] == "tokens" else 0)
            self.cursor[job] = at
            out.append(Later(at, m))
        return out


class InflatePrefill(Honest):
    """An armed prefill's `kv_end` claims `value` prompt tokens, none cached."""

    def __init__(self, value=4_000_000_000):
        super().__init__()
        self.value = value

    def from_worker(self, msg):
        if msg.get("type") == "kv_end" and msg.get("transfer") in self.transfers:
            self.hits += 1
            return [dict(msg, prompt_tokens=self.value, cached_tokens=0)]
        return [msg]


class InflateEmbed(Honest):
    """An armed embedding job's `embedded` claims `value` prompt tokens,
    and every vector is replaced by a constant one of the same length."""

    def __init__(self, value=4_000_000_000):
        super().__init__()
        self.value = value

    def from_worker(self, msg):
        if self._job(msg, "embedded"):
            self.hits += 1
            vectors = [[0.1] * len(v) for v in msg["vectors"]]
            return [dict(msg, prompt_tokens=self.value, vectors=vectors)]
        return [msg]


class Empty(Honest):
    """An armed job generates nothing: its `tokens` are dropped and its
    `done` says `stop` after 0 tokens (`accepted` still goes through)."""

    def from_worker(self, msg):
        if self._job(msg, "tokens"):
            self.hits += 1
            return []
        if self._job(msg, "done"):
            self.hits += 1
            return [dict(msg, reason="stop", completion_tokens=0)]
        return [msg]


class ForgeKv(Honest):
    """An armed prefill's KV frames carry random bytes (of the same length,
    with a correct CRC), and its `kv_end.digest` is the SHA-256 of those,
    so only a check of the KV's content can tell."""

    def __init__(self):
        super().__init__()
        self.digests = {}  # transfer -> sha256 of the forged payloads

    def frame(self, b):
        if len(b) < KV_HEADER or b[:4] != b"SYKF":
            return b
        (transfer,) = struct.unpack_from("<Q", b, 8)
        if transfer not in self.transfers:
            return b
        payload = os.urandom(len(b) - KV_HEADER)
        header = bytearray(b[:KV_HEADER])
        struct.pack_into("<I", header, 36, zlib.crc32(payload))
        self.digests.setdefault(transfer, hashlib.sha256()).update(payload)
        self.hits += 1
        return bytes(header) + payload

    def from_worker(self, msg):
        t = msg.get("transfer")
        if msg.get("type") == "kv_end" and t in self.transfers:
            digest = self.digests.pop(t, hashlib.sha256()).hexdigest()
            return [dict(msg, digest=digest)]
        if msg.get("type") == "kv_failed":
            self.digests.pop(t, None)
        return [msg]


class ForgeFirst(Honest):
    """An armed prefill's first token (in its `kv_end`) is another id, its
    reported log-probability unchanged; the KV is left honest."""

    def from_worker(self, msg):
        if msg.get("type") == "kv_end" and msg.get("transfer") in self.transfers:
            self.hits += 1
            first = dict(msg["first"], id=100 + (msg["first"]["id"] + 17) % 900)
            return [dict(msg, first=first)]
        return [msg]


class Garbage(Honest):
    """An armed job's generated token ids are random ids in [100, 1000)
    (logprob fields unchanged)."""

    def __init__(self, seed=None):
        super().__init__()
        self.rng = random.Random(seed)

    def from_worker(self, msg):
        if self._job(msg, "tokens"):
            self.hits += 1
            tokens = [dict(t, id=self.rng.randrange(100, 1000)) for t in msg["tokens"]]
            return [dict(msg, tokens=tokens)]
        return [msg]


class Hostile:
    """The proxy: `Hostile(upstream, tamper).start()`, then give the worker
    `hostile.base.replace("http://", "ws://")`; `armed` switches the tamper
    policy on and off (from any thread); `close()` stops it."""

    def __init__(self, upstream, tamper=None):
        self.upstream = upstream.rstrip("/").replace("http://", "ws://", 1).replace(
            "https://", "wss://", 1)
        self._armed = threading.Event()
        self.tamper = tamper if tamper is not None else Honest()
        self.base = None
        self.connections = 0  # worker connections relayed so far
        self._loop = None
        self._stop = None
        self._thread = None
        self._ready = threading.Event()
        self._error = None

    @property
    def tamper(self):
        return self._tamper

    @tamper.setter
    def tamper(self, tamper):
        tamper.hostile = self
        self._tamper = tamper

    @property
    def armed(self):
        return self._armed.is_set()

    @armed.setter
    def armed(self, on):
        if on:
            self._armed.set()
        else:
            self._armed.clear()

    def start(self):
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()),
                                        name="hostile-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error:
            raise RuntimeError(f"the hostile proxy did not start: {self._error}")
        return self

    def close(self):
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set_result, None)
            self._thread.join(30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *_):
        self.close()

    async def _main(self):
        self._loop = asyncio.get_running_loop()
        self._stop = self._loop.create_future()
        self._upstreams = {}  # worker connection -> its upstream connection
        try:
            server = await serve(self._session, "127.0.0.1", 0,
                                 process_request=self._open_upstream, **SOCKET_OPTIONS)
        except Exception as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            return
        async with server:
            port = server.sockets[0].getsockname()[1]
            self.base = f"http://127.0.0.1:{port}"
            self._ready.set()
            await self._stop
            for up in list(self._upstreams.values()):
                await up.close(1001, "hostile proxy closing")

    async def _open_upstream(self, down, request):
        """Before the worker's upgrade completes: the same upgrade upstream,
        whose refusal (a 401...) is the worker's answer too."""
        headers = [(k, v) for k, v in request.headers.raw_items()
                   if k.lower() not in HOP_HEADERS]
        try:
            up = await connect(self.upstream + request.path, additional_headers=headers,
                               user_agent_header=None, **SOCKET_OPTIONS)
        except InvalidStatus as e:
            r = e.response
            body = r.body or b""
            headers = Headers([("Connection", "close"), ("Content-Length", str(len(body))),
                               ("Content-Type", r.headers.get("Content-Type", "text/plain"))])
            return Response(r.status_code, r.reason_phrase, headers, body)
        except Exception as e:  # noqa: BLE001 - unreachable upstream
            return down.respond(502, f"hostile proxy: upstream failed: {e}")
        self._upstreams[down] = up
        return None

    async def _session(self, down):
        up = self._upstreams[down]
        self.connections += 1
        try:
            tasks = [asyncio.create_task(self._pump(down, up, self._from_worker)),
                     asyncio.create_task(self._pump(up, down, self._to_worker))]
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
            closed = done.pop().result()
            await self._mirror_close(closed, down if closed is up else up)
        finally:
            self._upstreams.pop(down, None)

    @staticmethod
    async def _pump(src, dst, relay):
        """Relays src -> dst until one side closes; returns that side. A
        `Later` message is sent at its time, the rest flowing meanwhile."""
        loop = asyncio.get_running_loop()

        async def later(m):
            await asyncio.sleep(max(0.0, m.at - loop.time()))
            try:
                await dst.send(json.dumps(m.msg, separators=(",", ":")))
            except ConnectionClosed:
                pass
        while True:
            try:
                message = await src.recv()
            except ConnectionClosed:
                return src
            try:
                for out in relay(message):
                    if isinstance(out, Later):
                        asyncio.ensure_future(later(out))
                    else:
                        await dst.send(out)
            except ConnectionClosed:
                return dst

    @staticmethod
    async def _mirror_close(closed, other):
        """Closes `other` the way `closed` was closed: its code and reason,
        an empty close frame, or a dropped connection."""
        p = closed.protocol
        frame = p.close_rcvd or p.close_sent
        if frame is None:
            other.transport.abort()
        elif frame.code == 1005:  # a close frame without a code
            await other.close(None)
        else:
            await other.close(frame.code, frame.reason)

    def _relay(self, message, hook):
        raw = message
        try:
            msg = json.loads(raw)
        except ValueError:
            return [raw]
        if not isinstance(msg, dict):
            return [raw]
        out = hook(msg)
        if len(out) == 1 and out[0] == json.loads(raw):
            return [raw]
        return [m if isinstance(m, Later) else json.dumps(m, separators=(",", ":"))
                for m in out]

    def _from_worker(self, message):
        if isinstance(message, bytes):
            b = self.tamper.frame(message)
            return [] if b is None else [b]
        return self._relay(message, self.tamper.from_worker)

    def _to_worker(self, message):
        if isinstance(message, bytes):
            return [message]
        return self._relay(message, self.tamper.to_worker)
