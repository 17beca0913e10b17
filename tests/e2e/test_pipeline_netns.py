"""A pipeline's stages on other hosts: each worker in a network namespace
of its own, joined to the server by a veth pair on a bridge the test made
(10.213.X.0/24, addresses nothing else uses), each direction of each link
delayed 10 ms (20 ms a round trip per hop). The default model split over
three such workers writes, greedy, what the whole model writes.

The delay is `tc netem` where the kernel has it; where it does not (this
machine's kernel has no netem qdisc, and modules cannot be loaded), each
worker reaches the server through a proxy on the bridge that holds every
chunk of bytes 10 ms each way. Needs root and iproute2; skipped
elsewhere."""

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, ROOT, _start, units
from test_fleet import call, provider_token, wait_for
from test_pipeline import MEMORY, PIPE, SMOL, WHOLE, chain

TAG = f"sp{os.getpid() % 10000}"
SUBNET = f"10.213.{os.getpid() % 200 + 20}"
DELAY_MS = 10


def ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def has_netem(ns, dev):
    r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                        "netem", "delay", f"{DELAY_MS}ms"], capture_output=True, text=True)
    return r.returncode == 0


@pytest.fixture()
def lan():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("network namespaces need root and iproute2")
    bridge, made = f"{TAG}br", []
    ip("ip", "link", "add", bridge, "type", "bridge")
    try:
        ip("ip", "addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        ip("ip", "link", "set", bridge, "up")
        hosts, netem = [], True
        for i in range(3):
            ns, outer, inner = f"{TAG}n{i}", f"{TAG}v{i}", f"{TAG}p{i}"
            ip("ip", "netns", "add", ns)
            made.append(ns)
            ip("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            ip("ip", "link", "set", inner, "netns", ns)
            ip("ip", "link", "set", outer, "master", bridge, "up")
            ip("ip", "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", inner, ns=ns)
            ip("ip", "link", "set", inner, "up", ns=ns)
            ip("ip", "link", "set", "lo", "up", ns=ns)
            netem = netem and has_netem(ns, inner)
            if netem:
                ip("tc", "qdisc", "add", "dev", outer, "root", "netem", "delay", f"{DELAY_MS}ms")
            hosts.append(ns)
        yield {"server": f"{SUBNET}.1", "hosts": hosts, "netem": netem}
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


class DelayProxy:
    """TCP on `host`:port to `target`, every chunk of bytes held `delay`
    seconds each way (in order: the same delay for all)."""

    def __init__(self, host, target, delay):
        self.target, self.delay = target, delay
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(
                asyncio.start_server(self.handle, host, 0))
            self.port = self.server.sockets[0].getsockname()[1]
            started.set()
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        started.wait(10)

    async def pipe(self, reader, writer):
        queue = asyncio.Queue()

        async def send():
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.delay, data))
        finally:
            queue.put_nowait(None)
            await sender

    async def handle(self, reader, writer):
        host, port = self.target
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self.pipe(reader, up_writer), self.pipe(up_reader, writer),
                             return_exceptions=True)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


def worker_in(ns, base, token, name):
    binary = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))
    env = dict(os.environ)
    env.setdefault("SYNOR_MODELS_DIR", os.path.join(ROOT, "models"))
    env.setdefault("RUST_LOG", "info")
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, binary, "worker", "--server", base.replace("http://", "ws://"),
         "--token", token, "--name", name, "--model", "none", "--embedding-model", "none",
         "--part-model", f"{PIPE}={SMOL}", "--max-memory", MEMORY, "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def complete(base, key, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json", "authorization": f"Bearer {key}",
                                  "x-synor-cache": "bypass"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["text"]


def test_three_stages_across_delayed_links_write_what_the_whole_model_writes(lan):
    gen = _start("--bind", f"{lan['server']}:0", "--model", SMOL, "--embedding-model", "none",
                 "--admin-token", ADMIN_TOKEN, "--pipeline-model", f"{PIPE}={SMOL}",
                 open_mode=False)
    srv = next(gen)
    base = srv["base"]
    workers, proxies = [], []
    try:
        status, acct = call(base, "POST", "/admin/accounts", {"name": "netns"})
        assert status == 201, acct
        assert call(base, "POST", f"/admin/accounts/{acct['id']}/topup", {"amount": units(10**12)})[0] == 200
        status, key = call(base, "POST", "/admin/keys", {"name": "netns", "account_id": acct["id"]})
        assert status == 201, key
        token = provider_token(base)["token"]
        port = int(base.rsplit(":", 1)[1])
        if not lan["netem"]:
            proxies.extend(DelayProxy(lan["server"], (lan["server"], port), DELAY_MS / 1000)
                           for _ in lan["hosts"])
        gateways = [f"http://{lan['server']}:{p.port}" for p in proxies] or [base] * 3
        workers = [worker_in(ns, gw, token, f"far{i}")
                   for i, (ns, gw) in enumerate(zip(lan["hosts"], gateways))]
        wait_for(lambda: len(chain(base)) == 3, timeout=90, what="three stages across the links")
        if lan["netem"]:
            remotes = {w["remote"].split(":")[0] for w in call(base, "GET", "/admin/fleet")[1]["data"]}
            assert remotes == {f"{SUBNET}.{10 + i}" for i in range(3)}, remotes
        # Every hop is slow: a step takes at least the three round trips.
        started = time.monotonic()
        complete(base, key["key"], PIPE, "Warm", 1)
        assert time.monotonic() - started >= 3 * 2 * DELAY_MS / 1000
        for prompt in ["The capital of France is", "Once upon a time"]:
            want = complete(base, key["key"], WHOLE, prompt, 24)
            assert complete(base, key["key"], PIPE, prompt, 24) == want, prompt
    finally:
        for w in workers:
            w.kill()
            w.wait()
        for p in proxies:
            p.close()
        gen.close()
