"""Time to interactive and page weight of the admin console's overview, in
headless Chromium (Debian's `chromium`, driven by Playwright from the e2e
virtualenv) against a running server:

    .py/venv/bin/python loadtest/console_tti.py --base http://127.0.0.1:8080 \
        --admin-token TOKEN [--runs 10]

"Interactive" is the moment the overview shows live numbers: its first
event from the overview stream is drawn and the live indicator is on. Cold
loads use a fresh browser context (nothing cached); warm loads reload the
page in the same context (the files revalidate by ETag). Page weight is what
the loads transfer: the page, its scripts and styles, and the overview's
first JSON. A benchmark, not a test: it prints a table for BENCHMARKS.md.
"""

import argparse
import json
import statistics
import sys
import time

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

MEASURE = """() => {
    const entries = [...performance.getEntriesByType('navigation'),
                     ...performance.getEntriesByType('resource')];
    return {
        tti_ms: performance.now(),
        requests: entries.length,
        transfer_bytes: entries.reduce((s, e) => s + (e.transferSize || 0), 0),
        body_bytes: entries.reduce((s, e) => s + (e.decodedBodySize || 0), 0),
        files: entries.map(e => [e.name.replace(location.origin, ''), e.decodedBodySize]),
    };
}"""

LIVE = "() => document.querySelector('[data-testid=\"live\"]')?.textContent.trim() === 'live'"


def sign_in(ctx, base, token):
    r = ctx.request.post(base + "/console/session", data=json.dumps({"token": token}),
                         headers={"content-type": "application/json"})
    if r.status != 200:
        sys.exit(f"sign-in failed: {r.status} {r.text()}")
    return r.json()["csrf"]


def load(page, base, reload=False):
    if reload:
        page.reload()
    else:
        page.goto(base + "/console#overview")
    page.wait_for_function(LIVE, timeout=30_000)
    return page.evaluate(MEASURE)


def summarize(name, runs):
    tti = sorted(r["tti_ms"] for r in runs)
    p90 = tti[min(len(tti) - 1, int(0.9 * len(tti)))]
    last = runs[-1]
    print(f"| {name} | {len(runs)} | {statistics.median(tti):.0f} | {p90:.0f} | "
          f"{last['requests']} | {last['transfer_bytes'] / 1024:.1f} | {last['body_bytes'] / 1024:.1f} |")
    return last


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8080")
    ap.add_argument("--admin-token", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=a.chromium, headless=True, args=CHROMIUM_ARGS)
        cold, warm = [], []
        for _ in range(a.runs):
            ctx = browser.new_context(viewport={"width": 1366, "height": 860})
            csrf = sign_in(ctx, a.base, a.admin_token)
            ctx.add_init_script(f"sessionStorage.setItem('synor.csrf', {json.dumps(csrf)})")
            page = ctx.new_page()
            started = time.monotonic()
            cold.append(load(page, a.base))
            cold[-1]["wall_ms"] = (time.monotonic() - started) * 1e3
            warm.append(load(page, a.base, reload=True))
            ctx.close()
        browser.close()
    print("| load | runs | TTI p50 (ms) | TTI p90 (ms) | requests | transferred (KiB) | decoded (KiB) |")
    print("|---|---|---|---|---|---|---|")
    last = summarize("cold (fresh context)", cold)
    summarize("warm (reload, ETag)", warm)
    print("\nfiles of a cold load (decoded bytes):")
    for name, size in last["files"]:
        print(f"  {name} {size}")


if __name__ == "__main__":
    main()
