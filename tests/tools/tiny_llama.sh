#!/usr/bin/env bash
# A tiny Llama chat model with a SentencePiece tokenizer (tests/tools/tiny_llama.py), built
# with the vLLM venv's transformers and sentencepiece (tests/tools/vllm_venv.sh): the model
# the conversion tests turn into GGUF with llama.cpp's converter. A no-op when cached.
# Result: $EPYC_TEST_CACHE/tiny-llama
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
OUT=$CACHE/tiny-llama
WANT="$(cat "$CACHE/vllm-venv/.epyc-stamp") $(sha256sum tests/tools/tiny_llama.py | cut -c1-16)"
if [ "$(cat "$OUT/.stamp" 2>/dev/null || true)" = "$WANT" ]; then
    echo "tiny llama: cached in $OUT"
    exit 0
fi
rm -rf "$OUT" "$OUT.new"
"$CACHE/vllm-venv/bin/python" tests/tools/tiny_llama.py --out "$OUT.new"
chmod -R a+rX "$OUT.new"
echo "$WANT" > "$OUT.new/.stamp"
mv "$OUT.new" "$OUT"
echo "tiny llama: built in $OUT"
