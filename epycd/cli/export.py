"""`epycctl export kube NAME [--kserve] [--output DIR] [--model-volume CLAIM] [--json]`:
the plan `epycctl plan NAME` shows (the approved one when NAME is approved) as Kubernetes
manifests (epycd.export, docs/fleet.md). Multi-document YAML on stdout, led by the notes
as `#` comments, then the KubeletConfiguration fragment the nodes need; or with --output DIR
one file per object (KIND-NAME.yaml) plus kubelet-config.yaml and NOTES.txt. The notes also
go to stderr. Nothing is applied to a cluster.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from epycd.atomic import make_dirs
from epycd.cli.options import TEXT, NonEmptyPath
from epycd.cli.output import json_option, print_json
from epycd.errors import InputError, Refusal, file_error
from epycd.names import is_endpoint_name
from epycd.settings import load_settings

if TYPE_CHECKING:
    from epycd.export import KubeExport
    from epycd.host.facts import HostFacts
    from epycd.plan.endpoint import Plan

KUBELET_FILE = "kubelet-config.yaml"
NOTES_FILE = "NOTES.txt"


def comment(lines: list[str] | tuple[str, ...]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def dump(objects: list[dict[str, Any]]) -> str:
    import yaml

    class Plain(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        """A multi-line string (a chat template) as a literal block, readable as the file;
        PyYAML falls back to quoting what a block cannot hold (trailing spaces)."""
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Plain.add_representer(str, text)
    return yaml.dump_all(objects, Dumper=Plain, sort_keys=False)


def kubelet_text(done: KubeExport) -> str:
    from epycd.export.kubelet import KUBELET_COMMENT

    return comment(KUBELET_COMMENT) + dump([done.kubelet_config])


def stdout_text(name: str, done: KubeExport) -> str:
    """What stdout gets: the notes as comments, the objects, then the kubelet fragment."""
    header = [f"epyc-llm {name}: written by epycctl export kube; notes:"]
    notes = comment(header + [f"- {note}" for note in done.notes])
    return notes + dump(done.objects) + "---\n" + kubelet_text(done)


def object_file(obj: dict[str, Any]) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def check_folder(folder: Path, st: os.stat_result) -> None:
    """Refuse a folder someone else could plant a link in (to make the export write or
    overwrite a file anywhere the admin may): not the admin's own (or root's), or group- or
    world-writable."""
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{folder} is not a folder", file=folder, fix="give a folder as --output")
    if st.st_uid not in {os.geteuid(), 0} or st.st_mode & 0o022:
        raise Refusal(
            f"{folder} can be written by others (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}): a link planted there would redirect the export",
            file=folder,
            fix=f"give a folder only you can write as --output (or chmod go-w {folder})",
        )


def present_in(dir_fd: int, name: str) -> bool:
    """Anything named `name` in the folder, a link (even a dangling one) included."""
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def write_new(dir_fd: int, name: str, text: str) -> None:
    """A new file, never through a link: O_CREAT | O_EXCL | O_NOFOLLOW."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def replace_file(folder: Path, dir_fd: int, name: str, text: str) -> None:
    """`name` replaced by a new file written beside it (--force): os.replace swaps the
    name itself, whatever it is; a link there is refused rather than replaced."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(name, dir_fd=dir_fd).st_mode):
            raise Refusal(
                f"{folder / name} is not a regular file (a link?): not replaced",
                file=folder / name,
                fix=f"remove {folder / name}, or give another --output folder",
            )
    staged = f".{name}.{secrets.token_hex(8)}.tmp"
    write_new(dir_fd, staged, text)
    try:
        os.replace(staged, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        os.unlink(staged, dir_fd=dir_fd)
        raise


def write_files(folder: Path, files: dict[str, str], force: bool) -> None:
    """Every file, or none when one exists already (without --force). The folder is the
    admin's alone (`check_folder`), opened once, and no file is written through a link."""
    make_dirs(folder, 0o755)
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_folder(folder, os.fstat(dir_fd))
        present = sorted(name for name in files if present_in(dir_fd, name))
        if present and not force:
            raise Refusal(
                f"{', '.join(present)} exist(s) in {folder}",
                file=folder,
                fix="give another --output folder, or --force to overwrite",
            )
        for name, text in files.items():
            replace_file(folder, dir_fd, name, text)
    except OSError as exc:
        raise file_error(exc, f"writing into {folder}") from None
    finally:
        os.close(dir_fd)


def planned(name: str) -> tuple[Plan, HostFacts]:
    """(the approved plan, else the current one; the host's facts), as `epycctl plan`."""
    from epycd.approval.record import approved_plans, load_approval
    from epycd.plan.pipeline.current import endpoint_specs, plan_endpoints
    from epycd.render import render_for_plan

    settings = load_settings()
    specs = endpoint_specs(settings)
    approval = load_approval(settings, name) if is_endpoint_name(name) else None
    if name not in {spec.name for spec in specs} and approval is None:
        raise InputError(
            f"no endpoint file {name}.toml",
            file=settings.config_dir,
            fix=f"create {settings.config_dir / (name + '.toml')} (examples in etc/)",
        )
    results, host = plan_endpoints(
        settings, approved_plans(settings), render=render_for_plan, specs=specs
    )
    if approval is not None:
        return approval.plan, host
    result = next(r for r in results if r.endpoint == name)
    if result.plan is None:
        problem = result.errors[0] if result.errors else None
        raise Refusal(
            f"{name} has no plan: {problem.text if problem else 'refused'}",
            file=result.config_file,
            fix=f"epycctl plan {name} shows why",
        )
    return result.plan, host


@click.group("export")
def export() -> None:
    """Write an endpoint's plan for another engine (Kubernetes)."""


@export.command("kube")
@click.argument("name")
@click.option("--kserve", is_flag=True, help="a KServe InferenceService (HuggingFace runtime)")
@click.option(
    "--output",
    type=NonEmptyPath(path_type=Path, file_okay=False),
    default=None,
    help="write one file per object into this folder instead of stdout",
)
@click.option("--force", is_flag=True, help="overwrite files already in --output")
@click.option(
    "--model-volume",
    type=TEXT,
    default=None,
    metavar="CLAIM",
    help="PersistentVolumeClaim holding the model (a local folder) or the HF cache (a hub id)",
)
@json_option("print the objects, the kubelet fragment and the notes as JSON")
def kube(
    name: str,
    kserve: bool,
    output: Path | None,
    force: bool,
    model_volume: str | None,
    as_json: bool,
) -> None:
    """NAME's plan as Kubernetes manifests (printed or written, never applied)."""
    from epycd.export import export_kube
    from epycd.stack import shipped_stack

    plan, host = planned(name)
    done = export_kube(plan, host, shipped_stack(), kserve=kserve, model_volume=model_volume)
    kubelet = kubelet_text(done)
    if output is not None:
        files = {object_file(obj): dump([obj]) for obj in done.objects}
        files[KUBELET_FILE] = kubelet
        files[NOTES_FILE] = "".join(f"- {note}\n" for note in done.notes)
        write_files(output, files, force)
    if as_json:
        print_json(done.as_json())
    elif output is None:
        click.echo(stdout_text(name, done), nl=False)
    for note in done.notes:
        click.echo(f"note: {note}", err=True)
