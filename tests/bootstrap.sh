#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian/Ubuntu machine (as root):
# the Debian tools the real-tool tests drive, a .venv with the project and its test extras,
# and the cached real parts under $EPYC_TEST_CACHE (outside the clone, reused between runs).
# Each cached part is a tool in tests/tools/, run in the order TOOLS gives (a tool comes
# after every tool it reads from); a tool that fails is named with its failing step.
set -euo pipefail
cd "$(dirname "$0")/.."

export EPYC_TEST_CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
mkdir -p "$EPYC_TEST_CACHE"

# tool                needs (the tools whose results it reads)
TOOLS=(
    quadlet.sh          # -
    haproxy.sh          # -
    prometheus.sh       # -
    rootfs.sh           # -
    engine_rootfs.sh    # -
    vllm_venv.sh        # - (packaging/vllm-runtime.sh)
    runtime_wheels.sh   # - (packaging/vllm-runtime.sh --download)
    vllm_image.sh       # rootfs.sh, vllm_venv.sh
    bare_host.sh        # runtime_wheels.sh (the bare-host e2e's apt repository and wheels)
    llama_server.sh     # vllm_venv.sh (torch and the tiny model, converted to GGUF)
    deb_hosts.sh        # - (the Debian package's other distributions)
)

say() { echo "bootstrap: $*"; }

# debhelper: packaging/deb/build.sh builds the Debian package tests/e2e/test_deb.py installs;
# lintian checks it there
debian_tools=(systemd podman numactl debhelper lintian)
missing=()
for pkg in "${debian_tools[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} from apt"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'

# every tool reports the command and line where it fails (tests/tools/lib/on_error.sh)
export BASH_ENV=$PWD/tests/tools/lib/on_error.sh
for tool in "${TOOLS[@]}"; do
    start=$SECONDS
    if ! bash "tests/tools/$tool"; then
        say "tests/tools/$tool failed (its last lines above name the step); nothing after it ran" >&2
        exit 1
    fi
    say "tests/tools/$tool done in $((SECONDS - start)) s"
done
