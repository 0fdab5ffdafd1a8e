#!/usr/bin/env bash
# Builds the Debian package: dist/epyc-llm_VERSION-REVISION_amd64.deb (on Debian 12, as any
# user: apt-get install debhelper python3-venv; lintian to check it).
#
#   packaging/deb/build.sh [--out DIR] [--revision N] [--also-revision N]
#
# --revision N rebuilds the same version as VERSION-N: an entry on top of the staged copy of
# the changelog only (never the source's), to try an upgrade. --also-revision N builds the
# changelog's own version and then VERSION-N too, from the same staged tree and wheels (one
# download for both: tests/e2e/test_deb.py tries the upgrade with them).
#
# VERSION is the project's own (pyproject.toml's version, which epycd.__version__ must equal)
# and REVISION the top entry of packaging/deb/debian/changelog, whose version must be
# VERSION-REVISION: a release adds its changelog entry (tests/packaging/test_deb.py holds
# them together).
#
# Why a private venv and not Debian's python3-* packages: the product needs pydantic >= 2.7,
# pydantic-settings, cysystemd and a recent huggingface_hub; Debian 12 has pydantic 1.10
# and no pydantic-settings or cysystemd. So the package carries the product's wheel and
# an offline wheelhouse of its runtime dependencies, binary wheels only, for each CPython
# it may meet (3.11: Debian 12, python3.11 on Ubuntu 22.04; 3.12: Ubuntu 24.04; 3.13: Debian
# 13; 3.14 next), for manylinux_2_34 x86_64 (glibc >= 2.34; Debian 12 has 2.36, Ubuntu 22.04
# 2.35), and the postinst makes the
# venv /opt/epyc-llm from them with pip --no-index: installing needs no network and gets
# exactly the wheels this build took. The package is amd64, not all, since those wheels are.
#
# The network is used here, never in debian/rules: this script stages the tree
# (build/deb/epyc-llm-VERSION: debian/, wheels/, the unit, the config and examples, the
# README and docs/admin.md) with pip (the project's wheel, and `pip download` of its
# dependencies), then runs dpkg-buildpackage in it. PIP_INDEX_URL and the other PIP_*
# variables reach pip.
# The wheel is built from the working tree as it is (uncommitted changes included): build
# a release from a clean checkout. About a minute on 2 cores; the .deb is about 25 MB.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$src/dist
revision=
also=
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --revision) revision=$2; shift 2 ;;
        --also-revision) also=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
PYTHONS=(3.11 3.12 3.13 3.14)
SDIST_ONLY=(sdnotify)
PLATFORM=manylinux_2_34_x86_64
# pip takes a --platform literally: every manylinux tag glibc 2.34 runs, each named
platforms=()
for minor in $(seq 34 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)

say() { echo "build.sh: $*"; }
die() { echo "build.sh: $1" >&2; exit "${2:-1}"; }

for tool in dpkg-buildpackage dh python3; do
    command -v "$tool" >/dev/null || die "$tool is missing: apt-get install debhelper python3-venv" 2
done
version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$src/pyproject.toml")
module_version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$src/epycd/__init__.py")
[ "$version" = "$module_version" ] ||
    die "pyproject.toml says $version, epycd/__init__.py says $module_version: make them one"
deb_version=$(cd "$src/packaging/deb" && dpkg-parsechangelog -S Version)
case "$deb_version" in
    "$version"-*) ;;
    *) die "debian/changelog's top entry is $deb_version, not $version-N: add an entry (dch -v $version-1)" ;;
esac

stage=$src/build/deb/epyc-llm-$version
rm -rf "$src/build/deb"
mkdir -p "$stage/wheels" "$stage/examples" "$stage/docs"
cp -a "$src/packaging/deb/debian" "$stage/debian"
changelog_revision=${deb_version#"$version"-}
[ -z "$revision" ] || [ -z "$also" ] || die "--revision and --also-revision: give one of them" 2

# Checks N (a number above the changelog's revision) before anything is downloaded.
check_revision() {
    case "$2" in
        *[!0-9]* | 0*) die "$1 takes a number above the changelog's ($changelog_revision), not $2" 2 ;;
    esac
    dpkg --compare-versions "$version-$2" gt "$deb_version" ||
        die "$1 $2: $version-$2 is not above the changelog's $deb_version" 2
}

