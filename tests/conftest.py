"""How the suite shares the machine (pytest-xdist, `-n 2 --dist loadgroup` in pyproject).

Every test that runs a real vLLM (marked `vllm`) or boots a machine (marked `e2e`) goes to one
worker, one at a time and first: two vLLM servers on a 2-core machine would each take twice
as long to load and stretch the start-up bounds those tests assert. The light tests (the
planner, the renderer, the approval workflow, each mostly waiting on its own subprocesses)
share the other worker while the heavy ones run.
"""

from __future__ import annotations

import pytest

HEAVY = ("e2e", "vllm")
HEAVY_GROUP = "one-vllm-at-a-time"


def is_heavy(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in HEAVY)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heavy tests in one xdist group, collected first so that group starts at once (it is
    the longest) rather than after a third of the light tests."""
    for item in items:
        if is_heavy(item):
            item.add_marker(pytest.mark.xdist_group(HEAVY_GROUP))
    items.sort(key=lambda item: not is_heavy(item))
