"""The admin console in real headless Chromium (Debian's `chromium`, driven
by Playwright), against the real `synor` binary: sign in, create an
account and a key, use the key with the OpenAI SDK, watch the overview,
the usage and the balance move, revoke the key (the SDK then gets 401),
flush the cache; a wrong token and a user key are refused, and the page
never asks anything of another host. A screenshot of every page is saved
under $CONSOLE_ARTIFACTS (default .artifacts/console).
"""

import os
import re
import shutil

import pytest

from conftest import ADMIN_TOKEN, ROOT, _synor, http_call

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = os.environ.get("CONSOLE_ARTIFACTS", os.path.join(ROOT, ".artifacts", "console"))
# As the machine notes say: no background traffic to a network that is closed.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PAGES = ["overview", "fleet", "market", "money", "keys", "caches", "models"]
WAIT_MS = 20_000


@pytest.fixture(scope="module")
def console_server(tmp_path_factory):
    db = "sqlite://" + str(tmp_path_factory.mktemp("console") / "synor.db")
    for info in _synor("--model", "tiny/tiny.gguf", "--embedding-model", "none",
                       "--database-url", db, "--admin-token", ADMIN_TOKEN,
                       "--placement-house-factor", "1000", open_mode=False):
        info["database_url"] = db
        yield info


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is missing: run scripts/install-browser.sh")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, console_server, request):
    """A fresh browser context on the console, recording every request URL
    and the page's errors; its last state is saved as a screenshot."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1366, "height": 860})
    p = ctx.new_page()
    p.requests, p.errors, p.unguarded = [], [], []
    p.on("request", lambda r: p.requests.append(r.url))
    # Every change the page makes carries the session's CSRF token
    # (signing in is what fetches it); the provider page's bearer token is
    # never sent by the browser on its own, so it needs none.
    p.on("request", lambda r: r.method not in ("GET", "HEAD") and "x-csrf-token" not in r.headers
         and not (r.method == "POST" and r.url.endswith("/console/session"))
         and not r.headers.get("authorization", "").startswith("Bearer swt-")
         and p.unguarded.append(f"{r.method} {r.url}"))
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.on("console", lambda m: m.type == "error" and "Failed to load resource" not in m.text
         and p.errors.append(m.text))
    p.goto(console_server["base"] + "/console")
    yield p
    shot(p, f"end-{request.node.name}")
    ctx.close()
    assert not p.errors, f"the page reported errors: {p.errors}"
    assert not p.unguarded, f"changes sent without the CSRF token: {p.unguarded}"



def shot(page, name):
    page.screenshot(path=os.path.join(ARTIFACTS, f"{name}.png"), full_page=True)


def sign_in(page, token):
    page.fill("#signin input[name=token]", token)
    page.click("#signin [type=submit]")


def go(page, name):
    page.click(f'nav a[href="#{name}"]')
    page.wait_for_function(f"location.hash === '#{name}'")


def flash(page):
    """The flash area's latest message, once one shows."""
    el = page.locator('[data-testid="flash"]')
    el.wait_for(state="visible", timeout=WAIT_MS)
    return el


def number(text):
    digits = re.sub(r"[^0-9\-]", "", text)
    return int(digits) if digits not in ("", "-") else 0


def test_a_wrong_token_and_a_user_key_cannot_open_the_console(page, console_server):
    base = console_server["base"]
    sign_in(page, "not-the-admin-token")
    err = page.locator('[data-testid="signin-error"]')
    err.wait_for(state="visible", timeout=WAIT_MS)
    assert "admin token" in err.inner_text()
    shot(page, "signin-refused")
    status, body, _ = http_call(base, "POST", "/admin/keys", {"name": "someone"})
    assert status == 201, body
    user_key = body["key"]
    page.fill("#signin input[name=token]", "")
    sign_in(page, user_key)
    page.wait_for_function(
        "document.querySelector('[data-testid=\"signin-error\"]').textContent.length > 0")
    assert page.locator("nav").is_hidden(), "a user key opened the console"
    # Nor does the key reach the admin API, the overview stream included.
    for path in ["/admin/overview", "/admin/overview/stream", "/admin/keys"]:
        status, body, _ = http_call(base, "GET", path, token=user_key)
        assert status == 401, (path, body)
    assert not page.context.cookies(), "no session for a refused sign-in"


