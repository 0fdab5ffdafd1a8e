"""`epycctl quickstart`: from an empty config folder to a serving endpoint in one command.

It picks the runtime this host has (podman with Quadlet, a reachable docker, or a host vLLM:
given with --vllm, found on PATH, else the embedded runtime of `install.sh --runtime`),
plans NAME.toml for the default model of data/epyc.json (or --model) together with the
other endpoint files, shows the plan, asks, writes the file, approves through the same steps
as `epycctl approve`, waits for the health gate with its progress, and prints the hand-off.

The endpoint file is planned from memory first and written only once the plan is clean and
the person said yes: no runtime, no model in the cache, a plan that does not fit, or a "no"
leave nothing behind. An existing NAME.toml with other content is never overwritten.
"""

from __future__ import annotations

import shutil
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import click
import tomli_w

from epycd import engines
from epycd.approval.record import Approval, approved_plans
from epycd.cli.approve import consent_options
from epycd.cli.options import TEXT
from epycd.errors import InputError, Refusal
from epycd.host.facts import HostFacts, HostVllmFacts, RuntimeFacts
from epycd.paths import runtime_install_command
from epycd.plan.endpoint import Plan
from epycd.plan.model import Runtime
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.route import container_runtime
from epycd.readfile import read_bytes
from epycd.settings import Settings
from epycd.spec import MAX_ENDPOINT_FILE_BYTES, key_choices
from epycd.spec.key_setting import AUTO_ENGINE
from epycd.stack import shipped_stack
from epycd.supervisor import SupervisorStatus
from epycd.text import escaped, escaped_lines

PROGRESS_INTERVAL_S = 1.0
DEFAULT_NAME = "default"


def vllm_candidate(given: str | None, runtime_dir: Path) -> str | None:
    """--vllm as given (an executable, or a venv/conda folder holding bin/vllm), else the
    `vllm` on PATH, else the embedded runtime's."""
    from epycd.host.runtimes import embedded_vllm

    if given is None:
        return shutil.which("vllm") or embedded_vllm(runtime_dir)
    path = Path(given).expanduser()
    if path.is_dir():
        path = path / "bin" / "vllm"
    return str(path.absolute())


def chosen_runtime(runtimes: RuntimeFacts, *, vllm_given: bool) -> Runtime | None:
    """What the planner's runtime = "auto" would pick; an explicit --vllm wins."""
    host_vllm = runtimes.vllm is not None and runtimes.vllm.present and not runtimes.vllm.error
    if vllm_given and host_vllm:
        return "host"
    return container_runtime(runtimes) or ("host" if host_vllm else None)


def found_text(runtimes: RuntimeFacts, runtime_dir: Path) -> list[str]:
    podman, docker, vllm = runtimes.podman, runtimes.docker, runtimes.vllm
    lines = [
        f"podman {podman.version}: no Quadlet (needs >= 4.4)"
        if podman.present
        else "podman: not installed",
        f"docker {docker.version or ''}: the daemon does not answer".replace(" :", ":")
        if docker.present
        else "docker: not installed",
    ]
    if vllm is None:
        lines.append(
            f"vllm: none given with --vllm and none on PATH; no embedded runtime in {runtime_dir}"
        )
    else:
        lines.append(f"vllm {vllm.path}: {vllm.error or 'cannot be used'}")
    return lines


def vllm_fixes(runtime_dir: Path) -> list[str]:
    return [
        "provision the embedded vLLM (about 1 GB to download): "
        f"{runtime_install_command(runtime_dir)}",
        "make docker reachable: systemctl enable --now docker (and check `docker version`)",
        "install podman >= 4.4, which brings Quadlet (Debian 13, Ubuntu 24.04, RHEL 9)",
        "point at a vLLM venv or conda env: epycctl quickstart --vllm /path/to/env/bin/vllm",
    ]


class NoRuntime(Exception):
    """Nothing on this host serves an engine's endpoints: what was looked at, and the
    one-time fixes."""

    def __init__(self, found: list[str], fixes: list[str]) -> None:
        super().__init__("no runtime to serve with")
        self.found = found
        self.fixes = fixes

    def __add__(self, other: NoRuntime) -> NoRuntime:
        return NoRuntime(self.found + other.found, self.fixes + other.fixes)


