"""The suite runs on two pytest-xdist workers (pyproject's addopts: `-n 2 --dist loadgroup`).

The tests that boot machines (`e2e`) or serve with a real vLLM (`vllm`) each take most of
the machine's two cores and wait on real servers with timeouts: they share one group, so one
worker runs them one after another, while the other runs the rest (CLI, planner, renderer,
llama-server, Quadlet tests) beside them. The group is collected first, so its worker starts
on it at once: it is most of the suite's time. `pytest -n 0` runs everything in one process.
"""

from __future__ import annotations

import pytest

HEAVY_MARKERS = ("e2e", "vllm")
HEAVY_GROUP = "machines-and-vllm"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    heavy = [i for i in items if any(i.get_closest_marker(m) for m in HEAVY_MARKERS)]
    for item in heavy:
        item.add_marker(pytest.mark.xdist_group(HEAVY_GROUP))
    chosen = set(heavy)
    items[:] = heavy + [item for item in items if item not in chosen]
