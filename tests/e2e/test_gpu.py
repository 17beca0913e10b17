"""`synor serve --device wgpu`: the real binary serving a model on the wgpu
backend (lavapipe, Mesa's software Vulkan, where there is no GPU) through
the OpenAI SDK, with the same greedy text as the CPU; and the devices a
build cannot run are refused at start with one clear error."""

import subprocess

import pytest

from conftest import _synor


def _chat(base, text):
    from openai import OpenAI
    sdk = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": text}],
        max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    return r.choices[0].message.content, r.usage.completion_tokens


@pytest.mark.parametrize("text", ["hello there", "count to three"])
def test_a_model_on_wgpu_answers_like_the_cpu(text):
    args = ("--model", "tiny/tiny.gguf", "--embedding-model", "none", "--no-cache")
    with_gpu = _synor(*args, "--device", "wgpu")
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


def test_a_device_this_build_cannot_run_is_refused_with_one_clear_error():
    import os
    binary = os.environ.get("SYNOR_BIN", "target/debug/synor")
    for device, why in [("cuda:0", "no CUDA driver on this machine"),
                        ("tpu", "unknown device `tpu`")]:
        p = subprocess.run([binary, "serve", "--device", device, "--bind", "127.0.0.1:0",
                            "--model", "tiny/tiny.gguf", "--embedding-model", "none"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0
        out = p.stdout + p.stderr
        # A machine with an NVIDIA driver gets the other clear refusal.
        assert why in out or "CUDA executor is not built yet" in out, out
        assert "panicked" not in p.stdout + p.stderr


def test_a_worker_on_wgpu_registers_its_adapter_and_passes_calibration_and_canaries():
    from test_fleet import fleet, fresh_db, provider_token, start_server, start_worker, wait_for
    srv = start_server(fresh_db())
    base = srv["base"]
    worker = start_worker(base, provider_token(base)["token"], "gpu1", "--device", "wgpu")
    try:
        [w] = wait_for(lambda: [w for w in fleet(base) if w["state"] == "active"],
                       timeout=120, what="the wgpu worker to be calibrated")
        gpus = [d for d in w["devices"] if d["kind"] == "wgpu"]
        assert gpus and gpus[0]["usable"], w["devices"]
        assert w["profile"]["decode_step_ms_1"] > 0, w
        # Its canaries matched the house's reference: not quarantined.
        assert w["state"] == "active"
    finally:
        if worker.poll() is None:
            worker.kill()
        srv["gen"].close()
