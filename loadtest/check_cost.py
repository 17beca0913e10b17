"""What the trust checks cost the house: a real `synor worker` serves
sequential requests while the server spot-checks them at a given rate;
the house seconds spent on checks (`synor:spot_check_seconds_total`) are
compared with the seconds the worker spent answering. A benchmark, not a
test: it prints a table for BENCHMARKS.md.

    .py/venv/bin/python loadtest/check_cost.py --bin target/debug/synor \
        [--rates 0.25,0.02] [--requests 40] [--prompt-words 120] [--max-tokens 64]

For each rate a server (SmolLM2, `--placement-house-factor 1000` so the
worker takes the work) and one worker (1 thread) start; after the worker
is calibrated, `--requests` completions run one after another (seeded
sampling, past the response cache). The share printed is house check
seconds / worker answer seconds: at 0.25 a new provider's cost, at 0.02 a
proven one's (the defaults).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import synor_proc

ADMIN = "check-cost-admin"
MODEL = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


def start_server(args, rate):
    db = "sqlite://" + tempfile.mkdtemp(prefix="cost-") + "/synor.db"
    return synor_proc.start(args.bin, [
        "--open", "--model", MODEL, "--embedding-model", "none", "--admin-token", ADMIN,
        "--placement-house-factor", "1000", "--spot-check-new-rate", str(rate),
        "--spot-check-rate", str(rate), "--database-url", db], args.models_dir)


def call(base, method, path, body=None):
    return synor_proc.call(base, method, path, body, ADMIN, 300)


def metric(base, name):
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def run(args, rate):
    server, base = start_server(args, rate)
    worker = None
    try:
        token = call(base, "POST", "/admin/providers", {"name": "p"})["token"]
        env = dict(os.environ, RUST_LOG="warn", SYNOR_MODELS_DIR=args.models_dir)
        worker = subprocess.Popen(
            [args.bin, "worker", "--server", base.replace("http://", "ws://"), "--token", token,
             "--model", MODEL, "--embedding-model", "none", "--threads", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 120
        while not [w for w in call(base, "GET", "/admin/fleet")["data"] if w["state"] == "active"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker was not calibrated")
            time.sleep(0.2)
        checks0 = metric(base, "synor:spot_checks_total")
        secs0 = metric(base, "synor:spot_check_seconds_total")
        answering = 0.0
        words = ["river", "stone", "light", "market", "garden", "letter", "morning", "train"]
        for i in range(args.requests):
            prompt = f"Note {i}: " + " ".join(words[(i + j) % 8] for j in range(args.prompt_words))
            t0 = time.monotonic()
            call(base, "POST", "/v1/completions",
                 {"model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": args.max_tokens,
                  "temperature": 0.8, "seed": i, "ignore_eos": True})
            answering += time.monotonic() - t0
        time.sleep(2)  # the last checks run after their answers
        checks = metric(base, "synor:spot_checks_total") - checks0
        secs = metric(base, "synor:spot_check_seconds_total") - secs0
        return checks, secs, answering
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        server.terminate()
        server.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/debug/synor")
    ap.add_argument("--models-dir", default=os.environ.get("SYNOR_MODELS_DIR", "models"))
    ap.add_argument("--rates", default="0.25,0.02")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--prompt-words", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    print("| check rate | requests | checks | house s on checks | s per check | worker s answering | share |")
    print("|---|---|---|---|---|---|---|")
    for rate in (float(r) for r in args.rates.split(",")):
        checks, secs, answering = run(args, rate)
        per = secs / checks if checks else 0.0
        print(f"| {rate:g} | {args.requests} | {checks:.0f} | {secs:.2f} | {per:.3f} | "
              f"{answering:.1f} | {secs / answering:.2%} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
