#!/usr/bin/env bash
# Builds the CPU vLLM the health tests serve with, by the product's own recipe
# (packaging/vllm-runtime.sh, the embedded runtime, with zentorch on any CPU), then the tiny
# test model. A no-op when both are cached.
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
# the test machines' pip finds torch's +cpu build in the wheel folder its settings name
# (PIP_FIND_LINKS), and PyTorch's CPU index is not reachable here: pip is given none, unless
# EPYC_TEST_TORCH_INDEX names one (tests/e2e/test_runtime.py gives the recipe a local copy)
export PIP_EXTRA_INDEX_URL=${EPYC_TEST_TORCH_INDEX-}
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
