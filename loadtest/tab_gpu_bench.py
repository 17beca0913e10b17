"""The browser worker's engine alone, in headless Chromium, on its CPU
kernels (WebAssembly SIMD128) and on the browser's WebGPU adapter
(SwiftShader where there is no GPU), one after the other on the same
model: prefill time, decode milliseconds a step, and the greedy tokens
(the two must agree). A benchmark, not a test; after
`scripts/build-tab.sh`:

    .py/venv/bin/python loadtest/tab_gpu_bench.py [--model models/....gguf]
        [--tab target/tab] [--devices cpu,webgpu] [--prompt 32] [--tokens 16]

A local HTTP server serves the page (`loadtest/tab_gpu_bench/`), the
build and the model; no synor server is involved.
"""

import argparse
import functools
import http.server
import json
import os
import shutil
import statistics
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--no-sandbox", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--enable-unsafe-webgpu",
        "--enable-unsafe-swiftshader"]


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(
        os.environ.get("SYNOR_MODELS_DIR", os.path.join(ROOT, "models")),
        "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tab", default=os.path.join(ROOT, "target", "tab"))
    ap.add_argument("--devices", default="cpu,webgpu")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()
    site = tempfile.mkdtemp(prefix="tab-gpu-bench-")
    for f in ("bench.html", "bench-worker.js"):
        shutil.copy(os.path.join(ROOT, "loadtest", "tab_gpu_bench", f), site)
    shutil.copy(os.path.join(ROOT, "web", "provide-jspi.js"), site)
    for f in ("tab.js", "tab_bg.wasm"):
        shutil.copy(os.path.join(a.tab, f), site)
    os.symlink(os.path.abspath(a.model), os.path.join(site, "model.gguf"))
    handler = functools.partial(Quiet, directory=site)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    from playwright.sync_api import sync_playwright
    rows = []
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                               headless=True, args=ARGS)
        for device in a.devices.split(","):
            page = b.new_page()
            page.goto(f"http://127.0.0.1:{srv.server_port}/bench.html?model=model.gguf&device={device}"
                      f"&prompt={a.prompt}&tokens={a.tokens}")
            page.wait_for_function("document.title == 'done'", timeout=a.timeout * 1000)
            r = page.evaluate("window.result")
            page.close()
            if "error" in r:
                raise SystemExit(f"{device}: {r['error']}")
            decode = sorted(t for t in r["times"][1:] if t > 0.5)
            rows.append((r, statistics.median(decode) if decode else float("nan")))
        b.close()
    srv.shutdown()
    print(f"| {os.path.basename(a.model)} | load (s) | prefill {a.prompt} tokens (ms) | decode (ms a step) | tok/s |")
    print("|---|---|---|---|---|")
    for r, step in rows:
        print(f"| {r['device']} | {r['load'] / 1e3:.1f} | {r['times'][0]:.0f} | {step:.1f} | {1e3 / step:.2f} |")
    for r, _ in rows:
        print(f"{r['device']}: tokens {json.dumps(r['tokens'])}")
    if len({json.dumps(r["tokens"]) for r, _ in rows}) > 1:
        print("the devices' greedy tokens differ")


if __name__ == "__main__":
    main()
