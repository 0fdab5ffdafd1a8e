#!/usr/bin/env bash
# Debootstraps the Debian rootfs the end-to-end test boots with systemd-nspawn (real systemd
# as PID 1; recipe: shared/reference/real-tools.md, "Real systemd as PID 1"). The test boots
# a fresh copy of it each run, so this cached tree stays pristine. A no-op when it is cached.
# Result: $EPYC_TEST_CACHE/rootfs
set -euo pipefail

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
ROOTFS=$CACHE/rootfs
STAMP=$ROOTFS/.epyc-stamp
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-venv,numactl,util-linux,procps,ca-certificates,libstdc++6,libgomp1
WANT="$SUITE $PACKAGES v1"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    echo "rootfs: cached in $ROOTFS"
    exit 0
fi

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# the machine's own Debian mirror (the first URIs of its sources), else deb.debian.org
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

rm -rf "$ROOTFS.new"
mkdir -p "$CACHE"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS.new" "$mirror"
# an empty machine-id: systemd makes one at each boot of a copy; no login prompt on the console
: > "$ROOTFS.new/etc/machine-id"
rm -f "$ROOTFS.new/etc/systemd/system/getty.target.wants/"* 2>/dev/null || true
chroot "$ROOTFS.new" apt-get clean
echo "$WANT" > "$ROOTFS.new/.epyc-stamp"
rm -rf "$ROOTFS"
mv "$ROOTFS.new" "$ROOTFS"
echo "rootfs: debootstrapped $SUITE into $ROOTFS"
