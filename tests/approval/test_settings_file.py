"""A bad epycd.conf is bad input for every command and for the boot check: exit 2, one line
naming the file (and the key where there is one), no traceback. The real CLI in a
subprocess, every EPYCD_* folder in a temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import hypothesis
import pytest
from hypothesis import strategies as st

from epycd.errors import EpycError
from epycd.settings import load_settings, settings_model
from tests.approval.conftest import ApprovalSandbox, make_env

COMMANDS = [
    ["detect"],
    ["check-model", "Qwen/Qwen3-0.6B"],
    ["estimate", "Qwen/Qwen3-0.6B", "--socket-gb", "64"],
    ["plan", "chat"],
    ["approve", "chat", "--yes", "--no-start"],
    ["remove", "chat", "--yes", "--no-stop"],
    ["status"],
    ["stop", "chat"],
    ["start", "chat"],
    ["logs", "chat"],
    ["quickstart", "--yes", "--no-start"],
]
BAD_FILES: dict[str, tuple[bytes, str]] = {
    "unknown key": (b"admin_grop = 'wheel'\n", "admin_grop"),
    "wrong type": (b"admin_group = 3\n", "admin_group"),
    "bad TOML": (b"admin_group = \n", "not valid TOML"),
    "non-UTF-8": (b"admin_group = '\xff'\n", "not UTF-8"),
    "no port": (b"metrics_listen = '0.0.0.0'\n", "metrics_listen: Value error, '0.0.0.0' is not"),
    "IPv6 bare": (b"metrics_listen = '::1:9464'\n", "[::1]:9464"),
}


def run(
    env: ApprovalSandbox, argv: list[str], *, module: str = "epycd"
) -> subprocess.CompletedProcess[str]:
    return env.epycctl(*argv, module=module, HF_HUB_OFFLINE="1")


def folder(env: ApprovalSandbox, name: str) -> Path:
    """An EPYCD_* folder (not through `env.settings`, which would read the bad file too)."""
    return Path(env.vars[f"EPYCD_{name.upper()}"])


def bad_conf(env: ApprovalSandbox, kind: str) -> tuple[Path, str]:
    content, said = BAD_FILES[kind]
    env.vars.pop("EPYCD_METRICS_LISTEN", None)  # the file's value, not the sandbox's, is read
    conf = folder(env, "config_dir") / "epycd.conf"
    conf.write_bytes(content)
    return conf, said


def assert_reported(done: subprocess.CompletedProcess[str], conf: Path, said: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(conf) in line and said in line


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_every_command_reports_a_bad_epycd_conf(env: ApprovalSandbox, kind: str) -> None:
    config_dir = folder(env, "config_dir")
    (config_dir / "chat.toml").write_text('model = "Qwen/Qwen3-0.6B"\n')
    conf, said = bad_conf(env, kind)
    for argv in COMMANDS:
        done = run(env, argv)
        assert_reported(done, conf, said)
    assert sorted(p.name for p in config_dir.iterdir()) == ["chat.toml", "epycd.conf"]
    assert not any(folder(env, "unit_dir").iterdir())


@pytest.mark.parametrize("kind", ["unknown key", "non-UTF-8", "no port"])
@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("epycd.approval.check", ["chat"]),
        ("epycd.approval.ready", ["chat"]),
        ("epycd.daemon", []),
    ],
)
def test_the_boot_gates_and_the_daemon_report_a_bad_epycd_conf(
    env: ApprovalSandbox, kind: str, module: str, argv: list[str]
) -> None:
    conf, said = bad_conf(env, kind)
    done = run(env, argv, module=module)
    assert_reported(done, conf, said)


def test_json_commands_report_it_as_json_too(env: ApprovalSandbox) -> None:
    conf, said = bad_conf(env, "unknown key")
    done = run(env, ["remove", "chat", "--yes", "--json"])
    assert_reported(done, conf, said)
    answer = json.loads(done.stdout)
    assert answer["endpoint"] == "chat" and answer["action"] == "remove"
    assert answer["result"] == "error" and said in answer["error"]


def test_help_works_with_a_bad_epycd_conf(env: ApprovalSandbox) -> None:
    bad_conf(env, "bad TOML")
    done = run(env, ["plan", "--help"])
    assert done.returncode == 0 and "Usage:" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_an_unreadable_epycd_conf_is_named_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = Path(tempfile.mkdtemp(prefix="epycd-conf-"))
    base.chmod(0o755)
    try:
        env = make_env(base, monkeypatch)
        conf = folder(env, "config_dir") / "epycd.conf"
        conf.write_text("admin_group = 'wheel'\n")
        conf.chmod(0o600)
        done = env.epycctl("status", module="epycd", user=65534)
    finally:
        shutil.rmtree(base)
    assert done.returncode == 1, done.stderr
    assert f"{conf}: cannot read: Permission denied" in done.stderr
    assert "Traceback" not in done.stderr


SETTING_KEYS = [*settings_model().model_fields, "bogus", "Admin_Group", "state-dir"]
TOML_VALUES = st.one_of(
    st.integers().map(str),
    st.floats().map(repr),
    st.text(max_size=20).map(json.dumps),
    st.sampled_from(["true", "[]", "[1, 'a']", "{}", "{ a = 1 }", "'/abs/path'", "'rel'", ""]),
)
CONF_TEXTS = st.lists(
    st.tuples(st.sampled_from(SETTING_KEYS), TOML_VALUES).map(lambda kv: f"{kv[0]} = {kv[1]}"),
    max_size=4,
).map(lambda lines: "\n".join(lines).encode())


@hypothesis.settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(content=st.one_of(CONF_TEXTS, st.binary(max_size=64)))
def test_any_epycd_conf_gives_settings_or_one_error_naming_it(
    content: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever epycd.conf holds, loading it gives settings or an error naming the file,
    exit 1 or 2: never another exception (which the CLI would print as a traceback)."""
    for name in list(os.environ):
        if name.upper().startswith("EPYCD_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("EPYCD_CONFIG_DIR", str(tmp_path))
    conf = tmp_path / "epycd.conf"
    conf.write_bytes(content)
    try:
        load_settings()
    except EpycError as exc:
        assert exc.exit_code in (1, 2)
        assert str(exc).startswith(f"{conf}: ")
