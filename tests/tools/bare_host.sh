#!/usr/bin/env bash
# The bare host of README command 1's end-to-end test (tests/e2e/test_runtime.py), as a new
# admin's server has it: Debian minbase with only BARE_PACKAGES (tests/tools/lib/
# debian_rootfs.sh: no venv module, no compiler, no Python headers, no numactl), and beside
# it a local Debian repository of the exact packages install.sh --runtime installs there from
# apt (their whole closure on that tree, resolved by apt itself in a throwaway copy), so the
# e2e runs the apt path offline (its pip indexes are tests/tools/bare_indexes.sh's).
# A no-op for what is cached. Results under $EPYC_TEST_CACHE:
#   rootfs-bare-bookworm     the bare tree
#   bare-apt-bookworm        its local repository (Packages + .debs)
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/tools/lib/debian_rootfs.sh
source tests/tools/lib/debian_rootfs.sh

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
# what install.sh --runtime installs from apt on a bare Debian (packaging/install.sh)
RUNTIME_APT="python3-venv python3-dev g++ numactl"

need_debootstrap
command -v dpkg-scanpackages >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev
}

bare_rootfs "$CACHE/rootfs-bare-bookworm" bookworm
# shellcheck disable=SC2086  # one package per word
closure_repository "$CACHE/rootfs-bare-bookworm" "$CACHE/bare-apt-bookworm" \
    "bookworm $BARE_PACKAGES + $RUNTIME_APT v1" install $RUNTIME_APT
