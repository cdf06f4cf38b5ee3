"""One operation on an MCP server over streamable HTTP, with the ``mcp`` SDK as client.

Each operation (list the tools, call one) opens its own session: a turn's
tool calls run in other tasks than the one that built the agent, the SDK's
sessions are bound to the task that opened them, and a fresh session also
picks up a token refreshed in the meantime. Failures come out as one of three
things the caller can act on: the server wants (other) credentials
(``MCPUnauthorizedError``, with its challenge), the server cannot be used now
(``MCPServerUnavailableError``), or the server answered the call with an error
(``MCPCallError``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from tether.adapters.mcp.config import MCPServerConfig
from tether.adapters.mcp.discovery import Challenge

_T = TypeVar("_T")


class MCPUnauthorizedError(Exception):
    """The server answered 401 (or 403 insufficient_scope) to the credentials sent."""

    def __init__(self, challenge: Challenge) -> None:
        super().__init__("the MCP server requires authorization")
        self.challenge = challenge


class MCPServerUnavailableError(Exception):
    """The server could not be reached or used; ``reason`` says why, for people."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MCPCallError(Exception):
    """The server answered, with an error (an unknown tool, a failed call)."""


class _ChallengeRecorder(httpx2.Auth):
    """Adds the credentials to every request and remembers an auth challenge.

    The SDK turns an HTTP 401 into a generic JSON-RPC error; this is where the
    status and its ``WWW-Authenticate`` are still visible.
    """

    def __init__(self, headers: Mapping[str, str]) -> None:
        self.headers = dict(headers)
        self.challenge: Challenge | None = None

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        for name, value in self.headers.items():
            request.headers[name] = value
        response = yield request
        header = response.headers.get("www-authenticate")
        insufficient = response.status_code == 403 and "insufficient_scope" in (header or "")
        if (response.status_code == 401 or insufficient) and self.challenge is None:
            self.challenge = Challenge.parse(header)


async def run_on_server(
    server: MCPServerConfig,
    headers: Mapping[str, str],
    operation: Callable[[Client], Awaitable[_T]],
) -> _T:
    """Open a session to ``server`` sending ``headers``, run ``operation``, close."""
    auth = _ChallengeRecorder(headers)
    connected = False
    try:
        async with asyncio.timeout(server.timeout):
            async with httpx2.AsyncClient(
                auth=auth, timeout=httpx2.Timeout(server.timeout), follow_redirects=False
            ) as http:
                async with Client(
                    streamable_http_client(server.url, http_client=http),
                    read_timeout_seconds=server.timeout,
                ) as client:
                    connected = True
                    return await operation(client)
    except Exception as error:
        if auth.challenge is not None:
            raise MCPUnauthorizedError(auth.challenge) from error
        leaf = _leaf(error)
        if isinstance(leaf, asyncio.CancelledError):
            raise
        if isinstance(leaf, TimeoutError):
            reason = f"it did not answer within {server.timeout:g} s"
            raise MCPServerUnavailableError(reason) from error
        if isinstance(leaf, MCPCallError):
            raise MCPCallError(str(leaf)) from error
        if isinstance(leaf, MCPError) and connected:
            raise MCPCallError(leaf.message) from error
        if isinstance(leaf, httpx2.TransportError):
            reason = f"it could not be reached ({_describe(leaf)})"
            raise MCPServerUnavailableError(reason) from error
        raise MCPServerUnavailableError(f"it could not be used ({_describe(leaf)})") from error


def result_value(result: CallToolResult) -> Any:
    """What a tool call returned, as the model should read it; raises
    ``MCPCallError`` for a result the server marked as an error."""
    texts = []
    for block in result.content:
        text = getattr(block, "text", None)
        texts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    if result.is_error:
        raise MCPCallError("\n".join(texts) or "the tool failed")
    if result.structured_content is not None:
        structured = result.structured_content
        # The SDK wraps a plain return value as {"result": value}.
        if set(structured) == {"result"}:
            return structured["result"]
        return structured
    return "\n".join(texts)


def _leaf(error: BaseException) -> BaseException:
    # Task groups wrap the real failure; the innermost one names the cause.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
