"""What the Python benchmarks in loadtest/ share: starting a `synor`
process on a free port (the address read from its log) and calling its
HTTP API with a bearer token."""

import json
import os
import re
import subprocess
import tempfile
import threading
import urllib.request


def start(binary, args, models_dir, what="serve"):
    """Starts `synor <what> --bind 127.0.0.1:0 <args>` with its own cache
    folder; answers the process and its base URL."""
    env = dict(os.environ, RUST_LOG="warn", SYNOR_MODELS_DIR=models_dir)
    proc = subprocess.Popen(
        [binary, what, "--bind", "127.0.0.1:0", *args,
         "--cache-dir", tempfile.mkdtemp(prefix="synor-bench-cache-")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            # Keep reading its log, so a full pipe never blocks it.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError("the server did not start")


def call(base, method, path, body=None, token=None, timeout=600):
    """One JSON call (past the response cache); answers the decoded body."""
    headers = {"content-type": "application/json", "x-synor-cache": "bypass"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base + path, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")
