#!/usr/bin/env bash
# The GPU backends on a real GPU, in two halves:
#
#   scripts/gpu-check.sh build [DIR]   here: the CUDA/wgpu kernel tests, the
#                                      model parity test, the GPU bench,
#                                      synor-genmodel and synor, built,
#                                      stripped and compressed into DIR
#                                      (default .dev), with the small
#                                      tokenizer source they need
#   scripts/gpu-check.sh run [DIR]     on the GPU machine, from the repo
#                                      root: every CUDA and wgpu kernel test,
#                                      the parity of a 1B Llama shape and a
#                                      Qwen2 shape (random weights, made
#                                      there by synor-genmodel) against the
#                                      CPU, and the GPU bench on both, with
#                                      the device's copy bandwidth measured
#                                      beside it, and the real `synor`
#                                      binary serving on CUDA and on wgpu
#                                      with the CPU's greedy text; logs
#                                      under $OUT
#
# GPU_CHECK_PARTS (default "kernels parity serve bench") picks what `run` runs,
# GPU_CHECK_MODELS (default "llama-1b qwen2-0.5b") the shapes, and
# GPU_CHECK_TEST_S (default 60) each kernel test's time limit, so a short
# lease can spend its minutes where they are needed.
#
# The GPU machine has no network and no Rust: everything it runs is built
# here. Its NVRTC is the machine's own (any libnvrtc.so* it has), its
# Vulkan loader the Debian packages in .gl (see the device notes).
set -uo pipefail

mode="${1:-}"
dir="${2:-.dev}"

exe_of() { grep -o '(/[^)]*)' | tr -d '()' | tail -1; }

