"""The suite runs on two pytest-xdist workers (pyproject's addopts: `-n 2 --dist loadgroup`).

The tests that boot machines (`e2e`) or start a real `vllm serve` (`serves`) each take most
of the machine's two cores and wait on real servers with timeouts: they share one group, so
one worker runs them one after another, while the other runs the rest beside them (CLI,
planner, renderer, llama-server and Quadlet tests, and the `vllm` tests that only plan with
the real venv). The group is collected first, so its worker starts on it at once: it is most
of the suite's time. `pytest -n 0` runs everything in one process.
"""

from __future__ import annotations

import pytest

from tests.health.realvllm import ServingTest

HEAVY_MARKERS = ("e2e", "serves")
HEAVY_GROUP = "machines-and-serving"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    heavy = [i for i in items if any(i.get_closest_marker(m) for m in HEAVY_MARKERS)]
    for item in heavy:
        item.add_marker(pytest.mark.xdist_group(HEAVY_GROUP))
    chosen = set(heavy)
    items[:] = heavy + [item for item in items if item not in chosen]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: a fixture may start the server (tests/health/realvllm.py)."""
    ServingTest.marked = item.get_closest_marker("serves") is not None
