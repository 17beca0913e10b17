"""API keys end to end: `synor keys` on the CLI, the real server, the
official SDK: no key / wrong key / revoked key get 401, a valid key works,
admin routes need the admin token. Keys spend from a funded account."""

import json
import os
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SYNOR = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))


def keys(db, *args):
    p = subprocess.run([SYNOR, "keys", "--database-url", db, *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def sdk(base, key):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)


def chat(client):
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)


def test_cli_keys_work_until_revoked(keyed_server):
    base, db = keyed_server["base"], keyed_server["database_url"]
    out = keys(db, "create", "--name", "e2e", "--rpm", "100")
    secret = next(l.split(": ", 1)[1] for l in out.splitlines() if l.startswith("key: "))
    key_id = out.split()[1]
    account = out.splitlines()[0].rsplit(" ", 1)[1]
    p = subprocess.run([SYNOR, "accounts", "--database-url", db, "topup", account, "2.5"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "balance 2.50" in p.stdout, p.stdout + p.stderr
    assert chat(sdk(base, secret)).usage.completion_tokens == 3
    with pytest.raises(openai.AuthenticationError) as e:
        chat(sdk(base, secret + "nope"))
    assert e.value.body["code"] == "invalid_api_key"
    listing = keys(db, "list")
    assert "e2e" in listing and secret not in listing
    keys(db, "revoke", key_id)
    with pytest.raises(openai.AuthenticationError):
        chat(sdk(base, secret))


def test_admin_routes_need_the_admin_token(keyed_server):
    base = keyed_server["base"]

    def create(token):
        req = urllib.request.Request(
            base + "/admin/keys", data=json.dumps({"name": "adm"}).encode(), method="POST",
            headers={"content-type": "application/json", "authorization": f"Bearer {token}"})
        return urllib.request.urlopen(req, timeout=30)

    with pytest.raises(urllib.error.HTTPError) as e:
        create("wrong")
    assert e.value.code == 401
    made = json.loads(create("e2e-admin").read())
    assert made["key"].startswith("sk-synor-")
    topup = urllib.request.Request(
        base + f"/admin/accounts/{made['account_id']}/topup", method="POST",
        data=json.dumps({"amount": "0.0001"}).encode(),
        headers={"content-type": "application/json", "authorization": "Bearer e2e-admin"})
    urllib.request.urlopen(topup, timeout=30).read()
    assert chat(sdk(base, made["key"])).choices[0].finish_reason == "length"
    # A tenant's API key is not an admin token.
    with pytest.raises(urllib.error.HTTPError) as e:
        create(made["key"])
    assert e.value.code == 401


def test_models_an_admin_loads_are_listed_kept_across_a_restart_and_forgotten_when_unloaded(tmp_path):
    from conftest import ADMIN_TOKEN, _start, http_call
    args = ("--model", "tiny/tiny.gguf", "--served-model-name", "tiny", "--embedding-model", "none",
            "--admin-token", ADMIN_TOKEN, "--database-url", f"sqlite://{tmp_path}/synor.db")

    def served(base):
        status, body, _ = http_call(base, "GET", "/v1/models", token="none")
        assert status == 200, body
        return sorted(m["id"] for m in body["data"])

    first = _start(*args)
    base = next(first)["base"]
    status, files, _ = http_call(base, "GET", "/admin/models/files")
    assert status == 200, files
    by_path = {f["path"]: f for f in files["data"]}
    assert by_path["tiny/tiny.gguf"]["kind"] == "text" and by_path["tiny/tiny.gguf"]["loaded_as"] == ["tiny"]
    smol = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert by_path[smol]["suggested_name"] == "smollm2-135m-instruct" and by_path[smol]["bytes"] > 10**7
    assert by_path["all-minilm-l6-v2"]["kind"] == "embedding"
    spec = {"name": "tiny-greedy", "path": "tiny/tiny.gguf", "generation_config": {"temperature": 0}}
    status, body, _ = http_call(base, "POST", "/admin/models", spec)
    assert status == 201, body
    assert served(base) == ["tiny", "tiny-greedy"]
    first.close()
    # Restarted on the same database: still served, with its defaults.
    second = _start(*args)
    base = next(second)["base"]
    assert served(base) == ["tiny", "tiny-greedy"]
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
    texts = {client.chat.completions.create(
        model="tiny-greedy", messages=[{"role": "user", "content": "hi"}], max_tokens=6, seed=s,
    ).choices[0].message.content for s in (1, 2, 3)}
    assert len(texts) == 1, texts
    status, body, _ = http_call(base, "DELETE", "/admin/models/tiny-greedy")
    assert status == 200, body
    second.close()
    third = _start(*args)
    try:
        assert served(next(third)["base"]) == ["tiny"]
    finally:
        third.close()


def test_the_overview_keeps_its_history_across_a_restart(tmp_path):
    import time
    from conftest import ADMIN_TOKEN, _start, http_call
    args = ("--model", "tiny/tiny.gguf", "--embedding-model", "none", "--admin-token", ADMIN_TOKEN,
            "--database-url", f"sqlite://{tmp_path}/synor.db")
    first = _start(*args)
    base = next(first)["base"]
    deadline = time.monotonic() + 20
    while not http_call(base, "GET", "/admin/overview")[1]["history"]:
        assert time.monotonic() < deadline, "no history point in 20 s"
        time.sleep(0.5)
    kept = http_call(base, "GET", "/admin/overview")[1]["history"]
    first.close()
    second = _start(*args)
    try:
        history = http_call(next(second)["base"], "GET", "/admin/overview")[1]["history"]
        assert [p["t"] for p in history[:len(kept)]] == [p["t"] for p in kept], (kept, history)
    finally:
        second.close()
