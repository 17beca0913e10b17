"""Starts the real `synor` binary on a free port for the end-to-end tests.

The binary comes from $SYNOR_BIN (the Makefile passes the one it built);
models from $SYNOR_MODELS_DIR (default ./models).
"""

import os
import queue
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
START_TIMEOUT_S = 120


def _pump(stream, lines):
    for line in iter(stream.readline, ""):
        lines.put(line)


def _synor(*extra, open_mode=True):
    yield from _start(*extra, open_mode=open_mode)


def _start(*extra, open_mode=True):
    if "--database-url" not in extra:
        # Each server its own ledger file, outside the checkout.
        import tempfile
        folder = tempfile.mkdtemp(prefix="synor-e2e-")
        extra = (*extra, "--database-url", f"sqlite://{folder}/synor.db")
    if "--cache-dir" not in extra:
        import tempfile
        extra = (*extra, "--cache-dir", tempfile.mkdtemp(prefix="synor-e2e-cache-"))
    if open_mode:
        extra = ("--open", *extra)
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    env = dict(os.environ)
    env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
    env.setdefault("RUST_LOG", "warn")
    proc = subprocess.Popen(
        [binary, "serve", *([] if "--bind" in extra else ["--bind", "127.0.0.1:0"]), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    seen = []
    base = None
    while base is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("synor did not start:\n" + "".join(seen))
        try:
            line = lines.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        seen.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            base = m.group(1)
    try:
        yield {"base": base, "proc": proc, "log": seen, "lines": lines}
    finally:
        # Also on `close()`: the tests that manage a server's life call it.
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise


@pytest.fixture(scope="session")
def server():
    yield from _synor()


@pytest.fixture(scope="session")
def tiny_server():
    """The tiny fixture model with one sequence slot and one waiting place,
    so a burst of requests overflows the queue."""
    yield from _synor(
        "--model", "tiny/tiny.gguf", "--embedding-model", "none",
        "--max-num-seqs", "1", "--max-waiting", "1",
    )


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory):
    """The tiny model behind API keys, on a fresh SQLite database."""
    db = "sqlite://" + str(tmp_path_factory.mktemp("keys") / "synor.db")
    for info in _synor(
        "--model", "tiny/tiny.gguf", "--embedding-model", "none",
        "--database-url", db, "--admin-token", "e2e-admin",
        open_mode=False,
    ):
        info["database_url"] = db
        yield info


def fresh_postgres_url():
    """A fresh schema in the local `test` database (PostgreSQL is started if
    it is down, with the machine's own command)."""
    up = lambda: subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432"],
                                capture_output=True).returncode == 0
    if not up():
        subprocess.run("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
                       shell=True, check=False)
        for _ in range(50):
            if up():
                break
            time.sleep(0.2)
    name = f"t_{int(time.time())}_{os.urandom(6).hex()}"
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-q",
                    "-c", f"CREATE SCHEMA {name}"], check=True, capture_output=True)
    return f"postgres://postgres@127.0.0.1:5432/test?options[search_path]={name}"


ADMIN_TOKEN = "e2e-admin"

# Amounts on the API are decimal strings of currency units; the tests
# compute in ticks (10^-10 of a unit, the ledger's own integer), exactly.
TICKS_PER_UNIT = 10**10


def ticks(amount):
    """An API amount (a decimal string of units) as integer ticks."""
    from decimal import Decimal
    assert isinstance(amount, str), f"amounts are units strings, got {amount!r}"
    return int(Decimal(amount) * TICKS_PER_UNIT)


def units(n):
    """`n` ticks as the decimal string of units the API takes."""
    from decimal import Decimal
    return format(Decimal(n) / TICKS_PER_UNIT, "f")


def http_call(base, method, path, body=None, token=ADMIN_TOKEN, scheme="Bearer"):
    """One JSON request: (status, decoded body, response headers)."""
    import json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(
        base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"{scheme} {token}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


@pytest.fixture(scope="session")
def billed_server(tmp_path_factory):
    """SmolLM2 behind API keys with the ledger on a fresh SQLite file."""
    db = "sqlite://" + str(tmp_path_factory.mktemp("billing") / "synor.db")
    for info in _synor("--embedding-model", "none", "--database-url", db,
                       "--admin-token", ADMIN_TOKEN, open_mode=False):
        info["database_url"] = db
        yield info


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of our own (so the test can stop it)."""
    port = _free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield {"url": f"redis://127.0.0.1:{port}/", "proc": proc}
    proc.kill()
    proc.wait()
