"""Endpoint files: every error names the file and the key and says what is allowed; a bad
file never stops a good one."""

from __future__ import annotations

from pathlib import Path

import pytest

from epycd.spec import endpoint_files, load_endpoints, parse_endpoint, spec_model
from epycd.spec.keys import allowed
from epycd.stack import shipped_stack
from tests.plan.conftest import PlanWorkspace

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
restart = "no"
[env]
VLLM_LOGGING_LEVEL = "INFO"
"""
    result = parse_endpoint(tmp_path / "qwen3.toml", text.encode(), precisions=PRECISIONS)
    assert result.ok, result.errors
    assert result.spec == spec_model()(
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
        restart="no",
    )
    assert result.name == "qwen3"


def test_empty_file_takes_the_defaults(tmp_path: Path) -> None:
    result = parse_endpoint(tmp_path / "default.toml", b"", precisions=PRECISIONS)
    assert result.ok
    assert result.spec is not None
    assert result.spec.model is None and result.spec.port == "auto"
    assert result.spec.socket == "auto" and result.spec.runtime == "auto"
    assert result.spec.restart == "on-failure" and not result.spec.throughput_flags


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
        ('restart = "always"', "restart", '"on-failure" (the default) or "no"'),
        ("throughput_flags = 'yes'", "throughput_flags", "true or false"),
        ('model = "qwen3"', "model", "absolute path"),
        ('model = "models/qwen3/"', "model", "absolute path"),
        ('vllm = "bin/vllm"', "vllm", "absolute path"),
        ('hf_token_file = "token"', "hf_token_file", "absolute path"),
        ('dtype = "int8"', "dtype", "bfloat16, float16, float32"),
        ('served_model_name = "my model"', "served_model_name", "without spaces"),
        ("extra_args = '--enforce-eager'", "extra_args", "list of strings"),
        ("extra_args = ['--enforce-eager', 3]", "extra_args[1]", "list of strings"),
        ("env = { VLLM_A = 1 }", "env.VLLM_A", "table of NAME"),
        ('env = { "bad-name" = "1" }', "env.bad-name", "[A-Za-z_][A-Za-z0-9_]*"),
        ('image = "repo/x:tag; rm -rf /"', "image", "image reference"),
        ('revision = "main branch"', "revision", "branch, tag or commit"),
        ("extra_args = ['--seed', ';']", "extra_args[1]", "--flag=value"),
        ("extra_args = ['']", "extra_args[0]", "--flag=value"),
        ('served_model_name = ";"', "served_model_name", "another name"),
        ('aliases = ["my model"]', "aliases", "letters, digits and _ . : / @ + -"),
        ('aliases = "gpt-4o"', "aliases", "a list of at most 16 names"),
        ("aliases = [" + ", ".join(f'"a{i}"' for i in range(17)) + "]", "aliases", "at most 16"),
        ('aliases = ["gpt-4o", "gpt-4o"]', "aliases", "given twice"),
        ('served_model_name = "chat"\naliases = ["chat"]', "aliases", "given twice"),
        ('env = { VLLM_A = "\u0085" }', "env.VLLM_A", "one line"),
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
        ('env = { VLLM_A = "x\\u2028y" }', "env.VLLM_A"),
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
    text = 'zzz = 1\nport = "x"\n[env]\nHF_TOKEN = "hf_abc"\nVLLM_A = "1\\n2"\n'
    keys = {key for key, _ in errors_of(tmp_path / "many.toml", text)}
    assert keys == {"zzz", "port", "env.HF_TOKEN", "env.VLLM_A"}


@pytest.mark.parametrize("stem", ["Upper", "-dash", "has_underscore", "a" * 64, "dot.ted"])
def test_bad_file_name_is_an_error(tmp_path: Path, stem: str) -> None:
    found = errors_of(tmp_path / f"{stem}.toml", "")
    assert found[0][0] == "file name"


def test_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    found = errors_of(path, 'model = "Qwen/Qwen3-0.6B"\nport = \n')
    assert found[0][1].startswith(f"{path}: is not valid TOML")


def test_folder_loads_each_file_on_its_own(ws: PlanWorkspace) -> None:
    ws.endpoint("good", "")
    (ws.config_dir / "bad.toml").write_text("nonsense = true\n")
    (ws.config_dir / "epycd.conf").write_text("admin_group = 'wheel'\n")
    (ws.config_dir / "notes.txt").write_text("not an endpoint")
    results = load_endpoints(ws.config_dir, precisions=PRECISIONS)
    assert [(r.name, r.ok) for r in results] == [("bad", False), ("good", True)]
    assert [p.name for p in endpoint_files(ws.config_dir)] == ["bad.toml", "good.toml"]


def test_missing_folder_is_no_endpoints(tmp_path: Path) -> None:
    assert load_endpoints(tmp_path / "absent", precisions=PRECISIONS) == []


@pytest.mark.parametrize(
    ("arg", "fix"),
    [("-tp", "--tensor-parallel-size"), ("-tp=2", "--tensor-parallel-size"),
     ("-pp", "--pipeline-parallel-size"), ("-dp", "--data-parallel-size"),
     ("-O3", "--optimization-level"), ("-Odecode", "--optimization-level"),
     ("-O", "--optimization-level"), ("-q", "--quantization"), ("-dpl", "long form"),
     ("--config", "could set any flag"), ("--config=/etc/vllm.yaml", "could set any flag"),
     ("--tensor-parallel-size=2", "one socket"), ("--tensor_parallel_size", "one socket"),
     ("--pipeline-parallel-size", "one socket"), ("--data-parallel-size-local=2", "one socket"),
     ("--data_parallel_address", "one socket"), ("--dp-supervisor-probe-interval-s", "socket"),
     ("--distributed-executor-backend=mp", "one socket"), ("--nnodes", "one socket"),
     ("--numa-bind-cpus=0-3", "pins the CPUs"), ("--uds=/tmp/s", "host and port keys"),
     ("--headless", "serves its API itself"), ("--host=0.0.0.0", "host key"),
     ("--host", "host key"), ("--api-server-count=4", "one API server"), ("--grpc", "HTTP"),
     ("--ssl-keyfile=/k.pem", "plain HTTP"), ("--tensor-parallel-size.x=2", "one socket"),
     ("--download-dir=/tmp", "HF cache")],
)  # fmt: skip
def test_aliases_and_indirection_cannot_override_the_plan(
    tmp_path: Path, arg: str, fix: str
) -> None:
    message = only_key(tmp_path / "args.toml", f'extra_args = ["--enforce-eager", "{arg}"]')
    assert ": extra_args[1]: " in message
    assert fix in message


@pytest.mark.parametrize(
    "args",
    [["--config-format=hf"], ["--model-impl", "vllm"], ["--seed", "-1"],
     ["--optimization-level=3"], ["--compilation-config.mode=3"], ["--quantization", "fp8"],
     ["--max-num-batched-tokens=4096"], ["--enable-prefix-caching"]],
)  # fmt: skip
def test_long_flags_the_plan_does_not_own_pass(tmp_path: Path, args: list[str]) -> None:
    text = "extra_args = [" + ", ".join(f'"{arg}"' for arg in args) + "]\n"
    result = parse_endpoint(tmp_path / "ok.toml", text.encode(), precisions=PRECISIONS)
    assert result.ok, result.errors


@pytest.mark.parametrize(
    ("name", "said"),
    [("NOTIFY_SOCKET", "readiness"), ("LD_PRELOAD", "other code"),
     ("LD_LIBRARY_PATH", "libraries"), ("PATH", "programs"), ("PYTHONPATH", "Python code"),
     ("HF_HOME", "HF cache"), ("GOMP_CPU_AFFINITY", "pins the threads"),
     ("KMP_AFFINITY", "pins the threads"), ("CUDA_VISIBLE_DEVICES", "CPU"),
     ("VLLM_PLUGINS", "other code"), ("VLLM_CACHE_ROOT", "other files"),
     ("TORCHINDUCTOR_CACHE_DIR", "other files"), ("VLLM_HOST_IP", "listens"),
     ("VLLM_PORT", "listens"), ("VLLM_DP_SIZE", "one socket"),
     ("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "/health"), ("MALLOC_CONF", "allowed: VLLM_*"),
     ("ld_preload", "other code"), ("OMP_SCHEDULE", "allowed: VLLM_*"),
     ("HF_ENDPOINT", "allowed: VLLM_*"), ("PYTHONSTARTUP", "other code")],
)  # fmt: skip
def test_env_that_takes_over_the_server_is_refused(tmp_path: Path, name: str, said: str) -> None:
    message = only_key(tmp_path / "env.toml", f'[env]\n{name} = "1"')
    assert f": env.{name}: " in message
    assert said in message


@pytest.mark.parametrize(
    "name",
    ["VLLM_LOGGING_LEVEL", "VLLM_ENGINE_READY_TIMEOUT_S", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
     "TOKENIZERS_PARALLELISM", "TORCHINDUCTOR_COMPILE_THREADS", "ZENDNNL_MATMUL_ALGO",
     "ZENTORCH_LINEAR"],
)  # fmt: skip
def test_env_that_tunes_the_server_passes(tmp_path: Path, name: str) -> None:
    result = parse_endpoint(
        tmp_path / "ok.toml", f'[env]\n{name} = "1"\n'.encode(), precisions=PRECISIONS
    )
    assert result.ok, result.errors


HF_LIKE = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"


@pytest.mark.parametrize(
    ("text", "key", "fix"),
    [('[env]\nVLLM_API_KEY = "s3cr3t-value"', "env.VLLM_API_KEY", "api_key_file"),
     ('[env]\nMY_SERVICE_KEY = "s3cr3t-value"', "env.MY_SERVICE_KEY", "api_key_file"),
     ('[env]\nVLLM_DB_PASSWORD = "s3cr3t-value"', "env.VLLM_DB_PASSWORD", "api_key_file"),
     ('[env]\nHUGGING_FACE_HUB_TOKEN = "s3cr3t-value"', "env.HUGGING_FACE_HUB_TOKEN",
      "hf_token_file"),
     (f'[env]\nVLLM_LOGGING_PREFIX = "{HF_LIKE}"', "env.VLLM_LOGGING_PREFIX", "hf_token_file"),
     ('[env]\nHTTPS_PROXY = "http://bob:s3cr3t-value@proxy:3128"', "env.HTTPS_PROXY",
      "api_key_file"),
     ('extra_args = ["--api-key=s3cr3t-value"]', "extra_args[0]", "api_key_file"),
     ('extra_args = ["--api-key", "s3cr3t-value"]', "extra_args[0]", "api_key_file"),
     ('extra_args = ["--hf-token=s3cr3t-value"]', "extra_args[0]", "hf_token_file"),
     (f'extra_args = ["--seed", "{HF_LIKE}"]', "extra_args[1]", "hf_token_file")],
)  # fmt: skip
def test_secrets_are_refused_with_the_fix_and_never_echoed(
    tmp_path: Path, text: str, key: str, fix: str
) -> None:
    message = only_key(tmp_path / "secret.toml", text)
    assert f": {key}: " in message
    assert fix in message
    assert "s3cr3t" not in message and HF_LIKE not in message


def test_every_key_has_its_allowed_values_for_the_error_message() -> None:
    """A bad value's fix names what the key allows; the pointer to the docs (not on the
    admin's machine) is never what an admin sees."""
    assert set(allowed()) == set(spec_model().model_fields)
