"""One model across several workers: a server serves the default model
whole and, under another name, as a pipeline of real worker processes that
each hold a layer range (`--pipeline-model`, `synor worker --part-model`).
Each worker's `--max-memory` holds at most 14 layers, the ends' holders
11, so the planner needs three of them and gives each 10 layers: the
pipeline's greedy text equals the whole model's, and a stage killed
mid-stream is replaced by a spare worker with the text unchanged."""

import json
import urllib.error
from concurrent.futures import ThreadPoolExecutor
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, _start, ticks
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
                 "--pipeline-model", f"{PIPE}={SMOL}", "--pipeline-micro-batches", "0",
                 "--pipeline-placement", "even")
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


def streamed(base, model, prompt, max_tokens, after, then):
    """The text chunks of a streamed completion; `then()` runs once
    `after` chunks have come."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json",
                                  "x-synor-cache": "bypass"})
    out = []
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            out.append(json.loads(line[6:])["choices"][0]["text"])
            if len(out) == after:
                then()
    return out


def audited(base):
    """The ledger's books balance."""
    status, audit = call(base, "GET", "/admin/ledger/audit")
    assert status == 200 and audit["violations"] == [], audit


def stop_all(workers):
    for w in workers:
        if w.poll() is None:
            stop(w)


def chain(base):
    """The workers holding parts, by first layer: (name, first, end)."""
    held = [(w["name"], h["first"], h["end"]) for w in fleet(base) for h in w["holds"]
            if h["model"] == PIPE]
    return sorted(held, key=lambda x: x[1])


def test_three_workers_of_ten_layers_write_what_the_whole_model_writes_and_are_paid(server):
    base = server["base"]
    providers = [provider_token(base, f"stage{i}") for i in range(3)]
    workers = [part_worker(base, p["token"], f"s{i}") for i, p in enumerate(providers)]
    try:
        wait_for(lambda: len(chain(base)) == 3, timeout=60, what="three stages")
        assert [(f, e) for _, f, e in chain(base)] == [(0, 10), (10, 20), (20, 30)], chain(base)
        prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"]
        for prompt in prompts:
            want = complete(base, WHOLE, prompt, 32)
            assert complete(base, PIPE, prompt, 32) == want, prompt
        # At once: each step's batch goes through the chain in three
        # micro-batches, every stage working on one while the next works
        # on another; the text is the same.
        many = [f"{p} and {i}" for i in range(3) for p in prompts]
        want = [complete(base, WHOLE, p, 24) for p in many]
        with ThreadPoolExecutor(len(many)) as pool:
            got = list(pool.map(lambda p: complete(base, PIPE, p, 24), many))
        assert got == want
        # The workers hold parts, never the whole model.
        for w in fleet(base):
            assert w["models"] == [] and w["parts"][0]["layers"] == 30, w
            assert w["state"] == "active", w
        # The admin sees the chain, stage by stage, with its measures.
        status, pipes = call(base, "GET", "/admin/pipelines")
        assert status == 200, pipes
        [p] = pipes["data"]
        assert p["model"] == PIPE and p["layers"] == 30 and len(p["offered_by"]) == 3, p
        assert [(s["first"], s["end"]) for s in p["stages"]] == [(0, 10), (10, 20), (20, 30)], p
        assert all(s["measured"]["steps"] > 0 and s["measured"]["step_ms"] > 0 for s in p["stages"]), p
        # Each stage's provider is paid its third of what the requests
        # paid providers, and nothing more; the books balance.
        def balance(p):
            return ticks(call(base, "GET", f"/admin/accounts/{p['account_id']}")[1]["balance"])
        wait_for(lambda: all(balance(p) > 0 for p in providers), timeout=10,
                 what="every stage's provider to be paid")
        status, usage = call(base, "GET", "/admin/usage?limit=100")
        assert status == 200, usage
        mine = [r for r in usage["data"] if r["model"] == PIPE]
        assert len(mine) == 12 and all(r["decode_by"].count(",") == 2 for r in mine), mine
        paid = sum(ticks(r["provider_amount"]) for r in mine)
        balances = [balance(p) for p in providers]
        assert sum(balances) == paid, (balances, paid)
        assert max(balances) - min(balances) <= paid // 10, balances
        audited(base)
        # Every stage gone, then a new chain: a prompt whose KV blocks the
        # engine cached on the old one is computed again on the new one,
        # the text the same.
        prompt = ("Once upon a time, in a small village by the sea, there lived an old "
                  "fisherman who every morning rowed out past the rocks to cast his nets")
        want = complete(base, WHOLE, prompt, 32)
        assert complete(base, PIPE, prompt, 32) == want
        for w in workers:
            stop(w)
        wait_for(lambda: chain(base) == [], what="the old stages to leave")
        workers = [part_worker(base, p["token"], f"t{i}") for i, p in enumerate(providers)]
        wait_for(lambda: len(chain(base)) == 3, timeout=60, what="three new stages")
        assert complete(base, PIPE, prompt, 32) == want
    finally:
        stop_all(workers)


