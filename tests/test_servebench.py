"""epycd's serving-bench client against a real socket server that closes a connection as the
request goes out, as a server does with a kept-alive connection it has just given up."""

from __future__ import annotations

import asyncio
import json

import httpx

from epycd.servebench import one_request

USAGE = {"prompt_tokens": 3, "completion_tokens": 2}


def streamed_answer() -> bytes:
    chunks = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}], "usage": USAGE}]
    lines = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    body = lines.encode()
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)


async def ask(unanswered: int) -> tuple[int, object]:
    """One bench request to a server that hangs up on its first `unanswered` connections:
    how many connections it saw, and the request's timing or error."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        if connections > unanswered:
            writer.write(streamed_answer())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, httpx.AsyncClient(timeout=10) as client:
        try:
            result: object = await one_request(
                client, f"http://127.0.0.1:{port}/v1/completions", "m", [1, 2, 3], 2
            )
        except httpx.HTTPError as error:
            result = error
    return connections, result


def test_a_request_the_server_hung_up_on_unanswered_goes_once_more() -> None:
    connections, timing = asyncio.run(ask(unanswered=1))
    assert connections == 2
    assert getattr(timing, "completion_tokens", None) == USAGE["completion_tokens"]


def test_a_request_unanswered_twice_is_an_error_not_a_loop() -> None:
    connections, error = asyncio.run(ask(unanswered=5))
    assert connections == 2
    assert isinstance(error, httpx.RemoteProtocolError)


def test_an_answered_request_goes_once() -> None:
    connections, timing = asyncio.run(ask(unanswered=0))
    assert connections == 1
    assert getattr(timing, "prompt_tokens", None) == USAGE["prompt_tokens"]
