#!/usr/bin/env bash
# Installs epyc-llm for an admin: a venv under /opt/epyc-llm with the commands linked into
# /usr/local/bin, epycd.service in /etc/systemd/system, the tmpfiles.d entry for the state and
# run folders, the sysusers.d entry for the user and group epyc-llm that the host endpoints
# run as (made at once), and example endpoint files in /etc/epyc-llm/examples. Where systemd
# is PID 1 it also creates those folders and enables and starts epycd. Rerunning it upgrades in place
# (and restarts a running epycd onto the new code); the endpoints keep running.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=${EPYC_LLM_PREFIX:-/opt/epyc-llm}
bindir=${EPYC_LLM_BINDIR:-/usr/local/bin}
unitdir=${EPYC_LLM_UNIT_DIR:-/etc/systemd/system}
tmpfilesdir=${EPYC_LLM_TMPFILES_DIR:-/usr/lib/tmpfiles.d}
sysusersdir=${EPYC_LLM_SYSUSERS_DIR:-/usr/lib/sysusers.d}
confdir=${EPYC_LLM_CONFIG_DIR:-/etc/epyc-llm}
service=epycd.service

say() { echo "install.sh: $*"; }

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "install.sh: epyc-llm needs Python >= 3.11 (found $(python3 --version 2>&1))" >&2
    exit 2
fi
python3 -m venv --help >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
}
[ -x "$prefix/bin/python" ] || python3 -m venv "$prefix"
"$prefix/bin/pip" install -q --upgrade pip
"$prefix/bin/pip" install -q --upgrade "$src"
install -m 0644 "$src/README.md" "$prefix/README.md"
mkdir -p "$bindir"
for cmd in epycctl epycd; do
    ln -sf "$prefix/bin/$cmd" "$bindir/$cmd"
done
say "epyc-llm in $prefix; epycctl and epycd in $bindir"

# the unit names the default prefix; another prefix is written into it
mkdir -p "$unitdir"
sed "s#/opt/epyc-llm/#$prefix/#g" "$src/units/$service" > "$unitdir/.$service.new"
chmod 0644 "$unitdir/.$service.new"
mv -f "$unitdir/.$service.new" "$unitdir/$service"
install -D -m 0644 "$src/packaging/epyc-llm.tmpfiles.conf" "$tmpfilesdir/epyc-llm.conf"
install -D -m 0644 "$src/packaging/epyc-llm.sysusers.conf" "$sysusersdir/epyc-llm.conf"
install -d -m 0755 "$confdir/examples"
install -m 0644 "$src"/etc/*.toml "$confdir/examples/"
say "$unitdir/$service, $tmpfilesdir/epyc-llm.conf, $sysusersdir/epyc-llm.conf, examples in $confdir/examples"

if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$sysusersdir/epyc-llm.conf"
elif ! getent passwd epyc-llm >/dev/null; then
    getent group epyc-llm >/dev/null || groupadd --system epyc-llm
    useradd --system --gid epyc-llm --home-dir / --no-create-home \
        --shell /usr/sbin/nologin --comment "epyc-llm endpoints (vLLM)" epyc-llm
fi
say "user and group epyc-llm (the host endpoints run as it): $(id epyc-llm)"

if command -v systemd-tmpfiles >/dev/null; then
    systemd-tmpfiles --create "$tmpfilesdir/epyc-llm.conf"
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable -q "$service"
    if systemctl -q is-active "$service"; then
        systemctl restart "$service"
        say "$service restarted on the new code"
    else
        systemctl start "$service"
        say "$service enabled and started"
    fi
else
    say "systemd is not running here: once it is, run \`systemctl enable --now $service\`"
fi
say "next: cp $confdir/examples/qwen3.toml $confdir/ && epycctl plan qwen3"
