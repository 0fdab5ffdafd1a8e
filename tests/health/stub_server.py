"""A stand-in server process for the supervisor's process handling (exit codes, signals).

vLLM cannot be told to exit with a chosen status; this stdlib OpenAI-shaped server can:

    python stub_server.py PORT MODEL [--exit-on-term CODE] [--api-key K | --api-key-from-env]
                          [--listen-after S] [--exit-after S CODE]

`--api-key-from-env` requires the key in VLLM_API_KEY, as vLLM itself does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.health.localhttp import Routes, _handler, openai_replies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("model")
    parser.add_argument("--exit-on-term", type=int, default=0)
    parser.add_argument("--api-key")
    parser.add_argument("--api-key-from-env", action="store_true")
    parser.add_argument("--listen-after", type=float, default=0.0)
    parser.add_argument("--exit-after", type=float, nargs=2, metavar=("SECONDS", "CODE"))
    args = parser.parse_args()
    if args.api_key_from_env:
        args.api_key = os.environ["VLLM_API_KEY"]

    def on_term(signum: int, _frame: FrameType | None) -> None:
        print(f"stub: signal {signum}, exiting {args.exit_on_term}", flush=True)
        os._exit(args.exit_on_term)

    signal.signal(signal.SIGTERM, on_term)
    print(f"stub: loading {args.model}", flush=True)
    if args.exit_after:
        seconds, code = args.exit_after
        threading.Timer(seconds, lambda: os._exit(int(code))).start()
    time.sleep(args.listen_after)
    server = ThreadingHTTPServer(
        ("127.0.0.1", args.port), _handler(Routes(openai_replies(args.model), args.api_key))
    )
    print(f"stub: listening on {args.port}", flush=True)
    print("stub: a line on stderr", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
