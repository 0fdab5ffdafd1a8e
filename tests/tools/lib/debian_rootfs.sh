# Sourced by tests/tools/rootfs.sh and tests/tools/engine_rootfs.sh (not run by itself: it is
# outside the tests/tools/*.sh that tests/bootstrap.sh runs). The steps of a cached Debian
# rootfs the e2e tests boot with systemd-nspawn: a tree is built in DIR.new and becomes DIR
# only once complete, with the stamp DIR/.epyc-stamp naming what it was built from.

# rootfs_cached DIR WANT: DIR is built, from WANT (its stamp says so)
rootfs_cached() {
    [ -f "$1/.epyc-stamp" ] && [ "$(cat "$1/.epyc-stamp")" = "$2" ]
}

# need_debootstrap: debootstrap and systemd-nspawn, from Debian's packages where missing
need_debootstrap() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    fi
}

# debian_mirror: the machine's own Debian mirror (the first URIs of its sources), else
# deb.debian.org
debian_mirror() {
    local mirror
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    echo "${mirror:-http://deb.debian.org/debian}"
}

# debootstrap_new DIR SUITE PACKAGES: a fresh minbase SUITE with PACKAGES in DIR.new
debootstrap_new() {
    local new=$1.new
    rm -rf "$new"
    mkdir -p "$(dirname "$1")"
    nice -n 19 debootstrap --variant=minbase --include="$3" "$2" "$new" "$(debian_mirror)"
    # an empty machine-id: systemd makes one at each boot of a copy; no login prompt on the console
    : > "$new/etc/machine-id"
    rm -f "$new/etc/systemd/system/getty.target.wants/"* 2>/dev/null || true
    chroot "$new" apt-get clean
}

# rootfs_finish DIR WANT: stamp DIR.new as built from WANT and put it in DIR's place
rootfs_finish() {
    echo "$2" > "$1.new/.epyc-stamp"
    rm -rf "$1"
    mv "$1.new" "$1"
}
