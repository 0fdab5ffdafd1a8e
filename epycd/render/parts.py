"""The lines every server's unit has, whatever its engine and runtime: its Description
(`describe`, `description`), the PartOf= of a set's instance (`part_of`), the API key's
credential (`api_key_credential`) and its limits (`limit_lines`)."""

from __future__ import annotations

from epycd.engines import engine_named
from epycd.names import unit_name
from epycd.plan.model import AnyServer
from epycd.render.commands import API_KEY_CREDENTIAL
from epycd.render.syntax import (
    plain_value,
)
from epycd.render.text import Line


def describe(decisions: AnyServer) -> str:
    """The unit's Description, before escaping."""
    where = f"socket {decisions.socket}"
    if decisions.gpus_held:
        where = f"Instinct GPU {','.join(map(str, decisions.gpus_held))}"
    server = engine_named(decisions.engine).title
    return (
        f"epyc-llm {decisions.endpoint}"
        + (f" instance {decisions.instance}" if decisions.instance is not None else "")
        + f": {server} serving {decisions.model} ({decisions.runtime}, {where})"
    )


def part_of(decisions: AnyServer) -> list[Line]:
    """An instance of a multi-instance endpoint stops and restarts with its balancer."""
    if decisions.instance is None:
        return []
    return [("PartOf", f"{unit_name(decisions.endpoint)}.service")]


def description(decisions: AnyServer) -> str:
    return plain_value(describe(decisions), "model")


def api_key_credential(decisions: AnyServer) -> list[Line]:
    """The API key reaches the health gate as a credential (vLLM reads the mounted file)."""
    if not decisions.api_key_file:
        return []
    path = plain_value(decisions.api_key_file, "api_key_file")
    return [("LoadCredential", f"{API_KEY_CREDENTIAL}:{path}")]


def limit_lines(decisions: AnyServer) -> list[Line]:
    """Open files and locked memory as vLLM wants them (docs/tuning.md rule 5)."""
    return [
        ("LimitNOFILE", str(decisions.limit_nofile)),
        ("LimitMEMLOCK", plain_value(decisions.limit_memlock, "limit_memlock")),
    ]
