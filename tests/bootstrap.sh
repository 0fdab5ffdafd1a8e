#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian/Ubuntu machine (as root):
# the Debian tools the real-tool tests drive and the builders use, a .venv with the project
# and its test extras, and the cached real parts under $EPYC_TEST_CACHE (outside the clone,
# reused between runs). Each cached part is a builder in tests/tools/, listed with what it
# reads in tests/tools/builders.py: a builder is rebuilt, from empty, only when what it reads
# changed (or a builder whose results it reads was rebuilt); independent builders run side by
# side. `python3 tests/tools/builders.py stale` says what a bootstrap would build, and why.
set -euo pipefail
cd "$(dirname "$0")/.."

export EPYC_TEST_CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
mkdir -p "$EPYC_TEST_CACHE"
# the endpoints under test run as the user epyc-llm and read the venv and models in here: a
# folder from `mktemp -d` (0700) would hide them
chmod 0755 "$EPYC_TEST_CACHE"

say() { echo "bootstrap: $*"; }

# the tests drive systemd, podman and numactl; debhelper builds the Debian package
# tests/e2e/test_deb.py installs, and lintian checks it there; the builders debootstrap trees
# (debootstrap, systemd-nspawn), index .debs (dpkg-dev) and fetch Ubuntu's keyring (curl):
# installed here, once, so that builders running side by side never take apt's lock
debian_tools=(systemd podman numactl debhelper lintian debootstrap systemd-container dpkg-dev curl)
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

python3 tests/tools/builders.py run
