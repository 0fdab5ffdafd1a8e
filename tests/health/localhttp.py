"""A small stdlib HTTP server in a thread, answering what a test tells it to."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, Any]


class Routes:
    def __init__(self, replies: dict[str, Reply], api_key: str | None = None) -> None:
        self.replies = replies
        self.api_key = api_key
        self.seen: list[tuple[str, str, dict[str, str], Any]] = []


def _handler(routes: Routes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            routes.seen.append((method, self.path, dict(self.headers.items()), body))
            status, payload = routes.replies.get(self.path, (404, {"detail": "Not Found"}))
            authorized = self.headers.get("Authorization") == f"Bearer {routes.api_key}"
            if routes.api_key and self.path.startswith("/v1/") and not authorized:
                status, payload = 401, {"error": "Unauthorized"}
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply("GET")

        def do_POST(self) -> None:
            self._reply("POST")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def local_server(
    replies: dict[str, Reply], port: int = 0, api_key: str | None = None, host: str = "127.0.0.1"
) -> Iterator[tuple[str, Routes]]:
    """On `host` (IPv4 or IPv6) and `port`; the base URL it is reached at."""
    routes = Routes(replies, api_key)
    server_class = ThreadingHTTPServer
    if ":" in host:

        class Server6(ThreadingHTTPServer):
            address_family = socket.AF_INET6

        server_class = Server6
    server = server_class((host, port), _handler(routes))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{server.server_address[1]}", routes
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def openai_replies(model: str = "tiny", text: str = "hello") -> dict[str, Reply]:
    """The routes of a healthy OpenAI-compatible server serving `model`."""
    return {
        "/health": (200, ""),
        "/v1/models": (200, {"object": "list", "data": [{"id": model, "object": "model"}]}),
        "/v1/chat/completions": (
            200,
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]},
        ),
        "/v1/completions": (200, {"choices": [{"index": 0, "text": text}]}),
        "/v1/embeddings": (200, embeddings_reply([[0.5, -0.25, 1.0], [0.0, 2.0, -1.5]])),
        "/v1/rerank": (200, rerank_reply([0.25, 0.75])),
    }


def embeddings_reply(vectors: list[list[float]]) -> dict[str, Any]:
    """An OpenAI embeddings answer of these vectors, in order."""
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "usage": {"prompt_tokens": 9, "total_tokens": 9}}


def rerank_reply(scores: list[float]) -> dict[str, Any]:
    """A rerank answer (Jina and Cohere's shape, as vLLM and llama-server give it): one
    result per document, best first."""
    ranked = sorted(enumerate(scores), key=lambda pair: -pair[1])
    results = [{"index": i, "relevance_score": score} for i, score in ranked]
    return {"model": "tiny", "usage": {"prompt_tokens": 15, "total_tokens": 15}, "results": results}