build() {
  set -e
  mkdir -p "$dir"
  local k p b
  k=$(cargo test --release -p kernels --features cuda,wgpu --no-run 2>&1 |
    tee /dev/stderr | grep 'Executable unittests' | exe_of)
  p=$(cargo test --release -p engine --features cuda,wgpu --test gpu_parity --no-run 2>&1 |
    tee /dev/stderr | grep 'Executable' | exe_of)
  b=$(cargo bench -p engine --features wgpu,cuda --bench gpu --no-run 2>&1 |
    tee /dev/stderr | grep 'Executable' | exe_of)
  cargo build --release -p loadtest --bin synor-genmodel -p synor --bin synor
  local target="${CARGO_TARGET_DIR:-target}/release"
  cp "$target/synor" "$dir/synor"
  cp "$k" "$dir/kernels-tests"
  cp "$p" "$dir/gpu-parity"
  cp "$b" "$dir/gpu-bench"
  cp "$target/synor-genmodel" "$dir/synor-genmodel"
  strip "$dir"/kernels-tests "$dir"/gpu-parity "$dir"/gpu-bench "$dir"/synor-genmodel "$dir"/synor
  cp "${SYNOR_MODELS_DIR:-models}/tiny/tiny.gguf" "$dir/tokenizer.gguf"
  # Compressed, so the whole set (about 26 MB, 70 uncompressed) travels
  # under the device tool's 64 MiB; `run` unpacks it.
  rm -f "$dir"/*.gz
  gzip -9 -f "$dir"/kernels-tests "$dir"/gpu-parity "$dir"/gpu-bench "$dir"/synor-genmodel \
    "$dir"/synor "$dir"/tokenizer.gguf
  du -sh "$dir"/*
}

# NVRTC: the machine's newest libnvrtc.so*, found by the name cudarc asks
# for (libnvrtc.so) through a link, and preloaded by its own path (never
# the toolkit's stubs: its stub libcuda would shadow the driver).
find_nvrtc() {
  local lib
  lib=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null |
    grep -v -e builtins -e stubs | sort -V | tail -1)
  [[ -n "$lib" ]] || { echo "no libnvrtc on this machine"; return 1; }
  mkdir -p /tmp/nvrtc
  ln -sf "$lib" /tmp/nvrtc/libnvrtc.so
  export SYNOR_NVRTC="$lib"
  export LD_LIBRARY_PATH="/tmp/nvrtc:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "NVRTC: $lib"
}

vulkan() {
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [[ -f "$icd" ]] && export VK_DRIVER_FILES="$icd"
}

# The device's read+write copy bandwidth (GB/s), through PyTorch when the
# machine has it.
copy_bandwidth() {
  python3 - <<'EOF' 2>/dev/null || echo 0
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10):
    y.copy_(x)
e.record()
torch.cuda.synchronize()
print(round(2 * 10 * x.numel() / (s.elapsed_time(e) / 1e3) / 1e9))
EOF
}

run() {
  local out="${OUT:-/tmp/gpu-check}" f
  for f in "$dir"/*.gz; do
    [[ -e "$f" ]] && gunzip -f "$f"
  done
  mkdir -p "$out" /tmp/bench
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv | tee "$out/device.txt"
  grep -m1 'model name' /proc/cpuinfo | tee -a "$out/device.txt"
  grep -qw avx512_vnni /proc/cpuinfo && echo "CPU: AVX-512 VNNI" | tee -a "$out/device.txt"
  find_nvrtc | tee -a "$out/device.txt"
  find_nvrtc >/dev/null
  vulkan
  local gbps
  gbps=$(copy_bandwidth)
  echo "copy bandwidth (read + write): $gbps GB/s" | tee -a "$out/device.txt"
  local models="${GPU_CHECK_MODELS:-llama-1b qwen2-0.5b}"
  for shape in $models; do
    "$dir/synor-genmodel" --shape "$shape" --quant q4_0 \
      --tokenizer "$dir/tokenizer.gguf" --out-dir /tmp/bench
  done
  local parts="${GPU_CHECK_PARTS:-kernels parity serve bench}"
  local status=0
  [[ " $parts " == *" kernels "* ]] && { kernel_tests "$out" || status=1; }
  [[ " $parts " == *" parity "* ]] && { parity "$out" || status=1; }
  [[ " $parts " == *" serve "* ]] && { serve_check "$out" || status=1; }
  [[ " $parts " == *" bench "* ]] && { bench "$out" "$gbps" || status=1; }
  return $status
}

kernel_tests() {
  local out="$1" status=0
  # One process per test, each under a time limit, so a test that hangs
  # on a driver (seen: the wgpu tests on NVIDIA's Vulkan) neither stops
  # the rest nor hides its own output.
  local t
  for backend in cuda wgpu; do
    echo "== kernel tests: $backend"
    for t in $("$dir/kernels-tests" "$backend::" --list 2>/dev/null | sed -n 's/: test$//p'); do
      if timeout "${GPU_CHECK_TEST_S:-60}" "$dir/kernels-tests" --exact "$t" --nocapture >"$out/t.log" 2>&1; then
        echo "ok      $t"
      else
        echo "FAILED  $t (exit $?)"
        status=1
      fi
      { echo "== $t"; cat "$out/t.log"; } >>"$out/kernels-$backend.log"
      grep -m3 -A3 'panicked' "$out/t.log" || true
    done
  done
  rm -f "$out/t.log"
  return $status
}

parity() {
  local out="$1" status=0
  for m in ${GPU_CHECK_MODELS:-llama-1b qwen2-0.5b}; do
    echo "== parity: $m"
    SYNOR_PARITY_MODEL="/tmp/bench/$m.Q4_0.gguf" "$dir/gpu-parity" --nocapture --test-threads=1 \
      2>&1 | tee "$out/parity-$m.log" | grep -v '^$' | tail -25 || status=1
  done
  return $status
}

# Waits for the background curls (every job but the server `$1`).
wait_curls() {
  local j
  for j in $(jobs -p); do
    [[ "$j" == "$1" ]] || wait "$j"
  done
}

# One greedy completion from `synor serve` on device $2 (empty: the CPU)
# with model $1, printed as its text.
complete_on() {
  local model=$1 dev=$2 out=$3 pid port=18181
  local args=(serve --bind "127.0.0.1:$port" --model "$model" --open --no-cache
    --served-model-name m --embedding-model none)
  [[ -n "$dev" ]] && args+=(--device "$dev")
  "$dir/synor" "${args[@]}" >>"$out/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  # The prompts in flight together, so the device decodes them as a batch.
  local i=0 prompt
  for prompt in "The capital of France is" "def fibonacci(n):" "Once upon a time"; do
    curl -s "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"m\",\"prompt\":\"$prompt\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}" \
      >"$out/completion.$i" &
    i=$((i + 1))
  done
  wait_curls "$pid"
  for i in 0 1 2; do
    python3 -c '
import json, sys
body = sys.stdin.read()
try:
    print(repr(json.loads(body)["choices"][0]["text"]))
except Exception:
    print("FAILED:", body[:200].replace("\n", " "))' <"$out/completion.$i"
  done
  rm -f "$out"/completion.*
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

# The real binary on each device: the same greedy text as on the CPU.
serve_check() {
  local out="$1" status=0 model want got dev
  for model in "$(realpath "$dir/tokenizer.gguf")" /tmp/bench/llama-1b.Q4_0.gguf; do
    [[ -f "$model" ]] || continue
    echo "== serve: $(basename "$model")"
    want=$(complete_on "$model" "" "$out")
    echo "cpu:    $want"
    for dev in cuda:0 wgpu; do
      got=$(complete_on "$model" "$dev" "$out")
      echo "$dev: $got"
      if [[ "$got" == "$want" && "$got" != *FAILED* ]]; then
        echo "same as the CPU"
      else
        echo "DIFFERS from the CPU"
        status=1
      fi
    done
  done
  return $status
}

bench() {
  local out="$1" gbps="$2" status=0
  for m in ${GPU_CHECK_MODELS:-llama-1b qwen2-0.5b}; do
    for dev in cuda wgpu; do
      echo "== bench: $m on $dev"
      SYNOR_BENCH_MODEL="/tmp/bench/$m.Q4_0.gguf" timeout 90 "$dir/gpu-bench" "$dev" "$gbps" \
        2>&1 | tee "$out/bench-$m-$dev.log" || status=1
    done
  done
  return $status
}

case "$mode" in
  build) build ;;
  run) run ;;
  *)
    echo "usage: scripts/gpu-check.sh build|run [DIR]" >&2
    exit 2
    ;;
esac
