"""Billing end to end, against the real binary and the official SDK:
requests are metered to the key's account (402 `insufficient_quota` when
it cannot cover the worst case), a cut stream pays for what it streamed,
200 concurrent requests across two servers sharing one PostgreSQL database
are each billed exactly once, and a server killed mid-stream leaves no hold
open after a restart: each killed stream is billed once, from its last
usage checkpoint."""

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import ADMIN_TOKEN, _start, fresh_postgres_url, http_call, ticks, units

SMOL = "smollm2-135m-instruct"


def call(base, method, path, body=None, token=ADMIN_TOKEN):
    return http_call(base, method, path, body, token)[:2]


def funded_key(base, amount, name="e2e"):
    """A new user account with `amount` ticks (10^-10 units) and a key on it."""
    status, acct = call(base, "POST", "/admin/accounts", {"name": name})
    assert status == 201, acct
    if amount:
        assert call(base, "POST", f"/admin/accounts/{acct['id']}/topup", {"amount": units(amount)})[0] == 200
    status, key = call(base, "POST", "/admin/keys", {"name": name, "account_id": acct["id"]})
    assert status == 201, key
    return acct["id"], key["key"]


def sdk(base, key):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)


def assert_audit_clean(base):
    status, audit = call(base, "GET", "/admin/ledger/audit")
    assert status == 200 and audit["violations"] == [], audit
    return audit


def test_requests_are_billed_to_the_key_account(billed_server):
    base = billed_server["base"]
    account, key = funded_key(base, 0, "broke")
    client = sdk(base, key)
    msg = [{"role": "user", "content": "Say hi"}]
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=SMOL, messages=msg, max_tokens=4)
    assert e.value.status_code == 402 and e.value.body["code"] == "insufficient_quota"
    assert call(base, "POST", f"/admin/accounts/{account}/topup", {"amount": units(5_000_000)})[0] == 200
    r = client.chat.completions.create(model=SMOL, messages=msg, max_tokens=4)
    status, usage = call(base, "GET", "/v1/usage", token=key)
    assert status == 200 and len(usage["data"]) == 1, usage
    rec = usage["data"][0]
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (r.usage.prompt_tokens, r.usage.completion_tokens)
    assert rec["outcome"] == "finished" and ticks(rec["cost"]) > 0
    # The tenant sees its cost, never the platform's split of it.
    assert "provider_amount" not in rec and "fee" not in rec, rec
    [full] = call(base, "GET", f"/admin/usage?key={usage['key']['id']}")[1]["data"]
    assert ticks(full["provider_amount"]) + ticks(full["fee"]) == ticks(rec["cost"]) == ticks(full["cost"])
    assert ticks(usage["account"]["balance"]) == 5_000_000 - ticks(rec["cost"])
    assert ticks(usage["account"]["held"]) == 0
    assert_audit_clean(base)


def test_usage_records_name_the_executors_of_each_stage(billed_server):
    base = billed_server["base"]
    _, key = funded_key(base, 5_000_000, "stages")
    client = sdk(base, key)
    client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Hi"}],
                                   max_tokens=2, extra_headers={"x-synor-cache": "bypass"})
    status, usage = call(base, "GET", "/v1/usage", token=key)
    assert status == 200 and len(usage["data"]) == 1, usage
    for rec in usage["data"]:
        # The house engine runs both stages on its CPU executor.
        assert (rec["prefill_by"], rec["decode_by"]) == ("cpu", "cpu"), rec
    assert_audit_clean(base)


def test_a_finished_stream_is_billed_before_its_done(billed_server):
    base = billed_server["base"]
    _, key = funded_key(base, 5_000_000, "streamer")
    client = sdk(base, key)
    seen = set()
    for i in range(3):
        stream = client.chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": f"Count to {i + 5}."}],
            max_tokens=8, stream=True, stream_options={"include_usage": True},
            extra_headers={"x-synor-cache": "bypass"})
        usage = [c.usage for c in stream if c.usage][-1]
        # No polling: the settlement committed before `[DONE]` was sent.
        status, billed = call(base, "GET", "/v1/usage", token=key)
        assert status == 200 and len(billed["data"]) == i + 1, billed
        # Records made in the same second tie on `created_at`: take the new one.
        (rec,) = [r for r in billed["data"] if r["request_id"] not in seen]
        seen.add(rec["request_id"])
        assert rec["outcome"] == "finished", rec
        assert rec["completion_tokens"] == usage.completion_tokens, (rec, usage)
        assert billed["account"]["held"] == "0.00", billed
    assert_audit_clean(base)