def test_sign_in_create_a_key_use_it_revoke_it_and_flush_the_cache(page, console_server):
    from openai import AuthenticationError, OpenAI

    base = console_server["base"]
    sign_in(page, ADMIN_TOKEN)
    page.locator("nav").wait_for(state="visible", timeout=WAIT_MS)
    cookie = next(c for c in page.context.cookies() if c["name"] == "synor_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    assert ADMIN_TOKEN not in page.url
    stored = page.evaluate("JSON.stringify([{...sessionStorage}, {...localStorage}])")
    assert ADMIN_TOKEN not in stored, "the admin token was kept by the page"
    # A second tab of the signed-in browser opens the console as well.
    other = page.context.new_page()
    other.goto(base + "/console#keys")
    other.locator("nav").wait_for(state="visible", timeout=WAIT_MS)
    other.close()
    page.locator('[data-testid="live"]').filter(has_text="live").wait_for(timeout=WAIT_MS)
    requests_before = number(page.locator('[data-testid="stat-requests"]').inner_text())

    # An account with money, and a key that spends it.
    go(page, "money")
    page.fill("form[name=create-account] input[name=name]", "console-user")
    page.click("form[name=create-account] [type=submit]")
    row = page.locator("tr[data-account-id]", has_text="console-user")
    row.wait_for(timeout=WAIT_MS)
    account_id = row.get_attribute("data-account-id")
    row.locator("form[name=topup] input[name=amount]").fill("0.0005")
    row.locator("form[name=topup] [type=submit]").click()
    page.wait_for_function(
        f"""() => {{
            const c = document.querySelector('tr[data-account-id="{account_id}"] [data-testid="balance"]');
            return c && c.textContent === '0.0005';
        }}""", timeout=WAIT_MS)

    go(page, "keys")
    # An API error is shown as the API's own message.
    page.fill("form[name=create-key] input[name=name]", "x" * 200)
    page.click("form[name=create-key] [type=submit]")
    assert "a key name is 1-128 characters" in flash(page).inner_text()
    page.fill("form[name=create-key] input[name=name]", "console-key")
    page.fill("form[name=create-key] input[name=account_id]", account_id)
    page.click("form[name=create-key] [type=submit]")
    secret_el = page.locator('[data-testid="new-secret"]')
    secret_el.wait_for(timeout=WAIT_MS)
    secret = secret_el.inner_text().strip()
    assert secret.startswith("sk-"), secret
    key_row = page.locator("tr[data-key-id]", has_text="console-key")
    key_row.wait_for(timeout=WAIT_MS)
    key_id = key_row.get_attribute("data-key-id")
    shot(page, "keys")

    # The key works with the OpenAI SDK.
    sdk = OpenAI(base_url=base + "/v1", api_key=secret, max_retries=0, timeout=60)
    r = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello console"}],
        max_tokens=8, temperature=0)
    assert r.usage.completion_tokens > 0

    # The overview sees it live, without a reload.
    go(page, "overview")
    page.wait_for_function(
        f"""() => {{
            const el = document.querySelector('[data-testid="stat-requests"]');
            return el && Number(el.textContent.replace(/[^0-9]/g, '')) > {requests_before};
        }}""", timeout=WAIT_MS)
    shot(page, "overview")

    # Usage and balance moved.
    go(page, "money")
    page.locator("tr[data-request-id]", has_text="tiny").first.wait_for(timeout=WAIT_MS)
    balance = page.locator(f'tr[data-account-id="{account_id}"] [data-testid="balance"]')
    assert 0 < float(balance.inner_text()) < 0.0005, balance.inner_text()
    assert page.locator('[data-testid="audit-ok"]').is_visible()
    shot(page, "money")

    # Revoked: the SDK gets 401.
    go(page, "keys")
    page.once("dialog", lambda d: d.accept())
    page.locator(f'tr[data-key-id="{key_id}"] [data-testid="revoke"]').click()
    page.locator(f'tr[data-key-id="{key_id}"]', has_text="revoked").wait_for(timeout=WAIT_MS)
    with pytest.raises(AuthenticationError):
        sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello again"}], max_tokens=4)

    # The cache flush answers with what it removed.
    go(page, "caches")
    page.click('[data-testid="flush"]')
    assert "ok" in flash(page).get_attribute("class")
    # A bound on wrong answers, set from the page and then off again.
    page.fill("form[name=delta] input[name=delta]", "0.02")
    page.click("form[name=delta] [type=submit]")
    page.locator('[data-testid="flash"]', has_text="Wrong answers bounded at 2.0%").wait_for(timeout=WAIT_MS)
    page.locator("text=No model has a bound on wrong answers yet.").wait_for(timeout=WAIT_MS)
    shot(page, "caches")
    page.fill("form[name=delta] input[name=delta]", "0")
    page.click("form[name=delta] [type=submit]")
    page.locator('[data-testid="flash"]', has_text="The bound is off").wait_for(timeout=WAIT_MS)

    go(page, "fleet")
    page.locator('[data-testid="house"] tr[data-model="tiny"]').wait_for(timeout=WAIT_MS)
    go(page, "models")
    page.locator("text=tiny").first.wait_for(timeout=WAIT_MS)
    for name in ["fleet", "market", "models"]:
        go(page, name)
        page.wait_for_load_state("networkidle")
        errors = page.locator('[data-testid="flash"].error')
        assert errors.count() == 0 or not errors.first.is_visible(), (name, errors.first.inner_text())
        shot(page, name)

    # Sign out: the session is gone, its cookie no longer opens the API.
    page.click('[data-testid="signout"]')
    page.locator("#signin").wait_for(state="visible", timeout=WAIT_MS)
    status = page.evaluate("fetch('/admin/keys').then(r => r.status)")
    assert status == 401
    outside = [u for u in page.requests if not u.startswith(base) and not u.startswith("data:")]
    assert not outside, f"requests left the server: {outside}"


