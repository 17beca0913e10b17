"""The weights a worker may load, as a browser tab would fetch them: with
a worker token, the served model's file whole or a byte range at a time,
with its SHA-256; resumed from any offset it reassembles to the file on
disk; wrong tokens, unknown models and unsatisfiable ranges are clear
errors in the OpenAI shape."""

import hashlib
import json
import os
import urllib.error
import urllib.request

from conftest import ROOT
from test_fleet import TINY, open_server, provider_token


def fetch(base, path, token=None, rng=None, method="GET"):
    req = urllib.request.Request(base + path, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if rng:
        req.add_header("Range", rng)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def test_a_worker_fetches_its_model_whole_or_in_ranges_and_checks_it():
    srv = open_server()
    try:
        base = srv["base"]
        token = provider_token(base, "tab")["token"]
        models = os.environ.get("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
        with open(os.path.join(models, TINY), "rb") as f:
            want = f.read()
        sha = hashlib.sha256(want).hexdigest()
        path = "/v1/providers/models/tiny/file"
        status, headers, body = fetch(base, path, token)
        assert status == 200 and body == want
        assert headers["x-synor-sha256"] == sha and headers["etag"] == f'"{sha}"'
        assert headers["accept-ranges"] == "bytes" and int(headers["content-length"]) == len(want)
        # In parts, as a download resumed after each one.
        parts, at, step = [], 0, max(1, len(want) // 7)
        while at < len(want):
            status, headers, part = fetch(base, path, token, f"bytes={at}-{at + step - 1}")
            assert status == 206, part
            end = min(at + step, len(want)) - 1
            assert headers["content-range"] == f"bytes {at}-{end}/{len(want)}"
            parts.append(part)
            at += len(part)
        assert b"".join(parts) == want
        status, _, tail = fetch(base, path, token, "bytes=-100")
        assert status == 206 and tail == want[-100:]
        # The headers alone.
        status, headers, body = fetch(base, path, token, method="HEAD")
        assert status == 200 and body == b"" and headers["x-synor-sha256"] == sha
        # Refusals, each in the OpenAI shape.
        for tok, p, rng, code in [
            (None, path, None, 401),
            ("swt-synor-wrong", path, None, 401),
            (token, "/v1/providers/models/none/file", None, 404),
            (token, path, f"bytes={len(want)}-", 416),
            (token, path, "bytes=0-1,5-6", 416),
        ]:
            status, headers, body = fetch(base, p, tok, rng)
            assert status == code, (p, rng, status, body)
            err = json.loads(body)["error"]
            assert err["message"] and err["type"], err
            if code == 416:
                assert headers["content-range"] == f"bytes */{len(want)}"
    finally:
        srv["gen"].close()