def test_a_cut_stream_pays_for_what_it_streamed(billed_server):
    base = billed_server["base"]
    _, key = funded_key(base, 5_000_000, "cutter")
    client = sdk(base, key)
    stream = client.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Count to a thousand."}],
        max_tokens=400, stream=True, extra_body={"ignore_eos": True})
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
        if got == 5:
            break
    stream.close()
    rec = None
    for _ in range(100):
        status, usage = call(base, "GET", "/v1/usage", token=key)
        if usage["data"]:
            rec = usage["data"][0]
            break
        time.sleep(0.1)
    assert rec is not None, "the cut request was never settled"
    assert rec["outcome"] == "cut", rec
    assert 5 <= rec["completion_tokens"] <= 5 + 24, rec
    status, prices = call(base, "GET", "/v1/market/prices", token=key)
    p = next(m for m in prices["data"] if m["model"] == SMOL)["prices"]
    worst = (rec["prompt_tokens"] * ticks(p["input"]) + 400 * ticks(p["output"])) // 1_000_000
    assert ticks(rec["cost"]) < worst, (rec, worst)
    # Read again: the account came before the record in the polled answer.
    assert call(base, "GET", "/v1/usage", token=key)[1]["account"]["held"] == "0.00"
    assert_audit_clean(base)


def test_concurrent_requests_on_two_servers_sharing_postgres_are_billed_once():
    db = fresh_postgres_url()
    args = ("--model", "tiny/tiny.gguf", "--embedding-model", "none", "--database-url", db,
            "--admin-token", ADMIN_TOKEN, "--max-waiting", "512")
    a, b = _start(*args, open_mode=False), _start(*args, open_mode=False)
    try:
        infos = [next(a), next(b)]
        servers = [i["base"] for i in infos]
        account, key = funded_key(servers[0], 50_000_000, "pair")

        def one(i):
            c = sdk(servers[i % 2], key)
            r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"n{i}"}],
                                          max_tokens=8)
            return r.usage.prompt_tokens, r.usage.completion_tokens

        try:
            with ThreadPoolExecutor(max_workers=64) as pool:
                results = list(pool.map(one, range(200)))
        except openai.APIStatusError as e:
            # Say why: the servers' own error lines.
            lines = []
            for info in infos:
                while not info["lines"].empty():
                    line = info["lines"].get()
                    if " ERROR " in line or "error" in line.lower() and "slow statement" not in line:
                        lines.append(line.strip()[:400])
            raise AssertionError(f"{e}: " + "\n".join(lines[-20:])) from e
        records = []
        for _ in range(50):
            records = call(servers[1], "GET", "/v1/usage?limit=1000", token=key)[1]["data"]
            if len(records) >= 200:
                break
            time.sleep(0.1)
        assert len(records) == 200, len(records)
        assert len({r["request_id"] for r in records}) == 200
        assert sum(r["completion_tokens"] for r in records) == sum(c for _, c in results)
        assert sum(r["prompt_tokens"] for r in records) == sum(p for p, _ in results)
        accounts = {x["id"]: x for x in call(servers[0], "GET", "/admin/accounts")[1]["data"]}
        spent = sum(ticks(r["cost"]) for r in records)
        assert ticks(accounts[account]["balance"]) == 50_000_000 - spent
        assert ticks(accounts[account]["held"]) == 0
        held = ("provider:house", "treasury", account)
        assert sum(ticks(accounts[i]["balance"]) for i in held) == 50_000_000
        assert ticks(accounts["deposits"]["balance"]) == -50_000_000
        for base in servers:
            assert_audit_clean(base)
    finally:
        a.close()
        b.close()


