"""How a turn finds its server's MCP OAuth store: a context variable set per request.

Dependency factories are classes, registered process-wide, and an agent is
built inside the turn's task; what they can see of the server that runs them is
the context that task was created in. ``MCPOAuthRuntimeMiddleware`` puts the
app's ``mcp_oauth_store`` and ``mcp_oauth_token_client`` (``setup_app`` keeps
them on ``app.state``) into that context for every HTTP request, so the turn a
request starts, and every task it spawns, sees the store of the app that
serves it, even with several apps in one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from tether.adapters.mcp.store import MCPOAuthIntegrationStore
from tether.adapters.mcp.token_client import MCPOAuthTokenClient

CALLBACK_PATH = "/mcp/oauth/callback"


@dataclass(frozen=True)
class MCPOAuthRuntime:
    """What the MCP tools of a turn use for OAuth; a None store or client means
    servers needing user authorization are skipped."""

    store: MCPOAuthIntegrationStore | None
    token_client: MCPOAuthTokenClient | None
    redirect_uri: str | None


_CURRENT: ContextVar[MCPOAuthRuntime | None] = ContextVar("tether_mcp_oauth", default=None)


def current_mcp_oauth_runtime() -> MCPOAuthRuntime | None:
    """The runtime of the request (or ``use_mcp_oauth_runtime`` block) running now."""
    return _CURRENT.get()


@contextmanager
def use_mcp_oauth_runtime(runtime: MCPOAuthRuntime | None) -> Iterator[None]:
    """Make ``runtime`` current in this block (and in tasks created within it)."""
    token = _CURRENT.set(runtime)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class MCPOAuthRuntimeMiddleware:
    """Pure ASGI middleware: each HTTP request runs with its app's MCP OAuth runtime.

    The redirect URI is ``redirect_uri``, else ``TETHER_MCP_REDIRECT_URI``, else
    the callback URL on the host the request came to.
    """

    def __init__(self, app: ASGIApp, redirect_uri: str | None = None) -> None:
        self.app = app
        self.redirect_uri = redirect_uri or os.environ.get("TETHER_MCP_REDIRECT_URI") or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = getattr(scope.get("app"), "state", None)
        runtime = MCPOAuthRuntime(
            store=getattr(state, "mcp_oauth_store", None),
            token_client=getattr(state, "mcp_oauth_token_client", None),
            redirect_uri=self.redirect_uri or _request_callback_url(scope),
        )
        with use_mcp_oauth_runtime(runtime):
            await self.app(scope, receive, send)


def _request_callback_url(scope: Scope) -> str | None:
    headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
    host = headers.get(b"host", b"").decode("latin-1")
    if not host:
        server: Any = scope.get("server")
        if not server:
            return None
        host = f"{server[0]}:{server[1]}"
    root = str(scope.get("root_path") or "").rstrip("/")
    return f"{scope.get('scheme', 'http')}://{host}{root}{CALLBACK_PATH}"
