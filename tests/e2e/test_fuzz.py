"""Property-based fuzzing with schemathesis: requests generated from
`openapi/openapi.json` against the live server must never get a 5xx (no
crash, no hang: every request has a timeout). Bounded: a fixed seed and a
fixed number of examples per operation."""

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ST = os.path.join(os.path.dirname(sys.executable), "st")


def test_generated_requests_never_get_a_server_error(server):
    p = subprocess.run(
        [ST, "run", os.path.join(ROOT, "openapi", "openapi.json"),
         "--url", server["base"], "--checks", "not_a_server_error",
         "--max-examples", "15", "--request-timeout", "60", "--seed", "1"],
        capture_output=True, text=True, timeout=900,
    )
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    m = re.search(r"(\d+) generated, (\d+) passed", p.stdout)
    assert m and int(m.group(1)) >= 100 and m.group(1) == m.group(2), p.stdout[-3000:]