def test_names_from_the_api_are_shown_as_text_never_run(page, console_server):
    hostile = '<img src=x onerror="window.__pwned=1">'
    status, body, _ = http_call(console_server["base"], "POST", "/admin/accounts",
                                {"name": hostile, "kind": "user"})
    assert status in (200, 201), body
    sign_in(page, ADMIN_TOKEN)
    page.locator("nav").wait_for(state="visible", timeout=WAIT_MS)
    go(page, "money")
    page.locator("tr[data-account-id]", has_text=hostile).wait_for(timeout=WAIT_MS)
    assert page.evaluate("window.__pwned") is None


def test_a_mutation_without_the_csrf_token_is_refused_in_the_browser(page, console_server):
    sign_in(page, ADMIN_TOKEN)
    page.locator("nav").wait_for(state="visible", timeout=WAIT_MS)
    # The cookie alone (as a forged cross-site form would send it) is not enough.
    status = page.evaluate("""fetch('/admin/cache/flush', {method: 'POST',
        headers: {'content-type': 'application/json'}, body: '{}'}).then(r => r.status)""")
    assert status == 403
    page.unguarded.clear()  # that forged request was this test's own


def test_the_overview_stream_ends_when_its_session_signs_out(console_server):
    import http.client
    import json
    from urllib.parse import urlparse

    u = urlparse(console_server["base"])

    def request(method, path, body=None, headers=None):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        c.request(method, path, body=body, headers=headers or {})
        return c, c.getresponse()

    _, r = request("POST", "/console/session", json.dumps({"token": ADMIN_TOKEN}),
                   {"content-type": "application/json"})
    assert r.status == 200
    cookie = r.getheader("set-cookie").split(";")[0]
    csrf = json.loads(r.read())["csrf"]
    conn, stream = request("GET", "/admin/overview/stream", headers={"cookie": cookie})
    assert stream.status == 200
    assert stream.getheader("content-type").startswith("text/event-stream")
    assert stream.getheader("cache-control") == "no-store"
    events = []

    def read_event():
        lines = []
        while True:
            line = stream.readline().decode()
            if line in ("\n", ""):
                return lines
            lines.append(line.rstrip("\n"))

    first = read_event()
    assert first[0] == "event: overview", first
    overview = json.loads(first[1][len("data: "):])
    assert overview["interval_s"] == 10 and "current" in overview
    _, out = request("DELETE", "/console/session", headers={"cookie": cookie, "x-csrf-token": csrf})
    assert out.status == 204
    conn.sock.settimeout(10)
    while True:
        ev = read_event()
        if not ev:
            break
        events.append(ev[0])
        if ev[0] == "event: ended":
            break
    assert events and events[-1] == "event: ended", events
    assert read_event() == [], "the stream closed after `ended`"


