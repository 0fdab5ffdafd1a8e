"""The admin's side of the Debian package's end-to-end test (tests/e2e/test_deb.py), run inside
the booted machine by the same oneshot driver unit as tests/e2e/inside.py. It reuses the
helpers of inside.py and inside_runtime.py (copied beside it into /opt/e2e): the same bare
Debian 12 with no network, apt's only source the local repository, pip's the local PyPI
mirror and PyTorch CPU index. The two packages (VERSION-1 and the rebuilt VERSION-2) are in
DEBS. One phase per boot:

install  `apt-get install ./epyc-llm_VERSION-1_amd64.deb`: its dependencies from apt, epycd
         enabled and active, `epycctl detect` works, no endpoint unit; quickstart without a
         runtime names the runtime step, which is run as named; quickstart --yes with the
         local tiny model -> ready, a chat
upgrade  after the boot, the endpoint ready; `apt-get install ./epyc-llm_VERSION-2_amd64.deb`:
         the approval unchanged, the endpoint's unit the same process, epycd active again on
         the new package; a chat
remove   `apt-get remove epyc-llm`: epycd gone, the endpoint still running and named; stopped
         with the command the message gives; `apt-get purge`: the venv gone, the admin's
         files kept and listed

On the other distributions (Debian 13, Ubuntu 24.04 and 22.04: tests/tools/deb_hosts.sh's bare
trees, apt's only source a local repository of the package's dependencies), one boot:

elsewhere  `apt-get install ./epyc-llm_VERSION-1_amd64.deb`: the venv on a Python of 3.11 or
           newer, epycd enabled and active, `epycctl detect` works; quickstart without a
           runtime names the runtime step; `apt-get purge`: epycd and the venv gone
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import inside
from inside import (
    APPROVAL,
    CONFIG,
    PhaseFailed,
    give_model_to_group,
    journal,
    must,
    record,
    run,
    sha256,
    show,
    use_identity_root,
    wait_for_daemon,
    wait_until,
)
from inside_runtime import NAME, UNIT, chat, fresh_machine, status, url_of

DEBS = Path("/srv/debs")
PREFIX = Path("/opt/epyc-llm")
ENDPOINT_FILE = Path("/etc/epyc-llm") / f"{NAME}.toml"
inside.ENV |= {"DEBIAN_FRONTEND": "noninteractive"}


def deb(revision: int) -> str:
    return str(DEBS / f"epyc-llm_{CONFIG['version']}-{revision}_amd64.deb")


def installed_version() -> dict[str, Any]:
    done = run("dpkg-query", "-W", "-f", "${Version} ${db:Status-Abbrev}", "epyc-llm")
    return {"rc": done["rc"], "text": done["stdout"].strip()}


def endpoint_units() -> list[str]:
    """Every unit and unit file named epyc-llm-*: loaded, or on disk where systemd looks."""
    listed = run("systemctl", "list-units", "--all", "--no-legend", "--plain", "epyc-llm-*")
    files = run("systemctl", "list-unit-files", "--no-legend", "--plain", "epyc-llm-*")
    names = {line.split()[0] for line in (listed["stdout"] + files["stdout"]).splitlines()}
    return sorted(names)


def product_state(check: str) -> None:
    record(
        check,
        version=installed_version(),
        epycd=show("epycd.service", "LoadState", "ActiveState", "SubState", "MainPID"),
        epycd_enabled=run("systemctl", "is-enabled", "epycd.service")["stdout"].strip(),
        unit=show(UNIT),
        approval_sha=sha256(APPROVAL),
        endpoint_sha=sha256(ENDPOINT_FILE),
        endpoint_units=endpoint_units(),
        epycctl=run("sh", "-c", "command -v epycctl")["stdout"].strip(),
        venv={p: (PREFIX / p).exists() for p in ("bin/python", "lib", "pyvenv.cfg", "runtime")},
        etc=sorted(str(p) for p in Path("/etc/epyc-llm").glob("**/*")),
        state_dir=sorted(str(p) for p in Path("/var/lib/epyc-llm").glob("**/*")),
    )


def wait_ready(what: str, timeout: float) -> None:
    if not wait_until(what, lambda: inside.endpoint_state(NAME) == "ready", timeout, every=3):
        journal("journal_serving", UNIT)
        raise PhaseFailed(f"{what}: not within {timeout} s")


def phase_install() -> None:
    record("pid1", comm=Path("/proc/1/comm").read_text().strip())
    fresh_machine()
    must("apt_update", "apt-get", "update", timeout=300)  # the local repository's lists
    must("apt_install", "apt-get", "install", "-y", deb(1), timeout=900)
    product_state("installed")
    run("epycctl", "detect", "--json", timeout=180, check="detect")
    give_model_to_group()
    use_identity_root()
    model = ["--model", CONFIG["model_dir"], *CONFIG["consent_args"]]
    hint = run("epycctl", "quickstart", "--yes", *model, timeout=300, check="quickstart_no_runtime")
    product_state("after_no_runtime")
    found = re.search(r"provision the embedded vLLM[^:]*: (.+)", hint["stdout"] + hint["stderr"])
    if found is None:
        raise PhaseFailed("quickstart without a runtime named no runtime step")
    step = found.group(1).strip()
    record("runtime_step_named", command=step)
    # as named, with the -y a script gives apt-get
    must("runtime_step", "sh", "-c", step.replace("apt-get install ", "apt-get install -y "),
         timeout=1000)  # fmt: skip
    done = run("epycctl", "quickstart", "--yes", *model, timeout=1500, check="quickstart")
    if done["rc"] != 0:
        journal("journal_serving", UNIT)
        raise PhaseFailed(f"quickstart failed (exit {done['rc']}): {done['stderr'][-2000:]}")
    product_state("ready")
    chat("chat", url_of(status("status")))


def phase_upgrade() -> None:
    wait_for_daemon("boot_timeline")
    wait_ready("the endpoint is ready after the boot", 450)
    product_state("before_upgrade")
    must("apt_upgrade", "apt-get", "install", "-y", deb(2), timeout=900)
    product_state("after_upgrade")
    wait_until(
        "epycd is active on the new package",
        lambda: show("epycd.service", "ActiveState")["ActiveState"] == "active",
        120,
    )
    product_state("upgraded")
    chat("chat", url_of(status("status")))


def phase_remove() -> None:
    wait_for_daemon("boot_timeline")
    wait_ready("the endpoint is ready after the boot", 450)
    product_state("before_remove")
    removed = must("apt_remove", "apt-get", "remove", "-y", "epyc-llm", timeout=600)
    product_state("removed")
    stop = re.search(r"stop each with (\S+) stop NAME", removed["stdout"] + removed["stderr"])
    if stop is None:
        raise PhaseFailed("apt-get remove named no way to stop the running endpoint")
    run(stop.group(1), "stop", NAME, timeout=300, check="stop")
    product_state("stopped")
    must("apt_purge", "apt-get", "purge", "-y", "epyc-llm", timeout=600)
    product_state("purged")


def phase_elsewhere() -> None:
    record("pid1", comm=Path("/proc/1/comm").read_text().strip())
    release = dict(
        line.split("=", 1)
        for line in Path("/etc/os-release").read_text().splitlines()
        if "=" in line
    )
    record("os", id=release["ID"], version=release.get("VERSION_ID", "").strip('"'))
    fresh_machine()
    must("apt_update", "apt-get", "update", timeout=300)
    must("apt_install", "apt-get", "install", "-y", deb(1), timeout=900)
    product_state("installed")
    python = run(str(PREFIX / "bin" / "python"), "-c", "import sys; print(*sys.version_info[:2])")
    record("venv_python", rc=python["rc"], version=python["stdout"].split())
    run("epycctl", "detect", "--json", timeout=180, check="detect")
    give_model_to_group()
    use_identity_root()
    model = ["--model", CONFIG["model_dir"], *CONFIG["consent_args"]]
    hint = run("epycctl", "quickstart", "--yes", *model, timeout=300, check="quickstart_no_runtime")
    found = re.search(r"provision the embedded vLLM[^:]*: (.+)", hint["stdout"] + hint["stderr"])
    record("runtime_step_named", command=found.group(1).strip() if found else None)
    product_state("after_no_runtime")
    must("apt_purge", "apt-get", "purge", "-y", "epyc-llm", timeout=600)
    product_state("purged")


PHASES = {
    "install": phase_install,
    "upgrade": phase_upgrade,
    "remove": phase_remove,
    "elsewhere": phase_elsewhere,
}

if __name__ == "__main__":
    inside.PHASES = PHASES
    inside.main()
