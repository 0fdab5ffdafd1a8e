"""The planning boundary as a property: endpoint files generated over every key and both
engines (vLLM on CPUs or Instinct GPUs, llama.cpp; one instance or a set), valid and not
(wrong types, numbers out of range, unknown keys, conflicting sockets and ports, missing
models, bad GGUF paths and revisions, broken TOML), planned on a fake 2-socket Genoa with
eight MI300X.

1. Nothing escapes planning, nor `epycctl status`, `plan` and `approve` (the real CLI,
   in-process, against the fake host root): every endpoint gets its result, every command
   one JSON object and an exit code of the contract; and no endpoint needed the boundary's
   last resort (`unexpected_error`): each refusal came from a rule, with its own line.
2. A valid endpoint file plans beside any number of generated ones as it does alone when
   none of them plans (a refused endpoint takes nothing); when some plan, it is refused only
   for what they share, and only when something else planned.

Bounded (`max_examples`) and derandomized: a failure prints the seed-free reproduction
(`print_blob`) and reruns the same examples; `HYPOTHESIS_SEED=N` explores another set.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st

from epycd.cli import main
from epycd.errors import UNEXPECTED_LOG
from epycd.host import runtimes
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.plan.pipeline.build import PlanSources, plan_all
from epycd.plan.pipeline.result import EndpointResult
from epycd.render import render_for_plan
from epycd.settings import Settings, settings_model
from tests.hosts import make_host
from tests.model.gguf_files import GgufShape, write_gguf
from tests.plan.conftest import PODMAN_5, write_model
from tests.plan.test_llama_plan import fake_llama_server

HOST = "genoa-2s-8x-mi300x"
EXAMPLES = int(os.environ.get("PLANNING_PROPERTY_EXAMPLES", "60"))
CLI_EXAMPLES = max(EXAMPLES // 3, 10)
SEED = int(os.environ.get("HYPOTHESIS_SEED", "20240601"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    print_blob=True,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
UNEXPECTED = "failed unexpectedly"


@dataclass
class World:
    """A fake host root and what endpoint files name (a model folder, a GGUF file, a
    llama-server, a chat template), built once; the config folder is emptied per example."""

    tmp: Path
    root: Path
    host: HostFacts
    model: Path
    gguf: Path
    server: Path
    template: Path
    settings: Settings
    hf_home: Path

    def __repr__(self) -> str:  # what a failing example prints: not the host's facts
        return f"World({self.tmp})"

    @property
    def config_dir(self) -> Path:
        return self.settings.config_dir

    def write(self, files: dict[str, bytes]) -> None:
        shutil.rmtree(self.config_dir, ignore_errors=True)
        self.config_dir.mkdir(parents=True)
        for name, raw in files.items():
            (self.config_dir / f"{name}.toml").write_bytes(raw)

    def plan(self) -> dict[str, EndpointResult]:
        results = plan_all(
            self.settings,
            self.host,
            render=render_for_plan,
            sources=PlanSources(listeners={}, environ={"HF_HOME": str(self.hf_home)}),
        )
        return {result.endpoint: result for result in results}

    def env(self) -> dict[str, str]:
        s = self.settings
        return {
            "EPYCD_CONFIG_DIR": str(s.config_dir),
            "EPYCD_STATE_DIR": str(s.state_dir),
            "EPYCD_RUN_DIR": str(s.run_dir),
            "EPYCD_UNIT_DIR": str(s.unit_dir),
            "EPYCD_QUADLET_DIR": str(s.quadlet_dir),
            "EPYCD_HOST_ROOT": str(self.root),
            "EPYCD_RUNTIME_DIR": str(self.tmp / "no-runtime"),
            "EPYCD_METRICS_LISTEN": "",
            "HF_HOME": str(self.hf_home),
            "HF_HUB_OFFLINE": "1",
        }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("planning-property")
    root = make_host(tmp / "hosts", HOST)
    host = detect_host(root, probe_runtimes=False)
    host = host.model_copy(update={"runtimes": RuntimeFacts(podman=PODMAN_5)})
    gguf = tmp / "models" / "tiny-q8_0.gguf"
    gguf.parent.mkdir(parents=True)
    write_gguf(
        gguf,
        GgufShape(layers=2, embedding=128, heads=4, kv_heads=2, feed_forward=512, vocab=300),
    )
    template = tmp / "templates" / "chat.jinja"
    template.parent.mkdir()
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    engines_own: dict[str, Any] = {"llama_runtime_dir": tmp / "no-llama-runtime"}
    settings_ = settings_model()(
        config_dir=tmp / "etc-epyc-llm",
        state_dir=tmp / "state",
        run_dir=tmp / "run",
        unit_dir=tmp / "systemd",
        quadlet_dir=tmp / "containers-systemd",
        host_root=root,
        runtime_dir=tmp / "no-runtime",
        **engines_own,
    )
    (tmp / "hf").mkdir()
    return World(
        tmp=tmp,
        root=root,
        host=host,
        model=write_model(tmp / "models" / "qwen3-0.6b"),
        gguf=gguf,
        server=fake_llama_server(tmp / "llama" / "bin"),
        template=template,
        settings=settings_,
        hf_home=tmp / "hf",
    )


# --- what an endpoint file may say -------------------------------------------------------

MODEL, GGUF, SERVER, TEMPLATE = "<model>", "<gguf>", "<server>", "<template>"
"""Placeholders for the world's files, put in by `render`."""

