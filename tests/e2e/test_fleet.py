"""The fleet's first part, with real processes on loopback: a provider
created through the admin API gets a worker token; `synor worker` loads its
model, connects to the gateway, registers its devices and its model's KV
geometry and reports its load every second; a wrong or revoked token is
refused at the handshake; the worker reconnects when the server comes
back; SIGTERM or an admin drain makes it leave cleanly."""

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

from conftest import ADMIN_TOKEN, ROOT, _start, http_call, ticks, units

TINY = "tiny/tiny.gguf"

# A usage record's amounts (units strings on the API) as ticks.
AMOUNTS = ("cost", "provider_amount", "fee")


def in_ticks(record):
    return {k: ticks(v) if k in AMOUNTS else v for k, v in record.items()}


def call(base, method, path, body=None, token=ADMIN_TOKEN):
    return http_call(base, method, path, body, token)[:2]


def start_server(db, bind="127.0.0.1:0"):
    gen = _start("--bind", bind, "--model", TINY, "--embedding-model", "none",
                 "--database-url", db, "--admin-token", ADMIN_TOKEN, open_mode=False)
    info = next(gen)
    info["gen"] = gen
    return info


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(base, token, name="w1", *extra, model=TINY):
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    env = dict(os.environ)
    env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
    env.setdefault("RUST_LOG", "info")
    ws = base.replace("http://", "ws://")
    return subprocess.Popen(
        [binary, "worker", "--server", ws, "--token", token, "--name", name,
         "--model", model, "--embedding-model", "none", "--threads", "1", "--region", "eu-north",
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def provider_token(base, name="acme"):
    status, created = call(base, "POST", "/admin/providers", {"name": name})
    assert status == 201, created
    assert created["token"].startswith("swt-synor-") and created["account_id"].startswith("provider:")
    return created


def fleet(base):
    status, body = call(base, "GET", "/admin/fleet")
    assert status == 200, body
    return body["data"]


def wait_for(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc, timeout=30):
    """SIGTERM, then the exit code and everything it printed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return finish(proc, timeout)


def finish(proc, timeout=60):
    """Waits for the process to exit by itself."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("the worker did not exit:\n" + out)
    return proc.returncode, out


def fresh_db():
    return "sqlite://" + tempfile.mkdtemp(prefix="synor-fleet-") + "/synor.db"


def test_a_worker_registers_reports_its_load_and_leaves_on_sigterm():
    srv = start_server(fresh_db())
    base = srv["base"]
    try:
        created = provider_token(base)
        worker = start_worker(base, created["token"])
        try:
            [w] = wait_for(lambda: fleet(base), what="the worker to register")
            # The server measures it before it gets work.
            [w] = wait_for(lambda: [w for w in fleet(base) if w["state"] == "active"],
                           what="the worker to be calibrated")
            assert (w["name"], w["provider_id"], w["region"]) == ("w1", created["account_id"], "eu-north")
            p = w["profile"]
            assert p["prefill_tokens_per_s"] > 0 and 0 < p["decode_step_ms_1"] <= p["decode_step_ms_4"], p
            assert w["token_id"] == created["id"] and w["threads"] == 1
            cpu = w["devices"][0]
            assert cpu["kind"] == "cpu" and cpu["usable"] and cpu["cores"] >= 1, w["devices"]
            [m] = w["models"]
            assert m["name"] == "tiny" and m["layers"] > 0 and m["kv_heads"] > 0 and m["head_dim"] > 0
            # Status arrives every second.
            first = w["last_seen"]
            wait_for(lambda: fleet(base)[0]["last_seen"] >= first + 2, timeout=10, what="heartbeats")
        finally:
            code, out = stop(worker)
        assert code == 0, out
        wait_for(lambda: fleet(base) == [], timeout=10, what="the worker to leave")
    finally:
        srv["gen"].close()


def test_wrong_revoked_or_missing_tokens_are_refused_at_the_handshake():
    srv = start_server(fresh_db())
    base = srv["base"]
    try:
        # No token at all: a plain 401 in the API's error shape.
        req = urllib.request.Request(base + "/v1/providers/connect")
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("connected without a token")
        except urllib.error.HTTPError as e:
            assert e.code == 401 and b"worker token" in e.read()
        bad = start_worker(base, "swt-synor-" + "x" * 40, name="intruder")
        code, out = finish(bad)
        assert code != 0 and "refused the worker token" in out, out
        created = provider_token(base, "revoked")
        status, _ = call(base, "DELETE", f"/admin/providers/tokens/{created['id']}")
        assert status == 200
        code, out = finish(start_worker(base, created["token"]))
        assert code != 0 and "refused the worker token" in out, out
        # A user's API key is not a worker token.
        status, key = call(base, "POST", "/admin/keys", {"name": "user"})
        assert status == 201, key
        code, out = finish(start_worker(base, key["key"]))
        assert code != 0 and "refused the worker token" in out, out
        assert fleet(base) == []
    finally:
        srv["gen"].close()


def test_a_worker_reconnects_when_its_server_comes_back_and_leaves_when_drained():
    db, port = fresh_db(), free_port()
    srv = start_server(db, bind=f"127.0.0.1:{port}")
    base = srv["base"]
    created = provider_token(base)
    worker = start_worker(base, created["token"])
    try:
        wait_for(lambda: fleet(base), what="the first registration")
        srv["gen"].close()
        # A new server on the same address and database (the token stands).
        srv = start_server(db, bind=f"127.0.0.1:{port}")
        [w] = wait_for(lambda: fleet(base), what="the worker to come back")
        assert w["provider_id"] == created["account_id"]
        status, body = call(base, "DELETE", f"/admin/fleet/{w['id']}")
        assert status == 200 and body["state"] == "draining", body
        code, out = finish(worker, timeout=30)
        assert code == 0 and "removed this worker" in out, out
        wait_for(lambda: fleet(base) == [], timeout=10, what="the drained worker to leave")
        status, body = call(base, "DELETE", "/admin/fleet/worker-none-0")
        assert status == 404, body
    finally:
        if worker.poll() is None:
            worker.kill()
        srv["gen"].close()


def test_an_admin_removes_a_worker_at_once_and_its_canaries_are_on_record():
    srv = start_server(fresh_db())
    base = srv["base"]
    worker = start_worker(base, provider_token(base)["token"])
    try:
        [w] = wait_for(lambda: [w for w in fleet(base) if w["state"] == "active"],
                       what="the worker to be calibrated")
        status, checks = call(base, "GET", "/admin/spotchecks")
        assert status == 200, checks
        [rec] = [c for c in checks["data"] if c["worker_id"] == w["id"]]
        assert rec["checked"] >= 1 and rec["passed"] == rec["checked"], rec
        assert rec["failed"] == 0 and rec["last_failure"] is None, rec
        status, body = call(base, "DELETE", f"/admin/fleet/{w['id']}?now=true")
        assert status == 200 and body["state"] == "removed", body
        code, out = finish(worker, timeout=30)
        assert code == 0 and "removed from the fleet by an admin" in out, out
        wait_for(lambda: fleet(base) == [], timeout=10, what="the removed worker to go")
        status, body = call(base, "DELETE", f"/admin/fleet/{w['id']}?now=true")
        assert status == 404, body
    finally:
        if worker.poll() is None:
            worker.kill()
        srv["gen"].close()


def test_a_paused_worker_stays_connected_without_work_until_resumed():
    srv = open_server()
    base = srv["base"]
    worker = start_worker(base, provider_token(base)["token"])
    try:
        workers_up(base, [worker], 1)
        [w] = fleet(base)
        status, body = call(base, "POST", f"/admin/fleet/{w['id']}/pause")
        assert status == 200 and body["state"] == "paused", body
        status, body = call(base, "POST", f"/admin/fleet/{w['id']}/pause")
        assert status == 409 and body["error"]["code"] == "conflict", body
        before = fleet(base)[0]["tokens_delivered"]
        for p in PROMPTS:
            complete(base, p, 8)
        time.sleep(2)
        [w] = fleet(base)
        assert w["state"] == "paused" and w["tokens_delivered"] == before, w
        assert worker.poll() is None, "a paused worker stays connected"
        status, body = call(base, "POST", f"/admin/fleet/{w['id']}/resume")
        assert status == 200 and body["state"] == "active", body
        for p in PROMPTS:
            complete(base, p, 8)
        [w] = fleet(base)
        assert w["tokens_delivered"] >= before + 3 * 8, w
        status, body = call(base, "POST", f"/admin/fleet/{w['id']}/resume")
        assert status == 409, body
        assert call(base, "POST", "/admin/fleet/worker-none-0/pause")[0] == 404
        code, out = stop(worker)
        assert code == 0, out
        assert "paused this worker" in out and "resumed this worker" in out, out
    finally:
        if worker.poll() is None:
            worker.kill()
        srv["gen"].close()


# --- Running work on workers, and losing them mid-stream -----------------

import random
import threading

import openai


def open_server(*extra):
    gen = _start("--model", TINY, "--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
                 "--placement-house-factor", "1000", *extra)
    info = next(gen)
    info["gen"] = gen
    return info


def sdk(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def complete(base, prompt, max_tokens, stream=False):
    return sdk(base).completions.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=stream,
        extra_body={"ignore_eos": True}, extra_headers={"x-synor-cache": "bypass"},
        **({"stream_options": {"include_usage": True}} if stream else {}))


def concurrent_streams(base, prompts, n, max_tokens):
    """`n` streamed completions at once, prompt `i % len(prompts)` for the
    i-th: the (i, text) of each that finished, and the errors of the rest."""
    texts, errors = [], []

    def one(i):
        try:
            chunks = complete(base, prompts[i % len(prompts)], max_tokens, stream=True)
            texts.append((i, "".join(c.choices[0].text for c in chunks if c.choices)))
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(repr(e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    return texts, errors


def workers_up(base, procs, n):
    """Waits for `n` workers, registered and calibrated. Calibrations run one
    at a time, the house's first, and a debug build's wgpu executor on
    lavapipe takes seconds a challenge: the wait grows with `n`."""
    wait_for(lambda: len([w for w in fleet(base) if w["state"] == "active"]) == n,
             timeout=30 + 30 * n, what=f"{n} calibrated workers")
    return procs


PROMPTS = ["The river", "Once upon a time", "1, 2, 3,"]


def synor_cli(*args):
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def test_a_provider_sees_its_work_and_earnings_and_is_paid_out():
    # Earnings final after a second, so a payout can take them.
    srv = open_server("--earnings-window", "1")
    base, ws = srv["base"], srv["base"].replace("http://", "ws://")
    procs = []
    try:
        created = provider_token(base, "seer")
        token = created["token"]
        procs.append(start_worker(base, token, "seer-1", "--status-every", "1"))
        # A worker of a model this server does not serve is told so.
        procs.append(start_worker(base, token, "lost", "--served-model-name", "elsewhere"))
        workers_up(base, procs[:1], 1)
        up = time.monotonic()
        for p in PROMPTS:
            complete(base, p, 12)
        # The vLLM-named series count the worker's requests, labelled by
        # it; the console's overview counts its tokens.
        text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        on = f'executor="seer-1@{created["account_id"]}"'
        def series(name, *labels):
            return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                       if ln.startswith(name + "{") and on in ln and all(x in ln for x in labels))
        assert series("synor:request_success_total", 'finished_reason="length"') == 3, text
        assert series("synor:generation_tokens_total") == 36, text
        assert series("synor:time_to_first_token_seconds_count") == 3, text
        assert series("synor:inter_token_latency_seconds_count") == 33, text
        wait_for(lambda: call(base, "GET", "/admin/overview")[1]["current"]["output_tokens_total"] >= 36,
                 timeout=10, what="the overview to count the worker's tokens")
        def payable():
            status, e = http_call(base, "GET", "/v1/providers/earnings", token=token)[:2]
            assert status == 200, e
            return ticks(e["payable"]) > 0 and e
        earned = wait_for(payable, timeout=20, what="final earnings")
        assert earned["jobs_ok"] >= 3 and ticks(earned["earned_today"]) > 0, earned
        # The CLI shows the same, in units.
        p = synor_cli("providers", "earnings", "--server", ws, "--token", token)
        assert p.returncode == 0, p.stderr
        assert "payable" in p.stdout and "earned today" in p.stdout, p.stdout
        assert "seer-1 (active)" in p.stdout and "spot checks" in p.stdout, p.stdout
        # More than payable is refused; the payable part is paid out once,
        # on record in the ledger.
        too_much = units(ticks(earned["balance"]) * 2 + 1)
        p = synor_cli("providers", "payout", "--server", ws, "--token", token, "--amount", too_much)
        assert p.returncode != 0 and "refused" in p.stderr, p.stdout + p.stderr
        p = synor_cli("providers", "payout", "--server", ws, "--token", token,
                      "--amount", earned["payable"], "--memo", "to my bank")
        assert p.returncode == 0 and f"paid out {earned['payable']}" in p.stdout, p.stdout + p.stderr
        status, paid = http_call(base, "GET", "/v1/providers/payouts", token=token)[:2]
        assert status == 200 and len(paid["data"]) == 1, paid
        [tx] = paid["data"]
        assert tx["entries"][created["account_id"]] == "-" + earned["payable"], tx
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
        # The terminals: the status line (every second: it has had two,
        # however fast the rest went), and the model the server lacks.
        time.sleep(max(0.0, up + 2.5 - time.monotonic()))
        _, out = stop(procs[0])
        assert re.search(r"status: \d+ jobs done \(\d+ lost\) .* tok/s .* spot checks .* earned today \d", out), out
        _, lost = stop(procs[1])
        assert "this server does not serve elsewhere (it serves: tiny)" in lost, lost
    finally:
        for p in procs:
            if p.returncode is None:
                stop(p)
        srv["gen"].close()


def test_greedy_text_is_the_same_on_every_executor_and_streams_spread_over_workers():
    srv = open_server()
    base = srv["base"]
    procs = []
    try:
        # The house engine alone (no worker serves the model yet).
        want = {p: complete(base, p, 40).choices[0].text for p in PROMPTS}
        created = provider_token(base)
        procs = [start_worker(base, created["token"], name=f"w{i}") for i in (1, 2)]
        workers_up(base, procs, 2)
        for p in PROMPTS:
            assert complete(base, p, 40).choices[0].text == want[p], p
        # 32 concurrent streams: all complete, both workers take part.
        texts, errors = concurrent_streams(base, PROMPTS, 32, 24)
        assert errors == [] and len(texts) == 32, errors
        for i, text in texts:
            assert want[PROMPTS[i % 3]].startswith(text), (i, text)
        delivered = {w["name"]: w["tokens_delivered"] for w in fleet(base)}
        assert all(v > 0 for v in delivered.values()), delivered
        # The workers' provider is paid for their tokens (settlement is
        # batched: wait for it), and the books balance.
        def paid():
            return ticks(call(base, "GET", f"/admin/accounts/{created['account_id']}")[1]["balance"]) > 0
        wait_for(paid, timeout=10, what="the provider to be paid")
        # The provider sees it with its worker token.
        status, earned = http_call(base, "GET", "/v1/providers/earnings", token=created["token"])[:2]
        assert status == 200 and earned["provider_id"] == created["account_id"], earned
        usage = next(t for t in earned["totals"] if t["kind"] == "usage")
        assert earned["balance"] == usage["total"] and ticks(usage["total"]) > 0, earned
        assert sorted(w["name"] for w in earned["workers"]) == ["w1", "w2"], earned
        assert http_call(base, "GET", "/v1/providers/earnings", token="swt-synor-nope")[0] == 401
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
        # Each worker was busy part of the last minute, as this server saw.
        status, uses = call(base, "GET", "/admin/fleet/utilization")
        ids = {w["id"] for w in fleet(base)}
        busy = {u["executor"]: u["busy_1m"] for u in uses["data"] if u["executor"] in ids}
        assert status == 200 and len(busy) == 2 and all(0 < b <= 1 for b in busy.values()), uses
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert "synor:executor_busy_ratio{" in metrics
        for name in ("w1", "w2"):
            line = next(ln for ln in metrics.splitlines()
                        if ln.startswith("synor:worker_tokens_delivered_total") and f'name="{name}"' in ln)
            assert float(line.rsplit(" ", 1)[1]) == delivered[name], line
            # Per stage: each worker's prefill and decode, as the relays saw them.
            for stage in ("prefill", "decode"):
                for figure in ("seconds", "tokens"):
                    line = next(ln for ln in metrics.splitlines()
                                if ln.startswith(f"synor:stage_{stage}_{figure}_total")
                                and f'executor="{name}@' in ln)
                    assert float(line.rsplit(" ", 1)[1]) > 0, line
    finally:
        for p in procs:
            stop(p)
        srv["gen"].close()


def test_a_worker_killed_mid_stream_costs_the_client_nothing():
    srv = open_server()
    base = srv["base"]
    procs = {}
    rng = random.Random(14)
    try:
        length = 600
        want = complete(base, "The river", length).choices[0].text
        created = provider_token(base)

        def ensure_two():
            for name in ("a", "b"):
                if name not in procs or procs[name].poll() is not None:
                    # 2 ms a token: the tiny model would otherwise finish all
                    # 600 before the client reads the chunk it kills at.
                    procs[name] = start_worker(base, created["token"], name,
                                               "--debug-token-delay-ms", "2")
            wait_for(lambda: sorted(w["name"] for w in fleet(base) if w["state"] == "active")
                     == ["a", "b"], what="two live, calibrated workers")
            # The previous round's relay lets go of its job just after the
            # last chunk: wait, so only this round's job shows as running.
            wait_for(lambda: all(w["jobs_running"] == 0 for w in fleet(base)), timeout=10,
                     what="the previous job to end")

        for round_ in range(4):
            ensure_two()
            stream = complete(base, "The river", length, stream=True)
            text, usage, killed = "", None, None
            cut = rng.randint(2, 200)
            for n, chunk in enumerate(stream):
                if chunk.choices:
                    text += chunk.choices[0].text
                if chunk.usage:
                    usage = chunk.usage
                if n == cut and killed is None:
                    busy = [w["name"] for w in fleet(base) if w["jobs_running"] > 0]
                    assert len(busy) == 1, fleet(base)
                    killed = busy[0]
                    procs[killed].kill()  # SIGKILL: no goodbye
                    procs[killed].wait()
            assert killed is not None, f"round {round_}: the stream ended before the cut"
            assert text == want, f"round {round_}: the text changed after killing {killed}"
            assert usage is not None and usage.completion_tokens == length, usage
        # Each kill was seen and replayed by the server (its log says so).
        log = []
        while not srv["lines"].empty():
            log.append(srv["lines"].get())
        replays = [line for line in log if "attempt lost; replaying" in line]
        assert len(replays) == 4, "".join(log)
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert "synor:fleet_replays_total 4" in metrics, metrics
        assert "synor:fleet_disconnects_total 4" in metrics, metrics
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
        status, usage = call(base, "GET", "/admin/usage")
        assert status == 200, usage
        billed = [r for r in usage["data"] if r["completion_tokens"] == length]
        assert len(billed) == 5, usage  # the baseline and four streams, once each
        # Usage records name the executors: the house for the baseline; for
        # each killed stream, the worker that prefilled and both that decoded.
        provider = created["account_id"]
        assert sorted(r["prefill_by"] for r in billed).count("cpu") == 1, billed
        for r in (r for r in billed if r["prefill_by"] != "cpu"):
            assert r["prefill_by"] in (f"a@{provider}", f"b@{provider}"), r
            assert sorted(r["decode_by"].split(",")) == [f"a@{provider}", f"b@{provider}"], r
        # The dead workers' reputation pays: four lost attempts against four
        # delivered put their provider under 1.0x (it starts there).
        ensure_two()
        assert all(w["reputation_bps"] < 10_000 for w in fleet(base)), [(w["name"], w["reputation_bps"], w["jobs_lost"], w["tokens_delivered"]) for w in fleet(base)]
    finally:
        for p in procs.values():
            if p.poll() is None:
                stop(p)
        srv["gen"].close()


def test_a_worker_that_stops_answering_loses_its_jobs_and_its_share():
    # The challenge is 8 assignments; after them this worker hangs.
    srv = open_server("--fleet-progress-timeout", "1")
    base = srv["base"]
    procs = []
    try:
        want = complete(base, "Once upon a time", 30).choices[0].text
        created = provider_token(base)
        # Alone, the hung worker gets the next request and loses it: the
        # client still gets the text (replayed on the house engine).
        procs = [start_worker(base, created["token"], "hung", "--debug-stall-after", "8")]
        workers_up(base, procs, 1)
        assert complete(base, "Once upon a time", 30).choices[0].text == want
        hung = next(w for w in fleet(base) if w["name"] == "hung")
        assert hung["jobs_lost"] >= 1 and hung["tokens_delivered"] == 0, hung
        # With a working peer, the work goes where it is done.
        procs.append(start_worker(base, created["token"], name="good"))
        workers_up(base, procs, 2)
        for _ in range(4):
            assert complete(base, "Once upon a time", 30).choices[0].text == want
        good = next(w for w in fleet(base) if w["name"] == "good")
        assert good["tokens_delivered"] >= 4 * 30, good
    finally:
        for p in procs:
            stop(p)
        srv["gen"].close()


def gross(net, fee_bps):
    return net + (net * fee_bps + 9_999) // 10_000


def test_the_cheaper_worker_gets_the_work_and_each_provider_earns_its_own_price():
    # Price weighs most here: on a busy machine two equally fast workers'
    # measured speeds and loads wander, and with the default weights that
    # noise sent a few of the sequential requests to the dearer one.
    srv = open_server("--placement-weights",
                      "cost=0.6,latency=0.1,capability=0.1,reputation=0.1,load=0.1")
    base = srv["base"]
    procs = []
    try:
        status, prices = call(base, "GET", "/v1/market/prices")
        assert status == 200, prices
        house = next(m for m in prices["data"] if m["model"] == "tiny")
        fee = house["fee_bps"]
        # Both within the market's band of the house's posted price; one at
        # half the other. A third asks 100x: the market refuses to list it.
        out = ticks(house["prices"]["output"])
        cheap_net, dear_net = out // 2, out
        cheap, dear, greedy = (provider_token(base, n) for n in ("cheap", "dear", "greedy"))
        procs = [start_worker(base, cheap["token"], "c", "--price", f"output={units(cheap_net)}"),
                 start_worker(base, dear["token"], "d", "--price", f"output={units(dear_net)}"),
                 start_worker(base, greedy["token"], "g", "--price", f"output={units(out * 100)}")]
        workers_up(base, procs, 3)
        by_name = {w["name"]: w for w in fleet(base)}
        assert ticks(by_name["c"]["asks"][0]["output"]) == cheap_net, by_name["c"]
        # Sequential requests: the cheap worker, equally fast, gets them.
        for _ in range(5):
            complete(base, "The river", 20)
        by_name = {w["name"]: w for w in fleet(base)}
        assert by_name["c"]["tokens_delivered"] >= 5 * 20, {
            n: (w["tokens_delivered"], w["profile"]) for n, w in by_name.items()}
        assert by_name["d"]["tokens_delivered"] <= 20, by_name
        # Each request is billed at the price of the executor it ran on:
        # the cheap worker's ask with the fee added.
        status, usage = call(base, "GET", "/admin/usage?limit=500")
        assert status == 200, usage
        mine = [in_ticks(r) for r in usage["data"] if r["provider_id"] == cheap["account_id"]]
        assert len(mine) >= 4, usage["data"]
        g = gross(cheap_net, fee)
        for r in mine:
            tokens = r["prompt_tokens"] + r["completion_tokens"]
            assert r["cost"] == -(-tokens * g // 1_000_000), (r, g)
            assert r["provider_amount"] + r["fee"] == r["cost"], r
            # What its user paid less the fee: never a multiple of it.
            net = r["cost"] - -(-r["cost"] * fee // (10_000 + fee))
            assert r["provider_amount"] == net, (r, net)
        # Each provider is paid exactly its usage records' amounts.
        def balance(p):
            return ticks(call(base, "GET", f"/admin/accounts/{p['account_id']}")[1]["balance"])
        wait_for(lambda: balance(cheap) > 0, timeout=10, what="the cheap provider to be paid")
        status, everything = call(base, "GET", "/admin/usage?limit=500")
        paid = sum(ticks(r["provider_amount"]) for r in everything["data"]
                   if r["provider_id"] == cheap["account_id"])
        assert balance(cheap) == paid, (balance(cheap), paid)
        # The book lists the listable asks at their gross prices; the
        # greedy one was refused and dropped: that worker takes the house's.
        def book():
            spot = call(base, "GET", "/v1/market/book?instrument=tiny")[1]
            return {ticks(lvl["price"]) for lvl in spot["asks"]}
        wait_for(lambda: {gross(cheap_net, fee), gross(dear_net, fee)} <= book(), timeout=20,
                 what="the workers' asks in the book")
        wait_for(lambda: [w["asks"] for w in fleet(base) if w["name"] == "g"] == [[]], timeout=20,
                 what="the greedy ask to be refused")
        assert gross(out * 100, fee) not in book()
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
    finally:
        for p in procs:
            stop(p)
        srv["gen"].close()


def test_two_replicas_on_one_postgres_share_a_worker_over_the_bus(private_redis):
    from conftest import fresh_postgres_url
    db = fresh_postgres_url()
    args = ("--model", TINY, "--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
            "--database-url", db, "--placement-house-factor", "1000",
            "--fleet-bus", private_redis["url"], "--fleet-bus-namespace", "t" + os.urandom(4).hex())
    a, b = _start(*args), _start(*args)
    worker = None
    try:
        ra, rb = next(a), next(b)
        # The house engine of replica B, before any worker: the reference.
        want = {p: complete(rb["base"], p, 24).choices[0].text for p in PROMPTS}
        created = provider_token(ra["base"])
        # Each token held 5 ms: a stream lasts long enough to be cut.
        worker = start_worker(ra["base"], created["token"], "shared", "--debug-token-delay-ms", "5")
        workers_up(ra["base"], [worker], 1)
        # B lists the worker connected to A, with A's measurements.
        [w] = wait_for(lambda: [w for w in fleet(rb["base"]) if w["state"] == "active"],
                       timeout=10, what="replica B to see A's worker")
        assert w["name"] == "shared" and w["profile"] is not None, w
        assert w["replica"] == fleet(ra["base"])[0]["replica"] != "local", w
        # Requests to B run on the worker connected to A, with the same text.
        for p in PROMPTS:
            assert complete(rb["base"], p, 24).choices[0].text == want[p], p
        status, usage = call(rb["base"], "GET", "/admin/usage?limit=100")
        on_worker = [r for r in usage["data"] if r["decode_by"] == f"shared@{created['account_id']}"]
        assert len(on_worker) >= 3, usage["data"]
        wait_for(lambda: fleet(ra["base"])[0]["tokens_delivered"] >= 3 * 24, timeout=10,
                 what="A to count what its worker delivered for B")
        # Killed mid-stream, the worker's loss crosses the bus: B replays
        # on its own engine and the client sees the same text.
        stream = complete(rb["base"], "The river", 200, stream=True)
        text = ""
        for n, chunk in enumerate(stream):
            if chunk.choices:
                text += chunk.choices[0].text
            if n == 5:
                worker.kill()
                worker.wait()
        assert text == complete(rb["base"], "The river", 200).choices[0].text
        metrics = urllib.request.urlopen(rb["base"] + "/metrics", timeout=10).read().decode()
        replays = next(ln for ln in metrics.splitlines() if ln.startswith("synor:fleet_replays_total"))
        assert int(replays.split()[1]) >= 1, replays
        # One order book: an ask posted on A is on B's book, and B's bid
        # fills it.
        status, prices = call(rb["base"], "GET", "/v1/market/prices")
        out = ticks(next(m for m in prices["data"] if m["model"] == "tiny")["prices"]["output"])
        odd = units(out - 7)  # a price no house ask has
        status, placed = call(ra["base"], "POST", "/admin/market/orders",
                              {"instrument": "tiny", "price": odd, "quantity": 3,
                               "account_id": created["account_id"]})
        assert status == 201, placed
        book = call(rb["base"], "GET", "/v1/market/book?instrument=tiny")[1]
        assert odd in [lvl["price"] for lvl in book["asks"]], book
        status, bid = call(rb["base"], "POST", "/v1/market/orders",
                           {"instrument": "tiny", "price": odd, "quantity": 3, "expires_in": 60})
        assert status == 201 and sum(f["quantity"] for f in bid["fills"]) == 3, bid
        book = call(ra["base"], "GET", "/v1/market/book?instrument=tiny")[1]
        assert odd not in [lvl["price"] for lvl in book["asks"]], book
        # An admin of B pauses and resumes a worker connected to A (A keeps
        # its state and announces it), then sends it away: it leaves cleanly.
        worker = start_worker(ra["base"], created["token"], "second")
        [w2] = wait_for(lambda: [w for w in fleet(rb["base"]) if w["name"] == "second"
                                 and w["state"] == "active"], what="B to see the second worker")
        for verb, want in (("pause", "paused"), ("resume", "active")):
            status, body = call(rb["base"], "POST", f"/admin/fleet/{w2['id']}/{verb}")
            assert status == 200 and body["state"] == want, body
            for r in (ra, rb):
                wait_for(lambda: [w["state"] for w in fleet(r["base"]) if w["name"] == "second"]
                         == [want], timeout=10, what=f"{want} on every replica")
        status, drained = call(rb["base"], "DELETE", f"/admin/fleet/{w2['id']}")
        assert status == 200, drained
        code, out = finish(worker, timeout=30)
        assert code == 0, out
        wait_for(lambda: fleet(rb["base"]) == [], timeout=10, what="B to forget the drained worker")
        # One ledger, billed once, clean.
        for r in (ra, rb):
            status, audit = call(r["base"], "GET", "/admin/ledger/audit")
            assert status == 200 and audit["violations"] == [], audit
    finally:
        if worker is not None and worker.poll() is None:
            stop(worker)
        a.close()
        b.close()


class RawWorker:
    """A hand-made WebSocket client speaking the worker protocol, so a test
    can send what a real worker never would."""

    def __init__(self, base, token):
        import base64
        host, port = base.replace("http://", "").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((
            f"GET /v1/providers/connect HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {token}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, payload, opcode=1):
        import struct
        data = payload.encode() if isinstance(payload, str) else payload
        n = len(data)
        header = bytes([0x80 | opcode])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self):
        """(opcode, payload) of the next frame."""
        import struct

        def exact(n):
            buf = b""
            while len(buf) < n:
                chunk = self.sock.recv(n - len(buf))
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            return buf
        b0, b1 = exact(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", exact(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", exact(8))[0]
        return b0 & 0x0F, exact(n)

    def close_reason(self):
        """Reads until the server's close frame: (code, reason)."""
        import struct
        while True:
            op, data = self.recv()
            if op == 8:
                return struct.unpack(">H", data[:2])[0], data[2:].decode()


REGISTER = {"v": 1, "type": "register", "name": "hostile", "build": "x", "devices": [],
            "models": [{"name": "tiny", "layers": 2, "kv_heads": 2, "head_dim": 32,
                        "block_size": 16, "context_length": 512}],
            "threads": 1, "region": "x"}


def test_a_hostile_worker_is_cut_off_and_the_server_keeps_serving():
    import json
    srv = open_server()
    base = srv["base"]
    try:
        want = complete(base, "The river", 16).choices[0].text
        created = provider_token(base)
        # A flood of status messages: back-pressure holds it, the server
        # keeps answering, and the flood costs it nothing but the socket.
        w = RawWorker(base, created["token"])
        w.send(json.dumps(REGISTER))
        op, welcome = w.recv()
        assert json.loads(welcome)["type"] == "welcome", welcome
        status = json.dumps({"v": 1, "type": "status",
                             "load": {"queued": 0, "running": 0, "free_kv_blocks": 9, "step_ms": 1.0}})
        stop_at = time.monotonic() + 3
        flood = threading.Thread(target=lambda: [w.send(status) for _ in iter(
            lambda: time.monotonic() < stop_at, False)], daemon=True)
        flood.start()
        t = time.monotonic()
        assert complete(base, "The river", 16).choices[0].text == want
        assert time.monotonic() - t < 10
        flood.join()
        # Then a control message over its limit: closed with 1009 and why.
        w.send("x" * (100 << 10))
        code, reason = w.close_reason()
        assert code == 1009 and "over the 65536-byte limit" in reason, (code, reason)
        # A frame past the socket's own limit ends the connection before
        # anything is buffered.
        w = RawWorker(base, created["token"])
        w.send(json.dumps(REGISTER))
        w.recv()
        try:
            w.send(b"\0" * (2 << 20), opcode=2)
            w.close_reason()
        except (ConnectionError, OSError):
            pass
        # Tokens for a job it was never given: closed with 1008.
        w = RawWorker(base, created["token"])
        w.send(json.dumps(REGISTER))
        w.recv()
        w.send(json.dumps({"v": 1, "type": "tokens", "job": 12345, "attempt": 1,
                           "tokens": [{"id": 5}]}))
        assert w.close_reason() == (1008, "job 12345 was not given to this worker")
        # A geometry that cannot be: refused at registration.
        w = RawWorker(base, created["token"])
        w.send(json.dumps({**REGISTER, "models": [{**REGISTER["models"][0], "head_dim": 0}]}))
        code, reason = w.close_reason()
        assert code == 1008 and "impossible geometry" in reason, reason
        assert http_call(base, "GET", "/health")[0] == 200
        assert complete(base, "The river", 16).choices[0].text == want
        wait_for(lambda: fleet(base) == [], timeout=10, what="the hostile sessions to end")
    finally:
        srv["gen"].close()
