"""A browser tab as a worker against a native worker on the same cores:
decode tokens a second, time to first served token for a tab opened cold
and for one returning with its weights kept, and the bytes it downloads;
with `--devices cpu,webgpu`, the tab on its CPU kernels and on the
browser's WebGPU adapter (SwiftShader where there is no GPU), one after
the other.
Headless Chromium (Debian's `chromium`, Playwright from the e2e
virtualenv) opens /provide on a running server; the native worker is
`synor worker` with --threads 1 and 2. A benchmark, not a test: it prints
a table for BENCHMARKS.md. Start the server so workers get the work:

    target/release/synor serve --open --model smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --embedding-model none --admin-token T --placement-house-factor 1000 --no-cache &
    .py/venv/bin/python loadtest/tab_bench.py --base http://127.0.0.1:8080 --admin-token T \\
        --model smollm2-135m-instruct --synor target/release/synor --tokens 128

Every request bypasses the response caches and ignores EOS (greedy), so
each run generates all its tokens.
"""

import argparse
import json
import subprocess
import time
import urllib.request

CHROMIUM_ARGS = ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--enable-unsafe-webgpu",
                 "--enable-unsafe-swiftshader"]


def call(base, method, path, token, body=None):
    req = urllib.request.Request(base + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def active(base, admin, name):
    return any(w["name"] == name and w["state"] == "active" for w in call(base, "GET", "/admin/fleet", admin)["data"])


def wait(cond, timeout=600):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit("timed out")


def generate(base, model, tokens):
    """A streamed greedy completion: (seconds to its first token, decode
    tokens a second after it)."""
    body = {"model": model, "prompt": "The history of the river", "max_tokens": tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "x-synor-cache": "bypass"})
    start, first, n = time.monotonic(), None, 0
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            if line.startswith(b"data: {") and b'"text"' in line:
                n += 1
                first = first or time.monotonic()
    end = time.monotonic()
    return first - start, (n - 1) / (end - first) if n > 1 else 0.0


def open_tab(ctx, base, token, model, name, device):
    page = ctx.new_page()
    page.goto(base + "/provide")
    page.fill('[data-testid="token"]', token)
    page.click('[data-testid="list-models"]')
    page.wait_for_selector(f'[data-testid="model"] option[value="{model}"]', state="attached")
    page.select_option('[data-testid="model"]', model)
    page.select_option('[data-testid="device"]', device)
    page.fill('input[name="name"]', name)
    page.click('[data-testid="start"]')
    return page


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--admin-token", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--synor", default="target/release/synor")
    ap.add_argument("--native-model", help="the file the native worker loads (default: the server's)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--devices", default="cpu", help="what the tab runs on, in order: cpu, webgpu")
    ap.add_argument("--no-native", action="store_true", help="skip the native workers")
    a = ap.parse_args()
    token = call(a.base, "POST", "/admin/providers", a.admin_token, {"name": "bench"})["token"]
    rows = []
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        ctx = browser.new_context()
        devices = a.devices.split(",")
        runs = [(devices[0], "cold")] + [(d, "cached") for d in devices]
        for device, kind in runs:
            name = f"tab-{device}-{kind}"
            t0 = time.monotonic()
            page = open_tab(ctx, a.base, token, a.model, name, device)
            wait(lambda: active(a.base, a.admin_token, name))
            joined = time.monotonic() - t0
            ttft, _ = generate(a.base, a.model, 2)
            loaded = page.get_attribute('[data-testid="loaded"]', "data-cached")
            text = page.text_content('[data-testid="loaded"]')
            _, speed = generate(a.base, a.model, a.tokens)
            rows.append((f"tab, {device} ({kind}: {text})", joined + ttft, speed, loaded))
            page.close()
            wait(lambda: not active(a.base, a.admin_token, name))
        browser.close()
    ws = a.base.replace("http://", "ws://")
    for threads in () if a.no_native else (1, 2):
        name = f"native-{threads}"
        t0 = time.monotonic()
        p = subprocess.Popen([a.synor, "worker", "--server", ws, "--token", token, "--name", name,
                              "--model", a.native_model or a.model, "--embedding-model", "none",
                              "--threads", str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait(lambda: active(a.base, a.admin_token, name))
            joined = time.monotonic() - t0
            ttft, _ = generate(a.base, a.model, 2)
            _, speed = generate(a.base, a.model, a.tokens)
            rows.append((f"native worker, --threads {threads}", joined + ttft, speed, "-"))
        finally:
            p.terminate()
            p.wait()
            wait(lambda: not active(a.base, a.admin_token, name))
    print(f"| executor | first served token (s) | decode tok/s ({a.tokens} tokens) |")
    print("|---|---|---|")
    for label, first, speed, _ in rows:
        print(f"| {label} | {first:.1f} | {speed:.2f} |")


if __name__ == "__main__":
    main()