def no_runtime_text(missing: NoRuntime) -> str:
    """The one-time fix for a host with nothing to serve with."""
    found = "\n".join(f"  {line}" for line in missing.found)
    fixes = "\n".join(f"  - {line}" for line in missing.fixes)
    return (
        f"No runtime to serve with on this host:\n{found}\n\n"
        f"Fix one of these once, then run `epycctl quickstart` again:\n{fixes}\n"
        "Nothing was changed."
    )


def model_argument(model: str) -> str:
    """A hub id as given; a local folder or file as the absolute path the endpoint file
    needs."""
    path = Path(model).expanduser()
    if model.startswith((".", "/", "~")) or path.exists():
        return str(path.resolve())
    return model


def endpoint_document(model: str, runtime: Runtime, vllm: str | None) -> bytes:
    data: dict[str, str] = {"model": model}
    if runtime == "host":
        assert vllm is not None
        data |= {"runtime": "host", "vllm": vllm}
    return quickstart_document(data)


def quickstart_document(data: dict[str, str]) -> bytes:
    """An endpoint file quickstart writes: its keys, under a line that says what to do."""
    header = "# written by `epycctl quickstart`; edit, then `epycctl approve NAME`\n"
    return (header + tomli_w.dumps(data)).encode()


def existing_matches(target: Path, content: bytes) -> bool:
    """True when `target` already holds exactly `content`; refuses a different file."""
    try:
        current = read_bytes(target, MAX_ENDPOINT_FILE_BYTES)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise Refusal(f"cannot read it: {exc.strerror}", file=target) from None
    if current == content:
        return True
    name = target.stem
    raise Refusal(
        "exists with other content; quickstart does not overwrite it",
        file=target,
        fix=f"serve it as it is with `epycctl plan {name}` and `epycctl approve {name}`, "
        f"choose another name with `--name`, or move the file away and run quickstart again",
    )


def progress_line(elapsed: float, unit_state: str, status: SupervisorStatus | None) -> str:
    said = "no status file yet"
    if status is not None:
        said = f"supervisor {status.state}" + (f", phase {status.phase}" if status.phase else "")
    return f"  {elapsed:6.0f} s  unit {unit_state}; {said}"


class StartProgress:
    """While `systemctl start` waits for READY=1: the unit's state and the supervisor's
    phase, one line each time either changes, and the state it ended in. It only watches;
    the bound is the start's (the plan's start timeout)."""

    def __init__(self, service: str, status_file: Path | None, echo: Callable[[str], None]) -> None:
        self.service = service
        self.status_file = status_file
        self.echo = echo
        self.started = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.last: tuple[str, str | None, str | None] | None = None

    def __enter__(self) -> StartProgress:
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.done.set()
        self.thread.join(5)
        self.observe()

    def unit_state(self) -> str:
        from epycd import systemd

        try:
            return systemd.is_active(self.service)
        except systemd.SystemdError:
            return "unknown"

    def status(self) -> SupervisorStatus | None:
        from epycd.status.collect import read_supervisor

        return read_supervisor(self.status_file) if self.status_file else None

    def observe(self) -> None:
        unit, status = self.unit_state(), self.status()
        seen = (unit, status.state if status else None, status.phase if status else None)
        if seen != self.last:
            self.last = seen
            self.echo(progress_line(time.monotonic() - self.started, unit, status))

    def watch(self) -> None:
        while not self.done.wait(PROGRESS_INTERVAL_S):
            self.observe()


def host_vllm(settings: Settings, candidate: str | None) -> HostVllmFacts | None:
    """The probe of the candidate vLLM, cached like `epycctl status` caches it."""
    if candidate is None:
        return None
    from epycd.host.probe_cache import PROBE_CACHE, ProbeCache

    return ProbeCache(settings.run_dir / PROBE_CACHE).probe(candidate)


def plan_candidate(
    settings: Settings, target: Path, content: bytes, host: HostFacts
) -> EndpointResult:
    """NAME planned from `content` (not yet on disk) together with the other endpoint files,
    exactly as `epycctl plan` would plan it once written."""
    from epycd.plan.pipeline.current import endpoint_specs, plan_endpoints
    from epycd.render import render_for_plan
    from epycd.spec import parse_endpoint
    from epycd.stack import shipped_stack

    others = [spec for spec in endpoint_specs(settings) if spec.name != target.stem]
    candidate = parse_endpoint(target, content, precisions=shipped_stack().precisions)
    planned = plan_endpoints(
        settings,
        approved_plans(settings),
        render=render_for_plan,
        specs=[*others, candidate],
        host=host,
    )
    return next(r for r in planned.results if r.endpoint == target.stem)


