"""tests/bootstrap.sh and its builder runner (tests/tools/builders.py), run for real in a copy
of their tree with a stand-in for each builder (minutes of debootstrap, pip and compiling
each). A stand-in fails, as the real builder does under `set -e`, when a cached part it reads
is not built yet, so the order is checked as it runs, not as it is written (a bootstrap once
ran vllm_image.sh before vllm_venv.sh and exited 1 without a word). The table itself is held
against the real scripts: every file a script runs or sources, and every cache folder it
writes or reads, must be in its row, or its key would miss a change."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.packaging.shellcheck import shellcheck
from tests.sandbox import REPO
from tests.tools.builders import BUILDERS, BY_NAME, Builder, keys

TOOLS = REPO / "tests" / "tools"

STAND_IN = """#!/usr/bin/env bash
set -euo pipefail
echo "start $(basename "$0" .sh) $(date +%s.%N)" >> "$EPYC_TEST_CACHE/../order"
for part in {reads}; do
    stamp=$(cat "$EPYC_TEST_CACHE/$part/.stamp")
done
sleep {sleep}
for part in {builds}; do
    [ ! -e "$EPYC_TEST_CACHE/$part" ] || {{ echo "$part was not emptied first" >&2; exit 3; }}
    mkdir -p "$EPYC_TEST_CACHE/$part"
    echo built > "$EPYC_TEST_CACHE/$part/.stamp"
done
echo "end $(basename "$0" .sh) $(date +%s.%N)" >> "$EPYC_TEST_CACHE/../order"
"""


def needed_parts(builder: Builder) -> list[str]:
    return [part for need in builder.needs for part in BY_NAME[need].builds]


def tree(
    tmp_path: Path, failing: str | None = None, sleep: float = 0.2
) -> tuple[Path, dict[str, str]]:
    """A copy of the bootstrap and its runner with stand-in builders, venv and dpkg-query."""
    root = tmp_path / "repo"
    (root / "tests" / "tools" / "lib").mkdir(parents=True)
    for copied in ("tests/bootstrap.sh", "tests/tools/builders.py", "tests/tools/lib/on_error.sh"):
        shutil.copy2(REPO / copied, root / copied)
    for builder in BUILDERS:
        for read in builder.reads:
            (root / read).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / read, root / read)
        text = STAND_IN.format(
            reads=" ".join(needed_parts(builder)), builds=" ".join(builder.builds), sleep=sleep
        )
        if builder.name == failing:
            text = text.replace("sleep", "false\nsleep", 1)
        (root / builder.script).write_text(text)
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
    (root.parent / "order").unlink(missing_ok=True)
    return subprocess.run(
        ["bash", str(root / "tests" / "bootstrap.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ran(tmp_path: Path) -> list[str]:
    order = tmp_path / "order"
    lines = order.read_text().splitlines() if order.exists() else []
    return [line.split()[1] for line in lines if line.startswith("start ")]


def events(tmp_path: Path) -> list[tuple[float, str, str]]:
    rows = [line.split() for line in (tmp_path / "order").read_text().splitlines()]
    return sorted((float(t), what, name) for what, name, t in rows)


def test_every_builder_script_has_a_row_and_every_row_a_script() -> None:
    scripts = sorted(p.stem for p in TOOLS.glob("*.sh"))
    assert sorted(BY_NAME) == scripts, "a new builder in tests/tools: give it a row in builders.py"
    for builder in BUILDERS:
        assert all((REPO / path).is_file() for path in builder.reads), builder
        assert set(builder.needs) <= set(BY_NAME), builder


CODE_PATH = re.compile(r"(?:tests/tools/[\w./-]+\.(?:sh|py)|packaging/[\w./-]+|pyproject\.toml)")
CACHE_PART = re.compile(r"\$(?:CACHE|\{CACHE\}|EPYC_TEST_CACHE)/([a-z][\w-]*)")


def code_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda b: b.name)
def test_a_row_names_every_file_its_script_runs_or_sources(builder: Builder) -> None:
    """What a script runs or sources and its row does not name would change no key."""
    named = {builder.script, *builder.reads, "tests/tools/lib/on_error.sh"}
    used = {m for line in code_lines(REPO / builder.script) for m in CODE_PATH.findall(line)}
    if "debian_rootfs.sh" in (REPO / builder.script).read_text():
        used.add("tests/tools/lib/debian_rootfs.sh")
    assert used <= named, f"{builder.script} reads {sorted(used - named)}: add them to its reads"


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda b: b.name)
def test_a_row_names_every_cache_folder_its_script_touches(builder: Builder) -> None:
    """A cache folder a script reads must be a needed builder's; one it writes, its own."""
    text = "\n".join(code_lines(REPO / builder.script))
    dirs = {m.group(1) for m in CACHE_PART.finditer(text)}
    allowed = set(builder.builds) | set(needed_parts(builder))
    # a name ending in "-" is a prefix completed by a variable ($CACHE/deb-apt-$2)
    outside = {
        d for d in dirs if not any(a == d or (d.endswith("-") and a.startswith(d)) for a in allowed)
    }
    assert not outside, f"{builder.script} touches {sorted(outside)} under the cache"