HEX40 = "0123456789abcdef" * 2 + "01234567"
WRONG_TYPES = st.sampled_from([1.5, True, [1], {"a": 1}, "", "x" * 300])
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(
        [
            MODEL,
            GGUF,
            "/nonexistent/model",
            "/nonexistent/x.gguf",
            "Org/Name",
            "Qwen/Qwen3-0.6B",
            "not a hub id",
            "org/../name",
            "/",
            7,
        ]
    ),
    "revision": st.sampled_from(
        ["main", "v1.0", HEX40, "refs/pr/1", "../../x", "/etc/passwd", "a/../b", "..", "x" * 201, 5]
    ),
    "dtype": st.sampled_from(["bfloat16", "float16", "float32", "auto", "int3", 16]),
    "max_model_len": st.one_of(st.integers(-5, 10), st.sampled_from([2048, 4096, 10**9, 2**70])),
    "max_num_seqs": st.one_of(st.integers(-2, 9), st.sampled_from([256, 10**7])),
    "port": st.one_of(
        st.sampled_from(["auto", 8000, 8001, 65535, 65534, 1, 0, -1, 70000, "8000", 80.5])
    ),
    "runtime": st.sampled_from(["auto", "podman", "docker", "host", "kubernetes", 1]),
    "socket": st.sampled_from(["auto", 0, 1, 2, 99, -1, "0", 0.5]),
    "image": st.sampled_from(["docker.io/vllm/vllm-openai-cpu:v0.25.1-x86_64", "bad image", 3]),
    "vllm": st.sampled_from(["/nonexistent/bin/vllm", "relative/vllm", SERVER, 1]),
    "served_model_name": st.sampled_from(["chat", "-flag", "two words", "x" * 201, 1]),
    "chat_template": st.sampled_from([TEMPLATE, "/nonexistent/t.jinja", "rel.jinja"]),
    "extra_args": st.sampled_from(
        [[], ["--seed", "1"], ["--port", "9"], ["--trust-remote-code"], ["x"], "--seed", [1]]
    ),
    "env": st.sampled_from(
        [{}, {"VLLM_CPU_KVCACHE_SPACE": "4"}, {"LD_PRELOAD": "/x.so"}, {"bad-name": "1"}, {"A": 1}]
    ),
    "hf_token_file": st.sampled_from(["/nonexistent/token", "relative", 1]),
    "api_key_file": st.sampled_from(["/nonexistent/key", "relative", 1]),
    "host": st.sampled_from(["127.0.0.1", "0.0.0.0", "::", "not-an-ip", "10.0.0.1", 1]),
    "throughput_flags": st.one_of(st.booleans(), st.just("yes")),
    "restart": st.sampled_from(["on-failure", "no", "always", False]),
    "profile": st.sampled_from(["balanced", "latency", "throughput", "fast"]),
    "device": st.sampled_from(["cpu", "instinct", "gpu", 0]),
    "gpus": st.one_of(
        st.just("auto"), st.lists(st.integers(-1, 9), max_size=4), st.just("0"), st.just([])
    ),
    "tensor_parallel_size": st.sampled_from(["auto", 1, 2, 3, 4, 8, 16, "2"]),
    "instances": st.sampled_from([1, 2, 4, "auto", 0, 65, -1, "two"]),
    "placement": st.sampled_from(["socket", "host", "node"]),
    "min_ready": st.sampled_from([1, 2, 3, 0, 100, "1"]),
    "engine": st.sampled_from(["vllm", "llama.cpp", "llama", 1]),
    "gguf_file": st.sampled_from(
        [
            "tiny-q8_0.gguf",
            "x.gguf",
            "../x.gguf",
            "/etc/x.gguf",
            "a/../b.gguf",
            "x.bin",
            "a//b.gguf",
            "C:x.gguf",
            "a\\..\\b.gguf",
        ]
    ),
    "llama_server": st.sampled_from([SERVER, "/nonexistent/llama-server", "relative", 1]),
}
UNKNOWN_KEYS = st.sampled_from(["sockets", "modle", "numa", "[x]", "Port"])


