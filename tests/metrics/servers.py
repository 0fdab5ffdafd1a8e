"""Real local HTTP peers for the scrape: an instance answering a recorded vLLM exposition,
one that accepts and never answers, one that trickles its answer, and a closed port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDED = Path(__file__).with_name("vllm-0.32.0-metrics.txt")
"""/metrics of the real vLLM 0.32.0 CPU server of the test venv serving the tiny model,
after three chat completions (`curl -s 127.0.0.1:PORT/metrics`)."""


def recorded() -> str:
    return RECORDED.read_text()


@contextlib.contextmanager
def answering(body: Callable[[], str] = recorded, port: int = 0) -> Iterator[int]:
    """A server on 127.0.0.1 (`port`, or any free one) answering GET /metrics with
    `body()`; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body().encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def hung() -> Iterator[int]:
    """A port whose connections are accepted by the kernel and never answered (a frozen
    server: its listen backlog takes the connection, nobody reads the request)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@contextlib.contextmanager
def raw_server(talk: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A server on 127.0.0.1 that hands each connection to `talk(conn, stop)` in its own
    thread, for answers no HTTP server would give; yields its port."""
    stop = threading.Event()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                conn, _ = sock.accept()
                threading.Thread(target=talk, args=(conn, stop), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        sock.close()


@contextlib.contextmanager
def trickling() -> Iterator[int]:
    """A server that sends its headers, then one byte of the body every 50 ms, forever."""

    def talk(conn: socket.socket, stop: threading.Event) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
            while not stop.is_set():
                conn.sendall(b"#")
                time.sleep(0.05)

    with raw_server(talk) as port:
        yield port


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


CGROUP_HIERARCHIES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))
"""cgroup v1's pids hierarchy, or the unified (v2) one."""


@contextlib.contextmanager
def in_unit(unit: str, body: Path, port: int) -> Iterator[int]:
    """A server answering GET /metrics with the file `body` (read at each request) on
    127.0.0.1:`port`, as a process of its own in a cgroup named after `unit`, as systemd
    runs an endpoint's vLLM: the planner then knows the port for the endpoint's own
    (`epycd.plan.placement.ports.endpoint_of_pid`), not another process's. Yields its pid."""
    import subprocess
    import sys
    import tempfile

    hierarchy = next((h for h in CGROUP_HIERARCHIES if (h / "cgroup.procs").is_file()), None)
    assert hierarchy is not None, "no cgroup hierarchy under /sys/fs/cgroup"
    parent = Path(tempfile.mkdtemp(prefix="epycd-test-", dir=hierarchy))
    group = parent / unit
    group.mkdir()
    script = (
        "import sys, time\nfrom pathlib import Path\nfrom tests.metrics.servers import answering\n"
        "with answering(Path(sys.argv[1]).read_text, port=int(sys.argv[2])):\n"
        "    print('listening', flush=True)\n    time.sleep(600)\n"
    )
    repo = str(Path(__file__).resolve().parents[2])
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(body), str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": repo, "PATH": "/usr/bin:/bin"},
    )
    try:
        (group / "cgroup.procs").write_text(str(process.pid))
        assert process.stdout is not None and process.stdout.readline() == "listening\n"
        yield process.pid
    finally:
        process.kill()
        process.wait()
        group.rmdir()
        parent.rmdir()


@contextlib.contextmanager
def streaming(chunks: Callable[[], Iterator[bytes]]) -> Iterator[int]:
    """A server that answers any request with a 200 and the body `chunks()` yields, written
    as it comes with no length (the end of the body is the close), for hostile bodies: one
    that drips, one that never ends. Yields its port."""

    def talk(conn: socket.socket, stop: threading.Event) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
            )
            for chunk in chunks():
                if stop.is_set():
                    return
                conn.sendall(chunk)

    with raw_server(talk) as port:
        yield port


def gauge_lines(prefix: str = "vllm:spam", per_family: int = 100) -> Iterator[bytes]:
    """A valid exposition that never ends: gauge families of `per_family` series each."""
    number = 0
    while True:
        series = "".join(f'{prefix}{number}{{n="{i}"}} {i}\n' for i in range(per_family))
        yield f"# TYPE {prefix}{number} gauge\n{series}".encode()
        number += 1


def dripping(interval_s: float = 0.02) -> Iterator[bytes]:
    """A valid exposition sent one series every `interval_s`, for ever."""
    for number, _ in enumerate(iter(int, 1)):
        yield f"# TYPE vllm:drip{number} gauge\nvllm:drip{number} {number}\n".encode()
        time.sleep(interval_s)


def sized(limit: int) -> str:
    """A valid exposition of gauge families, just under `limit` bytes."""
    body = bytearray()
    for chunk in gauge_lines():
        if len(body) + len(chunk) > limit:
            return body.decode()
        body += chunk
    raise AssertionError("unreachable")
