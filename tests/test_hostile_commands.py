"""A generative run (Hypothesis) of every `epycctl` command that reads a file or takes a flag,
fed hostile values: a FIFO, a symlink to /dev/zero, a folder, a socket or a huge sparse file
where a file is read (an endpoint file, epycd.conf, the gateway's key store, a model's
config.json, tokenizer_config.json, safetensors file or index, a chat template, an API key
file, a recipes cache, a host root, a model path), JSON and TOML of wrong types, bytes that are
not UTF-8, hostile safetensors headers, and text with control characters, NUL, newlines,
escapes or 5000 characters as a name or a flag's value. For every case, in this process:

- exit 0, 1 or 2, and no traceback on stdout or stderr (nor an exception out of the command);
- with --json, stdout is exactly one JSON object;
- on a refusal (exit 1 or 2) no file of the product's folders changed;
- each command returns within `CASE_SECONDS` (a FIFO read would block it for ever);
- another endpoint, `good`, still plans (exit 0, fits).

Left out: `logs` (runs journalctl; its only input is an endpoint name, whose rule `status`
and the others share and meet here), a `convert` that would run the converter (a hostile
config.json is driven into it with a Python that does not exist),
`gateway plan`/`approve`/`remove` (they read only settings and certificates, which the
gateway's own tests drive through the real HAProxy), and the flags that run a program
(`--vllm`, `--python`: a random text could name one on PATH; they get fixed hostile paths).
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import os
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epycd.cli import main
from epycd.engines.vllm.plan.tuning import version_tuple
from epycd.gateway.keys import store_path
from epycd.model.tables import version_key
from tests.model import hostile_safetensors as hs
from tests.plan.conftest import write_model
from tests.sandbox import EPYCD_DIRS, FAKE_SYSTEMCTL, CliSandbox, make_executable

CASES = int(os.environ.get("EPYC_HOSTILE_CASES", "200"))
"""Fixed, so that the run stays under a minute here; more to try harder."""
EXPLORE = os.environ.get("EPYC_HOSTILE_EXPLORE") == "1"
"""New random cases each run (by default the same derandomized ones, for a stable suite)."""
CASE_SECONDS = 20
HUGE_BYTES = 200 << 20
"""Over every cap of epycd/readfile.py (the largest, a safetensors header, is 100 MiB)."""
PROTECTED = {"good", "h"}
"""Endpoint names a random name must not be: `remove good --yes` would be a real removal."""

UNTRACKED = {"vllm-probes.json", ".lock"}
"""The probe cache (a cache, not state) and the empty state lock file (taken, never written)."""
FILE_KINDS = ("fifo", "dev-zero", "folder", "socket", "huge", "content")
ENDPOINT_KEYS = (
    "model", "port", "engine", "runtime", "vllm", "api_key_file", "hf_token_file",
    "chat_template", "max_model_len", "max_num_seqs", "socket", "instances", "host", "quantize",
    "gguf_file", "served_model_name", "aliases", "env", "extra_args", "image", "revision",
    "idle_stop", "on_demand", "gpus",
)  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
hostile_texts = st.one_of(
    st.text(max_size=24),
    st.text(alphabet=st.characters(max_codepoint=0x1F), min_size=1, max_size=8),
    st.sampled_from(
        [
            "",
            "-",
            "--json",
            "..",
            "../../etc/passwd",
            "/dev/zero",
            "a\x00b",
            "a\nb",
            "\x1b[2J",
            "x" * 5000,
            " ",
            "\u202eevil",
            "nope/../nope",
            "%s%n",
            "{{7*7}}",
        ]
    ),
).filter(lambda text: text not in PROTECTED)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # inf, -inf and nan are TOML too
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return '""'


@st.composite
def endpoint_texts(draw: st.DrawFn, model: str) -> bytes:
    """An endpoint file: the good model and keys of wrong types, or not TOML at all."""
    fields = draw(st.dictionaries(st.sampled_from(ENDPOINT_KEYS), json_values, max_size=3))
    fields.setdefault("model", model)
    text = "".join(f"{key} = {toml_value(value)}\n" for key, value in fields.items())
    return draw(st.sampled_from([text.encode(), text.encode()[: len(text) // 2] + b"\xff["]))


HOSTILE_HEADERS = [
    hs.safetensors({"w": {"dtype": "BF16", "shape": [32]}}),
    hs.safetensors({"w": hs.tensor(hs.TENSOR_BYTES, 0, shape=[32])}),
    hs.safetensors({"w": hs.tensor(0, 2**40)}),
    hs.safetensors({}, length=2**63),
    hs.safetensors({"a": hs.tensor(0, 64), "b": hs.tensor(32, 96)}, data=128),
]
json_contents = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=32),
    st.just(b"\xff\xfe not utf-8"),
)


class World:
    """The sandbox's folders, a good model and endpoint, and the slots a case fills."""

    def __init__(self, tmp: Path) -> None:
        self.box = CliSandbox.create(tmp / "box")
        self.box.use_fake_host()
        make_executable(self.box.bin_dir / "podman", "#!/bin/sh\necho 'podman version 5.4.2'\n")
        self.box.install_fake_systemctl(FAKE_SYSTEMCTL)
        self.settings = self.box.settings
        self.model = write_model(tmp / "good-model")
        self.config = self.settings.config_dir
        (self.config / "good.toml").write_text(f'model = "{self.model}"\nport = 8101\n')
        self.cases = tmp / "c"
        self.cases.mkdir()
        self.count = 0
        self.runner = CliRunner()

    def reset(self) -> None:
        """The slots in the product's folders emptied: a case Hypothesis stops between
        placing its file and running (a draw past its budget) does not clean up after it."""
        for path in (self.config / "h.toml", self.config / "epycd.conf", store_path(self.settings)):
            remove(path)

    def fresh(self) -> Path:
        """A folder of this case's own (short: a socket's path must fit in sun_path)."""
        self.count += 1
        folder = self.cases / str(self.count)
        folder.mkdir()
        return folder

    def snapshot(self, skip: set[Path]) -> dict[str, str]:
        found = {}
        for key in EPYCD_DIRS:
            for path in Path(getattr(self.settings, key)).rglob("*"):
                if path in skip or path.name in UNTRACKED or not path.is_file():
                    continue
                if path.is_symlink():
                    continue
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        return found

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        with deadline(CASE_SECONDS, argv):
            result = self.runner.invoke(main, argv, catch_exceptions=True)
        output = result.stdout + result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"{argv!r}: {result.exception!r}\n{output}")
        return result.exit_code, result.stdout, result.stderr


