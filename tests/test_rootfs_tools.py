"""The rootfs builders of the e2e tests (tests/tools/rootfs.sh, tests/tools/engine_rootfs.sh)
and the stamp that tells them a cached tree is built: the cached trees under
/var/cache/epyc-llm-test carry these stamps, so a builder that wrote another one would
debootstrap them all again. Run for real, with stand-ins for only debootstrap (minutes and the
network) and chroot (root), in a temporary cache."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.sandbox import REPO

TOOLS = REPO / "tests" / "tools"
BASE = "systemd,systemd-sysv,dbus,ca-certificates,python3,python3-venv,numactl,util-linux,procps"
STAMPS = {
    "rootfs": "bookworm systemd,systemd-sysv,dbus,python3,python3-venv,numactl,util-linux,"
    "procps,ca-certificates,libstdc++6,libgomp1 v1",
    "rootfs-trixie-podman": f"trixie {BASE},podman,crun,conmon,netavark,catatonit v1",
    "rootfs-bookworm-docker": f"bookworm {BASE},docker.io,containerd,runc v1",
}
"""What each cached tree's .epyc-stamp holds (the trees built so far have these)."""

DEBOOTSTRAP = """#!/bin/sh
# stand-in: records its call, makes the files the builders change after debootstrap
target=$4
echo "$*" >> "$CALLS"
mkdir -p "$target/etc/systemd/system/getty.target.wants"
echo 0123456789abcdef > "$target/etc/machine-id"
touch "$target/etc/systemd/system/getty.target.wants/getty@tty1.service"
"""
CHROOT = """#!/bin/sh
# stand-in: apt-get clean leaves a mark; dpkg-query answers the engine's version
case "$2" in
    apt-get) touch "$1/apt-cleaned" ;;
    dpkg-query) case "$5" in podman) echo "$PODMAN" ;; *) echo "$DOCKER" ;; esac ;;
esac
"""


def stand_ins(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("debootstrap", DEBOOTSTRAP),
        ("chroot", CHROOT),
        ("systemd-nspawn", "#!/bin/sh\n"),
        ("apt-get", "#!/bin/sh\necho apt-get must not run >&2\nexit 1\n"),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "EPYC_TEST_CACHE": str(tmp_path / "cache"),
        "CALLS": str(tmp_path / "calls"),
        "PODMAN": "5.4.2+ds1-2",
        "DOCKER": "20.10.24+dfsg1-1",
    }


def build(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(TOOLS / script)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def calls(env: dict[str, str]) -> list[str]:
    path = Path(env["CALLS"])
    return path.read_text().splitlines() if path.exists() else []


def assert_built(tree: Path, stamp: str) -> None:
    assert (tree / ".epyc-stamp").read_text() == stamp + "\n"
    assert (tree / "etc" / "machine-id").read_text() == ""
    assert not any((tree / "etc" / "systemd" / "system" / "getty.target.wants").iterdir())
    assert (tree / "apt-cleaned").exists()
    assert not tree.with_name(tree.name + ".new").exists()


@pytest.mark.parametrize("script", ["rootfs.sh", "engine_rootfs.sh"])
def test_a_build_stamps_what_the_cached_trees_carry_and_a_rerun_is_a_no_op(
    tmp_path: Path, script: str
) -> None:
    env = stand_ins(tmp_path)
    done = build(script, env)
    assert done.returncode == 0, done.stderr
    cache = Path(env["EPYC_TEST_CACHE"])
    built = sorted(p.name for p in cache.iterdir())
    assert built == (["rootfs"] if script == "rootfs.sh" else sorted(STAMPS)[1:])
    for name in built:
        assert_built(cache / name, STAMPS[name])
    asked = sorted(call.split()[1:4] for call in calls(env))
    assert asked == [
        [f"--include={STAMPS[name].split()[1]}", STAMPS[name].split()[0], f"{cache / name}.new"]
        for name in built
    ]

    again = build(script, env)
    assert again.returncode == 0, again.stderr
    assert len(calls(env)) == len(built), "a cached tree was debootstrapped again"
    assert again.stdout.count("cached in") == len(built), again.stdout


def test_a_stale_stamp_rebuilds_the_tree(tmp_path: Path) -> None:
    env = stand_ins(tmp_path)
    tree = Path(env["EPYC_TEST_CACHE"]) / "rootfs"
    tree.mkdir(parents=True)
    (tree / ".epyc-stamp").write_text("bookworm systemd v0\n")
    (tree / "old-file").touch()
    done = build("rootfs.sh", env)
    assert done.returncode == 0, done.stderr
    assert_built(tree, STAMPS["rootfs"])
    assert not (tree / "old-file").exists()


def test_an_engine_of_another_version_is_refused_and_not_cached(tmp_path: Path) -> None:
    env = {**stand_ins(tmp_path), "DOCKER": "26.1.5+dfsg1-9"}
    done = build("engine_rootfs.sh", env)
    assert done.returncode == 1
    assert "bookworm has docker.io '26.1.5+dfsg1-9', the test needs 20.10.*" in done.stderr
    cache = Path(env["EPYC_TEST_CACHE"])
    assert_built(cache / "rootfs-trixie-podman", STAMPS["rootfs-trixie-podman"])
    assert not (cache / "rootfs-bookworm-docker").exists()
