"""The test caches under $EPYC_TEST_CACHE and the builders that make them (tests/tools/*.sh).

Each builder has a key: the hash of everything it reads, that is its script, the repository
files it sources or runs, the output of its `facts` commands (what of the machine its result
depends on), and the keys of the builders whose results it reads. A builder is rebuilt
exactly when its key differs from the one kept beside the cache (.keys/NAME) or one of its
results is missing, and then from empty: its results are removed first. A rebuilt builder's
key changes the keys of the builders that read it, so they follow. Builders whose needs are
met run side by side (EPYC_TEST_BUILD_JOBS at a time, default 3: most wait on the network or
the disk while one compiles), each with its output in .logs/NAME.log; a failure prints the
log's last lines and stops the rest from starting.

    python3 tests/tools/builders.py run       build what is stale (tests/bootstrap.sh runs this)
    python3 tests/tools/builders.py stale     name what `run` would build, and why
    python3 tests/tools/builders.py keys      every builder's key

stdlib only: it runs before the project's venv exists, on the system's python3.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = "tests/tools"
LIB = "tests/tools/lib/debian_rootfs.sh"
ON_ERROR = "tests/tools/lib/on_error.sh"
DEB_HOSTS = ("trixie", "noble", "jammy")


@dataclass(frozen=True)
class Builder:
    """One row: a script of tests/tools and what it makes and reads."""

    name: str
    builds: tuple[str, ...]
    """Its results: folders under the cache, removed before it is rebuilt."""
    reads: tuple[str, ...] = ()
    """Repository files it sources or runs, besides its own script."""
    needs: tuple[str, ...] = ()
    """Builders whose results it reads: they run before it, and their keys are in its key."""
    facts: tuple[tuple[str, ...], ...] = ()
    """Commands (run in the repository) whose output its result depends on."""

    @property
    def script(self) -> str:
        return f"{TOOLS}/{self.name}.sh"


# The longest first, and what the longest chains start from (rootfs before the image built
# on it); each starts as soon as what it needs is built.
BUILDERS: tuple[Builder, ...] = (
    Builder(
        "llama_server",
        builds=("llama-server",),
        reads=("packaging/llama-runtime.sh",),
        facts=(("bash", "packaging/llama-runtime.sh", "--stamp"),),
    ),
    Builder(
        "vllm_venv",
        builds=("vllm-venv", "tiny-model"),
        reads=("packaging/vllm-runtime.sh", "tests/tools/tiny_model.py"),
    ),
    Builder("rootfs", builds=("rootfs",), reads=(LIB,)),
    Builder(
        "runtime_wheels",
        builds=("runtime-wheels",),
        reads=("packaging/vllm-runtime.sh", "pyproject.toml"),
    ),
    Builder("bare_host", builds=("rootfs-bare-bookworm", "bare-apt-bookworm"), reads=(LIB,)),
    Builder(
        "engine_rootfs",
        builds=("rootfs-trixie-podman", "rootfs-bookworm-docker"),
        reads=(LIB,),
    ),
    Builder(
        "deb_hosts",
        builds=(
            *(f"{kind}-{suite}" for suite in DEB_HOSTS for kind in ("rootfs-bare", "deb-apt")),
            "ubuntu-keyring",
        ),
        reads=(LIB, "packaging/deb/debian/control"),
    ),
    Builder("quadlet", builds=("quadlet",)),
    Builder("haproxy", builds=("haproxy",)),
    Builder("prometheus", builds=("prometheus",)),
    Builder(
        "bare_indexes",
        builds=("bare-pypi", "bare-torch-index"),
        reads=(LIB,),
        needs=("runtime_wheels",),
    ),
    Builder(
        "tiny_gguf",
        builds=("tiny-gguf",),
        reads=("tests/tools/tiny_gguf.py",),
        needs=("llama_server", "vllm_venv"),
    ),
    Builder(
        "vllm_image",
        builds=("vllm-image",),
        reads=("data/epyc.json",),
        needs=("rootfs", "vllm_venv"),
    ),
    Builder(
        "tiny_pooling",
        builds=("tiny-pooling",),
        reads=("tests/tools/tiny_pooling.py",),
        needs=("vllm_venv",),
    ),
    Builder(
        "tiny_llama",
        builds=("tiny-llama",),
        reads=("tests/tools/tiny_llama.py",),
        needs=("vllm_venv",),
    ),
    Builder("published_embedder", builds=("published-embedder",)),
    Builder("published_gemma", builds=("published-gemma",)),
    Builder(
        "tiny_pooling_gguf",
        builds=("tiny-pooling-gguf",),
        reads=("tests/tools/tiny_gguf.py",),
        needs=("llama_server", "vllm_venv", "tiny_pooling"),
    ),
)
BY_NAME = {builder.name: builder for builder in BUILDERS}


def cache_dir() -> Path:
    return Path(os.environ.get("EPYC_TEST_CACHE", "/var/cache/epyc-llm-test"))


def digest(parts: Iterable[bytes]) -> str:
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(len(part).to_bytes(8, "big") + part)
    return hashed.hexdigest()[:16]


def fact(command: tuple[str, ...], repo: Path) -> bytes:
    done = subprocess.run(command, cwd=repo, capture_output=True, check=True, timeout=60)
    return done.stdout


def keys(repo: Path = REPO, builders: Iterable[Builder] = BUILDERS) -> dict[str, str]:
    """Every builder's key, the builders it needs first (the table is in no set order)."""
    table = {builder.name: builder for builder in builders}
    found: dict[str, str] = {}

    def key(name: str, path: tuple[str, ...] = ()) -> str:
        if name in path:
            raise ValueError(f"builders need each other in a cycle: {' -> '.join((*path, name))}")
        if name not in found:
            builder = table[name]
            parts = [name.encode()]
            parts += [
                f.encode() + b"\0" + (repo / f).read_bytes()
                for f in (builder.script, *builder.reads)
            ]
            parts += [" ".join(c).encode() + b"\0" + fact(c, repo) for c in builder.facts]
            parts += [f"{n}={key(n, (*path, name))}".encode() for n in builder.needs]
            found[name] = digest(parts)
        return found[name]

    for name in table:
        key(name)
    return found


