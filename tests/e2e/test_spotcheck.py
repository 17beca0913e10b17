"""Spot checks of untrusted providers (issue 15), with real worker
processes on loopback serving the real model: every attempt of a new
provider is re-scored on the house engine here. Three cheaters are
caught: one serving the tiny random-weight model under the real model's
name, one running half of the model's layers, one replaying the text of
an earlier job. Each is quarantined (stored with its token, its worker
closed and its token refused), its pay clawed back and its user refunded. Honest workers pass a thousand checks with
no false positive."""

import os
import re
import subprocess
import threading
import urllib.request

from conftest import ADMIN_TOKEN, ROOT, _start, http_call, ticks
from test_fleet import call, finish, fleet, provider_token, stop, wait_for
import openai

SMOL = "smollm2-135m-instruct"


def server(*extra):
    gen = _start("--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
                 "--placement-house-factor", "1000", "--spot-check-new-rate", "1", *extra)
    info = next(gen)
    info["gen"] = gen
    return info


def worker(base, token, name, *extra):
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    env = dict(os.environ)
    env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
    env.setdefault("RUST_LOG", "info")
    return subprocess.Popen(
        [binary, "worker", "--server", base.replace("http://", "ws://"), "--token", token,
         "--name", name, "--embedding-model", "none", "--threads", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def checks(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^synor:spot_checks_total\{result="(\w+)"\} (\S+)$', text, re.M)}


def ask(base, i, max_tokens=12):
    """A request, its sampling varied with `i` (greedy, seeded, penalized)."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    sampling = [dict(temperature=0), dict(temperature=0.8, seed=i),
                dict(temperature=1.0, top_p=0.9, seed=i, frequency_penalty=0.5)][i % 3]
    return client.completions.create(
        model=SMOL, prompt=f"Question {i}: name a colour, a number and an animal.",
        max_tokens=max_tokens, extra_body={"ignore_eos": True},
        extra_headers={"x-synor-cache": "bypass"}, **sampling)


def active(base, n):
    wait_for(lambda: len([w for w in fleet(base) if w["state"] == "active"]) == n,
             timeout=60, what=f"{n} calibrated workers")


def journal_of(base, account, kind):
    status, journal = call(base, "GET", f"/admin/journal?account={account}&limit=500")
    assert status == 200, journal
    return [t for t in journal["data"] if t["kind"] == kind and account in t["entries"]]


def quarantined(base, p):
    """The token record of provider token `p`, once it is quarantined."""
    status, tokens = call(base, "GET", "/admin/providers/tokens")
    assert status == 200, tokens
    return next((t for t in tokens["data"] if t["id"] == p["id"] and t["quarantined_at"]), None)


def reputation(base, p):
    """The provider's reputation, as its (quarantined) token still sees it."""
    status, earned = http_call(base, "GET", "/v1/providers/earnings", token=p["token"])[:2]
    assert status == 200, earned
    return earned["reputation_bps"]


def closed_for_good(proc):
    """A sanctioned worker stops by itself, with an error naming why."""
    code, out = finish(proc)
    assert code != 0 and "quarantined" in out, out


def refused_again(base, p, name, flags):
    """The quarantined token is refused from now on."""
    again = worker(base, p["token"], name, *flags)
    out, _ = again.communicate(timeout=60)
    assert again.returncode != 0 and "quarantined" in out, out


def test_cheaters_are_caught_quarantined_and_their_pay_clawed_back():
    srv = server()
    base = srv["base"]
    try:
        # Two cheat from the start: the calibration's canaries (greedy
        # answers the house knows) catch them before they earn anything.
        for name, flags in {
            "tiny": ["--model", "tiny/tiny.gguf", "--served-model-name", SMOL],
            "skip": ["--debug-keep-layers", "15"],
        }.items():
            p = provider_token(base, name)
            cheat = worker(base, p["token"], name, *flags)
            try:
                t = wait_for(lambda: quarantined(base, p), timeout=60,
                             what=f"the {name} cheater to be caught")
                assert t["quarantine_reason"], t
                # Its worker is closed at once and stops by itself.
                closed_for_good(cheat)
            finally:
                stop(cheat)
            wait_for(lambda: fleet(base) == [], timeout=20, what="the cheater to leave")
            assert reputation(base, p) < 7_000
            assert call(base, "GET", f"/admin/accounts/{p['account_id']}")[1]["balance"] == "0.00"
            refused_again(base, p, name, flags)
        # One passes calibration (eight honest jobs), serves a request
        # honestly, then replays that answer to every later request: a spot
        # check catches it, its pay is clawed back and its user refunded.
        p = provider_token(base, "replay")
        flags = ["--debug-cheat", "replay", "--debug-cheat-after", "8"]
        cheat = worker(base, p["token"], "replay", *flags)
        try:
            active(base, 1)
            before = checks(base)
            for i in range(4):
                ask(base, 3 * i)
                if quarantined(base, p):
                    break
            wait_for(lambda: quarantined(base, p), timeout=20,
                     what="the replaying cheater to be caught")
            after = checks(base)
            # At least the check that caught it failed; a replayed answer
            # served before the quarantine took effect may fail its own
            # check a moment later (each is then clawed back on its own).
            assert after["fail"] >= before.get("fail", 0) + 1, (before, after)
            assert after["pass"] >= before.get("pass", 0) + 1, "its honest answer passed"
            claws = wait_for(lambda: journal_of(base, p["account_id"], "clawback"), timeout=10,
                             what="the clawback")
            for claw in claws:
                moved = claw["entries"]
                assert ticks(moved[p["account_id"]]) < 0 < ticks(moved["user:local"]), moved
                assert sum(ticks(v) for v in moved.values()) == 0, moved
            # One clawback per failed check, never two for one.
            assert len({c["id"] for c in claws}) == len(claws), claws
            assert len(claws) <= checks(base)["fail"] - before.get("fail", 0), (claws, before)
            closed_for_good(cheat)
            assert reputation(base, p) < 7_000
            # What is left of its pay is still pending (the window is an hour).
            status, earned = http_call(base, "GET", "/v1/providers/earnings", token=p["token"])[:2]
            assert status == 200 and ticks(earned["pending"]) >= ticks(earned["balance"]) >= 0, earned
        finally:
            stop(cheat)
        refused_again(base, p, "replay", flags)
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
    finally:
        srv["gen"].close()


def test_honest_workers_pass_a_thousand_spot_checks():
    srv = server("--max-num-seqs", "32", "--spot-check-rate", "1")
    base = srv["base"]
    procs = []
    try:
        p = provider_token(base, "honest")
        procs = [worker(base, p["token"], f"h{i}", "--max-num-seqs", "32") for i in (1, 2)]
        active(base, 2)
        start = sum(checks(base).values())  # the calibrations' canaries
        errors = []
        lock = threading.Lock()
        todo = iter(range(1000))

        def run():
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    ask(base, i, max_tokens=4)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))
        threads = [threading.Thread(target=run) for _ in range(16)]
        [t.start() for t in threads]
        [t.join(timeout=600) for t in threads]
        assert errors == [], errors[:3]
        wait_for(lambda: sum(checks(base).values()) >= start + 1000, timeout=60,
                 what="every check to finish")
        c = checks(base)
        assert c.get("fail", 0) == 0 and c["pass"] >= start + 990, c
        assert all(w["state"] == "active" for w in fleet(base)), fleet(base)
        text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        worst = float(re.search(r"^synor:spot_check_max_pass_deviation (\S+)$", text, re.M).group(1))
        print(f"largest logprob difference over {c['pass'] - start:.0f} honest checks: {worst}")
        assert worst <= 0.25
    finally:
        for pr in procs:
            stop(pr)
        srv["gen"].close()
