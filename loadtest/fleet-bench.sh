#!/usr/bin/env bash
# The fleet's serving benchmarks (issue 14), each with the same client
# (synor-loadtest, random 128-word prompts, 128 output tokens, EOS ignored,
# the response cache bypassed), one after the other on this machine:
#
#   house    the server's own engine (all cores), no workers
#   gw1      one worker through the gateway (all cores), the house engine
#            kept as fallback only (--placement-house-factor 1000)
#   pin1     one worker pinned to core 0, one thread
#   pin2     two workers pinned to cores 0 and 1, one thread each
#
# house vs gw1 is the gateway's overhead; pin1 vs pin2 is scale-out.
# Also measured: failover, the longest stall of a stream whose worker is
# killed (kill -9) mid-generation.
#
# `placement` instead compares placement by measure against round-robin
# on a fleet of unequal speed: two one-thread workers, one of them made
# slower (--debug-token-delay-ms 40, which calibration must see), under
# Poisson load at the given rates, by goodput (TTFT <= 2 s, TPOT <= 35 ms),
# with a decode step target of 30 ms for the batch caps.
#
# `split` compares prefill/decode disaggregation (issue 15) on two
# one-thread workers pinned to cores 0 and 1: --fleet-split never,
# always and auto, at each concurrency, with 512-word prompts and 64
# output tokens; then the cost model's estimated against measured TTFT
# and TPOT per plan, and the transfers, from /metrics.
#
# Usage: loadtest/fleet-bench.sh [serving] [CONCURRENCY...]   (default: 1 16)
#        loadtest/fleet-bench.sh placement [RATE...]          (default: 2 4 8)
#        loadtest/fleet-bench.sh split [CONCURRENCY...]       (default: 1 4)
#        loadtest/fleet-bench.sh pipeline [CONCURRENCY]       (default: 16)
#        loadtest/fleet-bench.sh stages [CONCURRENCY...]      (default: 1 8)
#        loadtest/fleet-bench.sh unequal [CONCURRENCY...]     (default: 16)
#        loadtest/fleet-bench.sh chains [CONCURRENCY...]      (default: 16)
#
# `stages` (issue 46) serves the default model whole (the house engine,
# every core) and as a pipeline of workers (--pipeline-model; each worker
# --threads 2, every core) of 1, 2, 3 and 4 stages on loopback, their
# --max-memory set so the planner needs that many (SmolLM2 Q4_1: 30 MB of
# ends, 8.5 MB a layer with its KV), at each concurrency, 64 output
# tokens, the same prompts for each.
#
# `unequal` (issue 46) serves the default model as a pipeline of three
# workers, one fast and two slow: each step holds 1 ms per layer on the
# fast one and 3 ms on the slow ones (--debug-layer-delay-us: a sleep,
# so the three do not fight over the shared cores as a real fleet of
# machines would not). Memory (170 and 124 MiB) makes three stages
# necessary and lets the fast one hold 16 layers. It runs the same load
# with the layers split evenly and by measured speed (after a warm-up that
# measures the stages and lets the planner move layers), each without and
# with micro-batching (as many micro-batches as stages), and prints each
# chain.
#
# `chains` (issue 46) serves the default model as a pipeline over six
# workers of 124 MiB (three stages a chain), each step holding 0.25 ms per
# layer for each token of the step (--debug-token-layer-delay-us: devices
# slower than these cores whose time grows with the batch, the sleep
# leaving the shared cores free), with `--pipeline-chains 1` (one chain,
# three workers idle) and then 2 (two chains, requests to the one
# expected to serve them soonest).
#
# `pipeline` saturates two one-thread workers (cores 0 and 1) with a
# mixed load (prompts of 32 to 992 words, 16 to 240 output tokens) at
# the default spot-check rates, then reports each worker's busy and
# transferring shares of the last minute, and what the spot checks cost
# the house engine against the work the workers did.
# Needs release binaries: cargo build --release -p synor --features synor/faults -p loadtest
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}/${PROFILE:-release}"
SYNOR="$TARGET/synor"
LOADTEST="$TARGET/synor-loadtest"
export SYNOR_MODELS_DIR="${SYNOR_MODELS_DIR:-models}"
MODE=serving
case "${1:-}" in serving | placement | split | pipeline | stages | unequal | chains) MODE=$1; shift ;; esac
case "$MODE" in
    placement) ARGS=("${@:-2 4 8}") ;;
    split) ARGS=("${@:-1 4}") ;;
    pipeline) ARGS=("${@:-16}") ;;
    stages) ARGS=("${@:-1 8}") ;;
    unequal | chains) ARGS=("${@:-16}") ;;
    *) ARGS=("${@:-1 16}") ;;
esac
read -r -a CONCURRENCY <<<"${ARGS[*]}"
ADMIN=bench-admin
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$port"

