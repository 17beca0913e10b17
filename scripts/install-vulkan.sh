#!/usr/bin/env bash
# Installs Mesa's software Vulkan driver (lavapipe) so the wgpu backend's
# tests have an adapter on a machine with no GPU. Idempotent; needs root or
# sudo the first time. A machine with a GPU driver still gets lavapipe
# (wgpu prefers the GPU).
set -euo pipefail
if ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then
  exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq mesa-vulkan-drivers
