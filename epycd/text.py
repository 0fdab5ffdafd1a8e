"""The one rule for characters that must never pass raw: into a unit file (they could end a
line and start a directive) or onto a terminal (escape sequences could rewrite what the
admin reads, and format characters could reorder or hide it).

Into a unit file (`is_unsafe`, `first_unsafe`: refused by spec and render): control
characters (Cc: newline, tab, ESC, DEL, C1), surrogates (Cs: the bytes of a non-UTF-8 file
name), and the Unicode line and paragraph separators (Zl, Zp).

Onto a terminal (`escaped`, `escaped_lines`: every value a command prints): those, and every
format character (Cf: the bidirectional overrides and isolates U+202A-202E, U+2066-2069,
U+061C, zero-width U+200B-200D, U+FEFF, ...), so what the admin reads is what the value
holds, in its order.
"""

from __future__ import annotations

import unicodedata

UNSAFE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
"""Never in a unit file or on a terminal."""

HIDDEN_CATEGORIES = UNSAFE_CATEGORIES | {"Cf"}
"""Never raw on a terminal: the unsafe ones and the format characters."""


def is_digits(text: str) -> bool:
    """Whether `text` is ASCII digits, 0-9 only: what `int()` of a number in a file or flag
    should see. `str.isdigit` also takes '²' and other digits `int()` refuses with a
    ValueError (tests/test_hostile_commands.py keeps it out of the product)."""
    return text.isascii() and text.isdigit()


def is_unsafe(char: str) -> bool:
    return unicodedata.category(char) in UNSAFE_CATEGORIES


def first_unsafe(text: str) -> tuple[int, str] | None:
    """(position, character) of the first unsafe character, or None."""
    return next(((i, ch) for i, ch in enumerate(text) if is_unsafe(ch)), None)


def is_hidden(char: str) -> bool:
    """A character a terminal would act on or not show as itself."""
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def escaped(text: str) -> str:
    """`text` with every control, format, surrogate and line/paragraph separator character
    written as a Python escape (`\\x1b`, `\\n`, `\\u202e`, `\\udcff`), so it prints on one
    line, in its own order, and changes nothing on the terminal."""
    if not any(map(is_hidden, text)):
        return text
    return "".join(repr(ch)[1:-1] if is_hidden(ch) else ch for ch in text)


def escaped_lines(text: str) -> str:
    """`escaped` line by line: the text's own line breaks stay, nothing else passes raw."""
    return "\n".join(escaped(line) for line in text.split("\n"))
