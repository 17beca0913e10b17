"""How long one key's small requests wait while another key floods the
engine with near-context prompts. A benchmark, not a test: it prints a
table for BENCHMARKS.md.

    .py/venv/bin/python loadtest/key_fairness.py --bin target/debug/synor \
        [--model smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf] \
        [--context 4096] [--flood 8] [--small 6]

A server with API keys starts on a fresh SQLite ledger; key A sends
`--flood` prompts of nearly `--context` tokens at once (each different, so
the prefix cache does not help; 16 tokens out), and key B sends `--small`
short requests (8 tokens out), one every `--every` seconds from the start,
without waiting for each other. Printed: each small request's time to its
answer, and when the flood finished.
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import synor_proc

ADMIN = "key-fairness-admin"


def start(args):
    db = "sqlite://" + tempfile.mkdtemp(prefix="fair-") + "/synor.db"
    return synor_proc.start(args.bin, ["--model", args.model, "--embedding-model", "none",
                                       "--database-url", db, "--admin-token", ADMIN,
                                       "--max-model-len", str(args.context)], args.models_dir)


def call(base, method, path, body=None, token=ADMIN, timeout=600):
    return synor_proc.call(base, method, path, body, token, timeout)


def key(base, name):
    acct = call(base, "POST", "/admin/accounts", {"name": name})
    call(base, "POST", f"/admin/accounts/{acct['id']}/topup", {"amount": "100000"})
    return call(base, "POST", "/admin/keys", {"name": name, "account_id": acct["id"]})["key"]


def complete(base, token, model, prompt, max_tokens):
    t0 = time.monotonic()
    r = call(base, "POST", "/v1/completions",
             {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
              "ignore_eos": True}, token=token)
    return time.monotonic() - t0, r["usage"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/debug/synor")
    ap.add_argument("--model", default="smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--models-dir", default=os.environ.get("SYNOR_MODELS_DIR", "models"))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--flood", type=int, default=8)
    ap.add_argument("--small", type=int, default=6)
    ap.add_argument("--every", type=float, default=3.0)
    args = ap.parse_args()
    proc, base = start(args)
    try:
        a, b = key(base, "flood"), key(base, "small")
        model = call(base, "GET", "/v1/models", token=a)["data"][0]["id"]
        # About 0.9 tokens a word here; leave room for the answer.
        words = int((args.context - 64) * 0.9)
        prompts = [f"Document {i}. " + " ".join(["river", "stone", "light", "market"][j % 4]
                                               for j in range(words))
                   for i in range(args.flood)]
        flood_done = []
        t0 = time.monotonic()

        def one(p):
            _, usage = complete(base, a, model, p, 16)
            flood_done.append((time.monotonic() - t0, usage["prompt_tokens"]))
        threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
        [t.start() for t in threads]
        waits = [None] * args.small

        def small(i):
            waits[i] = complete(base, b, model, f"Say hello, number {i}.", 8)[0]
        smalls = []
        for i in range(args.small):
            time.sleep(args.every)
            smalls.append(threading.Thread(target=small, args=(i,)))
            smalls[-1].start()
        [t.join() for t in threads + smalls]
        prompt_tokens = statistics.mean(n for _, n in flood_done)
        print(f"flood: {args.flood} prompts of {prompt_tokens:.0f} tokens from key A, "
              f"all answered after {max(s for s, _ in flood_done):.1f} s")
        print("| small request (key B) | sent at s | seconds to its answer |")
        print("|---|---|---|")
        for i, w in enumerate(waits):
            print(f"| {i + 1} | {(i + 1) * args.every:.0f} | {w:.2f} |")
        print(f"\nkey B: median {statistics.median(waits):.2f} s, max {max(waits):.2f} s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