# The staged changelog with an entry for VERSION-N on top of the source's.
stage_changelog() {
    { printf 'epyc-llm (%s) stable; urgency=medium\n\n  * Rebuilt as %s (build.sh --revision %s).\n\n' \
        "$version-$1" "$version-$1" "$1"
      printf ' -- %s  %s\n\n' "$(cd "$src/packaging/deb" && dpkg-parsechangelog -S Maintainer)" "$(date -R)"
      cat "$src/packaging/deb/debian/changelog"; } > "$stage/debian/changelog"
}

if [ -n "$revision" ]; then
    check_revision --revision "$revision"
    stage_changelog "$revision"
    deb_version=$version-$revision
fi
[ -z "$also" ] || check_revision --also-revision "$also"
cp "$src/packaging/epyc-llm.sysusers.conf" "$stage/debian/epyc-llm.sysusers"
cp "$src/packaging/epyc-llm.tmpfiles.conf" "$stage/debian/epyc-llm.tmpfiles"
# the package's README is /usr/share/doc/epyc-llm/README.md, not install.sh's copy
sed 's#^Documentation=file:///opt/epyc-llm/README.md$#Documentation=file:///usr/share/doc/epyc-llm/README.md#' \
    "$src/units/epycd.service" > "$stage/debian/epyc-llm.epycd.service"
grep -q '^Documentation=file:///usr/share/doc/epyc-llm/README.md$' "$stage/debian/epyc-llm.epycd.service" ||
    die "units/epycd.service's Documentation= line changed: update build.sh"
cp "$src/packaging/deb/epycd.conf" "$src/packaging/vllm-runtime.sh" "$src/packaging/llama-runtime.sh" \
    "$src/README.md" "$stage/"
# the README links the admin's guide as docs/admin.md: /usr/share/doc/epyc-llm/docs/admin.md
cp "$src/docs/admin.md" "$stage/docs/"
cp "$src"/etc/*.toml "$stage/examples/"

say "the project's wheel, and its dependencies' wheels for CPython ${PYTHONS[*]} ($PLATFORM)"
tools=$src/build/deb/tools
python3 -m venv "$tools"
pip=("$tools/bin/python" -m pip --disable-pip-version-check --quiet)
# the project, and the dependencies PyPI has only a source archive of (pure Python: built
# here into py3-none-any wheels, which every CPython below takes)
"${pip[@]}" wheel --no-deps --wheel-dir "$stage/wheels" "$src" "${SDIST_ONLY[@]}"
for wheel in "$stage"/wheels/*.whl; do
    case "$wheel" in
        *-none-any.whl) ;;
        *) die "$(basename "$wheel") is not pure Python: download it per CPython instead" ;;
    esac
done
mapfile -t requirements < <(python3 -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$src/pyproject.toml")
for python in "${PYTHONS[@]}"; do
    "${pip[@]}" download --only-binary=:all: --implementation cp --python-version "$python" \
        "${platforms[@]}" --find-links "$stage/wheels" --dest "$stage/wheels" "${requirements[@]}"
done
say "$(find "$stage/wheels" -name '*.whl' | wc -l) wheels, $(du -sh "$stage/wheels" | cut -f1)"

# Builds the staged tree as $1 (the staged changelog's top version) into $out.
build_deb() {
    (cd "$stage" && nice -n 10 dpkg-buildpackage -b -us -uc --no-sign >../dpkg-buildpackage.log 2>&1) ||
        die "dpkg-buildpackage failed: $(tail -n 20 "$src/build/deb/dpkg-buildpackage.log")"
    mkdir -p "$out"
    deb=$(find "$src/build/deb" -maxdepth 1 -name "epyc-llm_${1}_*.deb")
    [ -n "$deb" ] || die "no epyc-llm_${1}_*.deb from dpkg-buildpackage"
    cp "$deb" "$out/"
    say "$out/$(basename "$deb")"
}

build_deb "$deb_version"
if [ -n "$also" ]; then
    stage_changelog "$also"
    build_deb "$version-$also"
fi