@contextmanager
def deadline(seconds: int, argv: list[str]) -> Iterator[None]:
    def expired(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"{argv!r} did not return within {seconds} s (a blocked read?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def place(path: Path, kind: str, content: bytes) -> None:
    """A hostile file of `kind` at `path` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file() or path.is_socket() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(str(path))
    elif kind == "huge":
        with path.open("wb") as file:
            file.truncate(HUGE_BYTES)
    else:
        path.write_bytes(content)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


Case = tuple[str, list[str], list[Path], bool]
"""(what it covers, argv, the hostile paths it placed, whether it gives --json: a hostile
text "--json" may be an option's value)."""


def file_case(world: World, data: st.DataObject) -> Case:
    """A hostile file where a command reads one, and a command that reads it."""
    folder = world.fresh()
    kind = data.draw(st.sampled_from(FILE_KINDS), label="kind")
    slot = data.draw(
        st.sampled_from(
            ["endpoint", "settings", "keys", "config.json", "tokenizer_config.json",
             "model.safetensors", "model.safetensors.index.json", "chat_template",
             "api_key_file", "model-path", "recipes", "host-root"]
        ),
        label="slot",
    )  # fmt: skip
    endpoint = world.config / "h.toml"
    out = folder / "out"
    model = folder / "m"
    if slot in {"config.json", "tokenizer_config.json", "model.safetensors",
                "model.safetensors.index.json"}:  # fmt: skip
        write_model(model)
        if slot == "model.safetensors":
            content = data.draw(st.sampled_from(HOSTILE_HEADERS) | json_contents, label="bytes")
        else:
            content = data.draw(json_contents, label="bytes")
        target = model / slot
        place(target, kind, content)
        endpoint.write_text(f'model = "{model}"\n')
        argv = data.draw(
            st.sampled_from(
                [["check-model", str(model), "--json"],
                 ["estimate", str(model), "--socket-gb", "64", "--json"],
                 ["plan", "h", "--json"]]
                + ([["convert", str(model), "--output", str(out) + ".gguf",
                     "--python", "/nonexistent/python", "--json"]]
                   if slot == "config.json" else [])
            )
        )  # fmt: skip
        return f"{slot}/{kind}", argv, [target, endpoint], "--json" in argv
    if slot == "endpoint":
        content = data.draw(endpoint_texts(str(world.model)), label="bytes")
        place(endpoint, kind, content)
        argv = data.draw(
            st.sampled_from(
                [["plan", "h", "--json"], ["status", "h", "--json"], ["status", "--json"],
                 ["approve", "h", "--yes", "--no-start", "--no-pull", "--json"],
                 ["export", "kube", "h", "--output", str(out), "--json"],
                 ["stop", "h", "--json"], ["start", "h", "--json"],
                 ["remove", "h", "--yes", "--json"]]
            )
        )  # fmt: skip
        return f"endpoint/{kind}", argv, [endpoint], "--json" in argv
    if slot in {"chat_template", "api_key_file"}:
        target = folder / "f"
        place(target, kind, data.draw(st.binary(max_size=32), label="bytes"))
        endpoint.write_text(f'model = "{world.model}"\n{slot} = "{target}"\n')
        return (
            f"{slot}/{kind}",
            ["plan", "h", "--json"],
            [target, endpoint],
            True,
        )
    if slot == "settings":
        conf = world.config / "epycd.conf"
        content = data.draw(
            json_values.map(lambda v: f"host_root = {toml_value(v)}\n".encode())
            | st.binary(max_size=32),
            label="bytes",
        )
        place(conf, kind, content)
        argv = data.draw(
            st.sampled_from(
                [["plan", "good", "--json"], ["status", "--json"], ["gateway", "keys", "--json"],
                 ["check-model", str(world.model), "--json"], ["detect", "--json"]]
            )
        )  # fmt: skip
        return f"settings/{kind}", argv, [conf], "--json" in argv
    if slot == "keys":
        keys = store_path(world.settings)
        place(keys, kind, data.draw(json_contents, label="bytes"))
        argv = data.draw(
            st.sampled_from(
                [["gateway", "keys", "--json"], ["gateway", "revoke", "someone"],
                 ["gateway", "add-key", "newkey", "--models", "good"]]
            )
        )  # fmt: skip
        return f"keys/{kind}", argv, [keys], "--json" in argv
    if slot == "recipes":
        source = folder / "recipes.json"
        place(source, kind, data.draw(json_contents, label="bytes"))
        argv = ["instinct-recipes", "--from", str(source), "--out", str(out), "--json"]
        return f"recipes/{kind}", argv, [source], "--json" in argv
    if slot == "host-root":
        root = folder / "root"
        place(root, kind, b"")
        return (
            f"host-root/{kind}",
            ["detect", "--root", str(root), "--json"],
            [root],
            True,
        )
    path = folder / data.draw(st.sampled_from(["m", "m.gguf", "m.safetensors"]), label="name")
    place(path, kind, data.draw(json_contents, label="bytes"))
    argv = data.draw(
        st.sampled_from(
            [["check-model", str(path), "--json"],
             ["estimate", str(path), "--socket-gb", "64", "--json"],
             ["check-model", str(world.model), "--gguf-file", str(path), "--json"],
             ["check-model", str(world.model), "--vllm", str(path), "--json"],
             ["quickstart", "--model", str(path), "--name", "q", "--yes", "--no-start",
              "--no-pull"]]
        )
    )  # fmt: skip
    return f"model-path/{kind}", argv, [path], "--json" in argv


TEXT_COMMANDS: dict[str, Callable[[World, str, Path], list[str]]] = {
    "plan NAME": lambda w, t, o: ["plan", t, "--json"],
    "status NAME": lambda w, t, o: ["status", t, "--json"],
    "approve NAME": lambda w, t, o: ["approve", t, "--yes", "--no-start", "--no-pull", "--json"],
    "stop NAME": lambda w, t, o: ["stop", t, "--json"],
    "start NAME": lambda w, t, o: ["start", t, "--json"],
    "remove NAME": lambda w, t, o: ["remove", t, "--yes", "--json"],
    "bench NAME": lambda w, t, o: ["bench", t, "--json"],
    "export kube NAME": lambda w, t, o: ["export", "kube", t, "--output", str(o), "--json"],
    "export --model-volume": lambda w, t, o: [
        "export",
        "kube",
        "good",
        "--model-volume",
        t,
        "--output",
        str(o),
        "--json",
    ],
    "check-model MODEL": lambda w, t, o: ["check-model", t, "--json"],
    "check-model --revision": lambda w, t, o: ["check-model", "a/b", "--revision", t, "--json"],
    "check-model --vllm-version": lambda w, t, o: [
        "check-model",
        str(w.model),
        "--vllm-version",
        t,
        "--json",
    ],
    "estimate MODEL": lambda w, t, o: ["estimate", t, "--socket-gb", "64", "--json"],
    "estimate --max-model-len": lambda w, t, o: [
        "estimate",
        str(w.model),
        "--max-model-len",
        t,
        "--json",
    ],
    "estimate --socket-gb": lambda w, t, o: ["estimate", str(w.model), "--socket-gb", t, "--json"],
    "plan --root": lambda w, t, o: ["plan", "good", "--root", t, "--json"],
    "plan --sample-seconds": lambda w, t, o: ["plan", "good", "--sample-seconds", t, "--json"],
    "detect --root": lambda w, t, o: ["detect", "--root", t, "--json"],
    "detect --load-sample": lambda w, t, o: ["detect", "--load-sample", t, "--json"],
    "gateway add-key NAME": lambda w, t, o: ["gateway", "add-key", t, "--models", "good"],
    "gateway add-key --models": lambda w, t, o: ["gateway", "add-key", "k1", "--models", t],
    "gateway add-key --rpm": lambda w, t, o: [
        "gateway",
        "add-key",
        "k1",
        "--models",
        "good",
        "--rpm",
        t,
    ],
    "gateway revoke NAME": lambda w, t, o: ["gateway", "revoke", t],
    "metrics scrape-config --job": lambda w, t, o: ["metrics", "scrape-config", "--job", t],
    "metrics scrape-config --interval": lambda w, t, o: [
        "metrics",
        "scrape-config",
        "--interval",
        t,
    ],
    "instinct-recipes --from": lambda w, t, o: [
        "instinct-recipes",
        "--from",
        t,
        "--out",
        str(o),
        "--json",
    ],
    "quickstart --model": lambda w, t, o: [
        "quickstart",
        "--model",
        t,
        "--name",
        "q",
        "--yes",
        "--no-start",
        "--no-pull",
    ],
    "convert --output": lambda w, t, o: ["convert", "/nonexistent/model", "--output", t],
}


def text_case(world: World, data: st.DataObject) -> Case:
    name = data.draw(st.sampled_from(sorted(TEXT_COMMANDS)), label="command")
    text = data.draw(hostile_texts, label="text")
    out = world.fresh() / "out"
    argv = TEXT_COMMANDS[name](world, text, out)
    asks_json = "--json" in TEXT_COMMANDS[name](world, "x", out)
    return name, argv, [], asks_json


def check_case(world: World, case: Case) -> None:
    covered, argv, placed, asks_json = case
    skip = set(placed)
    try:
        before = world.snapshot(skip)
        code, stdout, stderr = world.run(argv)
        said = (covered, argv, code, stdout[-2000:], stderr[-2000:])
        assert code in (0, 1, 2), said
        assert "Traceback" not in stdout + stderr, said
        if asks_json:
            try:
                data = json.loads(stdout)
            except ValueError:
                raise AssertionError(("not one JSON object on stdout", *said)) from None
            assert isinstance(data, dict), said
        if code != 0:
            assert world.snapshot(skip) == before, ("wrote on a refusal", *said)
    finally:
        for path in placed:
            remove(path)
    good_code, good_out, good_err = world.run(["plan", "good", "--json"])
    assert good_code == 0, (covered, argv, good_out, good_err)
    assert json.loads(good_out)["memory"]["fits"] is True


def test_hostile_values_into_every_command_that_reads_a_file_or_a_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world = World(tmp_path)
    for name, value in world.box.environ(HF_HUB_OFFLINE="1").items():
        if name.startswith(("EPYCD_", "FAKE_", "HF_")) or name in {"PATH", "PYTHONPATH"}:
            monkeypatch.setenv(name, value)
    for name in ("EPYCD_ADMIN_GROUP", "NOTIFY_SOCKET", "HF_TOKEN", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    ran: collections.Counter[str] = collections.Counter()

    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        derandomize=not EXPLORE,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data(), files=st.booleans())
    def run(data: st.DataObject, files: bool) -> None:
        world.reset()
        case = file_case(world, data) if files else text_case(world, data)
        ran[case[0].split("/")[0] if files else case[0]] += 1
        check_case(world, case)

    run()
    total = sum(ran.values())
    with capsys.disabled():
        print(f"\n{total} generated cases over {len(ran)} inputs: {dict(sorted(ran.items()))}")
    assert total >= CASES


@pytest.mark.parametrize(
    "argv", [["gateway", "keys", "--json"], ["export", "kube", "x", "--json", "--output", "/x"]]
)
def test_a_bad_settings_file_is_one_json_object_from_a_groups_subcommand(
    tmp_path: Path, argv: list[str]
) -> None:
    """A group's subcommand validates the settings after its own --json is parsed."""
    os.mkfifo(tmp_path / "epycd.conf")
    result = CliRunner().invoke(main, argv, env={"EPYCD_CONFIG_DIR": str(tmp_path)})
    assert result.exit_code == 2, result.output
    data = json.loads(result.stdout)
    assert data["result"] == "error" and "is a FIFO" in data["error"], data


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "/nonexistent/model", "--output", "a\x00b"],
        ["detect", "--root", "/\x00", "--json"],
    ],
)
def test_a_nul_in_an_option_is_a_usage_error(argv: list[str]) -> None:
    """Only a caller in-process can pass a NUL (argv cannot hold one); it is refused as a
    usage error, never a ValueError out of the OS call."""
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "NUL character is not allowed" in result.stderr


def test_no_isdigit_in_the_product() -> None:
    """`str.isdigit` takes '²', which `int()` refuses: `check-model --vllm-version ²` was a
    ValueError out of the command. Digits are checked by `epycd.text.is_digits` alone."""
    package = Path(__file__).resolve().parent.parent / "epycd"
    found = [
        f"{path.relative_to(package.parent)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "text.py" or path.parent != package
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr in {"isdigit", "isnumeric"}
    ]
    assert not found, f"use epycd.text.is_digits, not str.isdigit: {found}"


@pytest.mark.parametrize("version", ["²", "0.³²"])
def test_a_version_of_unicode_digits_is_read_as_no_number(version: str) -> None:
    assert version_tuple(version) in (None, (0,))
    assert all(isinstance(part, int) for part in version_key(version))