def test_a_quarantined_token_shows_why_and_an_admin_clears_it(page, console_server):
    import sqlite3
    import time
    base = console_server["base"]
    status, created, _ = http_call(base, "POST", "/admin/providers", {"name": "caught"})
    assert status == 201, created
    # What a failed check stores with the token (the trust tests make one
    # for real, with a cheating worker).
    db = console_server["database_url"].removeprefix("sqlite://")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE worker_tokens SET quarantined_at = ?, quarantine_reason = ? WHERE id = ?",
                     (int(time.time()), "canary: token 7 is not in the top 4", created["id"]))
    sign_in(page, ADMIN_TOKEN)
    go(page, "fleet")
    row = page.locator(f'tr[data-token-id="{created["id"]}"]')
    row.filter(has_text="quarantined").wait_for(timeout=WAIT_MS)
    assert "canary: token 7" in row.inner_text()
    page.once("dialog", lambda d: d.accept())
    row.locator('[data-testid="clear-quarantine"]').click()
    row.filter(has_text="active").wait_for(timeout=WAIT_MS)
    assert row.locator('[data-testid="clear-quarantine"]').count() == 0
    status, tokens, _ = http_call(base, "GET", "/admin/providers/tokens")
    [t] = [t for t in tokens["data"] if t["id"] == created["id"]]
    assert t["quarantined_at"] is None and t["quarantine_reason"] is None, t


def api(console_server, path):
    status, body, _ = http_call(console_server["base"], "GET", path)
    assert status == 200, (path, body)
    return body


def wait_api(console_server, path, cond, what):
    """Polls an admin route until `cond(body)` holds (the API is the truth
    the page's numbers are checked against)."""
    import time
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        body = api(console_server, path)
        if cond(body):
            return body
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {body}"
        time.sleep(0.2)


def cell(page, row_selector, testid=None):
    row = page.locator(row_selector)
    row.wait_for(timeout=WAIT_MS)
    return row.locator(f'[data-testid="{testid}"]') if testid else row


