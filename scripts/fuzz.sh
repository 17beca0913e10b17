#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo fuzz, libFuzzer) of the decoders that read
# the fleet's bytes from the network (fuzz/fuzz_targets), each for
# FUZZ_SECONDS (default 10): `make fuzz`, part of `make test`. A crash fails
# the run and leaves its input under fuzz/artifacts/<target>/; the corpus
# grows under fuzz/corpus/ from run to run. Installs what it needs: the
# nightly toolchain through rustup (minimal profile) and cargo-fuzz
# through cargo.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${FUZZ_SECONDS:-10}
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# Apart from the project's own build: another toolchain, other flags.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target}/fuzz"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$target"
  if cargo +nightly fuzz run --sanitizer none "$target" -- \
      -max_total_time="$secs" >"$log" 2>&1; then
    echo "fuzz $target: $(grep -o 'Done [0-9]* runs' "$log" | tail -1) in ${secs} s, no crash"
  else
    tail -40 "$log"
    echo "fuzz $target: FAILED (input under fuzz/artifacts/$target)" >&2
    exit 1
  fi
done