def kept_key(cache: Path, name: str) -> str | None:
    try:
        return (cache / ".keys" / name).read_text().strip()
    except OSError:
        return None


def why_stale(builder: Builder, key: str, cache: Path) -> str | None:
    """Why `builder` must be built again, or None where its results are built from `key`."""
    missing = [part for part in builder.builds if not (cache / part).exists()]
    kept = kept_key(cache, builder.name)
    if kept is None:
        return "never built here"
    if kept != key:
        return f"its key changed ({kept} -> {key})"
    if missing:
        return f"{', '.join(missing)} missing"
    return None


def stale(cache: Path, repo: Path = REPO, builders: Iterable[Builder] = BUILDERS) -> dict[str, str]:
    """{name: why} for every builder to build, in the table's order."""
    rows = tuple(builders)
    found = keys(repo, rows)
    reasons = {b.name: why_stale(b, found[b.name], cache) for b in rows}
    return {name: why for name, why in reasons.items() if why is not None}


def unmount_below(path: Path) -> None:
    """Whatever is mounted at or below `path` (a podman store's overlay), deepest first."""
    inside = []
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            target = line.split()[4].replace("\\040", " ")
            if target == str(path) or target.startswith(f"{path}/"):
                inside.append(target)
    for target in sorted(inside, reverse=True):
        subprocess.run(["umount", "-l", target], check=False)


