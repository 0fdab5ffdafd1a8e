"""The Debian package (packaging/deb) on a bare Debian 12 under real systemd (PID 1 in
systemd-nspawn): the machine, its local apt repository and pip mirrors are test_runtime.py's
(tests/tools/bare_host.sh), with no network. The package is built here by
packaging/deb/build.sh from a clean copy of the tree, as VERSION-1 and as the rebuilt
VERSION-2 from the same staging (build.sh --also-revision 2), both cached under CACHE/deb by
the hash of the files they are built from (build.sh takes its wheels from pip's index: a
changed tree needs it). Three boots, each running one phase of tests/e2e/inside_deb.py:

install  apt installs VERSION-1 and its dependencies from the local repository; epycd
         enabled and active, `epycctl detect --json` works, no endpoint unit; quickstart
         names the runtime step, which runs as named (apt and the pip mirrors, as
         test_runtime.py provisions the runtime); quickstart --yes with the tiny local model
         -> ready, a chat
upgrade  apt installs VERSION-2: the approval unchanged, the endpoint's unit the same process,
         epycd started again on VERSION-2, a chat
remove   `apt-get remove`: epycd gone, the endpoint running and named with how to stop it, which
         works; `apt-get purge`: the venv gone, the endpoint file, approval, unit and runtime
         kept and listed

and one boot on each other distribution the package is for (Debian 13, Ubuntu 24.04 and
22.04: bare trees and local repositories of the package's dependencies by
tests/tools/deb_hosts.sh), the phase `elsewhere`: apt installs VERSION-1, epycd active, the
venv on a Python of 3.11 or newer (python3.11 on Ubuntu 22.04, whose python3 is 3.10),
`epycctl detect` works, quickstart names the runtime step, `apt-get purge` leaves no epycd. The
runtime step itself is run on Debian 12 only: its wheelhouse (about 1 GB) is for one CPython.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    REPO,
    Boot,
    Machine,
    clean_copy,
    drive_with,
    endpoint,
    fresh_copy,
    kept_or_removed,
    require_parts,
)
from tests.e2e.test_runtime import (
    APT_REPO,
    BARE_ROOTFS,
    HINT,
    PYPI,
    TORCH_INDEX,
    machine_config,
    write_machine,
)
from tests.health.realvllm import CACHE

pytestmark = pytest.mark.e2e

PHASES = ("install", "upgrade", "remove")
NAME = "default"
UNIT = f"epyc-llm-{NAME}.service"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
DEB_CACHE = CACHE / "deb"
RUNTIME_STEP = (
    "apt-get install g++ python3-dev python3-venv numactl && "
    "/usr/share/epyc-llm/vllm-runtime.sh /opt/epyc-llm/runtime"
)


def tree_hash(src: Path) -> str:
    """What the packages are built from: the clean copy's files, but the tests and what
    build.sh writes there."""
    digest = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        relative = path.relative_to(src)
        if relative.parts[0] in {"tests", "build", "dist"}:
            continue
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_debs(src: Path) -> Path:
    """VERSION-1 and VERSION-2 of the package, built from src (or cached for its hash)."""
    if shutil.which("dpkg-buildpackage") is None:
        pytest.fail("no dpkg-buildpackage: apt-get install debhelper (tests/bootstrap.sh)")
    out = DEB_CACHE / tree_hash(src)
    names = [f"epyc-llm_{VERSION}-{revision}_amd64.deb" for revision in (1, 2)]
    if all((out / name).is_file() for name in names):
        return out
    DEB_CACHE.mkdir(parents=True, exist_ok=True)
    for stale in DEB_CACHE.iterdir():  # other trees' packages, a week old
        if time.time() - stale.stat().st_mtime > 7 * 86400:
            shutil.rmtree(stale, ignore_errors=True)
    staging = out.with_name(f"{out.name}.new-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    build = [str(src / "packaging" / "deb" / "build.sh"), "--out", str(staging)]
    done = subprocess.run(
        ["nice", "-n", "10", *build, "--also-revision", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """VERSION-1 and VERSION-2, built once for the module from a clean copy of the tree."""
    src = tmp_path_factory.mktemp("deb-src") / "src"
    clean_copy(src)
    return build_debs(src)


def test_lintian_reports_no_error(debs: Path) -> None:
    """Debian's own package checker, on the package as built: no errors."""
    if shutil.which("lintian") is None:
        pytest.fail("no lintian: apt-get install lintian (tests/bootstrap.sh)")
    deb = debs / f"epyc-llm_{VERSION}-1_amd64.deb"
    done = subprocess.run(
        ["lintian", "--fail-on", "error", str(deb)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [line for line in done.stdout.splitlines() if line.startswith("E:")], done.stdout


def new_machine(rootfs: Path, work: Path, debs: Path) -> tuple[Path, Path]:
    """A fresh copy of `rootfs` in WORK/rootfs made test_runtime.py's machine, driven by
    inside_deb.py, the packages in /srv/debs; its results folder WORK/results."""
    root, results = fresh_copy(rootfs, work)
    config = machine_config(work) | {"version": VERSION}
    write_machine(root, config)
    drive_with(root, "inside_deb.py")
    (root / "srv" / "debs").mkdir(parents=True)
    for deb in debs.glob("*.deb"):
        shutil.copy2(deb, root / "srv" / "debs" / deb.name)
    (results / "config.json").write_text(json.dumps(config, indent=2))
    return root, results


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory, debs: Path) -> Iterator[Machine]:
    require_parts(BARE_ROOTFS, APT_REPO, PYPI, TORCH_INDEX, hint=HINT)
    work = tmp_path_factory.mktemp("e2e-deb")
    root, results = new_machine(BARE_ROOTFS, work, debs)
    binds = [
        "--private-network",
        f"--bind={results}:/results",
        f"--bind-ro={APT_REPO}:/var/cache/e2e-apt",
        f"--bind-ro={PYPI}:/var/cache/e2e-pypi",
        f"--bind-ro={TORCH_INDEX}:/var/cache/e2e-torch",
    ]
    with kept_or_removed(work):
        yield Machine(root, results, binds, phases=PHASES)


ELSEWHERE = {"trixie": ("debian", "13"), "noble": ("ubuntu", "24.04"), "jammy": ("ubuntu", "22.04")}
"""The other distributions: suite -> (os-release ID, VERSION_ID)."""
DEB_HOSTS_HINT = "run tests/tools/deb_hosts.sh (or tests/bootstrap.sh)"


@pytest.fixture(scope="module", params=list(ELSEWHERE))
def elsewhere(
    request: pytest.FixtureRequest, debs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Boot]:
    """One boot of the package's install and purge on another distribution."""
    suite: str = request.param
    rootfs, repo = CACHE / f"rootfs-bare-{suite}", CACHE / f"deb-apt-{suite}"
    require_parts(rootfs, repo, hint=DEB_HOSTS_HINT)
    work = tmp_path_factory.mktemp(f"e2e-deb-{suite}")
    root, results = new_machine(rootfs, work, debs)
    binds = [
        "--private-network",
        f"--bind={results}:/results",
        f"--bind-ro={repo}:/var/cache/e2e-apt",
    ]
    with kept_or_removed(work):
        yield Machine(root, results, binds, phases=("elsewhere",)).boot("elsewhere")


@pytest.fixture(scope="module")
def install(machine: Machine) -> Boot:
    return machine.boot("install")


@pytest.fixture(scope="module")
def upgrade(machine: Machine) -> Boot:
    return machine.boot("upgrade")


@pytest.fixture(scope="module")
def remove(machine: Machine) -> Boot:
    return machine.boot("remove")


def output(boot: Boot, check: str) -> str:
    done = boot.one(check)
    text: str = done["stdout"] + done["stderr"]
    return text


def journal_tail(boot: Boot) -> str:
    entries = boot.all("journal_serving")[-1]["entries"] if boot.all("journal_serving") else []
    return "\n".join(str(e["message"]) for e in entries[-15:])


def assert_chat(boot: Boot) -> None:
    chat = boot.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] >= 1, chat


