#!/usr/bin/env bash
# Debootstraps the Debian rootfs the end-to-end test boots with systemd-nspawn (real systemd
# as PID 1; docs/sources.md, "Tools the tests run for real", "Real systemd as PID 1"). It boots
# a fresh copy of it each run, so this cached tree stays pristine. A no-op when it is cached.
# Result: $EPYC_TEST_CACHE/rootfs
set -euo pipefail
# shellcheck source=tests/tools/lib/debian_rootfs.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian_rootfs.sh"

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
ROOTFS=$CACHE/rootfs
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-venv,numactl,util-linux,procps,ca-certificates,libstdc++6,libgomp1
WANT="$SUITE $PACKAGES v1"

if rootfs_cached "$ROOTFS" "$WANT"; then
    echo "rootfs: cached in $ROOTFS"
    exit 0
fi

need_debootstrap
debootstrap_new "$ROOTFS" "$SUITE" "$PACKAGES"
rootfs_finish "$ROOTFS" "$WANT"
echo "rootfs: debootstrapped $SUITE into $ROOTFS"
