#!/usr/bin/env python3
"""A pipeline's stages behind slow links (issue 46): SmolLM2 Q4_1 split
over 3 workers (10 layers each), each worker reaching the server through
a proxy that holds every chunk of bytes D ms each way (a round trip of
2D per hop: this machine's kernel has no netem qdisc), for each D given.
The same client (synor-loadtest: random 128-word prompts, 64 tokens, EOS
ignored, the response cache bypassed) at 1 and 8 streams; one engine
(the server's own, the same cores) first, as the compute floor.

Reports, per round trip: 1-stream time per output token against the floor
(3 hops x the round trip + one engine's time per token), and the 8-stream
speed-up over 1 stream. A benchmark, not a test: never run in CI.

    cargo build --release -p synor -p loadtest
    python3 loadtest/pipeline-links.py [ONE_WAY_MS ...]     (default: 10 25)
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from test_pipeline_netns import DelayProxy  # noqa: E402

SYNOR = os.path.join(ROOT, "target", "release", "synor")
LOADTEST = os.path.join(ROOT, "target", "release", "synor-loadtest")
SMOL = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
ADMIN = "bench-admin"


def admin(base, method, path, body=None):
    req = urllib.request.Request(base + path, json.dumps(body).encode() if body else None,
                                 {"authorization": f"Bearer {ADMIN}",
                                  "content-type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def loadtest(base, model, c):
    out = subprocess.run(
        [LOADTEST, "--base-url", base, "--model", model, "--seed", str(c), "--num-prompts",
         str(4 * c), "--max-concurrency", str(c), "--random-input-len", "128",
         "--random-output-len", "64", "--ignore-eos", "--no-progress"],
        capture_output=True, text=True, check=True).stdout
    tput = float(re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", out).group(1))
    tpot = float(re.search(r"Median TPOT \(NVIDIA: ITL\) \(ms\):\s+([\d.]+)", out).group(1))
    return tput, tpot


def main():
    delays = [float(d) for d in sys.argv[1:]] or [10.0, 25.0]
    env = dict(os.environ, SYNOR_MODELS_DIR=os.path.join(ROOT, "models"), RUST_LOG="warn")
    work = tempfile.mkdtemp(prefix="synor-links-")
    server = subprocess.Popen(
        [SYNOR, "serve", "--open", "--bind", "127.0.0.1:0", "--admin-token", ADMIN,
         "--model", SMOL, "--embedding-model", "none", "--database-url",
         f"sqlite://{work}/synor.db", "--pipeline-model", f"pipe={SMOL}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = None
    for line in server.stdout:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            base = m.group(1)
            break
    port = int(base.rsplit(":", 1)[1])
    print(f"machine: {cpu()}, {os.cpu_count()} cores; {time.strftime('%F')}")
    whole1, whole_tpot = loadtest(base, "smollm2-135m-instruct", 1)
    whole8, _ = loadtest(base, "smollm2-135m-instruct", 8)
    print(f"one engine: 1 stream {whole1:.1f} tok/s (TPOT {whole_tpot:.2f} ms); 8 streams {whole8:.1f}")
    token = admin(base, "POST", "/admin/providers", {"name": "links"})["token"]
    for d in delays:
        proxies = [DelayProxy("127.0.0.1", ("127.0.0.1", port), d / 1000) for _ in range(3)]
        workers = [subprocess.Popen(
            [SYNOR, "worker", "--server", f"ws://127.0.0.1:{p.port}", "--token", token,
             "--name", f"far{i}", "--model", "none", "--embedding-model", "none",
             "--part-model", f"pipe={SMOL}", "--max-memory", "124MiB", "--threads", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            for i, p in enumerate(proxies)]
        while sum(any(h["model"] == "pipe" for h in w["holds"])
                  for w in admin(base, "GET", "/admin/fleet")["data"]) != 3:
            time.sleep(0.2)
        time.sleep(1)
        one, tpot = loadtest(base, "pipe", 1)
        eight, _ = loadtest(base, "pipe", 8)
        floor = 3 * 2 * d + whole_tpot
        print(f"round trip {2 * d:.0f} ms a hop: 1 stream {one:.1f} tok/s, TPOT {tpot:.1f} ms "
              f"against a floor of {floor:.1f} ms (3 x {2 * d:.0f} + {whole_tpot:.2f}); "
              f"8 streams {eight:.1f} tok/s, {eight / one:.2f}x one stream")
        for w in workers:
            w.kill()
            w.wait()
        for p in proxies:
            p.close()
        while any(w["holds"] for w in admin(base, "GET", "/admin/fleet")["data"]):
            time.sleep(0.2)
    server.kill()


def cpu():
    with open("/proc/cpuinfo") as f:
        return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))


if __name__ == "__main__":
    main()
