#!/usr/bin/env bash
# The other distributions tests/e2e/test_deb.py installs the Debian package into (it must be
# usable on Debian 13 and Ubuntu 22.04 and 24.04; Debian 12 is bare_host.sh's machine): a bare
# tree of each, made as bare_host.sh makes Debian 12's, and beside it a local repository of the
# closure of the package's dependencies on that tree, as that tree's own apt resolves the
# Depends line of packaging/deb/debian/control (`apt-get satisfy`), so the test installs the
# .deb with apt and no network. A no-op for what is cached. Results under $EPYC_TEST_CACHE:
#   rootfs-bare-SUITE   the bare tree (SUITE: trixie, noble, jammy)
#   deb-apt-SUITE       its local repository of the package's dependencies (Packages + .debs)
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/tools/lib/debian_rootfs.sh
source tests/tools/lib/debian_rootfs.sh

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
# the package's own dependencies, without debhelper's substitution variables
DEPENDS=$(sed -n 's/^Depends: //p' packaging/deb/debian/control | sed 's/, *\${[^}]*}//g')
[ -n "$DEPENDS" ] || { echo "deb_hosts: no Depends line in packaging/deb/debian/control" >&2; exit 1; }

need_debootstrap
command -v dpkg-scanpackages >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev
}

# host DISTRIBUTION SUITE
host() {
    local rootfs=$CACHE/rootfs-bare-$2
    bare_rootfs "$rootfs" "$2" "$1"
    closure_repository "$rootfs" "$CACHE/deb-apt-$2" "$2 $BARE_PACKAGES + $DEPENDS v1" \
        satisfy "$DEPENDS"
}

host debian trixie
host ubuntu noble
host ubuntu jammy
