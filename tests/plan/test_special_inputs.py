"""Special files and secret ownership in the planner: every file planning reads for an endpoint
(its endpoint file, api_key_file, hf_token_file, chat_template, its model's config.json) may be
a FIFO, /dev/zero, a symlink to it, a folder or over its size cap; planning returns at once (a
FIFO read would block it forever: an alarm fails the test), reports it against that endpoint's
file and key, and plans the healthy endpoint beside it as usual. A key or token file is accepted
only where root alone controls it (ssh's rule)."""

from __future__ import annotations

import grp
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epycd.host.facts import HostFacts
from epycd.plan.pipeline.result import EndpointResult
from epycd.readfile import MODEL_JSON_MAX_BYTES, SECRET_MAX_BYTES, TEMPLATE_MAX_BYTES
from epycd.spec import MAX_ENDPOINT_FILE_BYTES
from tests.plan.conftest import CHATML, PlanWorkspace, fake_host, write_model
from tests.secrets import root_folder, write_secret

PLAN_SECONDS = 20
"""Planning two endpoints in-process takes well under a second; a blocked read never ends."""
KEY = "test-key-0123456789"
TOKEN = "hf_test0000000000000000000000000000"


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"planning did not return within {seconds} s (a blocked read?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def plan(ws: PlanWorkspace, host: HostFacts) -> dict[str, EndpointResult]:
    with deadline(PLAN_SECONDS):
        return ws.plan(host)


def fifo(path: Path, _cap: int) -> str:
    os.mkfifo(path)
    return "FIFO"


def dev_zero(_path: Path, _cap: int) -> str:
    return "character device"


def link_to_dev_zero(path: Path, _cap: int) -> str:
    path.symlink_to("/dev/zero")
    return "character device"


def folder(path: Path, _cap: int) -> str:
    path.mkdir()
    return "folder"


def over_cap(path: Path, cap: int) -> str:
    with path.open("wb") as file:
        file.truncate(cap + 1)  # sparse
    os.chmod(path, 0o600)
    return "larger than"


KINDS: dict[str, Callable[[Path, int], str]] = {
    "fifo": fifo,
    "dev-zero": dev_zero,
    "symlink-to-dev-zero": link_to_dev_zero,
    "folder": folder,
    "over-the-cap": over_cap,
}
KEYS = ("api_key_file", "hf_token_file", "chat_template", "endpoint file", "config.json")
CAPS = {
    "api_key_file": SECRET_MAX_BYTES,
    "hf_token_file": SECRET_MAX_BYTES,
    "chat_template": TEMPLATE_MAX_BYTES,
    "endpoint file": MAX_ENDPOINT_FILE_BYTES,
    "config.json": MODEL_JSON_MAX_BYTES,
}


@pytest.fixture
def secure_ws() -> Iterator[PlanWorkspace]:
    with root_folder() as base:
        yield PlanWorkspace(base)


def special_endpoint(ws: PlanWorkspace, case: int, key: str, kind: str) -> tuple[Path, Path, str]:
    """Endpoint `bad` whose `key` names a special file of `kind`: (the path that is special,
    the endpoint file, a word its error must say)."""
    folder_ = ws.tmp / f"case-{case}"
    folder_.mkdir()
    special = Path("/dev/zero") if kind == "dev-zero" else folder_ / "special"
    if key == "endpoint file":
        config = ws.config_dir / "bad.toml"
        config.unlink(missing_ok=True)
        special = Path("/dev/zero") if kind == "dev-zero" else config
        if kind == "dev-zero":
            config.symlink_to("/dev/zero")
        word = KINDS[kind](config, CAPS[key]) if kind != "dev-zero" else "character device"
        return special, config, word
    if key == "config.json":
        model = write_model(folder_ / "model")
        (model / "config.json").unlink()
        special = model / "config.json"
        if kind == "dev-zero":
            special.symlink_to("/dev/zero")
            word = "character device"
        else:
            word = KINDS[kind](special, CAPS[key])
        config = ws.endpoint("bad", f'model = "{model}"\nsocket = 1\n')
        return special, config, word
    word = KINDS[kind](special, CAPS[key])
    config = ws.endpoint("bad", f'socket = 1\n{key} = "{special}"\n')
    return special, config, word


