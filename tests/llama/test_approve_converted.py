"""approve of an `engine = "auto"` endpoint whose model is safetensors, end to end with real
parts: the real planner chooses llama.cpp, approve converts the tiny SentencePiece Llama with
the pinned source's converter (under the vLLM venv's torch), plans again on the converted
file, installs its units; the real llama-server then serves a chat from that file. On a fake
Genoa host root; systemd stays out (--no-start)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from epycd.approval.record import load_approval
from epycd.engines.llama_cpp.plan.converted import read_record, refused_path
from epycd.engines.llama_cpp.plan.model import LlamaServer
from tests.approval.conftest import ApprovalSandbox, env
from tests.health.realvllm import CACHE, VENV, free_port
from tests.llama.realllama import SERVER, healthy, llama_server
from tests.llama.test_convert import tiny_llama

__all__ = ["env"]


def real_epycctl(env: ApprovalSandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return env.epycctl(
        *args,
        module="epycd",
        env={
            "EPYCD_LLAMA_RUNTIME_DIR": str(SERVER),
            "EPYCD_RUNTIME_DIR": str(VENV),
            "EPYCD_LLAMA_CONVERTED_DIR": str(env.tmp / "converted"),
        },
    )


def test_approve_converts_then_installs_a_plan_on_the_converted_file(
    env: ApprovalSandbox,
) -> None:
    llama_server()
    model = tiny_llama()
    endpoint = env.settings.config_dir / "chat.toml"
    endpoint.write_text(f'engine = "auto"\nmodel = "{model}"\nprofile = "latency"\n')

    planned = real_epycctl(env, "plan", "chat", "--json")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    waiting = json.loads(planned.stdout)
    assert waiting["prerequisite"]["engine"] == "llama.cpp"
    output = Path(waiting["prerequisite"]["output"])
    assert not output.exists()

    done = real_epycctl(env, "approve", "chat", "--yes", "--no-start")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "convert: " in done.stderr and "convert_hf_to_gguf.py" in done.stderr
    record = read_record(output)
    assert record is not None and record.quantize == "q8_0"
    approval = load_approval(env.settings, "chat")
    assert approval is not None
    decided = approval.plan.decisions
    assert decided.engine == "llama.cpp" and decided.model == str(model)
    choice = decided.engine_choice
    assert choice is not None and choice.asked == "auto" and choice.converted is not None
    assert choice.converted.sha256 == record.sha256
    server = decided.first
    assert isinstance(server, LlamaServer)
    assert server.invocation.model_path == os.path.realpath(output)
    unit = Path(approval.units["epyc-llm-chat.service"].path).read_text()
    assert str(output) in unit

    again = real_epycctl(env, "plan", "chat", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["fingerprint"] == approval.fingerprint

    # the approved server's own argv, on a free loopback port and one thread, answers a chat
    argv = shlex.split(unit.split("\nExecStart=", 1)[1].split("\n", 1)[0])
    words = argv[argv.index(str(SERVER / "bin" / "llama-server")) :]
    port = free_port()
    words[words.index("--port") + 1] = str(port)
    words[words.index("--threads") + 1] = "1"
    words = [w for w in words if w != "--mlock"]
    with subprocess.Popen(words, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as served:
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while not healthy(url) and served.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            answer = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": str(model), "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 3},
                timeout=30,
            )  # fmt: skip
        finally:
            served.terminate()
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 3


def test_a_model_the_converter_refuses_is_served_by_vllm_after_approve_says_why(
    env: ApprovalSandbox,
) -> None:
    """The tiny Qwen2's byte-level BPE tokenizer was trained here: llama.cpp's converter
    does not know its pre-tokenizer and stops. approve records that and plans again, so
    auto's next choice (vLLM) is the plan shown and approved; an endpoint that asks for
    llama.cpp by name is refused at plan time with the converter's reason, converting
    nothing again."""
    llama_server()
    model = CACHE / "tiny-model"
    endpoint = env.settings.config_dir / "chat.toml"
    endpoint.write_text(f'engine = "auto"\nmodel = "{model}"\nprofile = "latency"\n')
    waiting = json.loads(real_epycctl(env, "plan", "chat", "--json").stdout)
    output = Path(waiting["prerequisite"]["output"])

    # vLLM on this fake Genoa runs the stock path, which asks for consent
    done = real_epycctl(env, "approve", "chat", "--yes", "--no-start", "--accept-unvalidated")
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "does not know this model's tokenizer" in said and "planned again" in said
    assert not output.exists() and list(output.parent.glob("*.part")) == []
    refused = refused_path(output)
    assert refused.is_file()
    approval = load_approval(env.settings, "chat")
    assert approval is not None and approval.plan.decisions.engine == "vllm"
    choice = approval.plan.decisions.engine_choice
    assert choice is not None
    assert any(r.startswith("not llama.cpp:") and "pre-tokenizer" in r for r in choice.reasons)

    named = env.settings.config_dir / "named.toml"
    named.write_text(f'engine = "llama.cpp"\nmodel = "{model}"\n')
    before = refused.stat().st_mtime_ns
    planned = real_epycctl(env, "plan", "named")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert "converter failed on" in planned.stdout + planned.stderr
    assert str(refused) in planned.stdout + planned.stderr
    assert refused.stat().st_mtime_ns == before


def states(env: ApprovalSandbox) -> list[tuple[str, str]]:
    done = real_epycctl(env, "status", "--json")
    return [(s["name"], s["state"]) for s in json.loads(done.stdout)["endpoints"]]


def test_a_source_changed_after_approval_is_changed_needs_approval_with_the_reason(
    env: ApprovalSandbox,
) -> None:
    """The converted file stands for its source as it was converted: the source's
    config.json rewritten after approve makes the approved endpoint changed-needs-approval
    in status, naming the file; approve converts it again and status says approved."""
    llama_server()
    model = env.tmp / "models" / "tiny-llama"
    shutil.copytree(tiny_llama(), model)
    endpoint = env.settings.config_dir / "chat.toml"
    endpoint.write_text(f'engine = "llama.cpp"\nmodel = "{model}"\n')
    done = real_epycctl(env, "approve", "chat", "--yes", "--no-start")
    assert done.returncode == 0, done.stdout + done.stderr
    assert states(env) == [("chat", "approved")]

    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rope_theta": 20000.0}))
    status = json.loads(real_epycctl(env, "status", "--json").stdout)["endpoints"]
    assert [(s["name"], s["state"]) for s in status] == [("chat", "changed-needs-approval")]
    reasons = " ".join([status[0]["reason"], *status[0]["reasons"]])
    assert "config.json was rewritten" in reasons and "approve chat" in reasons, reasons

    again = real_epycctl(env, "approve", "chat", "--yes", "--no-start")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "convert_hf_to_gguf.py" in again.stderr, "converted again"
    assert states(env) == [("chat", "approved")]
