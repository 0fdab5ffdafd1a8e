"""The admin's side of the embedded-runtime end-to-end test (tests/e2e/test_runtime.py), run
inside the booted machine by the same oneshot driver unit as tests/e2e/inside.py, whose
helpers it reuses (copied beside it into /opt/e2e). The machine is a bare Debian (minbase,
systemd, python3): no venv module, no Python headers, no compiler, no numactl, no container
engine, no network. Its apt source is a local repository (APT_REPO), pip's are a local PyPI
mirror (PYPI) and a local copy of PyTorch's CPU index (TORCH_INDEX), as an admin's mirrors.
One phase per boot:

install  what the machine lacks; README command 1 in its two steps (`install.sh --runtime`,
         which installs the prerequisites from apt, then `epycctl quickstart --yes`): first
         offline without a local model (refused, nothing written), then with the local tiny
         model -> compiled, ready, the hand-off, a chat, status; the recipe's rerun and its
         messages for an unreachable PyPI and an unreachable PyTorch index (its default)
reboot   back with no new approval: status ready, a chat; then the chat endpoint removed
         and its file deleted (this host holds one endpoint), and an embedding model
         quickstarted (the tiny BERT): ready, its hand-off's URL answering an embeddings request
embedder_reboot  the embedder back with no new approval: status ready, an embedding
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import inside
from inside import (
    CONFIG,
    PRODUCT_USER,
    PhaseFailed,
    give_model_to_group,
    journal,
    must,
    record,
    run,
    show,
    use_identity_root,
    wait_for_daemon,
    wait_until,
)

APT_REPO = "/var/cache/e2e-apt"
PYPI = "/var/cache/e2e-pypi"
TORCH_INDEX = "/var/cache/e2e-torch"
PREFIX = Path("/opt/epyc-llm")
RUNTIME = PREFIX / "runtime"
RECIPE = PREFIX / "share" / "epyc-llm" / "vllm-runtime.sh"
NAME = "default"
UNIT = f"epyc-llm-{NAME}.service"
EMBEDDER = "emb"
EMBEDDER_UNIT = f"epyc-llm-{EMBEDDER}.service"
ENDPOINT_FILE = Path("/etc/epyc-llm") / f"{NAME}.toml"
inside.UNIT = UNIT
inside.ENV |= {
    "PIP_INDEX_URL": f"file://{PYPI}",
    "PIP_EXTRA_INDEX_URL": f"file://{TORCH_INDEX}",
    "PIP_CACHE_DIR": "/root/.cache/pip",
}
PYTHON_H = (
    "import os, sysconfig; print(os.path.isfile(sysconfig.get_path('include') + '/Python.h'))"
)

CHAT = """
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="none", timeout=60, max_retries=0)
model = client.models.list().data[0].id
reply = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Say hello"}],
    temperature=0, max_tokens=8,
)
print(json.dumps({"choices": len(reply.choices), "content": reply.choices[0].message.content,
                  "model": reply.model}))
"""


EMBED = """
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="none", timeout=60, max_retries=0)
model = client.models.list().data[0].id
reply = client.embeddings.create(model=model, input=["Say hello", "Say goodbye"])
print(json.dumps({"vectors": len(reply.data), "width": len(reply.data[0].embedding),
                  "model": reply.model}))
"""


def status(check: str, name: str = NAME) -> dict[str, Any] | None:
    done = run("epycctl", "status", name, "--json", timeout=180)
    data = json.loads(done["stdout"]) if done["rc"] == 0 and done["stdout"].strip() else None
    record(check, rc=done["rc"], status=data, stderr=done["stderr"][-3000:])
    return data


def url_of(data: dict[str, Any] | None, name: str = NAME) -> str | None:
    """The endpoint's base URL (with /v1), as `status --json` hands it off."""
    entries = (data or {}).get("endpoints", [data or {}])
    return next((e.get("url") for e in entries if e.get("name") == name), None)


def embed(check: str, url: str | None) -> None:
    """An embeddings request through the hand-off's URL, by the OpenAI client."""
    if url is None:
        record(check, rc=None, reply=None, stderr="no URL in status")
        return
    done = run(str(RUNTIME / "bin" / "python"), "-c", EMBED, url, timeout=120)
    reply = json.loads(done["stdout"].strip().splitlines()[-1]) if done["rc"] == 0 else None
    record(check, rc=done["rc"], reply=reply, url=url, stderr=done["stderr"][-3000:])


def chat(check: str, url: str | None) -> None:
    if url is None:
        record(check, rc=None, reply=None, stderr="no URL in status")
        return
    done = run(str(RUNTIME / "bin" / "python"), "-c", CHAT, url, timeout=120)
    reply = json.loads(done["stdout"].strip().splitlines()[-1]) if done["rc"] == 0 else None
    record(check, rc=done["rc"], reply=reply, url=url, stderr=done["stderr"][-3000:])


def compile_prerequisites() -> dict[str, Any]:
    """What vLLM's compile step and install.sh's venv need, as the machine has them now."""
    return {
        "gxx": run("sh", "-c", "command -v g++")["stdout"].strip(),
        "python_h": run("python3", "-c", PYTHON_H)["stdout"].strip() == "True",
        "ensurepip": run("python3", "-c", "import ensurepip")["rc"] == 0,
        "numactl": run("sh", "-c", "command -v numactl")["stdout"].strip(),
    }


