#!/usr/bin/env bash
# Debootstraps the Debian rootfs trees the container end-to-end tests boot with
# systemd-nspawn (tests/e2e/test_containers.py), each with a container engine from Debian's
# own packages (recipe: shared/reference/real-tools.md, "A real container engine inside
# nspawn"):
#   rootfs-trixie-podman   trixie: systemd 257, podman 5.4 with its Quadlet generator
#   rootfs-bookworm-docker bookworm: systemd 252, docker.io 20.10
# The tests boot a fresh copy of each, so these cached trees stay pristine. A no-op for a
# tree that is cached. Results: $EPYC_TEST_CACHE/rootfs-trixie-podman, .../rootfs-bookworm-docker
set -euo pipefail

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
BASE=systemd,systemd-sysv,dbus,ca-certificates,python3,python3-venv,numactl,util-linux,procps

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

# build NAME SUITE EXTRA_PACKAGES ENGINE_PACKAGE VERSION_PATTERN
build() {
    local rootfs=$CACHE/$1 suite=$2 packages=$BASE,$3 engine=$4 pattern=$5
    local want="$suite $packages v1" version
    if [ -f "$rootfs/.epyc-stamp" ] && [ "$(cat "$rootfs/.epyc-stamp")" = "$want" ]; then
        echo "$1: cached in $rootfs"
        return
    fi
    rm -rf "$rootfs.new"
    mkdir -p "$CACHE"
    nice -n 19 debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs.new" "$mirror"
    : > "$rootfs.new/etc/machine-id"
    rm -f "$rootfs.new/etc/systemd/system/getty.target.wants/"* 2>/dev/null || true
    chroot "$rootfs.new" apt-get clean
    version=$(chroot "$rootfs.new" dpkg-query -W -f='${Version}' "$engine")
    # shellcheck disable=SC2254
    case "$version" in
        $pattern) ;;
        *) echo "$1: $suite has $engine '$version', the test needs $pattern" >&2; exit 1 ;;
    esac
    echo "$want" > "$rootfs.new/.epyc-stamp"
    rm -rf "$rootfs"
    mv "$rootfs.new" "$rootfs"
    echo "$1: debootstrapped $suite into $rootfs ($engine $version)"
}

build rootfs-trixie-podman trixie podman,crun,conmon,netavark podman '5.*'
build rootfs-bookworm-docker bookworm docker.io,containerd,runc docker.io '20.10.*'
