"""Refuse a request head (request line and headers) over the size limit with 431.

uvicorn's ``h11_max_incomplete_event_size`` bounds a head only while it is
incomplete: one that arrives whole in a single read is parsed at any size. So
the limit is checked again here, on the parsed head, before the app runs.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tether.api.refusal import send_refusal

_LINE_OVERHEAD = 4
"""``": "`` and CRLF around each header, as it travelled."""


def head_size(scope: Scope) -> int:
    """About the bytes of the head as sent: path, query and every header line."""
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    return size + sum(len(name) + len(value) + _LINE_OVERHEAD for name, value in scope["headers"])


class HeaderSizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and head_size(scope) > self.max_bytes:
            await send_refusal(
                send,
                431,
                "HEADERS_TOO_LARGE",
                f"the request line and headers are over the {self.max_bytes} byte limit",
            )
            return
        await self.app(scope, receive, send)
