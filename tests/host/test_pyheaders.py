"""The Python headers of the interpreter that serves a host vLLM (epycd.host.pyheaders,
docs/tuning.md rule 4), read from fake host roots: a venv-based vllm (the embedded runtime's
layout, a pyenv base, virtualenv's pyvenv.cfg), vllms outside a venv (conda, a system
Python, merged /usr), pip's other shebang forms, and what cannot be told. Nothing is run:
the interpreters are stubs that would fail."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from epycd.host.facts import HostVllmFacts
from epycd.host.pyheaders import host_realpath, python_headers, with_python_headers
from tests.hosts import write_python, write_venv_vllm, write_vllm_script

RUNTIME_VLLM = "/opt/epyc-llm/runtime/bin/vllm"


@pytest.mark.parametrize("headers", [True, False])
def test_the_embedded_runtime_is_served_by_debians_python(tmp_path: Path, headers: bool) -> None:
    """The runtime venv made from /usr/bin/python3.11: its headers are python3.11-dev's."""
    write_python(tmp_path, "/usr", "3.11", headers=headers)
    vllm = write_venv_vllm(tmp_path)
    found = python_headers(tmp_path, vllm)
    assert found.vllm == RUNTIME_VLLM
    assert (found.interpreter, found.prefix, found.version) == (
        "/usr/bin/python3.11",
        "/usr",
        "3.11",
    )
    assert found.header == "/usr/include/python3.11/Python.h"
    assert found.present is headers and found.note is None


@pytest.mark.parametrize("headers", [True, False])
def test_a_venv_from_pyenv_names_the_pyenv_prefix(tmp_path: Path, headers: bool) -> None:
    """virtualenv's pyvenv.cfg (`version_info`, no `executable`) over a pyenv Python."""
    prefix = "/root/.pyenv/versions/3.11.7"
    base = write_python(tmp_path, prefix, "3.11", headers=headers)
    vllm = write_venv_vllm(
        tmp_path, "/srv/vllm-env", base, cfg_version="version_info = 3.11.7.final.0",
        executable=False,
    )  # fmt: skip
    found = python_headers(tmp_path, vllm)
    assert (found.interpreter, found.prefix, found.version) == (base, prefix, "3.11")
    assert found.header == f"{prefix}/include/python3.11/Python.h"
    assert found.present is headers


def test_the_venvs_own_headers_do_not_count(tmp_path: Path) -> None:
    """A venv has no include/python3.X of its own: Python.h must be the base's."""
    write_python(tmp_path, "/usr", "3.11", headers=False)
    vllm = write_venv_vllm(tmp_path)
    (tmp_path / "opt/epyc-llm/runtime/include/python3.11").mkdir(parents=True)
    (tmp_path / "opt/epyc-llm/runtime/include/python3.11/Python.h").write_text("/* */\n")
    assert python_headers(tmp_path, vllm).present is False


@pytest.mark.parametrize("headers", [True, False])
def test_a_conda_env_is_its_own_prefix(tmp_path: Path, headers: bool) -> None:
    interpreter = write_python(tmp_path, "/opt/conda/envs/vllm", "3.12", headers=headers)
    vllm = write_vllm_script(tmp_path, "/opt/conda/envs/vllm/bin/vllm", interpreter)
    found = python_headers(tmp_path, vllm)
    assert (found.interpreter, found.prefix, found.version) == (
        interpreter,
        "/opt/conda/envs/vllm",
        "3.12",
    )
    assert found.header == "/opt/conda/envs/vllm/include/python3.12/Python.h"
    assert found.present is headers


@pytest.mark.parametrize("headers", [True, False])
def test_a_system_vllm_follows_the_python3_link(tmp_path: Path, headers: bool) -> None:
    """`pip install --break-system-packages vllm`: /usr/local/bin/vllm run by /usr/bin/python3,
    a link to python3.11 whose headers are /usr/include/python3.11."""
    write_python(tmp_path, "/usr", "3.11", headers=headers)
    vllm = write_vllm_script(tmp_path, "/usr/local/bin/vllm", "/usr/bin/python3")
    found = python_headers(tmp_path, vllm)
    assert (found.interpreter, found.prefix, found.version) == (
        "/usr/bin/python3.11",
        "/usr",
        "3.11",
    )
    assert found.present is headers


def test_merged_usr_links_are_followed_inside_the_host(tmp_path: Path) -> None:
    """/bin -> usr/bin (Debian since 12): /bin/python3.11's prefix is /usr, not /."""
    write_python(tmp_path, "/usr", "3.11")
    (tmp_path / "bin").symlink_to("usr/bin")
    vllm = write_vllm_script(tmp_path, "/opt/tools/vllm", "/bin/python3.11")
    found = python_headers(tmp_path, vllm)
    assert (found.interpreter, found.prefix, found.present) == ("/usr/bin/python3.11", "/usr", True)


def test_a_linked_vllm_is_followed_inside_the_host(tmp_path: Path) -> None:
    write_python(tmp_path, "/usr", "3.11", headers=False)
    write_venv_vllm(tmp_path)
    (tmp_path / "usr/local/bin").mkdir(parents=True)
    (tmp_path / "usr/local/bin/vllm").symlink_to(RUNTIME_VLLM)
    found = python_headers(tmp_path, "/usr/local/bin/vllm")
    assert (found.interpreter, found.present) == ("/usr/bin/python3.11", False)


