#!/usr/bin/env bash
# The llama.cpp runtime: `llama-server`, and `llama` (the source's one binary of its tools:
# `llama fit-params` estimates a context's memory, `llama quantize` makes Q8_0 or Q4_K_M
# files, `llama bench`), built from the pinned llama.cpp source for this CPU's own
# instruction set (GGML_NATIVE: AVX-512, VNNI and BF16 where the CPU has them, as on Zen 4
# and later). The one recipe for `packaging/install.sh --engine llama.cpp` (the product's
# prefix) and the tests' cached server (tests/tools/llama_server.sh).
#
#   llama-runtime.sh DEST [--jobs N] [--quiet]   provision (or resume) DEST/bin/llama-server, llama
#   llama-runtime.sh --stamp                     the stamp a finished DEST carries on this CPU
#   llama-runtime.sh --download DIR              a wheelhouse for offline hosts
#
# The source is the llama.cpp that llama-cpp-python's sdist vendors (PyPI carries it; the
# package registries carry no llama.cpp release of their own), checked against its sha256.
# cmake and ninja come from PyPI into a build venv, so the host needs only python3 (with
# venv) and g++. Resumable: a rerun keeps the download, the build venv and the objects built
# (ninja goes on where it stopped), and a finished DEST whose stamp matches is left as it is;
# once built, only the binary and the source's sdist (DEST/.build/download) are kept.
# Beside them, DEST/converter: the source's own convert_hf_to_gguf.py with its conversion/ and
# gguf-py/ (`epycctl convert`; stamped .source with the sdist's name), installed from the
# kept sdist on every run, so a DEST built before it had one gets it without a rebuild (the
# sdist downloaded again where it is not kept; without it and without an index, skipped).
# The stamp names the source and this CPU's flags: a DEST built on another CPU is rebuilt.
#
# pip's own variables choose where the source and the build tools come from: PIP_INDEX_URL
# (a PyPI mirror), or PIP_NO_INDEX=1 with PIP_FIND_LINKS=DIR (a wheelhouse made by --download
# on a connected host).
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36
SOURCE_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# the sdist's build backend, which pip runs to read the sdist's metadata while downloading it
BUILD_BACKEND="scikit-build-core[pyproject]>=0.9.2"
BUILD_TOOLS=("cmake>=3.21,<5" "ninja>=1.11")
DOWNLOAD_SIZE="about 110 MB"
BUILD_TIME="about 13 minutes on 2 cores, 2 on 32"
# cmake target -> the binary it installs in DEST/bin
TARGETS=(llama-server llama-app)
BINARIES=(llama-server llama)

say() { echo "llama-runtime: $*"; }
die() { echo "llama-runtime: $1" >&2; exit "${2:-1}"; }

# the CPU flags the native build compiles for: a build is only valid on CPUs that have them
cpu_flags() {
    grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -E '^(avx|avx2|avx512[a-z0-9_]*|avx_vnni|amx[a-z0-9_]*|f16c|fma|sse4_2|bmi2)$' |
        sort | tr '\n' ' ' | sed 's/ $//'
}

# Intel's AMX is left out of the native build: no EPYC has it, and ggml's AMX matrix kernels
# crashed llama-server on an Intel Xeon VM (SIGSEGV in ggml_backend_amx_mul_mat at its first
# graph); without them the CPU backend uses its AVX-512 kernels, as on EPYC.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

stamp() {
    echo "llama-cpp-python==$LLAMA_CPP_PYTHON bin=$(IFS=,; echo "${BINARIES[*]}") native=$(cpu_flags | sha256sum | cut -c1-12) amx=off"
}

index_reachable() {
    case "${PIP_NO_INDEX:-}" in 1 | yes | true | on) return 0 ;; esac
    python3 - "${PIP_INDEX_URL:-https://pypi.org/simple}" <<'EOF'
