"""Writes one golden file of llama.cpp's logits (called by
scripts/llama-golden.sh; standard library only).

Starts llama-server on the model, tokenizes each prompt as llama.cpp does
(special tokens added), asks for a greedy continuation with the top-k
log-probabilities of every position (from the raw logits, before any
sampler), and writes:

    {"model": file, "sha256": ..., "llama_cpp": version, "k": K,
     "self_spread": {"median", "p90", "max"} (llama.cpp against itself
                    with its other attention path, `-fa off`),
     "cases": [{"prompt": [ids], "tokens": [{"id": i,
                "top": [[id, logprob], ...]}, ...]}, ...]}
(`top` is empty where llama-server gives no log-probabilities: a token
that ends inside a UTF-8 character)
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village by the sea,",
    "List three primary colors:",
    "The quick brown fox",
    "Water boils at a temperature of",
    # A long one (about 1,500 tokens): rotary scaling shows at long range.
    "A ship's log, one line a day.\n" + "".join(
        f"Day {d}: wind from the {['north', 'east', 'south', 'west'][d % 4]}, "
        f"{(d * 7) % 30 + 5} knots; {(d * 13) % 90 + 10} miles made good; "
        f"{['clear', 'rain', 'fog', 'squalls', 'overcast'][d % 5]}.\n" for d in range(1, 61)) + "Day 61:",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wait_up(base, proc):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("llama-server did not come up")


def case(base, prompt, n, k):
    """One token at a time (the prompt and the tokens so far, one new
    token each call, the rest from llama.cpp's cache): one entry per
    position whatever the tokens' text is (a stream of several tokens
    drops the entries of tokens that end inside a UTF-8 character), and
    no end-of-generation bias (`ignore_eos` would be one)."""
    ids = post(base, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
    tokens, cont = [], []
    for _ in range(n):
        r = post(base, "/completion", {
            "prompt": ids + cont, "n_predict": 1, "temperature": 0, "n_probs": k,
            "cache_prompt": True, "seed": 0, "return_tokens": True,
        })
        [token] = r["tokens"]
        probs = r.get("completion_probabilities", [])
        if not probs:
            # llama-server withholds the entry of a token that ends inside
            # a UTF-8 character: the position is fed, not compared.
            tokens.append({"id": token, "top": []})
            cont.append(token)
            continue
        [p] = probs
        top = [[t["id"], t["logprob"]] for t in p["top_logprobs"]]
        if p["id"] != token or top[0][0] != token:
            sys.exit(f"llama.cpp's greedy token {token} is not its top one {top[0]}")
        tokens.append({"id": token, "top": top})
        cont.append(token)
    return {"prompt": ids, "tokens": tokens}


def run(a, extra):
    """Every prompt's case from one llama-server run with `extra` arguments."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [a.server, "-m", a.model, "--port", str(port), "--host", "127.0.0.1", "-t", "2",
         "-c", "2048", "-np", "1", "--no-warmup", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(base, proc)
        return [case(base, p, a.tokens, a.k) for p in PROMPTS]
    finally:
        proc.terminate()
        proc.wait()


def spread(cases, other):
    """How far two runs' top-k log-probabilities are apart (median, p90,
    max, over the positions before their continuations part)."""
    diffs = []
    for x, y in zip(cases, other):
        for p, q in zip(x["tokens"], y["tokens"]):
            if p["id"] != q["id"]:
                break
            theirs = dict(map(tuple, q["top"]))
            diffs += [abs(lp - theirs[i]) for i, lp in p["top"] if i in theirs]
    diffs.sort()
    at = lambda f: round(diffs[round((len(diffs) - 1) * f)], 4) if diffs else 0.0
    return {"median": at(0.5), "p90": at(0.9), "max": at(1.0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-name", required=True, help="the path under the models directory")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="another llama-server argument (repeatable)")
    a = ap.parse_args()
    cases = run(a, a.server_arg)
    # llama.cpp's own spread: its other CPU attention path on the same
    # prompts, compared position by position as the test compares ours.
    other = run(a, [*a.server_arg, "-fa", "off"])
    out = {"model": a.model_name, "sha256": sha256(a.model),
           "llama_cpp": "llama-cpp-python 0.3.36 (vendor/llama.cpp)", "k": a.k,
           "self_spread": spread(cases, other), "cases": cases}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{a.out}: {len(cases)} prompts, {a.tokens} positions each")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