def test_env_shebangs_look_on_the_services_path(tmp_path: Path) -> None:
    write_python(tmp_path, "/usr", "3.11", headers=False)
    vllm = write_vllm_script(tmp_path, "/opt/tools/vllm", "/usr/bin/env python3")
    found = python_headers(tmp_path, vllm)
    assert (found.interpreter, found.present) == ("/usr/bin/python3.11", False)


def test_pips_sh_launcher_for_long_paths(tmp_path: Path) -> None:
    """distlib writes `#!/bin/sh` and `'''exec' "PYTHON" "$0" "$@"` when the interpreter's
    path is too long for a shebang."""
    venv = "/srv/" + "a-very-long-folder-name/" * 6 + "env"
    write_python(tmp_path, "/usr", "3.11", headers=False)
    vllm = write_venv_vllm(tmp_path, venv)
    script = tmp_path / vllm.lstrip("/")
    script.write_text(
        f"#!/bin/sh\n'''exec' \"{venv}/bin/python3\" \"$0\" \"$@\"\n' '''\nimport sys\n"
    )
    found = python_headers(tmp_path, vllm)
    assert (found.interpreter, found.present) == ("/usr/bin/python3.11", False)


def test_without_a_version_any_python3_headers_count(tmp_path: Path) -> None:
    """An interpreter called `python` outside a venv tells no version."""
    write_vllm_script(tmp_path, "/opt/py/bin/python", "/bin/sh")
    header = tmp_path / "opt/py/include/python3.13/Python.h"
    header.parent.mkdir(parents=True)
    header.write_text("/* Python.h */\n")
    vllm = write_vllm_script(tmp_path, "/opt/py/bin/vllm", "/opt/py/bin/python")
    found = python_headers(tmp_path, vllm)
    assert (found.version, found.header, found.present) == (
        None, "/opt/py/include/python3.13/Python.h", True,
    )  # fmt: skip
    header.unlink()
    missing = python_headers(tmp_path, vllm)
    assert (missing.header, missing.present) == ("/opt/py/include/python3.*/Python.h", False)


@pytest.mark.parametrize(
    ("make", "note"),
    [
        ("missing", "No such file or directory"),
        ("shell", "is run by /bin/sh, not by a Python"),
        ("no-shebang", "has no usable shebang"),
        ("no-interpreter", "no interpreter /opt/gone/bin/python3.11"),
    ],
)
def test_what_cannot_be_told_is_not_known(tmp_path: Path, make: str, note: str) -> None:
    """Not known is not missing: a shell wrapper (tests/health/realvllm.py's stock vLLM) or
    a vllm the host root does not hold keep the plan as without this check."""
    vllm = "/opt/env/bin/vllm"
    if make == "shell":
        write_vllm_script(tmp_path, vllm, "/bin/sh")
    elif make == "no-shebang":
        write_vllm_script(tmp_path, vllm, "")
        (tmp_path / vllm.lstrip("/")).write_text("import sys\n")
    elif make == "no-interpreter":
        write_vllm_script(tmp_path, vllm, "/opt/gone/bin/python3.11")
    found = python_headers(tmp_path, vllm)
    assert found.present is None
    assert note in (found.note or ""), found


def test_a_relative_vllm_is_not_known(tmp_path: Path) -> None:
    assert python_headers(tmp_path, "bin/vllm").present is None


def test_a_link_loop_is_not_known(tmp_path: Path) -> None:
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt/a").symlink_to("/opt/b")
    (tmp_path / "opt/b").symlink_to("/opt/a")
    with pytest.raises(OSError):
        host_realpath(tmp_path, "/opt/a")
    assert python_headers(tmp_path, "/opt/a").present is None


def test_absolute_links_stay_inside_the_root(tmp_path: Path) -> None:
    """/usr/bin/python3 -> /usr/bin/python3.11 of the host at the root, not this machine's."""
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3").symlink_to("/usr/bin/python3.11")
    assert host_realpath(tmp_path, "/usr/bin/python3") == PurePosixPath("/usr/bin/python3.11")
    assert host_realpath(tmp_path, "/usr/bin/../bin/./python3") == PurePosixPath(
        "/usr/bin/python3.11"
    )


def test_probed_facts_carry_the_headers_only_when_present(tmp_path: Path) -> None:
    write_python(tmp_path, "/usr", "3.11", headers=False)
    vllm = write_venv_vllm(tmp_path)
    probed = with_python_headers(HostVllmFacts(path=vllm, present=True), tmp_path)
    assert probed.python_headers is not None and probed.python_headers.present is False
    broken = HostVllmFacts(path=vllm, present=False, error="cannot import vllm")
    assert with_python_headers(broken, tmp_path).python_headers is None


@pytest.mark.vllm
def test_the_tests_vllm_venv_has_its_pyenv_headers() -> None:
    """The tests' real vLLM venv (tests/tools/vllm_venv.sh) is made from pyenv's 3.11.7,
    which has its headers: a real plan on this machine still compiles."""
    from tests.health.realvllm import real_vllm_executable

    vllm = real_vllm_executable()
    found = python_headers(Path("/"), str(vllm))
    assert found.present is True, found
    assert found.version == "3.11" and found.header is not None
    assert Path(found.header).is_file()