def empty(builder: Builder, cache: Path) -> None:
    """Remove the builder's results and their half-built siblings: it starts from empty."""
    (cache / ".keys" / builder.name).unlink(missing_ok=True)
    for part in builder.builds:
        for path in (cache / part, cache / f"{part}.new", cache / f"{part}.scratch"):
            if path.exists() or path.is_symlink():
                unmount_below(path)
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()


def say(text: str) -> None:
    print(f"bootstrap: {text}", flush=True)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run(
    cache: Path, repo: Path = REPO, jobs: int = 3, builders: Iterable[Builder] = BUILDERS
) -> int:
    """Build what is stale, each builder once what it needs is built; 0, or 1 on a failure."""
    rows = tuple(builders)
    table = {b.name: b for b in rows}
    found = keys(repo, rows)
    todo = stale(cache, repo, rows)
    for name, why in todo.items():
        say(f"{name}: to build ({why})")
    if not todo:
        say("every cache is built from what its builder reads now")
        return 0
    for name in todo:
        empty(table[name], cache)
    (cache / ".keys").mkdir(parents=True, exist_ok=True)
    (cache / ".logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EPYC_TEST_CACHE": str(cache), "BASH_ENV": str(repo / ON_ERROR)}
    waiting = [name for name in table if name in todo]
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    failed: list[str] = []
    started = time.monotonic()
    while waiting or running:
        for name in list(waiting):
            ready = all(
                need not in todo or (cache / ".keys" / need).exists() for need in table[name].needs
            )
            if len(running) < jobs and ready and not failed:
                log = (cache / ".logs" / f"{name}.log").open("wb")
                process = subprocess.Popen(
                    ["bash", table[name].script],
                    cwd=repo,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                running[name] = (process, time.monotonic())
                waiting.remove(name)
                say(f"{name}: started (log: {cache}/.logs/{name}.log)")
        if failed and not running:
            break
        time.sleep(0.5)
        for name, (process, since) in list(running.items()):
            if process.poll() is None:
                continue
            del running[name]
            seconds = round(time.monotonic() - since)
            if process.returncode == 0:
                (cache / ".keys" / name).write_text(found[name] + "\n")
                say(f"tests/tools/{name}.sh done in {seconds} s")
            else:
                failed.append(name)
                log_path = cache / ".logs" / f"{name}.log"
                print(tail(log_path), file=sys.stderr)
                say(f"tests/tools/{name}.sh failed after {seconds} s (the end of {log_path} above)")
    if failed:
        left = ", ".join(waiting) or "none"
        say(f"failed: {', '.join(failed)}; not started: {left}")
        return 1
    say(f"built {len(todo)} of {len(table)} caches in {round(time.monotonic() - started)} s")
    return 0


def adopt(cache: Path, names: Iterable[str], repo: Path = REPO) -> None:
    """Record today's keys for caches built by these very scripts by an older bootstrap
    (one that kept no keys), so that they are not built again."""
    found = keys(repo)
    (cache / ".keys").mkdir(parents=True, exist_ok=True)
    for name in names:
        missing = [part for part in BY_NAME[name].builds if not (cache / part).exists()]
        if missing:
            raise SystemExit(f"{name}: {', '.join(missing)} not built: nothing to adopt")
        (cache / ".keys" / name).write_text(found[name] + "\n")
        say(f"{name}: adopted as built from {found[name]}")


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("run", "stale", "keys", "adopt"))
    parser.add_argument("names", nargs="*", help="adopt: the builders whose caches to adopt")
    args = parser.parse_args(argv)
    cache = cache_dir()
    if args.command == "run":
        cache.mkdir(parents=True, exist_ok=True)
        return run(cache, jobs=int(environ.get("EPYC_TEST_BUILD_JOBS", "3")))
    if args.command == "stale":
        for name, why in stale(cache).items():
            print(f"{name}: {why}")
        return 0
    if args.command == "adopt":
        adopt(cache, args.names)
        return 0
    for name, key in keys().items():
        print(f"{name} {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
