#!/usr/bin/env bash
# Installs Debian packages quietly, as root or through sudo: the one place
# the repo's scripts call apt-get from (`.ci/run` has its own list).
set -euo pipefail
sudo=()
if [ "$(id -u)" != 0 ]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq "$@"