def test_apt_installs_the_package_and_its_dependencies(install: Boot) -> None:
    assert install.one("pid1")["comm"] == "systemd"
    fresh = install.one("fresh")
    assert fresh["pypi_resolves"] is False, "the machine reaches the network"
    assert not fresh["ensurepip"] and not fresh["found"]["epycctl"], fresh
    done = install.one("apt_install")
    assert done["rc"] == 0, output(install, "apt_install")[-3000:]
    assert "python3.11-venv" in done["stdout"], "apt did not bring the venv module"
    state = install.one("installed")
    assert state["version"] == {"rc": 0, "text": f"{VERSION}-1 ii"}, state["version"]
    assert state["epycd"]["ActiveState"] == "active", state["epycd"]
    assert state["epycd_enabled"] == "enabled"
    assert state["epycctl"] == "/usr/bin/epycctl"
    assert state["venv"]["bin/python"] and not state["venv"]["runtime"], state["venv"]
    assert state["endpoint_units"] == [], "installing the package made an endpoint unit"
    detect = install.one("detect")
    assert detect["rc"] == 0, detect["stderr"][-2000:]
    assert isinstance(json.loads(detect["stdout"]), dict)


def test_quickstart_names_the_runtime_step_and_it_works(install: Boot) -> None:
    refused = install.one("quickstart_no_runtime")
    assert refused["rc"] != 0, refused["stdout"][-2000:]
    assert install.one("runtime_step_named")["command"] == RUNTIME_STEP
    state = install.one("after_no_runtime")
    assert state["endpoint_units"] == [] and state["endpoint_sha"] is None, state
    step = install.one("runtime_step")
    assert step["rc"] == 0, output(install, "runtime_step")[-3000:]
    assert "ready: /opt/epyc-llm/runtime" in step["stdout"], step["stdout"][-3000:]


