"""The heterogeneous pipeline (issue 15), with real worker processes on
loopback. Prefill on one worker, decode on another: the KV moves through
the server as checksummed frames, the decode worker verifies it before
its first step, and any doubt (a corrupted frame, a missing end, the
prefill worker killed mid-transfer) ends in a recompute, never in wrong
text. Work stealing: an idle worker takes choices queued on a busy one."""

import re
import signal
import threading
import time
import urllib.request

from conftest import http_call, ticks
from test_fleet import (call, complete, concurrent_streams, fleet, open_server, provider_token, sdk, start_worker, stop,
                        wait_for, workers_up)

# Long enough that the decode worker lacks at least 32 prompt tokens.
PROMPTS = [
    "A list of rivers: the Nile, the Amazon, the Yangtze, the Mississippi, the Danube, "
    "the Volga, the Rhine, the Ganges, the Mekong, the Niger and",
    "Once upon a time, in a kingdom by the sea, there lived a fisherman, his wife, their "
    "three daughters, a cat, a dog, and a very old goat who",
    "Counting slowly: one, two, three, four, five, six, seven, eight, nine, ten, eleven, "
    "twelve, thirteen, fourteen, fifteen,",
]


def metrics(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(synor:(?:kv_transfer|fleet_plans|fleet_steals)\w*)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def transfers(base, outcome):
    return metrics(base).get(f'synor:kv_transfers_total{{outcome="{outcome}"}}', 0)


def kv_bytes(base):
    return metrics(base)["synor:kv_transfer_bytes_total"]


def per_token(base):
    """KV bytes of one position over all layers (K and V, f16)."""
    m = fleet(base)[0]["models"][0]
    return m["layers"] * m["kv_heads"] * m["head_dim"] * 2 * 2


def test_split_output_is_a_single_workers_and_only_uncached_kv_moves():
    srv = open_server("--fleet-split", "always")
    base = srv["base"]
    procs = []
    try:
        want = {p: complete(base, p, 24).choices[0].text for p in PROMPTS}
        longer = PROMPTS[0] + " the Thames, the Seine, the Loire, the Elbe, the Oder, the Vistula, the Dnieper and"
        ref = complete(base, longer, 16).choices[0].text
        created = provider_token(base)
        procs = [start_worker(base, created["token"], name=f"w{i}") for i in (1, 2)]
        workers_up(base, procs, 2)
        per = per_token(base)
        for p in PROMPTS:
            before = kv_bytes(base)
            r = complete(base, p, 24)
            assert r.choices[0].text == want[p], p
            # Neither worker ran this prompt: every position moved.
            assert kv_bytes(base) - before == per * r.usage.prompt_tokens, p
        assert transfers(base, "imported") == len(PROMPTS), metrics(base)
        assert metrics(base)['synor:fleet_plans_total{plan="split"}'] == len(PROMPTS)
        # A longer prompt over one already run: the whole blocks the decode
        # worker holds are not sent again. A decode worker holds only what
        # it computed itself (imported KV never enters its prefix cache),
        # so where it had only imported that prompt, everything moves.
        before = kv_bytes(base)
        r = complete(base, longer, 16)
        sent = (kv_bytes(base) - before) // per
        kept = r.usage.prompt_tokens - sent
        assert 0 < sent <= r.usage.prompt_tokens and kept % 16 == 0, (sent, r.usage)
        assert r.choices[0].text == ref
        # Streams too, concurrently.
        texts, errors = concurrent_streams(base, PROMPTS, 6, 24)
        assert errors == [] and sorted(texts) == [(i, want[PROMPTS[i % 3]]) for i in range(6)]
        # Both workers spent part of the last minute moving KV.
        status, uses = call(base, "GET", "/admin/fleet/utilization")
        ids = {w["id"] for w in fleet(base)}
        moving = {u["executor"]: u["transferring"] for u in uses["data"] if u["executor"] in ids}
        assert status == 200 and len(moving) == 2, uses
        assert all(0 < v < 1 for v in moving.values()), moving
        status, audit = http_call(base, "GET", "/admin/ledger/audit",
                                  token=__import__("conftest").ADMIN_TOKEN)[:2]
        assert status == 200 and audit["violations"] == [], audit
    finally:
        for p in procs:
            stop(p)
        srv["gen"].close()


def test_a_transfer_in_doubt_is_recomputed_and_the_text_stays_right():
    # The faulty worker decodes slowly, so it is the prefill side.
    srv = open_server("--fleet-split", "always", "--fleet-kv-timeout", "1")
    base = srv["base"]
    procs = []
    try:
        # Each case its own prompts: one the decode worker ran is cached there.
        later = [p.replace(",", ";") for p in PROMPTS[:2]]
        want = {p: complete(base, p, 12).choices[0].text for p in PROMPTS + later}
        created = provider_token(base)
        good = start_worker(base, created["token"], "good")
        procs.append(good)
        workers_up(base, procs, 1)

        def with_prefill_worker(*flags):
            bad = start_worker(base, created["token"], "bad", "--debug-token-delay-ms", "20", *flags)
            procs.append(bad)
            workers_up(base, procs, 2)
            return bad

        # A corrupted chunk: the decode worker refuses the KV, recomputes.
        bad = with_prefill_worker("--debug-kv-fault", "corrupt")
        for p in PROMPTS:
            assert complete(base, p, 12).choices[0].text == want[p], p
        assert transfers(base, "recomputed") == len(PROMPTS), metrics(base)
        assert transfers(base, "imported") == 0
        stop(bad)
        procs.remove(bad)
        wait_for(lambda: len(fleet(base)) == 1, what="the bad worker to leave")
        # A dropped end: the server gives the transfer up after 1 s.
        bad = with_prefill_worker("--debug-kv-fault", "drop-end")
        t = time.monotonic()
        assert complete(base, later[0], 12).choices[0].text == want[later[0]]
        assert time.monotonic() - t >= 1.0
        assert transfers(base, "aborted") == 1, metrics(base)
        stop(bad)
        procs.remove(bad)
        wait_for(lambda: len(fleet(base)) == 1, what="the bad worker to leave")
        # The prefill worker killed mid-transfer (each frame takes 300 ms).
        bad = with_prefill_worker("--debug-kv-frame-delay-ms", "300")
        got = {}
        client = threading.Thread(target=lambda: got.update(
            r=complete(base, later[1], 12).choices[0].text))
        frames = metrics(base)["synor:kv_transfer_frames_total"]
        client.start()
        wait_for(lambda: metrics(base)["synor:kv_transfer_frames_total"] > frames,
                 what="the transfer to start")
        bad.send_signal(signal.SIGKILL)
        client.join(timeout=60)
        assert got.get("r") == want[later[1]], got
        assert transfers(base, "aborted") == 2, metrics(base)
    finally:
        for p in procs:
            stop(p)
        srv["gen"].close()


def test_an_idle_worker_takes_work_queued_on_a_busy_one():
    # The real model, one sequence at a time on the busy worker: about a
    # second a request, so the others wait in its queue.
    from conftest import ADMIN_TOKEN, _start
    from test_spotcheck import SMOL, worker
    gen = _start("--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
                 "--placement-house-factor", "1000", "--fleet-steal-after-ms", "300")
    base = next(gen)["base"]
    procs = []
    try:
        client = sdk(base)

        def complete_smol(p):
            return client.completions.create(
                model=SMOL, prompt=p, max_tokens=160, temperature=0,
                extra_body={"ignore_eos": True}, extra_headers={"x-synor-cache": "bypass"},
            ).choices[0].text
        # Enough queued work to outlast the idle worker's calibration
        # (a few seconds: its canaries are re-scored on the house).
        prompts = [f"Story number {i}:" for i in range(10)]
        want = {p: complete_smol(p) for p in prompts}
        created = provider_token(base)
        procs.append(worker(base, created["token"], "busy", "--max-num-seqs", "1"))
        workers_up(base, procs, 1)
        got, errors = {}, []

        def one(p):
            try:
                got[p] = complete_smol(p)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
        threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
        [t.start() for t in threads]
        wait_for(lambda: [w for w in fleet(base) if w["jobs_running"] >= 3], what="a queue")
        procs.append(worker(base, created["token"], "idle"))
        [t.join(timeout=120) for t in threads]
        assert errors == [] and got == want, (errors, got)
        delivered = {w["name"]: w["tokens_delivered"] for w in fleet(base)}
        assert delivered["idle"] > 0, delivered
        assert metrics(base)["synor:fleet_steals_total"] >= 1
    finally:
        for p in procs:
            stop(p)
        gen.close()


def test_embeddings_run_on_a_worker_that_holds_the_encoder():
    from conftest import ADMIN_TOKEN, ROOT, _start
    import os
    import subprocess
    gen = _start("--model", "tiny/tiny.gguf", "--admin-token", ADMIN_TOKEN,
                 "--placement-house-factor", "1000", open_mode=True)
    base = next(gen)["base"]
    proc = None
    try:
        client = sdk(base)
        texts = ["The cat sat on the mat.", "Paris is the capital of France."]
        here = client.embeddings.create(model="all-minilm-l6-v2", input=texts)
        created = provider_token(base)
        binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
        env = dict(os.environ, RUST_LOG="info")
        env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
        proc = subprocess.Popen(
            [binary, "worker", "--server", base.replace("http://", "ws://"), "--token",
             created["token"], "--name", "enc", "--model", "tiny/tiny.gguf", "--threads", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        [w] = wait_for(lambda: [w for w in fleet(base) if w["state"] == "active"], timeout=60,
                       what="the worker")
        assert w["encoders"] == ["all-minilm-l6-v2"], w
        there = client.embeddings.create(model="all-minilm-l6-v2", input=texts)
        for a, b in zip(here.data, there.data):
            assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-4
        assert there.usage.prompt_tokens == here.usage.prompt_tokens
        jobs = lambda: float(re.search(r"^synor:embed_jobs_on_workers_total (\S+)$",  # noqa: E731
                                       urllib.request.urlopen(base + "/metrics").read().decode(),
                                       re.M).group(1))
        assert jobs() == 1
        # Its provider is paid for the tokens it embedded.
        wait_for(lambda: ticks(call(base, "GET", f"/admin/accounts/{created['account_id']}")[1]["balance"]) > 0,
                 timeout=10, what="the provider to be paid")
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
    finally:
        if proc is not None:
            stop(proc)
        gen.close()


def test_a_split_between_a_cpu_and_a_wgpu_worker_moves_kv_and_keeps_the_text():
    # The GPU kernels compute what the CPU computes, and a GPU executor's
    # KV moves in the CPU's bytes: a prompt prefilled on one and decoded on
    # the other gives the house's text.
    srv = open_server("--fleet-split", "always")
    base = srv["base"]
    procs = []
    try:
        want = {p: complete(base, p, 12).choices[0].text for p in PROMPTS}
        created = provider_token(base)
        procs = [start_worker(base, created["token"], "cpu1"),
                 start_worker(base, created["token"], "gpu1", "--device", "wgpu")]
        workers_up(base, procs, 2)
        kinds = {w["name"]: {d["kind"] for d in w["devices"] if d["usable"]} for w in fleet(base)}
        assert "wgpu" in kinds["gpu1"] and "wgpu" not in kinds["cpu1"], kinds
        for p in PROMPTS:
            assert complete(base, p, 12).choices[0].text == want[p], p
        assert transfers(base, "imported") == len(PROMPTS), metrics(base)
    finally:
        for p in procs:
            stop(p)
        srv["gen"].close()
