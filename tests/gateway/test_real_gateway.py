"""The gateway's rendered HAProxy configuration and maps (epycd.gateway.haproxy), run by
Debian's HAProxy 2.6 in front of two real llama-servers: the tiny chat GGUF, which requires
its own API key, and the tiny BERT embedder. Every request goes through the real parts: the
keys, the routing by the body's model, the limits and the refusals are HAProxy's."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epycd.gateway.haproxy import BODY_LIMIT, HEADER_LIMIT, PEER_RESYNC_S, gateway_files
from epycd.gateway.keys import KeyStore, add_key
from epycd.gateway.routes import Route
from epycd.gateway.unit import credential_path
from epycd.metrics.gateway import gateway_series
from tests.health.realvllm import free_port
from tests.llama.realllama import serving, tiny_bert_gguf
from tests.render.test_balancer import cached_haproxy

CHAT_KEY = "endpoint-own-key"
CHAT = "tiny-chat"
EMBEDDER = "tiny-embedder"
ALIAS = "gpt-4o-mini"


@dataclass
class Gateway:
    url: str
    keys: dict[str, str]
    log: Path
    metrics_url: str

    def headers(self, client: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[client]}"}

    def post(self, path: str, body: object, client: str | None, **kwargs: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[client]}"} if client else {}
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.fixture(scope="module")
def endpoints() -> Iterator[dict[str, str]]:
    """The two real servers: endpoint name -> base URL."""
    with (
        serving(key=CHAT_KEY) as chat,
        serving("--embeddings", model=tiny_bert_gguf("embedder")) as emb,
    ):
        yield {"chat": chat, "emb": emb}


def routes_to(urls: dict[str, str]) -> list[Route]:
    return [
        Route(endpoint="chat", model=CHAT, aliases=[ALIAS], primary_endpoint="chat_completions",
              address=urls["chat"].removeprefix("http://"), api_key_file="/etc/keys/chat"),
        Route(endpoint="emb", model=EMBEDDER, primary_endpoint="embeddings",
              address=urls["emb"].removeprefix("http://")),
    ]  # fmt: skip


def start_gateway(
    folder: Path,
    routes: list[Route],
    clients: dict[str, dict[str, object]],
    tls: Path | None = None,
    master_worker: bool = False,
) -> tuple[subprocess.Popen[bytes], Gateway]:
    """HAProxy on the rendered files, the endpoints' keys (and `tls`, a PEM of a certificate
    and its key) as the credentials systemd would hand over, and a runtime folder as the
    unit's `RuntimeDirectory=`; with `master_worker`, as the unit runs it (`-W`: SIGUSR2
    reloads it)."""
    store, keys = KeyStore(), {}
    for name, limits in clients.items():
        store, keys[name] = add_key(store, name, now=datetime.now(UTC), **limits)  # type: ignore[arg-type]
    port, metrics_port = free_port(), free_port()
    files = gateway_files(routes, store, listen=f"127.0.0.1:{port}",
                          metrics_listen=f"127.0.0.1:{metrics_port}", folder=folder,
                          endpoint_keys={"chat": CHAT_KEY},
                          endpoint_keys_path=credential_path("endpoint-keys.map"),
                          tls_cert=credential_path("tls.pem") if tls else None)  # fmt: skip
    for name, text in files.files().items():
        (folder / name).write_text(text)
    credentials = folder / "credentials"
    credentials.mkdir()
    (credentials / "endpoint-keys.map").write_text(files.endpoint_keys)
    if tls is not None:
        (credentials / "tls.pem").write_text(tls.read_text())
    runtime = folder / "run"
    runtime.mkdir(mode=0o700)
    binary, env = cached_haproxy()
    log = folder / "haproxy.log"
    mode = ["-W"] if master_worker else []
    process = subprocess.Popen([str(binary), *mode, "-f", str(folder / "haproxy.cfg")],
                               env={**os.environ, **env, "CREDENTIALS_DIRECTORY": str(credentials),
                                    "RUNTIME_DIRECTORY": str(runtime)},
                               stdout=log.open("wb"),
                               stderr=subprocess.STDOUT)  # fmt: skip
    scheme = "https" if tls else "http"
    gateway = Gateway(f"{scheme}://localhost:{port}", keys, log, f"http://127.0.0.1:{metrics_port}")

    def up() -> bool:
        try:
            verify = ssl.create_default_context(cafile=str(tls)) if tls else True
            return httpx.get(f"{gateway.url}/health", timeout=2, verify=verify).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(up, 30), log.read_text()
    return process, gateway


@pytest.fixture
def gateway(tmp_path: Path, endpoints: dict[str, str]) -> Iterator[Gateway]:
    clients: dict[str, dict[str, object]] = {
        "everything": {"models": None, "rpm": None, "concurrency": None},
        "embed-only": {"models": [EMBEDDER], "rpm": None, "concurrency": None},
        "chat-only": {"models": [CHAT], "rpm": None, "concurrency": None},
        "three-a-minute": {"models": None, "rpm": 3, "concurrency": None},
        "one-at-a-time": {"models": None, "rpm": None, "concurrency": 1},
    }
    process, gw = start_gateway(tmp_path, routes_to(endpoints), clients)
    try:
        # both backends pass their first health check before the tests send anything
        assert wait_until(lambda: gw.post("/v1/embeddings", {"model": EMBEDDER, "input": "x"},
                                          "everything").status_code == 200, 30)  # fmt: skip
        yield gw
    finally:
        process.terminate()
        process.wait(30)


def chat(model: str = CHAT, text: str = "hello", **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        **extra,
    }


LONG_STREAM = chat(stream=True, max_tokens=1500, ignore_eos=True)
"""A streamed chat of 1500 tokens: about a second on the tiny model, one event each."""


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def test_one_url_routes_by_the_bodys_model(gateway: Gateway) -> None:
    """Each model reaches its own server (the chat one with its own key, which the client
    never had); a "model" inside a message does not move the request."""
    answer = gateway.post("/v1/chat/completions",
                          chat(text='{"model": "tiny-embedder"} "model": "tiny-embedder"'),
                          "everything")  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "chat.completion"
    vectors = gateway.post("/v1/embeddings", {"model": EMBEDDER, "input": ["a", "b"]}, "everything")
    assert vectors.status_code == 200, vectors.text
    assert len(vectors.json()["data"]) == 2
    models = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers("everything"))
    assert [m["id"] for m in models.json()["data"]] == [CHAT, ALIAS, EMBEDDER]


def test_an_alias_reaches_its_endpoint_and_counts_as_its_model(gateway: Gateway) -> None:
    """The alias goes where the model goes; a key's models and the usage counts know it as
    the model it stands for."""
    answer = gateway.post("/v1/chat/completions", chat(model=ALIAS), "everything")
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "chat.completion"
    refused = gateway.post("/v1/chat/completions", chat(model=ALIAS), "embed-only")
    assert (refused.status_code, error_code(refused)) == (403, "model_not_allowed")
    usage = usage_of(gateway)
    assert usage[("everything", CHAT)] == (1, 0, 0)
    assert usage[("embed-only", CHAT)] == (1, 1, 0)
    assert not any(model == ALIAS for _, model in usage)


def listed_models(gateway: Gateway, client: str) -> list[str]:
    answer = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers(client), timeout=10)
    assert answer.status_code == 200, answer.text
    return [model["id"] for model in answer.json()["data"]]


def test_v1_models_lists_only_the_models_the_key_may_use(gateway: Gateway) -> None:
    """A key limited to some models sees those (a model's aliases with it), a key allowed
    every model sees all: the gateway answers from the same list it checks a request by."""
    assert listed_models(gateway, "everything") == [CHAT, ALIAS, EMBEDDER]
    assert listed_models(gateway, "embed-only") == [EMBEDDER]
    assert listed_models(gateway, "chat-only") == [CHAT, ALIAS]
    for client in ("embed-only", "chat-only"):
        for model in listed_models(gateway, client):
            assert gateway.post("/v1/embeddings", {"model": model, "input": "x"},
                                client).status_code != 403  # fmt: skip


def test_unknown_model_missing_model_and_unknown_path(gateway: Gateway) -> None:
    unknown = gateway.post("/v1/chat/completions", chat(model="gpt-4"), "everything")
    assert (unknown.status_code, error_code(unknown)) == (404, "model_not_found")
    missing = gateway.post("/v1/embeddings", {"input": "x"}, "everything")
    assert (missing.status_code, error_code(missing)) == (400, "missing_model")
    not_json = httpx.post(f"{gateway.url}/v1/embeddings", content=b"model=tiny-embedder",
                          headers=gateway.headers("everything"))  # fmt: skip
    assert not_json.status_code == 400
    path = gateway.post("/v1/tokenize", {"model": CHAT, "content": "x"}, "everything")
    assert (path.status_code, error_code(path)) == (404, "unknown_url")


def test_no_key_a_wrong_key_and_a_model_the_key_may_not_use(gateway: Gateway) -> None:
    none = gateway.post("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, None)
    assert (none.status_code, error_code(none)) == (401, "invalid_api_key")
    gateway.keys["stranger"] = gateway.keys["everything"][:-1] + "x"
    wrong = gateway.post("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, "stranger")
    assert wrong.status_code == 401
    # the endpoint's own key is not a gateway key
    gateway.keys["endpoint"] = CHAT_KEY
    assert gateway.post("/v1/chat/completions", chat(), "endpoint").status_code == 401
    refused = gateway.post("/v1/chat/completions", chat(), "embed-only")
    assert (refused.status_code, error_code(refused)) == (403, "model_not_allowed")
    allowed = gateway.post("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, "embed-only")
    assert allowed.status_code == 200


def test_requests_per_minute_give_a_429_with_retry_after(gateway: Gateway) -> None:
    body = {"model": EMBEDDER, "input": "x"}
    assert [gateway.post("/v1/embeddings", body, "three-a-minute").status_code
            for _ in range(3)] == [200, 200, 200]  # fmt: skip
    over = gateway.post("/v1/embeddings", body, "three-a-minute")
    assert (over.status_code, error_code(over)) == (429, "rate_limit_exceeded")
    assert over.headers["retry-after"] == "60"
    # another key is not counted with it
    assert gateway.post("/v1/embeddings", body, "everything").status_code == 200


def test_concurrency_counts_requests_in_flight_only(gateway: Gateway) -> None:
    """While one streamed chat of the key runs, its second request is a 429; one after
    another, every request passes (a kept-alive connection is not a request)."""
    headers = {"Authorization": f"Bearer {gateway.keys['one-at-a-time']}"}
    with httpx.Client(headers=headers, timeout=60) as client:
        for _ in range(4):
            body = {"model": EMBEDDER, "input": "x"}
            assert client.post(f"{gateway.url}/v1/embeddings", json=body).status_code == 200
        with client.stream("POST", f"{gateway.url}/v1/chat/completions", json=LONG_STREAM) as held:
            assert held.status_code == 200
            lines = held.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            second = httpx.post(f"{gateway.url}/v1/embeddings", headers=headers,
                                json={"model": EMBEDDER, "input": "x"})  # fmt: skip
            assert (second.status_code, second.headers.get("retry-after")) == (429, "1")
            assert error_code(second) == "rate_limit_exceeded"
            later = sum(1 for line in lines if line.startswith("data: "))
            assert later > 100, "the stream had ended: it held nothing"
        assert client.post(f"{gateway.url}/v1/embeddings",
                           json={"model": EMBEDDER, "input": "x"}).status_code == 200  # fmt: skip


def test_a_stream_arrives_as_it_is_made(gateway: Gateway) -> None:
    """Server-sent events pass one by one, not buffered to the end."""
    headers = {"Authorization": f"Bearer {gateway.keys['everything']}"}
    arrivals = []
    sent = time.monotonic()
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", headers=headers,
                      json=LONG_STREAM, timeout=60) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    assert len(arrivals) > 1000
    # the first event came before the first half of the generation was over
    assert arrivals[0] - sent < (arrivals[-1] - sent) / 2


def test_a_200_kb_prompt_routes_and_a_body_over_the_limit_is_a_413(gateway: Gateway) -> None:
    long_text = "word " * (200_000 // 5)
    long = gateway.post("/v1/chat/completions", {**chat(), "messages": [
        {"role": "system", "content": long_text}, {"role": "user", "content": "hi"}]},
        "everything")  # fmt: skip
    # routed: the answer is llama-server's own (its context is smaller than the prompt)
    assert long.status_code != 404 and "model_not_found" not in long.text
    assert long.headers.get("server") == "llama.cpp" or long.status_code == 200, long.text
    huge = gateway.post(
        "/v1/embeddings", {"model": EMBEDDER, "input": "x" * BODY_LIMIT}, "everything"
    )
    assert (huge.status_code, error_code(huge)) == (413, "request_too_large")


def padded(size: int) -> bytes:
    """An embeddings request of exactly `size` bytes: its `user` field is the padding."""
    head = json.dumps({"model": EMBEDDER, "input": "x", "user": ""}).encode()
    return head[:-2] + b"p" * (size - len(head)) + b'"}'


def in_chunks(body: bytes) -> Iterator[bytes]:
    """`body` as httpx sends a generator: chunked, with no Content-Length."""
    for start in range(0, len(body), 64 << 10):
        yield body[start : start + (64 << 10)]


def test_a_chunked_body_meets_the_same_limit_as_one_with_a_length(gateway: Gateway) -> None:
    """One rule for both framings: a body of `BODY_LIMIT` bytes routes and one byte more is
    a 413, whether its length is said up front or it comes in chunks; a chunked body far
    over the limit never reaches the endpoint, and headers so large that the buffer could
    not hold the limit's body beside them are refused before any body is judged."""
    headers = gateway.headers("everything")
    url = f"{gateway.url}/v1/embeddings"
    for size, status in ((BODY_LIMIT, 200), (BODY_LIMIT + 1, 413)):
        body = padded(size)
        for framing, content in (("length", body), ("chunked", in_chunks(body))):
            answer = httpx.post(url, content=content, headers=headers, timeout=60)
            assert answer.status_code == status, (framing, size, answer.text[:300])
            if status == 413:
                assert error_code(answer) == "request_too_large", framing
    huge = httpx.post(url, content=in_chunks(padded(3 * BODY_LIMIT)), headers=headers, timeout=60)
    assert (huge.status_code, error_code(huge)) == (413, "request_too_large")
    padding = {"X-Padding": "p" * HEADER_LIMIT}
    for content in (padded(100), in_chunks(padded(3 * BODY_LIMIT))):
        refused = httpx.post(url, content=content, headers={**headers, **padding}, timeout=60)
        assert (refused.status_code, error_code(refused)) == (431, "headers_too_large")


def test_an_endpoint_that_is_down_is_a_503_with_retry_after_and_not_listed(
    tmp_path: Path, endpoints: dict[str, str]
) -> None:
    routes = routes_to(endpoints)
    dead = Route(endpoint="gone", model="gone-model", primary_endpoint="chat_completions",
                 address=f"127.0.0.1:{free_port()}")  # fmt: skip
    process, gw = start_gateway(
        tmp_path,
        [*routes, dead],
        {"everything": {"models": None, "rpm": None, "concurrency": None}},
    )
    try:
        # at once, before a health check ran: the refused connection is HAProxy's own 503,
        # in OpenAI's error object too; later, the backend's (no server up)
        answers = [gw.post("/v1/chat/completions", chat(model="gone-model"), "everything")
                   for _ in range(3)]  # fmt: skip
        time.sleep(5)  # two failed checks, 2 s apart
        answers.append(gw.post("/v1/chat/completions", chat(model="gone-model"), "everything"))
        for down in answers:
            assert down.status_code == 503, down.text
            assert (error_code(down), down.headers["retry-after"]) == ("endpoint_unavailable", "10")
        assert gw.post("/v1/chat/completions", chat(), "everything").status_code == 200
        # /v1/models lists the endpoints that are up, not every route
        listed = httpx.get(f"{gw.url}/v1/models", headers=gw.headers("everything")).json()
        assert [m["id"] for m in listed["data"]] == [CHAT, ALIAS, EMBEDDER], listed
        # each request is counted, and each 503 once the endpoint is known to be down (the
        # first refused connection marks it down) is a server error; HAProxy's own 503 of
        # that first refused connection is not (no rule runs for an answer it makes itself)
        requests, client_errors, server_errors = usage_of(gw)[("everything", "gone-model")]
        assert (requests, client_errors) == (4, 0) and server_errors >= 3
    finally:
        process.terminate()
        process.wait(30)


def test_the_log_names_the_client_and_never_a_key(gateway: Gateway) -> None:
    gateway.post("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, "embed-only")
    gateway.post("/v1/chat/completions", chat(), "everything")
    assert wait_until(lambda: "client=embed-only" in gateway.log.read_text(), 5)
    log = gateway.log.read_text()
    assert "client=everything" in log
    for key in [*gateway.keys.values(), CHAT_KEY]:
        assert key not in log


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key (openssl), as one PEM, and the
    certificate alone for the client to trust."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-addext",
         "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    both = folder / "gateway.pem"
    both.write_text(cert.read_text() + key.read_text())
    return both, cert


def test_tls_with_a_self_signed_certificate_speaks_h2_and_http_1_1(
    tmp_path: Path, endpoints: dict[str, str]
) -> None:
    pem, cert = self_signed(tmp_path)
    clients: dict[str, dict[str, object]] = {
        "everything": {"models": None, "rpm": None, "concurrency": None}
    }
    process, gw = start_gateway(tmp_path, routes_to(endpoints), clients, tls=pem)
    try:
        body = json.dumps({"model": EMBEDDER, "input": "x"})
        for version, said in (("--http2", "2"), ("--http1.1", "1.1")):
            done = subprocess.run(
                ["curl", "-sS", version, "--cacert", str(cert), "-o", "/dev/null",
                 "-w", "%{http_code} %{http_version}", "-H", "Content-Type: application/json",
                 "-H", f"Authorization: Bearer {gw.keys['everything']}", "-d", body,
                 f"{gw.url}/v1/embeddings"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.stdout == f"200 {said}", done.stderr
        # a body read from a pipe has no length: HTTP/2 frames, or HTTP/1.1 chunks, meet
        # the one limit too
        for version, said in (("--http2", "2"), ("--http1.1", "1.1")):
            for size, status in ((BODY_LIMIT, 200), (BODY_LIMIT + 1, 413)):
                piped = subprocess.run(
                    ["curl", "-sS", version, "--cacert", str(cert), "-o", "/dev/null",
                     "-w", "%{http_code} %{http_version}", "-H", "Content-Type: application/json",
                     "-H", f"Authorization: Bearer {gw.keys['everything']}", "-X", "POST",
                     "-T", "-", f"{gw.url}/v1/embeddings"],
                    input=padded(size), capture_output=True, timeout=60, check=False,
                )  # fmt: skip
                assert piped.stdout.decode() == f"{status} {said}", (size, piped.stderr)
        # not trusted without the certificate, and no plain HTTP on the TLS port
        untrusted = subprocess.run(["curl", "-sS", f"{gw.url}/health"], capture_output=True,
                                   text=True, timeout=60, check=False)  # fmt: skip
        assert untrusted.returncode == 60, untrusted.stderr
        plain = gw.url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/health", timeout=5)
    finally:
        process.terminate()
        process.wait(30)


def usage_of(gateway: Gateway) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(client, model) -> (requests, client errors, server errors), as epycd's /metrics
    reads them from the gateway."""
    families = {f.name: f for f in gateway_series(f"{gateway.metrics_url}/usage", 2.0)}
    assert families["epyc_llm_gateway_up"].samples[0].value == 1
    found = {}
    for sample in families["epyc_llm_gateway_requests"].samples:
        pair = (sample.labels["client"], sample.labels["model"])
        found[pair] = tuple(
            next(s.value for s in families[name].samples if s.labels == sample.labels)
            for name in ("epyc_llm_gateway_requests", "epyc_llm_gateway_client_errors",
                         "epyc_llm_gateway_server_errors")
        )  # fmt: skip
    return found  # type: ignore[return-value]


def test_use_is_counted_by_client_and_model_and_haproxys_exporter_has_each_endpoint(
    gateway: Gateway,
) -> None:
    """The usage table counts each client's requests to each model from the point its
    model is known (a 403 and a 429 among them, a 401 or an unknown model not: no client, or
    no model to count under), and HAProxy's own exporter has each endpoint's backend."""
    embed = {"model": EMBEDDER, "input": "x"}
    for _ in range(2):
        assert gateway.post("/v1/chat/completions", chat(), "everything").status_code == 200
    assert gateway.post("/v1/chat/completions", chat(), "embed-only").status_code == 403
    assert gateway.post("/v1/embeddings", embed, "embed-only").status_code == 200
    answers = [gateway.post("/v1/embeddings", embed, "three-a-minute") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    unknown = gateway.post("/v1/chat/completions", chat(model="gpt-4"), "embed-only")
    assert unknown.status_code == 404
    assert gateway.post("/v1/embeddings", embed, None).status_code == 401

    usage = usage_of(gateway)
    assert usage[("everything", CHAT)] == (2, 0, 0)
    assert usage[("embed-only", CHAT)] == (1, 1, 0)
    assert usage[("embed-only", EMBEDDER)] == (1, 0, 0)
    assert usage[("three-a-minute", EMBEDDER)] == (4, 1, 0)
    assert not any(model == "gpt-4" for _, model in usage)
    # the endpoint's answers and their time to the response headers; refusals are none
    families = {f.name: f for f in gateway_series(f"{gateway.metrics_url}/usage", 2.0)}
    latency = {
        (s.name, s.labels["client"], s.labels["model"]): s.value
        for s in families["epyc_llm_gateway_response_seconds"].samples
    }
    count, total = (
        "epyc_llm_gateway_response_seconds_count",
        "epyc_llm_gateway_response_seconds_sum",
    )
    assert latency[(count, "everything", CHAT)] == 2
    assert 0 < latency[(total, "everything", CHAT)] < 30, latency
    assert latency[(count, "embed-only", CHAT)] == 0 and latency[(total, "embed-only", CHAT)] == 0
    assert latency[(count, "three-a-minute", EMBEDDER)] == 3

    exported = httpx.get(f"{gateway.metrics_url}/metrics", timeout=10)
    assert exported.status_code == 200
    requests = {
        sample.labels["proxy"]: sample.value
        for family in text_string_to_metric_families(exported.text)
        if family.name == "haproxy_backend_http_requests"
        for sample in family.samples
    }
    assert requests["endpoint-chat"] >= 2 and requests["endpoint-emb"] >= 5, requests
    assert httpx.get(f"{gateway.metrics_url}/other", timeout=10).status_code == 404


def test_a_gateway_that_does_not_answer_reads_as_down_within_the_deadline() -> None:
    started = time.monotonic()
    families = gateway_series(f"http://127.0.0.1:{free_port()}/usage", 0.5)
    assert time.monotonic() - started < 1.5
    assert [(f.name, f.samples[0].value) for f in families] == [("epyc_llm_gateway_up", 0)]


def test_an_on_demand_endpoint_is_never_checked_yet_listed_and_routed(
    tmp_path: Path, endpoints: dict[str, str]
) -> None:
    """An on-demand endpoint's port is a socket that starts its engine on a connection
    (docs/on-demand.md): the gateway never connects to check it, lists it, and a request for
    its model is the one connection it gets."""
    held = socket.create_server(("127.0.0.1", 0))
    held.setblocking(False)
    port = held.getsockname()[1]
    on_demand = Route(endpoint="od", model="od-model", primary_endpoint="chat_completions",
                      address=f"127.0.0.1:{port}", on_demand=True)  # fmt: skip
    process, gw = start_gateway(
        tmp_path,
        [*routes_to(endpoints), on_demand],
        {"everything": {"models": None, "rpm": None, "concurrency": None}},
    )
    try:
        time.sleep(3)  # checks every 2 s, 0.5 s while down: a checked server would be asked
        with pytest.raises(BlockingIOError):
            held.accept()
        listed = httpx.get(f"{gw.url}/v1/models", headers=gw.headers("everything")).json()
        assert "od-model" in [m["id"] for m in listed["data"]], listed
        with pytest.raises(BlockingIOError):
            held.accept()
        sent = threading.Thread(
            target=lambda: gw.post("/v1/chat/completions", chat(model="od-model"), "everything")
        )
        sent.start()
        deadline = time.monotonic() + 10
        conn = None
        while conn is None and time.monotonic() < deadline:
            try:
                conn, _ = held.accept()
            except BlockingIOError:
                time.sleep(0.05)
        assert conn is not None, "the request never reached the on-demand endpoint's port"
        conn.close()
        sent.join(30)
    finally:
        held.close()
        process.terminate()
        process.wait(30)


def workers(master: int) -> set[int]:
    """The worker processes of HAProxy's master `master`."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return {int(pid) for pid in children}


def test_rate_limits_survive_a_reload(tmp_path: Path, endpoints: dict[str, str]) -> None:
    """A reload (each add-key, revoke or approve: SIGUSR2 to the master) starts new workers;
    the old ones hand the limits' counts over (a local peer), so a key over its requests
    per minute stays over it, and one under it keeps its count."""
    clients: dict[str, dict[str, object]] = {
        "everything": {"models": None, "rpm": None, "concurrency": None},
        "three-a-minute": {"models": None, "rpm": 3, "concurrency": None},
        "five-a-minute": {"models": None, "rpm": 5, "concurrency": None},
    }
    process, gw = start_gateway(tmp_path, routes_to(endpoints), clients, master_worker=True)
    try:
        # a started HAProxy first waits RESYNC_S to learn from an older process, and does
        # not teach a newer one before that
        time.sleep(PEER_RESYNC_S + 1)
        body = {"model": EMBEDDER, "input": "x"}
        assert wait_until(
            lambda: gw.post("/v1/embeddings", body, "everything").status_code == 200, 30
        )
        answers = [gw.post("/v1/embeddings", body, "three-a-minute") for _ in range(4)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert [gw.post("/v1/embeddings", body, "five-a-minute").status_code
                for _ in range(3)] == [200, 200, 200]  # fmt: skip
        for _ in range(2):  # a reload soon after another hands over as well
            old = workers(process.pid)
            process.send_signal(signal.SIGUSR2)
            handed = wait_until(lambda old=old: workers(process.pid).isdisjoint(old), 30)  # type: ignore[misc]
            assert handed, gw.log.read_text()
            over = gw.post("/v1/embeddings", body, "three-a-minute")
            assert (over.status_code, error_code(over)) == (429, "rate_limit_exceeded")
        answers = [gw.post("/v1/embeddings", body, "five-a-minute") for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
    finally:
        process.terminate()
        process.wait(30)
