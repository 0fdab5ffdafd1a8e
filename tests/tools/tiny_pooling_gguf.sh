#!/usr/bin/env bash
# The tiny BERT embedder and reranker (tests/tools/tiny_pooling.sh) as bf16 GGUF files, by the
# converter of the llama.cpp source tests/tools/llama_server.sh built from (tests/tools/
# tiny_gguf.py, with the vLLM venv's torch and transformers). The embedder is converted with
# the sentence-transformers files a published embedder ships (modules.json and its pooling
# module's config: mean pooling), so the file carries its pooling type as such a model's GGUF
# does; the reranker as converted (a one-label classifier head, no pooling type).
# Result: $EPYC_TEST_CACHE/tiny-pooling-gguf/{embedder,reranker}-bf16.gguf
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
SERVER=$CACHE/llama-server
POOLING=$CACHE/tiny-pooling
OUT=$CACHE/tiny-pooling-gguf
rm -rf "$OUT" "$OUT.new"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$SERVER"/.build/download/llama_cpp_python-*.tar.gz -C "$work"
source=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
cp -r "$POOLING/embedder" "$work/embedder"
cp -r "$POOLING/reranker" "$work/reranker"
mkdir "$work/embedder/1_Pooling"
cat > "$work/embedder/modules.json" <<'JSON'
[
  {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
  {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
]
JSON
cat > "$work/embedder/1_Pooling/config.json" <<'JSON'
{"word_embedding_dimension": 128, "pooling_mode_cls_token": false,
 "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false}
JSON
for model in embedder reranker; do
    "$CACHE/vllm-venv/bin/python" tests/tools/tiny_gguf.py --source "$source" \
        --model "$work/$model" --out "$work/out" --type bf16 >"$work/convert.log" 2>&1 || {
        tail -20 "$work/convert.log" >&2
        exit 1
    }
    mkdir -p "$OUT.new"
    mv "$work/out/tiny-bf16.gguf" "$OUT.new/$model-bf16.gguf"
done
mv "$OUT.new" "$OUT"
echo "tiny pooling gguf: $(cd "$OUT" && echo *.gguf) in $OUT"
