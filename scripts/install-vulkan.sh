#!/usr/bin/env bash
# Installs Mesa's software Vulkan driver (lavapipe) so the wgpu backend's
# tests have an adapter on a machine with no GPU (wgpu still prefers a
# GPU where there is one). Idempotent.
set -euo pipefail
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 \
  || "$(dirname "$0")/apt-install.sh" mesa-vulkan-drivers