def test_a_stage_killed_mid_stream_is_replaced_and_the_text_is_the_same(server):
    base = server["base"]
    token = provider_token(base)["token"]
    workers = [part_worker(base, token, f"k{i}") for i in range(3)]
    try:
        wait_for(lambda: len(chain(base)) == 3, timeout=60, what="three stages")
        spare = part_worker(base, token, "spare")
        workers.append(spare)
        wait_for(lambda: any(w["name"] == "spare" for w in fleet(base)), what="the spare")
        want = complete(base, WHOLE, "Once upon a time", 200)
        middle = next(n for n, f, _ in chain(base) if f > 0 and f < 20)
        assert middle.startswith("k"), chain(base)
        victim = workers[int(middle[1:])]
        # Streamed: the middle stage is killed once 20 chunks have come.
        got = "".join(streamed(base, PIPE, "Once upon a time", 200, after=20, then=victim.kill))
        assert victim.poll() is not None, "the stage was killed mid-stream"
        assert got == want
        assert "spare" in [n for n, _, _ in chain(base)], chain(base)
        audited(base)
    finally:
        stop_all(workers)


def test_measured_placement_moves_layers_to_the_faster_worker():
    """Three workers, two of them slower devices (each step held 2 ms per
    layer): the first chain is even; once every stage has run 50 steps
    the planner moves layers to the fast one, and the text stays the
    whole model's."""
    gen = _start("--model", SMOL, "--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
                 "--pipeline-model", f"{PIPE}={SMOL}")
    base = next(gen)["base"]
    token = provider_token(base)["token"]
    workers = [part_worker(base, token, "fast")]
    workers += [start_worker(base, token, f"slow{i}", "--part-model", f"{PIPE}={SMOL}",
                             "--max-memory", MEMORY, "--debug-layer-delay-us", "2000",
                             model="none") for i in range(2)]
    try:
        wait_for(lambda: len(chain(base)) == 3, timeout=60, what="three stages")
        assert [e - f for _, f, e in chain(base)] == [10, 10, 10], chain(base)
        want = complete(base, WHOLE, "Once upon a time", 24)

        def moved():
            assert complete(base, PIPE, "Once upon a time", 24) == want
            names = {w["id"]: w["name"] for w in fleet(base)}
            _, pipes = call(base, "GET", "/admin/pipelines")
            held = {names.get(s["worker"]): s["end"] - s["first"]
                    for s in pipes["data"][0]["stages"]}
            return held if held.get("fast", 0) > 10 else None
        held = wait_for(moved, timeout=240, what="layers to move to the fast worker")
        assert sum(held.values()) == 30 and len(held) == 3, held
        assert complete(base, PIPE, "Once upon a time", 24) == want
    finally:
        stop_all(workers)
        gen.close()


