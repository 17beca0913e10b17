# Synor Compute: the two commands are `make run` and `make test`.
# Everything they need (models, Python test client) is fetched by the repo's
# own scripts; nothing is installed system-wide except by .ci/run.

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
export SYNOR_MODELS_DIR ?= $(CURDIR)/models
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
VENV := $(CURDIR)/.py/venv

NVRTC := $(SYNOR_MODELS_DIR)/nvrtc/libnvrtc.so.12
# Test builds take the testing flags (`--debug-*`: slow, hung, faulty and
# cheating workers); `make run`'s release build leaves them out.
FEATURES := --features synor/faults
# What `cargo test` runs (benchmarks compile in `lint`'s clippy, not here:
# fifteen bench binaries to link for nothing).
TARGETS := --lib --bins --tests --examples

MODEL_FILES := \
	$(SYNOR_MODELS_DIR)/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
	$(SYNOR_MODELS_DIR)/smollm2-135m-instruct/generation_config.json \
	$(SYNOR_MODELS_DIR)/all-minilm-l6-v2/model.safetensors \
	$(SYNOR_MODELS_DIR)/all-minilm-l6-v2/config.json \
	$(SYNOR_MODELS_DIR)/all-minilm-l6-v2/tokenizer.json \
	$(SYNOR_MODELS_DIR)/all-minilm-l6-v2/1_Pooling/config.json \
	$(SYNOR_MODELS_DIR)/tiny/tiny.gguf

# The parity tests' small models, one per weight type (`synor-genmodel`,
# a fixed seed: the same bytes every time, as the golden files record).
PARITY_TYPES := f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs
# And one small model per architecture and RoPE variant (shape:type).
PARITY_ARCHS := parity-llama3:f32 parity-qwen3:f32 parity-qwen3:q4_k parity-qwen3moe:f32 \
	parity-qwen3moe:q4_k parity-mixtral:q8_0 parity-gemma3:f32 parity-gemma3:q8_0 \
	parity-gemma2:f32 parity-gemma2:q8_0 parity-phi:f32 parity-phi:q4_k

.PHONY: run test models check lint unit e2e fuzz build browser vulkan bench-chat clean-models synthetic tab

## run: fetch the default models if missing, then serve them on 127.0.0.1:8080
## (with /provide's browser worker built for the release)
run: $(MODEL_FILES)
	TAB_PROFILE=release scripts/build-tab.sh || echo "make run: the browser worker (/provide) was not built; the server runs without it"
	$(CARGO) run --release -p synor --bin synor -- serve --open

## test: formatting, lints, every cargo test (the wgpu backend's on lavapipe
## too), the OpenAI-SDK end-to-end tests, the console in headless Chromium,
## and a bounded run of the network decoders' fuzz targets
test: $(MODEL_FILES) lint unit e2e fuzz

## models: fetch and verify the default models (sha256) into $(SYNOR_MODELS_DIR)
models:
	scripts/fetch-models.sh

$(MODEL_FILES) &:
	scripts/fetch-models.sh

lint:
	@echo "== lint $$(date +%T)"
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --all-targets $(FEATURES) -- -D warnings

## unit: every cargo test; the server's default build has the wgpu backend,
## so its shaders' tests and the model's GPU parity test run here too, on
## whatever Vulkan adapter there is (lavapipe: `make vulkan`)
unit: $(MODEL_FILES) $(NVRTC) vulkan synthetic
	@echo "== unit $$(date +%T)"
	XDG_RUNTIME_DIR=$$(mktemp -d) SYNOR_NVRTC=$(NVRTC) $(CARGO) test --workspace $(FEATURES)

## NVRTC, for the test that compiles every CUDA kernel (no toolkit needed)
$(NVRTC):
	scripts/fetch-models.sh nvrtc

## synthetic: the parity tests' models (engine/tests/golden.rs), written
## by synor-genmodel into $(SYNOR_MODELS_DIR)/synthetic (about 15 s; always
## rewritten, so a cached copy can never be stale). It builds what `unit`
## and `e2e` build, with the same features: `cargo build -p loadtest`
## alone would resolve the dependencies' features apart and compile them
## all again.
synthetic: $(MODEL_FILES)
	@echo "== synthetic $$(date +%T)"
	$(CARGO) build --workspace $(TARGETS) $(FEATURES)
	@for q in $(PARITY_TYPES); do \
		$(TARGET_DIR)/debug/synor-genmodel --shape parity-llama --quant $$q \
			--tokenizer $(SYNOR_MODELS_DIR)/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
			--out-dir $(SYNOR_MODELS_DIR)/synthetic >/dev/null || exit 1; \
	done
	@for sq in $(PARITY_ARCHS); do \
		$(TARGET_DIR)/debug/synor-genmodel --shape $${sq%:*} --quant $${sq#*:} \
			--tokenizer $(SYNOR_MODELS_DIR)/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
			--out-dir $(SYNOR_MODELS_DIR)/synthetic >/dev/null || exit 1; \
	done

## fuzz: the fleet's network decoders under cargo fuzz, FUZZ_SECONDS (10)
## each (scripts/fuzz.sh installs nightly and cargo-fuzz where missing)
fuzz:
	@echo "== fuzz $$(date +%T)"
	scripts/fuzz.sh

## vulkan: Mesa's software Vulkan driver (lavapipe), for the wgpu tests
vulkan:
	scripts/install-vulkan.sh

build:
	$(CARGO) build --workspace $(TARGETS) $(FEATURES)

$(VENV)/.installed: tests/e2e/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/e2e/requirements.txt
	touch $@

## tab: the browser worker served at /provide (the `tab` crate in
## WebAssembly with wasm-bindgen's glue) into $(TARGET_DIR)/tab; the script
## installs the wasm32 target and the pinned wasm-bindgen-cli. Then the
## kernels' tests in WebAssembly (SIMD128 against the reference, under Node)
tab:
	@echo "== tab $$(date +%T)"
	scripts/build-tab.sh
	scripts/test-wasm.sh

## browser: Debian's chromium, for the console's tests in headless Chromium
browser:
	scripts/install-browser.sh

e2e: $(MODEL_FILES) $(NVRTC) build tab $(VENV)/.installed browser
	@echo "== e2e $$(date +%T)"
	SYNOR_NVRTC=$(NVRTC) SYNOR_BIN=$(TARGET_DIR)/debug/synor LOADTEST_BIN=$(TARGET_DIR)/debug/synor-loadtest \
		$(VENV)/bin/python -m pytest -q tests/e2e

clean-models:
	rm -rf $(SYNOR_MODELS_DIR)
