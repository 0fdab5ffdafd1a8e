"""A local stand-in for the model hub (this machine cannot reach the real one): the few HTTP
routes huggingface_hub uses for `model_info`, `snapshot_download` and `hf_hub_download`.

Files and answers are the fixture models' own; a gated repo refuses file downloads without the
expected bearer token, as the hub does (401 + `X-Error-Code: GatedRepo`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

from tests.model.hf_cache import commit_for, git_blob_sha1


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: str | bool = False
    safetensors_parameters: dict[str, int] | None = None
    token: str | None = None
    sha: str = ""
    requests: list[str] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    repos: dict[str, FakeRepo]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: Any) -> None:
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def _route(self) -> None:
        path = unquote(urlparse(self.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = self.repos.get("/".join(parts[2:4]))
            if repo is None:
                self._send(
                    404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"}
                )
                return
            repo.requests.append(path)
            if len(parts) > 5 and parts[4] == "revision" and parts[5] not in ("main", repo.sha):
                self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"})
            elif len(parts) == 4 or parts[4] == "revision":
                self._json(self._info(parts[2] + "/" + parts[3], repo))
            elif parts[4] == "tree":
                self._json(
                    [
                        {"type": "file", "oid": git_blob_sha1(c), "size": len(c), "path": name}
                        for name, c in repo.files.items()
                    ]
                )
            else:
                self._send(404, b"{}")
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self.repos.get("/".join(parts[:2]))
            name = "/".join(parts[4:])
            if repo is None or name not in repo.files:
                self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"})
                return
            repo.requests.append(path)
            if repo.gated and self.headers.get("Authorization") != f"Bearer {repo.token}":
                self._send(
                    401,
                    b'{"error":"Access to this model is restricted"}',
                    {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"},
                )
                return
            content = repo.files[name]
            self._send(
                200,
                content,
                {"X-Repo-Commit": repo.sha, "ETag": f'"{git_blob_sha1(content)}"'},
            )
            return
        self._send(404, b"{}")

    def _info(self, repo_id: str, repo: FakeRepo) -> dict[str, Any]:
        info: dict[str, Any] = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": repo.sha,
            "gated": repo.gated,
            "private": False,
        }
        if repo.safetensors_parameters:
            info["safetensors"] = {
                "parameters": repo.safetensors_parameters,
                "total": sum(repo.safetensors_parameters.values()),
            }
        return info

    do_GET = _route
    do_HEAD = _route


@contextmanager
def fake_hub(repos: dict[str, FakeRepo]) -> Iterator[str]:
    for repo_id, repo in repos.items():
        repo.sha = repo.sha or commit_for(repo_id)
    handler = type("Handler", (_Handler,), {"repos": repos})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
