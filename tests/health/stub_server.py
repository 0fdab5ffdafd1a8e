"""A stand-in server process for the supervisor's process handling (exit codes, signals).

vLLM cannot be told to exit with a chosen status; this stdlib OpenAI-shaped server can:

    python stub_server.py PORT MODEL [--exit-on-term CODE] [--api-key K | --api-key-from-env]
                          [--listen-after S] [--exit-after S CODE] [--control FILE]
                          [--engine-child]

`--api-key-from-env` requires the key in VLLM_API_KEY, as vLLM itself does. `--control FILE`
makes /health and /metrics answer as the JSON in FILE says at each request (the test
rewrites it while the supervisor runs): {"health": "ok" | "hang" | 503, "metrics": "ok" |
404, "running": N, "prompt": N, "generation": N, "moving": bool}. /metrics is the
exposition prometheus_client makes, as in vLLM: a gauge and two counters with labels
(model_name, engine) on two engines; "moving" adds one generated token per read.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.health.localhttp import Routes, _handler, openai_replies

ENGINES = ("0", "1")


class Metrics:
    """vLLM's progress metrics, exposed by the library vLLM exposes them with: a gauge and
    two counters (NAME_total) per engine, labelled like vLLM's."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.moved = 0
        self.control: dict[str, Any] = {}
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        said = self.control
        families = (
            (GaugeMetricFamily, "vllm:num_requests_running", float(said.get("running", 0))),
            (CounterMetricFamily, "vllm:prompt_tokens", float(said.get("prompt", 0))),
            (
                CounterMetricFamily,
                "vllm:generation_tokens",
                float(said.get("generation", 0)) + self.moved,
            ),
        )
        for kind, name, total in families:
            family = kind(name, name, labels=["model_name", "engine"])
            for engine, share in zip(ENGINES, (total - total // 2, total // 2), strict=True):
                family.add_metric([self.model, engine], share)
            yield family

    def text(self, control: dict[str, Any]) -> bytes:
        """The totals the control gives, split over the two engines."""
        if control.get("moving"):
            self.moved += 1
        self.control = control
        return generate_latest(self.registry)


def controlled(base: type[BaseHTTPRequestHandler], control: Path, metrics: Metrics) -> type:
    """`base` with /health and /metrics answering as `control` says."""

    class Handler(base):  # type: ignore[valid-type,misc]
        def do_GET(self) -> None:
            if self.path not in ("/health", "/metrics"):
                super().do_GET()
                return
            said: dict[str, Any] = json.loads(control.read_text()) if control.exists() else {}
            if self.path == "/health":
                answer = said.get("health", "ok")
                if answer == "hang":
                    time.sleep(3600)
                self._send(200 if answer == "ok" else int(answer), b"")
                return
            if said.get("metrics", "ok") != "ok":
                self._send(int(said["metrics"]), b"not found")
                return
            self._send(200, metrics.text(said))

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("model")
    parser.add_argument("--exit-on-term", type=int, default=0)
    parser.add_argument("--api-key")
    parser.add_argument("--api-key-from-env", action="store_true")
    parser.add_argument("--listen-after", type=float, default=0.0)
    parser.add_argument("--exit-after", type=float, nargs=2, metavar=("SECONDS", "CODE"))
    parser.add_argument("--control", type=Path)
    parser.add_argument(
        "--engine-child",
        action="store_true",
        help="start a child that outlives this process with its output open, as vLLM's engine",
    )
    args = parser.parse_args()
    if args.api_key_from_env:
        args.api_key = os.environ["VLLM_API_KEY"]

    def on_term(signum: int, _frame: FrameType | None) -> None:
        print(f"stub: signal {signum}, exiting {args.exit_on_term}", flush=True)
        os._exit(args.exit_on_term)

    signal.signal(signal.SIGTERM, on_term)
    print(f"stub: loading {args.model}", flush=True)
    if args.engine_child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if args.exit_after:
        seconds, code = args.exit_after
        threading.Timer(seconds, lambda: os._exit(int(code))).start()
    time.sleep(args.listen_after)
    handler = _handler(Routes(openai_replies(args.model), args.api_key))
    if args.control:
        handler = controlled(handler, args.control, Metrics(args.model))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    server.daemon_threads = True
    print(f"stub: listening on {args.port}", flush=True)
    print("stub: a line on stderr", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
