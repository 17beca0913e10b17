"""The README's quickstarts work when pasted: every `bash` and `python`
block of each `## Quickstart:` section runs, in order, against a real
server (the app developer's against `make run`'s open server; the
operator's and the provider's start their own, as the README says), with
`synor` on the PATH as `make run` leaves it, in a fresh directory."""

import os
import socket
import subprocess
import sys

from conftest import ROOT, _start

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import quickstarts  # noqa: E402

SYNOR = os.environ.get("SYNOR_BIN", os.path.join(ROOT, "target", "debug", "synor"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(tmp_path, port):
    """What a newcomer's shell has: `synor` and Python with the OpenAI SDK
    on the PATH, the models where `make run` put them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "synor").symlink_to(os.path.abspath(SYNOR))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNOR_", "OPENAI_"))}
    env.update({
        "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{env['PATH']}",
        "SYNOR_MODELS_DIR": os.environ.get("SYNOR_MODELS_DIR", os.path.join(ROOT, "models")),
        "SYNOR_URL": f"http://127.0.0.1:{port}",
        "SYNOR_BIND": f"127.0.0.1:{port}",
        "SYNOR_DATABASE_URL": f"sqlite://{tmp_path}/data/synor.db",
        "RUST_LOG": "info",
    })
    return env


def run(tmp_path, env, *titles):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    found = quickstarts.sections(readme)
    assert all(found[t] for t in found), f"a quickstart without blocks: {found.keys()}"
    text = quickstarts.script(found, quickstarts.pick(found, titles))
    path = tmp_path / "quickstart.sh"
    path.write_text(text)
    p = subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    logs = "".join(f"\n--- {f.name}\n{f.read_text()[-3000:]}" for f in tmp_path.glob("*.log"))
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}{logs}"
    return p.stdout


def test_the_app_developer_quickstart_works_when_pasted(tmp_path):
    port = free_port()
    env = environment(tmp_path, port)
    # `make run`: the default models in open mode.
    server = _start("--bind", f"127.0.0.1:{port}")
    next(server)
    try:
        out = run(tmp_path, env, "build an app")
    finally:
        server.close()
    assert "Paris" in out, out
    assert '"city"' in out and "384 dimensions" in out, out
    assert out.count("@@ block build") == 3, out


def test_the_operator_and_provider_quickstarts_work_when_pasted(tmp_path):
    port = free_port()
    out = run(tmp_path, environment(tmp_path, port), "run it for others", "provide compute")
    assert "admin token:" in out and '"balance":"4.99' in out, out
    assert "synor:request_success_total{" in out and "<title>" in out, out
    earned = out[out.rindex("provider "):]
    assert "earned today" in earned and "earned today  0.00\n" not in earned, earned
    assert "(active)" in earned and "spot checks" in earned, earned