def pick_runtime(
    settings: Settings, host: HostFacts, vllm: str | None
) -> tuple[Runtime, RuntimeFacts]:
    """The runtime to serve with, as `runtime = "auto"` picks it (an explicit --vllm wins),
    and the runtimes with the candidate vLLM probed; bad input for a --vllm that is no vLLM,
    NoRuntime when there is nothing to serve with."""
    containers = container_runtime(host.runtimes) is not None
    candidate = None if containers and vllm is None else vllm_candidate(vllm, settings.runtime_dir)
    runtimes = host.runtimes.model_copy(update={"vllm": host_vllm(settings, candidate)})
    runtime = chosen_runtime(runtimes, vllm_given=vllm is not None)
    if vllm is not None and runtime != "host":
        assert runtimes.vllm is not None
        raise InputError(
            f"{runtimes.vllm.path} cannot be used: {runtimes.vllm.error or 'not a vLLM'}",
            key="--vllm",
            fix="give the vllm executable (or the folder) of a venv/conda env with vLLM",
        )
    if runtime is None:
        raise NoRuntime(
            found_text(runtimes, settings.runtime_dir), vllm_fixes(settings.runtime_dir)
        )
    return runtime, runtimes


def missing_model_hint(result: EndpointResult, served: str) -> str | None:
    """Where the model is neither a local folder nor in the HF cache and the hub cannot be
    asked: the two ways quickstart can still serve."""
    if result.plan is not None or not any(
        p.key == "model" and "not in the local cache" in p.message for p in result.errors
    ):
        return None
    return (
        f"{served} cannot be fetched here. Either serve a model folder this host has:\n"
        "  epycctl quickstart --model /path/to/model   "
        "(then chgrp -R epyc-llm /path/to/model && chmod -R g+rX,o-rwx /path/to/model)\n"
        f"or put {served} in the HF cache named above (`hf download {served}` where the hub "
        "is reachable, with the same HF_HOME) and run quickstart again. Nothing was written."
    )


def shown_plan(settings: Settings, name: str, result: EndpointResult, host: HostFacts) -> Plan:
    """The plan's table, its units and fingerprint, as `approve` shows them; the plan, or
    its errors at their exit code."""
    from epycd.approval.install import unit_targets
    from epycd.cli.approve import planned_or_refused, units_text
    from epycd.cli.plan import confirmation_table

    click.echo(f"Plan for endpoint {name}\n")
    click.echo(confirmation_table(result, host))
    click.echo()
    plan = planned_or_refused(result)
    targets = unit_targets(settings, plan.units, plan.unit_dirs)
    click.echo(escaped_lines(units_text(plan, {k: str(v) for k, v in targets.items()})))
    click.echo(f"fingerprint {plan.fingerprint}\n")
    return plan


def echo_escaped(line: str) -> None:
    """A step of the install (paths, repairs) as the terminal may show it."""
    click.echo(escaped_lines(line))


def write_endpoint_file(target: Path, content: bytes) -> None:
    from epycd.approval.workflow import file_errors_refused
    from epycd.atomic import write_atomic

    with file_errors_refused():
        write_atomic(target, content, mode=0o644)
    click.echo(escaped(f"wrote {target}"))


def wait_and_hand_off(settings: Settings, approval: Approval, previous: Approval | None) -> None:
    """`systemctl (re)start` (blocks until READY=1 or the plan's start timeout) with
    progress, then the hand-off; on failure the gate's phase, reason and log tail."""
    from epycd import systemd
    from epycd.approval.workflow import main_service, start_approved
    from epycd.cli.status import handoff_text
    from epycd.status.collect import read_supervisor, supervisor_status_file
    from epycd.status.handoff import handoff

    name = approval.endpoint
    status_file = supervisor_status_file(settings, approval.plan, name)
    service = main_service(approval)
    timeout = approval.plan.decisions.start_timeout_s
    click.echo(f"waiting for {service} to pass the health gate (up to {timeout} s)")
    try:
        with StartProgress(service, status_file, click.echo):
            start_approved(approval, previous, click.echo)
    except systemd.SystemdError as exc:
        status = read_supervisor(status_file)
        if status is not None and status.state == "failed":
            if status.log_tail:
                click.echo(
                    "last log lines:\n" + escaped_lines("\n".join(status.log_tail)), err=True
                )
            raise Refusal(
                f"{name} did not become ready: failed in phase {status.phase}: {status.reason}",
                fix=f"see `epycctl status {name}` and `epycctl logs {name}`",
            ) from None
        raise Refusal(
            f"{name} did not become ready: {exc.message}",
            fix=f"see `epycctl status {name}` and `epycctl logs {name}`",
        ) from None
    click.echo(f"\n{name} is ready.\n")
    click.echo(escaped_lines(handoff_text(handoff(approval.plan))))


