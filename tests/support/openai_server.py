"""A small, real OpenAI-compatible chat-completions server for tests.

It speaks the streaming wire format (``data: {chunk}`` lines, then ``data: [DONE]``)
over real HTTP on 127.0.0.1, so the adapter is tested through the openai SDK and
an HTTP connection, not against a patched client. Its answers are scripted:

- a request without tool results asks for ``calculator`` with ``{"expression": "6 * 7"}``,
  the argument string split over several chunks (as real servers stream it);
  if the last user message contains "broken", the arguments are invalid JSON;
- a request carrying tool results answers with text quoting the results;
- a request ending with a partial assistant message continues it with text;
- a request with a tool call no tool message answers is refused with a 400,
  as OpenAI's API refuses it.

Every request body is recorded, so a test can check what the client sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CALCULATOR_ARGUMENT_PIECES = ['{"expre', 'ssion": "6', " * 7", '"}']
BROKEN_ARGUMENT_PIECES = ['{"expression": ', '"6 * 7"']
CONTINUATION = " and that is where the story ends."
PROMPT_TOKENS = 21
COMPLETION_TOKENS = 8
"""The usage each response reports when the request asks for it."""


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
    body = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return f"data: {json.dumps(body)}\n\n"


def _tool_call_response(pieces: list[str]) -> Iterator[str]:
    yield _chunk({"role": "assistant", "content": None})
    yield _chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_abc123",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": ""},
                }
            ]
        }
    )
    for piece in pieces:
        yield _chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
    yield _chunk({}, finish_reason="tool_calls")


def _text_response(text: str) -> Iterator[str]:
    yield _chunk({"role": "assistant", "content": ""})
    words = text.split(" ")
    for index, word in enumerate(words):
        yield _chunk({"content": word if index == 0 else " " + word})
    yield _chunk({}, finish_reason="stop")


def unanswered_tool_call(messages: list[dict[str, Any]]) -> str | None:
    """The id of a tool call with no tool message answering it before the next
    non-tool message: what OpenAI's API refuses with a 400."""
    for index, message in enumerate(messages):
        if message["role"] != "assistant" or not message.get("tool_calls"):
            continue
        answered = set()
        for later in messages[index + 1 :]:
            if later["role"] != "tool":
                break
            answered.add(later.get("tool_call_id"))
        for call in message["tool_calls"]:
            if call["id"] not in answered:
                return str(call["id"])
    return None


def _respond(body: dict[str, Any]) -> Iterator[str]:
    messages: list[dict[str, Any]] = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    results = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
    last = messages[-1]
    if last["role"] == "assistant" and not last.get("tool_calls"):
        yield from _text_response(CONTINUATION)
    elif results:
        yield from _text_response("The calculator result is " + ", ".join(results) + ". Done.")
    else:
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        broken = "broken" in user
        yield from _tool_call_response(
            BROKEN_ARGUMENT_PIECES if broken else CALCULATOR_ARGUMENT_PIECES
        )
    if (body.get("stream_options") or {}).get("include_usage"):
        # As the real API does: a last chunk with no choices and the call's usage.
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        chunk = {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "test-model-2024",
            "choices": [],
            "usage": usage,
        }
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


class OpenAICompatibleServer:
    """Runs the app with uvicorn in a background thread; use as a context manager."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.app = Starlette(
            routes=[Route("/v1/chat/completions", self._completions, methods=["POST"])]
        )
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", ws="none", http="h11"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        unanswered = unanswered_tool_call(body["messages"])
        if unanswered is not None:
            # As the real API does: a conversation with an unanswered call is refused.
            error = {
                "message": "An assistant message with 'tool_calls' must be followed by tool "
                f"messages responding to each 'tool_call_id'. Missing: {unanswered}",
                "type": "invalid_request_error",
                "param": "messages",
                "code": None,
            }
            return JSONResponse({"error": error}, status_code=400)

        async def events() -> AsyncIterator[str]:
            for event in _respond(body):
                yield event

        return StreamingResponse(events(), media_type="text/event-stream")

    def __enter__(self) -> OpenAICompatibleServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test OpenAI-compatible server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