start_server() {
    RUST_LOG=warn "$SYNOR" serve --open --bind "127.0.0.1:$port" --admin-token "$ADMIN" \
        --embedding-model none --database-url "sqlite://$WORK/synor.db" \
        --placement-house-factor "$1" --placement "${2:-measured}" "${@:3}" >"$WORK/server.log" 2>&1 &
    SERVER=$!
    PIDS+=("$SERVER")
    for _ in $(seq 1 600); do
        curl -sf "$BASE/health" >/dev/null && return
        sleep 0.1
    done
    echo "the server did not start"; cat "$WORK/server.log"; exit 1
}

stop_server() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; }

# next_config: the workers and the server stopped, the ledger gone (the next
# configuration starts afresh).
next_config() {
    stop_workers
    stop_server
    rm -f "$WORK/synor.db"*
}

admin() { curl -sf -H "authorization: Bearer $ADMIN" -H 'content-type: application/json' "$@"; }

workers_up() {
    for _ in $(seq 1 600); do
        n=$(admin "$BASE/admin/fleet" | python3 -c 'import json,sys; print(sum(w["state"] == "active" for w in json.load(sys.stdin)["data"]))')
        [ "$n" = "$1" ] && return
        sleep 0.1
    done
    echo "workers did not register"; exit 1
}

# start_worker NAME THREADS [CPU] [EXTRA...]
start_worker() {
    local pin=()
    [ -n "${3:-}" ] && pin=(taskset -c "$3")
    RUST_LOG=warn "${pin[@]}" "$SYNOR" worker --server "ws://127.0.0.1:$port" --token "$TOKEN" \
        --name "$1" --threads "$2" --embedding-model none "${@:4}" >"$WORK/$1.log" 2>&1 &
    WORKERS+=($!)
    PIDS+=($!)
}

stop_workers() {
    for w in "${WORKERS[@]}"; do kill "$w" 2>/dev/null || true; wait "$w" 2>/dev/null || true; done
    WORKERS=()
    workers_up 0
}

run() {
    local name=$1 c=$2
    "$LOADTEST" --base-url "$BASE" --seed "$c" --num-prompts $((4 * c)) --max-concurrency "$c" \
        --random-input-len 128 --random-output-len 128 --ignore-eos --no-progress \
        --result-file "$WORK/$name-$c.json" >"$WORK/$name-$c.txt" 2>&1 || { cat "$WORK/$name-$c.txt"; exit 1; }
    printf '%-6s c=%-3s %s\n' "$name" "$c" \
        "$(grep -E 'Output token throughput|Median TTFT|Median ITL|P99 ITL' "$WORK/$name-$c.txt" | tr -s ' ' | paste -sd ';')"
}

# run_model NAME MODEL CONCURRENCY: like `run`, for one served model.
run_model() {
    local name=$1 model=$2 c=$3
    "$LOADTEST" --base-url "$BASE" --model "$model" --seed "$c" --num-prompts $((4 * c)) \
        --max-concurrency "$c" --random-input-len 128 --random-output-len 64 --ignore-eos \
        --no-progress --result-file "$WORK/$name-$c.json" >"$WORK/$name-$c.txt" 2>&1 \
        || { cat "$WORK/$name-$c.txt"; exit 1; }
    printf '%-6s c=%-3s %s\n' "$name" "$c" \
        "$(grep -E 'Output token throughput|Median TTFT|Median ITL' "$WORK/$name-$c.txt" | tr -s ' ' | paste -sd ';')"
}

