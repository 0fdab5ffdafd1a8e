"""llama.cpp endpoints in the plan: the endpoint file's keys, the route to a llama-server, the
fit on the placed socket (rule 9) and rule 10's decisions, the unit that runs it under the
supervisor, and what the plan refuses. The llama-server here answers `--version` with a
version of the test's choosing, and the plan's memory pass for the tests' own GGUF files (which
llama.cpp cannot load) with the measured formulas (tests/plan/memory_standin.py); the real
server's own tests are tests/llama."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.engines.llama_cpp.plan.decide import CACHE_RAM_MAX_MIB, PROFILE_SLOTS, cache_ram_mib
from epycd.engines.llama_cpp.plan.model import LlamaServer, llama_server_argv
from epycd.engines.llama_cpp.plan.planner import probe_llama_server
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts, ServerFacts
from epycd.plan.endpoint import Plan
from epycd.plan.pipeline.result import EndpointResult
from tests.model.gguf_files import GgufShape, write_gguf
from tests.plan.conftest import PlanWorkspace
from tests.secrets import root_folder, write_secret

VERSION = "0.5.0-dev (build 1, commit 0c1e570)"


def fake_llama_server(folder: Path, version: str = VERSION) -> Path:
    """An executable that answers `--version` as llama-server does (on stderr), with a version
    of the test's choosing, and the plan's memory pass (every other call) with the measured
    formulas' table for the tests' own GGUF files, which llama.cpp cannot load
    (tests/plan/memory_standin.py)."""
    standin = shlex.quote(str(Path(__file__).with_name("memory_standin.py")))
    python = shlex.quote(sys.executable)
    folder.mkdir(parents=True, exist_ok=True)
    server = folder / "llama-server"
    server.write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then\n  echo "version: {version}" >&2\n'
        f'  echo "built with GNU" >&2\n  exit 0\nfi\n'
        f'exec {python} {standin} "$@"\n'
    )
    server.chmod(0o755)
    return server


def words_after(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def gguf_model(tmp_path: Path, **changes: object) -> Path:
    shape = GgufShape(layers=2, embedding=128, heads=4, kv_heads=2, feed_forward=512, vocab=300)
    for key, value in changes.items():
        setattr(shape, key, value)
    path = tmp_path / "models" / "tiny-q8_0.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(path, shape)
    return path


class LlamaWorkspace:
    def __init__(self, ws: PlanWorkspace, host: HostFacts) -> None:
        self.ws = ws
        self.server = fake_llama_server(ws.tmp / "llama" / "bin")
        self.gguf = gguf_model(ws.tmp)
        self.host = host

    def endpoint(self, name: str, text: str = "") -> Path:
        head = f'engine = "llama.cpp"\nllama_server = "{self.server}"\n'
        if "model =" not in text:
            head += f'model = "{self.gguf}"\n'
        return self.ws.endpoint(name, head + text)

    def plan(self, **kwargs: object) -> dict[str, EndpointResult]:
        return self.ws.plan(self.host, **kwargs)

    def planned(self, name: str) -> tuple[Plan, LlamaServer]:
        result = self.plan()[name]
        assert result.plan is not None, [e.text for e in result.errors]
        decisions = result.plan.decisions.first
        assert isinstance(decisions, LlamaServer), decisions.kind
        return result.plan, decisions


@pytest.fixture
def lw(ws: PlanWorkspace, host_of: Callable[..., HostFacts]) -> LlamaWorkspace:
    return LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))


def test_a_llama_endpoint_is_pinned_to_one_socket_with_one_thread_per_core(
    lw: LlamaWorkspace,
) -> None:
    lw.endpoint("chat")
    _, decided = lw.planned("chat")
    cores = parse_cpulist(decided.cpus)
    sock = next(s for s in lw.host.socket_topology if s.socket == decided.socket)
    assert cores == parse_cpulist(sock.physical_cpus)
    assert decided.numa_nodes == sorted(sock.numa_nodes)
    server = decided.invocation
    assert server.threads == len(cores)
    assert server.slots == PROFILE_SLOTS["balanced"]
    assert server.context == 4096  # the GGUF's training context fits, one pool shared
    assert words_after(decided.server_args, "--ctx-size") == "4096"
    assert "--kv-unified" in decided.server_args
    assert decided.fit.memory.cells == 4096, "the fit counts the one shared pool"
    assert decided.server_args == llama_server_argv(server)
    words = decided.server_args
    assert words[words.index("--threads") + 1] == words[words.index("--threads-batch") + 1]
    assert words[words.index("--fit") + 1] == "off"
    assert decided.llama_version == VERSION
    assert decided.dtype == "Q8_0"
    assert decided.fit.fits


def test_speculative_ngram_is_opt_in_and_leaves_other_plans_as_they_were(
    lw: LlamaWorkspace,
) -> None:
    lw.endpoint("plain", 'served_model_name = "chat"\nport = 8100\n')
    lw.endpoint("spec", 'served_model_name = "chat"\nport = 8101\nspeculative = "ngram"\n')
    plain_plan, plain = lw.planned("plain")
    _, spec = lw.planned("spec")
    assert "--spec-type" not in plain.server_args, "no profile turns it on"
    assert words_after(spec.server_args, "--spec-type") == "ngram-mod"
    same_port = [w if w != "8101" else "8100" for w in spec.server_args[:-2]]
    assert same_port == plain.server_args, "the same server, with two words more"
    recorded = plain_plan.model_dump(mode="json", by_alias=True)["decisions"]
    assert "speculative" not in recorded["servers"][0]["invocation"], "keys as before"
    assert spec.model_dump(mode="json")["invocation"]["speculative"] == "ngram"


def test_the_unit_runs_llama_server_under_the_supervisor_with_the_key_as_a_credential(
    host_of: Callable[..., HostFacts],
) -> None:
    with root_folder() as folder:
        lw = LlamaWorkspace(PlanWorkspace(folder), host_of("genoa-9654-2s-nps1"))
        key = write_secret(folder / "secrets" / "chat.key", "sk-local-secret\n")
        lw.endpoint("chat", f'api_key_file = "{key}"\n')
        plan, decided = lw.planned("chat")
    assert_key_as_credential(plan, decided, lw, key)


def assert_key_as_credential(
    plan: Plan, decided: LlamaServer, lw: LlamaWorkspace, key: Path
) -> None:
    text = plan.units["epyc-llm-chat.service"]
    start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    supervisor, server = start.split(" -- ", 1)
    assert "-m epycd.supervisor" in supervisor and "--api-key-env LLAMA_API_KEY" in supervisor
    assert server.split()[0] == str(lw.server)
    assert server.split()[1:] == decided.server_args
    assert f"LoadCredential=api_key:{key}" in text
    assert "sk-local-secret" not in text and "sk-local-secret" not in plan.model_dump_json()
    assert f"\nCPUAffinity={decided.cpus}\nNUMAPolicy=bind\nNUMAMask=" in text
    assert "\nUser=epyc-llm\n" in text and "\nLimitMEMLOCK=infinity\n" in text
    assert "VLLM_CACHE_ROOT" not in text, "llama-server compiles nothing: HOME only"


def test_the_slots_follow_the_profile_or_the_file(lw: LlamaWorkspace) -> None:
    lw.endpoint("one", 'profile = "latency"\nsocket = 0\n')
    lw.endpoint("two", "max_num_seqs = 3\nmax_model_len = 1000\nsocket = 1\n")
    results = lw.plan()
    one, two = (results[name].plan for name in ("one", "two"))
    assert one is not None and two is not None
    first, second = one.decisions.first, two.decisions.first
    assert isinstance(first, LlamaServer) and isinstance(second, LlamaServer)
    assert first.invocation.slots == PROFILE_SLOTS["latency"]
    assert (second.invocation.slots, second.invocation.context) == (3, 1000)
    assert first.socket != second.socket, "each on its own socket"
    assert one.decisions.port != two.decisions.port


def test_a_context_the_file_does_not_give_is_cut_to_what_fits(
    lw: LlamaWorkspace, host_of: Callable[..., HostFacts]
) -> None:
    """A 2M-token training context does not fit a VM's 24 GiB: the plan serves the most
    tokens that do, says so, and a file that asks for 2M is refused."""
    lw.host = host_of("vm-zen5-24g")
    lw.gguf = gguf_model(lw.ws.tmp, context=2_097_152, kv_heads=4, layers=32)
    lw.endpoint("auto")
    result = lw.plan()["auto"]
    assert result.plan is not None, [e.text for e in result.errors]
    decided = result.plan.decisions.first
    assert isinstance(decided, LlamaServer)
    assert decided.fit.fits and 256 <= decided.fit.context < 2_097_152
    assert decided.fit.context % 256 == 0
    assert any("does not fit" in warning for warning in decided.warnings), decided.warnings
    lw.endpoint("auto", "max_model_len = 2097152\n")
    refused = lw.plan()["auto"]
    assert refused.plan is None
    error = refused.errors[0]
    assert "does not fit" in error.message and error.key == "max_model_len", error.text
    assert error.fix and "max_model_len" in error.fix, error.text


def test_the_prompt_cache_takes_half_of_what_the_fit_leaves(lw: LlamaWorkspace) -> None:
    lw.endpoint("chat")
    _, decided = lw.planned("chat")
    fit = decided.fit
    assert decided.invocation.cache_ram_mib == cache_ram_mib(fit)
    spare_mib = (fit.available_gb - fit.required_gb) * 1024
    assert cache_ram_mib(fit) == min(int(spare_mib / 2), CACHE_RAM_MAX_MIB)
    tight = fit.model_copy(update={"available_gb": fit.required_gb + 1})
    assert cache_ram_mib(tight) == 512
    assert cache_ram_mib(fit.model_copy(update={"available_gb": fit.required_gb})) == 0


def test_plan_json_names_the_engine_and_its_server(lw: LlamaWorkspace) -> None:
    from epycd.cli.plan import plan_json

    lw.endpoint("chat")
    data = plan_json(lw.plan()["chat"])
    assert (data["kind"], data["engine"], data["device"]) == ("llama", "llama.cpp", "cpu")
    assert data["llama_server"] == str(lw.server) and data["llama_version"] == VERSION
    assert data["gguf_file"] == lw.gguf.name
    assert data["max_num_seqs"] == PROFILE_SLOTS["balanced"] and data["max_model_len"] == 4096
    assert data["memory"]["fits"] is True and data["vllm_version"] is None
    json.dumps(data)


def errors_of(result: EndpointResult) -> dict[str, str]:
    return {error.key or "": error.message for error in result.errors}


def test_keys_of_the_other_engine_are_refused_with_the_fix(lw: LlamaWorkspace) -> None:
    lw.endpoint(
        "chat",
        'dtype = "bfloat16"\nextra_args = ["--foo"]\nruntime = "podman"\nthroughput_flags = true\n',
    )
    lw.ws.endpoint("plain", 'gguf_file = "x.gguf"\nllama_server = "/usr/bin/llama-server"\n')
    results = lw.plan()
    chat = errors_of(results["chat"])
    assert set(chat) == {"dtype", "extra_args", "runtime", "throughput_flags"}, chat
    assert all("llama.cpp endpoint" in message for message in chat.values()), chat
    plain = errors_of(results["plain"])
    assert set(plain) == {"gguf_file", "llama_server"}, plain
    fixes = {error.fix for error in results["plain"].errors}
    assert all(fix and 'engine = "llama.cpp"' in fix for fix in fixes), fixes


@pytest.mark.parametrize("bad", ["../x.gguf", "a/../../x.gguf", "/etc/x.gguf", "model.bin"])
def test_a_gguf_file_outside_the_repository_is_refused(lw: LlamaWorkspace, bad: str) -> None:
    lw.endpoint("chat", f'gguf_file = "{bad}"\n')
    assert "gguf_file" in errors_of(lw.plan()["chat"])


def test_without_a_llama_server_it_is_refused_with_the_install_step(lw: LlamaWorkspace) -> None:
    lw.ws.endpoint("chat", f'engine = "llama.cpp"\nmodel = "{lw.gguf}"\n')
    result = lw.plan()["chat"]
    assert result.plan is None
    error = result.errors[0]
    assert error.exit_code == 1 and error.key == "engine", error.text
    assert error.fix and "install.sh --engine llama.cpp" in error.fix
    broken = lw.ws.tmp / "not-a-server"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    lw.ws.endpoint(
        "chat", f'engine = "llama.cpp"\nmodel = "{lw.gguf}"\nllama_server = "{broken}"\n'
    )
    bad = lw.plan()["chat"].errors[0]
    assert bad.exit_code == 2 and bad.key == "llama_server", bad.text
    assert probe_llama_server(str(lw.server)) == ServerFacts(
        path=str(lw.server), present=True, version=VERSION
    )


def test_a_llama_server_older_than_the_plans_words_is_refused_naming_it(
    lw: LlamaWorkspace,
) -> None:
    """A llama-server from before `--fit` answers the memory pass as llama.cpp's argument
    parser does (common/arg.cpp: `error: invalid argument: --fit`, exit 1): refused at the
    `llama_server` key, the server to change, not the model; asked once, not as a file that
    lost its log; the other endpoint plans."""
    old = lw.ws.tmp / "old" / "llama-server"
    old.parent.mkdir()
    asked = lw.ws.tmp / "asked"
    old.write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 4000 (0123abc)" >&2; exit 0; fi\n'
        f'echo x >> {asked}\necho "error: invalid argument: --fit" >&2\nexit 1\n'
    )
    old.chmod(0o755)
    lw.ws.endpoint("old", f'engine = "llama.cpp"\nmodel = "{lw.gguf}"\nllama_server = "{old}"\n')
    lw.endpoint("chat")
    results = lw.plan()
    [problem] = results["old"].errors
    assert problem.key == "llama_server" and problem.exit_code == 1, problem.text
    assert f"llama-server {old} does not take --fit" in problem.message, problem.text
    assert problem.fix and "remove llama_server" in problem.fix, problem.text
    assert asked.read_text().count("x") == 1
    assert results["chat"].plan is not None, [e.text for e in results["chat"].errors]


def test_the_llama_runtime_serves_where_the_file_names_no_server(lw: LlamaWorkspace) -> None:
    runtime = lw.ws.tmp / "llama-runtime"
    fake_llama_server(runtime / "bin", version="9.9.9 (built here)")
    lw.ws.settings = lw.ws.settings.model_copy(update={"llama_runtime_dir": runtime})
    lw.ws.endpoint("chat", f'engine = "llama.cpp"\nmodel = "{lw.gguf}"\n')
    assert lw.plan()["chat"].plan is None, "no stamp: the recipe did not finish there"
    (runtime / ".epyc-stamp").write_text("llama-cpp-python==0.3.36\n")
    _, decided = lw.planned("chat")
    assert decided.llama_server == str(runtime / "bin" / "llama-server")
    assert decided.llama_version == "9.9.9 (built here)"


def test_each_engine_refuses_the_others_model(lw: LlamaWorkspace) -> None:
    lw.ws.endpoint("vllm-gguf", f'model = "{lw.gguf}"\n')
    lw.endpoint("llama-folder", f'model = "{lw.ws.model}"\n')
    results = lw.plan()
    gguf = results["vllm-gguf"].errors[0]
    assert gguf.fix and 'engine = "llama.cpp"' in gguf.fix, gguf.text
    # a safetensors folder is served through its conversion (tests/plan/test_auto_engine.py),
    # which needs the converter's Python: this workspace has none
    folder = results["llama-folder"].errors[0]
    assert "needs the converter's Python" in folder.message and folder.key == "model", folder.text
    assert folder.fix and "install.sh --runtime" in folder.fix and "gguf" in folder.fix
