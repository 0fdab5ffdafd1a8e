"""README command 1 with the llama.cpp engine on a bare host (issue 32, "Done when"):
`packaging/install.sh --engine llama.cpp && epycctl quickstart --engine llama.cpp --model
FILE --yes` on real systemd (PID 1 in systemd-nspawn), in a fresh copy of the bare Debian 12
of tests/tools/bare_host.sh (no venv module, no compiler, no network; apt from a local
repository, pip from a local PyPI mirror), serving the tiny model converted to GGUF.

One part is given, not rebuilt: llama-server itself. The machine starts with the recipe's
finished folder in /opt/epyc-llm/llama-runtime (bin/ and its stamp), which
tests/tools/llama_server.sh built on this CPU with the same recipe (packaging/llama-runtime.sh,
from PyPI's pinned source: 13 minutes on 2 cores, too long to repeat per run); install.sh
still runs the recipe, which finds its stamp and keeps it. Two boots, each one phase of
tests/e2e/inside_llama.py:

install  install.sh --engine llama.cpp (the venv module and g++ from apt), quickstart ->
         ready, the hand-off, a chat, status ready; llama-server pinned to the socket's cores
         with one thread each, its memory bound to the socket's nodes, its weights locked
reboot   back with no new approval: status ready and a chat
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epycd.host.cpulist import format_cpulist, parse_cpulist
from tests.e2e.conftest import (
    Boot,
    Machine,
    clean_copy,
    drive_with,
    endpoint,
    fresh_copy,
    kept_or_removed,
    offline_apt,
    port_free,
    require_parts,
)
from tests.e2e.test_runtime import APT_REPO, BARE_ROOTFS, IDENTITY_ROOT, PYPI, journal_tail
from tests.llama.realllama import SERVER, llama_server, tiny_gguf
from tests.machine import physical_cpus_of_socket, serving_needs_identity, write_identity_root

pytestmark = pytest.mark.e2e

HINT = "run tests/bootstrap.sh (tests/tools/bare_host.sh and tests/tools/llama_server.sh)"
PHASES = ("install", "reboot")
NAME = "default"
MODEL_DIR = "/srv/models"
GGUF = f"{MODEL_DIR}/tiny-q8_0.gguf"
RUNTIME = "/opt/epyc-llm/llama-runtime"
PORTS = range(18621, 18630)


def machine_config() -> dict[str, Any]:
    """What inside_llama.py reads from /results/config.json (and inside.py's helpers)."""
    return {
        "name": NAME,
        "never": "never",
        "port": 0,
        "served": "",
        "client_python": "",
        "model_dir": MODEL_DIR,
        "gguf": GGUF,
        "pypi": "/var/cache/e2e-pypi",
        "identity_root": IDENTITY_ROOT if serving_needs_identity() else None,
    }


def write_machine(root: Path, config: dict[str, Any]) -> None:
    drive_with(root, "inside_llama.py")
    models = root / MODEL_DIR.lstrip("/")
    models.mkdir(parents=True)
    shutil.copy2(tiny_gguf("q8_0"), root / GGUF.lstrip("/"))
    runtime = root / RUNTIME.lstrip("/")
    runtime.mkdir(parents=True)
    shutil.copytree(SERVER / "bin", runtime / "bin")
    shutil.copy2(SERVER / ".epyc-stamp", runtime / ".epyc-stamp")
    offline_apt(root)
    if config["identity_root"]:
        write_identity_root(root / IDENTITY_ROOT.lstrip("/"))


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    require_parts(BARE_ROOTFS, APT_REPO, PYPI, hint=HINT)
    llama_server()
    busy = [port for port in PORTS if not port_free(port)]
    assert not busy, f"ports {busy} are in use on this machine"
    work = tmp_path_factory.mktemp("e2e-llama")
    root, results = fresh_copy(BARE_ROOTFS, work)
    src = work / "src"
    clean_copy(src)
    config = machine_config()
    write_machine(root, config)
    (results / "config.json").write_text(json.dumps(config, indent=2))
    binds = [
        "--private-network",
        # nspawn's seccomp filter refuses mlock(2) unless the container keeps CAP_IPC_LOCK
        # (a host has no such filter); the endpoint's unit still drops every capability
        "--capability=CAP_IPC_LOCK",
        f"--bind-ro={src}:/src",
        f"--bind={results}:/results",
        f"--bind-ro={APT_REPO}:/var/cache/e2e-apt",
        f"--bind-ro={PYPI}:/var/cache/e2e-pypi",
    ]
    with kept_or_removed(work):
        yield Machine(root, results, binds, phases=PHASES)


@pytest.fixture(scope="module")
def install(machine: Machine) -> Boot:
    return machine.boot("install")


def expected_cpus() -> list[int]:
    """The socket's physical cores, as this machine's topology (or its identity root) has
    them: the plan's set and llama-server's thread count."""
    return physical_cpus_of_socket(0)


def test_install_brings_the_build_prerequisites_and_keeps_the_built_server(install: Boot) -> None:
    assert install.one("pid1")["comm"] == "systemd"
    fresh = install.one("fresh")
    assert not fresh["ensurepip"] and not fresh["found"]["g++"], f"not a bare host: {fresh}"
    assert fresh["pypi_resolves"] is False, "the machine reaches the network"
    done = install.one("install")
    assert done["rc"] == 0, done["stdout"][-2000:] + done["stderr"][-3000:]
    out = done["stdout"]
    assert "apt: installing python3.11-venv g++" in out, out[-3000:]
    assert f"llama-runtime: {RUNTIME} is provisioned" in out, out[-3000:]
    assert "next: epycctl quickstart --engine llama.cpp" in out, out[-3000:]


def test_readme_command_one_with_llama_cpp_serves_the_gguf(install: Boot) -> None:
    done = install.one("quickstart")
    assert done["rc"] == 0, done["stdout"][-3000:] + done["stderr"][-3000:] + journal_tail(install)
    out = done["stdout"]
    assert "runtime: host (llama.cpp" in out and "Plan for endpoint default" in out, out[-3000:]
    assert f"{NAME} is ready." in out, out[-3000:]
    written = install.one("endpoint_file")["text"]
    assert 'engine = "llama.cpp"' in written and f'model = "{GGUF}"' in written, written
    unit = install.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(install.one("status")["status"], NAME)["state"] == "ready"
    chat = install.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] == 1 and chat["reply"]["completion_tokens"] > 0, chat
    timing = install.one("timing")
    print(
        f"\ne2e-llama: bare rootfs to ready {timing['fresh_to_ready_s']} s (install.sh --engine "
        f"llama.cpp {timing['install_s']} s, quickstart {timing['quickstart_s']} s); "
        f"boot {install.seconds} s"
    )


