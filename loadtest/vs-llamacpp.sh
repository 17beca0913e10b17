#!/usr/bin/env bash
# Synor against llama.cpp's llama-server on the same GGUF files, with the
# same client (synor-loadtest), one server after the other (issue 19).
# A benchmark, not a test: never run in CI.
#
#   loadtest/vs-llamacpp.sh [SHAPE:QUANT | FILE.gguf ...]   (default: llama-1b:q4_0)
#
# - SHAPE:QUANT models are made by synor-genmodel (random weights in
#   llama.cpp's GGUF layout) under $SYNOR_MODELS_DIR/bench, once; a path
#   to a .gguf file (a real model: `scripts/fetch-models.sh
#   qwen2.5-coder-1.5b`) is served as it is.
# - llama.cpp is built once under $LLAMA_DIR (default /tmp/synor-llamacpp)
#   from the source distribution of llama-cpp-python on PyPI; it is never
#   committed and never built in CI.
# - Each server runs alone on 127.0.0.1 with two threads; the client sends
#   random 128-word prompts for 128 tokens (--ignore-eos), past the response
#   cache (`x-synor-cache: bypass`), at each concurrency in $CONCURRENCY.
# - The machine's read bandwidth is measured just before and after each
#   run; a single stream's time per output token is put against the limit
#   it gives (the model file read once per token).
# - Results (JSON) go to $OUT (default /tmp/synor-vs-llamacpp-$ISA); the summary
#   table prints at the end, with a second one for Synor's engine over each
#   run (from /health before and after: the share of the run it spent in
#   steps, and the tokens and time of an average step). For a trace of every
#   step, run with RUST_LOG=info,engine::scheduler=debug ($OUT/server.log).
# - SYNOR_BIN=path serves with another synor binary (an older commit's,
#   for old and new side by side; the client is always this checkout's).
# - ISA=avx2 holds both servers to AVX2 (+FMA, F16C) on an AVX-512 host:
#   Synor through SYNOR_KERNELS=avx2, llama.cpp built without GGML_NATIVE
#   and with AVX-512 off (in its own build folder). It stands in for an
#   AVX2-only host when none is at hand; a real one is still the measure.
# - ISA=vnni holds Synor to AVX-512 VNNI on an AMX host (SYNOR_KERNELS=
#   vnni); llama.cpp is always built without AMX (see build_llama).
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS_DIR="${SYNOR_MODELS_DIR:-$PWD/models}"
LLAMA_DIR="${LLAMA_DIR:-/tmp/synor-llamacpp}"
LLAMA_VERSION="${LLAMA_VERSION:-0.3.36}"
CONCURRENCY="${CONCURRENCY:-1 8 16}"
INPUT_LEN="${INPUT_LEN:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
THREADS="${THREADS:-2}"
PORT="${PORT:-18080}"
SYNOR_ARGS="${SYNOR_ARGS:-}"
ONLY="${ONLY:-synor llama}"
ISA="${ISA:-native}"
OUT="${OUT:-/tmp/synor-vs-llamacpp-${ISA}}"
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
SHAPES=("$@")
((${#SHAPES[@]})) || SHAPES=(llama-1b:q4_0)

die() { echo "vs-llamacpp: $*" >&2; exit 1; }
log() { echo "vs-llamacpp: $*" >&2; }
[[ $ISA == native || $ISA == avx2 || $ISA == vnni ]] ||
  die "ISA is native, avx2 or vnni, not $ISA"

build_synor() {
  cargo build --release -q -p synor --bin synor -p loadtest --bin synor-loadtest --bin synor-genmodel
  SYNOR="${SYNOR_BIN:-$TARGET_DIR/release/synor}"
  LOADTEST="$TARGET_DIR/release/synor-loadtest"
  GENMODEL="$TARGET_DIR/release/synor-genmodel"
  cargo bench -q -p kernels --bench matmul --no-run 2>/dev/null
}

# The machine's read bandwidth now, in GB/s (all threads; it moves from
# minute to minute on a shared host, so it is taken beside every run).
bandwidth() {
  cargo bench -q -p kernels --bench matmul -- bandwidth 2>/dev/null |
    awk '/thread/ { v = $(NF - 1) } END { print v }'
}

build_llama() {
  local build="$LLAMA_DIR/build" isa_flags=(-DGGML_NATIVE=ON)
  if [[ $ISA == avx2 ]]; then
    build="$LLAMA_DIR/build-avx2"
    isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
      -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_BMI2=ON)
  fi
  LLAMA_SERVER="$build/bin/llama-server"
  [[ -x "$LLAMA_SERVER" ]] && return
  command -v cmake >/dev/null || scripts/apt-install.sh cmake
  command -v cmake >/dev/null || die "cmake is missing and could not be installed"
  mkdir -p "$LLAMA_DIR"
  if [[ ! -d "$LLAMA_DIR/src" ]]; then
    log "fetching llama-cpp-python==$LLAMA_VERSION's source distribution"
    python3 -m venv "$LLAMA_DIR/venv"
    "$LLAMA_DIR/venv/bin/pip" install -q scikit-build-core
    "$LLAMA_DIR/venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation \
      "llama-cpp-python==$LLAMA_VERSION" -d "$LLAMA_DIR/dl"
    mkdir -p "$LLAMA_DIR/sdist"
    tar -xzf "$LLAMA_DIR"/dl/llama_cpp_python-*.tar.gz -C "$LLAMA_DIR/sdist"
    mv "$LLAMA_DIR"/sdist/*/vendor/llama.cpp "$LLAMA_DIR/src"
  fi
  local flags=()
  # Without AMX: llama.cpp 0.3.36's AMX path dies (SIGILL on its first
  # tile load) on the Xeon VMs we have, where Synor's tiles run.
  grep -q amx_tile /proc/cpuinfo &&
    flags+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
      "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  log "building llama-server (about 5 minutes on two cores)"
  cmake -S "$LLAMA_DIR/src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    "${isa_flags[@]}" -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF "${flags[@]}" >"$LLAMA_DIR/cmake.log"
  cmake --build "$build" -j "$(nproc)" --target llama-server llama-bench \
    >"$LLAMA_DIR/build.log" || die "llama.cpp build failed: $LLAMA_DIR/build.log"
}

model_file() {
  local shape=$1 quant=$2 file
  file="$MODELS_DIR/bench/$shape.$(tr a-z A-Z <<<"$quant").gguf"
  if [[ ! -f "$file" ]]; then
    log "writing $file"
    "$GENMODEL" --shape "$shape" --quant "$quant" --out-dir "$MODELS_DIR/bench" >&2
  fi
  [[ -f "$file" ]] || die "synor-genmodel wrote no $file"
  echo "$file"
}

wait_ready() {
  local pid=$1
  for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || die "the server exited (log: $OUT/server.log)"
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return
    sleep 0.5
  done
  die "the server did not come up in 300 s"
}

SERVER_PID=
stop() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  SERVER_PID=
}
trap '[[ -n "$SERVER_PID" ]] && stop "$SERVER_PID"' EXIT

# health_to SERVER FILE: Synor's /health into FILE (a diagnostic: a failed
# read leaves the table without that run, never stops the benchmark).
health_to() {
  [[ $1 == synor ]] || return 0
  curl -sf "http://127.0.0.1:$PORT/health" >"$2" || rm -f "$2"
}

# run_one SERVER NAME MODELFILE CONCURRENCY
run_one() {
  local server=$1 name=$2 file=$3 c=$4 pid
  local prompts=$((c < 4 ? 8 : 4 * c))
  if [[ $server == synor ]]; then
    # shellcheck disable=SC2086
    SYNOR_NO_CACHE=true SYNOR_KERNELS="${ISA/native/}" "$SYNOR" serve --bind "127.0.0.1:$PORT" --model "$file" \
      --open --served-model-name bench --embedding-model none --max-num-seqs "$((c > 16 ? c : 16))" \
      $SYNOR_ARGS >"$OUT/server.log" 2>&1 &
  else
    "$LLAMA_SERVER" -m "$file" --host 127.0.0.1 --port "$PORT" -t "$THREADS" -np "$c" \
      -c "$((c * (INPUT_LEN * 2 + OUTPUT_LEN + 64)))" -a bench >"$OUT/server.log" 2>&1 &
  fi
  pid=$!
  SERVER_PID=$pid
  wait_ready "$pid"
  local bw_before bw_after
  bw_before=$(bandwidth)
  health_to "$server" "$OUT/$name.$server.c$c.health0"
  "$LOADTEST" --base-url "http://127.0.0.1:$PORT" --model bench --endpoint completions \
    --dataset random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
    --ignore-eos --max-concurrency "$c" --num-prompts "$prompts" --request-rate inf \
    --result-file "$OUT/$name.$server.c$c.json" >"$OUT/$name.$server.c$c.txt" 2>&1 ||
    { stop "$pid"; die "the client failed: $OUT/$name.$server.c$c.txt"; }
  health_to "$server" "$OUT/$name.$server.c$c.health1"
  bw_after=$(bandwidth)
  echo "$bw_before $bw_after $(stat -c %s "$file")" >"$OUT/$name.$server.c$c.bw"
  stop "$pid"
  log "$server $name c=$c: $(grep -E 'Output token throughput' "$OUT/$name.$server.c$c.txt" | tr -s ' ')"
}

summary() {
  python3 - "$OUT" <<'EOF'
import json, sys, glob, os
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    name, server, c, _ = os.path.basename(f).rsplit(".", 3)
    a = json.load(open(f))["aggregates"]
    bw = f[: -len(".json")] + ".bw"
    a["bw"] = [float(x) for x in open(bw).read().split()] if os.path.exists(bw) else None
    rows.setdefault((name, int(c[1:])), {})[server] = a
def g(a, *path):
    for p in path:
        a = a.get(p) if isinstance(a, dict) else None
    return a
# The limit: the model file (every weight, the tied embedding included) read
# once per token at the best bandwidth measured just before and after.
print("| model | streams | server | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms | read GB/s before / after | TPOT vs limit |")
print("|---|---|---|---|---|---|---|---|---|")
for (name, c), by in sorted(rows.items()):
    for server in ("synor", "llama"):
        a = by.get(server)
        if not a:
            continue
        tp = g(a, "output_throughput")
        t50, t99 = g(a, "ttft_ms", "percentiles", "p50"), g(a, "ttft_ms", "percentiles", "p99")
        i50, i99 = g(a, "itl_ms", "percentiles", "p50"), g(a, "itl_ms", "percentiles", "p99")
        f = lambda x: "-" if x is None else f"{x:.0f}"
        tpot = g(a, "tpot_ms", "percentiles", "p50")
        bw, vs = "-", "-"
        if a["bw"] and tpot:
            before, after, size = a["bw"]
            bw = f"{before:.1f} / {after:.1f}"
            limit_ms = size / max(before, after) / 1e6
            vs = f"{100 * limit_ms / tpot:.0f}% ({limit_ms:.1f} ms)" if c == 1 else "-"
        tp50 = "-" if tpot is None else f"{tpot:.1f}"
        print(f"| {name} | {c} | {server} | {tp:.1f} | {f(t50)} / {f(t99)} | {f(i50)} / {f(i99)} | {tp50} | {bw} | {vs} |")
# Synor's engine over each run, from /health before and after: the share of
# the run it spent in steps, and what an average step carried and took.
def engine(path):
    try:
        return next(m for m in json.load(open(path))["models"] if "steps" in m)
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None
print()
print("| model | streams | engine busy | steps | tokens a step | ms a step |")
print("|---|---|---|---|---|---|")
for (name, c), by in sorted(rows.items()):
    a = by.get("synor")
    base = os.path.join(out, f"{name}.synor.c{c}.health")
    e0, e1 = engine(base + "0"), engine(base + "1")
    if not a or not e0 or not e1:
        continue
    steps = e1["steps"] - e0["steps"]
    busy = e1["busy_seconds"] - e0["busy_seconds"]
    tokens = e1["batched_tokens"] - e0["batched_tokens"]
    if steps <= 0 or not a.get("duration_s"):
        continue
    print(f"| {name} | {c} | {100 * busy / a['duration_s']:.0f}% | {steps} | {tokens / steps:.1f} | {1e3 * busy / steps:.1f} |")
EOF
}

mkdir -p "$OUT"
curl -s "http://127.0.0.1:$PORT/" >/dev/null && die "port $PORT is taken (PORT=...)"
build_synor
[[ " $ONLY " == *" llama "* ]] && build_llama
for sq in "${SHAPES[@]}"; do
  if [[ $sq == *.gguf ]]; then
    [[ -f $sq ]] || die "no such model file: $sq"
    file=$sq name=$(basename "$sq" .gguf)
  else
    shape=${sq%%:*} quant=${sq#*:}
    file=$(model_file "$shape" "$quant") name=$shape.$quant
  fi
  for c in $CONCURRENCY; do
    for server in $ONLY; do
      run_one "$server" "$name" "$file" "$c"
    done
  done
done
summary
