"""The health gate: an endpoint is up only when it has really answered.

Three phases, one after the other, each with its own bound and no retry:
`health` waits for `/health` to answer 200 (connection refused or a reset while the model
loads is waiting, not failure; the server exiting is an immediate failure), `models` asks
`/v1/models` once for the served id, `request` sends one deterministic request on the
primary endpoint and checks its answer: text in the first choice of a chat or completions
endpoint, one vector of finite numbers per input of an embeddings endpoint (all of one width,
the model's where the plan gives it), one finite score per document of a rerank endpoint.

After the gate, while serving (docs/healing.md, "Watchdog"): `health_problem` asks `/health`,
and `StallWatch` reads the engine's progress from vLLM's own `/metrics` (`read_progress`):
vLLM's `/health` answers 200 while its engine process is frozen, its token counters do not.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard

import click
import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from epycd.engines import DEFAULT_ENGINE, ENGINES, ServerMetrics, engine_exporting
from epycd.readfile import SECRET_MAX_BYTES, read_text
from epycd.text import escaped

Phase = Literal["health", "models", "request"]
PrimaryEndpoint = Literal["chat_completions", "completions", "embeddings", "rerank"]
PRIMARY_ENDPOINTS: tuple[PrimaryEndpoint, ...] = (
    "chat_completions",
    "completions",
    "embeddings",
    "rerank",
)
PATHS: dict[PrimaryEndpoint, str] = {
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "rerank": "/v1/rerank",
}
"""Each primary endpoint's path, the same on vLLM and llama-server (rerank as Jina and
Cohere's API: a query, documents, and `results` of `index` and `relevance_score`)."""

SMOKE_PROMPT = "Say hello."
SMOKE_MAX_TOKENS = 16
SMOKE_TEXTS = [SMOKE_PROMPT, "The quick brown fox jumps over the lazy dog."]
"""The embeddings request's inputs and the rerank request's documents."""


class GateConfig(BaseModel):
    url: str = Field(description="base URL without /v1, e.g. http://127.0.0.1:8000")
    served_model_name: str
    endpoint: PrimaryEndpoint = "chat_completions"
    embedding_width: int | None = Field(
        default=None, gt=0, description="the numbers in each vector of an embeddings endpoint"
    )
    api_key: str | None = None
    load_timeout: float = Field(default=1800.0, gt=0, description="bound of phase health")
    health_timeout: float = Field(default=10.0, gt=0, description="bound of phase models")
    probe_timeout: float = Field(
        default=2.0, gt=0, description="each /health probe while waiting; keeps polls short"
    )
    request_timeout: float = Field(default=300.0, gt=0, description="bound of phase request")
    poll_interval: float = Field(default=0.2, gt=0, description="pause between /health probes")


class GateResult(BaseModel):
    ok: bool
    phase: Phase = Field(description="the phase that failed, or the last one when ok")
    reason: str
    seconds: dict[str, float] = Field(default_factory=dict, description="per phase reached")


class PhaseFailed(Exception):
    def __init__(self, phase: Phase, reason: str) -> None:
        super().__init__(reason)
        self.phase = phase
        self.reason = reason


ServerAlive = Callable[[], bool]


def _always_alive() -> bool:
    return True


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _describe(response: httpx.Response) -> str:
    body = response.text.strip().replace("\n", " ")
    return f"HTTP {response.status_code}: {body[:300]}" if body else f"HTTP {response.status_code}"


def still_loading(response: httpx.Response) -> bool:
    """An engine's /health saying it still loads the model (`Engine.loading_health`); any
    other answer that is not 200 (vLLM's dead engine answers 503 too) is a failure."""
    return any(engine.still_loading(response) for engine in ENGINES)


def wait_for_health(client: httpx.Client, config: GateConfig, server_alive: ServerAlive) -> None:
    """Polls /health until 200. Only a server that is not listening yet, or that says it is
    loading the model (`still_loading`), is waited for."""
    deadline = time.monotonic() + config.load_timeout
    last_error = "no answer yet"
    while True:
        if not server_alive():
            raise PhaseFailed("health", f"server exited while loading ({last_error})")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PhaseFailed(
                "health", f"/health did not answer within {config.load_timeout:g} s ({last_error})"
            )
        try:
            response = client.get("/health", timeout=min(config.probe_timeout, remaining))
        except httpx.TransportError as error:
            last_error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        else:
            if response.status_code == 200:
                return
            if not still_loading(response):
                raise PhaseFailed("health", f"/health answered {_describe(response)}")
            last_error = f"/health answered {_describe(response)}"
        time.sleep(max(0.0, min(config.poll_interval, deadline - time.monotonic())))