def test_every_console_action_does_what_it_says_and_shows_the_apis_numbers(page, console_server):
    """Money (top-up, credit limit, penalty), keys (a budget), the market
    (a region, a cost profile, an ask posted and cancelled), models (loaded
    from the file list and unloaded) and the fleet (a worker paused and resumed,
    another removed): each done in the page, checked in the API, and the
    page's own figures equal to the API's, at 1440 px without any table
    hiding its columns."""
    from test_fleet import provider_token, start_worker, stop, wait_for, workers_up
    base = console_server["base"]
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, ADMIN_TOKEN)
    page.locator("nav").wait_for(state="visible", timeout=WAIT_MS)
    accept = lambda d: d.accept()  # noqa: E731

    # Money: a user account, topped up and given a credit limit.
    go(page, "money")
    page.fill("form[name=create-account] input[name=name]", "acts-user")
    page.click("form[name=create-account] [type=submit]")
    user_row = 'tr[data-account-id]:has-text("acts-user")'
    user_id = cell(page, user_row).get_attribute("data-account-id")
    page.locator(user_row).locator("form[name=topup] input[name=amount]").fill("1.25")
    page.locator(user_row).locator("form[name=topup] [type=submit]").click()
    wait_api(console_server, f"/admin/accounts/{user_id}", lambda a: a["balance"] == "1.25", "the top-up")
    page.wait_for_function(f"""() => document.querySelector(
        'tr[data-account-id="{user_id}"] [data-testid="balance"]')?.textContent === '1.25'""", timeout=WAIT_MS)
    page.locator(user_row).locator("button", has_text="Manage").click()
    page.fill("form[name=credit-limit] input[name=credit_limit]", "0.50")
    page.click("form[name=credit-limit] [type=submit]")
    wait_api(console_server, f"/admin/accounts/{user_id}", lambda a: a["credit_limit"] == "0.50",
             "the credit limit")

    # A provider account: topped up, then a penalty taken from it.
    page.fill("form[name=create-account] input[name=name]", "acts-provider")
    page.select_option("form[name=create-account] select[name=kind]", "provider")
    page.click("form[name=create-account] [type=submit]")
    prov_row = 'tr[data-account-id]:has-text("acts-provider")'
    prov_id = cell(page, prov_row).get_attribute("data-account-id")
    assert prov_id.startswith("provider:"), prov_id
    page.locator(prov_row).locator("form[name=topup] input[name=amount]").fill("0.10")
    page.locator(prov_row).locator("form[name=topup] [type=submit]").click()
    wait_api(console_server, f"/admin/accounts/{prov_id}", lambda a: a["balance"] == "0.10", "its top-up")
    page.locator(prov_row).locator("button", has_text="Manage").click()
    page.fill("form[name=penalty] input[name=amount]", "0.03")
    page.fill("form[name=penalty] input[name=memo]", "late")
    page.click("form[name=penalty] [type=submit]")
    wait_api(console_server, f"/admin/accounts/{prov_id}", lambda a: a["balance"] == "0.07", "the penalty")
    page.wait_for_function(f"""() => document.querySelector(
        'tr[data-account-id="{prov_id}"] [data-testid="balance"]')?.textContent === '0.07'""", timeout=WAIT_MS)
    shot(page, "acts-money")

    # Keys: one with a budget, shown as the API has it.
    go(page, "keys")
    page.fill("form[name=create-key] input[name=name]", "acts-key")
    page.fill("form[name=create-key] input[name=account_id]", user_id)
    page.fill("form[name=create-key] input[name=budget]", "0.20")
    page.click("form[name=create-key] [type=submit]")
    key_row = cell(page, 'tr[data-key-id]:has-text("acts-key")')
    key = next(k for k in api(console_server, "/admin/keys")["data"] if k["name"] == "acts-key")
    assert key["budget"] == "0.20" and key["spent"] == "0.00", key
    assert "0.00 / 0.20" in key_row.inner_text(), key_row.inner_text()

    # The market: a region, a cost profile in it, an ask posted and cancelled.
    go(page, "market")
    page.fill("form[name=add-region] input[name=region]", "acts-region")
    page.fill("form[name=add-region] input[name=price_per_kwh]", "0.15")
    page.click("form[name=add-region] [type=submit]")
    wait_api(console_server, "/admin/market/regions",
             lambda r: r["regions"].get("acts-region") == "0.15", "the region")
    profile = {"id": prov_id, "region": "acts-region", "watts": "300", "pue_milli": "1200",
               "depreciation_per_hour": "0.05", "network_per_hour": "0.01",
               "prefill_tokens_per_hour": "1000000", "decode_tokens_per_hour": "200000",
               "cached_bps": "1000", "preemptible_discount_bps": "2000"}
    for name, value in profile.items():
        page.fill(f"form[name=provider-profile] input[name={name}]", value)
    page.click("form[name=provider-profile] [type=submit]")
    saved = wait_api(console_server, "/admin/market/providers",
                     lambda b: any(p["account_id"] == prov_id for p in b["data"]), "the profile")
    mine = next(p for p in saved["data"] if p["account_id"] == prov_id)["profile"]
    assert (mine["depreciation_per_hour"], mine["network_per_hour"], mine["watts"]) == ("0.05", "0.01", 300)
    posted = next(m for m in api(console_server, "/admin/market/prices")["data"] if m["model"] == "tiny")
    price = posted["prices"]["output"]
    page.fill("form[name=post-ask] input[name=instrument]", "tiny")
    page.fill("form[name=post-ask] input[name=account_id]", prov_id)
    page.fill("form[name=post-ask] input[name=price]", price)
    page.fill("form[name=post-ask] input[name=quantity]", "7")
    page.click("form[name=post-ask] [type=submit]")
    asks = wait_api(console_server, "/admin/market/orders?instrument=tiny",
                    lambda b: any(o["account_id"] == prov_id for o in b["data"]), "the ask")
    order = next(o for o in asks["data"] if o["account_id"] == prov_id)
    assert (order["price"], order["quantity"], order["side"]) == (price, 7, "ask"), order
    row = cell(page, f'tr[data-order-id="{order["id"]}"]')
    page.once("dialog", accept)
    row.locator('[data-testid="cancel"]').click()
    wait_api(console_server, "/admin/market/orders?instrument=tiny",
             lambda b: all(o["id"] != order["id"] for o in b["data"]), "the cancel")
    shot(page, "acts-market")

    # Models: one loaded from the list of files, then unloaded.
    go(page, "models")
    page.once("dialog", lambda d: d.accept("acts-model"))
    cell(page, 'tr[data-file="tiny/tiny.gguf"]', "load-file").click()
    wait_api(console_server, "/admin/models/files",
             lambda b: "acts-model" in next(f for f in b["data"] if f["path"] == "tiny/tiny.gguf")["loaded_as"],
             "the load")
    page.once("dialog", accept)
    cell(page, 'tr[data-model="acts-model"]', "unload").click()
    page.locator('tr[data-model="acts-model"]').wait_for(state="detached", timeout=WAIT_MS)
    shot(page, "acts-models")

    # The fleet: a worker paused and resumed (it stays), another removed.
    token = provider_token(base, "acts-fleet")["token"]
    workers = [start_worker(base, token, "acts-a"), start_worker(base, token, "acts-b")]
    try:
        workers_up(base, workers, 2)
        go(page, "fleet")
        by_name = {w["name"]: w for w in api(console_server, "/admin/fleet")["data"]}
        a_row = f'tr[data-worker-id="{by_name["acts-a"]["id"]}"]'

        def state_of(name):
            return next(w["state"] for w in api(console_server, "/admin/fleet")["data"]
                        if w["name"] == name)
        page.once("dialog", accept)
        cell(page, a_row, "pause").click()
        wait_for(lambda: state_of("acts-a") == "paused", timeout=20, what="the pause")
        cell(page, a_row, "resume").click()
        wait_for(lambda: state_of("acts-a") in ("active", "calibrating"), timeout=20,
                 what="the resume")
        assert workers[0].poll() is None, "a paused worker stays"
        page.once("dialog", accept)
        cell(page, f'tr[data-worker-id="{by_name["acts-b"]["id"]}"]', "remove").click()
        wait_for(lambda: workers[1].poll() is not None, timeout=30, what="the removed worker to leave")
        wait_for(lambda: [w["name"] for w in api(console_server, "/admin/fleet")["data"]]
                 == ["acts-a"], timeout=20, what="only the resumed worker to stay")
    finally:
        for w in workers:
            if w.poll() is None:
                stop(w)

    # At 1440 px no table hides columns behind a scroll, on any page.
    for name in PAGES:
        go(page, name)
        page.wait_for_timeout(600)
        hidden = page.evaluate("""() => [...document.querySelectorAll('.scroll')]
            .filter((s) => s.scrollWidth > s.clientWidth + 1)
            .map((s) => s.querySelector('th')?.closest('tr')?.textContent.slice(0, 80))""")
        assert not hidden, f"{name}: tables wider than the page: {hidden}"
    # The charts have a time axis and say their values on hover.
    go(page, "overview")
    chart = page.locator("svg.plot").first
    chart.wait_for(timeout=WAIT_MS)
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)
    page.wait_for_function("""() => [...document.querySelectorAll('[data-testid="chart-hover"]')]
        .some((t) => /\\d\\d:\\d\\d:\\d\\d/.test(t.textContent))""", timeout=WAIT_MS)
    shot(page, "acts-overview")


