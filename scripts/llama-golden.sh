#!/usr/bin/env bash
# Golden logits from llama.cpp, the reference implementation of GGUF, for
# the parity tests (`engine/tests/golden.rs`). Never run in CI: it builds
# llama.cpp from the source distribution of llama-cpp-python on PyPI under
# a temporary directory, runs llama-server on each model file, and writes
# tests/golden/<name>.json (prompt token ids, then for each position of a
# greedy continuation the token and llama.cpp's top-k log-probabilities),
# which are committed.
#
#   scripts/llama-golden.sh [NAME=MODEL_FILE ...]
#
# With no arguments: the default model. MODEL_FILE is relative to
# $SYNOR_MODELS_DIR (default ./models). LLAMA_WORK (default
# /tmp/synor-llama) keeps the build between runs. SERVER_ARGS adds
# llama-server arguments (`--swa-full` for the synthetic Gemma 3 files:
# llama-server's default sliding-window cache, pruned to the window, gives
# another answer than the exact attention for an 8-position window once a
# new prompt replaces the cached one).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${LLAMA_WORK:-/tmp/synor-llama}
VERSION=0.3.36
MODELS=${SYNOR_MODELS_DIR:-$ROOT/models}
SERVER=$WORK/build/bin/llama-server

build() {
    [ -x "$SERVER" ] && return
    command -v cmake >/dev/null || scripts/apt-install.sh cmake
    mkdir -p "$WORK"
    if [ ! -d "$WORK/venv" ]; then
        python3 -m venv "$WORK/venv"
        "$WORK/venv/bin/pip" install --quiet scikit-build-core
    fi
    if [ ! -d "$WORK/src" ]; then
        "$WORK/venv/bin/pip" download --quiet --no-deps --no-binary :all: --no-build-isolation \
            "llama-cpp-python==$VERSION" -d "$WORK/dl"
        mkdir -p "$WORK/src"
        tar -xzf "$WORK"/dl/llama_cpp_python-*.tar.gz -C "$WORK/src" --strip-components=1
    fi
    local flags=()
    # VMs that advertise AMX without letting it run.
    if grep -q amx_tile /proc/cpuinfo; then
        flags+=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    fi
    cmake -S "$WORK/src/vendor/llama.cpp" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF "${flags[@]}" >/dev/null
    cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >/dev/null
}

build
if [ $# -eq 0 ]; then
    set -- "smollm2-135m-q4_1=smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
mkdir -p tests/golden
for pair in "$@"; do
    name=${pair%%=*}
    file=${pair#*=}
    extra=()
    for arg in ${SERVER_ARGS:-}; do
        extra+=("--server-arg=$arg")
    done
    python3 scripts/llama_golden.py --server "$SERVER" --model "$MODELS/$file" \
        --model-name "$file" --out "tests/golden/$name.json" "${extra[@]}"
done
