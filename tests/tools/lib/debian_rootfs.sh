# Sourced by the tools of tests/tools that build machines (not run by itself: it is outside
# the tests/tools/*.sh that tests/bootstrap.sh runs). The steps of a cached Debian or Ubuntu
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

# debootstrap_new DIR SUITE PACKAGES: a fresh minbase Debian SUITE with PACKAGES in DIR.new
debootstrap_new() {
    debootstrap_into "$1" "$2" "$3" "$(debian_mirror)" ""
}

UBUNTU_MIRROR=http://archive.ubuntu.com/ubuntu
# Ubuntu's archive keys, from its own ubuntu-keyring package (Debian 12 has none), pinned by
# the package's hash: the 2018 archive key signs jammy and noble
UBUNTU_KEYRING_DEB=pool/main/u/ubuntu-keyring/ubuntu-keyring_2021.03.26_all.deb
UBUNTU_KEYRING_SHA256=0d0e7ed6b112f5d03eabf3c7eb01ebdacf9c57714b279e90495cfc58c8c4520f

# ubuntu_keyring: the path of Ubuntu's archive keyring, fetched once into the cache
ubuntu_keyring() {
    local dir=$CACHE/ubuntu-keyring
    local keyring=$dir/usr/share/keyrings/ubuntu-archive-keyring.gpg
    if [ ! -f "$keyring" ]; then
        rm -rf "$dir.new" && mkdir -p "$dir.new"
        curl -fsS --retry 3 -o "$dir.new/keyring.deb" "$UBUNTU_MIRROR/$UBUNTU_KEYRING_DEB" >&2
        echo "$UBUNTU_KEYRING_SHA256  $dir.new/keyring.deb" | sha256sum --check --quiet >&2
        dpkg-deb -x "$dir.new/keyring.deb" "$dir.new"
        rm -rf "$dir" && mv "$dir.new" "$dir"
    fi
    echo "$keyring"
}

# ubuntu_debootstrap_new DIR SUITE PACKAGES: a fresh minbase Ubuntu SUITE (main and
# universe, its -updates pocket in its sources) with PACKAGES in DIR.new. Debian 12's
# debootstrap knows jammy but not noble: every Ubuntu release since gutsy uses gutsy's script.
ubuntu_debootstrap_new() {
    debootstrap_into "$1" "$2" "$3" "$UBUNTU_MIRROR" /usr/share/debootstrap/scripts/gutsy \
        --components=main,universe --keyring="$(ubuntu_keyring)"
    printf 'deb %s %s main universe\ndeb %s %s-updates main universe\n' \
        "$UBUNTU_MIRROR" "$2" "$UBUNTU_MIRROR" "$2" > "$1.new/etc/apt/sources.list"
}

# debootstrap_into DIR SUITE PACKAGES MIRROR SCRIPT [DEBOOTSTRAP_OPTIONS...] (SCRIPT "": the
# suite's own)
debootstrap_into() {
    local new=$1.new suite=$2 packages=$3 mirror=$4 script=$5
    shift 5
    rm -rf "$new"
    mkdir -p "$(dirname "$new")"
    nice -n 19 debootstrap --variant=minbase --include="$packages" "$@" \
        "$suite" "$new" "$mirror" ${script:+"$script"}
    # an empty machine-id: systemd makes one at each boot of a copy; no login prompt on the console
    : > "$new/etc/machine-id"
    rm -f "$new/etc/systemd/system/getty.target.wants/"* 2>/dev/null || true
    chroot "$new" apt-get clean
}

# closure_repository ROOTFS REPO WANT APT_GET_ARGS...: REPO, a local apt repository (.debs and
# Packages) of what `apt-get --download-only APT_GET_ARGS` fetches on ROOTFS, resolved by the
# tree's own apt in a throwaway copy of it (its whole closure, nothing the tree already has)
closure_repository() {
    local rootfs=$1 repo=$2 want=$3
    shift 3
    if rootfs_cached "$repo" "$want"; then
        echo "$(basename "$repo"): cached in $repo"
        return
    fi
    local scratch=$repo.scratch
    rm -rf "$scratch" "$repo.new"
    cp -a "$rootfs" "$scratch"
    cp /etc/resolv.conf "$scratch/etc/resolv.conf"
    chroot "$scratch" env DEBIAN_FRONTEND=noninteractive sh -c \
        'apt-get update -qq && apt-get -y -qq --download-only "$@"' apt "$@"
    mkdir -p "$repo.new"
    cp "$scratch"/var/cache/apt/archives/*.deb "$repo.new/"
    rm -rf "$scratch"
    (cd "$repo.new" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null > Packages)
    rootfs_finish "$repo" "$want"
    echo "$(basename "$repo"): $(ls "$repo"/*.deb | wc -l) packages in $repo"
}

# What a new admin's server has (README command 1's bare host): minbase with only these (no
# venv module, no compiler, no Python headers, no numactl)
BARE_PACKAGES=systemd,systemd-sysv,dbus,python3,ca-certificates,iproute2,procps

# bare_rootfs DIR SUITE [debian|ubuntu]: the bare tree of SUITE in DIR (a no-op when cached)
bare_rootfs() {
    local dir=$1 suite=$2 distribution=${3:-debian}
    local want="$suite $BARE_PACKAGES v1"
    if rootfs_cached "$dir" "$want"; then
        echo "$(basename "$dir"): cached in $dir"
        return
    fi
    case "$distribution" in
        debian) debootstrap_new "$dir" "$suite" "$BARE_PACKAGES" ;;
        ubuntu) ubuntu_debootstrap_new "$dir" "$suite" "$BARE_PACKAGES" ;;
        *) echo "bare_rootfs: no distribution $distribution" >&2; return 1 ;;
    esac
    rootfs_finish "$dir" "$want"
    echo "$(basename "$dir"): debootstrapped $distribution $suite into $dir"
}

# rootfs_finish DIR WANT: stamp DIR.new as built from WANT and put it in DIR's place
rootfs_finish() {
    echo "$2" > "$1.new/.epyc-stamp"
    rm -rf "$1"
    mv "$1.new" "$1"
}
