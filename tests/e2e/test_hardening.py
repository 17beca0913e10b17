"""Hostile users and careless operators, against the real binary: money
that cannot overflow (HTTP and CLI), bids that need funds and cannot
poison the market's prices, validation before billing, `Bearer` in any
case, throttled admin guesses, slow-header connections closed, a cap on
connections per client, and a drain at shutdown that load balancers can
see."""

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, _start, http_call, ticks, units

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SYNOR = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
I64_MAX = 2**63 - 1


call = http_call


@pytest.fixture(scope="module")
def hard():
    """The tiny model behind keys and an admin token, on its own SQLite."""
    import tempfile
    db = "sqlite://" + tempfile.mkdtemp(prefix="synor-hard-") + "/synor.db"
    for info in _start("--model", "tiny/tiny.gguf", "--embedding-model", "none",
                       "--database-url", db, "--admin-token", ADMIN_TOKEN, open_mode=False):
        info["database_url"] = db
        yield info


def account_with_key(base, amount):
    status, acct, _ = call(base, "POST", "/admin/accounts", {"name": "hostile"})
    assert status == 201, acct
    if amount:
        assert call(base, "POST", f"/admin/accounts/{acct['id']}/topup", {"amount": units(amount)})[0] == 200
    status, key, _ = call(base, "POST", "/admin/keys", {"name": "hostile", "account_id": acct["id"]})
    assert status == 201, key
    return acct["id"], key["key"]


def assert_ledger_readable_and_clean(base, account, key):
    assert call(base, "GET", "/admin/accounts")[0] == 200
    status, audit, _ = call(base, "GET", "/admin/ledger/audit")
    assert status == 200 and audit["violations"] == [], audit
    assert call(base, "GET", "/v1/usage", token=key)[0] == 200


