"""The one rule for characters that must never pass raw: into a unit file (they could end a
line and start a directive) or onto a terminal (escape sequences could rewrite what the
admin reads).

Control characters (Cc: newline, tab, ESC, DEL, C1), surrogates (Cs: the bytes of a
non-UTF-8 file name), and the Unicode line and paragraph separators (Zl, Zp).
"""

from __future__ import annotations

import unicodedata

UNSAFE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def is_unsafe(char: str) -> bool:
    return unicodedata.category(char) in UNSAFE_CATEGORIES


def first_unsafe(text: str) -> tuple[int, str] | None:
    """(position, character) of the first unsafe character, or None."""
    return next(((i, ch) for i, ch in enumerate(text) if is_unsafe(ch)), None)


def escaped(text: str) -> str:
    """`text` with every unsafe character written as a Python escape (`\\x1b`, `\\n`,
    `\\udcff`), so it prints on one line and changes nothing on the terminal."""
    if first_unsafe(text) is None:
        return text
    return "".join(repr(ch)[1:-1] if is_unsafe(ch) else ch for ch in text)


def escaped_lines(text: str) -> str:
    """`escaped` line by line: the text's own line breaks stay, nothing else passes raw."""
    return "\n".join(escaped(line) for line in text.split("\n"))