def fresh_machine() -> None:
    """What this fresh machine lacks, before anything is installed."""
    tools = ("g++", "c++", "podman", "docker", "vllm", "epycctl", "pip", "pip3")
    found = {tool: run("sh", "-c", f"command -v {tool}")["stdout"].strip() for tool in tools}
    network = run("getent", "hosts", "pypi.org")["rc"]
    record("fresh", found=found, pypi_resolves=network == 0, **compile_prerequisites())


def compiled_kernels() -> int:
    """The C++ kernels inductor built for the endpoints (their caches are under /var/cache)."""
    found = run("find", "/var/cache", "-path", "*inductor*", "-name", "*.so", timeout=60)
    return len(found["stdout"].split())


def quickstart(check: str, *args: str) -> dict[str, Any]:
    done: dict[str, Any] = run("epycctl", "quickstart", "--yes", *args, timeout=1500, check=check)
    return done


def phase_install() -> None:
    record("pid1", comm=Path("/proc/1/comm").read_text().strip())
    fresh_machine()
    started = time.monotonic()
    must("install", "/src/packaging/install.sh", "--runtime", timeout=1500)
    installed = time.monotonic()
    give_model_to_group()
    use_identity_root()
    record("runtime_size", du=run("du", "-sb", str(RUNTIME))["stdout"].split()[0])
    record("runtime_stamp", text=(RUNTIME / ".epyc-stamp").read_text().strip())
    record("prerequisites", **compile_prerequisites())

    quickstart("quickstart_offline")
    record("after_offline", endpoint_file=ENDPOINT_FILE.exists(), unit=show(UNIT, "LoadState"))
    done = quickstart("quickstart", "--model", CONFIG["model_dir"], *CONFIG["consent_args"])
    record(
        "timing",
        install_s=round(installed - started, 1),
        quickstart_s=done["seconds"],
        fresh_to_ready_s=round(time.monotonic() - started, 1),
    )
    if done["rc"] != 0:
        journal("journal_serving", UNIT)
        raise PhaseFailed(f"quickstart failed (exit {done['rc']}): {done['stderr'][-2000:]}")
    record("unit", **show(UNIT))
    record("endpoint_file", text=ENDPOINT_FILE.read_text())
    chat("chat", url_of(status("status")))
    record("compiled", kernels=compiled_kernels())
    run(str(RECIPE), str(RUNTIME), timeout=120, check="recipe_again")
    mirrors = dict(inside.ENV)
    inside.ENV["PIP_INDEX_URL"] = "https://pypi.org/simple"
    run(str(RECIPE), "/opt/unreachable-runtime", timeout=120, check="recipe_unreachable")
    inside.ENV = {k: v for k, v in mirrors.items() if k != "PIP_EXTRA_INDEX_URL"}
    run(str(RECIPE), "/opt/unreachable-runtime", timeout=120, check="recipe_torch_unreachable")
    inside.ENV = mirrors
    record("unreachable_left", exists=Path("/opt/unreachable-runtime").exists())


def phase_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_until(
        "the endpoint unit settles",
        lambda: show(UNIT, "ActiveState")["ActiveState"] in {"active", "failed"},
        600,
    )
    record("unit", **show(UNIT))
    chat("chat", url_of(status("status")))
    quickstart_embedder()


def quickstart_embedder() -> None:
    """The chat endpoint removed (the host's one socket holds one endpoint), then README
    command 1 with the tiny BERT embedder: ready, and an embedding through its hand-off."""
    must("remove", "epycctl", "remove", NAME, "--yes", timeout=300)
    must("delete_endpoint_file", "rm", str(ENDPOINT_FILE), timeout=30)
    embedder = CONFIG["embedder_dir"]
    must("embedder_group", "chgrp", "-R", PRODUCT_USER, embedder, timeout=60)
    must("embedder_mode", "chmod", "-R", "u+rwX,g+rX,g-w,o-rwx", embedder, timeout=60)
    args = ("--model", embedder, "--name", EMBEDDER, *CONFIG["consent_args"])
    done = quickstart("quickstart_embedder", *args)
    if done["rc"] != 0:
        journal("journal_embedder", EMBEDDER_UNIT)
        raise PhaseFailed(f"quickstart of the embedder failed: {done['stderr'][-2000:]}")
    record("embedder_unit", **show(EMBEDDER_UNIT))
    embed("embed", url_of(status("embedder_status", EMBEDDER), EMBEDDER))


def phase_embedder_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_until(
        "the embedder unit settles",
        lambda: show(EMBEDDER_UNIT, "ActiveState")["ActiveState"] in {"active", "failed"},
        600,
    )
    record("embedder_unit", **show(EMBEDDER_UNIT))
    embed("embed", url_of(status("embedder_status", EMBEDDER), EMBEDDER))


PHASES = {
    "install": phase_install,
    "reboot": phase_reboot,
    "embedder_reboot": phase_embedder_reboot,
}

if __name__ == "__main__":
    inside.PHASES = PHASES
    inside.main()