def served_ids(payload: Any) -> list[str]:
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError("no 'data' list")
    return [str(entry.get("id")) for entry in payload["data"] if isinstance(entry, dict)]


def check_models(client: httpx.Client, config: GateConfig) -> None:
    try:
        response = client.get("/v1/models", timeout=config.health_timeout)
    except httpx.TransportError as error:
        raise PhaseFailed("models", f"/v1/models: {type(error).__name__}: {error}") from error
    if response.status_code != 200:
        raise PhaseFailed("models", f"/v1/models answered {_describe(response)}")
    try:
        ids = served_ids(response.json())
    except ValueError as error:
        raise PhaseFailed("models", f"/v1/models is not a model list: {error}") from error
    if config.served_model_name not in ids:
        listed = ", ".join(ids) or "nothing"
        raise PhaseFailed(
            "models", f"/v1/models does not list {config.served_model_name!r} (it lists {listed})"
        )


def smoke_request(config: GateConfig) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of the one deterministic request on the primary endpoint."""
    path = PATHS[config.endpoint]
    model = {"model": config.served_model_name}
    if config.endpoint == "embeddings":
        return path, model | {"input": SMOKE_TEXTS}
    if config.endpoint == "rerank":
        return path, model | {"query": SMOKE_PROMPT, "documents": SMOKE_TEXTS}
    body = model | {"temperature": 0, "max_tokens": SMOKE_MAX_TOKENS}
    if config.endpoint == "chat_completions":
        return path, body | {"messages": [{"role": "user", "content": SMOKE_PROMPT}]}
    return path, body | {"prompt": SMOKE_PROMPT}


def _refuse_error_payload(payload: Any) -> dict[str, Any]:
    """The answer as a JSON object; ValueError when it is none or carries an error."""
    if not isinstance(payload, dict):
        raise ValueError("the answer is not a JSON object")
    if payload.get("error") or payload.get("object") == "error":
        error = payload.get("error", payload)
        message = error.get("message") if isinstance(error, dict) else error
        raise ValueError(f"error payload: {message or payload.get('message')}")
    return payload


def answer_text(payload: Any, endpoint: PrimaryEndpoint) -> str:
    """The generated text of choices[0]; ValueError when the payload is an error or empty."""
    choices = _refuse_error_payload(payload).get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("no choices[0] in the answer")
    choice = choices[0]
    if choice.get("error"):
        raise ValueError(f"choices[0] carries an error: {choice['error']}")
    if endpoint == "chat_completions":
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        where = "choices[0].message.content"
    else:
        text = choice.get("text")
        where = "choices[0].text"
    if not isinstance(text, str):
        raise ValueError(f"{where} is missing")
    return text


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def answer_vectors(payload: Any, inputs: int, width: int | None) -> list[list[float]]:
    """One vector per input, in order, each of `width` finite numbers (of one width when
    `width` is None); ValueError otherwise."""
    data = _refuse_error_payload(payload).get("data")
    if not isinstance(data, list) or len(data) != inputs:
        raise ValueError(f"data holds no {inputs} embeddings")
    vectors = [item.get("embedding") if isinstance(item, dict) else None for item in data]
    for index, vector in enumerate(vectors):
        if not isinstance(vector, list) or not vector:
            raise ValueError(f"data[{index}].embedding is not a list of numbers")
        if not all(_finite(number) for number in vector):
            raise ValueError(f"data[{index}].embedding holds a number that is not finite")
    widths = sorted({len(vector) for vector in vectors if isinstance(vector, list)})
    expected = width or widths[0]
    if widths != [expected]:
        raise ValueError(f"the vectors have {', '.join(map(str, widths))} numbers, not {expected}")
    return [list(vector) for vector in vectors if isinstance(vector, list)]


def answer_scores(payload: Any, documents: int) -> list[float]:
    """One finite relevance score per document, by the document's index; ValueError
    otherwise."""
    results = _refuse_error_payload(payload).get("results")
    if not isinstance(results, list) or len(results) != documents:
        raise ValueError(f"results holds no {documents} scores")
    scores: dict[int, float] = {}
    for result in results:
        index = result.get("index") if isinstance(result, dict) else None
        score = result.get("relevance_score") if isinstance(result, dict) else None
        if not isinstance(index, int) or not 0 <= index < documents or not _finite(score):
            raise ValueError(f"{result} is not a document's index and finite relevance_score")
        scores[index] = float(score)
    if len(scores) != documents:
        raise ValueError("the results score a document twice")
    return [scores[index] for index in range(documents)]


def check_answer(payload: Any, config: GateConfig) -> None:
    """ValueError unless the answer is what the primary endpoint gives."""
    if config.endpoint == "embeddings":
        answer_vectors(payload, len(SMOKE_TEXTS), config.embedding_width)
    elif config.endpoint == "rerank":
        answer_scores(payload, len(SMOKE_TEXTS))
    else:
        answer_text(payload, config.endpoint)


def check_request(client: httpx.Client, config: GateConfig) -> None:
    path, body = smoke_request(config)
    try:
        response = client.post(path, json=body, timeout=config.request_timeout)
    except httpx.TransportError as error:
        raise PhaseFailed("request", f"{path}: {type(error).__name__}: {error}") from error
    if response.status_code != 200:
        raise PhaseFailed("request", f"{path} answered {_describe(response)}")
    try:
        check_answer(response.json(), config)
    except ValueError as error:
        raise PhaseFailed("request", f"{path} answered 200 but {error}") from error


def run_gate(config: GateConfig, server_alive: ServerAlive = _always_alive) -> GateResult:
    """Runs the three phases once. Never raises for what the server does."""
    seconds: dict[str, float] = {}
    phases: list[tuple[Phase, Callable[[httpx.Client], None]]] = [
        ("health", lambda c: wait_for_health(c, config, server_alive)),
        ("models", lambda c: check_models(c, config)),
        ("request", lambda c: check_request(c, config)),
    ]
    with httpx.Client(base_url=config.url, headers=auth_headers(config.api_key)) as client:
        for phase, run in phases:
            started = time.monotonic()
            try:
                run(client)
            except PhaseFailed as failure:
                seconds[phase] = round(time.monotonic() - started, 3)
                reason = failure.reason
                if phase != "health" and not server_alive():
                    reason = f"server exited; {reason}"
                return GateResult(ok=False, phase=failure.phase, reason=reason, seconds=seconds)
            seconds[phase] = round(time.monotonic() - started, 3)
    return GateResult(
        ok=True,
        phase="request",
        reason=f"{config.served_model_name} answered on {smoke_request(config)[0]}",
        seconds=seconds,
    )


def health_problem(client: httpx.Client, timeout: float) -> str | None:
    """None when /health answers 200 within `timeout`; else what it did instead."""
    try:
        response = client.get("/health", timeout=timeout)
    except httpx.HTTPError as error:
        if isinstance(error, httpx.TimeoutException):
            return f"/health did not answer within {timeout:g} s"
        return f"/health: {type(error).__name__}: {error}" if str(error) else type(error).__name__
    if response.status_code != 200:
        return f"/health answered {_describe(response)}"
    return None


@dataclass(frozen=True)
class Progress:
    """One reading of the engine's progress from /metrics."""

    running: float
    tokens: float


