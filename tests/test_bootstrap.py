"""tests/bootstrap.sh from an empty cache: the real script, in a copy of its tree, with a
stand-in for each tool in tests/tools/ (minutes of debootstrap, pip and podman each) that
fails, as the real tool does under `set -e`, when a cached part it reads is not built yet.
So the order is checked as it runs, not as it is written: the bootstrap of issue 25 ran
vllm_image.sh before vllm_venv.sh and exited 1 without a word."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.sandbox import REPO

TOOLS = REPO / "tests" / "tools"

BUILDS = {
    "quadlet.sh": "quadlet",
    "haproxy.sh": "haproxy",
    "prometheus.sh": "prometheus",
    "rootfs.sh": "rootfs",
    "engine_rootfs.sh": "rootfs-trixie-podman",
    "vllm_venv.sh": "vllm-venv",
    "runtime_wheels.sh": "runtime-wheels",
    "vllm_image.sh": "vllm-image",
    "bare_host.sh": "bare-pypi",
    "llama_server.sh": "llama-server",
    "deb_hosts.sh": "deb-apt-jammy",
}
"""The cached part each real tool builds under $EPYC_TEST_CACHE."""

READS = {
    "vllm_image.sh": ("rootfs", "vllm-venv"),
    "bare_host.sh": ("runtime-wheels",),
    "llama_server.sh": ("vllm-venv",),
}
"""The cached parts a real tool reads (vllm_image.sh: the rootfs and the venv it packs into
the image; bare_host.sh: the wheelhouse its local PyPI and PyTorch indexes are made from;
llama_server.sh: the vLLM venv's torch and the tiny model it converts to GGUF)."""

STAND_IN = """#!/usr/bin/env bash
set -euo pipefail
echo "$(basename "$0")" >> "$EPYC_TEST_CACHE/../order"
for part in {reads}; do
    stamp=$(cat "$EPYC_TEST_CACHE/$part/.epyc-stamp")
done
mkdir -p "$EPYC_TEST_CACHE/{builds}"
echo built > "$EPYC_TEST_CACHE/{builds}/.epyc-stamp"
"""


def real_tools() -> list[str]:
    return sorted(p.name for p in TOOLS.glob("*.sh"))


def tree(tmp_path: Path, failing: str | None = None) -> tuple[Path, dict[str, str]]:
    """A copy of the bootstrap with stand-in tools, a stand-in venv and dpkg-query."""
    root = tmp_path / "repo"
    (root / "tests" / "tools" / "lib").mkdir(parents=True)
    shutil.copy2(REPO / "tests" / "bootstrap.sh", root / "tests" / "bootstrap.sh")
    shutil.copy2(TOOLS / "lib" / "on_error.sh", root / "tests" / "tools" / "lib" / "on_error.sh")
    for tool in real_tools():
        text = STAND_IN.format(reads=" ".join(READS.get(tool, ())), builds=BUILDS[tool])
        if tool == failing:
            text = text.replace("mkdir -p", "false\nmkdir -p", 1)
        (root / "tests" / "tools" / tool).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        bin_dir / "dpkg-query": 'echo "install ok installed"',
        bin_dir / "apt-get": "echo apt-get must not run >&2; exit 1",
        root / ".venv" / "bin" / "python": "exit 0",
        root / ".venv" / "bin" / "pip": "exit 0",
    }
    for path, body in stand_ins.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "EPYC_TEST_CACHE": str(tmp_path / "cache"),
    }
    return root, env


def bootstrap(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "tests" / "bootstrap.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_tool_has_a_stand_in() -> None:
    assert sorted(BUILDS) == real_tools(), "a new tool in tests/tools: say what it builds"


def test_from_an_empty_cache_every_tool_runs_once_after_what_it_reads(tmp_path: Path) -> None:
    root, env = tree(tmp_path)
    done = bootstrap(root, env)
    assert done.returncode == 0, done.stdout + done.stderr
    order = (tmp_path / "order").read_text().split()
    assert sorted(order) == real_tools(), order
    for tool, parts in READS.items():
        builders = [t for t, built in BUILDS.items() if built in parts]
        assert all(order.index(b) < order.index(tool) for b in builders), order
    for tool in order:
        assert f"bootstrap: tests/tools/{tool} done in" in done.stdout


def test_the_glob_order_would_have_failed(tmp_path: Path) -> None:
    """The stand-ins catch a wrong order: in glob order a tool runs before what it reads."""
    root, env = tree(tmp_path)
    glob_order = " ".join(real_tools())
    script = root / "tests" / "bootstrap.sh"
    text = script.read_text()
    start = text.index("TOOLS=(")
    end = text.index("\n)\n", start) + 1
    script.write_text(text[:start] + f"TOOLS=({glob_order}" + text[end:])
    done = bootstrap(root, env)
    assert done.returncode == 1
    assert any(f"bootstrap: tests/tools/{tool} failed" in done.stderr for tool in READS), done


@pytest.mark.parametrize("failing", ["rootfs.sh", "vllm_venv.sh"])
def test_a_failing_tool_is_named_with_its_step_and_stops_the_rest(
    tmp_path: Path, failing: str
) -> None:
    root, env = tree(tmp_path, failing=failing)
    done = bootstrap(root, env)
    assert done.returncode == 1
    assert f"{failing}: line 7 failed (exit 1): false" in done.stderr, done.stderr
    assert f"bootstrap: tests/tools/{failing} failed" in done.stderr
    order = (tmp_path / "order").read_text().split()
    assert order[-1] == failing, "a tool ran after the one that failed"
