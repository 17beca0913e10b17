"""`synor serve --device wgpu|cuda:0`: the real binary serving a model on
the wgpu backend (lavapipe, Mesa's software Vulkan, where there is no GPU)
and on CUDA (where a CUDA driver is present; skipped elsewhere) through
the OpenAI SDK, with the same greedy text as the CPU; and the devices a
machine cannot run are refused at start with one clear error."""

import ctypes.util
import os
import subprocess

import pytest

from conftest import _synor


def _cuda_driver():
    return ctypes.util.find_library("cuda") is not None or os.path.exists("/proc/driver/nvidia")


def _chat(base, text):
    from openai import OpenAI
    sdk = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": text}],
        max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    return r.choices[0].message.content, r.usage.completion_tokens


@pytest.mark.parametrize("device", ["wgpu", "cuda:0"])
@pytest.mark.parametrize("text", ["hello there", "count to three"])
def test_a_model_on_a_gpu_answers_like_the_cpu(device, text):
    if device.startswith("cuda") and not _cuda_driver():
        pytest.skip("no CUDA driver on this machine")
    args = ("--model", "tiny/tiny.gguf", "--embedding-model", "none", "--no-cache")
    with_gpu = _synor(*args, "--device", device)
    gpu = next(with_gpu)
    try:
        got, n = _chat(gpu["base"], text)
    finally:
        with_gpu.close()
    with_cpu = _synor(*args)
    cpu = next(with_cpu)
    try:
        want, m = _chat(cpu["base"], text)
    finally:
        with_cpu.close()
    assert n == m == 12
    assert got == want


def test_a_device_this_machine_cannot_run_is_refused_with_one_clear_error():
    binary = os.environ.get("SYNOR_BIN", "target/debug/synor")
    refused = [("tpu", "unknown device `tpu`"), ("cuda:99", "cuda:99")]
    if not _cuda_driver():
        refused.append(("cuda:0", "no CUDA driver on this machine"))
    for device, why in refused:
        p = subprocess.run([binary, "serve", "--device", device, "--bind", "127.0.0.1:0",
                            "--model", "tiny/tiny.gguf", "--embedding-model", "none"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0
        out = p.stdout + p.stderr
        assert why in out, out
        assert "panicked" not in p.stdout + p.stderr


@pytest.mark.parametrize("device,kind", [("wgpu", "wgpu"), ("cuda:0", "cuda")])
def test_a_worker_on_a_gpu_registers_it_and_passes_calibration_and_canaries(device, kind):
    from test_fleet import fleet, fresh_db, provider_token, start_server, start_worker, wait_for
    if kind == "cuda" and not _cuda_driver():
        pytest.skip("no CUDA driver on this machine")
    srv = start_server(fresh_db())
    base = srv["base"]
    worker = start_worker(base, provider_token(base)["token"], "gpu1", "--device", device)
    try:
        [w] = wait_for(lambda: [w for w in fleet(base) if w["state"] == "active"],
                       timeout=120, what=f"the {device} worker to be calibrated")
        gpus = [d for d in w["devices"] if d["kind"] == kind]
        assert gpus and gpus[0]["usable"], w["devices"]
        assert w["profile"]["decode_step_ms_1"] > 0, w
        # Its canaries matched the house's reference: not quarantined.
        assert w["state"] == "active"
    finally:
        if worker.poll() is None:
            worker.kill()
        srv["gen"].close()