def test_six_workers_make_two_chains_and_requests_go_to_both(server):
    """Workers enough for two chains: the planner forms a second lane on
    the three workers the first does not use, the dispatcher sends each
    request to the chain expected to serve it soonest, both chains serve,
    and every answer is the whole model's."""
    base = server["base"]
    token = provider_token(base)["token"]
    workers = [part_worker(base, token, f"d{i}") for i in range(6)]
    try:
        def two():
            _, pipes = call(base, "GET", "/admin/pipelines")
            chains = pipes["data"][0]["chains"]
            return chains if len(chains) == 2 else None
        chains = wait_for(two, timeout=60, what="two chains")
        used = [s["worker"] for c in chains for s in c["stages"]]
        assert len(used) == 6 == len(set(used)), chains
        prompts = [f"Story {i}: once upon a time" for i in range(12)]
        want = [complete(base, WHOLE, p, 24) for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda p: complete(base, PIPE, p, 24), prompts))
        assert got == want
        _, pipes = call(base, "GET", "/admin/pipelines")
        for c in pipes["data"][0]["chains"]:
            assert all(s["measured"]["steps"] > 0 for s in c["stages"]), c
        audited(base)
    finally:
        stop_all(workers)


def test_a_stage_that_skips_its_layers_is_caught_and_clawed_back_and_the_others_keep_their_pay():
    """A middle stage that passes its hidden states on without running its
    layers (`--debug-cheat skip-layers`; its memory holds no ends, so the
    plan puts it in the middle) is caught by the first stage check: it is
    quarantined, what it was paid is clawed back and the user refunded;
    the two honest stages pass their checks and keep their pay."""
    from test_spotcheck import checks, journal_of, quarantined
    gen = _start("--model", SMOL, "--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
                 "--pipeline-model", f"{PIPE}={SMOL}", "--spot-check-new-rate", "1")
    base = next(gen)["base"]
    honest = [provider_token(base, f"honest{i}") for i in range(2)]
    liar = provider_token(base, "liar")
    workers = [part_worker(base, p["token"], f"h{i}") for i, p in enumerate(honest)]
    workers.append(start_worker(base, liar["token"], "liar", "--part-model", f"{PIPE}={SMOL}",
                                "--max-memory", "100MiB", "--debug-cheat", "skip-layers",
                                model="none"))
    try:
        wait_for(lambda: len(chain(base)) == 3, timeout=60, what="three stages")
        assert chain(base)[1][0] == "liar", chain(base)
        before = checks(base)
        # Its answer is wrong, but the server cannot know until the check.
        complete(base, PIPE, "The capital of France is", 16)
        wait_for(lambda: quarantined(base, liar), timeout=60, what="the liar to be caught")
        # The honest stages' checks of the same request pass.
        after = wait_for(lambda: (lambda c: c if c["pass"] >= before.get("pass", 0) + 2 else None)(
            checks(base)), timeout=30, what="the honest stages' checks")
        assert after["fail"] == before.get("fail", 0) + 1, (before, after)
        status, records = call(base, "GET", "/admin/spotchecks")
        assert status == 200, records
        by_name = {w["name"]: w["id"] for w in fleet(base)}
        mine = {r["worker_id"]: r for r in records["data"]}
        for name in ("h0", "h1"):
            r = mine[by_name[name]]
            assert r["failed"] == 0 and r["passed"] >= 1, r
        claws = wait_for(lambda: journal_of(base, liar["account_id"], "clawback"), timeout=30,
                         what="the liar's clawback")
        assert len(claws) == 1, claws
        moved = claws[0]["entries"]
        assert ticks(moved[liar["account_id"]]) < 0 < ticks(moved["user:local"]), moved
        assert sum(ticks(v) for v in moved.values()) == 0, moved

        def balance(p):
            return ticks(call(base, "GET", f"/admin/accounts/{p['account_id']}")[1]["balance"])
        assert balance(liar) == 0
        assert all(balance(p) > 0 for p in honest), [balance(p) for p in honest]
        audited(base)
    finally:
        stop_all(workers)
        gen.close()


def test_a_pipeline_model_with_no_chain_answers_503_and_retry_after():
    gen = _start("--model", SMOL, "--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
                 "--pipeline-model", f"{PIPE}={SMOL}", "--pipeline-step-timeout", "2")
    base = next(gen)["base"]
    try:
        body = {"model": PIPE, "prompt": "Hello", "max_tokens": 4}
        req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        assert e.value.code == 503 and e.value.headers["retry-after"], e.value.headers
        error = json.loads(e.value.read())["error"]
        assert error["code"] == "model_unavailable" and PIPE in error["message"], error
        # The whole model on the same server answers meanwhile.
        assert complete(base, WHOLE, "Hello", 4)
    finally:
        gen.close()
