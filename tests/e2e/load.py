"""Steady load on an endpoint for the fault tests (tests/e2e/inside_instances.py): CONCURRENCY
workers, each sending one chat completion after another until the stop file appears.

    python3 load.py URL MODEL CONCURRENCY STOP_FILE OUT_FILE

Standard library only (it runs under the machine's /usr/bin/python3). Every request is one
JSON line in OUT_FILE: its start and end on CLOCK_MONOTONIC (the same clock in every process
of the machine, so the driver's kill time compares with them), ok, the HTTP status or the
error, and the completion tokens the server counted (its `usage`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

MAX_TOKENS = 32
TIMEOUT_S = 120


def one_request(url: str, model: str) -> dict[str, object]:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Count to twenty."}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    item: dict[str, object] = {"start": started}
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            data = json.loads(reply.read())
        item |= {"ok": True, "status": reply.status,
                 "tokens": int(data.get("usage", {}).get("completion_tokens", 0))}  # fmt: skip
    except urllib.error.HTTPError as exc:
        item |= {
            "ok": False,
            "status": exc.code,
            "error": exc.read()[:300].decode(errors="replace"),
        }
    except (OSError, ValueError) as exc:
        item |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    item["end"] = time.monotonic()
    return item


def worker(url: str, model: str, stop: Path, out: list[dict[str, object]]) -> None:
    while not stop.exists():
        out.append(one_request(url, model))


def main() -> None:
    url, model, concurrency, stop, out_file = sys.argv[1:6]
    results: list[dict[str, object]] = []
    threads = [
        threading.Thread(target=worker, args=(url, model, Path(stop), results), daemon=True)
        for _ in range(int(concurrency))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * 2)
    Path(out_file).write_text("".join(json.dumps(item) + "\n" for item in results))


if __name__ == "__main__":
    main()