# stages_up K: waits for K workers holding parts of `pipe`.
stages_up() {
    for _ in $(seq 1 600); do
        n=$(admin "$BASE/admin/fleet" | python3 -c 'import json,sys; print(sum(any(h["model"] == "pipe" for h in w["holds"]) for w in json.load(sys.stdin)["data"]))')
        [ "$n" = "$1" ] && sleep 1 && return
        sleep 0.1
    done
    echo "the stages did not load"; cat "$WORK"/*.log; exit 1
}

WORKERS=()
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%F)"

if [ "$MODE" = placement ]; then
    for placement in measured round-robin; do
        start_server 1000 "$placement" --fleet-step-target-ms 30
        TOKEN=$(admin -X POST "$BASE/admin/providers" -d '{"name":"bench"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
        start_worker fast 1 0
        start_worker slow 1 1 --debug-token-delay-ms 40
        workers_up 2
        for rate in "${CONCURRENCY[@]}"; do
            out="$WORK/$placement-$rate.txt"
            "$LOADTEST" --base-url "$BASE" --seed 7 --num-prompts $((12 * rate)) --request-rate "$rate" \
                --random-input-len 64 --random-output-len 64 --ignore-eos --no-progress \
                --goodput ttft:2000 tpot:35 >"$out" 2>&1 || { cat "$out"; exit 1; }
            printf '%-11s rate=%-3s %s\n' "$placement" "$rate" \
                "$(grep -E 'Request goodput|Output token throughput|Median TPOT|Median TTFT' "$out" | tr -s ' ' | paste -sd ';')"
        done
        admin "$BASE/admin/fleet" | python3 -c 'import json,sys; print("   tokens per worker:", {w["name"]: w["tokens_delivered"] for w in json.load(sys.stdin)["data"]})'
        next_config
    done
    exit 0
fi

if [ "$MODE" = stages ]; then
    SMOL=smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
    # SERVER_ARGS: more server flags (e.g. the spot-check rates at 0).
    read -r -a more <<<"${SERVER_ARGS:-}"
    start_server 1 measured --model "$SMOL" --pipeline-model "pipe=$SMOL" "${more[@]}"
    TOKEN=$(admin -X POST "$BASE/admin/providers" -d '{"name":"bench"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
    for c in "${CONCURRENCY[@]}"; do run_model whole smollm2-135m-instruct "$c"; done
    for k in 1 2 3 4; do
        case $k in 1) mem=512MiB ;; 2) mem=166MiB ;; 3) mem=124MiB ;; *) mem=100MiB ;; esac
        for i in $(seq 1 "$k"); do
            start_worker "s$k-$i" 2 "" --model none --part-model "pipe=$SMOL" --max-memory "$mem"
        done
        stages_up "$k"
        for c in "${CONCURRENCY[@]}"; do run_model "k=$k" pipe "$c"; done
        for w in "${WORKERS[@]}"; do kill "$w" 2>/dev/null || true; wait "$w" 2>/dev/null || true; done
        WORKERS=()
        stages_up 0
    done
    exit 0
fi

if [ "$MODE" = unequal ]; then
    SMOL=smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
    for config in "even 1" "measured 1" "even 0" "measured 0"; do
        read -r placement micro <<<"$config"
        start_server 1 measured --model none --pipeline-model "pipe=$SMOL" \
            --pipeline-placement "$placement" --pipeline-micro-batches "$micro"
        TOKEN=$(admin -X POST "$BASE/admin/providers" -d '{"name":"bench"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
        part=(--model none --part-model "pipe=$SMOL")
        start_worker fast 1 "" "${part[@]}" --max-memory 170MiB --debug-layer-delay-us 1000
        start_worker slow1 1 "" "${part[@]}" --max-memory 124MiB --debug-layer-delay-us 3000
        start_worker slow2 1 "" "${part[@]}" --max-memory 124MiB --debug-layer-delay-us 3000
        stages_up 3
        name="$placement-mb$micro"
        [ "$micro" = 0 ] && name="$placement-mbauto"
        if [ "$placement" = measured ]; then
            run_model warmup pipe 16 >/dev/null
            sleep 3
            stages_up 3
        fi
        admin "$BASE/admin/fleet" >"$WORK/fleet.json"
        admin "$BASE/admin/pipelines" | python3 -c '
import json, sys
names = {w["id"]: w["name"] for w in json.load(open(sys.argv[1]))["data"]}
for p in json.load(sys.stdin)["data"]:
    print("   chain:", [(names.get(s["worker"]), s["first"], s["end"]) for s in p["stages"]])' "$WORK/fleet.json"
        for c in "${CONCURRENCY[@]}"; do run_model "$name" pipe "$c"; done
        next_config
    done
    exit 0
fi

if [ "$MODE" = chains ]; then
    SMOL=smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
    for chains in 1 2; do
        start_server 1 measured --model none --pipeline-model "pipe=$SMOL" --pipeline-chains "$chains"
        TOKEN=$(admin -X POST "$BASE/admin/providers" -d '{"name":"bench"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
        for i in 1 2 3 4 5 6; do
            start_worker "w$i" 1 "" --model none --part-model "pipe=$SMOL" --max-memory 124MiB \
                --debug-token-layer-delay-us 250
        done
        stages_up $((3 * chains))
        for c in "${CONCURRENCY[@]}"; do run_model "chains=$chains" pipe "$c"; done
        admin "$BASE/admin/pipelines" | python3 -c 'import json,sys; print("   chains:", [(c["lane"], [(s["first"], s["end"], s["measured"]["steps"]) for s in c["stages"]]) for c in json.load(sys.stdin)["data"][0]["chains"]])'
        next_config
    done
    exit 0
fi

if [ "$MODE" = pipeline ]; then
    start_server 1000 measured
    TOKEN=$(admin -X POST "$BASE/admin/providers" -d '{"name":"bench"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
    start_worker a 1 0
    start_worker b 1 1
    workers_up 2
    c="${CONCURRENCY[0]}"
    out="$WORK/pipeline.txt"
    start=$(date +%s)
    "$LOADTEST" --base-url "$BASE" --seed 5 --num-prompts $((8 * c)) --max-concurrency "$c" \
        --random-input-len 512 --random-output-len 128 --random-range-ratio 0.9 --ignore-eos \
        --no-progress >"$out" 2>&1 || { cat "$out"; exit 1; }
    echo "pipeline c=$c, $(( $(date +%s) - start )) s: $(grep -E 'Output token throughput|Median TTFT|Median TPOT' "$out" | tr -s ' ' | paste -sd ';')"
    admin "$BASE/admin/fleet/utilization" >"$WORK/utilization.json"
    python3 - "$WORK/utilization.json" <<'EOF'
import json, sys
for u in json.load(open(sys.argv[1]))["data"]:
    print(f"   {u['executor']}: busy {u['busy_1m']:.3f} of the last minute, "
          f"{u['busy_5m']:.3f} of five; transferring {u['transferring']:.3f}")
EOF
    curl -sf "$BASE/metrics" | grep -E '^synor:(spot_check|stage_(prefill|decode)_seconds_total|fleet_plans_total|engine_(busy|score)_seconds_total)' | sed 's/^/   /'
    stop_workers
    stop_server
    exit 0
fi

if [ "$MODE" = split ]; then
    for split in never always auto; do
        start_server 1000 measured --fleet-split "$split"
        TOKEN=$(admin -X POST "$BASE/admin/providers" -d '{"name":"bench"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
        start_worker a 1 0
        start_worker b 1 1
        workers_up 2
        for c in "${CONCURRENCY[@]}"; do
            out="$WORK/split-$split-$c.txt"
            "$LOADTEST" --base-url "$BASE" --seed "$c" --num-prompts $((6 * c)) --max-concurrency "$c" \
                --random-input-len 512 --random-output-len 64 --ignore-eos --no-progress >"$out" 2>&1 \
                || { cat "$out"; exit 1; }
            printf '%-7s c=%-3s %s\n' "$split" "$c" \
                "$(grep -E 'Output token throughput|Median TTFT|Median TPOT|P99 ITL' "$out" | tr -s ' ' | paste -sd ';')"
        done
        curl -sf "$BASE/metrics" | grep -E '^synor:(fleet_plans_total|kv_transfers_total|kv_transfer_bytes_total|plan_latency_ms)' \
            | grep -v ' 0$' | grep -v ' 0.000$' | sed 's/^/   /'
        next_config
    done
    exit 0
fi

start_server 1000
TOKEN=$(admin -X POST "$BASE/admin/providers" -d '{"name":"bench"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
for c in "${CONCURRENCY[@]}"; do run house "$c"; done

start_worker gw1 "$(nproc)"
workers_up 1
for c in "${CONCURRENCY[@]}"; do run gw1 "$c"; done
stop_workers

start_worker pin1 1 0
workers_up 1
for c in "${CONCURRENCY[@]}"; do run pin1 "$c"; done
stop_workers

start_worker pin2a 1 0
start_worker pin2b 1 1
workers_up 2
for c in "${CONCURRENCY[@]}"; do run pin2 "$c"; done

# Failover: one long stream, the worker running it killed after ~1 s; the
# longest gap between two tokens the client saw is the stall.
python3 - "$BASE" "$ADMIN" "$WORK" <<'EOF'
import json, os, signal, subprocess, sys, time, urllib.request
base, admin, work = sys.argv[1:4]
body = {"model": "smollm2-135m-instruct", "prompt": "The river", "max_tokens": 400,
        "temperature": 0, "ignore_eos": True, "stream": True}
req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json", "x-synor-cache": "bypass"})
fleet = lambda: json.load(urllib.request.urlopen(urllib.request.Request(
    base + "/admin/fleet", headers={"authorization": "Bearer " + admin})))["data"]
start = time.monotonic(); last = start; gaps = []; killed = None; n = 0
for line in urllib.request.urlopen(req, timeout=300):
    if not line.startswith(b"data: {"):
        continue
    now = time.monotonic(); gaps.append(now - last); last = now; n += 1
    if killed is None and now - start > 1.0:
        busy = [w for w in fleet() if w["jobs_running"] > 0]
        pid = subprocess.run(["pgrep", "-f", "--", "--name " + busy[0]["name"]], capture_output=True,
                             text=True).stdout.split()
        os.kill(int(pid[0]), signal.SIGKILL); killed = now
print(f"failover: {n} chunks, worker killed at {killed - start:.2f} s; longest stall "
      f"{max(gaps) * 1e3:.0f} ms, median gap {sorted(gaps)[len(gaps) // 2] * 1e3:.1f} ms")
EOF
