#!/usr/bin/env bash
# llama-server and llama (its tools: fit-params, quantize, bench) by the product's own recipe
# (packaging/llama-runtime.sh: the pinned source, built for this CPU). A no-op when cached.
# The tiny test model's GGUF files are tests/tools/tiny_gguf.sh's, from this build's source.
# Result: $EPYC_TEST_CACHE/llama-server/bin/llama-server
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
packaging/llama-runtime.sh "$CACHE/llama-server" --quiet
