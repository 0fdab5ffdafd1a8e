#!/usr/bin/env bash
# A tiny BERT embedder and reranker (tests/tools/tiny_pooling.py), built with the vLLM venv's
# transformers (tests/tools/vllm_venv.sh). A no-op when cached.
# Result: $EPYC_TEST_CACHE/tiny-pooling/{embedder,reranker}
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
OUT=$CACHE/tiny-pooling
WANT="$(cat "$CACHE/vllm-venv/.epyc-stamp") $(sha256sum tests/tools/tiny_pooling.py | cut -c1-16)"
if [ "$(cat "$OUT/.stamp" 2>/dev/null || true)" = "$WANT" ]; then
    echo "tiny pooling models: cached in $OUT"
    exit 0
fi
rm -rf "$OUT" "$OUT.new"
"$CACHE/vllm-venv/bin/python" tests/tools/tiny_pooling.py --out "$OUT.new"
echo "$WANT" > "$OUT.new/.stamp"
mv "$OUT.new" "$OUT"
echo "tiny pooling models: built in $OUT"
