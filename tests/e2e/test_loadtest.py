"""`synor-loadtest` end to end against the real `synor` binary: a short run
writes a valid JSON result and SVG plots; a cancellation storm leaves
nothing running; bad arguments are one line and a non-zero exit; repeated
runs bypass the response cache unless `--cache allow`, and hits are
reported."""

import json
import os
import re
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LOADTEST_BIN", os.path.join(ROOT, "target", "debug", "synor-loadtest"))


def loadtest(*args, timeout=300):
    return subprocess.run(
        [BIN, "--no-progress", *args], capture_output=True, text=True, timeout=timeout
    )


def test_a_run_writes_a_valid_result_and_plots(server, tmp_path):
    result = tmp_path / "result.json"
    plots = tmp_path / "plots"
    p = loadtest(
        "--base-url", server["base"],
        "--num-prompts", "6", "--max-concurrency", "3",
        "--random-input-len", "24", "--random-output-len", "12", "--ignore-eos",
        "--goodput", "ttft:60000",
        "--result-file", str(result), "--save-detailed", "--plot-dir", str(plots),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Serving Benchmark Result" in p.stdout and "TPOT (NVIDIA: ITL)" in p.stdout
    r = json.loads(result.read_text())
    a = r["aggregates"]
    assert a["completed"] == 6 and a["failed"] == 0
    assert a["total_output_tokens"] == 6 * 12
    assert a["total_input_tokens"] > 6 * 24
    assert 1 <= a["peak_concurrency"] <= 3
    assert a["goodput"] is not None and a["goodput"] > 0
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(a[k]["percentiles"]) == {"p50", "p90", "p99"}
        assert a[k]["median"] > 0
    assert len(r["details"]) == 6 and all(d["status"] == "ok" for d in r["details"])
    assert r["run"]["date"].endswith("Z")
    for name in ("ttft.svg", "itl.svg", "throughput.svg"):
        svg = (plots / name).read_text()
        assert svg.lstrip().startswith("<svg") and svg.rstrip().endswith("</svg>"), name
        assert "<rect" in svg or "<polyline" in svg, name
    # The comparison of a file with itself shows ratios of 1.
    c = subprocess.run([BIN, "compare", str(result), str(result)], capture_output=True, text=True)
    assert c.returncode == 0 and "1.00x" in c.stdout


def test_vllms_flags_and_result_file_and_a_duration(server, tmp_path):
    # vLLM's flag names, its flat result file beside ours, a rate capped by
    # a duration: 20 requests at 4/s cannot all be sent in 1.5 s.
    p = loadtest(
        "--base-url", server["base"], "--dataset-name", "random",
        "--num-prompts", "20", "--request-rate", "4", "--duration", "1.5",
        "--random-input-len", "16", "--random-output-len", "4", "--ignore-eos",
        "--metric-percentiles", "50,99.9", "--save-result", "--result-dir", str(tmp_path / "out"),
        "--result-filename", "run.json", "--api-key", "sk-never-written",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    flat = json.loads((tmp_path / "out" / "run.json").read_text())
    ours = json.loads((tmp_path / "out" / "run.synor.json").read_text())
    assert flat["backend"] == "synor" and flat["request_rate"] == 4.0
    assert 1 <= flat["completed"] < 20, flat["completed"]
    assert flat["completed"] == ours["aggregates"]["completed"] == len(flat["ttfts"])
    assert flat["total_output_tokens"] == 4 * flat["completed"]
    for m in ("ttft", "tpot", "itl", "e2el"):
        for k in (f"mean_{m}_ms", f"median_{m}_ms", f"std_{m}_ms", f"p50_{m}_ms", f"p99.9_{m}_ms"):
            assert isinstance(flat[k], float), k
    assert all(len(itl) == 3 for itl in flat["itls"]), flat["itls"]
    for f in (tmp_path / "out").iterdir():
        assert "sk-never-written" not in f.read_text(), f


def test_a_cancellation_storm_leaves_nothing_running(server):
    p = loadtest(
        "--base-url", server["base"], "--num-prompts", "8", "--max-concurrency", "8",
        "--random-input-len", "16", "--random-output-len", "200", "--ignore-eos",
        "--cancel-after", "2",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Cancellation check: PASS" in p.stdout
    assert re.search(r"Cancelled by the client:\s+8\n", p.stdout), p.stdout


def test_repeated_runs_bypass_the_cache_unless_allowed_and_hits_are_reported(server, tmp_path):
    # The warm-up asks for 16 tokens, the runs for 24: it never answers one.
    args = ("--base-url", server["base"], "--num-prompts", "4", "--max-concurrency", "4",
            "--random-input-len", "16", "--random-output-len", "24", "--ignore-eos",
            "--seed", "12")

    def run(name, *extra):
        result = tmp_path / f"{name}.json"
        p = loadtest(*args, *extra, "--result-file", str(result))
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout, json.loads(result.read_text())

    for name in ("bypass-1", "bypass-2"):
        out, r = run(name)
        c = r["aggregates"]["cache"]
        assert r["run"]["cache"] == "bypass"
        assert (c["hits"], c["bypassed"], c["hit_rate"]) == (0, 4, 0.0), c
        assert re.search(r"Cache hits:\s+0 \(0\.0%\)\n", out) and "WARNING" not in out, out
    run("allow-1", "--cache", "allow")
    out, r = run("allow-2", "--cache", "allow")
    c = r["aggregates"]["cache"]
    assert (c["hits"], c["hit_rate"]) == (4, 1.0), c
    assert sum(c["hits_by_tier"].values()) == 4, c
    assert "WARNING: 4 of 4 responses came from the response cache" in out, out


def test_bad_arguments_are_one_clear_line():
    for args, needle in [
        (["--request-rate", "0"], "greater than 0"),
        (["--dataset", "chat", "--dataset-path", "/no/such.jsonl"], "cannot read the dataset file"),
        (["--base-url", "http://127.0.0.1:9", "--num-prompts", "1"], "warm-up request failed"),
    ]:
        p = loadtest(*args, timeout=60)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, p.stderr)
        assert "panicked" not in p.stderr


def test_overload_is_counted_apart_with_retry_after(tiny_server, tmp_path):
    result = tmp_path / "overload.json"
    p = loadtest(
        "--base-url", tiny_server["base"], "--model", "tiny",
        "--num-prompts", "12", "--max-concurrency", "12",
        "--random-input-len", "8", "--random-output-len", "64", "--ignore-eos",
        "--result-file", str(result),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    a = json.loads(result.read_text())["aggregates"]
    assert a["failed"] == 0, a["errors"]
    assert a["rejected"] > 0 and a["completed"] > 0
    assert a["completed"] + a["rejected"] == 12
    assert a["retry_after_s"] is not None and a["retry_after_s"]["mean"] >= 1
    assert "Retry-After" in p.stdout
