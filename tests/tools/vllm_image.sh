#!/usr/bin/env bash
# Builds the local vLLM CPU container image the container end-to-end tests serve with: no
# registry is reachable, so the image is made from parts built from Debian's packages and
# PyPI only: the bookworm rootfs (tests/tools/rootfs.sh) with the vLLM CPU venv
# (tests/tools/vllm_venv.sh) and the interpreter it was made from at their own paths, `vllm`
# and `python3` on PATH. `podman import` stores it, tagged like a real image, in a podman
# storage folder the test machines mount read-only as an additional image store (no copy per
# run), and `podman save` writes a docker-archive for `docker load`. Also lays the tiny model
# out as a Hugging Face cache (hub/models--ORG--NAME with refs, snapshots and blobs).
# A second tag stands in for the registry's stock vLLM CPU image, the one the product's stock
# route (a CPU without AVX-512 BF16) serves when the endpoint file names no image: the name
# data/epyc.json pins, the same layers plus one: ENTRYPOINT `vllm serve` as the real image's, and
# zentorch hidden (a package that fails to import first on PYTHONPATH) so that vLLM runs its
# stock CpuPlatform whatever the CPU, as that image does.
# A no-op when cached. Results under $EPYC_TEST_CACHE/vllm-image: store/, image.tar (both
# tags), hf-cache/
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}
export EPYC_TEST_CACHE=$CACHE
DIR=$CACHE/vllm-image
STAMP=$DIR/.epyc-stamp
TAG=localhost/epyc-llm-test/vllm-cpu:0.32.0
MODEL_REPO=epyc-llm-test/tiny
# the stock image's pinned name, as epycd.stack.Stack.stock_image_pinned makes it
STOCK_TAG=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(d["stock_image"]["repository"] + ":" + d["stock_image"]["pinned_tag"].format(version=d["vllm_version"]))' data/epyc.json)
VENV=$CACHE/vllm-venv
# the rootfs and the venv are tests/tools/rootfs.sh's and vllm_venv.sh's, built before this
WANT="$TAG + $STOCK_TAG from $(cat "$CACHE/rootfs/.epyc-stamp") + $(cat "$VENV/.epyc-stamp") hf=$MODEL_REPO v2"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    echo "vllm image: cached in $DIR ($TAG)"
    exit 0
fi
command -v podman >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman
}

# the venv runs the interpreter it was made from (pyvenv.cfg `home`): ship that prefix too
home=$(awk -F' = ' '$1 == "home" {print $2}' "$VENV/pyvenv.cfg")
prefix=$(dirname "$home")
case "$prefix" in /usr | /usr/local) parts=() ;; *) parts=("${prefix#/}") ;; esac

# built in place (podman's database records its folder): the stamp, written last, marks it whole
rm -rf "$DIR"
mkdir -p "$DIR/run"
store=(--root "$DIR/store" --runroot "$DIR/run" --storage-driver overlay)
path="${VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
nice -n 19 tar -c --numeric-owner \
    --exclude=./.epyc-stamp --exclude=./usr/share/doc --exclude=./usr/share/man \
    --exclude=./var/cache/apt --exclude=./var/lib/apt/lists \
    -C "$CACHE/rootfs" . \
    --exclude='*/lib/python3*/test' --exclude='*.a' \
    -C / "${parts[@]}" "${VENV#/}" \
    | nice -n 19 podman "${store[@]}" import \
        --change "ENV PATH=$path" --change "ENV LANG=C.UTF-8" --change "ENV HOME=/root" \
        --change 'CMD ["vllm", "--help"]' --message "epyc-llm test image: vLLM CPU from PyPI on Debian" \
        - "$TAG"
# the image runs vLLM: the interpreter, its libraries and `vllm` resolve inside it (checked
# in a chroot of the image: `podman run` needs CAP_SYS_RESOURCE for its rlimits, which a
# sandboxed builder may lack)
mnt=$(podman "${store[@]}" image mount "$TAG")
mount -t proc proc "$mnt/proc"
mount -t tmpfs tmpfs "$mnt/tmp"
check=$(nice -n 19 chroot "$mnt" /usr/bin/env -i "PATH=$path" HOME=/root \
    python3 -c 'import vllm, zentorch, shutil, sys; print(shutil.which("vllm"), sys.version.split()[0])' \
    2>&1 | tail -1) || true
umount "$mnt/proc" "$mnt/tmp"
podman "${store[@]}" image unmount "$TAG" >/dev/null
case "$check" in
    "$VENV/bin/vllm "*) echo "vllm image: runs $check" ;;
    *) echo "vllm image: vLLM does not import in the image: $check" >&2; exit 1 ;;
esac
# the stock stand-in: one layer on the image, nothing run (COPY and metadata only)
context=$(mktemp -d)
mkdir -p "$context/zentorch"
echo 'raise ImportError("zentorch hidden: the epyc-llm tests stock vLLM image")' \
    > "$context/zentorch/__init__.py"
printf '%s\n' "FROM $TAG" "COPY zentorch /opt/stock-hide/zentorch" \
    "ENV PYTHONPATH=/opt/stock-hide" 'ENTRYPOINT ["vllm", "serve"]' 'CMD []' \
    > "$context/Containerfile"
podman "${store[@]}" build --pull=never --network=none -t "$STOCK_TAG" \
    -f "$context/Containerfile" "$context"
rm -rf "$context"
nice -n 19 podman "${store[@]}" save --multi-image-archive --format docker-archive \
    -o "$DIR/image.tar" "$TAG" "$STOCK_TAG"
rm -rf "$DIR/run"
# the overlay driver mounts its folder over itself: leave no mount behind
umount "$DIR/store/overlay" 2>/dev/null || true

python3 - "$CACHE/tiny-model" "$DIR/hf-cache/hub" "$MODEL_REPO" <<'PY'
"""A Hugging Face hub cache as huggingface_hub writes it: blobs by hash, a snapshot of links."""
import hashlib, os, shutil, sys
from pathlib import Path

source, hub, repo = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
top = hub / ("models--" + repo.replace("/", "--"))
files = sorted(p for p in source.iterdir() if p.is_file())
revision = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
snapshot = top / "snapshots" / revision
snapshot.mkdir(parents=True)
(top / "blobs").mkdir()
for file in files:
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    shutil.copy2(file, top / "blobs" / digest)
    os.symlink(f"../../blobs/{digest}", snapshot / file.name)
(top / "refs").mkdir()
(top / "refs" / "main").write_text(revision)
PY
echo "$WANT" > "$DIR/.epyc-stamp"
echo "vllm image: $TAG and $STOCK_TAG in $DIR ($(du -sh "$DIR/store" | cut -f1) store, $(du -sh "$DIR/image.tar" | cut -f1) archive)"