def prepared_host(name: str) -> tuple[Settings, HostFacts]:
    """The settings and the host's facts, once NAME is checked, the caller may administer
    and any interrupted install is recovered."""
    from epycd.approval.permissions import require_admin
    from epycd.approval.record import checked_name
    from epycd.approval.workflow import recover_interrupted
    from epycd.plan.pipeline.current import LOAD_SAMPLE_SECONDS, endpoint_specs, gather_host
    from epycd.settings import load_settings

    settings = load_settings()
    checked_name(name)
    require_admin(settings, "quickstart")
    for line in recover_interrupted(settings):
        click.echo(escaped_lines(line))
    host = gather_host(
        settings.host_root,
        sum(s.ok for s in endpoint_specs(settings)) + 1,
        LOAD_SAMPLE_SECONDS,
    )
    return settings, host


@dataclass(frozen=True)
class Candidate:
    """NAME.toml as quickstart would write it, and its plan."""

    target: Path
    content: bytes
    already: bool
    """The file exists and holds exactly `content`."""
    plan: Plan


@dataclass(frozen=True)
class Wanted:
    """What the person asked quickstart to serve, and with what."""

    engine: str
    model: str | None
    gguf_file: str | None
    vllm: str | None
    quantize: str | None = None


class QuickstartFile(ABC):
    """What `epycctl quickstart --engine ENGINE` writes: that engine's endpoint file for the
    wanted model. `QUICKSTART` in the engine's package's `cli.py`."""

    @abstractmethod
    def candidate(
        self, settings: Settings, host: HostFacts, wanted: Wanted
    ) -> tuple[str, bytes, str]:
        """(the model as the file gives it, the file's bytes, what serves it, for people);
        bad input for an option of another engine, NoRuntime where nothing can serve it."""

    @abstractmethod
    def runtime(self, settings: Settings, host: HostFacts) -> str:
        """What serves the engine's endpoints on this host, for people; NoRuntime, with what
        was looked at and the one-time fixes, where nothing does."""


class AutoQuickstart(QuickstartFile):
    """An `engine = "auto"` endpoint's file: the model alone; the plan chooses the engine by
    the profile (docs/tuning.md rule 12) among those this host has a runtime for."""

    def candidate(
        self, settings: Settings, host: HostFacts, wanted: Wanted
    ) -> tuple[str, bytes, str]:
        if wanted.vllm is not None:
            raise InputError(
                "--vllm names a vLLM to serve with", key="--vllm", fix="add --engine vllm"
            )
        runtime = self.runtime(settings, host)
        served = model_argument(wanted.model or shipped_stack().default_model)
        data = {"engine": AUTO_ENGINE, "model": served}
        if wanted.gguf_file is not None:
            data["gguf_file"] = wanted.gguf_file
        if wanted.quantize is not None:
            data["quantize"] = wanted.quantize
        return served, quickstart_document(data), runtime

    def runtime(self, settings: Settings, host: HostFacts) -> str:
        """The engines this host has a runtime for, the plan to choose among them; NoRuntime,
        with every engine's fixes, only where it has none."""
        found: list[str] = []
        missing = NoRuntime([], [])
        for engine in engines.ENGINES:
            try:
                found.append(
                    f"{engine.name} {quickstart_file(engine.name).runtime(settings, host)}"
                )
            except NoRuntime as of_engine:
                missing += of_engine
        if not found:
            raise missing
        return f'chosen by the plan (engine = "auto") from: {"; ".join(found)}'


def wanted_engine(engine: str | None, vllm: str | None) -> str:
    """--engine as given; without it auto, or vllm where --vllm names the vLLM to serve with."""
    if engine is not None:
        return engine
    return engines.DEFAULT_ENGINE.name if vllm is not None else AUTO_ENGINE


def quickstart_file(engine: str) -> QuickstartFile:
    if engine == AUTO_ENGINE:
        return AutoQuickstart()
    return engines.engine_named(engine).implementation("cli", "QUICKSTART", QuickstartFile)


