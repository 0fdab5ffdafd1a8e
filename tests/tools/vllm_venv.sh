#!/usr/bin/env bash
# Builds the CPU vLLM the health tests serve with, by the product's own recipe
# (packaging/vllm-runtime.sh, the embedded runtime, with zentorch on any CPU), then the tiny
# test model. A no-op when both are cached.
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
VENV=$CACHE/vllm-venv
STAMP=$VENV/.epyc-stamp
WANT=$(packaging/vllm-runtime.sh --stamp --zentorch yes)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/vllm" ]; then
    echo "vllm venv: cached in $VENV"
else
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    packaging/vllm-runtime.sh "$VENV" --zentorch yes --quiet
    echo "vllm venv: built in $VENV"
fi

"$VENV/bin/python" tests/tools/tiny_model.py --cache "$CACHE/tiny-model"