def test_quickstart_brings_the_endpoint_to_ready(install: Boot) -> None:
    install.assert_clean()
    done = install.one("quickstart")
    assert done["rc"] == 0, done["stderr"][-3000:] + journal_tail(install)
    assert f"{NAME} is ready." in done["stdout"], done["stdout"][-3000:]
    state = install.one("ready")
    assert (state["unit"]["ActiveState"], state["unit"]["SubState"]) == ("active", "running")
    assert state["approval_sha"] is not None and state["endpoint_sha"] is not None, state
    assert state["endpoint_units"] == [UNIT], state["endpoint_units"]
    assert endpoint(install.one("status")["status"], NAME)["state"] == "ready"
    assert_chat(install)
    print(
        f"\ne2e-deb: install boot {install.seconds} s "
        f"(apt {install.one('apt_install')['seconds']} s, "
        f"runtime step {install.one('runtime_step')['seconds']} s, "
        f"quickstart {done['seconds']} s)"
    )


def test_an_upgrade_keeps_the_endpoint_approved_and_running(upgrade: Boot) -> None:
    upgrade.assert_clean()
    before, after = upgrade.one("before_upgrade"), upgrade.one("upgraded")
    assert before["version"]["text"] == f"{VERSION}-1 ii", before["version"]
    assert after["version"] == {"rc": 0, "text": f"{VERSION}-2 ii"}, after["version"]
    assert before["unit"]["ActiveState"] == "active" and int(before["unit"]["MainPID"]) > 0
    for state in (upgrade.one("after_upgrade"), after):
        assert state["unit"]["ActiveState"] == "active", state["unit"]
        assert state["unit"]["MainPID"] == before["unit"]["MainPID"], "the endpoint restarted"
        assert state["approval_sha"] == before["approval_sha"] is not None
        assert state["endpoint_sha"] == before["endpoint_sha"]
        assert state["endpoint_units"] == [UNIT]
    assert after["epycd"]["ActiveState"] == "active", after["epycd"]
    assert after["epycd"]["MainPID"] != before["epycd"]["MainPID"], "epycd was not restarted"
    assert after["epycd_enabled"] == "enabled"
    assert_chat(upgrade)