import os, sys, urllib.parse, urllib.request
url = sys.argv[1].rstrip("/") + "/llama-cpp-python/"
parts = urllib.parse.urlsplit(url)
try:
    if parts.scheme == "file":
        if not os.path.isdir(urllib.parse.unquote(parts.path)):
            raise OSError("no such folder")
    else:
        urllib.request.urlopen(url, timeout=20).close()
except Exception as exc:
    sys.exit(f"llama-runtime: cannot reach the package index {url}: {exc}")
EOF
}

unreachable_fix() {
    die "the llama.cpp runtime needs $DOWNLOAD_SIZE from PyPI (llama-cpp-python's source, cmake
  and ninja); nothing was changed.
  fix: connect this host to the network (or set https_proxy), or set PIP_INDEX_URL to a PyPI
  mirror, or copy a wheelhouse here (made on a connected host with
  \`packaging/llama-runtime.sh --download DIR\`) and rerun with PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR"
}

# the pinned sdist, its hash checked by pip, into $1
fetch_source() {
    local dir=$1 requirement
    mkdir -p "$dir"
    requirement=$(mktemp)
    echo "llama-cpp-python==$LLAMA_CPP_PYTHON --hash=sha256:$SOURCE_SHA256" > "$requirement"
    python3 -m pip download -q -d "$dir" --no-deps --no-binary llama-cpp-python --require-hashes \
        -r "$requirement" || {
        rm -f "$requirement"
        die "pip could not download llama-cpp-python==$LLAMA_CPP_PYTHON's source (above); rerun to resume"
    }
    rm -f "$requirement"
}

download() {
    local dir=$1
    index_reachable || unreachable_fix
    fetch_source "$dir"
    python3 -m pip download -q -d "$dir" --prefer-binary "$BUILD_BACKEND" "${BUILD_TOOLS[@]}" pip
    say "wheelhouse $dir: $(du -sh "$dir" | cut -f1)"
}

has_compiler() { command -v g++ >/dev/null || command -v c++ >/dev/null; }

provision() {
    local dest=$1 jobs=$2 quiet=$3 want work source
    want=$(stamp)
    if [ -f "$dest/.epyc-stamp" ] && [ "$(cat "$dest/.epyc-stamp")" = "$want" ] &&
        [ -x "$dest/bin/llama-server" ] && [ -x "$dest/bin/llama" ]; then
        say "$dest is provisioned ($want)"
        return 0
    fi
    has_compiler || die "building llama-server needs a C++ compiler; nothing was changed.
  fix: apt-get install g++ (packaging/install.sh --engine llama.cpp does), then rerun" 2
    index_reachable || unreachable_fix
    work=$dest/.build
    say "provisioning $want in $dest ($DOWNLOAD_SIZE to download, $BUILD_TIME to build;"
    say "  a rerun resumes where this one stopped)"
    rm -f "$dest/.epyc-stamp"
    mkdir -p "$work"
    say "[1/5] the build tools (cmake, ninja) in $work/venv"
    [ -x "$work/venv/bin/python" ] || python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install ${quiet:+"$quiet"} "${BUILD_TOOLS[@]}" ||
        die "pip could not install cmake and ninja (above); rerun to resume"
    say "[2/5] the pinned source: llama-cpp-python $LLAMA_CPP_PYTHON's sdist (sha256 checked)"
    # the build venv's cmake on PATH: pip's metadata step then downloads none of its own
    PATH=$work/venv/bin:$PATH fetch_source "$work/download"
    source=$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
    if [ ! -f "$source/CMakeLists.txt" ]; then
        tar -xzf "$work/download/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$work"
    fi
    say "[3/5] configure for this CPU ($(cpu_flags))"
    PATH=$work/venv/bin:$PATH cmake -S "$source" -B "$work/cmake" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
        -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF >"$work/configure.log" 2>&1 ||
        die "cmake could not configure llama.cpp: $work/configure.log says why; rerun to resume"
    say "[4/5] build ${BINARIES[*]} with $jobs jobs (progress every 10%)"
    if ! PATH=$work/venv/bin:$PATH cmake --build "$work/cmake" --target "${TARGETS[@]}" \
        -j "$jobs" 2>&1 | tee "$work/build.log" | progress; then
        die "the build failed: the end of $work/build.log says why; rerun to resume"
    fi
    say "[5/5] install ${BINARIES[*]} in $dest/bin"
    local binary
    for binary in "${BINARIES[@]}"; do
        install -D -m 0755 "$work/cmake/bin/$binary" "$dest/bin/$binary"
    done
    "$dest/bin/llama-server" --version >/dev/null 2>&1 ||
        die "the built llama-server does not run (\`$dest/bin/llama-server --version\`)"
    "$dest/bin/llama" version >/dev/null 2>&1 ||
        die "the built llama does not run (\`$dest/bin/llama version\`)"
    # the pinned source stays for a rebuild (a CPU change); the tree and its objects go
    rm -rf "$work/cmake" "$work/venv" "$work/llama_cpp_python-$LLAMA_CPP_PYTHON"
    echo "$want" > "$dest/.epyc-stamp"
    say "ready: $dest/bin/llama-server and llama ($(du -sh "$dest/bin" | cut -f1))"
}

# DEST/converter from the kept sdist: the files of its vendor/llama.cpp the converter needs
install_converter() {
    local dest=$1 sdist target partial
    sdist=$dest/.build/download/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz
    target=$dest/converter
    if [ -f "$target/.source" ] && [ "$(cat "$target/.source")" = "${sdist##*/}" ]; then
        return 0
    fi
    if [ ! -f "$sdist" ]; then
        if ! index_reachable 2>/dev/null; then
            say "converter: not installed (the source is not kept in $dest/.build/download and"
            say "  no package index is reachable): llama-server serves GGUF files as before, and"
            say "  \`epycctl convert\` says so until this recipe runs again with an index"
            return 0
        fi
        fetch_source "$dest/.build/download"
    fi
    partial=$dest/converter.part
    rm -rf "$partial"
    mkdir -p "$partial"
    tar -xzf "$sdist" -C "$partial" --strip-components=3 \
        "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/convert_hf_to_gguf.py" \
        "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/conversion" \
        "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp/gguf-py" ||
        die "could not unpack the converter from $sdist; rerun to resume"
    echo "${sdist##*/}" > "$partial/.source"
    rm -rf "$target"
    mv "$partial" "$target"
    say "converter: $target (convert_hf_to_gguf.py, the source's own)"
}

# ninja's "[N/TOTAL] ..." lines as one line per tenth of the build
progress() {
    local shown=-1 line built total tenth
    while IFS= read -r line; do
        if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
            built=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
            tenth=$((built * 10 / total))
            if [ "$tenth" -gt "$shown" ]; then
                shown=$tenth
                say "  $((tenth * 10))% ($built/$total)"
            fi
        elif [[ $line == *error* ]]; then
            echo "$line"
        fi
    done
}

main() {
    local dest="" jobs quiet="" mode=provision
    jobs=$(nproc)
    while [ $# -gt 0 ]; do
        case "$1" in
            --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
            --quiet) quiet=-q; shift ;;
            --stamp) mode=stamp; shift ;;
            --download) mode=download; dest=${2:?--download needs a folder}; shift 2 ;;
            -*) die "unknown option $1 (see the head of $0)" 2 ;;
            *) dest=$1; shift ;;
        esac
    done
    [[ $jobs =~ ^[1-9][0-9]*$ ]] || die "--jobs takes a positive number, not $jobs" 2
    case "$mode" in
        stamp) stamp ;;
        download) download "$dest" ;;
        provision)
            [ -n "$dest" ] || die "usage: $0 DEST [--jobs N] [--quiet]" 2
            provision "$dest" "$jobs" "$quiet"
            install_converter "$dest"
            ;;
    esac
}

main "$@"
