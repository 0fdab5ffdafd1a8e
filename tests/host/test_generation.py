"""Name rule, CPUID rule and their reconciliation, each against a table written here."""

from __future__ import annotations

import pytest

from epycd.host.generation import classify, from_cpuid, from_model_number, model_number

AMD = "AuthenticAMD"


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("AMD EPYC 9654 96-Core Processor", "9654"),
        ("AMD EPYC 9654P 96-Core Processor", "9654"),
        ("AMD EPYC 4584PX 16-Core Processor", "4584"),
        ("AMD EPYC 72F3 8-Core Processor", "72F3"),
        ("AMD EPYC 9B14", "9B14"),
        ("AMD EPYC 7R13 Processor", "7R13"),
        ("AMD EPYC Embedded 9655", "9655"),
        ("AMD EPYC", None),
        ("AMD EPYC Processor (with IBPB)", None),
        ("AMD EPYC-Genoa Processor", None),
        ("AMD EPYC 96540 thing", None),
    ],
)
def test_model_number(name: str, part: str | None) -> None:
    assert model_number(name) == part


@pytest.mark.parametrize(
    ("part", "generation", "zen"),
    [
        ("7601", "Naples", "Zen 1"),
        ("7742", "Rome", "Zen 2"),
        ("7763", "Milan", "Zen 3"),
        ("72F3", "Milan", "Zen 3"),
        ("9654", "Genoa", "Zen 4"),
        ("9B14", "Genoa", "Zen 4"),
        ("9684", "Genoa", "Zen 4"),
        ("9754", "Bergamo", "Zen 4c"),
        ("9734", "Bergamo", "Zen 4c"),
        ("8534", "Siena", "Zen 4c"),
        ("4584", "EPYC 4004", "Zen 4"),
        ("4565", "EPYC 4005", "Zen 5"),
        ("9755", "Turin", "Zen 5"),
        ("9575", "Turin", "Zen 5"),
        ("9965", "Turin", "Zen 5c"),
        ("9845", "Turin", "Zen 5c"),
        ("9825", "Turin", "Zen 5c"),
        ("9745", "Turin", "Zen 5c"),
        ("9645", "Turin", "Zen 5c"),
        ("9655", "Turin", "Zen 5"),
        ("9996", "Venice", "Zen 6"),
        ("3251", "unknown", None),
        ("7000", "unknown", None),
    ],
)
def test_name_rule(part: str, generation: str, zen: str | None) -> None:
    assert tuple(from_model_number(part)) == (generation, zen)


@pytest.mark.parametrize(
    ("family", "model", "generation", "zen"),
    [
        (23, 0x01, "Naples", "Zen 1"),
        (23, 0x31, "Rome", "Zen 2"),
        (23, 0x71, "unknown", None),  # Matisse: a Ryzen
        (25, 0x01, "Milan", "Zen 3"),
        (25, 0x11, "Genoa", "Zen 4"),
        (25, 0x21, "unknown", None),  # Vermeer: a Ryzen
        (25, 0x61, "EPYC 4004", "Zen 4"),
        (25, 0xA0, "unknown", "Zen 4c"),
        (26, 0x02, "Turin", "Zen 5"),
        (26, 0x11, "Turin", "Zen 5c"),
        (26, 0x44, "EPYC 4005", "Zen 5"),
        (26, 0x24, "unknown", None),  # Strix Point: a laptop
        (26, 0x50, "Venice", "Zen 6"),
        (26, 0x90, "Venice", "Zen 6"),
        (6, 143, "unknown", None),
        (None, None, "unknown", None),
    ],
)
def test_cpuid_rule(
    family: int | None, model: int | None, generation: str, zen: str | None
) -> None:
    assert tuple(from_cpuid(family, model)) == (generation, zen)


def test_name_wins_when_it_has_a_model_number() -> None:
    (generation, zen), warnings = classify(AMD, "AMD EPYC 9654 96-Core Processor", 26, 2)
    assert (generation, zen) == ("Genoa", "Zen 4")
    assert warnings and "going by the name" in warnings[0]


def test_cpuid_decides_without_model_number() -> None:
    assert tuple(classify(AMD, "AMD EPYC", 26, 2)[0]) == ("Turin", "Zen 5")
    assert tuple(classify(AMD, "AMD EPYC", 25, 17)[0]) == ("Genoa", "Zen 4")
    assert tuple(classify(AMD, "AMD EPYC", 26, 0x11)[0]) == ("Turin", "Zen 5c")


def test_cpuid_tells_a_dense_part_the_list_lacks() -> None:
    (generation, zen), warnings = classify(AMD, "AMD EPYC 9685 999-Core Processor", 26, 0x12)
    assert (generation, zen, warnings) == ("Turin", "Zen 5c", [])


def test_agreeing_zen4c_without_generation_from_cpuid_is_quiet() -> None:
    assert classify(AMD, "AMD EPYC 9754 128-Core Processor", 25, 0xA0) == (
        ("Bergamo", "Zen 4c"),
        [],
    )


def test_zen4c_without_name_warns() -> None:
    (generation, zen), warnings = classify(AMD, "AMD EPYC", 25, 0xA0)
    assert (generation, zen) == ("unknown", "Zen 4c")
    assert "Bergamo or Siena" in warnings[0]


def test_qemu_codename_as_last_resort() -> None:
    assert classify(AMD, "AMD EPYC-Milan Processor", 99, 0)[0].generation == "Milan"


def test_not_epyc() -> None:
    assert classify("GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", 6, 143) == (
        ("unknown", None),
        [],
    )
    assert classify(AMD, "AMD Ryzen 9 9950X 16-Core Processor", 26, 0x44)[0].generation == (
        "unknown"
    )


def test_unknown_epyc_warns() -> None:
    (generation, _), warnings = classify(AMD, "AMD EPYC", 27, 0)
    assert generation == "unknown" and "cannot tell" in warnings[0]