def test_a_provider_page_shows_its_earnings_and_pays_out(page, console_server):
    from openai import OpenAI
    from test_fleet import start_worker, stop, workers_up
    base = console_server["base"]
    status, created, _ = http_call(base, "POST", "/admin/providers", {"name": "page-provider"})
    assert status == 201, created
    token, provider = created["token"], created["account_id"]
    assert http_call(base, "POST", f"/admin/accounts/{provider}/topup", {"amount": "0.50"})[0] == 200
    status, user, _ = http_call(base, "POST", "/admin/accounts", {"name": "page-user"})
    assert http_call(base, "POST", f"/admin/accounts/{user['id']}/topup", {"amount": "1.00"})[0] == 200
    status, key, _ = http_call(base, "POST", "/admin/keys", {"name": "page-key", "account_id": user["id"]})
    worker = start_worker(base, token, "page-w")
    try:
        workers_up(base, [worker], 1)
        sdk = OpenAI(base_url=base + "/v1", api_key=key["key"], max_retries=0, timeout=60)
        for i in range(3):
            sdk.completions.create(model="tiny", prompt=f"Story {i}", max_tokens=8, temperature=0,
                                   extra_headers={"x-synor-cache": "bypass"})
        history = wait_api(console_server, "/admin/journal?kind=usage&account=" + provider,
                           lambda b: len(b["data"]) >= 1, "the worker's pay")
        assert history["data"], history
        page.goto(base + "/console/provider")
        page.fill("#signin input[name=token]", token)
        page.click("#signin [type=submit]")
        payable = page.locator('[data-testid="provider-payable"]')
        payable.wait_for(state="visible", timeout=WAIT_MS)
        earned = http_call(base, "GET", "/v1/providers/earnings", token=token)[1]
        assert payable.inner_text() == "0.50" == earned["payable"], (payable.inner_text(), earned)
        assert page.locator('[data-testid="provider-name"]').inner_text().startswith("page-provider")
        page.locator('tr[data-worker-id]', has_text="page-w").wait_for(timeout=WAIT_MS)
        page.locator("figure.chart svg.plot").first.wait_for(timeout=WAIT_MS)
        page.fill("form[name=payout] input[name=amount]", "0.20")
        page.fill("form[name=payout] input[name=memo]", "to my bank")
        page.click("form[name=payout] [type=submit]")
        page.locator("tr[data-transaction-id]").first.wait_for(timeout=WAIT_MS)
        paid = http_call(base, "GET", "/v1/providers/payouts", token=token)[1]["data"]
        assert len(paid) == 1 and paid[0]["entries"][provider] == "-0.20" and paid[0]["memo"] == "to my bank"
        assert "0.20" in page.locator("tr[data-transaction-id]").first.inner_text()
        stored = page.evaluate("JSON.stringify([{...sessionStorage}, {...localStorage}, location.href])")
        assert token not in stored, "the worker token was kept by the page"
        shot(page, "provider-page")
        assert http_call(base, "GET", "/admin/ledger/audit")[1]["violations"] == []
    finally:
        stop(worker)