def test_keys_follow_what_a_builder_reads_and_what_it_needs(tmp_path: Path) -> None:
    root, _ = tree(tmp_path)
    before = keys(root)
    (root / "tests/tools/haproxy.sh").write_text(
        (root / "tests/tools/haproxy.sh").read_text() + "\n# one line\n"
    )
    after = keys(root)
    assert {n for n in before if before[n] != after[n]} == {"haproxy"}
    wheels = root / "tests/tools/runtime_wheels.sh"
    wheels.write_text(wheels.read_text() + "\n# one line\n")
    again = keys(root)
    assert {n for n in after if after[n] != again[n]} == {"runtime_wheels", "bare_indexes"}


def test_from_an_empty_cache_each_builder_runs_once_after_what_it_needs(tmp_path: Path) -> None:
    root, env = tree(tmp_path)
    done = bootstrap(root, env)
    assert done.returncode == 0, done.stdout + done.stderr
    order = ran(tmp_path)
    assert sorted(order) == sorted(BY_NAME), order
    finished = {name: t for t, what, name in events(tmp_path) if what == "end"}
    started = {name: t for t, what, name in events(tmp_path) if what == "start"}
    for builder in BUILDERS:
        assert all(finished[need] <= started[builder.name] for need in builder.needs), builder
        assert f"bootstrap: tests/tools/{builder.name}.sh done in" in done.stdout
        kept = (tmp_path / "cache" / ".keys" / builder.name).read_text().strip()
        assert kept == keys(root)[builder.name]


def test_independent_builders_run_side_by_side(tmp_path: Path) -> None:
    root, env = tree(tmp_path, sleep=1.0)
    done = bootstrap(root, env)
    assert done.returncode == 0, done.stdout + done.stderr
    running, most = 0, 0
    for _, what, _ in events(tmp_path):
        running += 1 if what == "start" else -1
        most = max(most, running)
    assert most == 3, "three builders at a time (EPYC_TEST_BUILD_JOBS's default)"


def test_a_warm_cache_builds_nothing(tmp_path: Path) -> None:
    root, env = tree(tmp_path)
    assert bootstrap(root, env).returncode == 0
    again = bootstrap(root, env)
    assert again.returncode == 0, again.stderr
    assert ran(tmp_path) == []
    assert "every cache is built from what its builder reads now" in again.stdout


def test_a_changed_builder_is_rebuilt_from_empty_alone(tmp_path: Path) -> None:
    root, env = tree(tmp_path)
    assert bootstrap(root, env).returncode == 0
    left = tmp_path / "cache" / "haproxy" / "left-by-the-old-build"
    left.write_text("")
    script = root / "tests/tools/haproxy.sh"
    script.write_text(
        script.read_text().replace("set -euo pipefail", "set -euo pipefail\n: one line")
    )
    done = bootstrap(root, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ran(tmp_path) == ["haproxy"]
    assert "haproxy: to build (its key changed" in done.stdout
    assert not left.exists(), "the builder was not started from empty"


def test_a_rebuilt_builder_rebuilds_those_that_read_it(tmp_path: Path) -> None:
    root, env = tree(tmp_path)
    assert bootstrap(root, env).returncode == 0
    shutil.rmtree(tmp_path / "cache" / "vllm-venv")
    done = bootstrap(root, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vllm_venv: to build (vllm-venv missing)" in done.stdout
    # its key is the same (nothing it reads changed): those that read it keep theirs
    assert ran(tmp_path) == ["vllm_venv"]
    lib = root / "tests/tools/tiny_model.py"
    lib.write_text(lib.read_text() + "\n# one line\n")
    done = bootstrap(root, env)
    assert sorted(ran(tmp_path)) == [
        "tiny_gguf",
        "tiny_llama",
        "tiny_pooling",
        "tiny_pooling_gguf",
        "vllm_image",
        "vllm_venv",
    ], done.stdout


@pytest.mark.parametrize("failing", ["rootfs", "vllm_venv"])
def test_a_failing_builder_is_named_with_its_step_and_what_needs_it_never_starts(
    tmp_path: Path, failing: str
) -> None:
    root, env = tree(tmp_path, failing=failing)
    done = bootstrap(root, env)
    assert done.returncode == 1
    assert f"{failing}.sh: line 7 failed (exit 1): false" in done.stderr, done.stderr
    assert f"bootstrap: tests/tools/{failing}.sh failed" in done.stdout
    dependents = {b.name for b in BUILDERS if failing in b.needs}
    assert dependents and not dependents & set(ran(tmp_path)), ran(tmp_path)
    assert not (tmp_path / "cache" / ".keys" / failing).exists()


def test_the_bootstrap_and_every_builder_pass_shellcheck() -> None:
    scripts = [REPO / "tests/bootstrap.sh", *(REPO / b.script for b in BUILDERS)]
    done = shellcheck(*scripts, severity="warning")
    assert done.returncode == 0, done.stdout