def assert_reported(
    result: EndpointResult, key: str, special: Path, config: Path, word: str
) -> None:
    assert result.plan is None and result.errors, result
    texts = [problem.text for problem in result.errors]
    assert result.exit_code == 2, texts
    if key == "config.json":
        assert any(str(special) in text and word in text for text in texts), texts
    elif key == "endpoint file":
        assert any(p.file == str(config) and word in p.text for p in result.errors), texts
    else:
        assert any(
            p.file == str(config) and p.key == key and str(special) in p.text and word in p.text
            for p in result.errors
        ), texts
    assert all("Traceback" not in text for text in texts)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key", KEYS)
def test_a_special_file_fails_its_endpoint_alone(
    secure_ws: PlanWorkspace, tmp_path: Path, key: str, kind: str
) -> None:
    ws = secure_ws
    host = fake_host(tmp_path, "genoa-9654-2s-nps1")
    ws.endpoint("good", "socket = 0\n")
    special, config, word = special_endpoint(ws, 0, key, kind)
    results = plan(ws, host)
    assert results["good"].plan is not None, [p.text for p in results["good"].errors]
    assert_reported(results["bad"], key, special, config, word)


@given(cases=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(list(KINDS))),
                      min_size=1, max_size=4))  # fmt: skip
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_property_any_special_files_leave_the_healthy_endpoint_planned(
    cases: list[tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Several endpoints, each with one special file of any kind under any key, and a
    healthy one: each bad one is reported against its own file and key, the healthy one is
    planned with the same fingerprint as alone."""
    host = fake_host(tmp_path_factory.mktemp("host"), "genoa-9654-2s-nps1")
    with root_folder() as base:
        ws = PlanWorkspace(base)
        ws.endpoint("good", "socket = 0\n")
        alone = plan(ws, host)["good"].plan
        assert alone is not None
        expected: dict[str, tuple[str, Path, Path, str]] = {}
        for index, (key, kind) in enumerate(cases):
            special, config, word = special_endpoint(ws, index, key, kind)
            name = f"bad-{index}"
            renamed = config.with_name(f"{name}.toml")
            config.rename(renamed)
            if special == config:
                special = renamed
            expected[name] = (key, special, renamed, word)
        results = plan(ws, host)
        good = results["good"].plan
        assert good is not None and good.fingerprint == alone.fingerprint
        for name, (its_key, its_special, its_config, its_word) in expected.items():
            assert_reported(results[name], its_key, its_special, its_config, its_word)


# Who owns a secret.


@pytest.mark.parametrize("key", ["api_key_file", "hf_token_file"])
def test_a_secret_owned_by_another_user_is_refused(
    secure_ws: PlanWorkspace, tmp_path: Path, key: str
) -> None:
    ws = secure_ws
    secret = write_secret(ws.tmp / "secrets" / "s", TOKEN + "\n")
    os.chown(secret, 65534, 65534)
    config = ws.endpoint("bad", f'{key} = "{secret}"\n')
    ws.endpoint("good", "socket = 1\n")
    results = plan(ws, fake_host(tmp_path, "genoa-9654-2s-nps1"))
    assert results["good"].plan is not None
    [problem] = results["bad"].errors
    assert (problem.file, problem.key, problem.exit_code) == (str(config), key, 2)
    assert f"{secret} is owned by uid 65534, not root" in problem.text
    assert f"chown root:root {secret}" in (problem.fix or "")
    assert TOKEN not in str(problem.model_dump())


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
@pytest.mark.parametrize("key", ["api_key_file", "hf_token_file"])
def test_a_secret_in_a_folder_others_may_write_is_refused(
    secure_ws: PlanWorkspace, tmp_path: Path, key: str, mode: int
) -> None:
    """Anyone who may write the folder may replace the file: refused, the sticky /tmp kind
    too (anyone may create the name first), naming the folder and its mode."""
    ws = secure_ws
    secret = write_secret(ws.tmp / "open" / "inner" / "s", TOKEN + "\n")
    (ws.tmp / "open").chmod(mode)
    config = ws.endpoint("bad", f'{key} = "{secret}"\n')
    [problem] = plan(ws, fake_host(tmp_path, "genoa-9654-2s-nps1"))["bad"].errors
    assert (problem.file, problem.key) == (str(config), key)
    assert f"its folder {ws.tmp / 'open'} is writable by others (mode {mode:o})" in problem.text
    assert f"chmod go-w {ws.tmp / 'open'}" in (problem.fix or "")


def test_a_secret_in_a_folder_of_another_user_is_refused(
    secure_ws: PlanWorkspace, tmp_path: Path
) -> None:
    ws = secure_ws
    secret = write_secret(ws.tmp / "theirs" / "s", KEY + "\n")
    os.chown(ws.tmp / "theirs", 65534, 65534)
    ws.endpoint("bad", f'api_key_file = "{secret}"\n')
    [problem] = plan(ws, fake_host(tmp_path, "genoa-9654-2s-nps1"))["bad"].errors
    assert f"its folder {ws.tmp / 'theirs'} is owned by uid 65534, not root" in problem.text


def test_a_secret_under_tmp_is_refused(secure_ws: PlanWorkspace, tmp_path: Path) -> None:
    """pytest's tmp_path is under the sticky, world-writable /tmp."""
    secret = write_secret(tmp_path / "s", KEY + "\n")
    secure_ws.endpoint("bad", f'api_key_file = "{secret}"\n')
    [problem] = plan(secure_ws, fake_host(tmp_path, "genoa-9654-2s-nps1"))["bad"].errors
    assert "its folder /tmp is writable by others (mode 1777)" in problem.text


def test_a_symlink_to_a_secret_elsewhere_is_judged_where_it_leads(
    secure_ws: PlanWorkspace, tmp_path: Path
) -> None:
    secret = write_secret(tmp_path / "s", KEY + "\n")
    link = secure_ws.tmp / "link.key"
    link.symlink_to(secret)
    secure_ws.endpoint("bad", f'api_key_file = "{link}"\n')
    [problem] = plan(secure_ws, fake_host(tmp_path, "genoa-9654-2s-nps1"))["bad"].errors
    assert "its folder /tmp is writable by others" in problem.text


def other_group() -> grp.struct_group:
    return next(g for g in grp.getgrall() if g.gr_gid != 0)


def test_the_admin_group_may_read_a_secret_only_when_roots_epycd_conf_names_it(
    secure_ws: PlanWorkspace, tmp_path: Path
) -> None:
    """root:ADMINS mode 0640 is accepted when root's epycd.conf names ADMINS as
    admin_group; without it (or for another group, or with group write) it is refused."""
    ws = secure_ws
    group = other_group()
    secret = write_secret(ws.tmp / "secrets" / "api.key", KEY + "\n", 0o640)
    os.chown(secret, 0, group.gr_gid)
    ws.endpoint("chat", f'api_key_file = "{secret}"\n')
    host = fake_host(tmp_path, "genoa-9654-2s-nps1")
    [problem] = plan(ws, host)["chat"].errors
    assert "readable or writable by others (mode 640)" in problem.text

    (ws.config_dir / "epycd.conf").write_text(f'admin_group = "{group.gr_name}"\n')
    assert plan(ws, host)["chat"].plan is not None

    secret.chmod(0o660)
    assert "mode 660" in plan(ws, host)["chat"].errors[0].text
    secret.chmod(0o640)
    (ws.config_dir / "epycd.conf").chmod(0o666)  # a file others may write names nobody
    assert "mode 640" in plan(ws, host)["chat"].errors[0].text


def test_a_root_owned_secret_in_root_folders_is_accepted(
    secure_ws: PlanWorkspace, tmp_path: Path
) -> None:
    secret = write_secret(secure_ws.tmp / "secrets" / "chat.jinja", CHATML)
    key = write_secret(secure_ws.tmp / "secrets" / "api.key", KEY + "\n")
    secure_ws.endpoint("chat", f'api_key_file = "{key}"\nchat_template = "{secret}"\n')
    result = plan(secure_ws, fake_host(tmp_path, "genoa-9654-2s-nps1"))["chat"]
    assert result.plan is not None, [p.text for p in result.errors]
