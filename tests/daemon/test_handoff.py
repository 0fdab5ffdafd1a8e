"""The hand-off of a ready endpoint, run for real: its curl command in a shell and its
OpenAI-client example in Python, against a local HTTP server on the endpoint's port that
answers like vLLM (the real vLLM serving is proven by tests/health and tests/e2e)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any

import pytest

from tests.daemon.conftest import DaemonSandbox
from tests.health.localhttp import Reply, local_server
from tests.plan.conftest import write_model
from tests.secrets import root_folder, write_secret

pytestmark = pytest.mark.vllm


def vllm_replies(model: str, text: str) -> dict[str, Reply]:
    now = int(time.time())
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    return {
        "/health": (200, ""),
        "/v1/models": (
            200,
            {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]},
        ),
        "/v1/chat/completions": (
            200,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": now,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            },
        ),
        "/v1/completions": (
            200,
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": now,
                "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": usage,
            },
        ),
    }


def ready_handoff(ws: DaemonSandbox, name: str) -> dict[str, Any]:
    ws.approve(name)
    ws.set_unit(f"epyc-llm-{name}.service", "active")
    ws.supervisor_says(name, "ready", phase="request")
    done = ws.epycctl("status", name, "--json")
    assert done.returncode == 0, done.stderr
    [status] = json.loads(done.stdout)["endpoints"]
    assert status["state"] == "ready"
    handoff: dict[str, Any] = status["handoff"]
    return handoff


def run_both(
    handoff: dict[str, Any], text: str, api_key: str | None = None, host: str = "127.0.0.1"
) -> list[tuple[str, str, dict[str, str], Any]]:
    """The curl (in a bash that fails on an unmatched glob, as zsh does by default) and the
    OpenAI example, against a server on `host` and the hand-off's port."""
    replies = vllm_replies(handoff["served_model_name"], text)
    with local_server(replies, handoff["port"], api_key, host) as (
        _url,
        routes,
    ):
        curl = subprocess.run(
            ["bash", "-O", "failglob", "-c", handoff["curl"]],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert curl.returncode == 0, curl.stderr
        choice = json.loads(curl.stdout)["choices"][0]
        assert text in json.dumps(choice)
        python = subprocess.run(
            [sys.executable, "-c", handoff["python"]], capture_output=True, text=True, timeout=60
        )
        assert python.returncode == 0, python.stderr
        assert python.stdout.strip() == text
    return routes.seen


def test_chat_handoff_curl_and_openai_client_work(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    handoff = ready_handoff(ws, "chat")
    assert handoff["endpoint"] == "/v1/chat/completions"
    seen = run_both(handoff, "Hi there")
    assert [(method, path) for method, path, _h, _b in seen] == [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
    ]
    for _method, _path, _headers, body in seen:
        assert body["model"] == handoff["served_model_name"]
        assert body["messages"] == [{"role": "user", "content": "Hello"}]
    client_headers = {key.lower(): value for key, value in seen[1][2].items()}
    assert client_headers["authorization"] == "Bearer EMPTY"


def test_completions_handoff_for_a_model_without_chat_template(ws: DaemonSandbox) -> None:
    base = write_model(ws.tmp / "models" / "base", chat=False)
    path = ws.endpoint("base")
    path.write_text(path.read_text().replace(str(ws.model), str(base)))
    handoff = ready_handoff(ws, "base")
    assert handoff["endpoint"] == "/v1/completions"
    assert "no chat template" in handoff["why"]
    seen = run_both(handoff, "and then")
    assert {path for _m, path, _h, _b in seen} == {"/v1/completions"}
    assert all(body["prompt"] == "Hello, world" for _m, _p, _h, body in seen)


def test_a_keyed_endpoint_hands_off_commands_that_read_the_key_file(
    ws: DaemonSandbox, request: pytest.FixtureRequest
) -> None:
    """The curl and the OpenAI example read the key from api_key_file; none prints it."""
    key = "s3cr3t-k3y-for-the-handoff"
    secrets = ExitStack()
    request.addfinalizer(secrets.close)
    key_file = write_secret(secrets.enter_context(root_folder()) / "chat.key", key + "\n")
    ws.endpoint("chat", f'host = "0.0.0.0"\napi_key_file = "{key_file}"\n')
    handoff = ready_handoff(ws, "chat")
    assert handoff["host"] == "0.0.0.0" and handoff["api_key_file"] == str(key_file)
    assert handoff["base_url"].startswith("http://127.0.0.1:")
    assert f"$(cat {key_file})" in handoff["curl"]
    seen = run_both(handoff, "Hi there", api_key=key)
    for _method, _path, headers, _body in seen:
        assert {k.lower(): v for k, v in headers.items()}["authorization"] == f"Bearer {key}"
    shown = ws.epycctl("status", "chat")
    assert shown.returncode == 0, shown.stderr
    assert str(key_file) in shown.stdout and "0.0.0.0" in shown.stdout
    everything = shown.stdout + shown.stderr + ws.epycctl("status", "chat", "--json").stdout
    assert key not in everything


def test_an_ipv6_loopback_endpoint_hands_off_its_own_address(ws: DaemonSandbox) -> None:
    """`host = "::1"`: the URL is the endpoint's own, bracketed, and the curl command runs
    as printed in a shell that treats an unquoted [::1] as a glob."""
    ws.endpoint("chat", 'host = "::1"\n')
    handoff = ready_handoff(ws, "chat")
    assert handoff["host"] == "::1"
    assert handoff["base_url"] == f"http://[::1]:{handoff['port']}/v1"
    assert f"'http://[::1]:{handoff['port']}/v1/chat/completions'" in handoff["curl"]
    assert f"base_url='http://[::1]:{handoff['port']}/v1'" in handoff["python"]
    seen = run_both(handoff, "Hi over IPv6", host="::1")
    assert [path for _m, path, _h, _b in seen] == ["/v1/chat/completions"] * 2
    shown = ws.epycctl("status", "chat")
    assert shown.returncode == 0, shown.stderr
    assert f"http://[::1]:{handoff['port']}/v1" in shown.stdout
