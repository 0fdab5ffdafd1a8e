"""`epycctl check-model` and `epycctl estimate` (docs/architecture.md, "Command contract")."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import click

from epycd import engines
from epycd.cli.options import CONTEXT_TOKENS, SEQUENCES, SOCKET_GIB, TEXT
from epycd.cli.output import EXIT_NO, json_option, print_json, table
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.model.check import inspect_model
from epycd.model.facts import ModelFacts
from epycd.model.formats import format_named, in_engines_own_format
from epycd.sizes import GIB
from epycd.text import escaped


def check_model_json(facts: ModelFacts, judged_by: str | None = None) -> dict[str, Any]:
    return {
        "model": facts.model,
        "revision": facts.revision,
        "format": facts.format,
        "engines": [engine.model_dump() for engine in facts.engines],
        "gguf": facts.gguf.model_dump() if facts.gguf else None,
        "architectures": facts.architectures,
        "supported": facts.support.supported,
        "kind": facts.support.kind,
        "launchable": facts.launchable,
        "primary_endpoint": facts.primary_endpoint,
        "supported_endpoints": facts.supported_endpoints,
        "chat_template": {
            "status": facts.chat_template.status,
            "names": facts.chat_template.names,
            "source": facts.chat_template.source,
        },
        "gated": facts.gated,
        "vllm_version": facts.support.vllm_version,
        "table_version": facts.support.table_version,
        "registry_source": facts.support.source,
        "judged_by": judged_by,
        "weights_bytes": facts.weights_bytes,
        "weights_source": facts.weights_source,
        "kv_bytes_per_token": facts.kv_bytes_per_token,
        "max_position_embeddings": facts.max_position_embeddings,
        "message": facts.message,
        "warnings": facts.warnings,
    }


def servable(facts: ModelFacts) -> bool:
    return facts.launchable or facts.support.kind == "undetermined"


GGUF_FILE = click.option(
    "--gguf-file",
    type=TEXT,
    default=None,
    help="the GGUF file of a hub repository (in the local HF cache) or of a folder",
)


@click.command("check-model")
@click.argument("model")
@click.option("--revision", type=TEXT, default=None, help="branch, tag or commit (default main)")
@click.option(
    "--vllm-version",
    type=TEXT,
    default=None,
    help="vLLM version to check against (default: the vLLM that serves on this host)",
)
@click.option(
    "--vllm", "vllm_executable", type=TEXT, default=None, help="ask this host vLLM's own registry"
)
@GGUF_FILE
@json_option("stable JSON for scripts")
def check_model(
    model: str,
    revision: str | None,
    vllm_version: str | None,
    vllm_executable: str | None,
    gguf_file: str | None,
    as_json: bool,
) -> None:
    """Can vLLM or llama.cpp serve MODEL (hub id, absolute folder or .gguf file) as a
    chat/completions endpoint?"""
    version, judged_by = judging_vllm(vllm_version, vllm_executable)
    facts = inspect_model(
        model,
        revision=revision,
        vllm_version=version,
        vllm_executable=vllm_executable,
        gguf_file=gguf_file,
    )
    if as_json:
        print_json(check_model_json(facts, judged_by))
    else:
        _print_check(facts, judged_by)
    if not servable(facts):
        sys.exit(EXIT_NO)


def judging_vllm(vllm_version: str | None, vllm_executable: str | None) -> tuple[str | None, str]:
    """The vLLM version a model is judged by and whose it is: --vllm-version as asked, the
    --vllm's own registry, else the vLLM `runtime = "auto"` serves with here."""
    if vllm_version is not None:
        return vllm_version, "as asked (--vllm-version)"
    if vllm_executable is not None:
        return None, f"the vLLM at {vllm_executable}"
    return serving_vllm()


def serving_vllm() -> tuple[str, str]:
    """The version of the vLLM `runtime = "auto"` (and quickstart) serves with on this host:
    the recipe's image where podman with Quadlet or docker serves, else the host vLLM (on
    PATH, else the embedded runtime) as probed, else the embedded runtime's validated pair,
    which `install.sh --runtime` provisions."""
    from epycd.cli.quickstart import host_vllm, vllm_candidate
    from epycd.host.runtimes import probe_docker, probe_podman
    from epycd.plan.route import container_runtime
    from epycd.settings import load_settings
    from epycd.stack import shipped_stack

    stack = shipped_stack()
    runtime = container_runtime(RuntimeFacts(podman=probe_podman(), docker=probe_docker()))
    if runtime is not None:
        return stack.vllm_version, f"the vLLM that serves here: the recipe's image ({runtime})"
    settings = load_settings()
    found = host_vllm(settings, vllm_candidate(None, settings.runtime_dir))
    if found is not None and found.present and found.version:
        return found.version, f"the vLLM that serves here: the host vLLM {found.path}"
    runtime_pair = stack.embedded_runtime
    return (
        runtime_pair.vllm_version,
        f"the embedded runtime's, which serves where no container runtime is "
        f"(not installed in {settings.runtime_dir})",
    )


