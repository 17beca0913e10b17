"""Every architecture beyond llama's block (issue 43), served by real worker
processes on loopback like the default model: Qwen3 (per-head norms of q
and k, heads wider than hidden / heads), Qwen3-MoE and Mixtral (routed
experts), Gemma 3 and 2 (GeGLU, post-norms, sliding-window layers, Gemma
2's soft-capped scores and logits), Phi-3 (stacked projections, LongRoPE,
a partial rotary embedding). Each worker loads the model's small
synthetic file (`make synthetic`), registers, is calibrated and
spot-checked, is placed, runs the split prefill/decode pipeline with the
other worker (its KV moved as checked frames), and is paid what the
server counted; the text is the server's own engine's, token for token."""

import pytest

from conftest import ADMIN_TOKEN, _start, ticks
from test_fleet import call, fleet, provider_token, sdk, start_worker, stop, wait_for, workers_up
from test_split import PROMPTS, metrics, transfers

ARCH_MODELS = {
    "qwen3": "synthetic/parity-qwen3.Q4_K.gguf",
    "qwen3moe": "synthetic/parity-qwen3moe.Q4_K.gguf",
    "mixtral": "synthetic/parity-mixtral.Q8_0.gguf",
    "gemma3": "synthetic/parity-gemma3.Q8_0.gguf",
    "gemma2": "synthetic/parity-gemma2.Q8_0.gguf",
    "phi3": "synthetic/parity-phi.Q4_K.gguf",
}


def complete(base, model, prompt):
    return sdk(base).completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True}, extra_headers={"x-synor-cache": "bypass"})


@pytest.mark.parametrize("name", sorted(ARCH_MODELS))
def test_each_architecture_is_calibrated_placed_split_checked_and_billed_on_workers(name):
    path = ARCH_MODELS[name]
    gen = _start("--model", path, "--served-model-name", name, "--embedding-model", "none",
                 "--admin-token", ADMIN_TOKEN, "--placement-house-factor", "1000",
                 "--fleet-split", "always")
    base = next(gen)["base"]
    procs = []
    try:
        want = {p: complete(base, name, p).choices[0].text for p in PROMPTS}
        created = provider_token(base)
        procs = [start_worker(base, created["token"], f"w{i}", "--served-model-name", name,
                              model=path) for i in (1, 2)]
        workers_up(base, procs, 2)
        # Calibrated and canary-checked like any worker.
        status, checks = call(base, "GET", "/admin/spotchecks")
        ids = {w["id"] for w in fleet(base)}
        mine = [c for c in checks["data"] if c["worker_id"] in ids]
        assert status == 200 and len(mine) == 2, checks
        assert all(c["checked"] >= 1 and c["passed"] == c["checked"] for c in mine), mine
        for p in PROMPTS:
            r = complete(base, name, p)
            assert r.choices[0].text == want[p], (name, p)
        # Every request split over the two workers, its KV moved and taken.
        assert metrics(base)['synor:fleet_plans_total{plan="split"}'] == len(PROMPTS), metrics(base)
        assert transfers(base, "imported") == len(PROMPTS), metrics(base)
        assert sum(w["tokens_delivered"] for w in fleet(base)) >= 12 * len(PROMPTS), fleet(base)
        # Billed and paid exactly once: the provider holds what its usage
        # records say it earned, and the ledger balances.
        def settled():
            usage = call(base, "GET", "/admin/usage?limit=500")[1]
            paid = sum(ticks(r["provider_amount"]) for r in usage["data"]
                       if r["provider_id"] == created["account_id"])
            balance = ticks(call(base, "GET", f"/admin/accounts/{created['account_id']}")[1]["balance"])
            return paid > 0 and balance == paid
        wait_for(settled, timeout=10, what="the provider to be paid its usage")
        status, audit = call(base, "GET", "/admin/ledger/audit")
        assert status == 200 and audit["violations"] == [], audit
    finally:
        for p in procs:
            stop(p)
        gen.close()
