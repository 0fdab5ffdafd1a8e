#!/usr/bin/env bash
# The tiny test model (tests/tools/tiny_model.py, built by tests/tools/vllm_venv.sh) as GGUF
# files, bf16 and q8_0, by the converter of the llama.cpp source tests/tools/llama_server.sh
# built from, run with the vLLM venv's torch and transformers (tests/tools/tiny_gguf.py).
# A no-op when cached. Result: $EPYC_TEST_CACHE/tiny-gguf/*.gguf
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
SERVER=$CACHE/llama-server
GGUF=$CACHE/tiny-gguf
WANT="$(cat "$SERVER/.epyc-stamp") $(cat "$CACHE/tiny-model/.tiny-model-stamp")"
WANT="$WANT $(sha256sum tests/tools/tiny_gguf.py | cut -c1-16)"
if [ "$(cat "$GGUF/.stamp" 2>/dev/null || true)" = "$WANT" ]; then
    echo "tiny gguf: cached in $GGUF"
    exit 0
fi
rm -rf "$GGUF" "$GGUF.new"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$SERVER"/.build/download/llama_cpp_python-*.tar.gz -C "$work"
source=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
for type in bf16 q8_0; do
    "$CACHE/vllm-venv/bin/python" tests/tools/tiny_gguf.py --source "$source" \
        --model "$CACHE/tiny-model" --out "$GGUF.new" --type "$type" >"$work/convert.log" 2>&1 || {
        tail -20 "$work/convert.log" >&2
        exit 1
    }
done
echo "$WANT" > "$GGUF.new/.stamp"
mv "$GGUF.new" "$GGUF"
echo "tiny gguf: $(cd "$GGUF" && echo *.gguf) in $GGUF"