@st.composite
def any_file(draw: st.DrawFn) -> dict[str, Any]:
    """Any subset of the keys, each valid or not, perhaps an unknown key, either engine."""
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=8, unique=True))
    data = {key: draw(st.one_of(VALUES[key], WRONG_TYPES) if draw(st.booleans()) else VALUES[key])
            for key in keys}  # fmt: skip
    if draw(st.booleans()):
        data[draw(UNKNOWN_KEYS)] = draw(st.one_of(TEXT, st.integers()))
    return data


def valid_file(kind: str, **more: Any) -> dict[str, Any]:
    """An endpoint file the planner plans on the fake host alone."""
    files: dict[str, dict[str, Any]] = {
        "vllm-cpu": {"model": MODEL, "runtime": "podman"},
        "vllm-set": {"model": MODEL, "runtime": "podman", "instances": 2},
        "instinct": {"model": MODEL, "device": "instinct", "gpus": [0]},
        "llama": {"engine": "llama.cpp", "model": GGUF, "llama_server": SERVER},
        "llama-set": {"engine": "llama.cpp", "model": GGUF, "llama_server": SERVER, "instances": 2},
    }
    return files[kind] | more


VALID_KINDS = ("vllm-cpu", "vllm-set", "instinct", "llama", "llama-set")
VALID_EXTRAS = st.fixed_dictionaries(
    {},
    optional={
        "profile": st.sampled_from(["balanced", "latency", "throughput"]),
        "restart": st.sampled_from(["on-failure", "no"]),
        "max_model_len": st.sampled_from([1024, 2048]),
        "served_model_name": st.just("chat"),
    },
)


@st.composite
def other_file(draw: st.DrawFn) -> bytes | dict[str, Any]:
    """A generated neighbour: mostly any keys, sometimes a valid file (which shares the host
    legitimately), a conflicting one or text that is no TOML at all."""
    choice = draw(st.sampled_from(["any", "any", "any", "valid", "conflict", "raw"]))
    if choice == "valid":
        return valid_file(draw(st.sampled_from(VALID_KINDS)), **draw(VALID_EXTRAS))
    if choice == "conflict":
        kind = draw(st.sampled_from(VALID_KINDS))
        return valid_file(kind, socket=draw(st.sampled_from([0, 1])), port=8000)
    if choice == "raw":
        return draw(st.sampled_from([b"model = ", b"\xff\xfe", b"[[x]]\n[x]\n", b"a = 1\na = 2\n"]))
    return draw(any_file())


NAMES = st.sampled_from([f"{c}-{i}" for c in "bmz" for i in range(4)])


@st.composite
def neighbourhood(draw: st.DrawFn) -> tuple[str, dict[str, Any], dict[str, bytes | dict[str, Any]]]:
    """The anchor (a valid file under a name that may sort anywhere) and its neighbours."""
    anchor = draw(st.sampled_from(["a-anchor", "n-anchor", "zz-anchor"]))
    kind = draw(st.sampled_from(VALID_KINDS))
    names = draw(st.lists(NAMES, min_size=1, max_size=5, unique=True))
    return anchor, valid_file(kind, **draw(VALID_EXTRAS)), {n: draw(other_file()) for n in names}


def render(world: World, data: bytes | dict[str, Any]) -> bytes:
    if isinstance(data, bytes):
        return data
    named = {MODEL: world.model, GGUF: world.gguf, SERVER: world.server, TEMPLATE: world.template}

    def fill(value: Any) -> Any:
        return str(named[value]) if isinstance(value, str) and value in named else value

    try:
        return tomli_w.dumps({key: fill(value) for key, value in data.items()}).encode()
    except (TypeError, ValueError):  # an integer TOML cannot hold, such as 2**70
        return "\n".join(f"{key} = {value!r}" for key, value in data.items()).encode()