def planned_candidate(
    settings: Settings, host: HostFacts, name: str, wanted: Wanted, *, yes: bool = False
) -> Candidate:
    """NAME.toml for the engine, runtime and model, planned and shown; nothing written yet,
    but what its plan waits for (its model converted), made once the person agrees."""
    try:
        served, content, runtime = quickstart_file(wanted.engine).candidate(settings, host, wanted)
    except NoRuntime as missing:
        click.echo(escaped_lines(no_runtime_text(missing)), err=True)
        raise Refusal("no runtime to serve with") from None
    target = settings.config_dir / f"{name}.toml"
    already = existing_matches(target, content)
    click.echo(escaped(f"runtime: {runtime}; model: {served}; endpoint file: {target}") + "\n")
    result = plan_candidate(settings, target, content, host)
    if result.prerequisite is not None:
        from epycd.approval.prerequisites import PlanChanged
        from epycd.cli.approve import make_first

        echo = click.echo
        try:
            make_first(
                name, result.prerequisite, settings, yes=yes, show=echo, progress=echo_escaped
            )
        except PlanChanged as changed:
            click.echo(escaped(f"{name}: {changed.message}; planned again"), err=True)
        result = plan_candidate(settings, target, content, host)
    hint = missing_model_hint(result, served)
    if hint:
        click.echo(escaped_lines(hint), err=True)
    return Candidate(target, content, already, shown_plan(settings, name, result, host))


@click.command("quickstart")
@click.option(
    "--engine",
    type=click.Choice([*(e.name for e in engines.ENGINES), AUTO_ENGINE]),
    default=None,
    help=f"the server: {AUTO_ENGINE} (the default: the plan chooses by the profile among the "
    "engines this host has a runtime for; docs/conversion.md), "
    + ", ".join(f"{e.name} ({e.serves})" for e in engines.ENGINES)
    + "; --vllm means vllm",
)
@click.option(
    "--model",
    type=TEXT,
    default=None,
    help="hub id or local model folder (default: data/epyc.json's); a GGUF model: "
    "a .gguf file, or a hub repository or folder with --gguf-file",
)
@click.option(
    "--gguf-file",
    type=TEXT,
    default=None,
    help="a GGUF model: the file's name in the --model repository or folder",
)
@click.option(
    "--quantize",
    type=click.Choice(key_choices("quantize")),
    default=None,
    help="the weights a safetensors model is converted to for llama.cpp (the file's "
    "`quantize`; default q8_0, near-lossless): q4_k_m is a quarter of bf16's size, as Ollama "
    "serves, and asks engine auto for llama.cpp whatever the profile",
)
@click.option(
    "--vllm",
    "vllm",
    type=TEXT,
    default=None,
    help="serve with this host vLLM: its `vllm` executable or its venv/conda folder",
)
@click.option(
    "--name", type=TEXT, default=DEFAULT_NAME, show_default=True, help="the endpoint (file) name"
)
@consent_options
@click.option(
    "--no-start", is_flag=True, help="Write the file, units and approval; do not touch systemd."
)
def quickstart(
    engine: str | None,
    model: str | None,
    gguf_file: str | None,
    quantize: str | None,
    vllm: str | None,
    name: str,
    yes: bool,
    accept_unvalidated: bool,
    no_start: bool,
    no_pull: bool,
) -> None:
    """Write NAME.toml for the default model (or --model, served by --engine), show the
    plan, approve it, start it, hand off."""
    from epycd.approval.record import current_approver
    from epycd.approval.workflow import gate, install_approved, make_approval
    from epycd.cli.approve import ask

    settings, host = prepared_host(name)
    wanted = Wanted(
        engine=wanted_engine(engine, vllm),
        model=model,
        gguf_file=gguf_file,
        vllm=vllm,
        quantize=quantize,
    )
    candidate = planned_candidate(settings, host, name, wanted, yes=yes)
    gate(candidate.plan, accept_unvalidated=accept_unvalidated)
    action = "approve" if candidate.already else f"write {candidate.target}, approve"
    ask(f"{action.capitalize()} {name} and {'install' if no_start else 'start'} it?", yes=yes)
    if not candidate.already:
        write_endpoint_file(candidate.target, candidate.content)
    approval = make_approval(
        settings, candidate.plan, host, current_approver(), accepted_unvalidated=accept_unvalidated
    )
    installed = install_approved(
        settings, approval, pull=not no_pull, touch_systemd=not no_start, log=echo_escaped
    )
    if no_start:
        click.echo(
            "--no-start: systemd not touched; the units start at the next boot "
            f"(`epycctl status {name}` then shows the hand-off)"
        )
        return
    wait_and_hand_off(settings, approval, installed.previous)
