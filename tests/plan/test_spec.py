"""Endpoint files: every error names the file and the key and says what is allowed; a bad
file never stops a good one."""

from __future__ import annotations

from pathlib import Path

import pytest

from epycd.spec import EndpointSpec, endpoint_files, load_endpoints, parse_endpoint
from epycd.stack import shipped_stack
from tests.plan.conftest import Workspace

PRECISIONS = shipped_stack().precisions


def errors_of(path: Path, text: str) -> list[tuple[str | None, str]]:
    result = parse_endpoint(path, text.encode(), precisions=PRECISIONS)
    assert result.spec is None
    for error in result.errors:
        assert error.file == str(path)
        assert error.fix, f"no fix for {error}"
    return [(error.key, str(error)) for error in result.errors]


def only_key(path: Path, text: str) -> str:
    found = errors_of(path, text)
    assert len(found) == 1, found
    assert found[0][0] is not None
    return found[0][1]


def test_full_file_is_valid(tmp_path: Path) -> None:
    text = """
model = "Qwen/Qwen3-0.6B"
revision = "main"
dtype = "float16"
max_model_len = 8192
max_num_seqs = 4
port = 8100
runtime = "podman"
socket = 1
image = "amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"
vllm = "/opt/venv/bin/vllm"
served_model_name = "qwen3"
chat_template = "/etc/epyc-llm/chatml.jinja"
extra_args = ["--enforce-eager", "--max-num-batched-tokens", "4096"]
hf_token_file = "/etc/epyc-llm/hf-token"
throughput_flags = true
restart = "on-failure"
[env]
VLLM_LOGGING_LEVEL = "INFO"
"""
    result = parse_endpoint(tmp_path / "qwen3.toml", text.encode(), precisions=PRECISIONS)
    assert result.ok, result.errors
    assert result.spec == EndpointSpec(
        model="Qwen/Qwen3-0.6B",
        revision="main",
        dtype="float16",
        max_model_len=8192,
        max_num_seqs=4,
        port=8100,
        runtime="podman",
        socket=1,
        image="amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30",
        vllm="/opt/venv/bin/vllm",
        served_model_name="qwen3",
        chat_template="/etc/epyc-llm/chatml.jinja",
        extra_args=["--enforce-eager", "--max-num-batched-tokens", "4096"],
        env={"VLLM_LOGGING_LEVEL": "INFO"},
        hf_token_file="/etc/epyc-llm/hf-token",
        throughput_flags=True,
        restart="on-failure",
    )
    assert result.name == "qwen3"


def test_empty_file_takes_the_defaults(tmp_path: Path) -> None:
    result = parse_endpoint(tmp_path / "default.toml", b"", precisions=PRECISIONS)
    assert result.ok
    assert result.spec is not None
    assert result.spec.model is None and result.spec.port == "auto"
    assert result.spec.socket == "auto" and result.spec.runtime == "auto"
    assert result.spec.restart == "no" and not result.spec.throughput_flags


