"""Property-based fuzzing with schemathesis: requests generated from
`openapi/openapi.json` against the live server must never get a 5xx (no
crash, no hang: every request has a timeout). Bounded: a fixed seed and a
fixed number of examples per operation. The hooks in `st_hooks.py` point
most bodies at the served models so generation paths are reached too. The
server runs with an admin token and every request carries it, so the admin,
ledger and market routes are fuzzed past authentication as well (and the
ledger's audit must still be clean afterwards)."""

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, _start

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ST = os.path.join(os.path.dirname(sys.executable), "st")


def _served_models(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        ids = [m["id"] for m in json.loads(r.read())["data"]]
    embed = [i for i in ids if "minilm" in i]
    return next(i for i in ids if i not in embed), (embed or [""])[0]


def _successes(base):
    """Successful requests by route, from the server's own HTTP counters."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for route, n in re.findall(
            r'synor:http_requests_total\{route="([^"]+)",method="[A-Z]+",status="20[01]"\} (\d+)', text):
        out[route] = out.get(route, 0) + int(n)
    return out


@pytest.fixture(scope="module")
def server():
    """Open mode (no API keys) with an admin token: generated requests
    carrying the token reach every route."""
    # Schemathesis also sends requests without the token: with the default
    # burst, those would lock the admin routes (429) for the rest of the run.
    yield from _start("--admin-token", ADMIN_TOKEN, "--admin-auth-burst", "1000000")


def _audit(base):
    req = urllib.request.Request(base + "/admin/ledger/audit",
                                 headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_generated_requests_never_get_a_server_error(server, tmp_path):
    chat, embed = _served_models(server["base"])
    before = _successes(server["base"])
    leaks = tmp_path / "leaks.txt"
    models_dir = os.path.realpath(os.environ.get("SYNOR_MODELS_DIR", os.path.join(ROOT, "models")))
    env = dict(os.environ, SCHEMATHESIS_HOOKS="st_hooks",
               PYTHONPATH=os.path.dirname(__file__),
               SYNOR_FUZZ_CHAT_MODEL=chat, SYNOR_FUZZ_EMBED_MODEL=embed,
               SYNOR_FUZZ_LEAKS=str(leaks), SYNOR_FUZZ_SECRETS=os.pathsep.join([models_dir, ROOT]))
    p = subprocess.run(
        [ST, "run", os.path.join(ROOT, "openapi", "openapi.json"),
         "--url", server["base"], "--checks", "not_a_server_error,response_schema_conformance",
         "--header", f"Authorization: Bearer {ADMIN_TOKEN}",
         "--max-examples", "15", "--request-timeout", "60", "--seed", "1"],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    m = re.search(r"(\d+) generated, (\d+) passed", p.stdout)
    assert m and int(m.group(1)) >= 100 and m.group(1) == m.group(2), p.stdout[-3000:]
    # The hooks must have carried cases past validation into the engines.
    after = _successes(server["base"])
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                  "/admin/accounts", "/admin/journal", "/admin/market/regions"):
        assert after.get(route, 0) > before.get(route, 0), (route, before, after)
    assert _audit(server["base"])["violations"] == []
    # No answer, of thousands, showed a backtrace or a server path.
    lines = leaks.read_text().splitlines()
    assert lines.count("CALL") >= 100, "the leak check ran"
    assert [l for l in lines if l != "CALL"] == []
