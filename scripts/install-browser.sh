#!/usr/bin/env bash
# Installs what the console's browser tests drive: Debian's `chromium`
# (Playwright's own browser download cannot reach the network; the Python
# driver comes with tests/e2e/requirements.txt). Idempotent.
set -euo pipefail
command -v chromium >/dev/null || "$(dirname "$0")/apt-install.sh" chromium
