"""The hostile proxy itself (tests/e2e/hostile.py), against an in-process
fake gateway: no synor binary, no model."""

import hashlib
import json
import os
import queue
import struct
import threading
import zlib

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.sync.server import serve

from hostile import ExtraTokens, ForgeKv, Hostile, Honest, InflatePrefill

TOKEN = "good-token"


class FakeGateway:
    """Refuses a wrong token with a 401, answers `register` with `welcome`,
    records the request and everything it receives; the test speaks for
    it through `conn`."""

    def __init__(self):
        self.requests = []
        self.received = queue.Queue()
        self.ready = threading.Event()
        self.conn = None
        self.server = serve(self._handler, "127.0.0.1", 0, process_request=self._check,
                            max_size=None, compression=None)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"

    def _check(self, conn, request):
        self.requests.append(request)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return conn.respond(401, '{"error":"incorrect or revoked worker token"}')
        return None

    def _handler(self, conn):
        self.conn = conn
        try:
            first = conn.recv()
            self.received.put(first)
            conn.send('{"type":"welcome","v":1,"worker_id":"w1","provider_id":"p","heartbeat_ms":1000}')
            self.ready.set()
            for m in conn:
                self.received.put(m)
        except ConnectionClosed:
            pass
        self.received.put(("closed", conn.protocol.close_rcvd))

    def next(self):
        return self.received.get(timeout=10)


@pytest.fixture
def gateway():
    g = FakeGateway()
    yield g
    g.server.shutdown()


def through(hostile, token=TOKEN, **headers):
    uri = hostile.base.replace("http://", "ws://") + "/v1/providers/connect"
    return connect(uri, additional_headers={"Authorization": f"Bearer {token}", **headers},
                   max_size=None, compression=None, open_timeout=10)


def register(ws, gateway):
    raw = '{"type": "register", "v": 1, "name": "n"}'  # spaces: bytes must pass as sent
    ws.send(raw)
    assert gateway.next() == raw
    assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
    assert gateway.ready.wait(10)


def frame(transfer, payload, layer=0, first=0, tokens=1):
    return (b"SYKF" + bytes([1, 1, 0, 0]) + struct.pack("<QI", transfer, layer)
            + bytes([1, 0, 0, 0]) + struct.pack("<IIII", first, tokens, len(payload),
                                                zlib.crc32(payload)) + payload)


def test_unarmed_passes_everything_and_forwards_headers(gateway):
    with Hostile(gateway.base, ExtraTokens(n=5)) as hostile, \
            through(hostile, **{"X-Probe": "yes"}) as ws:
        register(ws, gateway)
        req = gateway.requests[-1]
        assert req.path == "/v1/providers/connect"
        assert req.headers["Authorization"] == f"Bearer {TOKEN}"
        assert req.headers["X-Probe"] == "yes"
        assign = '{"type":"assign","v":1,"job":6,"attempt":1,"model":"m","prompt":[1]}'
        gateway.conn.send(assign)
        assert ws.recv(timeout=10) == assign
        for raw in ['{"type":"tokens","v":1,"job":6,"attempt":1,"tokens":[{"id":5}]}',
                    '{"type":"done","v":1,"job":6,"attempt":1,"reason":"length",'
                    '"prompt_tokens":1,"cached_tokens":0,"completion_tokens":1}']:
            ws.send(raw)
            assert gateway.next() == raw
        f = frame(3, os.urandom(64))
        ws.send(f)
        assert gateway.next() == f
        gateway.conn.send(f)
        assert ws.recv(timeout=10) == f
        assert hostile.tamper.hits == 0 and hostile.connections == 1


def test_a_refused_upgrade_is_relayed(gateway):
    with Hostile(gateway.base) as hostile:
        with pytest.raises(InvalidStatus) as e:
            through(hostile, token="wrong")
        assert e.value.response.status_code == 401
        assert b"revoked worker token" in e.value.response.body


def test_close_codes_and_reasons_go_both_ways(gateway):
    with Hostile(gateway.base) as hostile:
        with through(hostile) as ws:
            register(ws, gateway)
            gateway.conn.close(4003, "quarantined: lied about its counts")
            with pytest.raises(ConnectionClosed) as e:
                ws.recv(timeout=10)
            assert (e.value.rcvd.code, e.value.rcvd.reason) == (
                4003, "quarantined: lied about its counts")
            assert gateway.next()[0] == "closed"
        with through(hostile) as ws:
            register(ws, gateway)
            ws.close(4001, "leaving")
            _, rcvd = gateway.next()
            assert (rcvd.code, rcvd.reason) == (4001, "leaving")


def test_extra_tokens_pad_armed_jobs_only(gateway):
    tamper = ExtraTokens(n=5)
    with Hostile(gateway.base, tamper) as hostile, through(hostile) as ws:
        register(ws, gateway)
        gateway.conn.send('{"type":"assign","v":1,"job":6,"attempt":1}')  # before arming
        ws.recv(timeout=10)
        hostile.armed = True
        gateway.conn.send('{"type":"assign","v":1,"job":7,"attempt":1}')
        ws.recv(timeout=10)

        def job(j):
            ws.send(json.dumps({"type": "tokens", "v": 1, "job": j, "attempt": 1,
                                "tokens": [{"id": 1}, {"id": 2, "logprob": -0.5}]}))
            ws.send(json.dumps({"type": "done", "v": 1, "job": j, "attempt": 1,
                                "reason": "length", "prompt_tokens": 4, "cached_tokens": 0,
                                "completion_tokens": 2}))

        job(6)
        assert [json.loads(gateway.next())["type"] for _ in range(2)] == ["tokens", "done"]
        job(7)
        own, extra, done = (json.loads(gateway.next()) for _ in range(3))
        assert own["tokens"] == [{"id": 1}, {"id": 2, "logprob": -0.5}]
        assert (extra["type"], extra["job"], extra["attempt"]) == ("tokens", 7, 1)
        assert [t["id"] for t in extra["tokens"]] == [1, 2, 1, 2, 1]
        assert (done["type"], done["completion_tokens"]) == ("done", 7)
        assert tamper.hits == 1


def test_inflate_prefill_and_forge_kv_when_armed(gateway):
    with Hostile(gateway.base, InflatePrefill(value=123)) as hostile, through(hostile) as ws:
        register(ws, gateway)
        hostile.armed = True
        gateway.conn.send('{"type":"prefill","v":1,"transfer":9}')
        ws.recv(timeout=10)
        ws.send('{"type":"kv_end","v":1,"transfer":9,"prompt_tokens":4,"cached_tokens":2}')
        end = json.loads(gateway.next())
        assert (end["prompt_tokens"], end["cached_tokens"]) == (123, 0)

        hostile.tamper = ForgeKv()
        gateway.conn.send('{"type":"prefill","v":1,"transfer":10}')
        ws.recv(timeout=10)
        sent = [frame(10, os.urandom(256), layer=i) for i in range(3)]
        for f in sent:
            ws.send(f)
        ws.send(json.dumps({"type": "kv_end", "v": 1, "transfer": 10, "digest": "0" * 64}))
        got = [gateway.next() for _ in sent]
        digest = hashlib.sha256()
        for f, g in zip(sent, got):
            assert len(g) == len(f) and g[:36] == f[:36] and g[40:] != f[40:]
            assert struct.unpack_from("<I", g, 36)[0] == zlib.crc32(g[40:])
            digest.update(g[40:])
        assert json.loads(gateway.next())["digest"] == digest.hexdigest()

        hostile.armed = False
        hostile.tamper = Honest()
        f = frame(10, os.urandom(64))
        ws.send(f)
        assert gateway.next() == f
