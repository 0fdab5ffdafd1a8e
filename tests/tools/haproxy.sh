#!/usr/bin/env bash
# Fetches Debian bookworm's HAProxy (the balancer of instance sets, docs/instances.md) and
# the libraries it links that a minimal system lacks, without changing the system:
# `apt-get download` of the .debs into the cache, `dpkg -x` beside them. The render tests run
# `haproxy -c` on the rendered configuration; the e2e installs the .debs in its machine.
# A no-op when it is cached.
# Result: $EPYC_TEST_CACHE/haproxy/debs/*.deb and .../root/usr/sbin/haproxy
set -euo pipefail

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
DIR=$CACHE/haproxy
STAMP=$DIR/.epyc-stamp
WANT_SERIES=2.6
PACKAGES=(haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1)

if [ -x "$DIR/root/usr/sbin/haproxy" ] && [ -f "$STAMP" ] && grep -q "^haproxy $WANT_SERIES" "$STAMP"; then
    echo "haproxy: cached in $DIR ($(cat "$STAMP"))"
    exit 0
fi

version=$(apt-cache policy haproxy | awk '/Candidate:/ {print $2}')
case "$version" in
    "$WANT_SERIES".*) ;;
    *) echo "haproxy: apt offers haproxy '$version', the tests expect $WANT_SERIES.x" >&2; exit 1 ;;
esac
rm -rf "$DIR.new"
mkdir -p "$DIR.new/debs"
(cd "$DIR.new/debs" && apt-get -o APT::Sandbox::User=root download -qq "${PACKAGES[@]}")
for deb in "$DIR.new"/debs/*.deb; do
    dpkg -x "$deb" "$DIR.new/root"
done
LD_LIBRARY_PATH="$DIR.new/root/usr/lib/x86_64-linux-gnu" "$DIR.new/root/usr/sbin/haproxy" -v >/dev/null
echo "haproxy $version" > "$DIR.new/.epyc-stamp"
rm -rf "$DIR"
mv "$DIR.new" "$DIR"
echo "haproxy: $version unpacked in $DIR"