def test_llama_server_is_pinned_bound_and_locked(install: Boot) -> None:
    server = install.one("server")
    assert server["pid"] is not None, journal_tail(install)
    cores = expected_cpus()
    argv = server["argv"]
    assert argv[0] == f"{RUNTIME}/bin/llama-server", argv
    assert argv[argv.index("--threads") + 1] == str(len(cores)), argv
    assert argv[argv.index("--threads-batch") + 1] == str(len(cores)), argv
    assert parse_cpulist(server["cpus"]) == cores, server
    assert server["numa_policy"].split()[1].startswith("bind:"), server["numa_policy"]
    assert server["uid"] != "0", "llama-server runs as root"
    assert server["locked_kib"] > 0, "the weights are not locked (--load-mode mmap+mlock)"
    text = install.one("unit_file")["text"]
    assert f"\nCPUAffinity={format_cpulist(cores)}\n" in text, text
    bound = server["numa_policy"].split()[1].removeprefix("bind:")
    assert f"\nNUMAPolicy=bind\nNUMAMask={bound}\n" in text, text


def test_reboot_brings_it_back_ready(machine: Machine, install: Boot) -> None:
    install.assert_clean()
    reboot = machine.boot("reboot")
    reboot.assert_clean()
    unit = reboot.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(reboot.one("status")["status"], NAME)["state"] == "ready"
    chat = reboot.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] == 1, chat
    assert reboot.one("server")["pid"] is not None