def metric_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each of `names` summed over its samples (every label set) in a Prometheus
    exposition; ValueError when it is not one or lacks one of them."""
    sums = dict.fromkeys(names, 0.0)
    seen: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in sums:
                    sums[sample.name] += float(sample.value)
                    seen.add(sample.name)
    except (ValueError, IndexError, KeyError, TypeError) as error:
        raise ValueError(f"not a Prometheus exposition ({error})") from None
    missing = [name for name in names if name not in seen]
    if missing:
        raise ValueError("no " + ", ".join(missing))
    return sums


def parse_progress(text: str) -> Progress:
    """The requests running and the prompt + generation tokens counted so far, from a
    Prometheus exposition (`ServerMetrics`: the engine's whose running gauge it holds);
    ValueError when it is not one or holds no engine's."""
    metrics = engine_metrics_in(text)
    sums = metric_sums(text, (metrics.running, *metrics.tokens))
    return Progress(running=sums[metrics.running], tokens=sum(sums[n] for n in metrics.tokens))


def engine_metrics_in(exposition: str) -> ServerMetrics:
    """The metrics of the engine that wrote `exposition`; ValueError naming every engine's
    running gauge when it holds none."""
    engine = engine_exporting(exposition)
    if engine is None:
        raise ValueError("no " + " or ".join(e.metrics.running for e in ENGINES))
    return engine.metrics


def read_progress(client: httpx.Client, timeout: float) -> Progress:
    """The server's /metrics (vLLM serves it without the API key); ValueError naming why
    it cannot be read."""
    try:
        response = client.get("/metrics", timeout=timeout)
    except httpx.HTTPError as error:
        raise ValueError(f"/metrics: {type(error).__name__}: {error}".rstrip(": ")) from None
    if response.status_code != 200:
        raise ValueError(f"/metrics answered HTTP {response.status_code}")
    try:
        return parse_progress(response.text)
    except ValueError as error:
        raise ValueError(f"/metrics: {error}") from None


class StallWatch:
    """Whether the engine is hung: requests running and no prompt or generation token
    counted for `stall_s` seconds. Idle time (nothing running) is never a stall, and a
    reading that could not be made (None) neither starts nor ends one."""

    def __init__(self, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s = stall_s
        self.clock = clock
        self.tokens: float | None = None
        self.moved_at = clock()

    def stalled(self, progress: Progress | None) -> str | None:
        """None, or why the engine counts as stalled, for this reading."""
        now = self.clock()
        if progress is None:
            return None
        if progress.running <= 0 or progress.tokens != self.tokens:
            self.tokens = progress.tokens
            self.moved_at = now
            return None
        still = now - self.moved_at
        if still < self.stall_s:
            return None
        return f"engine stalled: {progress.running:g} requests running, no tokens for {still:.0f} s"


API_KEY_ENV = DEFAULT_ENGINE.api_key_env


def read_api_key(path: Path | None, option: str = "--api-key-credential") -> str | None:
    """The key in `path` (the endpoint's api_key_file or its systemd credential)."""
    if path is None:
        return None
    try:
        key = read_text(path, SECRET_MAX_BYTES).strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise click.BadParameter(f"{path}: {reason}", param_hint=option) from None
    if not key:
        raise click.BadParameter(f"{path} is empty", param_hint=option)
    return key


def credential_path(name: str | None) -> Path | None:
    """A credential systemd loaded for this unit (LoadCredential=NAME:PATH)."""
    if name is None:
        return None
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        raise click.BadParameter(
            "CREDENTIALS_DIRECTORY is not set: run from a unit with LoadCredential=",
            param_hint="--api-key-credential",
        )
    return Path(folder) / name


@click.command(name="epycd-health-gate")
@click.option("--url", required=True, help="Base URL without /v1, e.g. http://127.0.0.1:8000.")
@click.option("--served-model-name", required=True)
@click.option("--endpoint", type=click.Choice(PRIMARY_ENDPOINTS), required=True)
@click.option(
    "--embedding-width",
    type=click.IntRange(min=1),
    help="the numbers in each vector of an embeddings endpoint (any one width if not given)",
)
@click.option("--timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True)
@click.option(
    "--api-key-credential",
    help="name of the unit's credential holding the server's API key (sent as a Bearer token)",
)
def main(
    url: str,
    served_model_name: str,
    endpoint: PrimaryEndpoint,
    embedding_width: int | None,
    timeout: float,
    api_key_credential: str | None,
) -> None:
    """Run the gate once against a server started by someone else (Quadlet on podman < 5).

    Exit 0 when it passed; otherwise one line naming the phase and the reason, exit 1.
    """
    config = GateConfig(
        url=url,
        served_model_name=served_model_name,
        endpoint=endpoint,
        embedding_width=embedding_width,
        load_timeout=timeout,
        api_key=read_api_key(credential_path(api_key_credential)),
    )
    result = run_gate(config)
    if result.ok:
        click.echo(escaped(f"ready: {result.reason}"))
        return
    click.echo(escaped(f"health gate failed in phase {result.phase}: {result.reason}"), err=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