def test_remove_leaves_the_endpoint_running_and_says_how_to_stop_it(remove: Boot) -> None:
    remove.assert_clean()
    before, removed = remove.one("before_remove"), remove.one("removed")
    said = output(remove, "apt_remove")
    assert f"approved endpoints keep running ({UNIT})" in said, said[-3000:]
    assert removed["epycd"]["ActiveState"] == "inactive", removed["epycd"]
    assert removed["epycctl"] == "", "epycctl is still on PATH"
    assert removed["version"]["text"] == f"{VERSION}-2 rc", removed["version"]
    assert removed["unit"]["ActiveState"] == "active", removed["unit"]
    assert removed["unit"]["MainPID"] == before["unit"]["MainPID"] != "0"
    assert removed["venv"]["bin/python"], "remove deleted the venv the endpoint runs on"
    stop = remove.one("stop")
    assert stop["argv"][0] == "/opt/epyc-llm/bin/epycctl"
    assert stop["rc"] == 0, stop["stdout"][-2000:] + stop["stderr"][-2000:]
    assert remove.one("stopped")["unit"]["ActiveState"] in {"inactive", "failed"}


def test_purge_deletes_the_venv_and_keeps_the_admins_files(remove: Boot) -> None:
    before, purged = remove.one("before_remove"), remove.one("purged")
    said = output(remove, "apt_purge")
    assert "purge deleted the venv /opt/epyc-llm" in said, said[-3000:]
    for kept in (
        "/var/lib/epyc-llm (approvals, state)",
        "the endpoint files /etc/epyc-llm/*.toml (1)",
        "the endpoint units epyc-llm-*",
        "the embedded runtime /opt/epyc-llm/runtime",
    ):
        assert kept in said, said[-3000:]
    assert purged["version"]["rc"] != 0 or purged["version"]["text"].startswith("un")
    assert purged["venv"] == {
        "bin/python": False,
        "lib": False,
        "pyvenv.cfg": False,
        "runtime": True,
    }
    assert purged["endpoint_sha"] == before["endpoint_sha"] is not None
    assert purged["approval_sha"] == before["approval_sha"] is not None
    assert "/etc/epyc-llm/epycd.conf" not in purged["etc"], "the conffile outlived the purge"
    assert not any("/examples" in path for path in purged["etc"]), purged["etc"]
    assert purged["endpoint_units"] == [UNIT], "the endpoint's unit file went with the purge"


def test_the_package_installs_and_purges_on_other_distributions(elsewhere: Boot) -> None:
    elsewhere.assert_clean()
    assert elsewhere.one("pid1")["comm"] == "systemd"
    os_release = elsewhere.one("os")
    suite = next(
        s for s, (i, v) in ELSEWHERE.items() if (i, v) == (os_release["id"], os_release["version"])
    )
    fresh = elsewhere.one("fresh")
    assert fresh["pypi_resolves"] is False and not fresh["found"]["epycctl"], fresh
    done = elsewhere.one("apt_install")
    assert done["rc"] == 0, output(elsewhere, "apt_install")[-3000:]
    state = elsewhere.one("installed")
    assert state["version"] == {"rc": 0, "text": f"{VERSION}-1 ii"}, state["version"]
    assert state["epycd"]["ActiveState"] == "active", (suite, state["epycd"])
    assert state["epycd_enabled"] == "enabled"
    assert state["epycctl"] == "/usr/bin/epycctl"
    assert state["endpoint_units"] == [], "installing the package made an endpoint unit"
    python = elsewhere.one("venv_python")
    assert python["rc"] == 0 and [int(n) for n in python["version"]] >= [3, 11], python
    if suite == "jammy":  # python3 is 3.10 there: the venv is python3.11's, from universe
        assert "python3.11-venv" in done["stdout"], "apt did not bring python3.11's venv module"
    detect = elsewhere.one("detect")
    assert detect["rc"] == 0, detect["stderr"][-2000:]
    assert isinstance(json.loads(detect["stdout"]), dict)
    assert elsewhere.one("quickstart_no_runtime")["rc"] != 0
    assert elsewhere.one("runtime_step_named")["command"] == RUNTIME_STEP
    assert elsewhere.one("after_no_runtime")["endpoint_units"] == []
    purged = elsewhere.one("purged")
    assert purged["epycd"]["ActiveState"] != "active", purged["epycd"]
    assert purged["epycctl"] == "" and not purged["venv"]["bin/python"], purged