@pytest.mark.parametrize(
    ("text", "key", "allowed"),
    [
        ('modle = "Qwen/Qwen3-0.6B"', "modle", "allowed keys: model, revision"),
        ("max_model_len = '4096'", "max_model_len", "positive integer"),
        ("max_model_len = 0", "max_model_len", "positive integer"),
        ('port = "8000"', "port", '"auto"'),
        ("port = 70000", "port", "1-65535"),
        ("socket = -1", "socket", '"auto" or a socket number'),
        ('socket = "first"', "socket", '"auto" or a socket number'),
        ('runtime = "lxc"', "runtime", '"podman", "docker" or "host"'),
        ('restart = "always"', "restart", '"no" or "on-failure"'),
        ("throughput_flags = 'yes'", "throughput_flags", "true or false"),
        ('model = "qwen3"', "model", "absolute path"),
        ('model = "models/qwen3/"', "model", "absolute path"),
        ('vllm = "bin/vllm"', "vllm", "absolute path"),
        ('hf_token_file = "token"', "hf_token_file", "absolute path"),
        ('dtype = "int8"', "dtype", "bfloat16, float16, float32"),
        ('served_model_name = "my model"', "served_model_name", "without spaces"),
        ("extra_args = '--enforce-eager'", "extra_args", "list of strings"),
        ("extra_args = ['--enforce-eager', 3]", "extra_args[1]", "list of strings"),
        ("env = { A = 1 }", "env.A", "table of NAME"),
        ('env = { "bad-name" = "1" }', "env.bad-name", "[A-Za-z_][A-Za-z0-9_]*"),
        ('image = "repo/x:tag; rm -rf /"', "image", "image reference"),
        ('revision = "main branch"', "revision", "branch, tag or commit"),
        ("extra_args = ['--seed', ';']", "extra_args[1]", "--flag=value"),
        ("extra_args = ['']", "extra_args[0]", "--flag=value"),
        ('served_model_name = ";"', "served_model_name", "another name"),
        ('env = { A = "\u0085" }', "env.A", "one line"),
    ],
)
def test_bad_value_names_file_key_and_what_is_allowed(
    tmp_path: Path, text: str, key: str, allowed: str
) -> None:
    path = tmp_path / "bad.toml"
    message = only_key(path, text)
    assert message.startswith(f"{path}: {key}: "), message
    assert allowed in message


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('served_model_name = "a\\nExecStartPre=/bin/evil"', "served_model_name"),
        ('model = "/models/x\\ny"', "model"),
        ('extra_args = ["--enforce-eager\\r"]', "extra_args[0]"),
        ('env = { A = "x\\u2028y" }', "env.A"),
        ('chat_template = "/t\\u0000"', "chat_template"),
        ('[env]\n"A\\nB" = "1"', "env.A\nB"),
    ],
)
def test_control_characters_are_refused_anywhere(tmp_path: Path, text: str, key: str) -> None:
    found = errors_of(tmp_path / "ctl.toml", text)
    assert key in [k for k, _ in found], found
    assert any("control character" in message for _, message in found)


@pytest.mark.parametrize(
    "name",
    [
        "OMP_NUM_THREADS",
        "VLLM_CPU_NUM_OF_RESERVED_CPU",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_KVCACHE_SPACE",
        "HF_TOKEN",
        "TORCHINDUCTOR_FREEZING",
    ],
)
def test_env_the_plan_owns_is_refused(tmp_path: Path, name: str) -> None:
    message = only_key(tmp_path / "env.toml", f'[env]\n{name} = "1"')
    assert f": env.{name}: " in message


@pytest.mark.parametrize(
    "arg",
    ["--device", "--device=cpu", "--port", "--port=9000", "--shm-size=16g", "--max_model_len",
     "--dtype", "--served-model-name", "--kv-cache-memory-bytes=1", "--dev"],
)  # fmt: skip
def test_flags_the_plan_owns_are_refused(tmp_path: Path, arg: str) -> None:
    message = only_key(tmp_path / "args.toml", f'extra_args = ["--enforce-eager", "{arg}"]')
    assert ": extra_args[1]: " in message


def test_every_error_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    text = 'zzz = 1\nport = "x"\n[env]\nHF_TOKEN = "hf_abc"\nA = "1\\n2"\n'
    keys = {key for key, _ in errors_of(tmp_path / "many.toml", text)}
    assert keys == {"zzz", "port", "env.HF_TOKEN", "env.A"}


@pytest.mark.parametrize("stem", ["Upper", "-dash", "has_underscore", "a" * 64, "dot.ted"])
def test_bad_file_name_is_an_error(tmp_path: Path, stem: str) -> None:
    found = errors_of(tmp_path / f"{stem}.toml", "")
    assert found[0][0] == "file name"


def test_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    found = errors_of(path, 'model = "Qwen/Qwen3-0.6B"\nport = \n')
    assert found[0][1].startswith(f"{path}: is not valid TOML")


def test_folder_loads_each_file_on_its_own(ws: Workspace) -> None:
    ws.endpoint("good", "")
    (ws.config_dir / "bad.toml").write_text("nonsense = true\n")
    (ws.config_dir / "epycd.conf").write_text("admin_group = 'wheel'\n")
    (ws.config_dir / "notes.txt").write_text("not an endpoint")
    results = load_endpoints(ws.config_dir, precisions=PRECISIONS)
    assert [(r.name, r.ok) for r in results] == [("bad", False), ("good", True)]
    assert [p.name for p in endpoint_files(ws.config_dir)] == ["bad.toml", "good.toml"]


def test_missing_folder_is_no_endpoints(tmp_path: Path) -> None:
    assert load_endpoints(tmp_path / "absent", precisions=PRECISIONS) == []