# --- the checks --------------------------------------------------------------------------


@contextmanager
def no_last_resort() -> Iterator[list[logging.LogRecord]]:
    """The records of `unexpected_error`, which a run must not need."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(UNEXPECTED_LOG)
    handler = Keep(logging.ERROR)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def assert_each_by_a_rule(results: dict[str, EndpointResult], names: set[str]) -> None:
    assert set(results) == names
    for name, result in results.items():
        assert result.plan is not None or result.errors, name
        for error in result.errors:
            assert UNEXPECTED not in error.message, error.text
            assert "\n" not in error.text, error.text
            assert error.exit_code in (1, 2), error.text


@pytest.fixture(scope="module")
def fast_host() -> Iterator[None]:
    """podman 5 for the CLI's runtime probe (this machine's podman has no Quadlet) and no
    load sampling: the fake root's /proc/stat never changes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtimes, "probe_runtimes", lambda vllm=None: RuntimeFacts(podman=PODMAN_5))
        patch.setattr("epycd.host.load.sample_socket_busy", lambda root, cpus, seconds: {})
        yield


@seed(SEED)
@PROPERTY
@given(case=neighbourhood())
def test_a_valid_file_plans_beside_any_others_as_alone(
    world: World, case: tuple[str, dict[str, Any], dict[str, bytes | dict[str, Any]]]
) -> None:
    anchor, valid, others = case
    world.write({anchor: render(world, valid)})
    with no_last_resort() as records:
        alone = world.plan()[anchor]
        assert alone.plan is not None, [e.text for e in alone.errors]
        world.write(
            {anchor: render(world, valid)} | {n: render(world, d) for n, d in others.items()}
        )
        results = world.plan()
    assert not records, [r.getMessage() for r in records]
    assert_each_by_a_rule(results, {anchor, *others})
    beside = results[anchor]
    planned_others = [n for n, r in results.items() if n != anchor and r.plan is not None]
    event(f"{len(planned_others)} of {len(others)} others planned")
    event("the anchor planned beside them" if beside.plan else "the anchor refused beside them")
    if not planned_others:
        assert beside.plan == alone.plan, "refused endpoints took something from a valid one"
        return
    if beside.plan is None:
        keys = {error.key for error in beside.errors}
        assert keys <= {"socket", "port", "gpus", "instances", "placement", None}, keys
        return
    same = ("model", "kind", "engine", "dtype", "served_model_name", "restart", "model_kind")
    got, was = beside.plan.decisions, alone.plan.decisions
    assert [getattr(got, k, None) for k in same] == [getattr(was, k, None) for k in same]


def cli(world: World, *args: str) -> tuple[int, dict[str, Any]]:
    """The real `epycctl ARGS --json`, in-process: its exit code and its one JSON object."""
    result = CliRunner().invoke(main, [*args, "--json"], env=world.env())
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output, result.output
    return result.exit_code, json.loads(result.stdout)


@seed(SEED)
@settings(PROPERTY, max_examples=CLI_EXAMPLES)
@given(case=neighbourhood(), shown=st.integers(0, 5))
@pytest.mark.usefixtures("fast_host")
def test_status_plan_and_approve_answer_for_every_file(
    world: World, case: tuple[str, dict[str, Any], dict[str, bytes | dict[str, Any]]], shown: int
) -> None:
    anchor, valid, others = case
    files = {anchor: render(world, valid)} | {n: render(world, d) for n, d in others.items()}
    world.write(files)
    names = sorted(files)
    with no_last_resort() as records:
        code, status = cli(world, "status")
        assert code == 0 and {s["name"] for s in status["endpoints"]} == set(names), status
        name = names[shown % len(names)]
        code, plan = cli(world, "plan", name)
        assert plan["endpoint"] == name and (code == 0) == (not plan["errors"]), plan
        code, approve = cli(world, "approve", anchor)
        assert code in (1, 2) and approve["result"] == "error", approve
    assert not records, [r.getMessage() for r in records]
    assert not any(world.settings.state_dir.glob("approvals/*")), "approve without a yes wrote"
