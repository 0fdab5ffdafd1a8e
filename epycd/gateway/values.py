"""The one check of every value written into the gateway's haproxy.cfg or one of its maps
(docs/gateway.md, "What HAProxy is given").

HAProxy splits a configuration line and a map line at white space, reads `#` as a comment
and quotes, `%[`, `${` and backslashes specially: a value that holds one of them would be
read as something else. So every value the renderer (`epycd.gateway.haproxy`) writes passes
`checked` with the anchored rule of its kind first, and a value that does not match is an
error, never a line: the callers (routes, the key store, the settings) refuse bad values
earlier with their own file, key and fix; this is the last word before the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from epycd.errors import InputError
from epycd.names import ENDPOINT_NAME_RULE, MODEL_NAME_RULE
from epycd.settings import parse_listen

CLIENT_NAME_RULE = r"[a-z0-9][a-z0-9_.-]{0,62}"
"""A client of the gateway (epycd.gateway.keys): a key of the limit maps and a log field."""
CREDENTIALS = "${CREDENTIALS_DIRECTORY}/"


@dataclass(frozen=True)
class Rule:
    """What one kind of value may be, anchored (`re.fullmatch`), and what it is called."""

    name: str
    pattern: re.Pattern[str]

    def problem(self, value: str) -> str | None:
        if self.pattern.fullmatch(value) is None:
            return f"{value!r} is not a {self.name} HAProxy can be given"
        return None


def _rule(name: str, pattern: str) -> Rule:
    return Rule(name, re.compile(pattern))


ADDRESS = _rule(
    "listen or server address (IPv4, or IPv6 in brackets without a %zone, and a port)",
    r"(?:[0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9a-fA-F:.]+\]):[0-9]{1,5}",
)
MODEL = _rule("model name or alias", MODEL_NAME_RULE)
CLIENT = _rule("client name", CLIENT_NAME_RULE)
ACCESS = _rule("client/model pair", rf"{CLIENT_NAME_RULE}/(?:{MODEL_NAME_RULE}|\*)")
BACKEND = _rule("backend name", rf"endpoint-{ENDPOINT_NAME_RULE}")
ENDPOINT = _rule("endpoint name", ENDPOINT_NAME_RULE)
DIGEST = _rule("SHA-256 digest", r"[0-9a-f]{64}")
LIMIT = _rule("limit", r"[1-9][0-9]{0,8}")
SECRET = _rule("endpoint key (printable ASCII without white space)", r"[!-~]{1,4096}")
PATH = _rule(
    "file path (letters, digits and _ . - + @ = , : / only)",
    r"(?:/|" + re.escape(CREDENTIALS) + r")[A-Za-z0-9_.+@=,:/-]{1,4000}",
)


def checked(rule: Rule, value: object) -> str:
    """`value` as text when `rule` holds for the whole of it; an `InputError` otherwise."""
    text = str(value)
    problem = rule.problem(text)
    if problem is None and rule is ADDRESS:
        problem = _address_problem(text)
    if problem is not None:
        raise InputError(
            f"{problem}: it is not written into the gateway's haproxy.cfg or maps",
            fix="correct the value where it comes from (epycd.conf, the key store or the "
            "endpoint's approval), then run the command again",
        )
    return text


def _address_problem(text: str) -> str | None:
    try:
        parse_listen(text)
    except ValueError as exc:
        return str(exc)
    return None
