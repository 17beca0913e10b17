"""The fleet's first part, with real processes on loopback: a provider
created through the admin API gets a worker token; `synor worker` loads its
model, connects to the gateway, registers its devices and its model's KV
geometry and reports its load every second; a wrong or revoked token is
refused at the handshake; the worker reconnects when the server comes
back; SIGTERM or an admin drain makes it leave cleanly."""

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

from conftest import ADMIN_TOKEN, ROOT, _start, http_call

TINY = "tiny/tiny.gguf"


def call(base, method, path, body=None, token=ADMIN_TOKEN):
    return http_call(base, method, path, body, token)[:2]


def start_server(db, bind="127.0.0.1:0"):
    gen = _start("--bind", bind, "--model", TINY, "--embedding-model", "none",
                 "--database-url", db, "--admin-token", ADMIN_TOKEN, open_mode=False)
    info = next(gen)
    info["gen"] = gen
    return info


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(base, token, name="w1"):
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    env = dict(os.environ)
    env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
    env.setdefault("RUST_LOG", "info")
    ws = base.replace("http://", "ws://")
    return subprocess.Popen(
        [binary, "worker", "--server", ws, "--token", token, "--name", name,
         "--model", TINY, "--embedding-model", "none", "--threads", "1", "--region", "eu-north"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def provider_token(base, name="acme"):
    status, created = call(base, "POST", "/admin/providers", {"name": name})
    assert status == 201, created
    assert created["token"].startswith("swt-synor-") and created["account_id"].startswith("provider:")
    return created


def fleet(base):
    status, body = call(base, "GET", "/admin/fleet")
    assert status == 200, body
    return body["data"]


def wait_for(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc, timeout=30):
    """SIGTERM, then the exit code and everything it printed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return finish(proc, timeout)


def finish(proc, timeout=60):
    """Waits for the process to exit by itself."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("the worker did not exit:\n" + out)
    return proc.returncode, out


def fresh_db():
    return "sqlite://" + tempfile.mkdtemp(prefix="synor-fleet-") + "/synor.db"


def test_a_worker_registers_reports_its_load_and_leaves_on_sigterm():
    srv = start_server(fresh_db())
    base = srv["base"]
    try:
        created = provider_token(base)
        worker = start_worker(base, created["token"])
        try:
            [w] = wait_for(lambda: fleet(base), what="the worker to register")
            assert (w["name"], w["provider_id"], w["region"], w["state"]) == \
                ("w1", created["account_id"], "eu-north", "active")
            assert w["token_id"] == created["id"] and w["threads"] == 1
            cpu = w["devices"][0]
            assert cpu["kind"] == "cpu" and cpu["usable"] and cpu["cores"] >= 1, w["devices"]
            [m] = w["models"]
            assert m["name"] == "tiny" and m["layers"] > 0 and m["kv_heads"] > 0 and m["head_dim"] > 0
            # Status arrives every second.
            first = w["last_seen"]
            wait_for(lambda: fleet(base)[0]["last_seen"] >= first + 2, timeout=10, what="heartbeats")
        finally:
            code, out = stop(worker)
        assert code == 0, out
        wait_for(lambda: fleet(base) == [], timeout=10, what="the worker to leave")
    finally:
        srv["gen"].close()


def test_wrong_revoked_or_missing_tokens_are_refused_at_the_handshake():
    srv = start_server(fresh_db())
    base = srv["base"]
    try:
        # No token at all: a plain 401 in the API's error shape.
        req = urllib.request.Request(base + "/v1/providers/connect")
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("connected without a token")
        except urllib.error.HTTPError as e:
            assert e.code == 401 and b"worker token" in e.read()
        bad = start_worker(base, "swt-synor-" + "x" * 40, name="intruder")
        code, out = finish(bad)
        assert code != 0 and "refused the worker token" in out, out
        created = provider_token(base, "revoked")
        status, _ = call(base, "DELETE", f"/admin/providers/tokens/{created['id']}")
        assert status == 200
        code, out = finish(start_worker(base, created["token"]))
        assert code != 0 and "refused the worker token" in out, out
        # A user's API key is not a worker token.
        status, key = call(base, "POST", "/admin/keys", {"name": "user"})
        assert status == 201, key
        code, out = finish(start_worker(base, key["key"]))
        assert code != 0 and "refused the worker token" in out, out
        assert fleet(base) == []
    finally:
        srv["gen"].close()


def test_a_worker_reconnects_when_its_server_comes_back_and_leaves_when_drained():
    db, port = fresh_db(), free_port()
    srv = start_server(db, bind=f"127.0.0.1:{port}")
    base = srv["base"]
    created = provider_token(base)
    worker = start_worker(base, created["token"])
    try:
        wait_for(lambda: fleet(base), what="the first registration")
        srv["gen"].close()
        # A new server on the same address and database (the token stands).
        srv = start_server(db, bind=f"127.0.0.1:{port}")
        [w] = wait_for(lambda: fleet(base), what="the worker to come back")
        assert w["provider_id"] == created["account_id"]
        status, body = call(base, "DELETE", f"/admin/fleet/{w['id']}")
        assert status == 200 and body["state"] == "draining", body
        code, out = finish(worker, timeout=30)
        assert code == 0 and "asked this worker to drain" in out, out
        wait_for(lambda: fleet(base) == [], timeout=10, what="the drained worker to leave")
        status, body = call(base, "DELETE", "/admin/fleet/worker-none-0")
        assert status == 404, body
    finally:
        if worker.poll() is None:
            worker.kill()
        srv["gen"].close()
