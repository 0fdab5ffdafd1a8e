"""The Debian package's sources (packaging/deb): its version is the project's, its maintainer
scripts touch epycd.service alone (never an endpoint unit), its epycd.conf is the defaults,
and epycctl names the package's runtime step where the package is installed. The package
itself is built by packaging/deb/build.sh (about a minute with the network), not here."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

import epycd
from epycd.paths import runtime_install_command
from epycd.settings import settings_model
from tests.packaging.shellcheck import shellcheck
from tests.sandbox import REPO

DEB = REPO / "packaging" / "deb"
DEBIAN = DEB / "debian"
SCRIPTS = ("epyc-llm.postinst", "epyc-llm.prerm", "epyc-llm.postrm")


def project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def test_the_changelogs_top_entry_is_the_project_version() -> None:
    """A release bumps pyproject.toml and epycd.__version__ together and adds its changelog
    entry, VERSION-REVISION (build.sh refuses to build otherwise)."""
    top = (DEBIAN / "changelog").read_text().splitlines()[0]
    match = re.fullmatch(r"epyc-llm \((?P<version>[^)]+)\) \S+; urgency=\w+", top)
    assert match, top
    upstream, _, revision = match["version"].rpartition("-")
    assert upstream == project_version() == epycd.__version__
    assert revision.isdigit(), match["version"]


def test_every_changelog_entry_is_well_formed() -> None:
    text = (DEBIAN / "changelog").read_text()
    heads = re.findall(r"^epyc-llm \(([^)]+)\)", text, flags=re.MULTILINE)
    trailers = re.findall(
        r"^ -- .+ <.+@.+>  \w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d [+-]\d{4}$",
        text,
        flags=re.MULTILINE,
    )
    assert heads and len(heads) == len(trailers), text
    assert len(set(heads)) == len(heads), heads
    if shutil.which("dpkg-parsechangelog"):
        done = subprocess.run(
            ["dpkg-parsechangelog", "-l", str(DEBIAN / "changelog"), "-S", "Version"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0 and done.stdout.strip() == heads[0], done.stderr


def unit_lines(text: str) -> list[str]:
    """The lines of a maintainer script that act on a unit (comments and the lines it says
    to the admin left out)."""
    acting = re.compile(r"\b(systemctl|deb-systemd-invoke|deb-systemd-helper|invoke-rc\.d)\b")
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    commands = (line for line in lines if not line.strip().startswith(("say ", "echo ")))
    return [line for line in commands if acting.search(line)]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_maintainer_scripts_never_start_an_endpoint(script: str) -> None:
    """Installing, upgrading or removing acts on epycd.service alone (postinst's trigger
    restarts it on a new venv): an endpoint unit (epyc-llm-*) is only ever listed (prerm's
    note on remove), never enabled, started, stopped or restarted."""
    for line in unit_lines((DEBIAN / script).read_text()):
        words = line.split()
        if "list-units" in words:
            assert not {"enable", "start", "restart", "stop", "try-restart"} & set(words), line
        else:
            assert "epyc-llm-" not in line and "epycd.service" in words, line


def test_debhelper_handles_epycd_service_alone() -> None:
    """dh_installsystemd's snippets (enable, start, stop before an upgrade) are for the one
    unit the package ships, epycd.service; no other unit file is in debian/."""
    rules = (DEBIAN / "rules").read_text()
    calls = [line.split() for line in rules.splitlines() if "dh_installsystemd" in line]
    assert calls and all(
        "--name=epycd" in call for call in calls if call[0] != "override_dh_installsystemd:"
    )
    assert not list(DEBIAN.glob("*.service")), "the unit comes from units/epycd.service (build.sh)"
    build = (DEB / "build.sh").read_text()
    assert '"$stage/debian/epyc-llm.epycd.service"' in build


def test_the_units_documentation_line_is_the_one_build_sh_rewrites() -> None:
    unit = (REPO / "units" / "epycd.service").read_text().splitlines()
    assert "Documentation=file:///opt/epyc-llm/README.md" in unit


def test_the_shipped_epycd_conf_is_the_defaults() -> None:
    """Every line commented out (the file changes nothing), and each uncommented line is
    a real key with its default (admin_group, which has none, an example)."""
    text = (DEB / "epycd.conf").read_text()
    assert tomllib.loads(text) == {}
    uncommented = "\n".join(line[2:] for line in text.splitlines() if re.match(r"# \w+ = ", line))
    values = tomllib.loads(uncommented)
    assert set(values) <= set(settings_model().model_fields), values
    defaults = settings_model().model_fields
    for key, value in values.items():
        if key == "admin_group":
            continue
        if key == "runtime_dir":  # sys.prefix/runtime: the package's venv is /opt/epyc-llm
            assert value == "/opt/epyc-llm/runtime"
            continue
        assert str(defaults[key].default) == value, key
    assert "runtime_dir" in values and "metrics_listen" in values


def test_epycctl_names_the_packages_runtime_step(tmp_path: Path) -> None:
    recipe = tmp_path / "vllm-runtime.sh"
    runtime = Path("/opt/epyc-llm/runtime")
    assert runtime_install_command(runtime, recipe) == "packaging/install.sh --runtime"
    recipe.write_text("#!/bin/sh\n")
    packaged = runtime_install_command(runtime, recipe)
    assert packaged == f"apt-get install g++ python3-dev python3-venv numactl && {recipe} {runtime}"


def test_postinst_names_the_same_runtime_step() -> None:
    """The note after installing and epycctl's fix are one command."""
    postinst = (DEBIAN / "epyc-llm.postinst").read_text()
    recipe = Path("/usr/share/epyc-llm/vllm-runtime.sh")
    assert "vllm-runtime.sh usr/share/epyc-llm/" in (DEBIAN / "epyc-llm.install").read_text()
    expected = runtime_install_command(Path("$PREFIX/runtime"), recipe)
    if expected.startswith("packaging/"):  # the package is not installed on this machine
        expected = (
            f"apt-get install g++ python3-dev python3-venv numactl && {recipe} $PREFIX/runtime"
        )
    assert expected in postinst