def test_a_huge_top_up_is_refused_and_changes_nothing(hard):
    base = hard["base"]
    account, key = account_with_key(base, 1_000_000)
    huge = [units(9_223_372_036_854_000_000), units(I64_MAX), units(10**15 + 1), "0", "-5", "1e3", "abc"]
    for amount in huge:
        for _ in range(2):
            status, body, _ = call(base, "POST", f"/admin/accounts/{account}/topup", {"amount": amount})
            assert status == 400 and body["error"]["param"] == "amount", (amount, body)
    # A client that still sends ticks as a bare number is told the unit,
    # never credited 10^10 times what it meant.
    for bare in [5_000_000, 2.5]:
        status, body, _ = call(base, "POST", f"/admin/accounts/{account}/topup", {"amount": bare})
        assert status == 400 and body["error"]["param"] == "amount", body
        assert "decimal strings of currency units" in body["error"]["message"], body
    assert ticks(call(base, "GET", f"/admin/accounts/{account}")[1]["balance"]) == 1_000_000
    for system in ["deposits", "treasury"]:
        status, body, _ = call(base, "POST", f"/admin/accounts/{system}/topup", {"amount": "5"})
        assert status == 400, body
    status, body, _ = call(base, "PATCH", f"/admin/accounts/{account}", {"credit_limit": units(I64_MAX)})
    assert status == 400 and body["error"]["param"] == "credit_limit", body
    assert_ledger_readable_and_clean(base, account, key)
    # The CLI refuses the same and leaves the ledger readable.
    db = hard["database_url"]
    p = subprocess.run([SYNOR, "accounts", "--database-url", db, "topup", account, "9223372036854"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "at most" in p.stderr, p.stdout + p.stderr
    p = subprocess.run([SYNOR, "accounts", "--database-url", db, "list"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and account in p.stdout, p.stderr
    assert_ledger_readable_and_clean(base, account, key)


def test_bids_need_funds_sane_prices_and_a_real_instrument(hard):
    base = hard["base"]
    account, key = account_with_key(base, 100_000_000)
    bid = {"instrument": "tiny", "price": units(I64_MAX), "quantity": 1}
    status, body, _ = call(base, "POST", "/v1/market/orders", bid, token=key)
    assert status == 400 and body["error"]["param"] == "price", body
    bid = {"instrument": "no-such-model", "price": units(100), "quantity": 1}
    status, body, _ = call(base, "POST", "/v1/market/orders", bid, token=key)
    assert status == 400 and body["error"]["param"] == "instrument", body
    # A big bid at a sane price: its worst case is more than 100 units.
    _, prices, _ = call(base, "GET", "/v1/market/prices", token=key)
    tiny = next(p for p in prices["data"] if p["model"] == "tiny")
    price = ticks(tiny["prices"]["output"])
    bid = {"instrument": "tiny", "price": units(price), "quantity": 1_000_000_000, "expires_in": 86_400}
    status, body, _ = call(base, "POST", "/v1/market/orders", bid, token=key)
    assert status in (400, 402), body
    status, book, _ = call(base, "GET", "/v1/market/book?instrument=tiny", token=key)
    assert status == 200 and ticks(book.get("best_bid") or "0") <= price * 10, book
    _, after, _ = call(base, "GET", "/v1/market/prices", token=key)
    tiny = next(p for p in after["data"] if p["model"] == "tiny")
    assert ticks(tiny.get("spot", {}).get("last_trade") or "0") <= price * 10, tiny
    assert_ledger_readable_and_clean(base, account, key)


def test_context_length_is_checked_before_billing(hard):
    base = hard["base"]
    _, key = account_with_key(base, 0)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12}
    status, err, _ = call(base, "POST", "/v1/chat/completions", body, token=key)
    assert status == 400 and err["error"]["code"] == "context_length_exceeded", err
    body["max_tokens"] = 1e12  # not an integer: named, still before billing
    status, err, _ = call(base, "POST", "/v1/chat/completions", body, token=key)
    assert status == 400 and err["error"]["param"] == "max_tokens", err


def test_the_bearer_scheme_is_case_insensitive(hard):
    base = hard["base"]
    _, key = account_with_key(base, 1_000_000)
    for scheme in ["bearer", "BEARER", "Bearer"]:
        assert call(base, "GET", "/v1/models", token=key, scheme=scheme)[0] == 200
        assert call(base, "GET", "/admin/accounts", scheme=scheme)[0] == 200


@pytest.fixture
def own_server():
    """A fresh tiny server per test (these tests throttle or stop it)."""
    servers = []

    def start(*extra):
        gen = _start("--model", "tiny/tiny.gguf", "--embedding-model", "none",
                     "--admin-token", ADMIN_TOKEN, *extra)
        info = next(gen)
        servers.append(gen)
        return info

    yield start
    for gen in servers:
        gen.close()


def test_wrong_admin_tokens_are_throttled(own_server):
    base = own_server()["base"]
    statuses = [call(base, "GET", "/admin/accounts", token=f"guess-{i}")[0] for i in range(15)]
    assert statuses[:10] == [401] * 10 and statuses[-1] == 429, statuses
    status, _, headers = call(base, "GET", "/admin/accounts")
    assert status == 429 and int(headers["retry-after"]) >= 1, "even the right token waits"
    time.sleep(int(headers["retry-after"]) + 0.5)
    assert call(base, "GET", "/admin/accounts")[0] == 200


def port_of(base):
    return int(base.rsplit(":", 1)[1])


def closed_after(sock, limit):
    sock.settimeout(limit)
    t0 = time.monotonic()
    try:
        while sock.recv(1024):
            pass
    except socket.timeout:
        return None
    return time.monotonic() - t0


def test_slow_headers_are_cut_and_connections_per_client_are_capped(own_server):
    base = own_server("--header-timeout", "1", "--max-connections-per-client", "8")
    port = port_of(base["base"])
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    for s in slow[:6]:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
    # slow[6:] send nothing at all.
    extra = socket.create_connection(("127.0.0.1", port))
    extra.settimeout(5)
    assert extra.recv(64).startswith(b"HTTP/1.1 503"), "the ninth connection is refused"
    for s in slow:
        took = closed_after(s, 6)
        assert took is not None and took < 4, took
    # Freed: a normal request works again, and an idle kept-alive
    # connection is closed too.
    idle = socket.create_connection(("127.0.0.1", port))
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    idle.settimeout(5)
    assert idle.recv(64).startswith(b"HTTP/1.1 200")
    took = closed_after(idle, 6)
    assert took is not None and took < 4, took


def test_a_draining_server_says_so_and_finishes_running_streams(own_server):
    info = own_server("--shutdown-grace", "30")
    base, proc = info["base"], info["proc"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2000, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "x-synor-cache": "bypass"})
    stream = urllib.request.urlopen(req, timeout=120)
    stream.readline()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/health", timeout=10)
    assert e.value.code == 503 and json.loads(e.value.read())["status"] == "draining"
    with pytest.raises(urllib.error.HTTPError) as e:
        small = dict(body, stream=False, max_tokens=2)
        urllib.request.urlopen(urllib.request.Request(
            base + "/v1/chat/completions", data=json.dumps(small).encode(),
            headers={"content-type": "application/json"}), timeout=10)
    assert e.value.code == 503
    rest = stream.read().decode()
    assert rest.rstrip().endswith("data: [DONE]"), rest[-200:]
    assert proc.wait(timeout=30) == 0


def test_a_short_shutdown_grace_does_not_limit_uptime(own_server):
    base = own_server("--shutdown-grace", "0.5")["base"]
    time.sleep(2.5)
    assert call(base, "GET", "/health")[0] == 200
