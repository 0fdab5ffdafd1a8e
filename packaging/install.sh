#!/usr/bin/env bash
# Installs epyc-llm for an admin: a venv under /opt/epyc-llm with the commands linked into
# /usr/local/bin. Rerunning it upgrades in place.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=${EPYC_LLM_PREFIX:-/opt/epyc-llm}
bindir=${EPYC_LLM_BINDIR:-/usr/local/bin}

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "install.sh: epyc-llm needs Python >= 3.11 (found $(python3 --version 2>&1))" >&2
    exit 2
fi
python3 -m venv --help >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
}
[ -x "$prefix/bin/python" ] || python3 -m venv "$prefix"
"$prefix/bin/pip" install -q --upgrade pip
"$prefix/bin/pip" install -q "$src"
mkdir -p "$bindir"
for cmd in epycctl epycd; do
    ln -sf "$prefix/bin/$cmd" "$bindir/$cmd"
done
echo "installed epyc-llm into $prefix; commands in $bindir"