def test_a_server_killed_mid_stream_leaves_nothing_open_or_billed_twice(tmp_path):
    db = "sqlite://" + str(tmp_path / "crash.db")
    args = ("--embedding-model", "none", "--database-url", db, "--admin-token", ADMIN_TOKEN,
            "--instance-stale-after", "3")
    first = _start(*args, open_mode=False)
    info = next(first)
    base = info["base"]
    account, key = funded_key(base, 20_000_000, "crash")
    started = threading.Barrier(5)

    def stream(i):
        s = sdk(base, key).chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": f"Story {i}"}], max_tokens=1000,
            stream=True, extra_body={"ignore_eos": True})
        n, t0 = 0, None
        try:
            for c in s:
                n += 1
                t0 = t0 or time.monotonic()
                # Stream for 2.5 s (past two usage checkpoints), then wait.
                if t0 and time.monotonic() - t0 > 2.5:
                    started.wait(timeout=60)
                    t0 = float("inf")
        except Exception:
            return n
        return n

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(stream, i) for i in range(4)]
        started.wait(timeout=60)
        info["proc"].send_signal(signal.SIGKILL)
        info["proc"].wait(timeout=30)
        received = [f.result(timeout=60) for f in futures]
        assert all(n < 1000 for n in received), received
    first.close()
    second = _start(*args, open_mode=False)
    try:
        base = next(second)["base"]
        audit = assert_audit_clean(base)
        assert audit["open_holds"] == 4, "the killed streams' holds stay open until recovery"
        for _ in range(100):
            audit = assert_audit_clean(base)
            if audit["open_holds"] == 0:
                break
            time.sleep(0.2)
        assert audit["open_holds"] == 0, audit
        acct = call(base, "GET", f"/admin/accounts/{account}")[1]
        records = call(base, "GET", "/v1/usage?limit=100", token=key)[1]["data"]
        # Each killed stream is billed once, from its last checkpoint: for
        # some tokens, never more than it was sent (chunks hold one token).
        assert len(records) == 4 and all(r["outcome"] == "cut" for r in records), records
        assert all(0 < r["completion_tokens"] <= max(received) for r in records), (records, received)
        assert ticks(acct["held"]) == 0
        assert ticks(acct["balance"]) == 20_000_000 - sum(ticks(r["cost"]) for r in records)
        # Service resumes, and a new request is billed once.
        sdk(base, key).chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        after = call(base, "GET", "/v1/usage?limit=100", token=key)[1]["data"]
        assert len(after) == len(records) + 1
        assert_audit_clean(base)
    finally:
        second.close()


def test_a_filled_bid_covers_its_bidders_requests_at_the_trade_price(billed_server):
    base = billed_server["base"]
    account, key = funded_key(base, 10**10, "capacity")
    # The house keeps an ask at its output price: a bid at that price fills
    # against it at once, and the bidder pays for the capacity (5 tok/s for
    # a minute) at the trade price, now.
    book = call(base, "GET", f"/v1/market/book?instrument={SMOL}", token=key)[1]
    ask = book["best_ask"]
    assert ask, book
    status, placed = call(base, "POST", "/v1/market/orders",
                          {"instrument": SMOL, "price": ask, "quantity": 5, "expires_in": 60},
                          token=key)
    assert status == 201 and placed["fills"], placed
    [c] = call(base, "GET", "/v1/market/contracts", token=key)[1]["data"]
    assert (c["seller"], c["price"], c["quantity"]) == ("provider:house", ask, 5), c
    after_fill = ticks(call(base, "GET", "/v1/usage", token=key)[1]["account"]["balance"])
    assert after_fill < 10**10
    # Its requests run on that capacity, prepaid: recorded at the trade
    # price, nothing more to pay, while the contract has room (ten seconds'
    # worth: 50 tokens, a request taking its prompt and max_tokens); past it
    # they pay the spot price.
    for i in range(5):
        r = sdk(base, key).chat.completions.create(
            model=SMOL, messages=[{"role": "user", "content": f"covered {i}"}], max_tokens=8,
            extra_headers={"x-synor-cache": "bypass"})
        assert r.choices[0].message.content is not None
    for _ in range(50):
        records = call(base, "GET", "/v1/usage?limit=100", token=key)[1]["data"]
        if len(records) >= 5:
            break
        time.sleep(0.1)
    costs = [ticks(r["cost"]) for r in records]
    covered = [r for r in records if ticks(r["cost"]) == 0]
    assert covered and all(r["provider_id"] == "provider:house" for r in covered), records
    assert 0 < len(covered) < 5, costs  # the first ones covered, then the spot price
    spent = after_fill - ticks(call(base, "GET", "/v1/usage", token=key)[1]["account"]["balance"])
    assert spent == sum(costs), (spent, costs)
    assert_audit_clean(base)
