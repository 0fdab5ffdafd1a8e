#!/usr/bin/env bash
# The bare hosts of README command 1's end-to-end test (tests/e2e/test_runtime.py), as a new
# admin's server has them: Debian minbase with only systemd, systemd-sysv, dbus, python3,
# ca-certificates, iproute2 and procps (no venv module, no compiler, no Python headers, no
# numactl), and, beside each, a local Debian repository of the exact packages install.sh
# --runtime installs there from apt (their whole closure on that tree, resolved by apt itself
# in a throwaway copy), so the e2e runs the apt path offline. Also a local PyPI mirror and a
# local PyTorch CPU wheel index, as simple indexes made from the runtime wheelhouse
# (tests/tools/runtime_wheels.sh): torch's +cpu build only in the second, as on the real hosts.
# A no-op for what is cached. Results under $EPYC_TEST_CACHE:
#   rootfs-bare-bookworm     the bare tree (bare SUITE builds another Debian the same way)
#   bare-apt-bookworm        its local repository (Packages + .debs)
#   bare-pypi, bare-torch-index  the simple indexes
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/tools/lib/debian_rootfs.sh
source tests/tools/lib/debian_rootfs.sh

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
BARE=systemd,systemd-sysv,dbus,python3,ca-certificates,iproute2,procps
# what install.sh --runtime installs from apt on a bare Debian (packaging/install.sh)
RUNTIME_APT="python3-venv python3-dev g++ numactl"

need_debootstrap
command -v dpkg-scanpackages >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev
}

# bare SUITE: the bare tree and its local repository of RUNTIME_APT's closure
bare() {
    local suite=$1 rootfs=$CACHE/rootfs-bare-$1 repo=$CACHE/bare-apt-$1
    local want="$suite $BARE v1" repo_want="$suite $BARE + $RUNTIME_APT v1"
    if rootfs_cached "$rootfs" "$want"; then
        echo "rootfs-bare-$suite: cached in $rootfs"
    else
        debootstrap_new "$rootfs" "$suite" "$BARE"
        rootfs_finish "$rootfs" "$want"
        echo "rootfs-bare-$suite: debootstrapped $suite into $rootfs"
    fi
    if rootfs_cached "$repo" "$repo_want"; then
        echo "bare-apt-$suite: cached in $repo"
        return
    fi
    local scratch=$CACHE/.bare-scratch-$suite
    rm -rf "$scratch" "$repo.new"
    cp -a "$rootfs" "$scratch"
    cp /etc/resolv.conf "$scratch/etc/resolv.conf"
    # shellcheck disable=SC2086  # one package per word
    chroot "$scratch" sh -c "apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --download-only $RUNTIME_APT"
    mkdir -p "$repo.new"
    cp "$scratch"/var/cache/apt/archives/*.deb "$repo.new/"
    rm -rf "$scratch"
    (cd "$repo.new" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null > Packages)
    rootfs_finish "$repo" "$repo_want"
    echo "bare-apt-$suite: $(ls "$repo"/*.deb | wc -l) packages in $repo"
}

bare bookworm

# simple_index WHEELHOUSE DEST FILTER: a PEP 503 index of the wheelhouse's files whose
# project FILTER keeps (torch: only torch; pypi: all but torch)
wheels=$CACHE/runtime-wheels
want="$(cat "$wheels/.epyc-stamp") v1"
if rootfs_cached "$CACHE/bare-pypi" "$want" && rootfs_cached "$CACHE/bare-torch-index" "$want"; then
    echo "bare-pypi, bare-torch-index: cached"
    exit 0
fi
python3 - "$wheels" "$CACHE" <<'PY'
"""Two simple indexes from one wheelhouse: PyPI's part, and PyTorch's CPU index's part."""
import html, os, re, shutil, sys
from pathlib import Path

wheels, cache = Path(sys.argv[1]), Path(sys.argv[2])
indexes = {"bare-pypi": cache / "bare-pypi.new", "bare-torch-index": cache / "bare-torch-index.new"}
for folder in indexes.values():
    shutil.rmtree(folder, ignore_errors=True)
projects: dict[tuple[str, str], list[Path]] = {}
for file in sorted(wheels.iterdir()):
    if file.name.startswith(".") or not file.is_file():
        continue
    stem = re.split(r"-\d", file.name, maxsplit=1)[0]
    name = re.sub(r"[-_.]+", "-", stem).lower()
    index = "bare-torch-index" if name == "torch" else "bare-pypi"
    projects.setdefault((index, name), []).append(file)
for (index, name), files in projects.items():
    folder = indexes[index] / name
    folder.mkdir(parents=True)
    links = []
    for file in files:
        os.link(file, folder / file.name)  # a hard link: the index is bound elsewhere
        links.append(f'<a href="{html.escape(file.name)}">{html.escape(file.name)}</a><br>')
    (folder / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
for index, folder in indexes.items():
    names = sorted(p.name for p in folder.iterdir())
    (folder / "index.html").write_text(
        "<html><body>\n" + "\n".join(f'<a href="{n}/">{n}</a><br>' for n in names) + "\n</body></html>\n"
    )
PY
for index in bare-pypi bare-torch-index; do
    rootfs_finish "$CACHE/$index" "$want"
done
echo "bare-pypi: $(ls "$CACHE/bare-pypi" | wc -l) projects; bare-torch-index: torch"
