#!/usr/bin/env bash
# Debootstraps the Debian rootfs trees the container end-to-end tests boot with
# systemd-nspawn (tests/e2e/test_containers.py), each with a container engine from Debian's
# own packages (docs/sources.md, "Tools the tests run for real", "A container engine inside
# nspawn"):
#   rootfs-trixie-podman   trixie: systemd 257, podman 5.4 with its Quadlet generator and
#                          catatonit (the pause process of the infra container `podman kube play`
#                          makes for a pod)
#   rootfs-bookworm-docker bookworm: systemd 252, docker.io 20.10
# The tests boot a fresh copy of each, so these cached trees stay pristine. A no-op for a
# tree that is cached. Results: $EPYC_TEST_CACHE/rootfs-trixie-podman, .../rootfs-bookworm-docker
set -euo pipefail
# shellcheck source=tests/tools/lib/debian_rootfs.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian_rootfs.sh"

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
BASE=systemd,systemd-sysv,dbus,ca-certificates,python3,python3-venv,numactl,util-linux,procps

need_debootstrap

# build NAME SUITE EXTRA_PACKAGES ENGINE_PACKAGE VERSION_PATTERN
build() {
    local rootfs=$CACHE/$1 suite=$2 packages=$BASE,$3 engine=$4 pattern=$5
    local want="$suite $packages v1" version
    if rootfs_cached "$rootfs" "$want"; then
        echo "$1: cached in $rootfs"
        return
    fi
    debootstrap_new "$rootfs" "$suite" "$packages"
    version=$(chroot "$rootfs.new" dpkg-query -W -f='${Version}' "$engine")
    # shellcheck disable=SC2254
    case "$version" in
        $pattern) ;;
        *) echo "$1: $suite has $engine '$version', the test needs $pattern" >&2; exit 1 ;;
    esac
    rootfs_finish "$rootfs" "$want"
    echo "$1: debootstrapped $suite into $rootfs ($engine $version)"
}

build rootfs-trixie-podman trixie podman,crun,conmon,netavark,catatonit podman '5.*'
build rootfs-bookworm-docker bookworm docker.io,containerd,runc docker.io '20.10.*'
