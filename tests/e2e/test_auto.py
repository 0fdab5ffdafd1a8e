"""README command 1 without choosing an engine, from a bare host: `packaging/install.sh
--runtime --engine llama.cpp && epycctl quickstart --model DIR --yes` with a safetensors model
on real systemd (PID 1 in systemd-nspawn), in a fresh copy of the bare Debian 12 of
tests/tools/bare_host.sh (no venv module, no compiler, no network; apt from a local repository,
pip from the local PyPI mirror and PyTorch CPU index of tests/e2e/test_runtime.py).

quickstart writes `engine = "auto"`; the plan chooses llama.cpp for the default profile
(balanced), so the model is converted to GGUF first, by the pinned llama.cpp source's own
converter that the runtime recipe installs, under the vLLM runtime's Python; then it is
approved, served, answers a chat, and comes back after a reboot with no new approval.

One part is given, not rebuilt: llama-server itself, as in tests/e2e/test_llama.py (the
recipe's finished folder from tests/tools/llama_server.sh: its binaries, its stamp and the
source it keeps, without the converter, which the recipe then installs). The model is the tiny
SentencePiece Llama of tests/tools/tiny_llama.py. Two boots, each one phase of
tests/e2e/inside_auto.py (install, reboot).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import (
    MLOCK_AS_ON_A_HOST,
    Boot,
    Machine,
    clean_copy,
    drive_with,
    endpoint,
    fresh_copy,
    kept_or_removed,
    offline_apt,
    require_parts,
)
from tests.e2e.test_llama import machine_config as llama_machine_config
from tests.e2e.test_runtime import APT_REPO, BARE_ROOTFS, PYPI, TORCH_INDEX, journal_tail
from tests.llama.realllama import SERVER, llama_server
from tests.llama.test_convert import tiny_llama
from tests.machine import write_identity_root

pytestmark = pytest.mark.e2e

HINT = "run tests/bootstrap.sh (bare_host.sh, bare_indexes.sh, llama_server.sh, tiny_llama.sh)"
PHASES = ("install", "reboot")
NAME = "default"
MODEL_DIR = "/srv/models/tiny-llama"
RUNTIME = "/opt/epyc-llm/llama-runtime"
CONVERTED = "/var/cache/epyc-llm-converted"


def machine_config() -> dict[str, Any]:
    """What inside_auto.py (and the inside.py and inside_llama.py it reuses) read from
    /results/config.json: inside_llama.py's keys, this machine's model and mirrors."""
    return llama_machine_config() | {
        "model_dir": MODEL_DIR,
        "torch_index": "/var/cache/e2e-torch",
    }


def write_machine(root: Path, config: dict[str, Any]) -> None:
    drive_with(root, "inside_auto.py")
    shutil.copy2(Path(__file__).with_name("inside_llama.py"), root / "opt" / "e2e")
    shutil.copytree(tiny_llama(), root / MODEL_DIR.lstrip("/"))
    runtime = root / RUNTIME.lstrip("/")
    runtime.mkdir(parents=True)
    shutil.copytree(SERVER / "bin", runtime / "bin")
    shutil.copytree(SERVER / ".build" / "download", runtime / ".build" / "download")
    shutil.copy2(SERVER / ".epyc-stamp", runtime / ".epyc-stamp")
    offline_apt(root)
    if config["identity_root"]:
        write_identity_root(root / str(config["identity_root"]).lstrip("/"))


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    require_parts(BARE_ROOTFS, APT_REPO, PYPI, TORCH_INDEX, hint=HINT)
    llama_server()
    work = tmp_path_factory.mktemp("e2e-auto")
    root, results = fresh_copy(BARE_ROOTFS, work)
    src = work / "src"
    clean_copy(src)
    config = machine_config()
    write_machine(root, config)
    (results / "config.json").write_text(json.dumps(config, indent=2))
    binds = [
        "--private-network",
        *MLOCK_AS_ON_A_HOST,
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


@pytest.fixture(scope="module")
def reboot(machine: Machine, install: Boot) -> Boot:
    return machine.boot("reboot")


def served_file(boot: Boot) -> str:
    """The GGUF file the running llama-server serves (its -m)."""
    argv = boot.one("server")["argv"]
    assert argv is not None, boot.one("server")
    return str(argv[argv.index("-m") + 1] if "-m" in argv else argv[argv.index("--model") + 1])


def test_install_provisions_both_runtimes_and_the_converter(install: Boot) -> None:
    assert install.one("pid1")["comm"] == "systemd"
    fresh = install.one("fresh")
    assert not fresh["ensurepip"] and not fresh["found"]["g++"], f"not a bare host: {fresh}"
    done = install.one("install")
    assert done["rc"] == 0, done["stdout"][-2000:] + done["stderr"][-3000:]
    out = done["stdout"]
    assert "ready: /opt/epyc-llm/runtime" in out, out[-3000:]
    assert f"llama-runtime: {RUNTIME} is provisioned" in out, out[-3000:]
    assert f"llama-runtime: converter: {RUNTIME}/converter" in out, out[-3000:]


def test_quickstart_without_an_engine_converts_and_serves_with_llama_cpp(install: Boot) -> None:
    done = install.one("quickstart")
    assert done["rc"] == 0, done["stdout"][-3000:] + done["stderr"][-3000:] + journal_tail(install)
    out = done["stdout"]
    assert 'runtime: chosen by the plan (engine = "auto") from: vllm host; llama.cpp host' in out
    assert "convert_hf_to_gguf.py" in out, out[-3000:]  # the conversion's progress
    assert "Engine" in out and 'llama.cpp (engine = "auto")' in out, out[-3000:]
    assert f"{NAME} is ready." in out, out[-3000:]
    written = install.one("endpoint_file")["text"]
    assert 'engine = "auto"' in written and f'model = "{MODEL_DIR}"' in written, written
    converted = install.one("converted")
    ggufs = [f for f in converted["files"] if f.endswith("-Q8_0.gguf")]
    assert len(ggufs) == 1, converted
    assert not any(f.endswith(".part") for f in converted["files"]), converted
    (record,) = converted["records"].values()
    assert record["bytes"] == converted["files"][ggufs[0]]["bytes"], converted
    assert served_file(install) == ggufs[0]
    unit = install.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(install.one("status")["status"], NAME)["state"] == "ready"
    chat = install.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] == 1 and chat["reply"]["completion_tokens"] > 0, chat
    timing = install.one("timing")
    print(
        f"\ne2e-auto: bare rootfs to ready {timing['fresh_to_ready_s']} s (install.sh --runtime "
        f"--engine llama.cpp {timing['install_s']} s, quickstart with the conversion "
        f"{timing['quickstart_s']} s)"
    )


def test_reboot_serves_the_converted_file_again_without_a_new_approval(
    install: Boot, reboot: Boot
) -> None:
    unit = reboot.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(reboot.one("status")["status"], NAME)["state"] == "ready"
    chat = reboot.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["completion_tokens"] > 0, chat
    assert served_file(reboot) == served_file(install)
    assert reboot.one("converted")["files"] == install.one("converted")["files"]
