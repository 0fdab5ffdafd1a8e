#!/usr/bin/env bash
# Fetches the Quadlet generator of podman 5.4 (Debian trixie) for the render tests, without
# changing the system: a private apt state, `apt-get download`, `dpkg -x` into the cache
# (docs/sources.md, "Tools the tests run for real"). A no-op when it is cached.
# Result: $EPYC_TEST_CACHE/quadlet/root/usr/libexec/podman/quadlet
set -euo pipefail

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
DIR=$CACHE/quadlet
QUADLET=$DIR/root/usr/libexec/podman/quadlet
STAMP=$DIR/.epyc-stamp
WANT_SERIES=5.4

if [ -x "$QUADLET" ] && [ -f "$STAMP" ] && grep -q "^podman $WANT_SERIES" "$STAMP"; then
    echo "quadlet: cached in $DIR ($(cat "$STAMP"))"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/etc"
# the machine's own bookworm stanza, with the suite changed to trixie
awk 'BEGIN{RS="";ORS="\n\n"} /Suites: bookworm( |$)/' /etc/apt/sources.list.d/debian.sources \
    | sed 's/^Suites:.*/Suites: trixie/' > "$work/etc/trixie.sources"
if [ ! -s "$work/etc/trixie.sources" ]; then
    echo "quadlet: no bookworm stanza in /etc/apt/sources.list.d/debian.sources" >&2
    exit 1
fi
apt_private=(-o APT::Sandbox::User=root -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/etc"
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
apt-get "${apt_private[@]}" update -qq
version=$(apt-cache "${apt_private[@]}" policy podman | awk '/Candidate:/ {print $2}')
case "$version" in
    "$WANT_SERIES".*) ;;
    *) echo "quadlet: trixie offers podman '$version', the tests expect $WANT_SERIES.x" >&2; exit 1 ;;
esac
(cd "$work" && apt-get "${apt_private[@]}" download -qq "podman=$version")

rm -rf "$DIR.new"
mkdir -p "$DIR.new"
dpkg -x "$work"/podman_*.deb "$DIR.new/root"
"$DIR.new/root/usr/libexec/podman/quadlet" -version >/dev/null
echo "podman $version" > "$DIR.new/.epyc-stamp"
rm -rf "$DIR"
mv "$DIR.new" "$DIR"
echo "quadlet: podman $version unpacked in $DIR"
