#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian/Ubuntu machine (as root):
# the Debian tools the real-tool tests drive, a .venv with the project and its test extras,
# and the cached real parts under $EPYC_TEST_CACHE (outside the clone, reused between runs).
set -euo pipefail
cd "$(dirname "$0")/.."

export EPYC_TEST_CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
mkdir -p "$EPYC_TEST_CACHE"

debian_tools=(systemd podman numactl)
missing=()
for pkg in "${debian_tools[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'

for tool in tests/tools/*.sh; do
    [ -e "$tool" ] || continue
    bash "$tool"
done
