"""`epycd.text.escaped`, the one rule for what reaches a terminal: no control, format
(bidirectional overrides and isolates, zero-width characters, U+FEFF, any category Cf),
surrogate or line/paragraph separator character passes raw; printable text is unchanged."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from epycd.text import escaped, escaped_lines

HIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}
FORMAT_EXAMPLES = "\u202e\u202a\u200b\u200d\u2066\u2067\u2068\u2069\u061c\ufeff\u00ad\u2028\u2029"


def categories(text: str) -> set[str]:
    return {unicodedata.category(ch) for ch in text}


@given(st.text())
def test_escaped_leaves_no_hidden_character(text: str) -> None:
    shown = escaped(text)
    assert not categories(shown) & HIDDEN
    assert "\n" not in shown


@given(st.text(alphabet=st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))))
def test_printable_text_is_unchanged(text: str) -> None:
    assert escaped(text) == text
    assert escaped_lines(text) == text


@given(st.lists(st.text(alphabet=st.characters(exclude_categories=("Cc", "Cs")))))
def test_escaped_lines_keeps_line_breaks_only(lines: list[str]) -> None:
    shown = escaped_lines("\n".join(lines))
    assert shown.count("\n") == max(len(lines) - 1, 0)
    assert not categories(shown.replace("\n", "")) & HIDDEN


def test_format_characters_are_written_as_escapes() -> None:
    for char in FORMAT_EXAMPLES:
        code = ord(char)
        want = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
        assert escaped(f"a{char}b") == f"a{want}b", hex(code)
    assert escaped("model\u202egpj.exe") == "model\\u202egpj.exe"
