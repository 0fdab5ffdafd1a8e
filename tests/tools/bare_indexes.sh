#!/usr/bin/env bash
# The pip indexes of README command 1's end-to-end test (tests/e2e/test_runtime.py): a local
# PyPI mirror and a local PyTorch CPU wheel index, as simple indexes (PEP 503) made from the
# runtime wheelhouse (tests/tools/runtime_wheels.sh): torch's +cpu build only in the second,
# as on the real hosts. A no-op when cached. Results under $EPYC_TEST_CACHE:
#   bare-pypi, bare-torch-index  the simple indexes
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/tools/lib/debian_rootfs.sh
source tests/tools/lib/debian_rootfs.sh

CACHE=${EPYC_TEST_CACHE:-/var/cache/epyc-llm-test}

# simple_index WHEELHOUSE DEST FILTER: a PEP 503 index of the wheelhouse's files whose
# project FILTER keeps (torch: only torch; pypi: all but torch)
wheels=$CACHE/runtime-wheels
want="$(cat "$wheels/.epyc-stamp") v1"
if rootfs_cached "$CACHE/bare-pypi" "$want" && rootfs_cached "$CACHE/bare-torch-index" "$want"; then
    echo "bare-pypi, bare-torch-index: cached"
    exit 0
fi
python3 - "$wheels" "$CACHE" <<'PY'
"""Two simple indexes from one wheelhouse: PyPI's part, and PyTorch's CPU index's part."""
import html, os, re, shutil, sys
from pathlib import Path

wheels, cache = Path(sys.argv[1]), Path(sys.argv[2])
indexes = {"bare-pypi": cache / "bare-pypi.new", "bare-torch-index": cache / "bare-torch-index.new"}
for folder in indexes.values():
    shutil.rmtree(folder, ignore_errors=True)
projects: dict[tuple[str, str], list[Path]] = {}
for file in sorted(wheels.iterdir()):
    if file.name.startswith(".") or not file.is_file():
        continue
    stem = re.split(r"-\d", file.name, maxsplit=1)[0]
    name = re.sub(r"[-_.]+", "-", stem).lower()
    index = "bare-torch-index" if name == "torch" else "bare-pypi"
    projects.setdefault((index, name), []).append(file)
for (index, name), files in projects.items():
    folder = indexes[index] / name
    folder.mkdir(parents=True)
    links = []
    for file in files:
        os.link(file, folder / file.name)  # a hard link: the index is bound elsewhere
        links.append(f'<a href="{html.escape(file.name)}">{html.escape(file.name)}</a><br>')
    (folder / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
for index, folder in indexes.items():
    names = sorted(p.name for p in folder.iterdir())
    (folder / "index.html").write_text(
        "<html><body>\n" + "\n".join(f'<a href="{n}/">{n}</a><br>' for n in names) + "\n</body></html>\n"
    )
PY
for index in bare-pypi bare-torch-index; do
    rootfs_finish "$CACHE/$index" "$want"
done
echo "bare-pypi: $(ls "$CACHE/bare-pypi" | wc -l) projects; bare-torch-index: torch"
