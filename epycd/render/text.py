"""Unit file text from sections of already-escaped `Key=value` lines."""

from __future__ import annotations

from collections.abc import Sequence

Line = tuple[str, str]
Section = tuple[str, Sequence[Line]]


def unit_text(endpoint: str, sections: Sequence[Section]) -> str:
    """The whole file; the values must come from epycd.render.syntax."""
    out = [f"# epyc-llm endpoint {endpoint}: written by epycd; see `epycctl plan {endpoint}`"]
    for name, lines in sections:
        out += ["", f"[{name}]"]
        out += [f"{key}={value}" for key, value in lines]
    return "\n".join(out) + "\n"
