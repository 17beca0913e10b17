#!/usr/bin/env bash
# Builds the browser worker (`make tab`, part of `make test` and `make
# run`): the `tab` crate for wasm32-unknown-unknown, then wasm-bindgen's
# glue, into $TARGET/tab/ (tab.js, tab_bg.wasm), where the server serves
# them at /provide. Installs what it needs: the wasm32 target through
# rustup, and wasm-bindgen-cli of the version Cargo.lock pins (the CLI
# must match the crate) through cargo, under $TARGET/tools.
# TAB_PROFILE: the cargo profile (default `tab`: unoptimized, a short
# build for the tests; `release` for `make run`).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
profile="${TAB_PROFILE:-tab}"
rustup target list --installed | grep -qx wasm32-unknown-unknown \
  || rustup target add wasm32-unknown-unknown
version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
bindgen="$target/tools/bin/wasm-bindgen"
if ! [[ -x "$bindgen" && "$("$bindgen" --version)" == "wasm-bindgen $version" ]]; then
  # No default features: the CLI's downloader (TLS) is not needed here.
  cargo install wasm-bindgen-cli --version "$version" --root "$target/tools" --bin wasm-bindgen \
    --no-default-features --force
fi
cargo build -p tab --target wasm32-unknown-unknown --profile "$profile"
dir=$([[ "$profile" == dev ]] && echo debug || echo "$profile")
"$bindgen" --target web --no-typescript --out-dir "$target/tab" \
  "$target/wasm32-unknown-unknown/$dir/tab.wasm"
# tab.js imports the GPU's waits from beside itself (the server serves its
# own copy at /provide/; this one is for loading the build directly, as
# loadtest/tab_engine_bench.mjs does under Node).
cp web/provide-jspi.js "$target/tab/"
echo "tab: $(du -h "$target/tab/tab_bg.wasm" | cut -f1) of WebAssembly in $target/tab ($profile)"