def test_purge_keeps_the_admins_files() -> None:
    """postrm deletes the venv's own parts, never the state, the endpoint files, the units
    or the runtime."""
    postrm = (DEBIAN / "epyc-llm.postrm").read_text()
    removals = [line for line in postrm.splitlines() if re.search(r"\brm\b", line)]
    assert removals
    for line in removals:
        for kept in ("/var/lib/epyc-llm", "/etc/epyc-llm", "runtime", "/etc/systemd"):
            assert kept not in line, line


def test_the_scripts_pass_shellcheck() -> None:
    done = shellcheck(DEB / "build.sh", *(DEBIAN / script for script in SCRIPTS))
    assert done.returncode == 0, done.stdout


@pytest.mark.skipif(shutil.which("dpkg-buildpackage") is None, reason="debhelper is not installed")
@pytest.mark.parametrize("option", ["--revision", "--also-revision"])
@pytest.mark.parametrize("revision", ["1", "0", "2x", "02"])
def test_build_sh_refuses_a_revision_not_above_the_changelog(
    tmp_path: Path, revision: str, option: str
) -> None:
    """--revision N and --also-revision N (a rebuild to try an upgrade with) must be a number
    above the changelog's revision; build.sh says so before it downloads anything."""
    for part in ("pyproject.toml", "epycd/__init__.py", "packaging/deb"):
        target = tmp_path / part
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(REPO / part, target)
    build = tmp_path / "packaging" / "deb" / "build.sh"
    done = subprocess.run(
        [str(build), option, revision], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{option} " in done.stderr and "changelog's" in done.stderr, done.stderr
    assert not (tmp_path / "build" / "deb" / "tools").exists(), "it went on to pip"
