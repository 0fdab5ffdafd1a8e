from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epycd.host.cpulist import format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3\n", [0, 1, 2, 3]),
        ("0-1,3\n", [0, 1, 3]),
        ("0,2,4-5,7", [0, 2, 4, 5, 7]),
        ("", []),
        ("\n", []),
        ("5", [5]),
        ("3-3", [3]),
    ],
)
def test_parse(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-2", "0-3,x"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_format() -> None:
    assert format_cpulist([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert format_cpulist([]) == ""
    assert format_cpulist([7, 7]) == "7"


@given(st.sets(st.integers(min_value=0, max_value=2048), max_size=300))
def test_round_trip(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == sorted(cpus)
    runs = text.split(",") if text else []
    # shortest form: no two runs touch
    bounds = [(int(r.split("-")[0]), int(r.split("-")[-1])) for r in runs]
    assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(bounds))
