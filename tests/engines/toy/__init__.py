"""A test-only engine, "toy", written in the tests alone: the proof that an engine needs no
edit in epycd. It serves any Hugging Face model folder with a stand-in server (Python's
http.server) on the host, sized by one simple rule, and has every stage an engine has: its
endpoint-file keys (`spec.py`), decisions (`plan/model.py`), planner (`plan/engines/planner.py`),
units (`render.py`) and plan view (`cli.py`). It is registered as an installed engine would
be, by the `epycd.engines` entry point of tests/engines/plugins (a dist-info there); a
process sees it only with that folder on its path (tests/engines/test_toy_engine.py)."""

from __future__ import annotations

from epycd.engines.base import Engine, ServerMetrics

TOY = Engine(
    name="toy",
    package=__name__,
    title="Toy",
    server="toy-server",
    serves="any model, by a stand-in server (tests only)",
    metrics=ServerMetrics(
        prefix="toy:",
        running="toy:requests_running",
        waiting="toy:requests_waiting",
        tokens=("toy:tokens_total",),
    ),
    api_key_env="TOY_API_KEY",
    runtimes=("host",),
    runtimes_reason="runs its stand-in server on the host",
    no_kube_export="a test-only engine has no image",
)
