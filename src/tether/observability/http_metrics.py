"""``tether_http_request_seconds``: every request's duration, by route template.

A pure ASGI middleware (not ``BaseHTTPMiddleware``: that would buffer a
stream's body). The route is the template FastAPI matched
(``/chat/stream/{message_id}``), never the path, so a label's values stay few;
a request no route matched is ``unmatched``.
"""

from __future__ import annotations

import time

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HTTPMetricsMiddleware"]

_UNMATCHED = "unmatched"


class HTTPMetricsMiddleware:
    """Observes each HTTP request's duration on ``histogram`` (method, route, status)."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app raises before answering

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or _UNMATCHED
            self.histogram.labels(scope["method"], route, str(status)).observe(
                time.perf_counter() - started
            )
