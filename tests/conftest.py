"""The suite runs on two pytest-xdist workers (pyproject's addopts: `-n 2 --dist loadgroup`).

The tests that boot machines (`e2e`) wait on real systemd, engines and timeouts, one machine
at a time: they are one group, run one after another by one worker. The tests that start a
real `vllm serve` (`serves`) are another group, so they run one after another too, beside
the machines on the other worker. xdist hands out the largest groups first, one to each
worker, and the rest (CLI, planner, renderer, llama-server and Quadlet tests, and the `vllm`
tests that only plan with the real venv) a test at a time to whichever worker is free.
`pytest -n 0` runs everything in one process.
"""

from __future__ import annotations

import pytest

from tests.health.realvllm import ServingTest

GROUPS = {"e2e": "machines", "serves": "serving"}
"""Marker -> the xdist group its tests run in, one after another."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = next((m for m in GROUPS if item.get_closest_marker(m)), None)
        if marker is not None:
            item.add_marker(pytest.mark.xdist_group(GROUPS[marker]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: a fixture may start the server (tests/health/realvllm.py)."""
    ServingTest.marked = item.get_closest_marker("serves") is not None
