#!/usr/bin/env bash
# Installs what the console's browser tests drive: Debian's `chromium`
# (Playwright's own browser download cannot reach the network; the Python
# driver comes with tests/e2e/requirements.txt). Idempotent; needs root or
# sudo the first time.
set -euo pipefail
if command -v chromium >/dev/null; then
  exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq chromium
