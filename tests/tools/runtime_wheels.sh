#!/usr/bin/env bash
# A wheelhouse for the embedded-runtime end-to-end test (tests/e2e/test_runtime.py): the
# wheels packaging/vllm-runtime.sh installs, and what install.sh needs for the product itself
# (its dependencies and its build backend), so the test machine installs all of it with
# PIP_NO_INDEX=1 and no network. A no-op when cached for this recipe and pyproject.toml.
# Result: $EPYC_TEST_CACHE/runtime-wheels
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
# the test machines' pip finds torch's +cpu build in the wheel folder its settings name
# (PIP_FIND_LINKS), and PyTorch's CPU index is not reachable here: pip is given none, unless
# EPYC_TEST_TORCH_INDEX names one (tests/e2e/test_runtime.py gives the recipe a local copy)
export PIP_EXTRA_INDEX_URL=${EPYC_TEST_TORCH_INDEX-}
DIR=$CACHE/runtime-wheels
WANT="$(packaging/vllm-runtime.sh --stamp --zentorch yes) $(sha256sum pyproject.toml | cut -c1-16)"

if [ -f "$DIR/.epyc-stamp" ] && [ "$(cat "$DIR/.epyc-stamp")" = "$WANT" ]; then
    echo "runtime wheels: cached in $DIR"
    exit 0
fi
product=$(python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))
print(" ".join(p["project"]["dependencies"] + p["build-system"]["requires"] + ["setuptools", "wheel"]))')
# shellcheck disable=SC2086  # one requirement per word
packaging/vllm-runtime.sh --download "$DIR" $product
echo "$WANT" > "$DIR/.epyc-stamp"
