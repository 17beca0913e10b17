#!/usr/bin/env bash
# Runs the kernels' tests compiled to WebAssembly with SIMD128 (part of
# `make tab`, so of `make test`): the browser worker's CPU path
# (`kernels::cpu::wasm`) against the plain-Rust reference, bit for bit,
# and the quantized matmuls against the float reference. Built for
# wasm32-wasip1 (installed through rustup) and run by Node's WASI
# (scripts/wasi-run.mjs). Extra arguments go to libtest.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
export CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $PWD/scripts/wasi-run.mjs"
cargo test -p kernels --target wasm32-wasip1 --lib --test matmul --test kquant -- "$@"
