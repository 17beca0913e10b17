#!/usr/bin/env bash
# Times the first hour of a newcomer on a clean clone, following only the
# README: `make run` (models fetched, a release build, the server up) to
# the first answer of the app developer's quickstart; then the operator's
# quickstart to its first console page, and the provider's to its first
# earning. Prints the seconds of each from the start. Not part of `make
# test` (it builds in release from nothing); its numbers go to
# BENCHMARKS.md.
#
#   scripts/newcomer.sh [REPO]      # REPO: what to clone (default: this checkout)
#
# Needs port 8080 free (the README's address) and the tools make run needs.
set -euo pipefail

repo="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
work="$(mktemp -d /tmp/synor-newcomer.XXXXXX)"
start=$(date +%s.%N)
since() { python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.0f}')" "$1" "$start"; }
# Every synor process started under the work folder (cargo starts the
# server by a relative path, so it is found by its working directory).
cleanup() {
  for p in $(pgrep -f 'synor (serve|worker)' || true); do
    case "$(readlink "/proc/$p/cwd" 2>/dev/null)" in "$work"*) kill "$p" 2>/dev/null || true ;; esac
  done
}
trap cleanup EXIT

git clone -q "$repo" "$work/synor"
cd "$work/synor"
# What the app developer's quickstart asks for: the OpenAI SDK
# (`pip install openai`), here in a virtual environment of its own.
python3 -m venv .newcomer-venv
.newcomer-venv/bin/pip install --quiet --disable-pip-version-check openai
export PATH="$PWD/.newcomer-venv/bin:$PATH"
echo "newcomer: make run in $work/synor"
make run > make-run.log 2>&1 &
until curl -sf http://127.0.0.1:8080/ready > /dev/null; do
  sleep 2
  if ! jobs %1 > /dev/null 2>&1; then tail -20 make-run.log; exit 1; fi
done
up=$(date +%s.%N)
python3 scripts/quickstarts.py README.md "build an app" > app.sh
bash app.sh > app.out 2>&1
first_answer=$(awk '/^@@ block build 1 / {print $5}' app.out)
cleanup
wait %1 2>/dev/null || true
python3 scripts/quickstarts.py README.md "run it for others" "provide compute" > ops.sh
bash ops.sh > ops.out 2>&1
console=$(awk '/^@@ block run 3 / {print $5}' ops.out)
earning=$(awk '/^@@ block provide 2 / {print $5}' ops.out)
echo "newcomer: server up after $(since "$up") s (models, release build, start)"
echo "newcomer: first answer after $(since "$first_answer") s"
echo "newcomer: first console page after $(since "$console") s"
echo "newcomer: first earning after $(since "$earning") s"
echo "newcomer: logs in $work/synor (make-run.log, app.out, ops.out)"
