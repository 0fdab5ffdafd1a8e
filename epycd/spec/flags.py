"""An endpoint file's `extra_args`, read once and with one grammar: the one vLLM's parser
reads them with, and the one every reader here shares (docs/architecture.md, "Endpoint
file").

- A long flag is a word that starts with `--` (`--` alone is none). A short flag (`-x`) is
  refused in extra_args (`epycd.spec.policy.arg_refusal`) and is never a flag here.
- Its name is the word up to the first `=` and the first `.`, underscores read as dashes:
  `--flag-name`, `--flag_name`, `--flag-name=V` and `--flag-name.key=V` all name
  `--flag-name`; `key` is a sub-key of the flag's (JSON) value.
- Its value is the text after the first `=` (`--flag=` gives ""), else the next word unless
  that word starts with `-`: a value that starts with `-` joins its flag, `--flag=-x`.
- A name longer than 3 characters that starts a flag's name abbreviates it (vLLM's parser
  takes any unique prefix: `--dev` is `--device`); a table entry `--flag-*` is a family.

`ExtraFlags.words` reach `vllm serve` verbatim, after the plan's own flags. What the file may
pass (`arg_refusal`), the consent its flags need (`consent_reasons`), and whether it gives a
flag the plan would otherwise pass itself (`given`, `value`) all read this one parse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Self

from pydantic import BaseModel, ConfigDict, PrivateAttr


class Flag(NamedTuple):
    """One long flag of the words."""

    name: str
    """`--flag-name`: dashes, without `=value` or `.key`."""
    key: str | None
    """`key` of `--flag.key=value`, else None."""
    value: str | None
    """After the first `=`, else the next word unless it starts with `-`; None: no value."""
    position: int
    """Where the flag's word is in the words."""


def flag_name(word: str) -> str | None:
    """`--flag-name` of the long flag `word` (`--flag_name`, `--flag-name=V`,
    `--flag-name.key=V`), None for a value, a short flag or `--`."""
    if not word.startswith("--") or word == "--":
        return None
    return word.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def names(name: str, flag: str) -> bool:
    """Whether the flag name `name` (a `flag_name`) names `flag`: the same, an abbreviation of
    it (longer than 3 characters), or any flag of the family `flag` when it ends in `*`."""
    stem = flag.removesuffix("*")
    if name == stem or (len(name) > 3 and stem.startswith(name)):
        return True
    return flag.endswith("*") and name.startswith(stem)


def read_flags(words: Iterable[str]) -> tuple[Flag, ...]:
    """Every long flag of `words`, in order, with its sub-key and value."""
    listed = list(words)
    flags = []
    for index, word in enumerate(listed):
        name = flag_name(word)
        if name is None:
            continue
        before, equals, after = word.partition("=")
        key = before.split(".", 1)[1] if "." in before else None
        following = listed[index + 1] if index + 1 < len(listed) else None
        if equals:
            value: str | None = after
        elif following is not None and not following.startswith("-"):
            value = following
        else:
            value = None
        flags.append(Flag(name, key, value, index))
    return tuple(flags)


class ExtraFlags(BaseModel):
    """The words of an endpoint file's extra_args (or of an Instinct recipe's args), and
    their flags, read once when it is made (`ExtraFlags.of(words)`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    words: tuple[str, ...] = ()
    """What reaches `vllm serve`, verbatim."""
    _flags: tuple[Flag, ...] = PrivateAttr(default=())

    def model_post_init(self, context: Any, /) -> None:
        self._flags = read_flags(self.words)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        copied._flags = read_flags(copied.words)
        return copied

    @classmethod
    def of(cls, words: Iterable[str]) -> ExtraFlags:
        return cls(words=tuple(words))

    @property
    def flags(self) -> tuple[Flag, ...]:
        return self._flags

    def given(self, flag: str) -> bool:
        """Whether the words pass `flag` (`--flag-name`, exactly as vLLM names it), in any
        spelling of the grammar: `--flag_name`, `=`, a sub-key, an abbreviation."""
        return any(names(found.name, flag) for found in self._flags)

    def value(self, flag: str) -> str | None:
        """The value the words give `flag`: of its last occurrence, the one vLLM's parser
        keeps; sub-keys (`--flag.key=V`) set part of a value and are not one. None when the
        flag is not given or given without a value."""
        found = [f for f in self._flags if f.key is None and names(f.name, flag)]
        return found[-1].value if found else None
