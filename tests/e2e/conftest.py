"""Starts the real `synor` binary on a free port for the end-to-end tests.

The binary comes from $SYNOR_BIN (the Makefile passes the one it built);
models from $SYNOR_MODELS_DIR (default ./models).
"""

import os
import queue
import re
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
    if open_mode:
        extra = ("--open", *extra)
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    env = dict(os.environ)
    env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
    env.setdefault("RUST_LOG", "warn")
    proc = subprocess.Popen(
        [binary, "serve", "--bind", "127.0.0.1:0", *extra],
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
    yield {"base": base, "proc": proc}
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