def _print_check(facts: ModelFacts, judged_by: str) -> None:
    template = facts.chat_template
    names = f" ({', '.join(template.names)})" if template.names else ""
    rows = [
        ("model", facts.model),
        ("revision", facts.revision or "-"),
        ("format", _format_row(facts)),
        ("architectures", ", ".join(facts.architectures) or "-"),
        ("kind", _kind(facts)),
        ("vLLM", _vllm_row(facts)),
        ("judged by", judged_by),
        ("served by", ", ".join(e.engine for e in facts.engines if e.supported) or "none"),
        ("chat template", f"{template.status}{names}"),
        ("primary endpoint", facts.primary_endpoint or "-"),
        ("endpoints", ", ".join(facts.supported_endpoints) or "-"),
        ("launchable", "yes" if facts.launchable else "no"),
        ("gated", {True: "yes", False: "no", None: "unknown"}[facts.gated]),
    ]
    click.echo(table(rows))
    for warning in facts.warnings:
        click.echo(escaped(f"warning: {warning}"))
    click.echo(escaped(facts.message))


def _format_row(facts: ModelFacts) -> str:
    gguf = facts.gguf
    if gguf is None:
        return facts.format
    size = (
        f"{gguf.size_bytes / GIB:.2f} GiB"
        if gguf.size_bytes >= GIB // 10
        else f"{gguf.size_bytes / 1024**2:.1f} MiB"
    )
    return f"GGUF {gguf.file_type or 'unknown type'}, {size}, {gguf.file}"


def _kind(facts: ModelFacts) -> str:
    """vLLM's kind of a Hugging Face model; the kind its own engine gives a model in an
    engine's format."""
    own = format_named(facts.format)
    return next((e.kind for e in facts.engines if own and e.engine == own.engine), "undetermined")


def _vllm_row(facts: ModelFacts) -> str:
    support = facts.support
    if in_engines_own_format(facts):
        return f"{support.vllm_version}: no (its CPU backend loads no {facts.format.upper()})"
    if support.source == "installed-vllm":
        return f"{support.vllm_version} (installed vLLM's registry)"
    table_note = f"table {support.table_version}" if support.table_version else "no table"
    return f"{support.vllm_version} ({table_note})"


class FormatEstimate(ABC):
    """`epycctl estimate` of a model by the engine that serves its format, in that engine's
    terms: `ESTIMATE` in its package's `cli.py` (an engine's own format, `epycd.model.formats`;
    a Hugging Face model's, the default engine's)."""

    @abstractmethod
    def run(
        self,
        facts: ModelFacts,
        max_model_len: int | None,
        max_num_seqs: int | None,
        socket_gb: float | None,
        as_json: bool,
    ) -> None:
        """Print the fit in one socket's memory; exit `EXIT_NO` where it does not fit."""


@click.command("estimate")
@click.argument("model")
@click.option(
    "--max-model-len",
    type=CONTEXT_TOKENS,
    default=None,
    help="context length (default: the model's max positions); a GGUF file: per slot",
)
@click.option(
    "--max-num-seqs",
    type=SEQUENCES,
    default=None,
    help="concurrent sequences the KV must hold (default: what a balanced plan gives, "
    "vLLM's 128 where memory allows; a GGUF file: its server's own 4 slots)",
)
@click.option(
    "--socket-gb",
    type=SOCKET_GIB,
    default=None,
    help="socket memory in GiB (default: socket 0 of this host, as detected)",
)
@click.option("--revision", type=TEXT, default=None, help="branch, tag or commit (default main)")
@GGUF_FILE
@json_option("stable JSON for scripts")
def estimate(
    model: str,
    max_model_len: int | None,
    max_num_seqs: int | None,
    socket_gb: float | None,
    revision: str | None,
    gguf_file: str | None,
    as_json: bool,
) -> None:
    """Does MODEL fit one socket's memory at this context and concurrency? (vLLM for
    safetensors weights, llama.cpp's llama-server for a GGUF file)"""
    facts = inspect_model(model, revision=revision, gguf_file=gguf_file)
    own = format_named(facts.format)
    serving = engines.engine_named(own.engine) if own is not None else engines.DEFAULT_ENGINE
    estimate_of = serving.implementation("cli", "ESTIMATE", FormatEstimate)
    estimate_of.run(facts, max_model_len, max_num_seqs, socket_gb, as_json)


def this_host() -> HostFacts:
    from epycd.host.detect import detect_host
    from epycd.settings import load_settings

    return detect_host(Path(load_settings().host_root), probe_runtimes=False)


def budget_rows(
    headroom: float, required: float, available: float, note: str, fits: bool
) -> list[tuple[str, str]]:
    return [
        ("OS headroom", f"{headroom} GiB"),
        ("required", f"{required} GiB"),
        ("available", f"{available} GiB ({note})"),
        ("fits", "yes" if fits else "no"),
    ]


def print_answer(rows: list[tuple[str, str]], warnings: list[str], action: str) -> None:
    click.echo(table(rows))
    for warning in warnings:
        click.echo(escaped(f"warning: {warning}"))
    click.echo(escaped(action))


def socket_memory(
    socket_gb: float | None, host: HostFacts | None = None
) -> tuple[float, float, float | None, str]:
    """(total, available, first node available, description) of socket 0, GiB (of `host`, or
    of this host detected here, unless `socket_gb` is given)."""
    if socket_gb is not None:
        return socket_gb, socket_gb, None, f"given: {socket_gb:g} GiB"
    host = host or this_host()
    sock = host.socket(0)
    first = host.node(sock.numa_nodes[0]).memory_available_bytes / GIB if sock.numa_nodes else None
    note = (
        f"socket 0 of this host: {sock.memory_gb:.1f} GiB, {sock.memory_available_gb:.1f} GiB "
        f"available (NUMA nodes {', '.join(map(str, sock.numa_nodes))})"
    )
    return sock.memory_gb, sock.memory_available_gb, first, note
