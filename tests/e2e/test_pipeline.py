"""One model across several workers: a server serves the default model
whole and, under another name, as a pipeline of real worker processes that
each hold a layer range (`--pipeline-model`, `synor worker --part-model`).
Each worker's `--max-memory` holds at most 14 layers, the ends' holders
11, so the planner needs three of them and gives each 10 layers: the
pipeline's greedy text equals the whole model's, and a stage killed
mid-stream is replaced by a spare worker with the text unchanged."""

import json
import threading
import time
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, _start
from test_fleet import call, fleet, provider_token, start_worker, stop, wait_for

SMOL = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
WHOLE = "smollm2-135m-instruct"
PIPE = "smol-pipe"
# A layer of SmolLM2 Q4_1 weighs 2.2 MB plus 6.3 MB of KV (512 blocks);
# its embeddings (the ends) 30 MB.
MEMORY = "124MiB"


@pytest.fixture()
def server():
    gen = _start("--model", SMOL, "--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
                 "--pipeline-model", f"{PIPE}={SMOL}")
    info = next(gen)
    yield info
    gen.close()


def part_worker(base, token, name):
    return start_worker(base, token, name, "--part-model", f"{PIPE}={SMOL}",
                        "--max-memory", MEMORY, model="none")


def complete(base, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json",
                                  "x-synor-cache": "bypass"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["text"]


def chain(base):
    """The workers holding parts, by first layer: (name, first, end)."""
    held = [(w["name"], h["first"], h["end"]) for w in fleet(base) for h in w["holds"]
            if h["model"] == PIPE]
    return sorted(held, key=lambda x: x[1])


def test_three_workers_of_ten_layers_write_what_the_whole_model_writes(server):
    base = server["base"]
    token = provider_token(base)["token"]
    workers = [part_worker(base, token, f"s{i}") for i in range(3)]
    try:
        wait_for(lambda: len(chain(base)) == 3, timeout=60, what="three stages")
        assert [(f, e) for _, f, e in chain(base)] == [(0, 10), (10, 20), (20, 30)], chain(base)
        for prompt in ["The capital of France is", "Once upon a time", "1, 2, 3,"]:
            want = complete(base, WHOLE, prompt, 32)
            assert complete(base, PIPE, prompt, 32) == want, prompt
        # The workers hold parts, never the whole model.
        for w in fleet(base):
            assert w["models"] == [] and w["parts"][0]["layers"] == 30, w
    finally:
        for w in workers:
            stop(w)


def test_a_stage_killed_mid_stream_is_replaced_and_the_text_is_the_same(server):
    base = server["base"]
    token = provider_token(base)["token"]
    workers = [part_worker(base, token, f"k{i}") for i in range(3)]
    try:
        wait_for(lambda: len(chain(base)) == 3, timeout=60, what="three stages")
        spare = part_worker(base, token, "spare")
        workers.append(spare)
        wait_for(lambda: any(w["name"] == "spare" for w in fleet(base)), what="the spare")
        want = complete(base, WHOLE, "Once upon a time", 120)
        middle = next(n for n, f, _ in chain(base) if f > 0 and f < 20)
        victim = next(w for w, i in zip(workers, range(3)) if f"k{i}" == middle)
        got = {}
        t = threading.Thread(target=lambda: got.update(text=complete(base, PIPE, "Once upon a time", 120)))
        t.start()
        time.sleep(1.0)
        assert t.is_alive(), "the stream ended before a stage was killed"
        victim.kill()
        t.join(timeout=300)
        assert got.get("text") == want
        assert "spare" in [n for n, _, _ in chain(base)], chain(base)
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
    finally:
        for w in workers:
            if w.poll() is None:
                stop(w)
