#!/usr/bin/env bash
# Fetches Debian bookworm's Prometheus (the server and promtool; docs/metrics.md) without changing
# the system: `apt-get download` of the .deb into the cache, `dpkg -x` beside it. Both are
# Go programs linking only libc, so they run from there, on this machine (the metrics tests
# run `promtool check metrics` on epycd's /metrics) and bound into the e2e machine, which
# runs the real server on loopback against epycd. Its web console's JavaScript packages are
# not needed: the tests use the HTTP API. A no-op when it is cached.
# Result: $EPYC_TEST_CACHE/prometheus/root/usr/bin/{prometheus,promtool}
set -euo pipefail

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
DIR=$CACHE/prometheus
STAMP=$DIR/.epyc-stamp
WANT_SERIES=2.42

if [ -x "$DIR/root/usr/bin/promtool" ] && [ -f "$STAMP" ] && grep -q "^prometheus $WANT_SERIES" "$STAMP"; then
    echo "prometheus: cached in $DIR ($(cat "$STAMP"))"
    exit 0
fi

version=$(apt-cache policy prometheus | awk '/Candidate:/ {print $2}')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    apt-get update -qq
    version=$(apt-cache policy prometheus | awk '/Candidate:/ {print $2}')
fi
case "$version" in
    "$WANT_SERIES".*) ;;
    *) echo "prometheus: apt offers prometheus '$version', the tests expect $WANT_SERIES.x" >&2; exit 1 ;;
esac
rm -rf "$DIR.new"
mkdir -p "$DIR.new/debs"
(cd "$DIR.new/debs" && apt-get -o APT::Sandbox::User=root download -qq prometheus)
dpkg -x "$DIR.new"/debs/prometheus_*.deb "$DIR.new/root"
"$DIR.new/root/usr/bin/promtool" --version >/dev/null
"$DIR.new/root/usr/bin/prometheus" --version >/dev/null
echo "prometheus $version" > "$DIR.new/.epyc-stamp"
rm -rf "$DIR"
mv "$DIR.new" "$DIR"
echo "prometheus: $version unpacked in $DIR"
