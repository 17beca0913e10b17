"""Untrusted providers (issue 41), with a real `synor worker` behind a
hostile proxy (`hostile.py`) that calibrates honestly, then lies: about
the tokens it produced, the prompt it prefilled, the inputs it embedded,
or by answering nothing at all. The server bills and pays only what it
counted itself, and no provider is ever paid more than its users paid
for its work less the protocol fee; the ledger's audit checks it. A
sanction follows the token: every live connection, every replica,
every restart, until an admin clears it."""

import re
import urllib.request

import pytest

from conftest import fresh_postgres_url, ticks
from hostile import (Empty, ExtraTokens, ForgeFirst, ForgeKv, Garbage, Hostile, InflateEmbed, InflatePrefill,
                     Trickle)
from test_fleet import (call, complete, finish, fleet, in_ticks, open_server, provider_token, sdk, start_worker, units,
                        stop, wait_for, workers_up)
from test_split import PROMPTS, transfers


def fee_inside(cost, fee_bps):
    """The protocol fee inside a cost, rounded up (the ledger's rule)."""
    return -(-cost * fee_bps // (10_000 + fee_bps))


def fee_bps(base):
    status, prices = call(base, "GET", "/v1/market/prices")
    assert status == 200, prices
    return next(m for m in prices["data"] if m["model"] == "tiny")["fee_bps"]


def usage(base):
    """Every usage record with the platform's split (amounts in ticks)."""
    status, body = call(base, "GET", "/admin/usage?limit=500")
    assert status == 200, body
    return {r["request_id"]: in_ticks(r) for r in body["data"]}


def balance(base, account):
    return ticks(call(base, "GET", f"/admin/accounts/{account}")[1]["balance"])


def violations(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    return float(re.search(r"^synor:fleet_protocol_violations_total (\S+)$", text, re.M).group(1))


def assert_paid_within_what_users_paid(base, records, fee):
    """Every record: the fee is at least the protocol's, the providers'
    part at most the rest; and the audit agrees."""
    for r in records:
        assert r["fee"] >= fee_inside(r["cost"], fee), r
        assert 0 <= r["provider_amount"] <= r["cost"] - fee_inside(r["cost"], fee), r
    status, audit = call(base, "GET", "/admin/ledger/audit")
    assert status == 200 and audit["violations"] == [], audit
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    assert re.search(r"^synor:ledger_audit_violations 0$", text, re.M), "the audit in /metrics"


def hostile_worker(base, tamper, name="w1", *extra):
    proxy = Hostile(base, tamper).start()
    return proxy, start_worker(proxy.base, provider_token(base, name)["token"], name, *extra)


def encoder_worker(base, token):
    """A worker serving the tiny model and the default encoder."""
    import os
    import subprocess
    from conftest import ROOT
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    env = dict(os.environ, RUST_LOG="info")
    env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
    return subprocess.Popen(
        [binary, "worker", "--server", base.replace("http://", "ws://"), "--token", token,
         "--name", "enc", "--model", "tiny/tiny.gguf", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def shut(procs, proxy, *servers):
    """Stops the workers, the proxy and the servers a test started."""
    for p in procs:
        if p is not None:
            stop(p)
    if proxy is not None:
        proxy.close()
    for g in servers:
        g.close()


def new_records(base, before):
    return [r for rid, r in usage(base).items() if rid not in before]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_lying_worker_is_paid_only_what_the_server_counted_and_never_past_the_fee(backend):
    srv = open_server(*(["--database-url", fresh_postgres_url()] if backend == "postgres" else []))
    base = srv["base"]
    proxy = proc = None
    try:
        fee = fee_bps(base)
        # House-served requests: the house is paid like any provider.
        for p in PROMPTS[:2]:
            complete(base, p, 8)
        assert_paid_within_what_users_paid(base, usage(base).values(), fee)
        proxy, proc = hostile_worker(base, ExtraTokens(200))
        workers_up(base, [proc], 1)
        provider = fleet(base)[0]["provider_id"]
        # Honest work first (the proxy is not armed): paid its price less
        # the fee, never a multiple of what the user paid.
        seen = usage(base)
        for p in PROMPTS:
            complete(base, p, 8)
        honest = new_records(base, seen)
        assert [r["provider_id"] for r in honest] == [provider] * 3, honest
        for r in honest:
            assert r["provider_amount"] == r["cost"] - fee_inside(r["cost"], fee), r
        assert_paid_within_what_users_paid(base, honest, fee)
        paid = balance(base, provider)
        assert paid == sum(r["provider_amount"] for r in honest), (paid, honest)
        # 200 tokens past `max_tokens`: the client gets 8, the user pays
        # for 8, the worker is paid for 8 (and its standing pays).
        proxy.armed = True
        before, seen = violations(base), usage(base)
        r = complete(base, PROMPTS[0], 8)
        assert r.usage.completion_tokens == 8, r.usage
        assert proxy.tamper.hits >= 1, "the proxy padded the answer"
        assert violations(base) >= before + 1
        [rec] = new_records(base, seen)
        assert rec["completion_tokens"] == 8, rec
        assert balance(base, provider) - paid <= rec["cost"] - fee_inside(rec["cost"], fee)
        # Streamed, the same: no chunk past the eighth token.
        chunks = list(complete(base, PROMPTS[1], 8, stream=True))
        assert [c.usage.completion_tokens for c in chunks if c.usage] == [8]
        # An answer with no tokens, `done` at once: not paid, lost, and
        # served elsewhere in full.
        proxy.tamper = Empty()
        paid, seen = balance(base, provider), usage(base)
        lost = fleet(base)[0]["jobs_lost"]
        r = complete(base, PROMPTS[2], 8)
        assert r.usage.completion_tokens == 8 and r.choices[0].text, r
        assert proxy.tamper.hits >= 1, "the proxy emptied the answer"
        assert balance(base, provider) == paid, "an empty answer is not paid"
        assert fleet(base)[0]["jobs_lost"] > lost
        assert_paid_within_what_users_paid(base, new_records(base, seen), fee)
    finally:
        shut([proc], proxy, srv["gen"])


def test_a_prefill_worker_that_inflates_its_prompt_count_is_paid_for_the_real_prompt():
    srv = open_server("--fleet-split", "always")
    base = srv["base"]
    procs, proxy = [], None
    try:
        fee = fee_bps(base)
        honest = complete(base, PROMPTS[0], 8)
        proxy = Hostile(base, InflatePrefill(4_000_000_000)).start()
        token = provider_token(base, "liar")["token"]
        procs = [start_worker(proxy.base, token, f"w{i}") for i in (1, 2)]
        workers_up(base, procs, 2)
        provider = fleet(base)[0]["provider_id"]
        proxy.armed = True
        seen = usage(base)
        r = complete(base, PROMPTS[0], 8)
        assert proxy.tamper.hits >= 1, "the prefill's count was inflated"
        assert r.usage.prompt_tokens == honest.usage.prompt_tokens, r.usage
        assert r.choices[0].text == honest.choices[0].text
        [rec] = new_records(base, seen)
        assert rec["prompt_tokens"] == honest.usage.prompt_tokens, rec
        assert balance(base, provider) <= rec["cost"] - fee_inside(rec["cost"], fee)
        assert_paid_within_what_users_paid(base, [rec], fee)
    finally:
        shut(procs, proxy, srv["gen"])


def quarantined(base, token):
    rows = call(base, "GET", "/admin/providers/tokens")[1]["data"]
    return next(t for t in rows if t["id"] == token["id"])["quarantined_at"] is not None


def test_a_prefill_worker_that_forges_kv_or_its_first_token_harms_no_one_but_itself():
    srv = open_server("--fleet-split", "always", "--spot-check-new-rate", "1", "--placement-weights",
                      "cost=0.6,latency=0.1,capability=0.1,reputation=0.1,load=0.1")
    base = srv["base"]
    procs, proxy = [], None
    try:
        later = ["Another story. " + p for p in PROMPTS]
        want = {p: complete(base, p, 8).choices[0].text for p in PROMPTS + later}
        out = ticks(next(m for m in call(base, "GET", "/v1/market/prices")[1]["data"]
                         if m["model"] == "tiny")["prices"]["output"])
        # The honest worker asks less, so it is placed as the decode side
        # and the forger, the only other, prefills.
        honest, forger = provider_token(base, "honest"), provider_token(base, "forger")
        proxy = Hostile(base, ForgeKv()).start()
        procs = [start_worker(base, honest["token"], "h", "--price", f"output={units(out // 2)}"),
                 start_worker(proxy.base, forger["token"], "f", "--price", f"output={units(out)}")]
        workers_up(base, procs, 2)
        # Random KV with matching checksums and digest: the decode worker
        # recomputes a few positions, refuses it and computes the prompt
        # itself. The answers are right, nothing forged is cached (the same
        # prompts again come out right), no one is quarantined, and the
        # forger is not paid for KV that was not used.
        proxy.armed = True
        refused = transfers(base, "recomputed")
        for _ in range(2):
            for p in PROMPTS:
                assert complete(base, p, 8).choices[0].text == want[p], p
        assert proxy.tamper.hits >= 1, "the proxy forged KV"
        assert transfers(base, "recomputed") >= refused + 1
        assert not quarantined(base, honest) and not quarantined(base, forger)
        # (Placed as the decode side, which its cache can make it, it works
        # honestly and is paid for that alone.)
        decoded = sum(r["provider_amount"] for r in usage(base).values()
                      if r["provider_id"] == forger["account_id"])
        assert balance(base, forger["account_id"]) <= decoded, usage(base)
        # A forged first token: the split's check judges it as the prefill
        # worker's, which is quarantined; the honest decode worker is not.
        proxy.tamper = ForgeFirst()
        for p in later:
            complete(base, p, 8)
            if proxy.tamper.hits:
                break
        assert proxy.tamper.hits >= 1, "the proxy forged a first token"
        closed_for(procs[1], "quarantined")
        procs[1] = None
        assert quarantined(base, forger) and not quarantined(base, honest)
        [h] = [w for w in fleet(base) if w["name"] == "h"]
        assert h["state"] == "active", h
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
    finally:
        shut(procs, proxy, srv["gen"])


def test_an_embedding_worker_is_billed_by_the_servers_count_and_its_vectors_checked():
    from conftest import ADMIN_TOKEN, _start
    gen = _start("--model", "tiny/tiny.gguf", "--admin-token", ADMIN_TOKEN,
                 "--placement-house-factor", "1000", "--spot-check-new-rate", "1", open_mode=True)
    base = next(gen)["base"]
    proc = proxy = None
    try:
        client = sdk(base)
        texts = ["The cat sat on the mat.", "Paris is the capital of France."]
        here = client.embeddings.create(model="all-minilm-l6-v2", input=texts)
        proxy = Hostile(base, InflateEmbed(4_000_000_000)).start()
        created = provider_token(base, "enc")
        proc = encoder_worker(proxy.base, created["token"])
        [w] = wait_for(lambda: [w for w in fleet(base) if w["state"] == "active"], timeout=60,
                       what="the worker")
        assert w["encoders"] == ["all-minilm-l6-v2"], w
        # It inflates its count and answers constant vectors.
        proxy.armed = True
        seen = usage(base)
        there = client.embeddings.create(model="all-minilm-l6-v2", input=texts)
        assert proxy.tamper.hits >= 1, "the worker's answer was forged"
        # Billed by the server's count; the check caught the vectors and
        # the house's went to the client instead.
        assert there.usage.prompt_tokens == here.usage.prompt_tokens
        for a, b in zip(here.data, there.data):
            assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-4
        [rec] = new_records(base, seen)
        assert rec["prompt_tokens"] == here.usage.prompt_tokens, rec
        assert rec["fee"] >= 0 and rec["provider_amount"] <= rec["cost"] - rec["fee"], rec
        closed_for(proc, "quarantined")
        proc = None
        assert balance(base, created["account_id"]) == 0, "a forged answer is not paid"
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
    finally:
        shut([proc], proxy, gen)


@pytest.mark.parametrize("split", [False, True])
def test_a_worker_that_trickles_tokens_is_cut_at_its_attempts_deadline(split):
    import time
    srv = open_server("--fleet-progress-timeout", "5", *(["--fleet-split", "always"] if split else []))
    base = srv["base"]
    procs, proxy = [], None
    try:
        want = complete(base, PROMPTS[0], 8).choices[0].text
        # Split: two workers of one provider behind the proxy, one the
        # prefill side, the other the decode side that trickles.
        proxy = Hostile(base, Trickle(gap=4.0)).start()
        token = provider_token(base, "slow")["token"]
        procs = [start_worker(proxy.base, token, f"w{i}") for i in range(1 + split)]
        workers_up(base, procs, len(procs))
        # One token every 4 s, each inside the 5 s progress timeout: the
        # attempt's deadline (5 s + 8 x 0.25 s from the end of the KV
        # transfer) ends it, the house finishes the answer, the same text.
        proxy.armed = True
        t0 = time.monotonic()
        r = complete(base, PROMPTS[0], 8)
        took = time.monotonic() - t0
        assert proxy.tamper.hits >= 1
        assert r.choices[0].text == want and r.usage.completion_tokens == 8, r
        assert took < 15, f"{took:.1f} s: the trickle held the client"
        assert sum(w["jobs_lost"] for w in fleet(base)) >= 1
    finally:
        shut(procs, proxy, srv["gen"])


def closed_for(proc, why):
    code, out = finish(proc, timeout=30)
    assert code != 0 and why in out, out


def test_a_sanction_follows_the_token_to_every_connection_replica_and_restart():
    url = fresh_postgres_url()
    a = open_server("--database-url", url, "--spot-check-new-rate", "1")
    b = open_server("--database-url", url)
    procs, proxy = [], None
    try:
        p = provider_token(a["base"], "cheat")
        # One token, three live workers: two behind a hostile proxy on
        # replica A, one on replica B.
        proxy = Hostile(a["base"], Garbage(seed=7)).start()
        procs = [start_worker(proxy.base, p["token"], n) for n in ("g1", "g2")]
        workers_up(a["base"], procs, 2)
        procs.append(start_worker(b["base"], p["token"], "b1"))
        workers_up(b["base"], procs[2:], 1)
        # Garbage on A: its spot check quarantines the token.
        proxy.armed = True
        complete(a["base"], PROMPTS[0], 8)
        assert proxy.tamper.hits >= 1
        wait_for(lambda: [t for t in call(b["base"], "GET", "/admin/providers/tokens")[1]["data"]
                          if t["id"] == p["id"] and t["quarantined_at"]],
                 timeout=30, what="the quarantine, stored for every replica")
        # Every live session of the token is closed: on A at once, on B
        # by its sweep; each worker stops with the reason.
        for proc in procs:
            closed_for(proc, "quarantined")
        assert fleet(a["base"]) == [] and fleet(b["base"]) == []
        # Refused at the handshake by the other replica and after a restart.
        closed_for(start_worker(b["base"], p["token"], "again"), "quarantined")
        a["gen"].close()
        a = open_server("--database-url", url)
        closed_for(start_worker(a["base"], p["token"], "again"), "quarantined")
        # An admin clears it; the token works again, calibrated afresh.
        path = f"/admin/providers/tokens/{p['id']}/quarantine"
        assert call(a["base"], "DELETE", path)[0] == 200
        assert call(a["base"], "DELETE", path)[0] == 404
        procs = [start_worker(a["base"], p["token"], "cleared")]
        workers_up(a["base"], procs, 1)
        # Revoked on B, its worker on A is closed by A's sweep.
        assert call(b["base"], "DELETE", f"/admin/providers/tokens/{p['id']}")[0] == 200
        closed_for(procs[0], "revoked")
        assert complete(a["base"], PROMPTS[1], 8).usage.completion_tokens == 8
        for srv in (a, b):
            status, audit = call(srv["base"], "GET", "/admin/ledger/audit")
            assert status == 200 and audit["violations"] == [], audit
    finally:
        shut(procs, proxy, a["gen"], b["gen"])


def test_a_worker_too_slow_for_its_model_is_told_so_and_one_that_stalls_is_quarantined():
    # Four seconds a challenge: a worker holding each token 0.4 s answers
    # the prefill challenges (two tokens each), right, and not a decode
    # challenge's 24; a hung one answers nothing at all.
    srv = open_server("--fleet-calibration-timeout", "4")
    base = srv["base"]
    procs = []
    try:
        slow_t, hung_t = provider_token(base, "slowpoke"), provider_token(base, "hung")
        slow = start_worker(base, slow_t["token"], "slow", "--debug-token-delay-ms", "400")
        hung = start_worker(base, hung_t["token"], "hung", "--debug-stall-after", "0")
        procs = [slow, hung]
        # Stalling is not slowness: three failed calibrations, quarantined.
        closed_for(hung, "quarantined")
        assert quarantined(base, hung_t)
        # The slow one is told why it gets no work, and is not sanctioned.
        [w] = [w for w in fleet(base) if w["name"] == "slow"]
        assert w["state"] == "calibrating" and w["profile"] is None, w
        assert not quarantined(base, slow_t)
        assert complete(base, "The river", 4).choices[0].text
        status, body = call(base, "GET", "/admin/usage")
        assert status == 200 and body["data"][0]["decode_by"] == "cpu", body["data"][0]
        _, out = stop(slow)
        assert "too slow to serve tiny here: its 3 answers were right" in out, out
        assert "It is measured again in 60 minutes" in out, out
    finally:
        for p in procs:
            if p.poll() is None:
                stop(p)
        srv["gen"].close()
